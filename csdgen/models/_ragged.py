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

:class:`RaggedSession` is the per-row :class:`~csdgen.models.base.DecodingSession` built on it
that the adapters share (class-conditional Llama, Janus, Emu3, Chameleon): a prompt of
left-padded rows, a region of image tokens with an optional row-end token after every image
row (:func:`window_columns` lays a per-row window out as sequence columns), the unconditional
rows of guidance after the conditional ones. An adapter supplies only its forward
(:meth:`RaggedSession._logits`) and its codebook -> vocabulary id map.

Files, one idea each: the session is here; the cache is :mod:`csdgen.models._ragged_cache`, the
window and tree column layouts :mod:`csdgen.models._ragged_windows` (their names re-exported here).

Family-agnostic: a family adapter decides which of its sequence's tokens are valid; this
module knows nothing of image positions. The bookkeeping lives on the host (the engine hands
per-row lengths over from its one sync per iteration), so no call here waits for the device: what
a forward needs on the device (the window's layout, the attention mask, the position ids, row
selections) travels in queued copies (:mod:`csdgen.transfer`), one per forward.
"""

from __future__ import annotations

from typing import Any

import torch

from ..transfer import to_device, to_device_all
from .base import DecodingSession, WindowLogits, check_row_arguments, row_tensor
from ._ragged_cache import additive_mask, causal_mask, RaggedCache
from ._ragged_windows import kept_tree_columns, split_guided, window_columns, window_layout, _place_window

__all__ = ["RaggedCache", "RaggedSession", "additive_mask", "causal_mask", "split_guided", "window_columns", "window_layout"]


class RaggedSession(DecodingSession):
    """A per-row session over a transformers ``DynamicCache`` (see the module docstring).

    Rows: the ``B`` conditional rows, then (guided) their ``B`` unconditional rows. Row ``r``'s
    sequence is its visible prompt tokens, then the image region: image token ``i`` and, after
    each image row, the row-end token. Image length ``k`` <-> region length
    ``k + k // cols`` (``k`` without row ends).

    Subclasses call ``super().__init__`` and implement :meth:`_logits` (and :meth:`_vocab_ids`
    when codebook ids are not the model's token ids).

    Args:
        batch_size: B; guided: whether the unconditional rows follow.
        cache: an empty ``DynamicCache``.
        prompt_ids: ``[R, P]`` int64 left-padded prompt ids (R = 2B guided, else B).
        prompt_valid: ``[R, P]`` bool / int, which prompt columns a row uses (padding and hidden
            prompt tokens are 0).
        num_image_tokens: N; device: the model's device.
        cols: image tokens per image row; row_end: the row-end id (None: no row ends);
        filler: id of hole columns.
    """

    def __init__(self, *, batch_size: int, guided: bool, cache: Any, prompt_ids: torch.Tensor, prompt_valid: torch.Tensor,
                 num_image_tokens: int, device: Any, cols: int = 1, row_end: int | None = None, filler: int = 0):
        self.batch_size, self.guided = batch_size, guided
        self.prompt_ids = to_device(prompt_ids, device)
        self.prompt_valid = prompt_valid.to(torch.bool).cpu()
        self.prompt_lengths = self.prompt_valid.sum(1)  # [R] visible prompt tokens per row
        self.kv = RaggedCache(cache, prompt_ids.shape[0], device)
        self.num_image_tokens, self.cols, self.row_end, self.filler = num_image_tokens, cols, row_end, filler
        self._lengths: torch.Tensor | None = None  # [B] image positions cached; None before prefill

    # -- what a family supplies -------------------------------------------------------------------

    def _logits(self, ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor,
                out: torch.Tensor, prefill: bool) -> torch.Tensor:
        """Run the model on ``[R, S]`` new columns (appending them to ``self.cache``); return the
        image logits ``[R, W, V]`` read at columns ``out`` (``[R, W]`` int64).

        ``prefill`` is True for the prompt (whose embedding may differ from the image tokens').
        """
        raise NotImplementedError

    def _vocab_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """Codebook ids ``[B, W]`` -> the model's token ids (default: the same)."""
        return tokens

    # -- the per-row interface --------------------------------------------------------------------

    @property
    def cache(self) -> Any:
        return self.kv.cache

    def _rows(self, per_image: torch.Tensor) -> torch.Tensor:
        return torch.cat([per_image, per_image]) if self.guided else per_image

    def region_length(self, image_length: torch.Tensor) -> torch.Tensor:
        """Region columns holding image positions ``0 .. k - 1`` (row ends of complete rows included)."""
        return image_length + (image_length // self.cols if self.row_end is not None else 0)

    def row_sequence(self, row: int) -> torch.Tensor:
        """Row ``row``'s sequence as cached (visible prompt tokens, image and row-end ids): for tests."""
        return self.kv.row_ids(row)

    def prefill(self) -> WindowLogits:
        if self._lengths is not None:
            raise ValueError("prefill runs once per session")
        mask, positions = self.kv.inputs(self.prompt_valid)
        last = torch.full((self.prompt_ids.shape[0], 1), self.prompt_ids.shape[1] - 1, device=self.prompt_ids.device)
        logits = self._logits(self.prompt_ids, mask, positions, last, prefill=True)
        self.kv.append(self.prompt_valid, self.prompt_ids)
        self._lengths = torch.zeros(self.batch_size, dtype=torch.long)
        return split_guided(logits, self.batch_size, self.guided)

    def _window_arguments(self, tokens, start, widths) -> tuple[int, int, torch.Tensor, torch.Tensor]:
        """``forward``'s arguments checked: ``(B, W, start [B], widths [B])`` int64 CPU (``widths`` None:
        ``W`` for every row). Raises ValueError before prefill, or a start other than each row's
        length, or a width past the image's last token."""
        if self._lengths is None:
            raise ValueError("forward before prefill: call prefill() first")
        B, W = tokens.shape
        start = row_tensor(start, B)
        widths = torch.full((B,), W, dtype=torch.long) if widths is None else row_tensor(widths, B)
        check_row_arguments("start", start, self.batch_size, self._lengths, self._lengths)
        check_row_arguments("widths", widths, self.batch_size, 0, torch.clamp(self.num_image_tokens - 1 - start, max=W))
        return B, W, start, widths

    def _tree_arguments(self, tokens, start, layout, valid) -> tuple[int, int, torch.Tensor, torch.Tensor]:
        """``forward_tree``'s arguments checked: ``(B, S, start [B], deepest [B])`` (int64 CPU; ``deepest``:
        each row's deepest valid node, -1 for none). Raises ValueError before prefill, for a start other
        than each row's length, or a valid node past the image's last token."""
        if self._lengths is None:
            raise ValueError("forward_tree before prefill: call prefill() first")
        B, S = tokens.shape
        start = row_tensor(start, B)
        check_row_arguments("start", start, self.batch_size, self._lengths, self._lengths)
        deepest = torch.where(valid, layout.depth[None], -1).max(1).values
        check_row_arguments("tree depth", deepest, self.batch_size, -1, self.num_image_tokens - 1 - start)
        return B, S, start, deepest

    def _rollback_lengths(self, lengths) -> torch.Tensor:
        """``rollback``'s lengths checked: ``[B]`` int64 CPU, each in ``0 ..`` the row's length.
        Raises ValueError before prefill or for a length out of range."""
        if self._lengths is None:
            raise ValueError("rollback before prefill")
        lengths = row_tensor(lengths, self.batch_size)
        check_row_arguments("rollback lengths", lengths, self.batch_size, 0, self._lengths)
        return lengths

    def forward(self, tokens, start, widths=None):
        B, W, start, widths = self._window_arguments(tokens, start, widths)
        dev = self.prompt_ids.device
        vocab = self._vocab_ids(tokens.to(dev))
        # the window's layout, mask and positions on the host, then one queued copy to the device (no host sync)
        token_col, is_end, valid, out = window_layout(start, widths, W, self.cols, self.row_end)
        valid = self._rows(valid)
        mask, positions = self.kv.host_inputs(valid)
        host = [token_col, is_end, self._rows(out), positions] + ([] if mask is None else [mask])
        token_col, is_end, out, positions, *mask = to_device_all(host, dev)
        # a 2-D mask makes transformers read it back (is anything masked?) for a 1-column forward: a 4-D one
        # is used as given
        mask = causal_mask(mask[0], is_end.shape[1], self.kv.dtype) if mask else None
        ids = self._rows(_place_window(vocab, token_col, is_end, self.row_end, self.filler))
        logits = self._logits(ids, mask, positions, out, prefill=False)
        self.kv.append(valid, ids)
        self._lengths = start + widths
        return split_guided(logits, self.batch_size, self.guided)

    def rollback(self, lengths):
        lengths = self._rollback_lengths(lengths)
        self.kv.truncate(self.prompt_lengths + self._rows(self.region_length(lengths)))
        self._lengths = lengths.clone()

    def select_rows(self, rows):
        rows = row_tensor(rows, len(torch.as_tensor(rows).reshape(-1)))
        every = torch.cat([rows, rows + self.batch_size]) if self.guided else rows
        every_dev = to_device(every, self.prompt_ids.device)
        self.kv.select_rows(every, every_dev)
        self.prompt_ids = self.prompt_ids[every_dev]
        self.prompt_valid, self.prompt_lengths = self.prompt_valid[every], self.prompt_lengths[every]
        self._lengths = None if self._lengths is None else self._lengths[rows]
        self.batch_size = len(rows)

    @property
    def cache_lengths(self):
        if self._lengths is None:
            raise ValueError("cache_lengths before prefill")
        return self._lengths.clone()

    supports_admission = True

    def admit(self, other):
        """Append ``other``'s rows (a prefilled session of the same model and guidance) after this
        session's: :meth:`csdgen.models.base.DecodingSession.admit`. The caches are joined by
        :meth:`RaggedCache.merge` (the narrower one left-padded with holes); with guidance the rows
        stay ordered conditional rows first (old, then new), then the unconditional ones."""
        self._check_admission(other)
        B1, B2 = self.batch_size, other.batch_size
        self.kv.merge(other.kv, (B1, B2) if self.guided else None)
        self._join_prompts(other)
        self._lengths = torch.cat([self._lengths, other._lengths])
        self.batch_size = B1 + B2

    def _check_admission(self, other, unprefilled: bool = False) -> None:
        """Raise ValueError unless ``other`` can join this session (:meth:`admit`): a prefilled
        session (``unprefilled``: one not prefilled) of the same class and model, guidance and image layout."""
        if type(other) is not type(self) or getattr(other, "model", None) is not getattr(self, "model", None):
            raise ValueError(f"admit: a {type(other).__name__} cannot join a {type(self).__name__} of another model")
        if other.guided != self.guided:
            raise ValueError(f"admit: guided={other.guided} rows cannot join a session with guided={self.guided}")
        if self._lengths is None:
            raise ValueError("admit: this session must be prefilled first (call prefill())")
        if (other._lengths is None) != unprefilled:
            raise ValueError("admit_unprefilled: the joining session must not be prefilled" if unprefilled else
                             "admit: both sessions must be prefilled first (call prefill())")
        if (other.cols, other.row_end, other.num_image_tokens) != (self.cols, self.row_end, self.num_image_tokens):
            raise ValueError("admit: the sessions lay their images out differently (cols, row end, image length)")

    def _join_prompts(self, other) -> None:
        """Append ``other``'s logical prompt rows (ids, visibility, lengths) to this session's, both
        left-padded to the wider prompt; with guidance ordered conditional rows first (old, then
        new), then the unconditional ones."""
        B1, B2 = self.batch_size, other.batch_size
        R1 = self.prompt_ids.shape[0]
        if self.guided:  # [cond old, uncond old, cond new, uncond new] -> [cond old, cond new, uncond old, uncond new]
            order = torch.cat([torch.arange(B1), R1 + torch.arange(B2), B1 + torch.arange(B1), R1 + B2 + torch.arange(B2)])
        else:
            order = None
        P = max(self.prompt_ids.shape[1], other.prompt_ids.shape[1])

        def left(t: torch.Tensor, value) -> torch.Tensor:
            if t.shape[1] == P:
                return t
            return torch.cat([torch.full((t.shape[0], P - t.shape[1]), value, dtype=t.dtype, device=t.device), t], dim=1)

        ids = torch.cat([left(self.prompt_ids, self.filler), left(other.prompt_ids.to(self.prompt_ids.device), self.filler)])
        valid = torch.cat([left(self.prompt_valid, False), left(other.prompt_valid, False)])
        lengths = torch.cat([self.prompt_lengths, other.prompt_lengths])
        if order is not None:
            ids, valid, lengths = ids[to_device(order, ids.device)], valid[order], lengths[order]
        self.prompt_ids, self.prompt_valid, self.prompt_lengths = ids, valid, lengths

    # -- draft trees (csdgen.trees) ---------------------------------------------------------------

    supports_trees = True

    def _tree_columns(self, start: torch.Tensor, layout, valid: torch.Tensor):
        """Sequence columns of a tree window: each node, and after a node that ends an image row a
        row-end column of its own (the node's output is read there; its children see it).

        Returns ``(col [B, S], end [B, S] bool, S2, valid2 [B, S2], offsets [B, S2], sees [B, S2, S2])``,
        all CPU: the node columns, which nodes have a row end (at ``col + 1``), the window's column
        count, the valid columns, the region offset of each column from the row's cached region,
        and which columns each column sees.
        """
        B, S = valid.shape
        depth = layout.depth
        position = start[:, None] + depth[None]  # [B, S] image positions
        if self.row_end is None:
            end = torch.zeros(B, S, dtype=torch.bool)
        else:
            end = valid & ((position + 1) % self.cols == 0)
        col = torch.arange(S)[None] + end.long().cumsum(1) - end.long()
        S2 = S + (int(end.sum(1).max()) if B else 0)
        rows = torch.arange(B)[:, None].expand(B, S)
        valid2 = torch.zeros(B, S2, dtype=torch.bool)
        valid2[rows[valid], col[valid]] = True
        valid2[rows[end], col[end] + 1] = True
        offsets = torch.zeros(B, S2, dtype=torch.long)
        rel = self.region_length(position) - self.region_length(start)[:, None]
        offsets[rows, col] = rel
        offsets[rows[end], col[end] + 1] = rel[end] + 1
        anc = layout.ancestors[None].expand(B, S, S)
        strict = anc & ~torch.eye(S, dtype=torch.bool)[None]
        sees = torch.zeros(B, S2, S2, dtype=torch.bool)
        b, s, t = anc.nonzero(as_tuple=True)  # node column -> node columns of itself and its ancestors
        sees[b, col[b, s], col[b, t]] = True
        keep = end[b, s]  # its row-end column -> the same, and itself
        sees[b[keep], col[b, s][keep] + 1, col[b, t][keep]] = True
        sees[b[keep], col[b, s][keep] + 1, col[b, s][keep] + 1] = True
        b, s, t = (strict & end[:, None, :]).nonzero(as_tuple=True)  # ancestors' row-end columns
        sees[b, col[b, s], col[b, t] + 1] = True
        keep = end[b, s]
        sees[b[keep], col[b, s][keep] + 1, col[b, t][keep] + 1] = True
        return col, end, S2, valid2, offsets, sees

    def forward_tree(self, tokens, start, layout, valid):
        """Evaluate a draft tree in one forward: a 4-D attention mask (each node sees the row's cache
        and its own ancestors) and depth-based positions (:meth:`RaggedCache.tree_inputs`).

        Args:
            tokens: ``[B, S]`` int64 codebook ids of the nodes (slot 0: the root at image position
                ``start[b]``); start: ``[B]`` int64 CPU, the rows' cached lengths;
            layout: a :class:`csdgen.trees.TreeLayout`; valid: ``[B, S]`` bool CPU, nodes fed.

        Returns:
            logits ``[B, S, V]`` (cond / uncond): node ``s``'s slot is the distribution of the
            position after it given its ancestors. Until :meth:`keep_path` the cache holds the tree.

        Raises:
            ValueError: a bad ``start``, or a node past the image.
        """
        B, S, start, deepest = self._tree_arguments(tokens, start, layout, valid)
        col, end, S2, valid2, offsets, sees = self._tree_columns(start, layout, valid)
        dev = self.prompt_ids.device
        vocab = self._vocab_ids(tokens.to(dev))
        ends = torch.zeros(B, S2 + 1, dtype=torch.bool).scatter_(1, torch.where(end, col + 1, S2), True)[:, :S2]
        # a row-ending node's output is read at its row end
        col_dev, ends, out = to_device_all([col, ends, torch.where(end, col + 1, col)], dev)
        ids = torch.full((B, S2), self.filler, dtype=torch.long, device=dev).scatter_(1, col_dev, vocab)
        if self.row_end is not None:
            ids = ids.masked_fill(ends, self.row_end)
        ids, valid2, out = self._rows(ids), self._rows(valid2), self._rows(out)
        mask, positions = self.kv.tree_inputs(valid2, self._rows(offsets), self._rows(sees), self.kv.dtype)
        logits = self._logits(ids, mask, positions, out, prefill=False)
        self.kv.append(valid2, ids)
        self._tree_start, self._tree_columns_of = start, (col, end, S2)
        self._lengths = start + deepest + 1
        return split_guided(logits, self.batch_size, self.guided)

    def keep_path(self, path, lengths):
        """After :meth:`forward_tree`: keep the root and the winning path's nodes, image positions
        ``0 .. lengths[b] - 1``; the other branches become holes (compacted away by
        :meth:`RaggedCache.truncate` when they waste space).

        Args:
            path: ``[B, W]`` int64 CPU, the node at each depth ``0 .. W - 1`` of the winning path.
            lengths: ``[B]`` int64 CPU, ``start[b] <= lengths[b] <=`` the tree's deepest position + 1.
        """
        start, (col, end, S2) = self._tree_start, self._tree_columns_of
        lengths = row_tensor(lengths, self.batch_size)
        check_row_arguments("keep_path lengths", lengths, self.batch_size, start, self._lengths)
        keep = kept_tree_columns(path, lengths - start, col, end, S2)
        self.kv.drop_new(self._rows(keep))
        self.kv.truncate(self.prompt_lengths + self._rows(self.region_length(lengths)))
        self._lengths = lengths.clone()
