"""A static-shape session: a preallocated per-row KV cache, window buckets, compiled forwards.

The ragged session (:mod:`csdgen.models._ragged`) keeps a transformers ``DynamicCache`` whose
width changes every iteration (concatenation on every forward, a crop on every rollback,
compaction now and then), so no two forwards have the same shapes and every forward pays
eager transformers' host cost. :class:`StaticSession` holds the same per-row sequences in
buffers allocated once (the layout of gpt-fast's static KV cache, generalised to rows at
different lengths):

* **cache**: per layer ``[R, heads, T, head_dim]`` keys and values with
  ``T = P + region_length(N) + slack`` rounded up to a multiple of 64 (``P`` the padded prompt
  width); row ``r``'s prompt sits in columns ``0 .. P - 1`` (left-padded, padding masked) and
  its image region (image tokens and row ends) from column ``P`` on, region column ``k`` at
  cache column ``P + k``. A forward writes its columns by index at each row's own offset
  (:class:`StaticRowCache`: a transformers ``Cache`` whose layers scatter instead of
  concatenate); a rollback is a length update; nothing is cropped or concatenated.
* **masks and positions** are built on the device from per-row region lengths (an additive
  ``[R, 1, S, T]`` mask: the row's visible prompt columns and its region up to the query's own
  column; position ids ``prompt length + region offset``), the way a 2-D padding mask and
  per-row lengths would be, so every row reads as the same sequence decoded alone (up to
  floating-point summation order; tested against the ragged session and a fresh prefill).
* **buckets**: a window of ``W`` slots runs as ``width_bucket(W)`` slots
  (:data:`WIDTH_BUCKETS` = 1, 2, 4, ..., 64; the padding slots are masked, as image ends
  already were), and the images as ``batch_bucket(A, capacity)`` batch slots (the capacity,
  then powers of two as images finish), so one run visits a handful of static shapes
  ``(batch slots, window bucket)``.
* **batch slots**: image ``i`` of the session lives in a slot (with guidance its conditional and
  unconditional rows are physical rows ``2 * slot`` and ``2 * slot + 1``); finished images
  free their slot (:meth:`StaticSession.select_rows`), and only when the images left fit a
  smaller bucket are the live slots moved down (one gather per layer); images admitted into a
  running batch (:meth:`StaticSession.admit`, the server's continuous batching) take free slots,
  their prefilled keys and values copied in.
* **compiled forwards** (``compile=True``): the window step (layout, mask, model forward,
  head) of each shape (batch slots, window bucket, attended columns rounded up to
  :data:`COMPILED_VISIBLE_STEP`) is ``torch.compile``\\ d on first use, cached across sessions of the
  model (:data:`COMPILE_SECONDS` records the first call of each shape); on CUDA each shape is
  then captured as a CUDA graph (:class:`_GraphedStep`) and replayed.

The family adapter is unchanged: :func:`make_static` turns any
:class:`~csdgen.models._ragged.RaggedSession` that overrides only ``__init__``, ``_logits`` and
``_vocab_ids`` into a static one (its class gains :class:`StaticSession` in front), and the
adapter's ``_logits`` runs over this cache exactly as over a ``DynamicCache``.

Host syncs: none. Per forward the session copies one small int64 vector (slots, window starts
and widths) to the device (from pinned memory on CUDA).
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ._ragged import RaggedSession, kept_tree_columns
from .base import WindowLogits, check_row_arguments, row_tensor

__all__ = [
    "WIDTH_BUCKETS",
    "ENGINES",
    "width_bucket",
    "batch_bucket",
    "StaticRowCache",
    "StaticSession",
    "static_refusal",
    "make_static",
    "open_engine",
    "check_engine",
    "COMPILE_SECONDS",
]

#: window widths a static session runs (a window of W slots runs as the smallest bucket >= W)
WIDTH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
#: the values of ``generate(engine=...)``
ENGINES = ("auto", "static", "eager")
#: cache columns kept past the image region for the widest window (rounded up with the rest to 64)
SLACK = 64
#: uncompiled static steps attend over the columns in use rounded up to this many (StaticRowCache.visible)
VISIBLE_STEP = 64
#: compiled steps attend over the columns in use rounded up to this many (each rounding is one more
#: compiled shape: a 256-token image at batch 1 visits 3; attending over the whole cache, 384
#: columns, made a compiled 32-wide step at batch 1 slower than the eager one, 24.1 against 22.7 ms)
COMPILED_VISIBLE_STEP = 128
#: seconds of the first call of every compiled shape: ``{(model class, guided, rows, columns, attended columns, cache width): s}``
COMPILE_SECONDS: dict[tuple, float] = {}

_OWN_METHODS = ("prefill", "forward", "rollback", "select_rows", "forward_tree", "keep_path", "cache_lengths")


def width_bucket(width: int) -> int:
    """The bucket a window of ``width`` slots runs as: the smallest of :data:`WIDTH_BUCKETS` that
    holds it, beyond 64 (tree windows) the next power of two."""
    if width < 1:
        raise ValueError(f"width={width}: allowed >= 1")
    for bucket in WIDTH_BUCKETS:
        if width <= bucket:
            return bucket
    return 1 << (width - 1).bit_length()


def batch_bucket(images: int, capacity: int) -> int:
    """Batch slots a forward runs with ``images`` images in a session of ``capacity`` slots: the
    next power of two, at most the capacity."""
    return min(capacity, 1 << max(images - 1, 0).bit_length())


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


# -- the cache ------------------------------------------------------------------------------------


class _RowLayer(CacheLayerMixin):
    """One layer of :class:`StaticRowCache`: ``keys`` / ``values`` ``[rows, heads, width, head_dim]``,
    allocated on the first update; an update writes column ``s`` of physical row ``r`` at cache
    column ``cache.write[r, s]`` and returns the first ``R`` rows, columns ``0 .. cache.visible - 1``
    (the mask hides the ones a row does not use)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, owner: "StaticRowCache"):
        super().__init__()
        self._owner = weakref.ref(owner)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        owner = self._owner()
        rows, width = owner.rows, owner.width
        heads, device = key_states.shape[1], key_states.device
        self.keys = torch.zeros(rows, heads, width, key_states.shape[-1], dtype=key_states.dtype, device=device)
        self.values = torch.zeros(rows, value_states.shape[1], width, value_states.shape[-1], dtype=value_states.dtype,
                                  device=device)
        self.device = device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        R, H, S, D = key_states.shape
        write = self._owner().write[:R, :S]
        keys, values = self.keys[:R], self.values[:R]
        keys.scatter_(2, write[:, None, :, None].expand(R, H, S, D), key_states)
        values.scatter_(2, write[:, None, :, None].expand(R, values.shape[1], S, values.shape[-1]), value_states)
        visible = self._owner().visible
        return keys[:, :, :visible], values[:, :, :visible]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._owner().visible, 0

    def get_seq_length(self) -> int:
        return 0  # positions are always given explicitly

    def get_max_length(self) -> int:
        return self._owner().width


