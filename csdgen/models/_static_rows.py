"""Images joining and leaving a running static session: admission into free slots (growing the
buffers or the prompt width when needed), row selection and compaction of the slots.
"""

from __future__ import annotations

import torch

from ._static_cache import StaticBuffers
from ._static_shapes import slot_bucket
from .base import row_tensor


class StaticRows:
    """The admission and row selection of :class:`~csdgen.models._static.StaticSession` (a mixin: it reads the session's slots, buffers and prompt rows)."""

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
        self._join(other, prefilled=True)

    def can_admit_unprefilled(self, other) -> bool:
        """Whether ``other`` (a static session not yet prefilled) can join by :meth:`admit_unprefilled`:
        images without row ends, and every row's prompt (conditional and unconditional) one token long."""
        return self.row_end is None and other.row_end is None and bool((other.prompt_lengths == 1).all())

    def admit_unprefilled(self, other) -> None:
        """Join the images of ``other`` (a static session of the same model, guidance and image layout,
        not prefilled; :meth:`can_admit_unprefilled`) into free batch slots without a forward of their
        own: their prompt rows are registered and nothing is cached. Their prefill is then the first
        column of their next window: such a row has cache length -1 and :meth:`forward` takes it at
        ``start=-1`` (``widths`` 1), feeding its prompt's one token at the last prompt column (position
        0) and returning the logits of image position 0, what :meth:`prefill` would have returned
        (tested against a prefilled admission). The engine folds it into the running batch's next
        iteration (:meth:`csdgen.engine.ContinuousBatch.admit`): an admission then costs no forward.

        Raises:
            ValueError: another model, guidance or image layout; a prefilled session, or one with a
                longer prompt or row ends (:meth:`can_admit_unprefilled`).
        """
        self._check_admission(other, unprefilled=True)
        if not self.can_admit_unprefilled(other):
            raise ValueError("admit_unprefilled: only images without row ends whose prompts are one token long "
                             f"(prompt lengths {sorted(set(other.prompt_lengths.tolist()))}, row end {other.row_end})")
        self._join(other, prefilled=False)

    def _join(self, other, prefilled: bool) -> None:
        """:meth:`admit` (``prefilled``) or :meth:`admit_unprefilled` after their checks."""
        B, k = self.batch_size, other.batch_size
        if B + k > self.capacity:
            self._grow_capacity(slot_bucket(B + k) if self.compile else max(B + k, 2 * self.capacity))
        if other._P > self._P:
            self._widen_prompt(other._P)
        shift = self._P - other._P
        bucket = max(self._bucket, self._batch_bucket(B + k))
        used = torch.zeros(bucket, dtype=torch.bool)
        used[self._slots] = True
        slots = (~used).nonzero()[:, 0][:k]  # [k] the new images' slots
        src, dst = other._physical(other._slots), self._physical(slots)
        src_dev, dst_dev = self._to_device(src), self._to_device(dst)
        n = min(other.width, self.width - shift)  # other's columns that land inside this cache
        # of those, the ones its rows use: the prompt and the region cached so far (a prefilled session: the
        # prompt alone). Columns past them are never attended unmasked (a row writes each region column
        # before a query reads it), so they are neither copied nor cleared: copying the whole width cost an
        # admission 6-7 ms of its 22-27 (one image into a running batch of 15, built-in model, 2-core CPU)
        used = min(n, other._P + (int(other._region[other._slots].max()) if other.batch_size else 0)) if prefilled else 0
        layers = zip(self.kv.cache.layers, other.kv.cache.layers) if used or shift else ()  # unprefilled: nothing cached
        for mine, theirs in layers:
            for name in ("keys", "values"):
                target, source = getattr(mine, name), getattr(theirs, name)
                if shift:  # the prompt's left padding in this cache (masked; cleared as the buffers start)
                    target[dst_dev, :, :shift] = 0
                target[dst_dev, :, shift:shift + used] = source[src_dev, :, :used].to(target.dtype)
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
        self._lengths = torch.cat([self._lengths, other._lengths if prefilled else torch.full((k,), -1, dtype=torch.long)])
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

    def select_rows(self, rows):
        rows = row_tensor(rows, len(torch.as_tensor(rows).reshape(-1)))
        self._slots = self._slots[rows]
        self._lengths = None if self._lengths is None else self._lengths[rows]
        self.batch_size = len(rows)
        every = torch.cat([rows, rows + len(self.prompt_lengths) // 2]) if self.guided else rows
        self.prompt_ids = self.prompt_ids[self._to_device(every)]
        self.prompt_valid, self.prompt_lengths = self.prompt_valid[every], self.prompt_lengths[every]
        bucket = self._batch_bucket(len(rows))
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
