"""Draft trees at the root of each window, verified exactly by recursive rejection sampling.

SJD-PAC (Kang et al., CVPR 2026, arXiv 2603.18599) adds "proactive drafting" to speculative
Jacobi decoding: the first levels of the window hold ``K`` candidate tokens each instead of
one, so that a window whose first draft is rejected can still commit a sibling. Its released
code picks the root-to-leaf path with the longest accepted run, which biases the output
(``docs/frontier.md``, ``tests/test_trees.py`` shows the bias). csdgen makes it exact:

* **Tree** (:class:`TreeLayout`): the root is image ``b``'s last committed token (depth 0,
  image position ``c - 1``); depths ``1 .. D`` are full ``K``-ary levels; the node of depth
  ``d`` stands at image position ``c - 1 + d``. Level ``d``'s ``K`` candidates are shared by
  every parent at that level: candidate 0 is the window's ordinary draft at that position,
  candidates ``1 .. K-1`` are drawn **without replacement** from the same draft distribution
  ``p`` (:func:`draw_siblings`). The first branch (all candidates 0) goes on as the window's
  ordinary chain, so the main path holds the ``W`` slots of an SJD window and the tree adds
  ``K + K^2 + ... + K^D - D`` side nodes. Slots are in breadth-first order (a node's parent is
  always to its left), and every node attends to its ancestors only (:attr:`TreeLayout.ancestors`)
  at position ``cached length + depth``.
* **Exact verification** (:func:`verify_tree`): at every internal node, the ``K`` children are
  tested by recursive rejection sampling (SpecTr/SpecInfer-style multi-draft speculative
  sampling, in the without-replacement form of Sequoia, Chen et al., 2024, Algorithm 2):
  sibling ``k`` has draft distribution ``p_k = norm(p`` with siblings ``1 .. k-1`` removed``)``
  (how it was actually drawn) and target ``r_{k-1}``, where ``r_0 = q`` (the node's target
  distribution) and ``r_k = norm(max(0, r_{k-1} - p_k))`` after a rejection. The **first**
  accepted sibling wins; when none is, the new token is a sample of ``r_K``. By induction over
  ``k`` the token decided at each node is distributed exactly as ``q``; since the choice at a
  level never looks deeper, the committed path is an exact sample of the target (unlike the
  longest-run choice). Beyond depth ``D`` the main path is verified as plain SJD.
* **Relaxed rules** apply to each sibling's test with ``(p_k, r_{k-1})`` in place of
  ``(p, q)`` (and their own residual). For CSD this means the entropy bonus ``lam * H`` and
  the total-variation gate are computed on the *residual* target left by the rejected
  siblings, so every sibling gets its own relaxed chance: a tree adds relaxation as well as
  candidates, and CSD with a tree drifts further from the target than CSD on a chain.

The engine side (drafting the tree, the session's tree forward, compaction of the cache to
the winning path) is in :mod:`csdgen.engine.tree_loop` (``_TreeLoop``) and in the sessions'
``forward_tree`` / ``keep_path`` methods (:mod:`csdgen.models._ragged`,
:mod:`csdgen.models.function`).

Session protocol for trees (duck-typed; the engine refuses a session without it in one line):
``supports_trees`` (bool; ``tree_refusal`` says why not), ``forward_tree(tokens [B, S], start [B],
layout, valid [B, S]) -> WindowLogits [B, S, V]`` and ``keep_path(path [B, W], lengths [B])``
(CPU per-row arguments, as for the other session methods).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from .acceptance import AcceptanceRule, checked_probability, first_rejection
from .drafting import refresh_drafts
from .tensor_checks import described
from .decisions import ACCEPT_STREAM as _ACCEPT  # the chain's stream kinds
from .decisions import COUPLED_STREAM as _COUPLED
from .decisions import KEEP_STREAM as _KEEP
from .decisions import RESIDUAL_STREAM as _RESIDUAL
from .decisions import Decision
from .sampling import as_integer, sample

__all__ = ["TreeLayout", "tree_layout", "tree_nodes", "check_tree", "draw_siblings", "without", "TreeVerdict", "verify_tree",
           "TREE_KINDS"]

#: uniform streams a tree iteration uses on top of the chain's: per child test (target sample, acceptance),
#: per internal node (residual), per node (bonus sample), and the sibling draws
TREE_KINDS = 5
_TY, _TACC, _TRES, _TBONUS, _TSIB = range(TREE_KINDS)


def check_tree(tree) -> tuple[int, int] | None:
    """Validate ``tree=(K, D)``: None, or two integers ``K >= 1`` (candidates per level), ``D >= 1`` (levels).

    Returns:
        ``(K, D)`` as ints; None for None and for ``K = 1`` (one candidate per level has no side branch:
        it is the plain window, run and recorded as no tree).

    Raises:
        ValueError: naming the bad value and what is allowed.
    """
    if tree is None:
        return None
    ok = isinstance(tree, (tuple, list)) and len(tree) == 2 and all(as_integer(v) is not None for v in tree)
    # D is bounded before K**D is computed: (10**5, 10**7) would take minutes to raise to the power
    if not ok or tree[0] < 1 or tree[1] < 1 or (tree[0] > 1 and (tree[1] > 12 or tree[0] ** tree[1] > 4096)):
        raise ValueError(f"tree={tree!r}: allowed None or (K, D) with integers K >= 1 (candidates per level), "
                         "D >= 1 (tree levels) and K**D <= 4096")
    K, D = as_integer(tree[0]), as_integer(tree[1])
    return None if K == 1 else (K, D)


@dataclass(frozen=True)
class TreeLayout:
    """The node layout of a tree window (the same for every image of a batch; CPU tensors).

    Attributes:
        K: candidates per level; D: tree levels (``<= W - 1``); W: main-path slots (the window).
        S: nodes (fed slots): ``1 + K + ... + K^D + (W - 1 - D)``.
        depth: ``[S]`` int64, depth of each node (0 = root); image position ``c - 1 + depth``.
        parent: ``[S]`` int64 (root: 0).
        branch: ``[S]`` int64, the candidate index of each node (0 for the root and the chain).
        ancestors: ``[S, S]`` bool, ``ancestors[s, t]``: node ``t`` is ``s`` or an ancestor of ``s``.
        children: ``[M, K]`` int64, the children of the internal nodes ``0 .. M - 1`` (depth < D).
        main: ``[W]`` int64, the main-path node at depth ``0 .. W - 1``.
        on_main: ``[S]`` bool, node on the main path.
    """

    K: int
    D: int
    W: int
    S: int
    depth: torch.Tensor
    parent: torch.Tensor
    branch: torch.Tensor
    ancestors: torch.Tensor
    children: torch.Tensor
    main: torch.Tensor
    on_main: torch.Tensor

    @property
    def internal(self) -> int:
        """M, the nodes with tree children (depth < D)."""
        return self.children.shape[0]


def _tree_sizes(K, D, W, caller: str) -> tuple[int, int, int]:
    """``(K, D, W)`` as ints if ``K >= 1``, ``D >= 0`` and ``W >= 1`` are integers, else the ValueError naming the bad one."""
    for name, value, low, meaning in (("K", K, 1, "candidates per level"), ("D", D, 0, "tree levels"),
                                      ("W", W, 1, "main-path slots, the window")):
        number = as_integer(value)
        if number is None or number < low:
            raise ValueError(f"{caller}: {name}={value!r}; allowed an integer >= {low} ({meaning}), with K >= 1, D >= 0 "
                             f"and W >= 1")
    return as_integer(K), as_integer(D), as_integer(W)


def tree_nodes(K: int, D: int, W: int) -> int:
    """S, the nodes (fed slots) of a window of ``W`` main-path slots with a ``K``-ary tree of ``D`` levels:
    ``1 + K + ... + K^D' + (W - 1 - D')`` with ``D' = min(D, W - 1)``, as :func:`tree_layout` lays them out
    (computed without building the layout, whose ``[S, S]`` ancestor mask a memory plan need not allocate).

    Args:
        K: candidates per level, an integer >= 1; D: tree levels, an integer >= 0 (only the first
            ``W - 1`` are laid out); W: main-path slots, an integer >= 1.

    Returns:
        S, equal to ``tree_layout(K, D, W).S``.

    Raises:
        ValueError: ``K``, ``D`` or ``W`` is not such an integer (the message names it).
    """
    K, D, W = _tree_sizes(K, D, W, "tree_nodes")
    D = min(D, W - 1)
    return sum(K**d for d in range(D + 1)) + (W - 1 - D)


def tree_layout(K: int, D: int, W: int) -> TreeLayout:
    """The layout of a window of ``W`` main-path slots with a ``K``-ary tree of ``min(D, W - 1)`` levels
    (module docstring; layouts are cached, 64 of them).

    Args:
        K: candidates per level, an integer >= 1 (1: a plain chain); D: tree levels, an integer
            >= 0 (a tree never reaches past the window: ``min(D, W - 1)`` levels are laid out);
            W: main-path slots (the window), an integer >= 1. Numpy and 0-d torch integers are
            taken as the ints they are.

    Returns:
        the :class:`TreeLayout`, with ``S = tree_nodes(K, D, W)`` nodes.

    Raises:
        ValueError: ``K``, ``D`` or ``W`` is not such an integer (the message names it; a list was
            an 'unhashable type' TypeError from the cache).
    """
    return _tree_layout(*_tree_sizes(K, D, W, "tree_layout"))


@lru_cache(maxsize=64)
def _tree_layout(K: int, D: int, W: int) -> TreeLayout:
    """:func:`tree_layout` of checked ints."""
    D = min(D, W - 1)
    depth, parent, branch = [0], [0], [0]
    level_start = [0]
    for d in range(1, D + 1):
        first_parent, count = level_start[d - 1], K ** (d - 1)
        level_start.append(len(depth))
        for i in range(count * K):
            depth.append(d)
            parent.append(first_parent + i // K)
            branch.append(i % K)
    main = [level_start[d] for d in range(D + 1)]
    for d in range(D + 1, W):
        parent.append(main[-1])
        main.append(len(depth))
        depth.append(d)
        branch.append(0)
    S = len(depth)
    depth_t, parent_t = torch.tensor(depth), torch.tensor(parent)
    ancestors = torch.eye(S, dtype=torch.bool)
    for s in range(1, S):  # parents are to the left: one pass in order builds the closure
        ancestors[s] |= ancestors[parent[s]]
    M = level_start[D] if D > 0 else 0
    children = torch.tensor([[level_start[depth[m] + 1] + (m - level_start[depth[m]]) * K + k for k in range(K)]
                             for m in range(M)], dtype=torch.long).reshape(M, K)
    on_main = torch.zeros(S, dtype=torch.bool)
    on_main[torch.tensor(main)] = True
    return TreeLayout(K, D, W, S, depth_t, parent_t, torch.tensor(branch), ancestors, children, torch.tensor(main), on_main)


def without(probs: torch.Tensor, removed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``probs`` with the tokens ``removed`` set to 0, renormalised: a without-replacement draw's law.

    Args:
        probs: ``[..., V]`` float distributions; removed: ``[..., k]`` int64 tokens (``k >= 0``) in
            ``0 .. V - 1`` (values not checked: that would read the tensor), the same leading shape.

    Returns:
        ``(probs' [..., V] float32, alive [...] bool)``; where no mass is left (``alive`` False)
        ``probs'`` is ``probs`` (never read by the callers: such a candidate is void).

    Raises:
        ValueError: ``removed`` is not an int64 tensor of shape ``[..., k]`` with ``probs``' leading shape.
    """
    if not isinstance(removed, torch.Tensor) or removed.dtype != torch.long or removed.shape[:-1] != probs.shape[:-1]:
        raise ValueError(f"without: removed is {described(removed)}; allowed an int64 tensor [..., k] of tokens with probs' leading "
                         f"shape {list(probs.shape[:-1])}")
    kept = probs.float()
    if removed.shape[-1]:
        kept = kept.scatter(-1, removed, 0.0)
    mass = kept.sum(-1, keepdim=True)
    alive = mass > 1e-12
    return torch.where(alive, kept / torch.where(alive, mass, torch.ones_like(mass)), probs.float()), alive[..., 0]


