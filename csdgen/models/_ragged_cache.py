"""The ragged session's KV cache: one transformers ``DynamicCache`` whose rows hold each image's own
sequence at its own length (left padding and holes masked), with the attention masks and positions
built from it, rollback by length and compaction when holes waste space.
"""

from __future__ import annotations

from typing import Any

import torch

from ..transfer import to_device, to_device_all

__all__ = ["RaggedCache", "additive_mask", "causal_mask"]


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[R, S, T]`` bool (True: the query may attend the column) -> the additive ``[R, 1, S, T]`` mask
    in ``dtype`` (0 where allowed, else its most negative value), on ``allowed``'s device."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min)[:, None]


def causal_mask(valid: torch.Tensor, new: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive 4-D attention mask of a forward appending ``new`` columns, built on ``valid``'s device.

    Column ``s`` of the new ones (cache column ``T + s``) sees the valid cached and new columns up
    to itself. transformers uses a 4-D mask as given, where from a 2-D one it decides whether
    anything is masked by reading the mask back to the host (a host sync) for a 1-column forward.

    Args:
        valid: ``[R, T + S]`` int64 or bool, 1 where a cached or new column holds one of the row's tokens.
        new: S, the new columns (the last ``S`` of ``valid``).
        dtype: the model's float dtype (the mask holds 0 or its most negative value).

    Returns:
        ``[R, 1, S, T + S]`` ``dtype``.
    """
    R, width = valid.shape
    column = torch.arange(width, device=valid.device)
    query = torch.arange(width - new, width, device=valid.device)
    return additive_mask(valid.bool()[:, None, :] & (column[None, :] <= query[:, None])[None], dtype)


class RaggedCache:
    """A ``DynamicCache`` whose rows hold sequences of different lengths (see the module docstring).

    Args:
        cache: an empty transformers ``DynamicCache`` (its layers expose ``keys`` / ``values``
            ``[R, heads, T, head_dim]``).
        rows: R, the number of rows.
        device: where attention masks and position ids go.

    Attributes:
        valid: ``[R, T]`` bool CPU, True where column ``t`` of row ``r`` holds one of its tokens.
        lengths: ``[R]`` int64 CPU, valid columns per row (the row's sequence length).
    """

    #: compact when more than this fraction of the width is wasted on every row
    COMPACT_FRACTION = 0.25

    def __init__(self, cache: Any, rows: int, device: Any):
        self.cache = cache
        self.device = torch.device(device)
        self.valid = torch.zeros(rows, 0, dtype=torch.bool)
        self.lengths = torch.zeros(rows, dtype=torch.long)
        self.ids = torch.zeros(rows, 0, dtype=torch.long, device=self.device)  # the ids in the cache, per column

    @property
    def dtype(self) -> torch.dtype:
        """The float dtype of the cached keys (float32 before the first forward)."""
        layers = getattr(self.cache, "layers", None) or []
        keys = getattr(layers[0], "keys", None) if layers else None
        return keys.dtype if isinstance(keys, torch.Tensor) and keys.is_floating_point() else torch.float32

    @property
    def width(self) -> int:
        """T, the physical width of the cache (holes included)."""
        return self.valid.shape[1]

    @property
    def rows(self) -> int:
        return self.valid.shape[0]

    def inputs(self, new_valid: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Attention mask and position ids for a forward appending ``S`` columns.

        Args:
            new_valid: ``[R, S]`` bool CPU, which of the new columns row ``r`` uses.

        Returns:
            ``(attention_mask [R, T + S] int64 or None when nothing is masked, position_ids
            [R, S] int64)`` on the device, copied there in one queued copy
            (:func:`csdgen.transfer.to_device_all`, no host sync). The position of a valid column is
            the number of valid columns before it in its row; a hole gets its row's last position (unused).
        """
        mask, positions = self.host_inputs(new_valid)
        if mask is None:
            return None, to_device(positions, self.device)
        mask, positions = to_device_all([mask, positions], self.device)
        return mask, positions

    def host_inputs(self, new_valid: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """:meth:`inputs` on the host: ``(attention_mask [R, T + S] int64 CPU or None, position_ids [R, S] int64 CPU)``."""
        new_valid = new_valid.to(torch.bool).cpu()
        positions = (self.lengths[:, None] + new_valid.long().cumsum(1) - 1).clamp(min=0)
        mask = torch.cat([self.valid, new_valid], dim=1)
        return (None if bool(mask.all()) else mask.long()), positions

    def tree_inputs(self, new_valid: torch.Tensor, offsets: torch.Tensor, sees: torch.Tensor,
                    dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention mask and position ids for a forward appending ``S`` *tree* columns (draft trees).

        New column ``s`` of row ``r`` sees the row's valid cached columns and the new columns
        ``t`` with ``sees[r, s, t]`` (itself and its ancestors); its position is the row's length
        plus ``offsets[r, s]``. transformers uses a 4-D mask as given (no causal mask is added),
        as an additive float mask in the eager and SDPA attentions.

        Args:
            new_valid: ``[R, S]`` bool CPU; offsets: ``[R, S]`` int64 CPU; sees: ``[R, S, S]`` bool CPU;
            dtype: the model's float dtype (the mask holds 0 or its most negative value).

        Returns:
            ``(attention_mask [R, 1, S, T + S] dtype, position_ids [R, S] int64)`` on the device.
        """
        new_valid = new_valid.to(torch.bool).cpu()
        R, S = new_valid.shape
        past = self.valid[:, None, :].expand(R, S, self.width)
        tree = (sees & new_valid[:, None, :]) | torch.eye(S, dtype=torch.bool)[None]  # a padding column sees itself
        allowed, positions = to_device_all([torch.cat([past, tree], dim=2), self.lengths[:, None] + offsets], self.device)
        return additive_mask(allowed, dtype), positions

    def drop_new(self, keep: torch.Tensor) -> None:
        """Make the last ``S`` columns holes where ``keep`` (``[R, S]`` bool CPU) is False."""
        S = keep.shape[1]
        self.valid[:, self.width - S :] &= keep.to(torch.bool).cpu()
        self.lengths = self.valid.sum(1)

    def append(self, new_valid: torch.Tensor, ids: torch.Tensor | None = None) -> None:
        """Record the ``[R, S]`` columns the last forward appended to the cache (and their ids, for inspection)."""
        new_valid = new_valid.to(torch.bool).cpu()
        ids = torch.zeros(new_valid.shape, dtype=torch.long) if ids is None else ids
        self.ids = torch.cat([self.ids, ids.to(self.device, torch.long)], dim=1)
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        self.lengths = self.lengths + new_valid.sum(1)

    def truncate(self, keep: torch.Tensor) -> None:
        """Keep the first ``keep[r]`` tokens of every row ``r`` (``[R]`` int64 CPU, ``<= lengths``).

        Raises:
            ValueError: a ``keep`` outside ``0 .. lengths[r]``.
        """
        keep = keep.to(torch.long).cpu()
        if keep.shape != self.lengths.shape or bool(((keep < 0) | (keep > self.lengths)).any()):
            raise ValueError(f"keep={keep.tolist()}: allowed 0..{self.lengths.tolist()} per row")
        self.valid = self.valid & (self.valid.long().cumsum(1) <= keep[:, None])
        self.lengths = keep.clone()
        used = self.valid.any(0).nonzero()
        end = int(used[-1, 0]) + 1 if len(used) else 0
        self._crop(end)
        if self.rows and self.width - int(self.lengths.max()) > self.COMPACT_FRACTION * self.width:
            self.compact()

    def _crop(self, end: int) -> None:
        drop = self.width - end
        if drop > 0:
            self.cache.crop(-drop)  # transformers 5.x takes the number of columns to drop, negative
            self.valid = self.valid[:, :end]
            self.ids = self.ids[:, :end]

    def compact(self) -> None:
        """Move every row's valid columns to the right end (holes first): width ``max(lengths)``."""
        longest = int(self.lengths.max()) if self.rows else 0
        if longest == self.width:
            return
        order = torch.sort(self.valid.to(torch.int8), dim=1, stable=True).indices[:, self.width - longest :]  # [R, L]
        index = to_device(order, self.device)
        row = torch.arange(self.rows, device=self.device)[:, None]
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            layer.keys = layer.keys.transpose(1, 2)[row, index].transpose(1, 2).contiguous()
            layer.values = layer.values.transpose(1, 2)[row, index].transpose(1, 2).contiguous()
        self.valid = self.valid.gather(1, order)
        self.ids = self.ids.gather(1, index)

    def select_rows(self, rows: torch.Tensor, rows_on_device: torch.Tensor | None = None) -> None:
        """Keep rows ``rows`` (``[R']`` int64 CPU) in that order; drop the others. ``rows_on_device``: the
        same indices already on the device (None: copied there here, queued)."""
        rows = rows.to(torch.long).cpu()
        rows_dev = to_device(rows, self.device) if rows_on_device is None else rows_on_device
        self.cache.batch_select_indices(rows_dev)
        self.valid = self.valid[rows]
        self.lengths = self.lengths[rows]
        self.ids = self.ids[rows_dev]
        used = self.valid.any(0).nonzero()
        self._crop(int(used[-1, 0]) + 1 if len(used) else 0)

    def merge(self, other: "RaggedCache", split: tuple[int, int] | None = None) -> None:
        """Append ``other``'s rows to this cache's (continuous batching), in one copy per layer.

        The narrower cache's rows are left-padded with hole columns to the common width (their
        valid columns keep their order and positions), so every row holds the same sequence as
        before. ``split=(B, B')``: both caches hold their conditional rows first, then as many
        unconditional ones (guidance); the merged rows are ``[cond of self, cond of other, uncond
        of self, uncond of other]``. Without ``split``: this cache's rows, then ``other``'s.

        Args:
            other: a RaggedCache of the same model (same layers, heads and head size); consumed.

        Raises:
            ValueError: caches whose layers differ.
        """
        R1, R2, T = self.rows, other.rows, max(self.width, other.width)
        if split is None:
            mine, theirs = [(0, R1, 0)], [(0, R2, R1)]  # (first row, end row, destination row)
        else:
            B1, B2 = split
            mine, theirs = [(0, B1, 0), (B1, R1, B1 + B2)], [(0, B2, B1), (B2, R2, R1 + B2)]

        def place(out: torch.Tensor, parts: list, src: torch.Tensor, dim: int) -> None:  # right-aligned along dim
            width = src.shape[dim]
            for lo, hi, dst in parts:
                if hi > lo:
                    out[dst : dst + hi - lo].narrow(dim, out.shape[dim] - width, width).copy_(src[lo:hi])

        for a_layer, b_layer in zip(self.cache.layers, other.cache.layers):
            ready = [getattr(layer, "keys", None) is not None and layer.keys.numel() > 0 for layer in (a_layer, b_layer)]
            if not any(ready):
                continue
            if not all(ready):
                raise ValueError("merge: one cache has a layer the other has not filled (caches of different models?)")
            for name in ("keys", "values"):
                a, b = getattr(a_layer, name), getattr(b_layer, name).to(getattr(a_layer, name).device)
                if a.shape[1] != b.shape[1] or a.shape[3] != b.shape[3]:
                    raise ValueError(f"merge: cache {name} of shapes {tuple(a.shape)} and {tuple(b.shape)} "
                                     "(caches of different models?)")
                out = a.new_zeros(R1 + R2, a.shape[1], T, a.shape[3])
                place(out, mine, a, 2)
                place(out, theirs, b, 2)
                setattr(a_layer, name, out)
        valid = torch.zeros(R1 + R2, T, dtype=torch.bool)
        place(valid, mine, self.valid, 1)
        place(valid, theirs, other.valid, 1)
        ids = torch.zeros(R1 + R2, T, dtype=torch.long, device=self.device)
        place(ids, mine, self.ids, 1)
        place(ids, theirs, other.ids.to(self.device), 1)
        lengths = torch.zeros(R1 + R2, dtype=torch.long)
        place(lengths[:, None], mine, self.lengths[:, None], 1)
        place(lengths[:, None], theirs, other.lengths[:, None], 1)
        self.valid, self.ids, self.lengths = valid, ids, lengths

    def row_ids(self, row: int) -> torch.Tensor:
        """The ids of one row's valid columns, in order (its sequence as the cache holds it)."""
        return self.ids[row][self.valid[row].to(self.ids.device)]

    def row_entries(self, layer: int, row: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[heads, lengths[row], head_dim]`` of one row's valid columns (for tests)."""
        cached = self.cache.layers[layer]
        columns = self.valid[row].nonzero()[:, 0].to(cached.keys.device)
        return cached.keys[row][:, columns], cached.values[row][:, columns]
