"""The text families' check of each condition: a prompt string (UTF-8 text) or a token-id list.

Every text family (Janus, Emu3, Chameleon-format, GLM-Image, Liquid) calls
:func:`check_conditions` before tokenising, so a bad element is refused with its index, its value
and what is allowed, instead of failing inside the tokenizer or ``int()``.
"""

from __future__ import annotations

import operator
from typing import Any, Sequence

import torch

from csdgen.prompts import check_text
from csdgen.tensor_checks import is_integer_tensor

__all__ = ["check_conditions"]

ALLOWED = "a prompt string or a list of token ids (ints)"


def check_conditions(conditions: Sequence[Any]) -> Sequence[Any]:
    """``conditions`` unchanged if each element is a prompt ``str`` holding UTF-8 text or a token-id list
    (a list, tuple or array of ints, or a 1-D integer tensor); the list itself is checked by the caller.

    Raises:
        TypeError: an element of another type (``int``, ``None``, ``bytes``, a float list ...), naming
            its index, value and what is allowed.
        ValueError: a string with a lone surrogate (bytes that were not UTF-8,
            :func:`csdgen.prompts.check_text`), or an id list that is not flat.
    """
    for i, c in enumerate(conditions):
        if isinstance(c, str):
            check_text(c, f"conditions[{i}] =")
        elif isinstance(c, torch.Tensor):
            if c.ndim != 1 or not is_integer_tensor(c):
                raise ValueError(f"conditions[{i}]: a {c.dtype} tensor of shape {tuple(c.shape)}; allowed: {ALLOWED} "
                                 f"(a 1-D integer tensor)")
        elif not isinstance(c, (bytes, bytearray, dict, set)) and hasattr(c, "__len__") and hasattr(c, "__iter__"):
            for j, t in enumerate(c):
                try:
                    if isinstance(t, bool):
                        raise TypeError
                    operator.index(t)
                except TypeError:
                    raise TypeError(f"conditions[{i}][{j}] = {t!r} ({type(t).__name__}); allowed: {ALLOWED}") from None
        else:
            raise TypeError(f"conditions[{i}] = {c!r} ({type(c).__name__}); allowed: {ALLOWED}")
    return conditions
