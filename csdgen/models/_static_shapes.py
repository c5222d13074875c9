"""The static session's shapes: window, batch, slot and prompt buckets, the cache's width, and the
step shapes a session compiles (one compiled forward per :class:`StepShape`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import torch

__all__ = ["WIDTH_BUCKETS", "PROMPT_STEP", "VISIBLE_STEP", "COMPILED_VISIBLE_STEP", "width_bucket", "batch_bucket", "slot_bucket", "prompt_bucket", "cache_width", "StepShape", "step_shapes", "attention_dtype"]


#: window widths a static session runs (a window of W slots runs as the smallest bucket >= W)
WIDTH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


#: prompts up to this many columns are padded to a power of two, longer ones to a multiple of it (:func:`prompt_bucket`)
PROMPT_STEP = 64


#: uncompiled static steps attend over the columns in use rounded up to this many (StaticRowCache.visible)
VISIBLE_STEP = 64


#: compiled steps attend over the columns in use rounded up to this many (each rounding is one more
#: compiled shape: a 256-token image at batch 1 visits 3; attending over the whole cache, 384
#: columns, made a compiled 32-wide step at batch 1 slower than the eager one, 24.1 against 22.7 ms)
COMPILED_VISIBLE_STEP = 128


def width_bucket(width: int) -> int:
    """The bucket a window of ``width`` slots runs as: the smallest of :data:`WIDTH_BUCKETS` that
    holds it, beyond 64 (tree windows) the next power of two."""
    if width < 1:
        raise ValueError(f"width={width}: allowed >= 1")
    for bucket in WIDTH_BUCKETS:
        if width <= bucket:
            return bucket
    return 1 << (width - 1).bit_length()


def batch_bucket(images: int, capacity: int, compiled: bool = True) -> int:
    """Batch slots a forward runs with ``images`` images in a session of ``capacity`` slots.

    Compiled (every bucket one more compiled shape and CUDA graph): the next power of two, at most
    the capacity. Uncompiled: ``images`` itself (at least 1, at most the capacity), since a forward
    costs what its slots hold and nothing is compiled per shape (built-in model, 2-core CPU, width 1:
    12 images take 20.3 ms per iteration in 12 slots, 23.2 ms in 16;
    benchmarks/results/static_batch_slots.md).
    """
    if not compiled:
        return min(capacity, max(images, 1))
    return min(capacity, 1 << max(images - 1, 0).bit_length())


def slot_bucket(images: int) -> int:
    """Batch slots a compiled session allocates for ``images`` images: the next power of two
    (so a batch of 3 after a batch of 4 runs the same shapes)."""
    if images < 1:
        raise ValueError(f"images={images}: allowed >= 1")
    return 1 << (images - 1).bit_length()


def prompt_bucket(width: int) -> int:
    """Columns a prompt of ``width`` columns is left-padded to: the next power of two up to
    :data:`PROMPT_STEP`, beyond it the next multiple of :data:`PROMPT_STEP` (at most 63 masked
    columns), so prompts of many lengths share a few cache layouts and compiled shapes."""
    if width < 1:
        raise ValueError(f"prompt width={width}: allowed >= 1")
    if width <= PROMPT_STEP:
        return 1 << (width - 1).bit_length()
    return _round_up(width, PROMPT_STEP)


def cache_width(prompt_width: int, image_columns: int, row_end_columns: int = 0) -> int:
    """T, the cache columns of a row: the prompt bucket, the image region (``image_columns``: image
    tokens and row ends), room for the widest window bucket (64 slots and ``row_end_columns`` row
    ends) past the region's end, rounded up to 64."""
    return _round_up(prompt_width + image_columns + WIDTH_BUCKETS[-1] + row_end_columns, 64)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class StepShape(NamedTuple):
    """One compiled window step: the static shapes a dynamo variant (and a CUDA graph) is made for.

    Attributes:
        guided: two physical rows per image (guidance) or one.
        slots: batch slots of the buffer set (its capacity).
        batch: batch slots the step runs (``batch_bucket``); rows = batch x rows per image.
        width: window slots (``width_bucket``).
        visible: cache columns attended over.
        prompt: prompt columns (``prompt_bucket``).
        columns: T, the cache width.
    """

    guided: bool
    slots: int
    batch: int
    width: int
    visible: int
    prompt: int
    columns: int


