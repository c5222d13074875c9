"""Measured peak memory of torch tensors on any device (the figure a memory plan is checked against).

**Peak** here: the most bytes held at once by live tensor storages -- the tensors that exist
when the meter starts (give the model: its weights and buffers) plus every tensor an operator
creates inside the block, counted from its creation until its storage is freed. Allocator
caching, the Python heap and the CUDA context are not counted (``torch.cuda.max_memory_allocated``
measures the same on CUDA; on the CPU no allocator keeps that count, hence this meter).

It runs as a ``TorchDispatchMode``, so it sees the tensors of every aten operator (the model's
forwards, the engine's sampling); each operator costs a few microseconds more inside the block.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .memory import tensor_bytes

__all__ = ["TensorMemoryMeter"]


class TensorMemoryMeter(TorchDispatchMode):
    """``with TensorMemoryMeter(model) as meter: ...``; then ``meter.peak`` bytes (``meter.base``: at the start).

    Args:
        *modules: modules whose parameters and buffers count from the start (shared storages once).
    """

    def __init__(self, *modules: torch.nn.Module):
        super().__init__()
        seen: set = set()
        self.base = sum(tensor_bytes(t, seen) for m in modules for t in [*m.parameters(), *m.buffers()])
        self._known = {ptr for ptr, _ in seen}  # their views are not new memory
        self.live = self.base
        self.peak = self.base
        self._storages: dict[int, int] = {}

    def _freed(self, key: int, nbytes: int) -> None:
        if self._storages.pop(key, None) is not None:
            self.live -= nbytes

    def _track(self, tensor: torch.Tensor) -> None:
        if type(tensor) is not torch.Tensor and hasattr(type(tensor), "__tensor_flatten__"):
            return  # a tensor subclass: its inner tensors come from operators of their own
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key == 0 or key in self._storages or key in self._known:
            return
        nbytes = storage.nbytes()
        self._storages[key] = nbytes
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._freed, key, nbytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor) and value.device.type != "meta":
                self._track(value)
        return out
