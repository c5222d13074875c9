"""The decoding loop: AR, speculative Jacobi decoding (SJD) and its relaxed variants (CSD, ...).

One iteration (Teng et al., 2024, "Accelerating Auto-regressive Text-to-Image Generation with
Training-free Speculative Jacobi Decoding"; the CSD paper's Algorithm 1), for every image ``b``
of the batch at its own committed length ``c_b``:

    draft -> forward -> verify -> commit -> roll back

* **draft**: image ``b``'s window feeds its image positions ``c_b - 1 .. c_b + n_b - 2``: its
  last committed token, then its pending drafts (``n_b = min(W, N - c_b)`` slots; the other
  slots of the ``[B, W]`` batch are padding the session masks out). Drafts left by the last
  forward are carried with their draft distribution; new slots get drafts from the
  initialisation (:mod:`csdgen.drafting`).
* **forward**: one model call for the whole batch gives the target distribution ``q`` at
  positions ``c_b .. c_b + n_b - 1`` of every image.
* **verify** (:func:`verify`): the rule's acceptance probabilities for the whole window, the
  first rejection per image (vectorised, :func:`csdgen.acceptance.first_rejection`), a sample
  from the residual at that slot only, or a *bonus* sample from ``q`` at the last slot when
  every draft passed; drafts after the rejection are refreshed from ``q``.
* **commit**: image ``b`` commits its accepted drafts and the new token: ``c_b`` grows by 1 .. n_b.
* **roll back**: row ``b`` of the cache keeps positions ``0 .. c_b - 2`` (per-row lengths).

**Images are independent.** Every image's window starts at its own committed length (per-row
positions, attention masks and cache lengths: :mod:`csdgen.models._ragged`), and every random
number an image uses is a hash of ``(seed, image index, the image's own forward count, draw
kind, slot)`` (:func:`csdgen.sampling.stream_uniforms`). With a fixed window, an image's
tokens and number of forwards depend only on the seed, its index in the run
(``image_indices``) and its condition: not on the batch size or on the other images
(tested; equal up to floating-point summation order of batched kernels). Finished images
leave the batch (:meth:`~csdgen.models.base.DecodingSession.select_rows`).

**Window ``"auto"``.** The width ``W`` of each iteration is chosen from the forward+verify
times measured on the running model and batch (a warm-up of three forwards at width 8 and one at 1, then an
exponential average kept current, with a neighbouring width tried now and then when it is
predicted close to the best) and the acceptance seen so far as a function of a draft's age
(forwards it has been refined by), from which the tokens committed per forward at every width
are predicted: ``W = argmax E[tokens committed | W] / t(W)`` over ``1 .. AUTO_MAX_WINDOW``, 1
(plain AR) when nothing pays. The choice depends on the past only,
so lossless rules stay exact; the widths are recorded (:attr:`GenerationResult.widths`).
Since measured times steer the widths, ``"auto"`` reproduces an image's *distribution*, not
its exact tokens: pass a fixed window for bit-reproducible images across runs and batch sizes.

**Draft trees** (``tree=(K, D)``, :mod:`csdgen.trees`): the first ``D`` draft positions of
every window hold ``K`` candidates (the draft and ``K - 1`` siblings drawn without replacement
from its draft distribution); one ``session.forward_tree`` evaluates every node, the siblings
are verified by recursive rejection sampling (exact), and the session keeps the winning path
(``session.keep_path``). A separate loop class (``_TreeLoop``); without a tree nothing changes.

**Non-finite logits.** NaN or +inf in a (guided) target distribution, or a position where
every token is -inf, raises ValueError at the iteration's host sync; -inf alone excludes a
token (:func:`csdgen.sampling.apply_guidance` keeps a token -inf in both rows at -inf). No
rule commits a draft the target distribution gives probability 0 (after top-k, top-p or a
family's mask): :func:`verify` sets such acceptance probabilities to 0.

**Cache check.** The first iteration feeds one extra probe slot past its window and rolls it
back, so every row's cache is cropped once at the start: a model whose cache cannot roll
back fails there, not after a long run.

Host syncs: one per iteration (committed lengths, the non-finite flag and the acceptance
counts of ``"auto"``, in one transfer). AR decoding is the loop with a window of 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable, Sequence

import torch

from .acceptance import RULES, SJD, AcceptanceRule, first_rejection, make_rule
from .drafting import check_drafting, init_drafts, refresh_drafts, resolve_draft_init
from .models.base import DecodingSession, ImageTokenModel
from .sampling import SamplingConfig, entropy, sample, stream_uniforms, target_probs
from .trees import TREE_KINDS, check_tree, draw_siblings, tree_layout, verify_tree

__all__ = [
    "Decision",
    "ImageStats",
    "StepInfo",
    "GenerationResult",
    "Verdict",
    "verify",
    "generate",
    "METHODS",
    "AUTO_MAX_WINDOW",
]

#: method names ``generate`` takes: ``"ar"`` plus every acceptance rule's name
METHODS = ("ar", "sjd", "csd", "addition", "jacobi", "gsd", "lantern")
#: the widest window ``window="auto"`` considers
AUTO_MAX_WINDOW = 32

# uniform streams per image and forward, one number per slot each
_KINDS = 6
_Y, _ACCEPT, _RESIDUAL, _INIT, _KEEP, _COUPLED = range(_KINDS)


class Decision(IntEnum):
    """How an image token was decided (the acceptance map's categories)."""

    SAMPLED = 0  #: plain sample from q: an AR step, the prefill token, or a window's bonus token
    ACCEPTED = 1  #: draft accepted by the rule's exact test (the lossless ``u < min(1, q/p)``; Jacobi: a match)
    RELAXED = 2  #: draft accepted only thanks to the rule's relaxation
    RESAMPLED = 3  #: sampled from the residual after the draft was rejected


@dataclass
class ImageStats:
    """Statistics of one image.

    Attributes:
        steps: target forwards (prefill included: it produces token 0) until this image was complete.
        num_tokens: N.
        committed_per_step: tokens this image committed at each of its steps (sums to N).
        decisions: ``[N]`` int8, a :class:`Decision` per image token.
        entropy: ``[N]`` float32, entropy in nats of the target distribution the token was decided under.
        side_branch: with a draft tree (``generate(..., tree=(K, D))``): ``[N]`` bool, the token was
            accepted from a side branch of the tree (a node off the main path); None without a tree.
        branches: with a draft tree: ``[steps - 1, D]`` int64, the winning candidate (0 = main
            branch, ``1 .. K-1`` = side branches) at each tree level of each step after the
            prefill, -1 where that level accepted nothing; None without a tree.
    """

    steps: int
    num_tokens: int
    committed_per_step: list[int]
    decisions: torch.Tensor
    entropy: torch.Tensor
    side_branch: torch.Tensor | None = None
    branches: torch.Tensor | None = None
    tree: tuple[int, int] | None = None

    def tree_summary(self) -> dict | None:
        """With a draft tree: ``branch_wins[d][k]`` (steps where candidate ``k`` won level ``d + 1``),
        ``tokens_per_level[d]`` (tokens level ``d + 1`` committed), ``chain_tokens`` (drafts accepted
        beyond the tree), ``side_tokens``; None without a tree."""
        if self.branches is None:
            return None
        K, D = self.tree
        wins = [[int((self.branches[:, d] == k).sum()) for k in range(K)] for d in range(D)]
        per_level = [int((self.branches[:, d] >= 0).sum()) for d in range(D)]
        accepted = sum(n - 1 for n in self.committed_per_step[1:])
        return {"branch_wins": wins, "tokens_per_level": per_level, "chain_tokens": accepted - sum(per_level),
                "side_tokens": int(self.side_branch.sum())}

    @property
    def step_compression(self) -> float:
        """Image tokens per forward: ``N / steps`` (1.0 for AR)."""
        return self.num_tokens / self.steps

    @property
    def mean_accepted_length(self) -> float:
        """Mean tokens committed per forward, excluding the prefill forward."""
        rest = self.committed_per_step[1:]
        return sum(rest) / len(rest) if rest else float(self.num_tokens)

    def counts(self) -> dict[str, int]:
        """Number of tokens per decision, by lower-case name."""
        return {d.name.lower(): int((self.decisions == d).sum()) for d in Decision}

    def summary(self) -> dict:
        """A JSON-ready dictionary of the scalar statistics."""
        return {
            "steps": self.steps,
            "tokens": self.num_tokens,
            "step_compression": self.step_compression,
            "mean_accepted_length": self.mean_accepted_length,
            "mean_entropy_nats": float(self.entropy.mean()),
            **{f"tokens_{k}": v for k, v in self.counts().items()},
            **({"tree": self.tree_summary()} if self.branches is not None else {}),
        }


@dataclass
class StepInfo:
    """What a ``callback`` sees after every forward (prefill included).

    Attributes:
        step: forwards of the batch so far.
        committed: ``[B]`` int64 committed length per image (all images of the call).
        tokens: ``[B, N]`` committed tokens and pending drafts.
        session: the model's session, rolled back to the committed positions of the images
            still decoding.
        rows: ``[B']`` int64 CPU, the image index (0 .. B-1) of each of the session's rows.
        decisions: ``[B, N]`` int8 :class:`Decision` of every committed token (meaningless beyond
            ``committed``), for live acceptance maps.
        entropy: ``[B, N]`` float32, the target entropy in nats each committed token was decided under.
    """

    step: int
    committed: torch.Tensor
    tokens: torch.Tensor
    session: DecodingSession
    rows: torch.Tensor | None = None
    decisions: torch.Tensor | None = None
    entropy: torch.Tensor | None = None


@dataclass
class GenerationResult:
    """Tokens and statistics of one ``generate`` call.

    Attributes:
        tokens: ``[B, N]`` int64 image tokens (raster order).
        images: one :class:`ImageStats` per image.
        steps: forwards of the batch (prefill included).
        seconds: wall time of decoding (prefill to last forward, device synchronised; no model
            loading, no image decoding).
        settings: method, rule options, window, drafting and sampling settings.
        batch_acceptance: ``"per-image"``: every image walks its own window.
        widths: the window width ``W`` of every forward after the prefill (all equal for a fixed
            window; chosen per iteration by ``window="auto"``).
        timings: with ``profile=True``: seconds spent in the model forwards (``"forward"``) and in
            :func:`verify` (``"verify"``), each measured with device synchronisation.
    """

    tokens: torch.Tensor
    images: list[ImageStats]
    steps: int
    seconds: float
    settings: dict[str, Any] = field(default_factory=dict)
    batch_acceptance: str = "per-image"
    widths: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def step_compression(self) -> float:
        """Mean over images of ``N / steps``."""
        return sum(s.step_compression for s in self.images) / len(self.images)

    def summary(self) -> dict:
        """A JSON-ready record: settings, batch figures and per-image statistics."""
        return {
            "settings": self.settings,
            "batch_acceptance": self.batch_acceptance,
            "batch_steps": self.steps,
            "seconds": self.seconds,
            "step_compression": self.step_compression,
            "widths": self.widths,
            **({"timings": self.timings} if self.timings else {}),
            "images": [s.summary() for s in self.images],
        }


@dataclass
class Verdict:
    """What :func:`verify` decided for a window.

    Attributes:
        accepted: ``[B]`` int64, r: leading drafts accepted (``0 .. widths - 1``); the image
            commits ``r + 1`` tokens.
        tokens: ``[B, W]`` int64, the window's new content: accepted drafts before slot ``r``,
            the new token at ``r`` (residual or bonus sample), refreshed drafts after it.
        decisions: ``[B, W]`` int8 :class:`Decision` codes, meaningful at slots ``<= r``.
    """

    accepted: torch.Tensor
    tokens: torch.Tensor
    decisions: torch.Tensor


def verify(
    rule: AcceptanceRule,
    refresh: str,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    widths: torch.Tensor,
    uniforms: torch.Tensor,
) -> Verdict:
    """One verify step: acceptance probabilities, first rejection, residual, bonus, refresh.

    Speculative sampling (Leviathan et al., 2023, Algorithm 1) applied per window position as in
    SJD (Teng et al., 2024): draft ``x_j`` passes when ``u_j < b_j``; the first failing slot
    ``r`` commits a sample of the rule's residual (``norm(max(0, q - p))`` by default), computed
    at that slot only; when every draft passes, the last slot commits a bonus sample of ``q``.
    A draft with ``q(x) = 0`` never passes, whatever the rule (relaxations widen acceptance
    among the tokens the target allows, never beyond them). Drafts after ``r`` are refreshed
    from ``q`` (:func:`csdgen.drafting.refresh_drafts`). Decisions are labelled by the rule's
    own exact part (:meth:`~csdgen.acceptance.AcceptanceRule.exact_probability`).

    Args:
        rule: the acceptance rule.
        refresh: ``"independent"`` or ``"coupled"``.
        draft_tokens: ``[B, W]`` int64, ``x_j`` = the draft at output slot ``j`` (slot
            ``widths - 1`` is the bonus slot: its draft is not tested).
        draft_probs: ``[B, W, V]`` float, ``p``.
        target_probs: ``[B, W, V]`` float, ``q``.
        widths: ``[B]`` int64 on the device, valid slots per image (``1 .. W``).
        uniforms: ``[6, B, W]`` float64 in [0, 1): target sample, acceptance, residual,
            (initialisation, unused here), coupled keep, coupled residual.

    Returns:
        a :class:`Verdict`.
    """
    x, p, q = draft_tokens, draft_probs, target_probs
    B, W = x.shape
    slot = torch.arange(W, device=x.device)
    last = (widths - 1)[:, None]  # [B, 1] the bonus slot
    y = sample(q, uniforms[_Y])
    b = rule.acceptance_probability(x, p, q, y)
    b_exact = rule.exact_probability(x, p, q, y, b)
    allowed = q.gather(-1, x[..., None]).squeeze(-1) > 0
    b = torch.where(allowed, b, torch.zeros_like(b))
    passes = (uniforms[_ACCEPT] < b) & (slot < last)
    r = first_rejection(passes)  # [B] <= widths - 1
    r_col = r[:, None]
    at = r_col[..., None].expand(B, 1, q.shape[-1])
    residual = rule.residual(p.gather(1, at), q.gather(1, at), y.gather(1, r_col))[:, 0]  # [B, V] at slot r only
    z = sample(residual, uniforms[_RESIDUAL].gather(1, r_col)[:, 0])
    bonus = r_col == last
    token = torch.where(bonus[:, 0], y.gather(1, r_col)[:, 0], z)
    fresh = refresh_drafts(refresh, x, p, q, y, uniforms[_KEEP], uniforms[_COUPLED])
    fresh = torch.where(slot == last, y, fresh)
    tokens = torch.where(slot < r_col, x, torch.where(slot == r_col, token[:, None], fresh))
    exact = uniforms[_ACCEPT] < b_exact
    code = torch.where(
        slot < r_col,
        torch.where(exact, int(Decision.ACCEPTED), int(Decision.RELAXED)),
        torch.where(bonus, int(Decision.SAMPLED), int(Decision.RESAMPLED)),
    ).to(torch.int8)
    return Verdict(r, tokens, code)


def _check_window(window: Any) -> int | str:
    if window == "auto":
        return "auto"
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r}: must be an integer >= 1 (1 = AR) or 'auto'")
    return window


