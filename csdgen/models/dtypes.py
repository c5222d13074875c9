"""The device and dtype a model runs on when the user gives none, and the dtype names allowed.

On a CPU every model runs float32; on CUDA a released checkpoint runs its family's reference dtype
(:data:`FAMILY_GPU_DTYPES`: bfloat16), the built-in model float32 (:func:`resolve_dtype`).
"""

from __future__ import annotations

import torch

from ._transformers import DTYPES as _DTYPES

__all__ = ["check_device", "default_device", "DTYPE_CHOICES", "FAMILY_GPU_DTYPES", "default_dtype", "resolve_dtype"]


def check_device(device: str | torch.device) -> str | torch.device:
    """``device`` if torch knows it (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device``).

    Raises:
        ValueError: one line naming the value and the devices allowed (instead of torch's list of
            every device type it was built to name); a CUDA device where none is visible (instead of
            torch's "Torch not compiled with CUDA enabled" from inside the memory check).
    """
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device={device!r}: not a device; allowed: 'cpu', 'cuda' or 'cuda:N' (a GPU's index)") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r}: no CUDA device is visible here; allowed: 'cpu'")
    return device


def default_device() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


#: what ``dtype`` / ``--dtype`` accepts: a name of ``DTYPES``, or ``auto`` (= None: :func:`resolve_dtype`'s default)
DTYPE_CHOICES = ("auto", *_DTYPES)


#: the dtype each family's reference code runs on a GPU (the released weights' dtype, what the authors'
#: inference scripts load: Janus-Pro, Emu3, Lumina-mGPT 1.0 and 2.0, Anole / Chameleon, GLM-Image and
#: Liquid all bfloat16); the built-in model was trained and is measured in float32. On a CPU every
#: model runs float32 (:func:`resolve_dtype`).
FAMILY_GPU_DTYPES = {"janus": torch.bfloat16, "emu3": torch.bfloat16, "lumina-mgpt": torch.bfloat16,
                     "anole": torch.bfloat16, "lumina-mgpt-2": torch.bfloat16, "glm-image": torch.bfloat16,
                     "liquid": torch.bfloat16, "builtin": torch.float32}


def default_dtype(device: str | torch.device, family: str | None = None) -> torch.dtype:
    """The dtype a model runs in when none is given: :func:`resolve_dtype`'s, without the reason.

    Args:
        device: where it runs. family: a key of :data:`FAMILY_GPU_DTYPES` (None: a released checkpoint's,
            bfloat16 on CUDA).
    """
    return resolve_dtype(None, device, family)[0]


def resolve_dtype(dtype: torch.dtype | str | None, device: str | torch.device,
                  family: str | None = None) -> tuple[torch.dtype, str]:
    """The dtype a model runs in, and why, in words for a run's first line.

    Given (a name of :data:`DTYPE_CHOICES` other than ``auto``, or a torch dtype of them): that one,
    ``"as given"``. Else (None or ``"auto"``): on CUDA the family's :data:`FAMILY_GPU_DTYPES` entry
    (``"the family's default on cuda"``; the built-in model: float32, ``"the built-in model's
    dtype"``); on any other device float32 (``"the default on cpu"``).

    Args:
        dtype: ``"auto"``, ``"float32"``, ``"bfloat16"``, ``"float16"``, a torch dtype of these, or None.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ... or a torch.device.
        family: a key of :data:`FAMILY_GPU_DTYPES`; None: a released checkpoint (bfloat16 on CUDA).

    Returns:
        ``(torch dtype, reason)``, e.g. ``(torch.bfloat16, "the family's default on cuda")``.

    Raises:
        ValueError: a dtype or family not allowed (one line naming the value and the allowed ones).
    """
    if family is not None and family not in FAMILY_GPU_DTYPES:
        raise ValueError(f"family={family!r}: allowed {', '.join(FAMILY_GPU_DTYPES)}")
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype], "as given"
    if isinstance(dtype, torch.dtype) and dtype in _DTYPES.values():
        return dtype, "as given"
    if dtype is not None and dtype != "auto":
        raise ValueError(f"dtype={dtype!r}: allowed {', '.join(DTYPE_CHOICES)}")
    kind = torch.device(device).type
    if family == "builtin":
        return torch.float32, "the built-in model's dtype"
    if kind == "cuda":
        return FAMILY_GPU_DTYPES[family or "janus"], "the family's default on cuda"
    return torch.float32, f"the default on {kind}"


def _dtype(dtype: torch.dtype | str | None, device: str | torch.device, family: str | None = None) -> torch.dtype:
    return resolve_dtype(dtype, device, family)[0]

