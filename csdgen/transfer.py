"""Host -> device copies that do not make the host wait for the device (:func:`to_device`).

A plain ``tensor.to("cuda")`` of a host tensor is a blocking copy: CUDA copies from pageable
host memory only after the device's queue has drained to that point, so every such copy in a
decoding iteration is one more host sync (the host stops feeding the GPU until it is idle). The
engines copy their small per-iteration index tensors (window layouts, masks, position ids, row
selections) with :func:`to_device` instead: on CUDA the tensor is first copied into pinned
(page-locked) memory, then copied to the device with ``non_blocking=True``, which queues the copy
and returns at once. On other devices it is an ordinary ``.to(device, non_blocking=True)``.

:class:`csdgen.engine.syncs.HostSyncCounter` counts a ``.to(device, non_blocking=True)`` as a
queued copy, and any other host -> device copy as a host sync.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["to_device", "to_device_all"]


def to_device(host: torch.Tensor, device: Any) -> torch.Tensor:
    """Copy a host tensor to ``device`` without waiting for the device (pinned, non-blocking on CUDA).

    The copy is queued on the device's current stream, so device work queued after it sees the
    values; the host may change ``host`` afterwards (the pinned staging copy is a new tensor, which
    PyTorch's pinned-memory allocator keeps until the copy has run).

    Args:
        host: a tensor on the host (CPU), any dtype and shape.
        device: the target device (a ``torch.device`` or its name).

    Returns:
        the tensor on ``device`` (``host`` itself where ``device`` is the CPU and nothing needs copying).
    """
    device = torch.device(device)
    if device.type == "cuda" and host.device.type == "cpu":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device, non_blocking=True)


def to_device_all(tensors: list[torch.Tensor], device: Any) -> list[torch.Tensor]:
    """Copy several small integer or bool host tensors to ``device`` in one queued copy (:func:`to_device`).

    They travel packed into one int64 vector (one pinned buffer and one copy instead of one each)
    and come back with their own shapes and dtypes.

    Args:
        tensors: host tensors of an integer dtype or bool (values must fit in int64).
        device: the target device.

    Returns:
        the tensors on ``device``, in order, each with its shape and dtype.

    Raises:
        ValueError: a floating-point or complex tensor (the int64 packing would change its values).
    """
    for t in tensors:
        if t.is_floating_point() or t.is_complex():
            raise ValueError(f"to_device_all: a {t.dtype} tensor of shape {tuple(t.shape)}; allowed: integer or bool tensors")
    if not tensors:
        return []
    packed = to_device(torch.cat([t.reshape(-1).to(torch.long) for t in tensors]), device)
    parts = torch.split(packed, [t.numel() for t in tensors])
    return [part.view(t.shape).to(t.dtype) for part, t in zip(parts, tensors)]
