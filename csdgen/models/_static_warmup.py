"""The static session's warm-up: the step shapes a server will run, compiled (or captured) ahead of its
first request, per batch size and window width (``csdgen serve --warmup``).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple, Sequence

import torch

from ._static_shapes import slot_bucket, StepShape, width_bucket, WIDTH_BUCKETS
from ._static import make_static

__all__ = ["WarmupReport", "warmup"]


class WarmupReport(NamedTuple):
    """What :func:`warmup` did.

    Attributes:
        made: compiled steps made now (compiled, and on CUDA captured as graphs).
        held: steps of the shapes warmed that the model's buffer sets already held.
        seconds: wall-clock seconds of the warm-up (prefills included).
        shapes: every :class:`StepShape` warmed (made or held).
    """

    made: int
    held: int
    seconds: float
    shapes: tuple[StepShape, ...]


def _default_condition(model: Any) -> Any:
    return 0 if hasattr(model, "num_classes") else "a test"


def warmup(model: Any, batch_sizes: Sequence[int], widths: Sequence[int] = WIDTH_BUCKETS, *, guided: bool = True,
           conditions: Sequence[Any] | None = None, prompt_widths: Sequence[int] | None = None,
           capacity: int | None = None, compile: bool | None = None) -> WarmupReport:
    """Compile (and on CUDA capture) the static window steps later sessions of ``model`` will run,
    before they run: every :class:`StepShape` of :func:`step_shapes` for the capacity
    (``slot_bucket(max(batch_sizes))``, what ``generate`` at those batch sizes opens, or
    ``capacity``, a server's ``--max-batch``), the window buckets of ``widths`` and each prompt bucket.
    The steps stay in the model's buffer sets (:func:`model_buffers`), which sessions of at most
    that many images reuse (``generate``, a server's :class:`~csdgen.engine.continuous.ContinuousBatch`
    with that capacity).

    Args:
        model: a family adapter whose sessions take the static path (a RaggedSession family).
        batch_sizes: batch sizes (>= 1) later runs use; the largest sets the capacity.
        widths: window widths (>= 1) later runs use (each warmed as its bucket and every smaller
            bucket: a window narrows at the image end); default every bucket.
        guided: guidance rows (classifier-free guidance) or not.
        conditions: conditions ``model.start`` takes, one session per distinct prompt bucket
            (default: class 0 for a class-conditional model, else the prompt ``"a test"``).
        prompt_widths: prompt widths (columns) to warm besides the conditions' own (each as its
            :func:`prompt_bucket`): prompts of a server's requests land in one of them.
        capacity: batch slots, as a ``ContinuousBatch(capacity=...)`` opens them (default: see above).
        compile: compile; None: on CUDA only (as ``generate``). Uncompiled steps need no warm-up:
            then nothing is done.

    Returns:
        a :class:`WarmupReport` (steps made, steps already held, seconds, shapes).

    Raises:
        ValueError: an empty ``batch_sizes``, a batch size, width, prompt width or capacity < 1, or
            a model whose sessions cannot take the static path.
    """
    sizes = list(batch_sizes)
    if not sizes or any(not isinstance(b, int) or b < 1 for b in sizes):
        raise ValueError(f"batch_sizes={sizes!r}: allowed one or more integers >= 1")
    if any(not isinstance(w, int) or w < 1 for w in widths):
        raise ValueError(f"widths={list(widths)!r}: allowed integers >= 1 (window slots)")
    extra = list(prompt_widths or [])
    if any(not isinstance(p, int) or p < 1 for p in extra):
        raise ValueError(f"prompt_widths={extra!r}: allowed integers >= 1 (prompt columns)")
    if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
        raise ValueError(f"capacity={capacity!r}: allowed an integer >= 1 (batch slots)")
    device = getattr(model, "device", torch.device("cpu"))
    if compile is None:
        compile = torch.device(device).type == "cuda"
    if not compile:
        return WarmupReport(0, 0, 0.0, ())
    began = time.perf_counter()
    capacity = max(capacity, max(sizes)) if capacity is not None else slot_bucket(max(sizes))
    buckets = sorted({b for w in widths for b in WIDTH_BUCKETS if b <= width_bucket(min(w, WIDTH_BUCKETS[-1]))})
    conditions = list(conditions) if conditions is not None else [_default_condition(model)]
    plans = [(c, None) for c in conditions] + [(conditions[0], p) for p in extra]
    made = held = 0
    shapes: list[StepShape] = []
    seen: set[tuple] = set()
    for condition, width in plans:
        session = make_static(model.start([condition], 1, guided), compile=True, capacity=capacity, prompt_width=width)
        try:
            if session._buffer_key(session._P) in seen:
                continue
            seen.add(session._buffer_key(session._P))
            session.prefill()
            dev = session._dev
            for shape in session.step_shapes(buckets):
                shapes.append(shape)
                if shape in session.buffers.steps:
                    held += 1
                    continue
                session.kv.cache.visible = shape.visible
                # every slot empty (width 0); three distinct tensors, as a forward passes (dynamo guards on aliasing)
                tokens, start, empty = (torch.zeros(*size, dtype=torch.long, device=dev)
                                        for size in ((shape.batch, shape.width), (shape.batch,), (shape.batch,)))
                session._call_window_step(tokens, start, empty)
                made += 1
        finally:
            session.release()
    return WarmupReport(made, held, time.perf_counter() - began, tuple(shapes))
