"""Draft trees on the static session: a tree's nodes in one forward over the preallocated cache, then
the winning path's columns moved to the front.
"""

from __future__ import annotations

import torch

from ._ragged_windows import kept_tree_columns
from ._static_shapes import width_bucket
from .base import check_row_arguments, row_tensor


class StaticTrees:
    """The draft-tree forward and path keeping of :class:`~csdgen.models._static.StaticSession` (a mixin over its cache)."""

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
