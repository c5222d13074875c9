"""A static-shape session: a preallocated per-row KV cache, window buckets, compiled forwards.

The ragged session (:mod:`csdgen.models._ragged`) keeps a transformers ``DynamicCache`` whose
width changes every iteration (concatenation on every forward, a crop on every rollback,
compaction now and then), so no two forwards have the same shapes and every forward pays
eager transformers' host cost. :class:`StaticSession` holds the same per-row sequences in
buffers allocated once (the layout of gpt-fast's static KV cache, generalised to rows at
different lengths):

* **buffers** (:class:`StaticBuffers`): per layer ``[R, heads, T, head_dim]`` keys and values,
  the write columns, the cached ids and the prompt rows of ``R = capacity x rows per image``
  physical rows. The prompt is left-padded to ``P = prompt_bucket(prompt width)`` columns
  (:data:`PROMPT_STEP`; padding masked) and the cache is ``T = cache_width(P, image columns,
  row-end columns)`` wide: the prompt in columns ``0 .. P - 1``, the image region (image tokens
  and row ends) from column ``P`` on, room for the widest window bucket after it, rounded up
  to 64. A forward writes its columns by index at each row's own offset
  (:class:`StaticRowCache`: a transformers ``Cache`` whose layers scatter instead of
  concatenate); a rollback is a length update; nothing is cropped or concatenated.
* **masks and positions** are built on the device from per-row region lengths (an additive
  ``[R, 1, S, T]`` mask in the dtype the model's attention computes in,
  :func:`attention_dtype`: the row's visible prompt columns and its region up to the query's
  own column; position ids ``prompt length + region offset``), so every row reads as the same
  sequence decoded alone (up to floating-point summation order; tested against the ragged
  session and a fresh prefill).
* **buckets**: a window of ``W`` slots runs as ``width_bucket(W)`` slots
  (:data:`WIDTH_BUCKETS` = 1, 2, 4, ..., 64; the padding slots are masked, as image ends
  already were), the images as ``batch_bucket(A, capacity)`` batch slots (powers of two as
  images finish), and a step attends over the columns in use rounded up to
  :data:`VISIBLE_STEP` (:data:`COMPILED_VISIBLE_STEP` when compiled).
* **batch slots**: image ``i`` of the session lives in a slot (with guidance its conditional and
  unconditional rows are physical rows ``2 * slot`` and ``2 * slot + 1``); finished images
  free their slot (:meth:`StaticSession.select_rows`), and only when the images left fit a
  smaller bucket are the live slots moved down (one gather per layer); images admitted into a
  running batch (:meth:`StaticSession.admit`, the server's continuous batching) take free slots,
  their prefilled keys and values copied in.

**Compiled sessions** (``compile=True``, the default on CUDA) decode in buffers owned by the
model, not by the session: the model's store (:func:`model_buffers`) keeps one buffer set per
(guidance, image layout, prompt bucket, dtype, device), handed to one session at a time and
reused by the next (every ``generate`` call, every batch of a server that drains to empty):
a session takes a free set of at least its capacity (its batch size rounded up to a power of
two, :func:`slot_bucket`, or the capacity asked for; at least the most slots of the model's
sets) and clears it, and gives it back when it ends (:meth:`StaticSession.release`, or when it
is garbage collected). The window step of each shape is ``torch.compile``\\ d (one dynamo variant
per :class:`StepShape`, under ``torch.no_grad``) and, on CUDA, captured as a CUDA graph
(:class:`_GraphedStep`) the first time its buffer set runs it; the compiled or graphed steps
live in their buffer set (:attr:`StaticBuffers.steps`) and are reused with it. A step records
the buffers it was made with (:attr:`_CompiledStep.pointers`); a graph checks them before every
replay. A set's tensors are never replaced: a session that needs more (batch slots past its
capacity, a wider prompt joining a running batch, a tree window wider than the cache) moves
into another set (a copy, :meth:`StaticSession._reallocate`); a set of another prompt bucket
stays in the store with its steps, a smaller set of the same kind is dropped with its steps.
Uncompiled sessions allocate a set of their own (exactly their batch size; nothing to reuse).

**The compiled shapes** of one buffer set are :func:`step_shapes`: batch slots
``1, 2, 4, ..., capacity`` x the window buckets a run uses x the attended-column buckets
``min(T, k * COMPILED_VISIBLE_STEP)``; a run visits one set per prompt bucket and guidance.
:func:`warmup` (``csdgen serve --warmup``) compiles and captures them before the first request.

The family adapter is unchanged: :func:`make_static` turns any
:class:`~csdgen.models._ragged.RaggedSession` that overrides only ``__init__``, ``_logits`` and
``_vocab_ids`` into a static one (its class gains :class:`StaticSession` in front), and the
adapter's ``_logits`` runs over this cache exactly as over a ``DynamicCache``.

Host syncs: none. Per forward the session copies one small int64 vector (slots, window starts
and widths) to the device (from pinned memory on CUDA).

Files, one idea each: this module is the session and the engine's choice (:func:`open_engine`,
:func:`make_static`); its shapes and buckets are :mod:`csdgen.models._static_shapes`, its cache
:mod:`csdgen.models._static_cache`, its compiled and graphed steps :mod:`csdgen.models._static_steps`
and the server's warm-up :mod:`csdgen.models._static_warmup` (the shapes' and cache's names are
re-exported here).
"""