class StaticRowCache(Cache):
    """A transformers ``Cache`` over preallocated ``[rows, heads, width, head_dim]`` buffers per layer.

    Before a forward of ``S`` columns over physical rows ``0 .. R - 1`` the session fills
    ``write[:R, :S]`` (int64, on the device) with the cache column of each new column and sets
    ``visible``; every layer's ``update`` scatters its keys and values there (no concatenation)
    and returns columns ``0 .. visible - 1`` of those rows, which the caller's 4-D mask restricts.
    ``visible`` is the columns in use rounded up to :data:`VISIBLE_STEP`, or to
    :data:`COMPILED_VISIBLE_STEP` for compiled steps (each rounding one compiled shape), so that
    attention costs what the rows' lengths need, not the whole preallocated width.

    Args:
        rows: physical rows (every batch slot, both guidance rows); width: T, columns per row.
        device: where ``write`` lives (the layers allocate on the model's device at the first update).
    """

    def __init__(self, rows: int, width: int, device: Any):
        super().__init__(layer_class_to_replicate=None, layers=[])
        self.rows, self.width = rows, width
        self.visible = width
        self.write = torch.zeros(rows, width, dtype=torch.long, device=device)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        while len(self.layers) <= layer_idx:
            self.layers.append(_RowLayer(self))
        return self.layers[layer_idx].update(key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.visible, 0

    def buffers(self) -> list[torch.Tensor]:
        """Every key and value buffer (allocated layers only)."""
        return [t for layer in self.layers if layer.is_initialized for t in (layer.keys, layer.values)]

    def move_rows(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """Copy physical rows ``source`` to rows ``target`` (``[n]`` int64 on the device) in every layer."""
        for buffer in self.buffers():
            buffer.index_copy_(0, target, buffer.index_select(0, source))

    def move_columns(self, rows: int, source: torch.Tensor, target: torch.Tensor) -> None:
        """Per row: copy columns ``source[r]`` to ``target[r]`` (``[rows, n]`` int64 on the device)."""
        for buffer in self.buffers():
            view = buffer[:rows]
            H, D = view.shape[1], view.shape[3]
            moved = view.gather(2, source[:, None, :, None].expand(rows, H, source.shape[1], D))
            view.scatter_(2, target[:, None, :, None].expand(rows, H, target.shape[1], D), moved)


# -- compiled steps -------------------------------------------------------------------------------


def _compile_backend_ok() -> None:
    # every (batch slots, window bucket, guidance) shape is one more compiled variant of the same code
    import torch._dynamo

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < 256:
            setattr(config, name, 256)
    if hasattr(config, "accumulated_recompile_limit") and config.accumulated_recompile_limit < 4096:
        config.accumulated_recompile_limit = 4096


_COMPILED: dict[str, Any] = {}


def _compiled(name: str, fn):
    """``torch.compile(fn)``, one wrapper per step kind (dynamo keeps one variant per static shape)."""
    if name not in _COMPILED:
        _compile_backend_ok()
        _COMPILED[name] = torch.compile(fn, dynamic=False)
    return _COMPILED[name]


class _GraphedStep:
    """A CUDA graph of one window step shape, captured on first use and replayed afterwards.

    The step's inputs are copied into static buffers, the graph replays the recorded kernels
    (the cache buffers it writes are the session's own, allocated once), and the output is
    cloned out of the graph's memory pool. A capture that fails (an operation that cannot be
    captured) raises; the session then runs that shape compiled without a graph.
    """

    def __init__(self, fn, example: tuple[torch.Tensor, ...], pool):
        self.fn = fn
        self.inputs = tuple(t.clone() for t in example)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the graph (same inputs: the cache writes repeat)
            for _ in range(2):
                fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.output = fn(*self.inputs)

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        for static, value in zip(self.inputs, args):
            static.copy_(value)
        self.graph.replay()
        return self.output.clone()


# -- the session ----------------------------------------------------------------------------------


class StaticSession(RaggedSession):
    """The per-row session over a preallocated cache (see the module docstring).

    Made by :func:`make_static` from a not yet prefilled
    :class:`~csdgen.models._ragged.RaggedSession` of a family adapter; the adapter's ``_logits``
    and ``_vocab_ids`` run unchanged. Logical rows are the ragged session's (``B`` conditional
    rows, then the ``B`` unconditional ones); :meth:`row_sequence` and ``kv.row_entries`` take
    those row indices, so the cache checks of the ragged session apply as they are.

    Attributes:
        compile: whether the window steps are compiled (and, on CUDA, captured as graphs).
        capacity: batch slots of the cache (the batch size it was opened with).
        compile_seconds: ``{"rows x columns[/attended columns]": seconds}`` of the first call of every compiled
            shape this session ran (compilation, warm-up and capture included).
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
            self._grow_capacity(max(B + k, 2 * self.capacity))
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
        """Make room for ``capacity`` batch slots (more than now): every per-row buffer is copied into
        one with more rows (the images keep their slots)."""
        rows = capacity * self._per_slot
        old = self.kv.cache.rows
        cache = self.kv.cache

        def more(t: torch.Tensor, fill=0) -> torch.Tensor:
            grown = torch.full((rows, *t.shape[1:]), fill, dtype=t.dtype, device=t.device)
            grown[:old] = t
            return grown

        for layer in cache.layers:
            if layer.is_initialized:
                layer.keys, layer.values = more(layer.keys), more(layer.values)
        cache.rows = rows
        cache.write = more(cache.write)
        self.kv.ids = more(self.kv.ids)
        self._prompt_phys_ids = more(self._prompt_phys_ids, self.filler)
        self._prompt_valid_T = more(self._prompt_valid_T, False)
        self._prompt_len = more(self._prompt_len)
        self._prompt_dev = more(self._prompt_dev)
        self._region = torch.cat([self._region, torch.zeros(capacity - self.capacity, dtype=torch.long)])
        self.capacity = capacity

    def _widen_prompt(self, P: int) -> None:
        """Make every row's prompt ``P`` columns wide (more than now): the cache, ids and prompt
        buffers move right by the difference into a cache wide enough for the image after it
        (positions are the rows' own, so nothing is recomputed); compiled steps are dropped."""
        shift = P - self._P
        T = _round_up(P + int(self.region_length(torch.tensor(self.num_image_tokens))) + SLACK, 64)
        T = max(T, self.width + shift)
        old = self.width
        self.kv.grow(T, shift)
        valid = torch.zeros(self._prompt_valid_T.shape[0], T, dtype=torch.bool)
        valid[:, shift:shift + old] = self._prompt_valid_T
        self._prompt_valid_T = valid
        self._prompt_dev = torch.cat([self._prompt_len[:, None], valid.long()], 1).to(self._dev)
        phys = torch.full((self._prompt_phys_ids.shape[0], P), self.filler, dtype=torch.long, device=self._dev)
        phys[:, shift:] = self._prompt_phys_ids
        self._prompt_phys_ids = phys
        self._P = P
        self._steps.clear()

    def _init_static(self, compile: bool, capacity: int | None = None) -> None:
        B, R = self.batch_size, self.prompt_ids.shape[0]
        self.capacity = C = max(B, capacity or B)
        self.compile = bool(compile)
        self.compile_seconds: dict[str, float] = {}
        dev = self.prompt_ids.device
        self._dev = dev
        self._per_slot = 2 if self.guided else 1
        rows = C * self._per_slot
        P = self.prompt_ids.shape[1]
        self._P = P
        # physical prompt rows: slot i -> row i (unguided) or rows 2i (cond), 2i + 1 (uncond)
        phys = self._physical(torch.arange(B))  # [R] physical row of each logical row
        ids = torch.full((rows, P), self.filler, dtype=torch.long, device=dev)
        ids[phys.to(dev)] = self.prompt_ids
        valid = torch.zeros(rows, P, dtype=torch.bool)
        valid[phys] = self.prompt_valid
        self._prompt_phys_ids = ids
        self._prompt_len = valid.sum(1)  # [rows] CPU
        T = _round_up(P + int(self.region_length(torch.tensor(self.num_image_tokens))) + SLACK, 64)
        self.kv = _StaticKV(self, rows, T)
        self._prompt_valid_T = torch.zeros(rows, T, dtype=torch.bool)
        self._prompt_valid_T[:, :P] = valid
        self._prompt_dev = torch.cat([self._prompt_len[:, None], self._prompt_valid_T.long()], 1).to(dev)
        self._slots = torch.arange(B)  # [B] CPU, the slot of every image (logical row)
        self._region = torch.zeros(C, dtype=torch.long)  # [C] CPU, region columns cached per slot
        self._bucket = batch_bucket(B, C)
        self._steps: dict[tuple, Any] = {}  # compiled (or graphed) window step per shape
        self._pool = None
        self._float = self._model_dtype()

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
        return self.kv.cache.width

    def _extra_columns(self, width: int) -> int:
        """Row-end columns a window of ``width`` slots can hold at most."""
        return 0 if self.row_end is None else -(-width // self.cols)

    def _to_device(self, host: torch.Tensor) -> torch.Tensor:
        if self._dev.type == "cuda":
            return host.pin_memory().to(self._dev, non_blocking=True)
        return host.to(self._dev)

    # -- the device steps (compiled per shape when ``compile``) -----------------------------------

    def _run(self, ids, mask, positions, write, out, prefill: bool = False):
        """The model on ``[R, S]`` columns of physical rows ``0 .. R - 1`` written at cache columns ``write``."""
        R, S = ids.shape
        self.kv.cache.write[:R, :S].copy_(write)
        self.kv.ids[:R].scatter_(1, write, ids)
        return self._logits(ids, mask, positions, out, prefill=prefill)

    def _mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """``[R, S, T]`` bool -> the additive ``[R, 1, S, T]`` mask in the model's float dtype (0 or its minimum)."""
        dtype = self._float
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            ~allowed, torch.finfo(dtype).min)[:, None]

    def _model_dtype(self) -> torch.dtype:
        """The float dtype of the adapter's transformer (its first floating parameter; float32 if none is found)."""
        owner = getattr(self, "model", None)
        for name in ("backbone", "model"):
            module = getattr(owner, name, None)
            if isinstance(module, torch.nn.Module):
                for p in module.parameters():
                    if p.is_floating_point():
                        return p.dtype
        return torch.float32

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

    def _call_window_step(self, tokens, start, widths):
        """The window step, compiled per shape when ``compile`` (and replayed as a CUDA graph on CUDA)."""
        if not self.compile:
            return self._window_step(tokens, start, widths)
        visible = self.kv.cache.visible
        key = (*tokens.shape, visible)
        runner = self._steps.get(key)
        if runner is not None:
            return runner(tokens, start, widths)
        began = time.perf_counter()
        step = _compiled("window", _window_step_fn)
        session = weakref.ref(self)

        def runner(*args):
            return step(session(), *args)

        if self._dev.type == "cuda":
            try:
                if self._pool is None:
                    self._pool = torch.cuda.graph_pool_handle()
                runner = _GraphedStep(runner, (tokens, start, widths), self._pool)
            except Exception as error:  # a shape that cannot be captured runs compiled, without a graph
                import warnings

                warnings.warn(f"CUDA graph capture of the static window step {key} failed ({error}); "
                              "it runs compiled without a graph", RuntimeWarning, stacklevel=2)
        logits = runner(tokens, start, widths)
        if self._dev.type == "cuda":
            torch.cuda.synchronize(self._dev)
        seconds = time.perf_counter() - began
        rows, width = self._rows_of_bucket(key[0]), key[1]
        COMPILE_SECONDS.setdefault((type(self).__name__, self.guided, rows, width, visible, self.width), seconds)
        # "rows x window columns", and "/ attended columns" where that is not the whole cache
        self.compile_seconds[f"{rows}x{width}" + (f"/{visible}" if visible < self.width else "")] = seconds
        self._steps[key] = runner
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
        if self._lengths is None:
            raise ValueError("forward before prefill: call prefill() first")
        B, W = tokens.shape
        start = row_tensor(start, B)
        widths = torch.full((B,), W, dtype=torch.long) if widths is None else row_tensor(widths, B)
        check_row_arguments("start", start, self.batch_size, self._lengths, self._lengths)
        check_row_arguments("widths", widths, self.batch_size, 0, torch.clamp(self.num_image_tokens - 1 - start, max=W))
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
        if self._lengths is None:
            raise ValueError("rollback before prefill")
        lengths = row_tensor(lengths, self.batch_size)
        check_row_arguments("rollback lengths", lengths, self.batch_size, 0, self._lengths)
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
        """Grow the cache (a copy, and new compiled shapes) when a forward of ``columns`` columns at
        the widest region would not fit (wide tree windows)."""
        needed = self._P + int(self.region_length(torch.tensor(self.num_image_tokens))) + columns
        if needed <= self.width:
            return
        T = _round_up(needed, 64)
        self.kv.grow(T)
        grown = torch.zeros(self._prompt_valid_T.shape[0], T, dtype=torch.bool)
        grown[:, : self._prompt_valid_T.shape[1]] = self._prompt_valid_T
        self._prompt_valid_T = grown
        self._prompt_dev = torch.cat([self._prompt_len[:, None], grown.long()], 1).to(self._dev)
        self._steps.clear()

    # -- draft trees ---------------------------------------------------------------------------------

    def forward_tree(self, tokens, start, layout, valid):
        """A draft tree in one forward over the static cache (see RaggedSession.forward_tree): node
        columns are written after each row's region, each node sees the row's cache and its own
        ancestors (an additive mask built on the device), positions follow depth."""
        if self._lengths is None:
            raise ValueError("forward_tree before prefill: call prefill() first")
        B, S = tokens.shape
        start = row_tensor(start, B)
        check_row_arguments("start", start, self.batch_size, self._lengths, self._lengths)
        deepest = torch.where(valid, layout.depth[None], -1).max(1).values
        check_row_arguments("tree depth", deepest, self.batch_size, -1, self.num_image_tokens - 1 - start)
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


def _window_step_fn(session: StaticSession, tokens, start, widths):
    return session._window_step(tokens, start, widths)


class _StaticKV:
    """The static session's cache and its inspection helpers (the ragged session's ``kv`` counterpart)."""

    def __init__(self, session: StaticSession, rows: int, width: int):
        self._session = weakref.ref(session)
        self.cache = StaticRowCache(rows, width, session._dev)
        self.ids = torch.zeros(rows, width, dtype=torch.long, device=session._dev)  # ids per column, for inspection

    def grow(self, width: int, shift: int = 0) -> None:
        """Widen every row to ``width`` columns (a copy into new buffers), its old columns moved
        right by ``shift`` (a wider prompt, :meth:`StaticSession._widen_prompt`)."""
        cache = self.cache
        old = cache.width
        for layer in cache.layers:
            if layer.is_initialized:
                for name in ("keys", "values"):
                    t = getattr(layer, name)
                    wider = t.new_zeros(t.shape[0], t.shape[1], width, t.shape[3])
                    wider[:, :, shift:shift + old] = t
                    setattr(layer, name, wider)
        cache.width = width
        cache.write = torch.zeros(cache.rows, width, dtype=torch.long, device=cache.write.device)
        wider = self.ids.new_zeros(self.ids.shape[0], width)
        wider[:, shift:shift + old] = self.ids
        self.ids = wider

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


def make_static(session: RaggedSession, *, compile: bool = False, capacity: int | None = None) -> StaticSession:
    """The static counterpart of a fresh (not prefilled) ragged session of a family adapter.

    Args:
        session: a :class:`~csdgen.models._ragged.RaggedSession` subclass instance that overrides
            only ``__init__``, ``_logits`` and ``_vocab_ids``, not yet prefilled.
        compile: compile each window shape (and capture it as a CUDA graph on CUDA).
        capacity: batch slots to allocate (default: the session's batch size).

    Raises:
        ValueError: a session the static path cannot take (:func:`static_refusal` says why).
    """
    why = static_refusal(session)
    if why is not None:
        raise ValueError(f"engine='static' cannot be used: {why}; allowed: engine='eager' for this model")
    if isinstance(session, StaticSession):
        return session
    static = object.__new__(_static_class(type(session)))
    static.__dict__.update(session.__dict__)
    static._init_static(compile, capacity)
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
