"""The static session's cache: buffers allocated once per model and shape, rows written by index.

:class:`StaticBuffers` holds per layer ``[R, heads, T, head_dim]`` keys and values, the write
columns, the cached ids and the prompt rows; :class:`StaticRowCache` is a transformers ``Cache``
whose layers write a forward's columns at each row's own offset instead of concatenating. A
model's buffer sets are pooled (:func:`model_buffers`), so a new session of the same shape reuses them.
"""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from ._static_shapes import StepShape

__all__ = ["StaticRowCache", "StaticBuffers", "model_buffers"]


def _row_numbers(rows: int, columns: int, device: torch.device) -> torch.Tensor:
    """``[rows, columns]`` int64: row ``r`` holds ``r`` in every column (the first index of an index_put)."""
    return torch.arange(rows, device=device)[:, None].expand(rows, columns)


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
        owner.allocated()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        R, S = key_states.shape[0], key_states.shape[2]
        write = self._owner().write[:R, :S]
        keys, values = self.keys[:R], self.values[:R]
        # column s of row r goes to cache column write[r, s]: an index_put over (row, column) pairs, not a
        # scatter_ along the columns. On a CPU, scatter_ of bfloat16 took 63 us against index_put's 6 (8 rows,
        # 8 heads, 300 columns, 2 threads; torch 2.13), a third of a bfloat16 forward of the built-in model
        # at 4 images; in float32 the two cost the same.
        rows = _row_numbers(R, S, write.device)
        keys.transpose(1, 2).index_put_((rows, write), key_states.transpose(1, 2))
        values.transpose(1, 2).index_put_((rows, write), value_states.transpose(1, 2))
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
    ``visible``; every layer's ``update`` writes its keys and values there (no concatenation)
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
        self.on_allocate = None  # called when a layer allocates its buffers (StaticBuffers forgets its pointers)

    def allocated(self) -> None:
        if self.on_allocate is not None:
            self.on_allocate()

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
            view.transpose(1, 2).index_put_((_row_numbers(rows, target.shape[1], target.device), target),
                                            moved.transpose(1, 2))  # not scatter_: see _RowLayer.update


class StaticBuffers:
    """The device tensors a static session decodes in, and the compiled steps made over them.

    Args:
        capacity: batch slots; per_slot: physical rows per image (2 with guidance).
        width: T, cache columns per row; prompt_width: P, prompt columns (left-padded).
        device: the model's device; filler: the id of padding columns.
        key: the model store's key (None: the set belongs to one session).

    Attributes:
        cache: the :class:`StaticRowCache` (keys and values per layer, ``write`` ``[rows, T]`` int64).
        ids: ``[rows, T]`` int64, the id cached at every column (for inspection).
        prompt: ``[rows, 1 + T]`` int64: each row's visible prompt length, then 0/1 per column
            (1: a visible prompt column).
        prompt_ids: ``[rows, P]`` int64, the left-padded prompt ids (the prefill's input).
        steps: ``{StepShape: compiled or graphed step}`` made over these tensors.
    """

    def __init__(self, capacity: int, per_slot: int, width: int, prompt_width: int, device: Any, filler: int,
                 key: tuple | None = None):
        self.capacity, self.per_slot = capacity, per_slot
        self.rows = rows = capacity * per_slot
        self.width, self.prompt_width, self.device, self.key = width, prompt_width, torch.device(device), key
        self.cache = StaticRowCache(rows, width, device)
        self.cache.on_allocate = self._forget_pointers
        self.ids = torch.zeros(rows, width, dtype=torch.long, device=device)
        self.prompt = torch.zeros(rows, 1 + width, dtype=torch.long, device=device)
        self.prompt_ids = torch.full((rows, prompt_width), filler, dtype=torch.long, device=device)
        self.steps: dict[StepShape, Any] = {}
        self.graph_pool = None  # the CUDA graphs' memory pool (shared by this set's graphs)
        self.holder: weakref.ref | None = None  # the session decoding in this set (model-owned sets)
        self._pointers: tuple[int, ...] | None = None

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a window step reads or writes: keys and values, write columns, ids, prompt rows."""
        return [*self.cache.buffers(), self.cache.write, self.ids, self.prompt, self.prompt_ids]

    def pointers(self) -> tuple[int, ...]:
        """``data_ptr()`` of every tensor of :meth:`tensors` (what a CUDA graph bakes in)."""
        if self._pointers is None:
            self._pointers = tuple(t.data_ptr() for t in self.tensors())
        return self._pointers

    def _forget_pointers(self) -> None:
        self._pointers = None

    @property
    def free(self) -> bool:
        """No live session decodes in this set."""
        return self.holder is None or self.holder() is None

    def clear(self) -> None:
        """Zero the keys and values (a new session: stale columns are masked, but must be finite)."""
        for t in self.cache.buffers():
            t.zero_()

    def copy_from(self, old: "StaticBuffers", shift: int) -> None:
        """Copy ``old``'s rows into this set (at least as many rows and columns; everything else
        cleared), their columns moved right by ``shift`` (a wider prompt). This set's tensors stay
        the same objects (its steps stay valid); layers it has not allocated are allocated like ``old``'s."""
        rows, T = old.rows, old.width
        while len(self.cache.layers) < len(old.cache.layers):
            self.cache.layers.append(_RowLayer(self.cache))
        for layer, mine in zip(old.cache.layers, self.cache.layers):
            if not layer.is_initialized:
                continue
            for name in ("keys", "values"):
                t = getattr(layer, name)
                if mine.is_initialized:
                    target = getattr(mine, name)
                    target.zero_()
                else:
                    target = t.new_zeros(self.rows, t.shape[1], self.width, t.shape[3])
                    setattr(mine, name, target)
                target[:rows, :, shift:shift + T] = t
            mine.device, mine.is_initialized = layer.device, True
        for mine, theirs, offset in ((self.ids, old.ids, 0), (self.prompt, old.prompt, 1)):
            mine.zero_()
            mine[:rows, offset + shift:offset + shift + T] = theirs[:, offset:]
        self.prompt[:rows, 0] = old.prompt[:, 0]
        self.prompt_ids[:rows, shift:shift + old.prompt_width] = old.prompt_ids
        self._forget_pointers()


