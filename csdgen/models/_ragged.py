"""Per-row KV-cache bookkeeping over a transformers ``DynamicCache``: every row at its own length.

Batched decoding with per-image windows needs every row of the cache to hold a sequence of
its own length. A ``DynamicCache`` stores ``[R, heads, T, head_dim]`` tensors with one common
width ``T`` and appends the same number of columns to every row, so rows of different
lengths are stored the way left-padded prompts are: with **holes**, columns a row does not
use, hidden by the 2-D attention mask. Each row's position ids count its own valid columns
(as for left padding), so a row's keys and attention are those of the same sequence decoded
alone, up to floating-point summation order.

:class:`RaggedCache` keeps, on the host, which columns of which row are valid:

* :meth:`RaggedCache.inputs` gives the attention mask ``[R, T + S]`` and position ids
  ``[R, S]`` for ``S`` new columns, where row ``r`` uses only the columns marked in its
  ``new_valid`` row (padding slots, and row-end tokens some rows have and others not, are
  holes);
* :meth:`RaggedCache.append` records them after the forward;
* :meth:`RaggedCache.truncate` keeps the first ``keep[r]`` valid columns of each row (a
  per-row rollback): later columns become holes, the columns no row uses any more at the end
  are cropped, and when holes waste more than a quarter of the width the cache is compacted
  (valid columns of every row moved to the right end, like left padding: one gather per
  layer, about the cost of the copy ``DynamicCache.update`` makes on every forward);
* :meth:`RaggedCache.select_rows` drops rows (finished images).

Family-agnostic: a family adapter decides which of its sequence's tokens are valid; this
module knows nothing of image positions. The bookkeeping lives on the host (the engine hands
per-row lengths over from its one sync per iteration), so no call here waits for the device.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import WindowLogits

__all__ = ["RaggedCache", "split_guided"]


def split_guided(logits: torch.Tensor, batch_size: int, guided: bool) -> WindowLogits:
    """``[R, W, V]`` logits of all rows -> cond rows (first ``batch_size``), then the uncond rows (guided)."""
    if guided:
        return WindowLogits(logits[:batch_size], logits[batch_size:])
    return WindowLogits(logits, None)


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
            [R, S] int64)`` on the device. The position of a valid column is the number of
            valid columns before it in its row; a hole gets its row's last position (unused).
        """
        new_valid = new_valid.to(torch.bool).cpu()
        positions = (self.lengths[:, None] + new_valid.long().cumsum(1) - 1).clamp(min=0)
        mask = torch.cat([self.valid, new_valid], dim=1)
        mask = None if bool(mask.all()) else mask.long().to(self.device)
        return mask, positions.to(self.device)

    def append(self, new_valid: torch.Tensor) -> None:
        """Record the ``[R, S]`` columns the last forward appended to the cache."""
        new_valid = new_valid.to(torch.bool).cpu()
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

    def compact(self) -> None:
        """Move every row's valid columns to the right end (holes first): width ``max(lengths)``."""
        longest = int(self.lengths.max()) if self.rows else 0
        if longest == self.width:
            return
        order = torch.sort(self.valid.to(torch.int8), dim=1, stable=True).indices[:, self.width - longest :]  # [R, L]
        index = order.to(self.device)
        row = torch.arange(self.rows, device=self.device)[:, None]
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            layer.keys = layer.keys.transpose(1, 2)[row, index].transpose(1, 2).contiguous()
            layer.values = layer.values.transpose(1, 2)[row, index].transpose(1, 2).contiguous()
        self.valid = self.valid.gather(1, order)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep rows ``rows`` (``[R']`` int64 CPU) in that order; drop the others."""
        rows = rows.to(torch.long).cpu()
        self.cache.batch_select_indices(rows.to(self.device))
        self.valid = self.valid[rows]
        self.lengths = self.lengths[rows]
        used = self.valid.any(0).nonzero()
        self._crop(int(used[-1, 0]) + 1 if len(used) else 0)

    def row_entries(self, layer: int, row: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[heads, lengths[row], head_dim]`` of one row's valid columns (for tests)."""
        cached = self.cache.layers[layer]
        columns = self.valid[row].nonzero()[:, 0].to(cached.keys.device)
        return cached.keys[row][:, columns], cached.values[row][:, columns]