def step_shapes(*, guided: bool, capacity: int, prompt_width: int, image_columns: int, row_end_columns: int = 0,
                widths: Sequence[int] = WIDTH_BUCKETS, columns: int | None = None) -> list[StepShape]:
    """Every compiled window step a buffer set can run: the documented bound of a run's compiles.

    Args:
        guided: guidance rows. capacity: batch slots of the set (a power of two for compiled sessions).
        prompt_width: P, the (bucketed) prompt columns. image_columns: region columns of a whole
            image (image tokens and row ends). row_end_columns: row ends a 64-slot window can hold.
        widths: the window buckets the run uses (default every :data:`WIDTH_BUCKETS`).
        columns: T (default :func:`cache_width`).

    Returns:
        the shapes, sorted: ``batch`` in 1, 2, 4, ... up to the capacity (and the capacity) x
        ``widths`` x attended columns ``min(T, k * COMPILED_VISIBLE_STEP)`` for every ``k`` a
        window can reach.

    Raises:
        ValueError: a capacity or prompt width < 1, a width not in :data:`WIDTH_BUCKETS`.
    """
    if capacity < 1 or prompt_width < 1:
        raise ValueError(f"capacity={capacity}, prompt_width={prompt_width}: allowed >= 1")
    bad = [w for w in widths if w not in WIDTH_BUCKETS]
    if bad:
        raise ValueError(f"widths {bad}: allowed window buckets {WIDTH_BUCKETS}")
    T = columns or cache_width(prompt_width, image_columns, row_end_columns)
    batches = sorted({batch_bucket(a, capacity) for a in range(1, capacity + 1)})
    visible = sorted({min(T, _round_up(prompt_width + r, COMPILED_VISIBLE_STEP)) for r in range(1, T - prompt_width + 1)})
    return sorted(StepShape(bool(guided), capacity, a, w, v, prompt_width, T) for a in batches for w in set(widths)
                  for v in visible)


def attention_dtype(owner: Any) -> torch.dtype:
    """The float dtype a family adapter's transformer computes attention in (what its additive mask must be).

    Looked up on ``owner`` (a family adapter, e.g. ``session.model``): its ``attention_dtype``
    attribute if it has one; else the first parameter of the first decoder layer
    (a module whose class name ends in ``DecoderLayer``) of its modules; else the dtype of its
    input embeddings; else its first floating parameter; else float32. The first floating
    parameter alone is not enough: a Janus checkpoint keeps its vision tower in float32 beside a
    bfloat16 language model.
    """
    declared = getattr(owner, "attention_dtype", None)
    if isinstance(declared, torch.dtype):
        return declared
    modules = [owner] if isinstance(owner, torch.nn.Module) else [
        m for m in (getattr(owner, name, None) for name in ("backbone", "model")) if isinstance(m, torch.nn.Module)]
    for module in modules:
        for sub in module.modules():
            if type(sub).__name__.endswith("DecoderLayer"):
                for p in sub.parameters():
                    if p.is_floating_point():
                        return p.dtype
    for module in modules:
        embeddings = getattr(module, "get_input_embeddings", None)
        try:
            weight = embeddings().weight if embeddings is not None else None
        except (NotImplementedError, AttributeError):
            weight = None
        if isinstance(weight, torch.Tensor) and weight.is_floating_point():
            return weight.dtype
    for module in modules:
        for p in module.parameters():
            if p.is_floating_point():
                return p.dtype
    return torch.float32
