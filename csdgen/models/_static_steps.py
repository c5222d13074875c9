"""The static session's compiled steps: one ``torch.compile``d window forward per step shape, and on
CUDA its replay as a CUDA graph bound to one buffer set (a capture that fails falls back to the
compiled call, with one warning).
"""

from __future__ import annotations

import os
import warnings
import weakref
from typing import Any

import torch

from ._static_cache import StaticBuffers
from ._static_shapes import StepShape

__all__ = ["COMPILE_BACKEND"]


#: the ``torch.compile`` backend of the window step (``CSDGEN_COMPILE_BACKEND``, default inductor; tests use "eager")
COMPILE_BACKEND = os.environ.get("CSDGEN_COMPILE_BACKEND", "inductor")


def _compile_backend_ok() -> None:
    # every StepShape is one more compiled variant of the same code (a run visits a few dozen, a
    # server several prompt buckets of them: step_shapes)
    import torch._dynamo

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < 1024:
            setattr(config, name, 1024)
    if hasattr(config, "accumulated_recompile_limit") and config.accumulated_recompile_limit < 16384:
        config.accumulated_recompile_limit = 16384


_COMPILED: dict[tuple, Any] = {}


def _compiled(name: str, fn):
    """``torch.compile(fn)`` with :data:`COMPILE_BACKEND`, one wrapper per step kind and backend
    (dynamo keeps one variant per static shape)."""
    key = (name, COMPILE_BACKEND)
    if key not in _COMPILED:
        _compile_backend_ok()
        _COMPILED[key] = torch.compile(fn, dynamic=False, backend=COMPILE_BACKEND)
    return _COMPILED[key]


def _window_step_fn(session: "StaticSession", tokens, start, widths):
    return session._window_step(tokens, start, widths)


class _CompiledStep:
    """The compiled window step of one :class:`StepShape`, made over one buffer set.

    Attributes:
        shape: its :class:`StepShape`. graphed: whether it replays a CUDA graph.
        pointers: ``StaticBuffers.pointers()`` of the set it was made over.
        tensors: weak references to that set's tensors (``StaticBuffers.tensors()``).
    """

    graphed = False

    def __init__(self, shape: StepShape, buffers: StaticBuffers):
        self.shape = shape
        self.pointers = buffers.pointers()
        self.tensors = [weakref.ref(t) for t in buffers.tensors()]

    def bound_to(self, buffers: StaticBuffers) -> bool:
        """Whether ``buffers``' tensors are the very ones this step was made over."""
        now = buffers.tensors()
        return len(now) == len(self.tensors) and all(r() is t for r, t in zip(self.tensors, now))

    def __call__(self, session: "StaticSession", tokens, start, widths) -> torch.Tensor:
        return _compiled("window", _window_step_fn)(session, tokens, start, widths)


_CAPTURE_WARNED = False


class _GraphedStep(_CompiledStep):
    """A CUDA graph of one window step shape over one buffer set, captured once and replayed.

    The step's inputs are copied into the graph's static input tensors and the graph replays the
    recorded kernels over the set's buffers; before every replay it checks that the session's
    buffers are the ones it captured (their ``data_ptr()``), raising RuntimeError otherwise. The
    output lives in the graph's memory pool and is overwritten by the next replay: it is returned
    as is (no clone), which is safe because :meth:`StaticSession._logical` copies the images' rows
    out of it (``index_select``) before anything else runs.

    Capture runs on a side stream with ``capture_error_mode="thread_local"`` (CUDA calls of other
    threads, a server's or a demo's, do not break it); a capture that fails raises after the
    stream is restored and synchronised, and the caller runs that shape compiled, without a graph.
    """

    graphed = True

    def __init__(self, shape: StepShape, buffers: StaticBuffers, session: "StaticSession",
                 example: tuple[torch.Tensor, ...]):
        super().__init__(shape, buffers)
        device = buffers.device
        if buffers.graph_pool is None:
            buffers.graph_pool = torch.cuda.graph_pool_handle()
        self.inputs = tuple(t.clone() for t in example)
        step = _compiled("window", _window_step_fn)
        caller = torch.cuda.current_stream(device)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(caller)
        with torch.cuda.stream(stream):  # warm-up outside the graph (same inputs: the cache writes repeat)
            for _ in range(2):
                step(session, *self.inputs)
        stream.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(self.graph, pool=buffers.graph_pool, stream=stream, capture_error_mode="thread_local"):
                self.output = step(session, *self.inputs)
        except BaseException:
            # torch.cuda.graph leaves the side stream current when ending the capture raises
            torch.cuda.set_stream(caller)
            try:
                self.graph.reset()
            except Exception:  # a graph whose capture failed may refuse a reset; it is dropped anyway
                pass
            torch.cuda.synchronize(device)
            raise
        torch.cuda.synchronize(device)

    def __call__(self, session: "StaticSession", tokens, start, widths) -> torch.Tensor:
        if session.buffers.pointers() != self.pointers:
            raise RuntimeError(f"the CUDA graph of {self.shape} was captured over other buffers than the session's")
        for static, value in zip(self.inputs, (tokens, start, widths)):
            static.copy_(value)
        self.graph.replay()
        return self.output


def _capture_failed(shape: StepShape, error: BaseException) -> None:
    global _CAPTURE_WARNED
    if not _CAPTURE_WARNED:
        _CAPTURE_WARNED = True
        warnings.warn(f"CUDA graph capture of the static window step {tuple(shape)} failed ({error}); such shapes run "
                      "compiled without a graph (warned once)", RuntimeWarning, stacklevel=3)