def _resolve_method(method: str | AcceptanceRule, model: ImageTokenModel) -> tuple[AcceptanceRule, str]:
    if isinstance(method, str) and method == "ar":
        return SJD(), "ar"
    if isinstance(method, str) and method not in METHODS:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)} (or an AcceptanceRule)")
    if isinstance(method, AcceptanceRule):
        return method, method.name
    options = {}
    if method == "csd" and model.defaults is not None:
        options = {"lam": model.defaults.lam, "delta": model.defaults.delta}
    needs_codebook = getattr(RULES[method], "needs_codebook", False)
    rule = make_rule(method, codebook=model.codebook_embeddings() if needs_codebook else None, **options)
    return rule, rule.name


def _default_sampling(model: ImageTokenModel) -> SamplingConfig:
    d = model.defaults
    if d is None:
        return SamplingConfig()
    # a family's top-k at or above this checkpoint's codebook size keeps every token (tiny test checkpoints)
    top_k = d.top_k if d.top_k is not None and d.top_k < model.codebook_size else None
    return SamplingConfig(guidance_scale=d.guidance_scale, temperature=d.temperature, top_k=top_k,
                          top_p=getattr(d, "top_p", None))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
            per second, 1 .. :data:`AUTO_MAX_WINDOW` (see the module docstring). Ignored (1) for ``"ar"``.
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