def draw_siblings(drafts: torch.Tensor, draft_probs: torch.Tensor, K: int, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``K`` candidates of each tree level: the draft first, then ``K - 1`` more without replacement.

    Candidate 0 is the window's draft ``x`` (a sample of ``p``); candidate ``k`` is a sample of
    ``p`` with candidates ``0 .. k-1`` removed (:func:`without`), so the candidates are a
    sequential without-replacement sample of ``p`` and :func:`verify_tree` can score each one
    with the law it was really drawn from. A level whose ``p`` has fewer than ``K`` tokens of
    positive mass (one-hot drafts, top-k) gets *void* candidates (never accepted).

    Args:
        drafts: ``[A, D]`` int64, the draft at each level; draft_probs: ``[A, D, V]`` float ``p``.
        K: candidates per level, an integer >= 1; uniforms: ``[A, D, K - 1]`` float64 in [0, 1)
            (:func:`csdgen.sampling.sample`'s preconditions).

    Returns:
        ``(candidates [A, D, K] int64, alive [A, D, K] bool)``.

    Raises:
        ValueError: ``K`` is not an integer >= 1; ``draft_probs`` is not ``[A, D, V]`` or ``uniforms``
            not ``[A, D, K - 1]`` for ``drafts`` ``[A, D]``.
    """
    k_int = as_integer(K)
    if k_int is None or k_int < 1:
        raise ValueError(f"draw_siblings: K={K!r}; allowed an integer >= 1 (candidates per level)")
    K = k_int
    if draft_probs.shape[:-1] != drafts.shape or drafts.dim() != 2 or tuple(uniforms.shape) != (*drafts.shape, K - 1):
        raise ValueError(f"draw_siblings: drafts {list(drafts.shape)}, draft_probs {list(draft_probs.shape)}, uniforms "
                         f"{list(uniforms.shape)}; allowed [A, D], [A, D, V] and [A, D, K - 1] = "
                         f"{[*drafts.shape, K - 1]} (K = {K})")
    cand, alive = [drafts], [torch.ones_like(drafts, dtype=torch.bool)]
    for k in range(1, K):
        probs, ok = without(draft_probs, torch.stack(cand, -1))
        drawn = sample(probs, uniforms[..., k - 1])
        cand.append(torch.where(ok, drawn, drafts))
        alive.append(ok & alive[-1])
    return torch.stack(cand, -1), torch.stack(alive, -1)


def _longest_choice(layout: TreeLayout, node_pass: torch.Tensor) -> torch.Tensor:
    """SJD-PAC's path choice (biased, for the tests' control): ``[A, M]`` the child to follow at
    every internal node so that the walk takes the leaf path with the longest accepted run
    (cumulative minimum of the node tests along the path), the lowest leaf index on ties."""
    dev = node_pass.device
    D = layout.D
    leaves = (layout.depth == D).nonzero()[:, 0]  # [L] in breadth-first order (main leaf first)
    order = torch.argsort(layout.depth)
    along = torch.stack([order[layout.ancestors[l][order]] for l in leaves.tolist()])  # [L, D + 1] root .. leaf
    run = node_pass[:, along[:, 1:].to(dev)].long().cumprod(-1).sum(-1)  # [A, L]
    best = run.argmax(-1)  # first maximum
    chosen = along.to(dev)[best]  # [A, D + 1]
    won = torch.full((node_pass.shape[0], layout.internal), -1, dtype=torch.long, device=dev)
    branch = layout.branch.to(dev)
    best_run = run.gather(1, best[:, None])[:, 0]
    for d in range(D):
        take = best_run > d
        won.scatter_(1, chosen[:, d : d + 1], torch.where(take, branch[chosen[:, d + 1]], -1)[:, None])
    return won


@dataclass
class TreeVerdict:
    """What :func:`verify_tree` decided for a tree window (slot ``j`` = image position ``c + j``).

    Attributes:
        accepted: ``[A]`` int64 r, accepted candidates on the winning path (commits ``r + 1``).
        tokens: ``[A, W]`` int64: the winning path's candidates before ``r``, the new token at ``r``,
            refreshed drafts (from the main path's targets) after it.
        decisions: ``[A, W]`` int8 :class:`csdgen.decisions.Decision` codes (meaningful at ``<= r``).
        side: ``[A, W]`` bool, the token was accepted from a side branch (a node off the main path).
        path: ``[A, W]`` int64, the winning path's node at depth ``0 .. W - 1`` (main path beyond it).
        branches: ``[A, D]`` int64, the winning candidate at each tree level (-1: level not accepted).
        target: ``[A, W, V]``, the target distribution each slot was decided under (the path's nodes).
        main_target: ``[A, W, V]``, the main path's targets: the draft distribution recorded
            for the next window's carried drafts.
    """

    accepted: torch.Tensor
    tokens: torch.Tensor
    decisions: torch.Tensor
    side: torch.Tensor
    path: torch.Tensor
    branches: torch.Tensor
    target: torch.Tensor
    main_target: torch.Tensor


def verify_tree(
    rule: AcceptanceRule,
    refresh: str,
    layout: TreeLayout,
    candidates: torch.Tensor,
    alive: torch.Tensor,
    drafts: torch.Tensor,
    draft_probs: torch.Tensor,
    target: torch.Tensor,
    widths: torch.Tensor,
    uniforms: torch.Tensor,
    chain_uniforms: torch.Tensor,
    choice: str = "first",
) -> TreeVerdict:
    """Exact multi-candidate verification of a tree window (module docstring), vectorised.

    All internal nodes run their sibling recursion at once (a loop over the ``K`` siblings,
    tensor ops over ``[A, M, V]``), then the winning path is walked level by level (a loop over
    the ``D`` levels) and continued on the main chain with :func:`~csdgen.acceptance.first_rejection`.
    No host sync.

    Args:
        rule: the acceptance rule (applied to each sibling's test).
        refresh: ``"independent"`` or ``"coupled"`` (drafts after the committed prefix).
        layout: the window's :class:`TreeLayout`.
        candidates: ``[A, D, K]`` int64 from :func:`draw_siblings`; alive: ``[A, D, K]`` bool.
        drafts: ``[A, W]`` int64, the main path's draft at slot ``j`` (image position ``c + j``).
        draft_probs: ``[A, W, V]`` float ``p`` of those drafts (also the tree levels' ``p``).
        target: ``[A, S, V]`` float ``q`` at every node (the distribution of the node's position + 1).
        widths: ``[A]`` int64 valid main slots per image (nodes deeper than ``widths - 1`` are padding).
        uniforms: ``[TREE_KINDS, A, >= S]`` float64; chain_uniforms: ``[6, A, >= W]`` float64
            (the chain's kinds of :mod:`csdgen.decisions`).
        choice: ``"first"`` (exact: the first accepted sibling wins) or ``"longest"``: every
            sibling is tested against the residual of the ones before it whether or not one was
            accepted, and the root-to-leaf path with the longest accepted run wins (first on ties),
            as in SJD-PAC's released code. **Biased**; kept only as the failing control of the tests.

    Returns:
        a :class:`TreeVerdict`.

    Raises:
        ValueError: an unknown ``choice`` or ``refresh`` mode (:func:`csdgen.drafting.refresh_drafts`).
            Shapes and values are not checked here: the tree loop builds them.
    """
    if choice not in ("first", "longest"):
        raise ValueError(f"choice={choice!r}: allowed 'first' (exact) or 'longest' (SJD-PAC's biased path choice)")
    A, W = drafts.shape
    K, D, M = layout.K, layout.D, layout.internal
    dev = drafts.device
    depth = layout.depth.to(dev)
    main = layout.main.to(dev)
    q_main = target[:, main]  # [A, W, V]
    y_node = sample(target, uniforms[_TBONUS][:, : layout.S])  # [A, S] a sample of q at every node
    last = (widths - 1)[:, None]  # [A, 1] the deepest valid depth

    # 1. the sibling recursion at every internal node
    won = torch.full((A, M), -1, dtype=torch.long, device=dev)
    won_exact = torch.zeros(A, M, dtype=torch.bool, device=dev)
    node_pass = torch.ones(A, layout.S, dtype=torch.bool, device=dev)  # every sibling's own test ("longest")
    new_token = torch.zeros(A, M, dtype=torch.long, device=dev)
    if M:
        children = layout.children.to(dev)  # [M, K]
        node_depth = depth[:M]  # [M]
        q_int = target[:, :M]  # [A, M, V]
        p_lvl = draft_probs[:, node_depth]  # [A, M, V]: level depth+1's candidates were drawn from p at slot depth
        cand = candidates[:, node_depth]  # [A, M, K]
        ok = alive[:, node_depth] & (node_depth[None, :, None] + 1 <= last[..., None])  # child depth valid
        residual = q_int.float()
        for k in range(K):
            x_k = cand[..., k]
            p_k, _ = without(p_lvl, cand[..., :k])
            y_k = sample(residual, uniforms[_TY][:, children[:, k]])
            b = checked_probability(rule, rule.acceptance_probability(x_k, p_k, residual, y_k), x_k.shape)
            exact = uniforms[_TACC][:, children[:, k]] < rule.exact_probability(x_k, p_k, residual, y_k, b)
            allowed = ok[..., k] & (q_int.gather(-1, x_k[..., None])[..., 0] > 0)
            passes = allowed & (uniforms[_TACC][:, children[:, k]] < b)
            first = passes & (won < 0)
            won = torch.where(first, k, won)
            won_exact = torch.where(first, exact, won_exact)
            rejected = ok[..., k] & (won < 0)
            if choice == "longest":
                node_pass[:, children[:, k]] = passes
                rejected = ok[..., k] & ~passes
            residual = torch.where(rejected[..., None], rule.residual(p_k, residual, y_k).float(), residual)
        new_token = sample(residual, uniforms[_TRES][:, :M])

    # 2. walk the winning path down the tree levels
    path = main[None].expand(A, W).clone()
    node = torch.zeros(A, dtype=torch.long, device=dev)
    going = torch.ones(A, dtype=torch.bool, device=dev)
    reached = torch.zeros(A, dtype=torch.long, device=dev)
    branches = torch.full((A, max(D, 1)), -1, dtype=torch.long, device=dev)[:, :D]
    exact_path = torch.ones(A, W, dtype=torch.bool, device=dev)
    if choice == "longest" and D:
        won = _longest_choice(layout, node_pass)
    for d in range(1, D + 1):
        w = won.gather(1, node[:, None])[:, 0]
        step = going & (w >= 0)
        child = layout.children.to(dev)[node, w.clamp(min=0)]
        branches[:, d - 1] = torch.where(step, w, -1)
        exact_path[:, d - 1] = won_exact.gather(1, node[:, None])[:, 0]
        node = torch.where(step, child, node)
        path[:, d] = torch.where(step, child, path[:, d])
        reached += step.long()
        going = step

    # 3. the main chain beyond the tree (plain SJD), reached only through the main leaf
    slot = torch.arange(W, device=dev)
    y_main = y_node[:, main]
    b_chain = checked_probability(rule, rule.acceptance_probability(drafts, draft_probs, q_main, y_main), drafts.shape)
    chain_exact = chain_uniforms[_ACCEPT][:, :W] < rule.exact_probability(drafts, draft_probs, q_main, y_main, b_chain)
    allowed = q_main.gather(-1, drafts[..., None])[..., 0] > 0
    chain_pass = allowed & (chain_uniforms[_ACCEPT][:, :W] < b_chain) & (slot >= D) & (slot < last)
    chain_r = first_rejection(chain_pass | (slot < D))  # >= D when the first D levels are taken as passed
    on_leaf = going & (node == main[D])
    r = torch.where(on_leaf, chain_r, reached)  # [A]
    exact_path = torch.where(slot >= D, chain_exact, exact_path)

    # 4. the new token at slot r: bonus (no child was tested), tree residual, or chain residual
    end = path.gather(1, r[:, None])[:, 0]  # [A] node at depth r
    internal_end = (r < D) & (r < last[:, 0])  # stopped at an internal node whose children were all rejected
    leaf_side = (r == D) & ~layout.on_main.to(dev)[end]
    bonus = (r == last[:, 0]) | leaf_side
    r_col = r[:, None]
    at = r_col[..., None].expand(A, 1, target.shape[-1])
    chain_res = rule.residual(draft_probs.gather(1, at), q_main.gather(1, at), y_main.gather(1, r_col))[:, 0]
    z_chain = sample(chain_res, chain_uniforms[_RESIDUAL].gather(1, r_col)[:, 0])
    z_tree = new_token.gather(1, end.clamp(max=max(M - 1, 0))[:, None])[:, 0] if M else z_chain
    token = torch.where(bonus, y_node.gather(1, end[:, None])[:, 0], torch.where(internal_end, z_tree, z_chain))

    # 5. the window's new content in chain coordinates
    path_tokens = candidates.new_zeros(A, W)
    if D:
        branch_at = layout.branch.to(dev)[path[:, 1 : D + 1]]  # [A, D] candidate index of the path node at depth 1..D
        path_tokens[:, :D] = candidates.gather(-1, branch_at[..., None])[..., 0]
    path_tokens = torch.where(slot < D, path_tokens, drafts)
    fresh = refresh_drafts(refresh, drafts, draft_probs, q_main, y_main, chain_uniforms[_KEEP][:, :W],
                           chain_uniforms[_COUPLED][:, :W])
    fresh = torch.where(slot == last, y_main, fresh)
    tokens = torch.where(slot < r_col, path_tokens, torch.where(slot == r_col, token[:, None], fresh))
    code = torch.where(
        slot < r_col,
        torch.where(exact_path, int(Decision.ACCEPTED), int(Decision.RELAXED)),
        torch.where(bonus[:, None], int(Decision.SAMPLED), int(Decision.RESAMPLED)),
    ).to(torch.int8)
    node_after = path[:, 1:]  # node holding the token of slot j is the path node at depth j + 1
    side = torch.cat([~layout.on_main.to(dev)[node_after], torch.zeros(A, 1, dtype=torch.bool, device=dev)], 1) & (slot < r_col)
    decided_under = target.gather(1, path[..., None].expand(-1, -1, target.shape[-1]))
    return TreeVerdict(r, tokens, code, side, path, branches, decided_under, q_main)
