"""The engine's public entry point, :func:`generate`: arguments checked and resolved, then one
run of the loop (or of the tree loop)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..acceptance import AcceptanceRule
from ..drafting import check_drafting, resolve_draft_init
from ..models.base import ImageTokenModel
from ..sampling import SamplingConfig
from ..trees import check_tree
from .loop import _Loop
from .methods import _check_window, _default_sampling, _resolve_method
from .results import GenerationResult, StepInfo
from .tree_loop import _TreeLoop

__all__ = ["generate"]


def generate(
    model: ImageTokenModel,
    conditions: Any = None,
    *,
    batch_size: int | None = None,
    method: str | AcceptanceRule = "csd",
    window: int | str | None = None,
    seed: int = 0,
    image_indices: Sequence[int] | None = None,
    sampling: SamplingConfig | None = None,
    draft_init: str | None = None,
    refresh: str = "independent",
    callback: Callable[[StepInfo], None] | None = None,
    profile: bool = False,
    tree: tuple[int, int] | None = None,
) -> GenerationResult:
    """Generate image tokens by AR decoding or speculative Jacobi decoding with an acceptance rule.

    Arguments left None come from ``model.defaults`` (the family's published or measured
    defaults, :class:`csdgen.models.defaults.FamilyDefaults`), else from the CSD reference.

    Args:
        model: any :class:`~csdgen.models.base.ImageTokenModel`.
        conditions: what the model conditions on (class ids, prompts; one per image) or None.
        batch_size: number of images when ``conditions`` does not fix it.
        method: ``"ar"``, ``"sjd"``, ``"csd"`` (lambda and delta from ``model.defaults``),
            ``"addition"``, ``"jacobi"``, ``"gsd"``, ``"lantern"`` (default options; the last
            two take the model's codebook) or an :class:`~csdgen.acceptance.AcceptanceRule`
            instance such as ``CSD(lam=0.3)``.
        window: W, input slots of one Jacobi forward (each forward commits 1..W tokens per
            image), or ``"auto"`` (default): chosen every iteration to maximise measured tokens
            per second, 1 .. :data:`AUTO_MAX_WINDOW` (see :mod:`csdgen.engine`). Ignored (1) for ``"ar"``.
        seed: the run's seed. Image ``i`` of the call draws from its own random stream keyed by
            ``(seed, image_indices[i])``.
        image_indices: the index of each image in the whole run (default ``0 .. B-1``); a
            caller splitting a run into batches passes the run-wide indices, so the batch size
            never changes an image (with a fixed window).
        sampling: guidance scale, temperature (0 = greedy), top-k, top-p (default: the model's).
        draft_init: ``"uniform"`` (CSD reference), ``"onehot"`` (SJD reference),
            ``"repeat-horizontal"`` or ``"repeat-vertical"``; None: what the rule needs
            (one-hot for GSD and LANTERN), else ``"uniform"``.
        refresh: ``"independent"`` (SJD) or ``"coupled"`` (maximal coupling); both lossless.
        callback: called with a :class:`StepInfo` after every forward (progress bars, tests).
        profile: also time the forwards and :func:`verify` with device synchronisation
            (:attr:`GenerationResult.timings`; adds two syncs per iteration: for benchmarks).
        tree: ``(K, D)``: a draft tree at the root of every window (:mod:`csdgen.trees`): ``K``
            candidates at each of the first ``D`` window positions, verified exactly (recursive
            rejection sampling over siblings), the first branch continued as the window's chain;
            ``window`` counts the main path only, the forward also evaluates the
            ``K + ... + K^D - D`` side nodes. None (default): plain windows. Needs a session
            with ``forward_tree`` (``FunctionModel`` and every RaggedSession family: built-in /
            Llama, Janus, Emu3, Chameleon; see docs/frontier.md).

    Returns:
        :class:`GenerationResult` with tokens ``[B, N]`` int64 and per-image statistics.

    Raises:
        ValueError: bad window, unknown method, draft initialisation or refresh mode, a draft
            initialisation the rule cannot use, bad sampling settings (e.g. top-k > V),
            ``image_indices`` not one non-negative int per image, conditions the model rejects,
            logits with NaN / +inf (or no allowed token) at some position, a bad ``tree``, a
            tree with ``method="ar"``, or a tree on a model whose session cannot evaluate trees.
    """
    window = _check_window(window if window is not None else "auto")
    rule, method_name = _resolve_method(method, model)
    if method_name == "ar":
        window = 1
    tree = check_tree(tree)
    if tree is not None and method_name == "ar":
        raise ValueError(f"tree={tree!r} with method='ar': a draft tree needs a speculative method (e.g. 'sjd')")
    draft_init = resolve_draft_init(draft_init, rule.draft_init, rule.name)
    check_drafting(draft_init, refresh)
    sampling = sampling or _default_sampling(model)
    if sampling.top_k is not None and sampling.top_k > model.codebook_size:
        raise ValueError(f"top_k={sampling.top_k} exceeds the codebook size V={model.codebook_size}; allowed: 1..{model.codebook_size}")
    settings = {
        "method": method_name,
        "rule": rule.options(),
        "window": window,
        "draft_init": draft_init,
        "refresh": refresh,
        "seed": seed,
        "guidance_scale": sampling.guidance_scale,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
    }
    if tree is None:
        loop = _Loop(model, rule, window, seed, sampling, draft_init, refresh, callback, profile)
    else:
        settings["tree"] = list(tree)
        loop = _TreeLoop(model, rule, window, seed, sampling, draft_init, refresh, callback, profile, tree=tree)
    return loop.run(conditions, batch_size, image_indices, settings)