class _Store:
    """A model's buffer sets: ``{key: [StaticBuffers]}``, each handed to one session at a time;
    ``capacity``: the most batch slots of any set made (a new set gets at least as many, so that a
    smaller batch, or a new prompt bucket, runs the shapes of the slots already compiled)."""

    def __init__(self):
        self.sets: dict[tuple, list[StaticBuffers]] = {}
        self.capacity = 0
        self.lock = threading.Lock()

    def acquire(self, key: tuple, capacity: int, width: int, make, holder: Any) -> StaticBuffers:
        """A free set of ``key`` with at least ``capacity`` slots and ``width`` columns (the smallest),
        or a new one from ``make()`` (then the free sets of that key it supersedes are dropped),
        handed to ``holder`` (a session; the set is free again once it is released or freed)."""
        with self.lock:
            for attempt in range(2):
                sets = self.sets.setdefault(key, [])
                fits = [s for s in sets if s.free and s.capacity >= capacity and s.width >= width]
                if fits:
                    chosen = min(fits, key=lambda s: (s.capacity, s.width))
                    chosen.holder = weakref.ref(holder)
                    return chosen
                if attempt == 0 and any(not s.free and s.capacity >= capacity and s.width >= width for s in sets):
                    gc.collect()  # a finished session may still be held in a reference cycle
                else:
                    break
            sets[:] = [s for s in sets if not (s.free and s.capacity <= capacity and s.width <= width)]
            made = make()
            made.holder = weakref.ref(holder)
            sets.append(made)
            self.capacity = max(self.capacity, made.capacity)
            return made

    def drop(self, old: StaticBuffers) -> None:
        """Forget ``old`` (superseded by a larger set of its key): it and its steps are freed with it."""
        with self.lock:
            if old.key in self.sets:
                self.sets[old.key] = [s for s in self.sets[old.key] if s is not old]

    def all(self) -> list[StaticBuffers]:
        with self.lock:
            return [s for sets in self.sets.values() for s in sets]


_STORES: dict[int, _Store] = {}


def _store(model: Any, create: bool = True) -> _Store | None:
    """The buffer store of ``model`` (an adapter object), created on first use; None where ``model``
    cannot be weakly referenced (its sessions then own their buffers)."""
    if model is None:
        return None
    store = _STORES.get(id(model))
    if store is None and create:
        try:
            weakref.finalize(model, _STORES.pop, id(model), None)
        except TypeError:
            return None
        store = _STORES[id(model)] = _Store()
    return store


def model_buffers(model: Any) -> list[StaticBuffers]:
    """The buffer sets (and their compiled steps, :attr:`StaticBuffers.steps`) compiled static
    sessions of ``model`` (a family adapter) keep for the next session; empty if none."""
    store = _store(model, create=False)
    return store.all() if store is not None else []


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
