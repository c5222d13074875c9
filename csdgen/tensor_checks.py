"""What the argument checks of the tensor functions share: whether a value is an integer tensor, and how a
refusal shows a value (its dtype and shape, or its type). Shapes and dtypes only: nothing here reads a
tensor's values, so no check costs a host sync."""

from __future__ import annotations

import torch

__all__ = ["is_integer_tensor", "described"]


def is_integer_tensor(value) -> bool:
    """True for a tensor of integers (any width, signed or not); False for bool, float and complex tensors and
    for anything that is no tensor."""
    return (isinstance(value, torch.Tensor) and not value.dtype.is_floating_point and not value.dtype.is_complex
            and value.dtype != torch.bool)


def described(value) -> str:
    """``value`` as a refusal shows it: ``"torch.int64 [2, 3]"`` for a tensor, else its type's name."""
    return f"{value.dtype} {list(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
