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
  already were), the images as ``batch_bucket(A, capacity)`` batch slots (compiled: powers of
  two as images finish, each one more compiled shape; uncompiled: exactly the images), and a step attends over the columns in use rounded up to
  :data:`VISIBLE_STEP` (:data:`COMPILED_VISIBLE_STEP` when compiled).
* **batch slots**: image ``i`` of the session lives in a slot (with guidance its conditional and
  unconditional rows are physical rows ``2 * slot`` and ``2 * slot + 1``); finished images
  free their slot (:meth:`StaticSession.select_rows`), and only when the images left fit a
  smaller bucket are the live slots moved down (one gather per layer; uncompiled, at every image
  that leaves); images admitted into a
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

Files, one idea each: this module is the session's window forward and the engine's choice
(:func:`open_engine`, :func:`make_static`); its shapes and buckets are
:mod:`csdgen.models._static_shapes`, its cache :mod:`csdgen.models._static_cache`, its compiled and
graphed steps :mod:`csdgen.models._static_steps`, images joining and leaving it
:mod:`csdgen.models._static_rows`, draft trees on it :mod:`csdgen.models._static_trees` and the
server's warm-up :mod:`csdgen.models._static_warmup` (the shapes' and cache's names are re-exported here).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from ..transfer import to_device
from ._ragged import RaggedSession
from ._ragged_cache import additive_mask
from .base import WindowLogits
from ._static_shapes import (
    attention_dtype, batch_bucket, cache_width, COMPILED_VISIBLE_STEP, prompt_bucket, PROMPT_STEP, slot_bucket,
    step_shapes, StepShape, VISIBLE_STEP, width_bucket, WIDTH_BUCKETS, _round_up,
)
from ._static_cache import StaticBuffers, StaticRowCache, _StaticKV, _store, model_buffers
from ._static_rows import StaticRows
from ._static_steps import _capture_failed, _CompiledStep, _GraphedStep
from ._static_trees import StaticTrees

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
    "split_model",
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


class StaticSession(StaticRows, StaticTrees, RaggedSession):
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

    @property
    def batch_slots(self) -> int:
        """The batch bucket an iteration's times are kept under (``window="auto"`` in a served batch
        keeps one time table per bucket): compiled, the slots the next forward runs
        (:func:`batch_bucket`), whatever number of images fills them; uncompiled, the forward runs
        exactly the images and is timed under their power-of-two bucket, so that a batch whose
        image count wanders pools its times in a few tables instead of one per count, each
        warmed up and explored on its own."""
        return self._bucket if self.compile else batch_bucket(self.batch_size, self.capacity)

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
        self._bucket = self._batch_bucket(B)

    def _batch_bucket(self, images: int) -> int:
        """:func:`batch_bucket` of this session (exact when uncompiled)."""
        return batch_bucket(images, self.capacity, self.compile)

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
        # a row admitted unprefilled (start -1, admit_unprefilled) feeds its prompt's last token first
        unprefilled = start == -1
        if self.guided:
            ids, region, out = ids.repeat_interleave(2, 0), region.repeat_interleave(2, 0), out.repeat_interleave(2, 0)
            unprefilled = unprefilled.repeat_interleave(2, 0)
        R = ids.shape[0]
        ids = torch.cat([torch.where(unprefilled, self._prompt_phys_ids[:R, -1], ids[:, 0])[:, None], ids[:, 1:]], 1)
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
        # the prompt attends over its own columns (rounded as a step's), not the whole cache width
        self._set_visible(0)
        valid = self._prompt_valid_T[:R, :P]
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)
        s = torch.arange(P)
        t = torch.arange(self.kv.cache.visible)
        allowed = ((self._prompt_valid_T[:R, None, : len(t)] & (t[None, None] <= s[None, :, None]))
                   | (t[None, None] == s[None, :, None]))
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
    if split_model(session):
        return ("its model is split across devices (device_map; modules offloaded to the CPU or disk count): the "
                "static engine's one preallocated cache and compiled steps do not follow layers that live, or are "
                "loaded, elsewhere; the eager engine keeps each layer's cache with its layer")
    return None


def split_model(session: Any) -> bool:
    """Whether the model a session drives is placed on more than one device (accelerate's device map;
    ``"disk"`` offload counts as a place)."""
    for value in vars(session).values():
        for placed in (getattr(value, "device_map", None), getattr(value, "hf_device_map", None)):
            if isinstance(placed, dict) and len({str(v) for v in placed.values()}) > 1:
                return True
    return False


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