class _AutoWindow:
    """Chooses each iteration's width from measured times and acceptance by draft age (module docstring).

    Times ``t(W)``: seconds per iteration (forward, verify and bookkeeping, sync to sync) at
    width W, an exponential average; widths not measured are interpolated linearly between
    measured ones (extrapolated with the last slope, >= 0, beyond them).

    Expected tokens ``E(W)``: a draft's chance to pass depends mostly on its *age*, the forwards
    it has been refined by since it entered the window (a fresh draft is a guess; one drawn from
    the last forward's q given nearly the right prefix usually passes). The loop counts, per age,
    drafts reached and rejected (decayed per iteration so the estimate follows the image); in a
    steady state at width W committing L tokens per forward, the draft at slot j has age
    ``floor((W - 1 - j) / L)``, so ``L = 1 + sum_j prod_{s<j} accept(age_s)`` is solved by a
    damped fixed-point iteration for every W at once. The width maximising ``E(W) / t(W)`` wins.
    """

    DECAY = 0.95  # acceptance counts, per iteration
    PRIOR = 0.5  # acceptance assumed for draft ages not seen
    TIME_WEIGHT = 0.3  # weight of a new time measurement
    EXPLORE_EVERY = 8  # try a neighbouring width this often, when it is predicted close to the best
    EXPLORE_WITHIN = 0.8
    AGES = 16  # ages 0 .. AGES - 1 (older drafts count as AGES - 1)

    def __init__(self, max_width: int):
        self.max_width = max_width
        self.reached = torch.zeros(self.AGES, dtype=torch.float64)
        self.rejected = torch.zeros(self.AGES, dtype=torch.float64)
        self.times: dict[int, float] = {}
        warm = min(8, max_width)
        self.plan = [warm, warm, warm, 1] if warm > 1 else [1]  # three in a row: refined drafts get seen
        self.count = 0

    def accept_by_age(self) -> torch.Tensor:
        """``[AGES]`` float64 estimated acceptance of a reached draft of each age.

        Fresh drafts (age 0) and refined ones (age >= 1) are estimated apart: an age not seen
        takes the nearest seen age of its group, and a group never seen (lately) the prior
        :attr:`PRIOR`, optimistic enough that a width that was not tried gets tried.
        """
        seen = self.reached > 0.5
        rate = (1 - self.rejected / self.reached.clamp(min=1e-9)).clamp(0, 1)
        out = torch.full((self.AGES,), self.PRIOR, dtype=torch.float64)
        if bool(seen[0]):
            out[0] = rate[0]
        index = torch.arange(1, self.AGES)
        seen_at = index[seen[1:]]
        if len(seen_at):
            out[1:] = rate[seen_at[(index[:, None] - seen_at[None]).abs().argmin(1)]]
        return out

    def expected_tokens(self) -> torch.Tensor:
        """``[max_width]`` float64, E(W) for W = 1 .. max_width in the steady state (class docstring)."""
        M = self.max_width
        accept = self.accept_by_age()
        widths = torch.arange(1, M + 1, dtype=torch.float64)[:, None]  # [M, 1]
        slot = torch.arange(max(M - 1, 1), dtype=torch.float64)[None]  # [1, M-1]
        drafts = slot <= widths - 2
        tokens = torch.ones(M, 1, dtype=torch.float64)
        for _ in range(8):
            age = ((widths - 1 - slot) / tokens).floor().clamp(0, self.AGES - 1).long()
            passes = torch.where(drafts, accept[age], torch.zeros_like(slot))
            tokens = 0.5 * tokens + 0.5 * (1 + passes.cumprod(1).sum(1, keepdim=True))
        return tokens[:, 0]

    def cost(self) -> torch.Tensor:
        """``[max_width]`` float64 estimated seconds per iteration at W = 1 .. max_width."""
        ws = sorted(self.times)
        widths = torch.arange(1, self.max_width + 1, dtype=torch.float64)
        if len(ws) == 1:
            return torch.full_like(widths, self.times[ws[0]])
        xs = torch.tensor(ws, dtype=torch.float64)
        ts = torch.tensor([self.times[w] for w in ws], dtype=torch.float64)
        index = torch.searchsorted(xs, widths).clamp(1, len(ws) - 1)
        x0, x1, t0, t1 = xs[index - 1], xs[index], ts[index - 1], ts[index]
        slope = ((t1 - t0) / (x1 - x0)).clamp(min=0)
        t = t0 + slope * (widths - x0)
        return torch.where(widths < xs[0], ts[0], t).clamp(min=1e-9)

    def choose(self, limit: int) -> int:
        """The next width (``<= limit``, the widest window any image can still use)."""
        self.count += 1
        limit = min(limit, self.max_width)
        if self.plan:
            return min(self.plan.pop(0), limit)
        rate = self.expected_tokens()[:limit] / self.cost()[:limit]
        best = int(rate.argmax()) + 1
        if self.count % self.EXPLORE_EVERY == 0:
            other = min(2 * best, limit) if (self.count // self.EXPLORE_EVERY) % 2 else max(1, best // 2)
            if rate[other - 1] >= self.EXPLORE_WITHIN * rate[best - 1]:
                return other
        return best

    def observe(self, width: int, seconds: float, reached: list[float], rejected: list[float]) -> None:
        self.reached = self.DECAY * self.reached + torch.tensor(reached, dtype=torch.float64)
        self.rejected = self.DECAY * self.rejected + torch.tensor(rejected, dtype=torch.float64)
        old = self.times.get(width)
        self.times[width] = seconds if old is None else (1 - self.TIME_WEIGHT) * old + self.TIME_WEIGHT * seconds


class _Loop:
    """State of one ``generate`` call (see the module docstring for the algorithm).

    Image state lives in ``[B, N + slack]`` buffers (the slack columns absorb the padding slots
    of windows near the image end, so every scatter has distinct in-range positions); the
    session holds only the images still decoding (``self.active``, their image indices).
    """

    def __init__(self, model, rule, window, seed, sampling, draft_init, refresh, callback, profile):
        self.model, self.rule, self.window, self.seed, self.sampling = model, rule, window, seed, sampling
        self.draft_init, self.refresh, self.callback, self.profile = draft_init, refresh, callback, profile
        self.device = torch.device(model.device)
        self.max_width = AUTO_MAX_WINDOW if window == "auto" else window
        self.auto = _AutoWindow(min(self.max_width, max(model.num_image_tokens - 1, 1))) if window == "auto" else None
        self.timings = {"forward": 0.0, "verify": 0.0} if profile else {}

    # -- random numbers -------------------------------------------------------------------------

    def _uniforms(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """``[_KINDS, A, width]`` float64 for the active images ``rows`` at their own forward count."""
        return stream_uniforms(self.seed, self.indices[rows], self.steps_per_image[rows], _KINDS, width)

    # -- main loop ------------------------------------------------------------------------------

    def run(self, conditions, batch_size, image_indices, settings) -> GenerationResult:
        model = self.model
        N, dev = model.num_image_tokens, self.device
        _synchronize(dev)
        began = time.perf_counter()
        session = model.start(conditions, batch_size, self.sampling.guided)
        self._opened(session)
        self.B = B = session.batch_size
        self.indices = self._image_indices(image_indices, B)
        slack = self.max_width + 2
        self.tokens = torch.zeros(B, N + slack, dtype=torch.long, device=dev)
        self.decisions = torch.full((B, N + slack), int(Decision.SAMPLED), dtype=torch.int8, device=dev)
        self.entropy = torch.zeros(B, N + slack, device=dev)
        self.entered = torch.zeros(B, N + slack, dtype=torch.long, device=dev)  # forward count when a draft was initialised
        self.steps_per_image = torch.zeros(B, dtype=torch.long, device=dev)
        self.committed = torch.ones(B, dtype=torch.long, device=dev)
        self.commit_log: list[torch.Tensor] = []
        self.widths: list[int] = []
        self.active = torch.arange(B, device=dev)
        self.active_host = torch.arange(B)

        logits = session.prefill()
        q, bad = target_probs(logits.cond, logits.uncond, self.sampling, check=True)
        u = self._uniforms(self.active, 1)
        self.tokens[:, 0] = sample(q[:, 0], u[_Y, :, 0])
        self.entropy[:, 0] = entropy(q[:, 0])
        self.steps_per_image += 1
        self.commit_log.append(torch.ones(B, dtype=torch.long, device=dev))
        self.steps = 1
        committed_host, _ = self._sync(self.committed, bad, None)
        self._notify(session)

        self.prev = None  # (q [A, W, V], widths [A], shift [A]) of the last forward, for carried drafts
        probe = N >= 3 and self.PROBE  # the first iteration checks that the cache rolls back (module docstring)
        checked = False
        mark = time.perf_counter()
        while len(self.active_host):
            c_host = committed_host[self.active_host]
            limit = int((N - c_host).max())
            width = min(self.auto.choose(limit) if self.auto else self.window, limit)
            r_counts = self._iterate(session, width, c_host, probe)
            self.steps += 1
            self.widths.append(width)
            committed_host, counts = self._sync(self.committed, self._bad, r_counts)
            new_c = committed_host[self.active_host]
            self._rollback(session, new_c - 1)
            if not checked and (probe or not self.PROBE):
                self._check_rollback(session, new_c - 1)
            probe, checked = False, True
            if self.auto is not None:
                now = time.perf_counter()
                self.auto.observe(width, now - mark, *counts)
                mark = now
            alive = (new_c < N).nonzero()[:, 0]
            if len(alive) < len(self.active_host):
                self._notify(session)
                if len(alive):
                    session.select_rows(alive)
                    self._select(alive)
                else:
                    self.active_host = self.active_host[:0]
                continue
            self._notify(session)
        _synchronize(dev)
        seconds = time.perf_counter() - began
        settings = {**settings}
        return GenerationResult(self.tokens[:, :N].clone(), self._image_stats(), self.steps, seconds, settings,
                                widths=self.widths, timings=self.timings)

    def _image_indices(self, image_indices, B: int) -> torch.Tensor:
        if image_indices is None:
            return torch.arange(B, device=self.device)
        values = list(image_indices)
        if len(values) != B or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise ValueError(f"image_indices={values!r}: allowed one integer >= 0 per image ({B} images)")
        return torch.tensor(values, dtype=torch.long, device=self.device)

    #: feed one extra probe slot in the first iteration (the tree loop checks its compaction instead)
    PROBE = True

    def _opened(self, session) -> None:
        """Hook: the session was just opened (the tree loop checks that it can evaluate trees)."""

    def _rollback(self, session, lengths: torch.Tensor) -> None:
        """Hook: keep image positions ``0 .. lengths - 1`` of every session row after an iteration."""
        session.rollback(lengths)

    def _sync_extra(self) -> torch.Tensor | None:
        """Hook: more numbers the iteration's one host sync carries (read back as ``self._extra_host``)."""
        return None

    def _check_rollback(self, session, expected: torch.Tensor) -> None:
        lengths = session.cache_lengths
        if not torch.equal(lengths.cpu(), expected):
            raise RuntimeError(f"the model's session did not roll back its cache: holds {lengths.tolist()} positions, "
                               f"expected {expected.tolist()}; its cache cannot be used for speculative decoding")

    def _select(self, alive: torch.Tensor) -> None:
        """Keep the session rows ``alive`` (CPU indices into the active rows)."""
        self.active_host = self.active_host[alive]
        alive_dev = alive.to(self.device)
        self.active = self.active[alive_dev]
        q, widths, shift = self.prev
        self.prev = (q[alive_dev], widths[alive_dev], shift[alive_dev])

    def _sync(self, committed: torch.Tensor, bad: torch.Tensor, counts: torch.Tensor | None):
        """The one host sync per iteration: committed lengths, the non-finite flag, auto's counts."""
        parts = [committed.double(), bad.reshape(1).double()]
        if counts is not None:
            parts.append(counts.reshape(-1).double())
        extra = self._sync_extra()
        if extra is not None:
            parts.append(extra.reshape(-1).double())
        values = torch.cat(parts).cpu()
        if extra is not None:
            self._extra_host = values[len(values) - extra.numel() :].long().reshape(extra.shape)
            values = values[: len(values) - extra.numel()]
        B = committed.shape[0]
        if bool(values[B]):
            raise ValueError("the model returned logits with NaN or +inf (or no allowed token) at some position; "
                             "allowed: finite or -inf logits with at least one finite logit per position "
                             "(check the model weights, inputs and masks)")
        committed_host = values[:B].long()
        rest = values[B + 1 :]
        if counts is None:
            return committed_host, None
        half = len(rest) // 2
        return committed_host, (rest[:half].tolist(), rest[half:].tolist())

    def _notify(self, session) -> None:
        if self.callback is not None:
            N = self.model.num_image_tokens
            self.callback(StepInfo(self.steps, self.committed, self.tokens[:, :N], session, self.active_host.clone(),
                                   self.decisions[:, :N], self.entropy[:, :N]))

    # -- one iteration --------------------------------------------------------------------------

    def _drafts(self, rows, c, W: int, u_init: torch.Tensor):
        """Drafts ``x`` ``[A, W]`` at positions ``c .. c + W - 1`` and their distributions ``p`` ``[A, W, V]``."""
        V, dev = self.model.codebook_size, self.device
        slot = torch.arange(W, device=dev)
        positions = c[:, None] + slot  # [A, W]
        tokens = self.tokens[rows]
        if self.prev is None:
            carried = torch.zeros(len(rows), dtype=torch.long, device=dev)
        else:
            prev_q, prev_widths, shift = self.prev
            carried = (prev_widths - shift).clamp(0, W)  # [A] drafts left by the last forward
        new_tokens, new_probs = init_drafts(self.draft_init, tokens, c + carried, W, V, self.model.grid[1], u_init,
                                            positions=positions)
        is_carried = slot[None] < carried[:, None]  # [A, W]
        x = torch.where(is_carried, tokens.gather(1, positions), new_tokens)
        if self.prev is None:
            p = new_probs
        else:
            source = (shift[:, None] + slot).clamp(max=prev_q.shape[1] - 1)
            old = prev_q.gather(1, source[..., None].expand(-1, -1, V)).to(new_probs.dtype)
            p = torch.where(is_carried[..., None], old, new_probs)
        self.tokens[rows] = tokens.scatter(1, positions, x)
        if self.auto is not None:
            entered = self.entered[rows]
            now = self.steps_per_image[rows][:, None].expand_as(positions)
            self.entered[rows] = entered.scatter(1, positions, torch.where(is_carried, entered.gather(1, positions), now))
        return x, p

    def _iterate(self, session, W: int, c_host: torch.Tensor, probe: bool) -> torch.Tensor | None:
        """One forward for the active images; returns auto's ``[2, AGES]`` acceptance counts by draft age (or None)."""
        N, dev = self.model.num_image_tokens, self.device
        rows = self.active
        c = self.committed[rows]  # [A]
        widths = (N - c).clamp(max=W)  # [A] valid output slots per image
        widths_host = (N - c_host).clamp(max=W)
        u = self._uniforms(rows, W)
        x, p = self._drafts(rows, c, W, u[_INIT])
        if self.auto is not None:
            self._ages_entered = self.entered[rows].gather(1, c[:, None] + torch.arange(W, device=dev))
        # inputs: the last committed token, then the drafts (plus, once, one probe slot to roll back)
        fed_width, fed_widths = W, widths_host
        if probe:
            fed_widths = torch.clamp(N - c_host, max=W + 1)
            widths_host = fed_widths - 1
            widths = (N - c).clamp(max=W + 1) - 1
            fed_width = W + 1
        inputs = self.tokens[rows].gather(1, (c - 1)[:, None] + torch.arange(fed_width, device=dev))
        if self.profile:
            _synchronize(dev)
            t0 = time.perf_counter()
        logits = session.forward(inputs, c_host - 1, fed_widths)
        cond = logits.cond[:, :W]
        uncond = None if logits.uncond is None else logits.uncond[:, :W]
        slot = torch.arange(W, device=dev)
        valid = slot[None] < widths[:, None]
        q, self._bad = target_probs(cond, uncond, self.sampling, valid=valid, check=True)
        if self.profile:
            _synchronize(dev)
            t1 = time.perf_counter()
        verdict = verify(self.rule, self.refresh, x, p, q, widths, u)
        if self.profile:
            _synchronize(dev)
            self.timings["forward"] += t1 - t0
            self.timings["verify"] += time.perf_counter() - t1
        r = verdict.accepted
        self._commit(rows, c, verdict, q, widths)
        self.prev = (q, widths, r + 1)
        return self._auto_counts(rows, r, widths)

    def _auto_counts(self, rows: torch.Tensor, r: torch.Tensor, widths: torch.Tensor) -> torch.Tensor | None:
        """``[2, AGES]`` acceptance counts by draft age for ``window="auto"`` (None for a fixed window);
        called after the commit step, with ``self._ages_entered`` read before it."""
        dev = self.device
        if self.auto is None:
            return None
        slot = torch.arange(self._ages_entered.shape[1], device=dev)
        # acceptance counts by draft age, for the width chooser (ages read before the commit step)
        age = (self.steps_per_image[rows][:, None] - 1 - self._ages_entered).clamp(0, _AutoWindow.AGES - 1)
        is_draft = slot[None] < (widths - 1)[:, None]
        reached = is_draft & (slot[None] <= r[:, None])
        rejected = is_draft & (slot[None] == r[:, None])
        counts = torch.zeros(2, _AutoWindow.AGES, dtype=torch.long, device=dev)
        counts[0].scatter_add_(0, age.reshape(-1), reached.reshape(-1).long())
        counts[1].scatter_add_(0, age.reshape(-1), rejected.reshape(-1).long())
        return counts

    def _commit(self, rows, c, verdict: Verdict, q, widths) -> None:
        W = verdict.tokens.shape[1]
        slot = torch.arange(W, device=self.device)
        positions = c[:, None] + slot  # [A, W]; slots >= widths land in the slack columns or beyond the commit
        r_col = verdict.accepted[:, None]
        decided = slot[None] <= r_col
        self.tokens[rows] = self.tokens[rows].scatter(1, positions, verdict.tokens)
        old_codes = self.decisions[rows].gather(1, positions)
        self.decisions[rows] = self.decisions[rows].scatter(1, positions, torch.where(decided, verdict.decisions, old_codes))
        old_h = self.entropy[rows].gather(1, positions)
        self.entropy[rows] = self.entropy[rows].scatter(1, positions, torch.where(decided, entropy(q).to(old_h.dtype), old_h))
        new_c = c + verdict.accepted + 1
        self.committed[rows] = new_c
        self.steps_per_image[rows] += 1
        log = torch.full((self.B,), -1, dtype=torch.long, device=self.device)
        log[rows] = verdict.accepted + 1
        self.commit_log.append(log)

    def _image_stats(self) -> list[ImageStats]:
        log = torch.stack(self.commit_log, dim=1).cpu()  # [B, steps]; -1 where an image had finished
        N = self.model.num_image_tokens
        steps = self.steps_per_image.cpu()
        decisions, entropies = self.decisions[:, :N].cpu(), self.entropy[:, :N].cpu()
        stats = []
        for b in range(self.B):
            row = log[b]
            stats.append(ImageStats(steps=int(steps[b]), num_tokens=N, committed_per_step=row[row >= 0].tolist(),
                                    decisions=decisions[b], entropy=entropies[b]))
        return stats


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

    def __init__(self, *args, tree: tuple[int, int]):
        super().__init__(*args)
        self.K, self.D = tree
        self._pending = None

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
        D, S = layout.D, layout.S
        u = stream_uniforms(self.seed, self.indices[rows], self.steps_per_image[rows], _KINDS + TREE_KINDS,
                            max(W, S, D * (K - 1), 1))
        chain_u, tree_u = u[:_KINDS], u[_KINDS:]
        x, p = self._drafts(rows, c, W, chain_u[_INIT][:, :W])
        if self.auto is not None:
            self._ages_entered = self.entered[rows].gather(1, c[:, None] + torch.arange(W, device=dev))
        cand, alive = draw_siblings(x[:, :D], p[:, :D], K, tree_u[-1][:, : D * (K - 1)].reshape(A, D, K - 1))
        depth, branch = layout.depth.to(dev), layout.branch.to(dev)
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
        q, self._bad = target_probs(logits.cond, logits.uncond, self.sampling, valid=valid, check=True)
        if self.profile:
            _synchronize(dev)
            t1 = time.perf_counter()
        verdict = verify_tree(self.rule, self.refresh, layout, cand, alive, x, p, q, widths, tree_u, chain_u,
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
        self.prev = (verdict.main_target, widths, r + 1)
        self._pending = verdict.path[:, 1 : D + 1]
        return self._auto_counts(rows, r, widths)

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
