"""The decoding loop with a draft tree at the root of every window (:class:`_TreeLoop`,
``generate(..., tree=(K, D))``; the trees themselves are :mod:`csdgen.trees`)."""

from __future__ import annotations

import dataclasses
import time

import torch

from ..sampling import stream_uniforms, target_probs
from ..transfer import to_device_all
from ..trees import TREE_KINDS, TreeLayout, draw_siblings, tree_layout, verify_tree
from .loop import _Loop, _synchronize
from .results import ImageStats
from .streams import _INIT, _KINDS


class _TreeLoop(_Loop):
    """The decoding loop with a draft tree at the root of every window (:mod:`csdgen.trees`).

    Per iteration: the window's drafts as in :class:`_Loop` (carried or initialised), plus
    ``K - 1`` siblings per tree level drawn without replacement from the same draft
    distribution; one ``session.forward_tree`` over every node; :func:`csdgen.trees.verify_tree`;
    the commit; the winning path's tree nodes travel in the iteration's one host sync, and the
    session keeps that path (``session.keep_path``: losing branches become holes of the cache).
    With ``window="auto"`` the widths are the main path's, and the measured time of each width
    includes the tree's side nodes, so the cost model counts them.
    """

    PROBE = False
    #: how the winning path is chosen (:func:`csdgen.trees.verify_tree`); only the tests change it
    PATH_CHOICE = "first"

    def __init__(self, *args, tree: tuple[int, int], **kwargs):
        super().__init__(*args, tree=tree, **kwargs)
        self.K, self.D = tree
        self._pending = None
        self._device_layouts: dict[tuple[int, int, int], TreeLayout] = {}

    def _opened(self, session) -> None:
        if not getattr(session, "supports_trees", False):
            why = getattr(session, "tree_refusal", "its session has no forward_tree")
            raise ValueError(f"tree=({self.K}, {self.D}) cannot be used with {type(self.model).__name__}: {why}; "
                             "allowed: tree=None for this model")
        N = self.model.num_image_tokens
        self.side = torch.zeros(session.batch_size, N + self.max_width + 2, dtype=torch.bool, device=self.device)
        self.branch_log: list[torch.Tensor] = []

    def _sync_extra(self):
        return self._pending

    def _rollback(self, session, lengths):
        if self._pending is None:  # after the prefill
            session.rollback(lengths)
            return
        layout = self._layout
        path = layout.main[None].expand(len(lengths), layout.W).clone()
        path[:, 1 : layout.D + 1] = self._extra_host
        session.keep_path(path, lengths)
        self._pending = None

    def _iterate(self, session, W: int, c_host: torch.Tensor, probe: bool) -> torch.Tensor | None:
        N, dev, K = self.model.num_image_tokens, self.device, self.K
        rows = self.active
        A = len(self.active_host)
        c = self.committed[rows]
        widths = (N - c).clamp(max=W)
        widths_host = (N - c_host).clamp(max=W)
        layout = self._layout = tree_layout(K, self.D, W)
        on_device = self._on_device(layout)
        D, S = layout.D, layout.S
        u = stream_uniforms(self.seed, self.indices[rows], self.steps_per_image[rows], _KINDS + TREE_KINDS,
                            max(W, S, D * (K - 1), 1))
        chain_u, tree_u = u[:_KINDS], u[_KINDS:]
        x, p = self._drafts(rows, c, W, chain_u[_INIT][:, :W])
        if self._counting(W):
            self._ages_entered = self.entered[rows].gather(1, c[:, None] + torch.arange(W, device=dev))
        cand, alive = draw_siblings(x[:, :D], p[:, :D], K, tree_u[-1][:, : D * (K - 1)].reshape(A, D, K - 1))
        depth, branch = on_device.depth, on_device.branch
        root = self.tokens[rows].gather(1, (c - 1)[:, None])
        chain_tokens = x[:, (depth - 1).clamp(0, W - 1)]
        tree_tokens = cand[:, (depth - 1).clamp(0, D - 1), branch] if D else chain_tokens
        fed = torch.where(depth == 0, root, torch.where(depth <= D, tree_tokens, chain_tokens))
        valid_host = layout.depth[None] <= (widths_host - 1)[:, None]  # [A, S] nodes inside the image
        if self.profile:
            _synchronize(dev)
            t0 = time.perf_counter()
        logits = session.forward_tree(fed, c_host - 1, layout, valid_host)
        valid = depth[None] <= (widths - 1)[:, None]
        q, self._bad = target_probs(logits.cond, logits.uncond, self.sampling, valid=valid, check=True,
                                    guidance=self._scales(c[:, None] + depth[None]))  # a node at depth d: position c + d
        self._raw_logits = (logits.cond, logits.uncond, valid)
        if self.profile:
            _synchronize(dev)
            t1 = time.perf_counter()
        # the longest-run choice (the tests' control) reads the layout on the host
        shown = on_device if self.PATH_CHOICE == "first" else layout
        verdict = verify_tree(self.rule, self.refresh, shown, cand, alive, x, p, q, widths, tree_u, chain_u,
                              choice=self.PATH_CHOICE)
        if self.profile:
            _synchronize(dev)
            self.timings["forward"] += t1 - t0
            self.timings["verify"] += time.perf_counter() - t1
        r = verdict.accepted
        self._commit(rows, c, verdict, verdict.target, widths)
        slot = torch.arange(W, device=dev)
        positions = c[:, None] + slot
        old = self.side[rows].gather(1, positions)
        self.side[rows] = self.side[rows].scatter(1, positions, torch.where(slot <= r[:, None], verdict.side, old))
        log = torch.full((self.B, self.D), -2, dtype=torch.long, device=dev)  # -2: image not decoding
        log[rows] = -1
        log[rows, :D] = verdict.branches
        self.branch_log.append(log)
        self._keep_drafts(rows, c, verdict.main_target, widths)
        self._pending = verdict.path[:, 1 : D + 1]
        return self._auto_counts(rows, r, widths, W)

    def _on_device(self, layout: TreeLayout) -> TreeLayout:
        """``layout`` with its tensors on the loop's device, copied there once per window width (queued:
        :func:`csdgen.transfer.to_device_all`), so that no iteration copies them again (a blocking copy each)."""
        key = (layout.K, layout.D, layout.W)
        found = self._device_layouts.get(key)
        if found is None:
            names = [f.name for f in dataclasses.fields(layout) if isinstance(getattr(layout, f.name), torch.Tensor)]
            moved = to_device_all([getattr(layout, name) for name in names], self.device)
            found = self._device_layouts[key] = dataclasses.replace(layout, **dict(zip(names, moved)))
        return found

    def _image_stats(self) -> list[ImageStats]:
        stats = super()._image_stats()
        N = self.model.num_image_tokens
        log = torch.stack(self.branch_log, dim=1).cpu() if self.branch_log else torch.zeros(self.B, 0, self.D, dtype=torch.long)
        side = self.side[:, :N].cpu()
        for b, s in enumerate(stats):
            row = log[b]
            s.branches = row[row[:, 0] > -2] if len(row) else row[:0]
            s.side_branch = side[b]
            s.tree = (self.K, self.D)
        return stats
