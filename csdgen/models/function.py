"""FunctionModel: any ``prefix -> next-token logits`` function as an image-token model.

For tests, teaching, and checking your own model with the engine before writing an adapter.
It has no cache: every window position is one call of the function on its whole prefix, so it
is slow, and exactly as correct as the function. Rows at different positions are grouped by
prefix length: one call per distinct prefix length in a window slot.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..sampling import as_integer
from .base import DecodingSession, ImageTokenModel, WindowLogits, check_row_arguments, row_tensor

__all__ = ["FunctionModel"]

LogitsFn = Callable[[torch.Tensor], torch.Tensor]


class FunctionModel(ImageTokenModel):
    """Wrap ``fn(prefix) -> logits``.

    Args:
        fn: maps a token prefix ``[B, t]`` int64 (``0 <= t < N``, image tokens only) to
            next-token logits ``[B, V]`` float.
        num_image_tokens: N.
        codebook_size: V.
        uncond_fn: the unconditional counterpart of ``fn`` for classifier-free guidance
            (None: the model cannot be guided).
        grid: ``(rows, cols)`` of the raster order, two integers >= 1 whose product is N (a tuple
            or list; numpy integers taken as ints); None: ``(1, N)``, one row.

    Raises:
        TypeError: ``fn`` (or ``uncond_fn``, when given) is not callable.
        ValueError: sizes that are not integers >= 1, or a grid that is not two integers >= 1 whose
            product is N; when decoding, a function that returns anything but logits ``[B, V]``.
    """

    def __init__(
        self,
        fn: LogitsFn,
        num_image_tokens: int,
        codebook_size: int,
        uncond_fn: LogitsFn | None = None,
        grid: tuple[int, int] | None = None,
    ):
        for name, f in (("fn", fn), ("uncond_fn", uncond_fn)):
            if not callable(f) and not (name == "uncond_fn" and f is None):
                raise TypeError(f"{name}={f!r}: allowed a function prefix [B, t] int64 -> logits [B, V]"
                                + (" (or None: no guidance)" if name == "uncond_fn" else ""))
        if any(as_integer(v) is None or v < 1 for v in (num_image_tokens, codebook_size)):
            raise ValueError(f"num_image_tokens={num_image_tokens!r}, codebook_size={codebook_size!r}: both must be "
                             f"integers >= 1")
        num_image_tokens, codebook_size = as_integer(num_image_tokens), as_integer(codebook_size)
        self.fn, self.uncond_fn = fn, uncond_fn
        self.num_image_tokens, self.codebook_size = num_image_tokens, codebook_size
        self.grid = (1, num_image_tokens) if grid is None else _checked_grid(grid, num_image_tokens)

    def start(self, conditions: Any, batch_size: int | None, guided: bool) -> DecodingSession:
        """A session of ``batch_size`` images; with ``batch_size`` None, one image per entry of the list
        ``conditions`` (``fn`` reads none of them), as for the other models.

        Raises:
            ValueError: neither a count >= 1 nor a list of conditions; guidance without ``uncond_fn``.
        """
        if batch_size is None and isinstance(conditions, (list, tuple)) and conditions:
            batch_size = len(conditions)
        if batch_size is None or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: FunctionModel takes no conditions; give batch_size >= 1 "
                             f"(csdgen.generate(model, None, batch_size=B)) or a list of B conditions it ignores")
        if guided and self.uncond_fn is None:
            raise ValueError("guidance requested, but this FunctionModel has no uncond_fn; use guidance_scale=1")
        return _FunctionSession(self, batch_size, guided)


def _checked_grid(grid, num_image_tokens: int) -> tuple[int, int]:
    """``grid`` as ``(rows, cols)`` ints if it is two integers >= 1 whose product is ``num_image_tokens``, else a ValueError."""
    sides = [as_integer(v) for v in grid] if isinstance(grid, (tuple, list)) else []
    if len(sides) != 2 or any(v is None or v < 1 for v in sides) or sides[0] * sides[1] != num_image_tokens:
        raise ValueError(f"grid={grid!r}: allowed None (one row, (1, {num_image_tokens})) or (rows, cols), two integers "
                         f">= 1 whose product is num_image_tokens={num_image_tokens}")
    return sides[0], sides[1]


class _FunctionSession(DecodingSession):
    def __init__(self, model: FunctionModel, batch_size: int, guided: bool):
        self.model, self.batch_size, self.guided = model, batch_size, guided
        self.tokens = torch.zeros(batch_size, model.num_image_tokens, dtype=torch.long, device=model.device)
        self.lengths = torch.zeros(batch_size, dtype=torch.long)  # CPU

    def _call(self, fn: LogitsFn, rows: torch.Tensor, length: int) -> torch.Tensor:
        out = fn(self.tokens[rows.to(self.tokens.device), :length])
        expected = (len(rows), self.model.codebook_size)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
            # else a RuntimeError ('shape mismatch: value tensor of shape ...') from the engine's indexing
            got = f"shape {list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"FunctionModel: the function returned {got} for a prefix [{len(rows)}, {length}]; allowed: "
                             f"next-token logits [B, V] = {list(expected)} (one row per prefix row, V = codebook_size)")
        return out

    def _logits(self, ends: torch.Tensor, live: torch.Tensor) -> WindowLogits:
        """Logits ``[B, S, V]`` after prefixes ``tokens[b, :ends[b, j]]`` where ``live[b, j]`` (else 0)."""
        B, S = ends.shape
        V = self.model.codebook_size
        cond = torch.zeros(B, S, V, device=self.model.device)
        uncond = torch.zeros(B, S, V, device=self.model.device) if self.guided else None
        for length in ends[live].unique().tolist():
            at = (ends == length) & live
            rows, slots = at.nonzero(as_tuple=True)
            dev_rows, dev_slots = rows.to(cond.device), slots.to(cond.device)
            out = self._call(self.model.fn, rows, length)
            cond = cond.to(out.dtype)
            cond[dev_rows, dev_slots] = out
            if self.guided:
                out_u = self._call(self.model.uncond_fn, rows, length)
                uncond = uncond.to(out_u.dtype)
                uncond[dev_rows, dev_slots] = out_u
        return WindowLogits(cond, uncond)

    def prefill(self) -> WindowLogits:
        return self._logits(torch.zeros(self.batch_size, 1, dtype=torch.long), torch.ones(self.batch_size, 1, dtype=torch.bool))

    def forward(self, tokens, start, widths=None):
        B, W = tokens.shape
        start = row_tensor(start, B)
        widths = torch.full((B,), W, dtype=torch.long) if widths is None else row_tensor(widths, B)
        check_row_arguments("start", start, self.batch_size, self.lengths, self.lengths)
        check_row_arguments("widths", widths, self.batch_size, 0, torch.clamp(self.model.num_image_tokens - 1 - start, max=W))
        slot = torch.arange(W)
        live = slot[None] < widths[:, None]  # [B, W]
        positions = (start[:, None] + slot).clamp(max=self.model.num_image_tokens - 1)
        rows = torch.arange(B)[:, None].expand(B, W)
        dev = self.tokens.device
        self.tokens[rows[live].to(dev), positions[live].to(dev)] = tokens.to(dev)[live.to(dev)]
        self.lengths = start + widths
        return self._logits(start[:, None] + slot + 1, live)

    def rollback(self, lengths):
        lengths = row_tensor(lengths, self.batch_size)
        check_row_arguments("rollback lengths", lengths, self.batch_size, 0, self.lengths)
        self.lengths = lengths.clone()

    def select_rows(self, rows):
        rows = row_tensor(rows, len(torch.as_tensor(rows).reshape(-1)))
        self.tokens, self.lengths = self.tokens[rows.to(self.tokens.device)], self.lengths[rows]
        self.batch_size = len(rows)

    @property
    def cache_lengths(self):
        return self.lengths.clone()

    supports_admission = True

    def admit(self, other):
        if not isinstance(other, _FunctionSession) or other.model is not self.model or other.guided != self.guided:
            raise ValueError("admit: the other session must come from the same FunctionModel with the same guidance")
        self.tokens = torch.cat([self.tokens, other.tokens.to(self.tokens.device)])
        self.lengths = torch.cat([self.lengths, other.lengths])
        self.batch_size += other.batch_size

    # -- draft trees (csdgen.trees) ---------------------------------------------------------------

    supports_trees = True

    def forward_tree(self, tokens, start, layout, valid):
        """Evaluate a draft tree: node ``s`` of row ``b`` is image position ``start[b] + depth[s]``.

        Args:
            tokens: ``[B, S]`` int64 node tokens (slot 0: the root, at position ``start[b]``).
            start: ``[B]`` int64 CPU, the rows' cached lengths.
            layout: a :class:`csdgen.trees.TreeLayout` (``depth``, ``ancestors``).
            valid: ``[B, S]`` bool CPU, nodes fed (the others are padding; their logits are 0).

        Returns:
            logits ``[B, S, V]``: node ``s``'s slot is the distribution of the position after it,
            given its ancestors. Until :meth:`keep_path`, the row caches the whole tree.
        """
        B, S = tokens.shape
        start = row_tensor(start, B)
        check_row_arguments("start", start, self.batch_size, self.lengths, self.lengths)
        N = self.model.num_image_tokens
        depth = layout.depth
        deepest = torch.where(valid, depth[None], -1).max(1).values
        if bool((start + deepest >= N).any()):
            raise ValueError(f"tree window past the image: start={start.tolist()}, depth up to {deepest.tolist()}, N={N}")
        dev = self.tokens.device
        # prefix of node s in row b: the row's tokens, with position start[b] + depth[t] set to node t's
        # token for every ancestor t of s
        prefixes = self.tokens[:, None, :].expand(B, S, N).clone()  # [B, S, N]
        anc_b, anc_s, anc_t = layout.ancestors[None].expand(B, S, S).nonzero(as_tuple=True)
        pos = (start[anc_b] + depth[anc_t]).clamp(max=N - 1)
        keep = valid[anc_b, anc_s]
        prefixes[anc_b[keep].to(dev), anc_s[keep].to(dev), pos[keep].to(dev)] = tokens[anc_b[keep].to(dev), anc_t[keep].to(dev)]
        ends = start[:, None] + depth[None] + 1  # [B, S] prefix lengths
        V = self.model.codebook_size
        cond = torch.zeros(B, S, V, device=self.model.device)
        uncond = torch.zeros(B, S, V, device=self.model.device) if self.guided else None
        for length in ends[valid].unique().tolist():
            rows, slots = ((ends == length) & valid).nonzero(as_tuple=True)
            prefix = prefixes[rows.to(dev), slots.to(dev), :length]
            out = self.model.fn(prefix)
            cond = cond.to(out.dtype)
            cond[rows.to(cond.device), slots.to(cond.device)] = out
            if self.guided:
                out_u = self.model.uncond_fn(prefix)
                uncond = uncond.to(out_u.dtype)
                uncond[rows.to(cond.device), slots.to(cond.device)] = out_u
        self._tree = (tokens.to(dev), start)
        self.lengths = start + deepest + 1
        return WindowLogits(cond, uncond)

    def keep_path(self, path, lengths):
        """After :meth:`forward_tree`: keep the nodes ``path[b, 0 .. lengths[b] - start[b] - 1]``.

        Args:
            path: ``[B, W]`` int64 CPU, the node at each depth of the winning path.
            lengths: ``[B]`` int64 CPU, image positions each row keeps (``>= start``).
        """
        tokens, start = self._tree
        lengths = row_tensor(lengths, self.batch_size)
        check_row_arguments("keep_path lengths", lengths, self.batch_size, start, self.lengths)
        B, W = path.shape
        depth = torch.arange(W)
        kept = depth[None] < (lengths - start)[:, None]
        rows = torch.arange(B)[:, None].expand(B, W)
        dev = self.tokens.device
        self.tokens[rows[kept].to(dev), (start[:, None] + depth)[kept].to(dev)] = tokens[rows[kept].to(dev), path[kept].to(dev)]
        self.lengths = lengths.clone()
        self._tree = None