from __future__ import annotations

import time
import weakref
from typing import Any, Sequence

import torch

from ..transfer import to_device
from ._ragged import RaggedSession, additive_mask, kept_tree_columns
from .base import WindowLogits, check_row_arguments, row_tensor
from ._static_shapes import (
    attention_dtype, batch_bucket, cache_width, COMPILED_VISIBLE_STEP, prompt_bucket, PROMPT_STEP, slot_bucket,
    step_shapes, StepShape, VISIBLE_STEP, width_bucket, WIDTH_BUCKETS, _round_up,
)
from ._static_cache import model_buffers, StaticBuffers, StaticRowCache, _store
from ._static_steps import _capture_failed, _CompiledStep, _GraphedStep

__all__ = [
    "WIDTH_BUCKETS",
    "PROMPT_STEP",
    "ENGINES",
    "width_bucket",
    "batch_bucket",
    "slot_bucket",
    "prompt_bucket",
    "cache_width",
    "StepShape",
    "step_shapes",
    "attention_dtype",
    "StaticBuffers",
    "StaticRowCache",
    "StaticSession",
    "model_buffers",
    "static_refusal",
    "make_static",
    "open_engine",
    "check_engine",
    "COMPILE_SECONDS",
]

#: the values of ``generate(engine=...)``
ENGINES = ("auto", "static", "eager")
#: seconds of the first call of every compiled shape in this process (compilation, warm-up and capture):
#: ``{(model class, guided, rows, columns, attended columns, cache width, prompt width, rows of the buffers): s}``
COMPILE_SECONDS: dict[tuple, float] = {}

_OWN_METHODS = ("prefill", "forward", "rollback", "select_rows", "forward_tree", "keep_path", "cache_lengths")


# -- the cache ------------------------------------------------------------------------------------


# -- buffers: one set per session, or the model's, reused across sessions ----------------------------


# -- compiled steps -------------------------------------------------------------------------------


