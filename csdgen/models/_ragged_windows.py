"""Where a window's and a draft tree's tokens go among each row's columns: image positions, row ends
(families whose rows end with a newline token), the columns a tree keeps, and the guided logits
split into cond and uncond rows.
"""

from __future__ import annotations

import torch

from ..transfer import to_device_all
from .base import WindowLogits

__all__ = ["split_guided", "kept_tree_columns", "window_layout", "window_columns"]


def split_guided(logits: torch.Tensor, batch_size: int, guided: bool) -> WindowLogits:
    """``[R, W, V]`` logits of all rows -> cond rows (first ``batch_size``), then the uncond rows (guided)."""
    if guided:
        return WindowLogits(logits[:batch_size], logits[batch_size:])
    return WindowLogits(logits, None)


def kept_tree_columns(path: torch.Tensor, kept: torch.Tensor, col: torch.Tensor, end: torch.Tensor,
                      columns: int) -> torch.Tensor:
    """The tree columns a row keeps after verification: the winning path's first ``kept[b]`` nodes
    and, after a node that closes an image row, the row-end column that follows it.

    Args:
        path: ``[B, W]`` int64, the node at each depth ``0 .. W - 1`` of the winning path.
        kept: ``[B]`` int64, how many of the path's nodes each row keeps (``0 .. W``).
        col: ``[B, nodes]`` int64, each node's column in the tree's input.
        end: ``[B, nodes]`` bool, whether a row-end column follows the node's column.
        columns: the tree input's width (columns per row).

    Returns:
        ``[B, columns]`` bool, True where the column stays in the cache.
    """
    B, W = path.shape
    kept_depth = torch.arange(W)[None] < kept[:, None]
    rows = torch.arange(B)[:, None].expand(B, W)[kept_depth]
    nodes = path[kept_depth]
    keep = torch.zeros(B, columns, dtype=torch.bool)
    keep[rows, col[rows, nodes]] = True
    with_end = end[rows, nodes]
    keep[rows[with_end], col[rows, nodes][with_end] + 1] = True
    return keep


def window_layout(start: torch.Tensor, widths: torch.Tensor, W: int, cols: int, row_end: int | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`window_columns`' layout on the host: where each slot's token and row end go.

    Args:
        start: ``[B]`` int64 CPU, image position of slot 0; widths: ``[B]`` int64 CPU, valid slots;
        W: slots per row; cols: image tokens per image row; row_end: the row-end id, or None.

    Returns:
        ``(token_col [B, W] int64, is_end [B, S] bool, valid [B, S] bool, out [B, W] int64)``, all CPU:
        the column of each slot's token, the row-end columns, the columns a row uses, and the column
        whose output is slot ``j``'s; ``S = W + max_b(row ends of row b)``.
    """
    B = start.shape[0]
    slot = torch.arange(W)
    live = slot[None] < widths[:, None]
    if row_end is None:
        ends = torch.zeros(B, W, dtype=torch.long)
    else:
        ends = (live & ((start[:, None] + slot + 1) % cols == 0)).long()
    token_col = slot + ends.cumsum(1) - ends  # row ends before the slot push it right
    S = W + (int(ends.sum(1).max()) if B else 0)
    valid = torch.zeros(B, S + 1, dtype=torch.bool)
    valid.scatter_(1, token_col, live)
    is_end = torch.zeros(B, S + 1, dtype=torch.bool)
    is_end.scatter_(1, torch.where(ends.bool(), token_col + 1, S), True)
    is_end = is_end[:, :S]
    return token_col, is_end, valid[:, :S] | is_end, token_col + ends


def _place_window(tokens: torch.Tensor, token_col: torch.Tensor, is_end: torch.Tensor, row_end: int | None,
                  filler: int) -> torch.Tensor:
    """``[B, S]`` ids on the tokens' device: each slot's token at its column, row ends, holes ``filler``
    (``token_col``, ``is_end`` on the same device)."""
    B, S = is_end.shape
    ids = torch.full((B, S), filler, dtype=torch.long, device=tokens.device).scatter_(1, token_col, tokens)
    return ids if row_end is None else ids.masked_fill(is_end, row_end)


def window_columns(tokens: torch.Tensor, start: torch.Tensor, widths: torch.Tensor, cols: int, row_end: int | None,
                   filler: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lay a per-row window out as sequence columns, a row-end token after every image row's last token.

    Row ``b``'s slot ``j`` holds image position ``start[b] + j``; when that position ends an image
    row (``(start[b] + j + 1) % cols == 0``) and ``row_end`` is given, a row-end column follows it,
    and the slot's output (the distribution of the next position) is read at the row-end column.
    Rows end rows at different slots, so their windows have different lengths: shorter rows are
    padded with hole columns (``filler``, not valid). Slots ``>= widths[b]`` are holes too.

    The layout is computed on the host (:func:`window_layout`) and copied to the device in one
    queued copy (:func:`csdgen.transfer.to_device_all`): no host sync.

    Args:
        tokens: ``[B, W]`` int64 ids (the family's vocabulary ids), on the model's device.
        start: ``[B]`` int64 CPU, image position of slot 0; widths: ``[B]`` int64 CPU, valid slots.
        cols: image tokens per image row; row_end: the row-end id, or None (no row ends).
        filler: id written into hole columns.

    Returns:
        ``(ids [B, S] on tokens' device, valid [B, S] bool CPU, out [B, W] int64 on tokens' device)``
        with ``S = W + max_b(row ends of row b)``; ``out[b, j]`` is the column whose output is slot ``j``'s.
    """
    token_col, is_end, valid, out = window_layout(start, widths, tokens.shape[1], cols, row_end)
    token_col, is_end, out = to_device_all([token_col, is_end, out], tokens.device)
    return _place_window(tokens, token_col, is_end, row_end, filler), valid, out