class StaticSession(RaggedSession):
    """The per-row session over a preallocated cache (see the module docstring).

    Made by :func:`make_static` from a not yet prefilled
    :class:`~csdgen.models._ragged.RaggedSession` of a family adapter; the adapter's ``_logits``
    and ``_vocab_ids`` run unchanged. Logical rows are the ragged session's (``B`` conditional
    rows, then the ``B`` unconditional ones); :meth:`row_sequence` and ``kv.row_entries`` take
    those row indices, so the cache checks of the ragged session apply as they are.

    Attributes:
        compile: whether the window steps are compiled (and, on CUDA, captured as graphs).
        capacity: batch slots of the cache (uncompiled: the batch size it was opened with;
            compiled: at least its power of two, the model's buffer set it took).
        buffers: the :class:`StaticBuffers` it decodes in (compiled: the model's, see :meth:`release`).
        compile_seconds: ``{"rows x columns[/attended columns]": seconds}`` of every step this
            session made (compilation, warm-up and capture included); steps its buffer set
            already held from an earlier session cost nothing and are not listed.
        width_buckets: :data:`WIDTH_BUCKETS` (``window="auto"`` prices widths per bucket).
    """

    engine = "static"
    width_buckets = WIDTH_BUCKETS
    #: the loop's rollback probe is not needed: a rollback here is a length update
    rollback_probe = False
    #: rows join a running batch (:meth:`admit`): into free batch slots of the capacity it was opened with
    supports_admission = True

    def admit(self, other) -> None:
        """Join the images of ``other`` (a prefilled static session of the same model, guidance and
        image layout, opened for them alone) into free batch slots of this session: their keys,
        values and prompt columns are copied into this cache, the prompts right-aligned to this
        session's prompt width (a wider prompt first widens every row's prompt columns, a copy of
        the cache); the batch bucket grows where the images need it, and the capacity (a copy of the cache
        into one with more slots) where they do not fit. Every
        row then reads as the sequence decoded alone (tested against a fresh session).

        Raises:
            ValueError: another model, guidance or image layout; a session not prefilled.
        """
        self._check_admission(other)
        B, k = self.batch_size, other.batch_size
        if B + k > self.capacity:
            self._grow_capacity(slot_bucket(B + k) if self.compile else max(B + k, 2 * self.capacity))
        if other._P > self._P:
            self._widen_prompt(other._P)
        shift = self._P - other._P
        bucket = max(self._bucket, batch_bucket(B + k, self.capacity))
        used = torch.zeros(bucket, dtype=torch.bool)
        used[self._slots] = True
        slots = (~used).nonzero()[:, 0][:k]  # [k] the new images' slots
        src, dst = other._physical(other._slots), self._physical(slots)
        src_dev, dst_dev = self._to_device(src), self._to_device(dst)
        n = min(other.width, self.width - shift)  # other's columns that land inside this cache
        for mine, theirs in zip(self.kv.cache.layers, other.kv.cache.layers):
            for name in ("keys", "values"):
                target, source = getattr(mine, name), getattr(theirs, name)
                target[dst_dev] = 0
                target[dst_dev, :, shift:shift + n] = source[src_dev, :, :n].to(target.dtype)
        ids = self.kv.ids
        ids[dst_dev] = 0
        ids[dst_dev, shift:shift + n] = other.kv.ids[src_dev, :n]
        valid = torch.zeros(len(dst), self.width, dtype=torch.bool)
        valid[:, shift:shift + other._P] = other._prompt_valid_T[src, : other._P]
        self._prompt_valid_T[dst] = valid
        self._prompt_len[dst] = other._prompt_len[src]
        self._prompt_dev[dst_dev] = torch.cat([self._prompt_len[dst][:, None], valid.long()], 1).to(self._dev)
        phys_ids = torch.full((len(dst), self._P), self.filler, dtype=torch.long, device=self._dev)
        phys_ids[:, shift:] = other._prompt_phys_ids[src_dev]
        self._prompt_phys_ids[dst_dev] = phys_ids
        self._region[slots] = other._region[other._slots]
        self._join_prompts(other)  # the logical rows, ordered as the ragged session orders them
        self._slots = torch.cat([self._slots, slots])
        self._lengths = torch.cat([self._lengths, other._lengths])
        self.batch_size = B + k
        self._bucket = bucket

    def _grow_capacity(self, capacity: int) -> None:
        """Make room for ``capacity`` batch slots (more than now): the images keep their slots in a set with more rows."""
        self._reallocate(capacity=capacity)

    def _widen_prompt(self, P: int) -> None:
        """Make every row's prompt ``P`` columns wide (more than now): the cache, ids and prompt rows
        move right by the difference into a set of that prompt width (positions are the rows'
        own, so nothing is recomputed)."""
        self._reallocate(prompt_width=P)

    def _reallocate(self, capacity: int | None = None, width: int | None = None, prompt_width: int | None = None) -> None:
        """Move the session into a buffer set with at least ``capacity`` slots, ``width`` columns and
        ``prompt_width`` prompt columns (old columns moved right by the prompt's growth).

        A set's tensors are never replaced, so a step made over a set stays valid for it: a
        compiled session takes the new set from the model's store (a free one it already holds,
        with its steps, or a new one) and gives the old one back, unless the new set supersedes
        it (same key, more slots or columns: the old set and its steps are then dropped); a
        session's own set is dropped with its steps."""
        old = self.buffers
        P = prompt_width or old.prompt_width
        shift = P - old.prompt_width
        C = max(capacity or 0, old.capacity, self._store.capacity if old.key is not None else 0)
        T = max(width or 0, self._cache_width(P), old.width + shift)
        if old.key is None:
            new = StaticBuffers(C, self._per_slot, T, P, self._dev, self.filler)
        else:
            key = self._buffer_key(P)
            new = self._store.acquire(key, C, T, lambda: StaticBuffers(C, self._per_slot, T, P, self._dev, self.filler, key),
                                      self)
        new.copy_from(old, shift)
        new.cache.visible = old.cache.visible
        self.buffers = new
        if old.key is not None and old.key != new.key:
            old.holder = None  # another prompt width: still valid, kept for later sessions
        else:
            if old.key is not None:
                self._store.drop(old)
            old.steps.clear()
            old.holder = None
        rows = new.rows
        valid = torch.zeros(rows, new.width, dtype=torch.bool)
        valid[: old.rows, shift:shift + old.width] = self._prompt_valid_T
        lengths = torch.zeros(rows, dtype=torch.long)
        lengths[: old.rows] = self._prompt_len
        region = torch.zeros(new.capacity, dtype=torch.long)
        region[: old.capacity] = self._region
        self._prompt_valid_T, self._prompt_len, self._region = valid, lengths, region
        self.capacity, self._P = new.capacity, P

    @property
    def batch_slots(self) -> int:
        """Batch slots the next forward runs (the batch bucket, :func:`batch_bucket`): what an
        iteration's time depends on, whatever number of images fills them (``window="auto"`` in a
        served batch keeps its times per bucket)."""
        return self._bucket

    def release(self) -> None:
        """Give a model-owned buffer set back to the model's store for the next session (the
        session must not be used afterwards). Nothing to do for a session's own set. A session
        that is garbage collected gives its set back too."""
        if self.buffers.key is not None and self.buffers.holder is not None and self.buffers.holder() is self:
            self.buffers.holder = None

    def _buffer_key(self, prompt_width: int) -> tuple:
        """The model store's key of a set for this session: guidance, image layout, prompt width, dtype, device."""
        return (self.guided, self.num_image_tokens, self.cols, self.row_end, self.filler, prompt_width, self._float,
                str(self._dev))

    def _cache_width(self, prompt_width: int) -> int:
        return cache_width(prompt_width, int(self.region_length(torch.tensor(self.num_image_tokens))),
                           self._extra_columns(WIDTH_BUCKETS[-1]))

    def _init_static(self, compile: bool, capacity: int | None = None, pooled: bool | None = None,
                     prompt_width: int | None = None) -> None:
        B = self.batch_size
        self.compile = bool(compile)
        C = max(B, capacity or B)
        if self.compile and capacity is None:  # a capacity asked for (a server's --max-batch) is kept as it is
            C = slot_bucket(C)
        self.compile_seconds: dict[str, float] = {}
        dev = self.prompt_ids.device
        self._dev = dev
        self._per_slot = 2 if self.guided else 1
        self._float = attention_dtype(getattr(self, "model", None))
        given = self.prompt_ids.shape[1]
        P = self._P = prompt_bucket(max(given, prompt_width or 1))
        T = self._cache_width(P)
        store = _store(getattr(self, "model", None)) if (self.compile if pooled is None else pooled) else None
        self._store = store
        if store is None:
            self.buffers = StaticBuffers(C, self._per_slot, T, P, dev, self.filler)
        else:
            key = self._buffer_key(P)
            C = max(C, store.capacity)
            self.buffers = store.acquire(key, C, T, lambda: StaticBuffers(C, self._per_slot, T, P, dev, self.filler, key),
                                         self)
            self.buffers.clear()
        self.kv = _StaticKV(self)
        self.capacity = C = self.buffers.capacity
        T = self.width
        rows = C * self._per_slot
        # physical prompt rows: slot i -> row i (unguided) or rows 2i (cond), 2i + 1 (uncond), left-padded to P
        phys = self._physical(torch.arange(B))  # [R] physical row of each logical row
        ids = torch.full((rows, P), self.filler, dtype=torch.long, device=dev)
        ids[phys.to(dev), P - given:] = self.prompt_ids
        valid = torch.zeros(rows, P, dtype=torch.bool)
        valid[phys, P - given:] = self.prompt_valid
        self.buffers.prompt_ids.copy_(ids)
        self._prompt_len = valid.sum(1)  # [rows] CPU
        self._prompt_valid_T = torch.zeros(rows, T, dtype=torch.bool)
        self._prompt_valid_T[:, :P] = valid
        self.buffers.prompt.copy_(torch.cat([self._prompt_len[:, None], self._prompt_valid_T.long()], 1).to(dev))
        self._slots = torch.arange(B)  # [B] CPU, the slot of every image (logical row)
        self._region = torch.zeros(C, dtype=torch.long)  # [C] CPU, region columns cached per slot
        self._bucket = batch_bucket(B, C)

    @property
    def _prompt_dev(self) -> torch.Tensor:
        """``[rows, 1 + T]`` int64 on the device: prompt lengths, then visible prompt columns (the buffers')."""
        return self.buffers.prompt

    @property
    def _prompt_phys_ids(self) -> torch.Tensor:
        """``[rows, P]`` int64 on the device: the left-padded prompt ids of every physical row (the buffers')."""
        return self.buffers.prompt_ids

    # -- layout helpers ---------------------------------------------------------------------------

    def _physical(self, slots: torch.Tensor) -> torch.Tensor:
        """Physical rows of the images in ``slots`` (``[n]`` CPU) in logical order: conds, then unconds."""
        if not self.guided:
            return slots.clone()
        return torch.cat([2 * slots, 2 * slots + 1])

    def _rows_of_bucket(self, bucket: int) -> int:
        return bucket * self._per_slot

    @property
    def width(self) -> int:
        """T, the cache columns per row."""
        return self.buffers.width

    def _extra_columns(self, width: int) -> int:
        """Row-end columns a window of ``width`` slots can hold at most."""
        return 0 if self.row_end is None else -(-width // self.cols)

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        """A queued copy of ``host`` to the session's device (pinned, non-blocking on CUDA: no host sync)."""
        return to_device(host, self._dev)

    # -- the device steps (compiled per shape when ``compile``) -----------------------------------

    def _run(self, ids, mask, positions, write, out, prefill: bool = False):
        """The model on ``[R, S]`` columns of physical rows ``0 .. R - 1`` written at cache columns ``write``."""
        R, S = ids.shape
        self.kv.cache.write[:R, :S].copy_(write)
        self.kv.ids[:R].scatter_(1, write, ids)
        return self._logits(ids, mask, positions, out, prefill=prefill)

    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """``[R, S, T]`` bool -> the additive ``[R, 1, S, T]`` mask in the attention's dtype (0 or its minimum)."""
        return additive_mask(allowed, self._float)

    def _window_step(self, tokens: torch.Tensor, start: torch.Tensor, widths: torch.Tensor) -> torch.Tensor:
        """One window over every batch slot of a bucket: ``[slots, W]`` codebook ids, ``[slots]`` starts
        and widths (int64 on the device; an empty slot has width 0) -> logits ``[rows, W, V]`` of the
        physical rows. Pure tensor code over fixed shapes (what is compiled and captured)."""
        A, W = tokens.shape
        dev = tokens.device
        slot = torch.arange(W, device=dev)
        live = slot[None] < widths[:, None]
        vocab = self._vocab_ids(tokens)
        if self.row_end is None:
            ends = torch.zeros(A, W, dtype=torch.long, device=dev)
            region = start
        else:
            ends = (live & ((start[:, None] + slot + 1) % self.cols == 0)).long()
            region = start + start // self.cols
        S = W + self._extra_columns(W)
        col = slot + ends.cumsum(1) - ends  # [A, W] the column of each slot
        ids = torch.full((A, S + 1), self.filler, dtype=torch.long, device=dev)
        ids.scatter_(1, col, vocab)
        if self.row_end is not None:
            ids.scatter_(1, torch.where(ends.bool(), col + 1, S), self.row_end)
        ids = ids[:, :S]
        out = col + ends
        if self.guided:
            ids, region, out = ids.repeat_interleave(2, 0), region.repeat_interleave(2, 0), out.repeat_interleave(2, 0)
        R = ids.shape[0]
        prompt = self._prompt_dev[:R]
        column = torch.arange(S, device=dev)
        write = self._P + region[:, None] + column  # [R, S] cache column of every new column
        positions = prompt[:, 0:1] + region[:, None] + column
        visible = self.kv.cache.visible
        t = torch.arange(visible, device=dev)
        allowed = prompt[:, None, 1:visible + 1].bool() | ((t >= self._P) & (t[None, None] <= write[:, :, None]))
        return self._run(ids, self._mask(allowed), positions, write, out)

    def _set_visible(self, region_columns: int) -> None:
        """The cache columns the next step attends over: the prompt and ``region_columns`` region
        columns rounded up to :data:`VISIBLE_STEP` (:data:`COMPILED_VISIBLE_STEP` when compiled: each
        rounding is one more compiled shape), at most the cache width."""
        cache = self.kv.cache
        step = COMPILED_VISIBLE_STEP if self.compile else VISIBLE_STEP
        cache.visible = min(cache.width, _round_up(self._P + region_columns, step))

    def _step_shape(self, tokens: torch.Tensor) -> StepShape:
        A, W = tokens.shape
        return StepShape(self.guided, self.capacity, A, W, self.kv.cache.visible, self._P, self.width)

    def step_shapes(self, widths: Sequence[int] = WIDTH_BUCKETS) -> list[StepShape]:
        """:func:`step_shapes` of this session's buffer set: every compiled step it can run with windows
        in the buckets ``widths``."""
        return step_shapes(guided=self.guided, capacity=self.capacity, prompt_width=self._P,
                           image_columns=int(self.region_length(torch.tensor(self.num_image_tokens))),
                           row_end_columns=self._extra_columns(WIDTH_BUCKETS[-1]), widths=widths, columns=self.width)

    def _call_window_step(self, tokens, start, widths):
        """The window step, compiled per shape when ``compile`` (and replayed as a CUDA graph on CUDA),
        under ``torch.no_grad``."""
        with torch.no_grad():
            if not self.compile:
                return self._window_step(tokens, start, widths)
            shape = self._step_shape(tokens)
            runner = self.buffers.steps.get(shape)
            if runner is not None:
                return runner(self, tokens, start, widths)
            return self._make_step(shape, tokens, start, widths)

    def _make_step(self, shape: StepShape, tokens, start, widths) -> torch.Tensor:
        """Compile (and on CUDA capture) the step of ``shape`` over this session's buffers, run it once."""
        began = time.perf_counter()
        runner = None
        if self._dev.type == "cuda":
            try:
                runner = _GraphedStep(shape, self.buffers, self, (tokens, start, widths))
            except Exception as error:  # a shape that cannot be captured runs compiled, without a graph
                _capture_failed(shape, error)
        if runner is None:
            runner = _CompiledStep(shape, self.buffers)
        logits = runner(self, tokens, start, widths)
        if self._dev.type == "cuda":
            torch.cuda.synchronize(self._dev)
        seconds = time.perf_counter() - began
        rows, width, visible = self._rows_of_bucket(shape.batch), shape.width, shape.visible
        COMPILE_SECONDS.setdefault((type(self).__name__, self.guided, rows, width, visible, self.width, self._P,
                                    self.buffers.rows), seconds)
        # "rows x window columns", and "/ attended columns" where that is not the whole cache
        self.compile_seconds[f"{rows}x{width}" + (f"/{visible}" if visible < self.width else "")] = seconds
        self.buffers.steps[shape] = runner
        return logits

    # -- DecodingSession ----------------------------------------------------------------------------

    def prefill(self) -> WindowLogits:
        if self._lengths is not None:
            raise ValueError("prefill runs once per session")
        R, P, dev = self._rows_of_bucket(self._bucket), self._P, self._dev
        self.kv.cache.visible = self.width
        valid = self._prompt_valid_T[:R, :P]
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)
        s = torch.arange(P)
        t = torch.arange(self.width)
        allowed = (self._prompt_valid_T[:R, None, :] & (t[None, None] <= s[None, :, None])) | (t[None, None] == s[None, :, None])
        write = s.expand(R, P)
        out = torch.full((R, 1), P - 1, dtype=torch.long)
        with torch.no_grad():
            logits = self._run(self._prompt_phys_ids[:R], self._mask(allowed.to(dev)), positions.to(dev), write.to(dev),
                               out.to(dev), prefill=True)
        self._lengths = torch.zeros(self.batch_size, dtype=torch.long)
        return self._logical(logits, 1, self._to_device(self._slots))

    def _logical(self, logits: torch.Tensor, width: int, slots: torch.Tensor) -> WindowLogits:
        """Physical-row logits ``[rows, S, V]`` -> the images' ``[B, width, V]`` (cond, uncond); ``slots``
        ``[B]`` int64 on the device, the images' slots."""
        if not self.guided:
            return WindowLogits(logits.index_select(0, slots)[:, :width], None)
        pairs = logits.view(-1, 2, *logits.shape[1:])
        return WindowLogits(pairs[:, 0].index_select(0, slots)[:, :width], pairs[:, 1].index_select(0, slots)[:, :width])

    def _slot_vectors(self, start: torch.Tensor, widths: torch.Tensor, bucket: int) -> torch.Tensor:
        """``[B + 2 * bucket]`` int64 CPU: the images' slots, then every slot's window start and width."""
        s_start = torch.zeros(bucket, dtype=torch.long)
        s_widths = torch.zeros(bucket, dtype=torch.long)
        s_start[self._slots] = start
        s_widths[self._slots] = widths
        return torch.cat([self._slots, s_start, s_widths])

    def forward(self, tokens, start, widths=None):
        B, W, start, widths = self._window_arguments(tokens, start, widths)
        Wb, A = width_bucket(W), self._bucket
        self._ensure_width(Wb + self._extra_columns(Wb))
        packed = self._to_device(self._slot_vectors(start, widths, A))
        slots, s_start, s_widths = packed[:B], packed[B : B + A], packed[B + A :]
        padded = torch.zeros(A, Wb, dtype=torch.long, device=self._dev)
        padded[slots, :W] = tokens
        self._set_visible(int(self.region_length(start.max() + Wb)) + self._extra_columns(Wb) if B else 0)
        logits = self._call_window_step(padded, s_start, s_widths)
        self._region[self._slots] = self.region_length(start + widths)
        self._lengths = start + widths
        return self._logical(logits, W, slots)

    def rollback(self, lengths):
        lengths = self._rollback_lengths(lengths)
        self._region[self._slots] = self.region_length(lengths)
        self._lengths = lengths.clone()

    def select_rows(self, rows):
        rows = row_tensor(rows, len(torch.as_tensor(rows).reshape(-1)))
        self._slots = self._slots[rows]
        self._lengths = None if self._lengths is None else self._lengths[rows]
        self.batch_size = len(rows)
        every = torch.cat([rows, rows + len(self.prompt_lengths) // 2]) if self.guided else rows
        self.prompt_ids = self.prompt_ids[self._to_device(every)]
        self.prompt_valid, self.prompt_lengths = self.prompt_valid[every], self.prompt_lengths[every]
        bucket = batch_bucket(max(len(rows), 1), self.capacity)
        if bucket < self._bucket:
            self._compact(bucket)

    def _compact(self, bucket: int) -> None:
        """Move the images in slots ``>= bucket`` into free slots below it (keys, values, prompt rows)."""
        moving = (self._slots >= bucket).nonzero()[:, 0]
        if len(moving):
            free = torch.ones(bucket, dtype=torch.bool)
            free[self._slots[self._slots < bucket]] = False
            targets = free.nonzero()[:, 0][: len(moving)]
            source, target = self._physical(self._slots[moving]), self._physical(targets)
            src, dst = self._to_device(source), self._to_device(target)
            self.kv.cache.move_rows(src, dst)
            self.kv.ids.index_copy_(0, dst, self.kv.ids.index_select(0, src))
            self._prompt_dev.index_copy_(0, dst, self._prompt_dev.index_select(0, src))
            self._prompt_phys_ids.index_copy_(0, dst, self._prompt_phys_ids.index_select(0, src))
            self._prompt_valid_T[target] = self._prompt_valid_T[source]
            self._prompt_len[target] = self._prompt_len[source]
            self._region[targets] = self._region[self._slots[moving]]
            self._slots[moving] = targets
        self._bucket = bucket

    @property
    def cache_lengths(self):
        if self._lengths is None:
            raise ValueError("cache_lengths before prefill")
        return self._lengths.clone()

    def row_sequence(self, row: int) -> torch.Tensor:
        """Logical row ``row``'s sequence as cached (visible prompt ids, then its image region): for tests."""
        return self.kv.row_ids(row)

    # -- the cache width ----------------------------------------------------------------------------

    def _ensure_width(self, columns: int) -> None:
        """Move into a wider buffer set when a forward of ``columns`` columns at the widest region
        would not fit (tree windows wider than 64 slots)."""
        needed = self._P + int(self.region_length(torch.tensor(self.num_image_tokens))) + columns
        if needed > self.width:
            self._reallocate(width=_round_up(needed, 64))

    # -- draft trees ---------------------------------------------------------------------------------

    def forward_tree(self, tokens, start, layout, valid):
        """A draft tree in one forward over the static cache (see RaggedSession.forward_tree): node
        columns are written after each row's region, each node sees the row's cache and its own
        ancestors (an additive mask built on the device), positions follow depth."""
        B, S, start, deepest = self._tree_arguments(tokens, start, layout, valid)
        col, end, S2, valid2, offsets, sees = self._tree_columns(start, layout, valid)
        Sb, Ob = width_bucket(S2), width_bucket(S)
        self._ensure_width(Sb)
        A, dev, slots = self._bucket, self._dev, self._slots
        # per batch slot, on the host (an empty slot: one column at region 0 that sees itself)
        ends = torch.zeros(B, S2 + 1, dtype=torch.bool).scatter_(1, torch.where(end, col + 1, S2), True)[:, :S2]
        s_kind = torch.zeros(A, Sb, dtype=torch.long)  # 0 hole, 1 node, 2 row end
        s_kind[slots, :S2] = ends.long() * 2
        s_kind[slots[:, None].expand(B, S), col] = 1
        s_region = torch.zeros(A, dtype=torch.long)
        s_region[slots] = self.region_length(start)
        s_offsets = torch.zeros(A, Sb, dtype=torch.long)
        s_offsets[slots, :S2] = offsets
        s_out = torch.zeros(A, Ob, dtype=torch.long)
        s_out[slots, :S] = torch.where(end, col + 1, col)
        s_index = torch.zeros(A, Sb, dtype=torch.long)  # node slot whose token sits at each column
        s_index[slots[:, None].expand(B, S), col] = torch.arange(S)[None].expand(B, S)
        s_sees = torch.eye(Sb, dtype=torch.bool).repeat(A, 1, 1)
        s_sees[slots, :S2, :S2] = (sees & valid2[:, None, :]) | torch.eye(S2, dtype=torch.bool)[None]
        packed = self._to_device(torch.cat([slots, s_region, s_kind.reshape(-1), s_offsets.reshape(-1), s_out.reshape(-1),
                                            s_index.reshape(-1)]))
        n = [B, A, A * Sb, A * Sb, A * Ob, A * Sb]
        slot_dev, region, kind, offsets_dev, out, index = torch.split(packed, n)
        kind, offsets_dev, out, index = kind.view(A, Sb), offsets_dev.view(A, Sb), out.view(A, Ob), index.view(A, Sb)
        sees_dev = self._to_device(s_sees)
        self.kv.cache.visible = self.width
        # on the device: ids, positions, write columns and the mask
        placed = torch.zeros(A, S, dtype=torch.long, device=dev)
        placed[slot_dev] = tokens.to(dev)
        vocab = self._vocab_ids(placed.gather(1, index.clamp(max=S - 1)))
        ids = torch.where(kind == 1, vocab, torch.full_like(vocab, self.filler))
        if self.row_end is not None:
            ids = ids.masked_fill(kind == 2, self.row_end)
        if self.guided:
            ids, out, region = ids.repeat_interleave(2, 0), out.repeat_interleave(2, 0), region.repeat_interleave(2, 0)
            offsets_dev, sees_dev = offsets_dev.repeat_interleave(2, 0), sees_dev.repeat_interleave(2, 0)
        R = ids.shape[0]
        prompt = self._prompt_dev[:R]
        column = torch.arange(Sb, device=dev)
        write = self._P + region[:, None] + column
        positions = prompt[:, 0:1] + region[:, None] + offsets_dev
        t = torch.arange(self.width, device=dev)
        past = prompt[:, 1:].bool() | ((t >= self._P) & (t < (self._P + region)[:, None]))
        allowed = past[:, None, :].expand(R, Sb, self.width).clone()
        allowed.scatter_(2, write[:, None, :].expand(R, Sb, Sb), sees_dev)
        with torch.no_grad():
            logits = self._run(ids, self._mask(allowed), positions, write, out)
        self._tree = (start, col, end, S2)
        self._lengths = start + deepest + 1
        return self._logical(logits, S, slot_dev)

    def keep_path(self, path, lengths):
        """After :meth:`forward_tree`: move the root and the winning path's columns (and their row
        ends) to the front of the tree's columns; image positions ``0 .. lengths[b] - 1`` stay."""
        start, col, end, S2 = self._tree
        lengths = row_tensor(lengths, self.batch_size)
        check_row_arguments("keep_path lengths", lengths, self.batch_size, start, self._lengths)
        B = path.shape[0]
        keep = kept_tree_columns(path, lengths - start, col, end, S2)
        count = keep.sum(1)
        n = max(int(count.max()) if B else 0, 1)
        index = torch.arange(n)[None].expand(B, n)
        order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :n]  # kept columns first, in order
        source = torch.where(index < count[:, None], order, index)  # the rest: copied onto themselves
        A = self._bucket
        s_source = torch.arange(n)[None].repeat(A, 1)
        s_source[self._slots] = source
        region = torch.zeros(A, dtype=torch.long)
        region[self._slots] = self.region_length(start)
        base = self._P + region[:, None]
        src, dst = base + s_source, base + torch.arange(n)[None]
        if self.guided:
            src, dst = src.repeat_interleave(2, 0), dst.repeat_interleave(2, 0)
        R = A * self._per_slot
        moves = self._to_device(torch.stack([src, dst]))
        src, dst = moves[0], moves[1]
        self.kv.cache.move_columns(R, src, dst)
        ids = self.kv.ids[:R]
        ids.scatter_(1, dst, ids.gather(1, src))
        self._region[self._slots] = self.region_length(lengths)
        self._lengths = lengths.clone()
        self._tree = None


class _StaticKV:
    """The static session's cache and its inspection helpers (the ragged session's ``kv`` counterpart):
    ``cache`` and ``ids`` are the session's current buffer set's."""

    def __init__(self, session: StaticSession):
        self._session = weakref.ref(session)

    @property
    def cache(self) -> StaticRowCache:
        return self._session().buffers.cache

    @property
    def ids(self) -> torch.Tensor:
        return self._session().buffers.ids

    def _columns(self, row: int) -> tuple[int, torch.Tensor]:
        s = self._session()
        image, uncond = (row % s.batch_size, row >= s.batch_size) if s.guided else (row, False)
        slot = int(s._slots[image])
        phys = 2 * slot + int(uncond) if s.guided else slot
        prompt = s._prompt_valid_T[phys, : s._P].nonzero()[:, 0]
        region = s._P + torch.arange(int(s._region[slot]))
        return phys, torch.cat([prompt, region])

    def row_ids(self, row: int) -> torch.Tensor:
        """Ids of logical row ``row``'s cached columns, in order."""
        phys, columns = self._columns(row)
        return self.ids[phys][columns.to(self.ids.device)]

    def row_entries(self, layer: int, row: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[heads, columns, head_dim]`` of logical row ``row``'s cached columns (for tests)."""
        phys, columns = self._columns(row)
        cached = self.cache.layers[layer]
        columns = columns.to(cached.keys.device)
        return cached.keys[phys][:, columns], cached.values[phys][:, columns]


# -- choosing the engine --------------------------------------------------------------------------


def static_refusal(session: Any) -> str | None:
    """Why ``session`` cannot run on the static path (None: it can)."""
    if not isinstance(session, RaggedSession):
        return f"its session ({type(session).__name__}) is not a per-row transformers session (RaggedSession)"
    if isinstance(session, StaticSession):
        return None
    if getattr(type(session), "static_path", True) is False:  # a family whose rows carry state of their own
        return f"its session ({type(session).__name__}) keeps per-row state the static slots do not (static_path = False)"
    for name in _OWN_METHODS:
        if getattr(type(session), name) is not getattr(RaggedSession, name):
            return f"its session ({type(session).__name__}) overrides {name}"
    if getattr(session, "_lengths", None) is not None:
        return "its session is already prefilled"
    return None


_CLASSES: dict[type, type] = {}


def _static_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Static{cls.__name__.lstrip('_')}", (StaticSession, cls), {"__module__": cls.__module__})
    return _CLASSES[cls]


def make_static(session: RaggedSession, *, compile: bool = False, capacity: int | None = None,
                pooled: bool | None = None, prompt_width: int | None = None) -> StaticSession:
    """The static counterpart of a fresh (not prefilled) ragged session of a family adapter.

    Args:
        session: a :class:`~csdgen.models._ragged.RaggedSession` subclass instance that overrides
            only ``__init__``, ``_logits`` and ``_vocab_ids``, not yet prefilled.
        compile: compile each window shape (and capture it as a CUDA graph on CUDA); the default
            capacity is then the batch size rounded up to a power of two (:func:`slot_bucket`).
        capacity: batch slots to allocate (default: the session's batch size); a compiled session
            takes at least the most slots of the model's buffer sets.
        pooled: decode in a buffer set of the model's store, reused by later sessions (default:
            ``compile``); False: a set of its own (a session opened only to be admitted into
            another, :meth:`StaticSession.admit`).
        prompt_width: pad the prompt to the bucket of at least this many columns (:func:`warmup`).

    Raises:
        ValueError: a session the static path cannot take (:func:`static_refusal` says why), or a
            prompt_width < 1.
    """
    why = static_refusal(session)
    if why is not None:
        raise ValueError(f"engine='static' cannot be used: {why}; allowed: engine='eager' for this model")
    if prompt_width is not None and prompt_width < 1:
        raise ValueError(f"prompt_width={prompt_width}: allowed >= 1 (columns)")
    if isinstance(session, StaticSession):
        return session
    static = object.__new__(_static_class(type(session)))
    static.__dict__.update(session.__dict__)
    static._init_static(compile, capacity, pooled, prompt_width)
    return static


def check_engine(engine: Any) -> None:
    """Raise ValueError unless ``engine`` is one of :data:`ENGINES` (naming the allowed ones)."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}: allowed {', '.join(map(repr, ENGINES))}")


def open_engine(session: Any, engine: str, compile: bool | None, capacity: int | None = None) -> Any:
    """The session the loop decodes with: ``session`` itself (``"eager"``, or ``"auto"`` where the
    static path does not apply) or its static counterpart (``"static"``, or ``"auto"`` for every
    RaggedSession family).

    Args:
        session: what ``model.start`` returned (not yet prefilled).
        engine: one of :data:`ENGINES`.
        compile: compile the static path's forwards; None: on CUDA only (CPU compilation takes
            tens of seconds per shape, which a short run does not win back).
        capacity: batch slots of a static session (default: the session's batch size).

    Raises:
        ValueError: an unknown engine, ``engine="static"`` where it does not apply, or ``compile``
            with the eager engine.
    """
    check_engine(engine)
    if compile and engine == "eager":
        raise ValueError("compile=True with engine='eager': compiled forwards need the static engine; "
                         "allowed: engine='static' or 'auto' with compile=True, or compile=False")
    if engine == "eager" or (engine == "auto" and static_refusal(session) is not None):
        if compile and engine == "auto":
            raise ValueError(f"compile=True cannot be used: {static_refusal(session)}; allowed: compile=False for this model")
        return session
    device = getattr(session, "prompt_ids", torch.empty(0)).device
    if compile is None:
        compile = device.type == "cuda"
    return make_static(session, compile=compile, capacity=capacity)


# -- warm-up --------------------------------------------------------------------------------------


