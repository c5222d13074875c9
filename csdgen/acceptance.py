"""Acceptance rules: the probability of keeping each draft token of a window, and the residual.

Notation (the CSD paper's, "CSD: Content-aware Speculative Decoding for Efficient Image Generation",
ICML 2026; the SJD paper, Teng et al. 2024, arXiv 2410.01699, swaps the letters):

* ``q`` = ``target_probs`` — the target model's distribution at a window position, after
  guidance and warping;
* ``p`` = ``draft_probs`` — the distribution the draft token ``x`` at that position was
  sampled from;
* ``x`` = ``draft_tokens``; ``y`` = ``target_sample``, one sample from ``q`` per position
  drawn by the decoding loop (only the exact-match Jacobi rule looks at it).

A rule is a pure function of these tensors: it returns acceptance probabilities ``b`` for
every position of every window at once (``[B, W]``) and the residual distribution to
resample from after a rejection (``[B, W, V]``). Uniform draws and the left-to-right walk
belong to :func:`first_rejection` and the decoding loop; no rule holds a model, a cache or
a random generator.

Lossless rule: :class:`SJD`. Every lossy rule starts from the same exact ratio
(:func:`lossless_acceptance`) and changes it, so the exact path is written once.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from .sampling import ENTROPY_EPS, as_integer, entropy, is_number as _number, total_variation

__all__ = [
    "AcceptanceRule",
    "SJD",
    "CSD",
    "Addition",
    "JacobiMatch",
    "GSD",
    "Lantern",
    "lossless_acceptance",
    "residual_distribution",
    "first_rejection",
    "check_window",
    "make_rule",
    "RULES",
]


def _shape(t) -> str:
    return f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}" if isinstance(t, torch.Tensor) else type(t).__name__


def check_window(draft_tokens, draft_probs, target_probs, target_sample=None) -> None:
    """The tensors of one window checked by shape and dtype only (no host sync): ``draft_tokens`` ``[B, W]``
    integer ids, ``draft_probs`` and ``target_probs`` ``[B, W, V]`` floating, and ``target_sample`` ``[B, W]``
    integer where given. A batch or window of other sizes broadcast, or gathered row 0 only, without a word.

    Raises:
        ValueError: naming each tensor's shape and dtype and what is allowed.
    """
    ids = (torch.int64, torch.int32)
    ok = (isinstance(draft_tokens, torch.Tensor) and draft_tokens.dim() == 2 and draft_tokens.dtype in ids
          and all(isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() == 3
                  and tuple(t.shape[:2]) == tuple(draft_tokens.shape) for t in (draft_probs, target_probs))
          and draft_probs.shape[-1] == target_probs.shape[-1]
          and (target_sample is None or (isinstance(target_sample, torch.Tensor) and target_sample.dtype in ids
                                         and tuple(target_sample.shape) == tuple(draft_tokens.shape))))
    if not ok:
        sample = "" if target_sample is None else f", target_sample {_shape(target_sample)}"
        raise ValueError(f"draft_tokens {_shape(draft_tokens)}, draft_probs {_shape(draft_probs)}, target_probs "
                         f"{_shape(target_probs)}{sample}: allowed draft_tokens [B, W] int64 ids, draft_probs and "
                         "target_probs [B, W, V] floating of one shape" + ("" if target_sample is None else
                                                                           ", target_sample [B, W] int64 ids"))


def lossless_acceptance(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """Exact speculative-sampling acceptance ``b = min(1, q(x) / p(x))``.

    Leviathan et al. (2023), Algorithm 1; used per window position by SJD (Teng et al., 2024,
    eq. 3) and as the base of every relaxed rule here. A zero draft probability ``p(x) = 0``
    (which a correctly sampled draft never has) gives ``b = 0``: reject.

    Args:
        draft_tokens: ``[B, W]`` int64 draft ids ``x``.
        draft_probs: ``[B, W, V]`` float, ``p`` the draft was sampled from.
        target_probs: ``[B, W, V]`` float, target ``q``.

    Returns:
        ``[B, W]`` float32 in [0, 1] (for probabilities in [0, 1]; values are not checked, which would
        take a host sync).

    Raises:
        ValueError: tensors of other shapes or dtypes (:func:`check_window`).
    """
    check_window(draft_tokens, draft_probs, target_probs)
    index = draft_tokens.unsqueeze(-1)
    q_x = target_probs.gather(-1, index).squeeze(-1).float()
    p_x = draft_probs.gather(-1, index).squeeze(-1).float()
    ratio = torch.where(p_x > 0, q_x / p_x.clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(q_x))
    return ratio.clamp(max=1.0)


def residual_distribution(draft_probs: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """The residual ``norm(max(0, q - p))`` to resample from after a rejection.

    Leviathan et al. (2023), Algorithm 1; the CSD paper (ICML 2026; its theorem on the optimal
    resampling distribution) shows the same distribution minimises the total variation to ``q`` under its relaxed
    acceptance. A rejection implies ``q(x) < p(x)``, so the residual mass equals
    ``TV(p, q) > 0``; where it is zero in floating point the residual falls back to ``q``.

    Args:
        draft_probs: ``[B, W, V]`` float ``p``.
        target_probs: ``[B, W, V]`` float ``q``.

    Returns:
        ``[B, W, V]`` float32: probabilities for probabilities ``p`` and ``q`` (rows that sum to 1); a ``q``
        of zero mass stays zero. Never NaN for finite inputs.

    Raises:
        ValueError: ``p`` and ``q`` of other shapes (a broadcast was silently another distribution).
    """
    if not (isinstance(draft_probs, torch.Tensor) and isinstance(target_probs, torch.Tensor)
            and draft_probs.shape == target_probs.shape and draft_probs.dim() >= 1):
        raise ValueError(f"draft_probs {_shape(draft_probs)}, target_probs {_shape(target_probs)}: allowed two "
                         "tensors of one shape [..., V]")
    diff = (target_probs.float() - draft_probs.float()).clamp_min(0.0)
    mass = diff.sum(-1, keepdim=True)
    degenerate = mass <= 1e-12
    return torch.where(degenerate, target_probs.float(), diff / torch.where(degenerate, torch.ones_like(mass), mass))


def first_rejection(accepted: torch.Tensor) -> torch.Tensor:
    """Number of leading accepted positions of each window, with no loop over positions.

    Args:
        accepted: ``[B, W]`` bool, True where the draft at that position passes its test.

    Returns:
        ``[B]`` int64 in [0, W]: the index of the first rejection, or W if none.

    Raises:
        ValueError: ``accepted`` not a bool tensor (integers counted past W, probabilities truncated to 0).
    """
    if not isinstance(accepted, torch.Tensor) or accepted.dtype != torch.bool:
        raise ValueError(f"accepted {_shape(accepted)}: allowed a bool tensor [B, W] (True where the draft passes; "
                         "compare uniforms with acceptance probabilities first)")
    return accepted.long().cumprod(-1).sum(-1)


#: ids of rules of the caller's own whose probabilities were checked once (:func:`checked_probability`)
_CHECKED_RULES: set[int] = set()


def checked_probability(rule: "AcceptanceRule", b, shape: tuple[int, ...]) -> torch.Tensor:
    """``b``, what ``rule.acceptance_probability`` returned, checked: a floating tensor of ``shape``
    (no host sync); for a rule of the caller's own (not defined in this module), its values in
    [0, 1] on its first window as well (one host sync, once per rule: a NaN or 2.0 ran as "never" or
    "always" without a word).

    Raises:
        ValueError: naming the rule, what it returned and what is allowed.
    """
    allowed = f"allowed: a float tensor of shape [B, W] = {list(shape)} with values in [0, 1]"
    if not isinstance(b, torch.Tensor) or tuple(b.shape) != tuple(shape) or not b.is_floating_point():
        got = (f"a {b.dtype} tensor of shape {list(b.shape)}" if isinstance(b, torch.Tensor)
               else f"{type(b).__name__}")
        raise ValueError(f"{type(rule).__name__}.acceptance_probability returned {got}; {allowed}")
    if type(rule).__module__ != __name__ and id(rule) not in _CHECKED_RULES:
        bad = ~((b >= 0) & (b <= 1))  # NaN is neither
        if bool(bad.any()):
            raise ValueError(f"{type(rule).__name__}.acceptance_probability returned {float(b[bad][0])}; {allowed}")
        _CHECKED_RULES.add(id(rule))
    return b


class AcceptanceRule(ABC):
    """A rule deciding how likely each draft token of a window is to be kept.

    Subclasses set ``name`` (the CLI/method name) and ``lossless`` (True only when the output
    distribution provably equals the target distribution), and implement
    :meth:`acceptance_probability`. The residual defaults to :func:`residual_distribution`.

    Class attributes:
        draft_init: the draft initialisation the rule needs (a name of
            :data:`csdgen.drafting.DRAFT_INITS`), or None when any works. ``generate`` uses it
            when the caller gives none and refuses an incompatible one.
        needs_codebook: the constructor takes the model's codebook embeddings; such a rule's
            ``codebook_size`` is then the V of the codebook it was made with (``generate`` refuses
            it for a model of another V).
        takes_target_entropy: :meth:`acceptance_probability` takes the keyword ``target_entropy``
            (``[B, W]`` float32, ``entropy(q, eps=ENTROPY_EPS)`` in nats), which the decoding loop
            computes once per iteration for its statistics, instead of computing it again.
    """

    name: ClassVar[str]
    lossless: ClassVar[bool] = False
    needs_codebook: ClassVar[bool] = False
    codebook_size: int | None = None
    draft_init: ClassVar[str | None] = None
    takes_target_entropy: ClassVar[bool] = False

    @abstractmethod
    def acceptance_probability(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        target_sample: torch.Tensor,
    ) -> torch.Tensor:
        """Acceptance probabilities ``b`` for a whole window.

        Args:
            draft_tokens: ``[B, W]`` int64 draft ids ``x``.
            draft_probs: ``[B, W, V]`` float, ``p``.
            target_probs: ``[B, W, V]`` float, ``q``.
            target_sample: ``[B, W]`` int64, one sample ``y ~ q`` per position.

        Returns:
            ``[B, W]`` float32 in [0, 1].

        Raises:
            ValueError: the package's rules refuse tensors of other shapes or dtypes (:func:`check_window`);
                the decoding loop checks what any rule returns (:func:`checked_probability`).
        """

    def exact_probability(
        self,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor,
        target_probs: torch.Tensor,
        target_sample: torch.Tensor,
        acceptance: torch.Tensor,
    ) -> torch.Tensor:
        """The part of the acceptance that is exact: ``[B, W]`` float32 in [0, 1].

        With the same uniform ``u``, an accepted draft is an *exact* acceptance when
        ``u < exact_probability`` and a *relaxed* one otherwise; the decoding loop labels its
        decisions with this. A lossless rule is exact throughout (its own ``acceptance``, which
        the caller passes in so nothing is computed twice); the default for a relaxed rule is
        the lossless ratio ``min(1, q(x) / p(x))`` it relaxes.

        Args:
            draft_tokens, draft_probs, target_probs, target_sample: as for
                :meth:`acceptance_probability`.
            acceptance: ``[B, W]``, this rule's :meth:`acceptance_probability` on the same window.
        """
        if self.lossless:
            return acceptance
        return lossless_acceptance(draft_tokens, draft_probs, target_probs)

    def residual(self, draft_probs: torch.Tensor, target_probs: torch.Tensor, target_sample: torch.Tensor) -> torch.Tensor:
        """Distribution ``[B, W, V]`` float32 to sample a rejected position from (default ``norm(max(0, q - p))``,
        :func:`residual_distribution`).

        Args:
            draft_probs: ``[B, W, V]`` float ``p``; target_probs: ``[B, W, V]`` float ``q``;
            target_sample: ``[B, W]`` int64 ``y ~ q`` (only :class:`JacobiMatch` uses it).
        """
        return residual_distribution(draft_probs, target_probs)

    def options(self) -> dict:
        """The rule's parameters, for records and tables."""
        return {}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts})"


class SJD(AcceptanceRule):
    """Lossless speculative Jacobi decoding: ``b = min(1, q(x) / p(x))`` (Teng et al., 2024)."""

    name = "sjd"
    lossless = True

    def acceptance_probability(self, draft_tokens, draft_probs, target_probs, target_sample):
        return lossless_acceptance(draft_tokens, draft_probs, target_probs)


class CSD(AcceptanceRule):
    """Content-aware speculative decoding ("CSD: Content-aware Speculative Decoding for Efficient Image
    Generation", ICML 2026: the relaxed acceptance ``b_k`` of its entropy-based probability relaxation, gated by its
    distribution alignment filter).

    ``b = min(1, min(1, q(x)/p(x)) + lam * H(q))`` where ``TV(p, q) < delta``, else the exact
    ``min(1, q(x)/p(x))``. Lossy: the relaxation trades exactness for acceptance.

    As in the public CSD code, ``p`` and ``q`` are clamped to at least ``eps`` (1e-10) before
    the entropy and the TV distance, and the entropy is per window position in nats. The ratio
    term is the exact SJD ratio (the reference also clamps it, which changes it only where
    ``q(x) < 1e-10``); this keeps ``lam = 0`` or ``delta = 0`` identical to :class:`SJD`.

    Args:
        lam: relaxation coefficient ``lambda`` >= 0 (default 0.5, the reference's). With
            nats, ``lam * H >= 1`` once ``H >= 1 / lam`` (2 nats at the default): such
            positions are accepted for sure whenever the filter passes.
        delta: TV threshold in [0, 1] (default 0.65). 0 switches the relaxation off.
        entropy_unit: ``"nats"`` (reference) or ``"normalized"`` (H / ln V in [0, 1];
            csdgen's variant, not in the paper).
        eps: clamping floor for entropy and TV (default :data:`~csdgen.sampling.ENTROPY_EPS`, 1e-10,
            the reference's), in [0, 1). Recorded in the rule's repr when it is not the default.

    Raises:
        ValueError: ``lam`` not a finite number >= 0, ``delta`` not a number in [0, 1], an unknown
            ``entropy_unit`` or ``eps`` not a number in [0, 1) (bools and strings are not numbers), naming the
            argument; at a call, windows of other shapes (:func:`check_window`) or a ``target_entropy`` not
            ``[B, W]``.
    """

    name = "csd"
    takes_target_entropy = True

    def __init__(self, lam: float = 0.5, delta: float = 0.65, entropy_unit: str = "nats", eps: float = ENTROPY_EPS):
        if not _number(lam) or not math.isfinite(lam) or lam < 0:
            raise ValueError(f"lam={lam!r}: the CSD relaxation coefficient lambda must be a finite number >= 0")
        if not _number(delta) or not (0.0 <= delta <= 1.0):
            raise ValueError(f"delta={delta!r}: the CSD TV threshold must be a number in [0, 1]")
        if entropy_unit not in ("nats", "normalized"):
            raise ValueError(f"entropy_unit={entropy_unit!r}: allowed 'nats' (reference) or 'normalized' (H / ln V)")
        if not _number(eps) or not (0 <= eps < 1):
            raise ValueError(f"eps={eps!r}: the clamping floor must be a number in [0, 1) (default {ENTROPY_EPS})")
        self.lam, self.delta, self.entropy_unit, self.eps = float(lam), float(delta), entropy_unit, float(eps)

    def acceptance_probability(self, draft_tokens, draft_probs, target_probs, target_sample, *,
                               target_entropy: torch.Tensor | None = None):
        """:meth:`AcceptanceRule.acceptance_probability`; ``target_entropy``: ``[B, W]`` float32, the
        entropy of ``q`` in nats with ``q`` clamped at :data:`~csdgen.sampling.ENTROPY_EPS`
        (``entropy(q, eps=ENTROPY_EPS)``) where the caller has it, used when this rule's ``eps`` is
        that floor (the decoding loop passes the one it keeps for its statistics)."""
        # q = target_probs (model), p = draft_probs (previous Jacobi iterate or initialisation)
        exact = lossless_acceptance(draft_tokens, draft_probs, target_probs)
        if target_entropy is not None and (not isinstance(target_entropy, torch.Tensor)
                                           or tuple(target_entropy.shape) != tuple(exact.shape)):
            raise ValueError(f"target_entropy {_shape(target_entropy)}: allowed a [B, W] = {list(exact.shape)} tensor "
                             "of the target's entropy in nats")
        if target_entropy is not None and self.eps == ENTROPY_EPS:
            h = target_entropy.float()
            h = h / math.log(target_probs.shape[-1]) if self.entropy_unit == "normalized" else h
        else:
            h = entropy(target_probs, normalized=self.entropy_unit == "normalized", eps=self.eps)
        aligned = total_variation(draft_probs, target_probs, eps=self.eps) < self.delta
        relaxed = (exact + self.lam * h).clamp(max=1.0)
        return torch.where(aligned, relaxed, exact)

    def options(self):
        # eps only where it is not the default: the records of every rule made with it stay as they were
        default = {} if self.eps == ENTROPY_EPS else {"eps": self.eps}
        return {"lam": self.lam, "delta": self.delta, "entropy_unit": self.entropy_unit, **default}


class Addition(AcceptanceRule):
    """Constant relaxation ``b = min(1, q(x)/p(x) + c)`` without entropy or filter.

    The "Addition" ablation of the CSD paper's tables; its code is not public, so this is the
    natural reading of the name. Lossy for ``c > 0``.

    Args:
        c: the constant added to the exact ratio, a finite number >= 0 (default 0.2, csdgen's choice).

    Raises:
        ValueError: ``c`` not a finite number >= 0 (bools and strings are not numbers).
    """

    name = "addition"

    def __init__(self, c: float = 0.2):
        if not _number(c) or not math.isfinite(c) or c < 0:
            raise ValueError(f"c={c!r}: the Addition constant must be a finite number >= 0")
        self.c = float(c)

    def acceptance_probability(self, draft_tokens, draft_probs, target_probs, target_sample):
        return (lossless_acceptance(draft_tokens, draft_probs, target_probs) + self.c).clamp(max=1.0)

    def options(self):
        return {"c": self.c}


class JacobiMatch(AcceptanceRule):
    """Exact-match Jacobi decoding: keep ``x`` iff it equals this forward's sample ``y ~ q``.

    On a rejection the committed token is ``y`` itself, so every committed token is a sample
    from ``q``: lossless, but it accepts far less often than :class:`SJD` when sampling
    (with greedy decoding it is classic Jacobi decoding, Song et al., 2021).
    """

    name = "jacobi"
    lossless = True

    def acceptance_probability(self, draft_tokens, draft_probs, target_probs, target_sample):
        check_window(draft_tokens, draft_probs, target_probs, target_sample)
        return (draft_tokens == target_sample).float()

    def residual(self, draft_probs, target_probs, target_sample):
        if not (isinstance(target_sample, torch.Tensor) and target_sample.dtype in (torch.int64, torch.int32)
                and tuple(target_sample.shape) == tuple(target_probs.shape[:-1])):
            raise ValueError(f"target_sample {_shape(target_sample)}: allowed int64 ids of target_probs' shape "
                             f"without V, {list(target_probs.shape[:-1])}")
        return torch.nn.functional.one_hot(target_sample.long(), target_probs.shape[-1]).float()


def _check_codebook_size(rule: "AcceptanceRule", target_probs: torch.Tensor) -> None:
    """A rule made with a codebook of V entries meets targets over V tokens (no host sync): another V
    indexed past the codebook, or ran on the wrong neighbours, without a word."""
    if target_probs.shape[-1] != rule.codebook_size:
        raise ValueError(f"{type(rule).__name__} was made with a codebook of {rule.codebook_size} entries; the target "
                         f"distribution has V={target_probs.shape[-1]}: make the rule with this model's "
                         "codebook_embeddings()")


def _codebook(codebook: torch.Tensor | None, rule: str) -> torch.Tensor:
    if codebook is None or not isinstance(codebook, torch.Tensor) or codebook.dim() != 2:
        got = ("none" if codebook is None else f"shape {tuple(codebook.shape)}" if isinstance(codebook, torch.Tensor)
               else type(codebook).__name__)
        raise ValueError(f"the {rule} rule needs codebook embeddings [V, D] (a model's codebook_embeddings(), "
                         f"e.g. make_rule({rule!r}, codebook=model.codebook_embeddings())); got {got}")
    return codebook.detach().float()


class GSD(AcceptanceRule):
    """Grouped speculative decoding (So et al., ICCV 2025): accept against a cluster of the draft.

    ``b = min(1, sum_C q / sum_C p)`` where the cluster ``C`` of draft ``x`` holds the tokens
    within ``radius`` ranks of ``x`` in the target's probability-sorted order that also have
    ``|q(x') - q(x)| < prob_gap`` and squared codebook distance to ``x`` below ``max_distance``
    (the official code's values: 7, 0.15, 0.5). ``x`` is always in ``C``; an empty draft mass
    ``sum_C p = 0`` rejects. The cluster can lower one token's ratio below SJD's; on average it
    accepts more. Lossy for ``radius > 0``. One batched sort per window replaces the official
    per-position loop, and codebook distances are computed for the ``2 radius + 1`` candidates
    only (no ``V x V`` matrix). Needs one-hot drafts (``draft_init = "onehot"``).

    Args:
        codebook: ``[V, D]`` codebook vectors (``model.codebook_embeddings()``).
        radius: rank radius (the "group size" parameter), >= 0; one above ``V - 1`` acts as ``V - 1``
            (which spans every rank), at the cost of ``V - 1``.
        prob_gap: maximal ``|q(x') - q(x)|``, > 0.
        max_distance: maximal squared codebook distance, > 0.

    Raises:
        ValueError: missing codebook or a parameter out of range; at a call, a window of other shapes
            (:func:`check_window`) or a target over another V than the codebook's.
    """

    name = "gsd"
    needs_codebook = True
    draft_init = "onehot"  # the official code's drafts; with uniform p the cluster ratio is V * sum_C q / |C|

    def __init__(self, codebook: torch.Tensor | None = None, radius: int = 7, prob_gap: float = 0.15, max_distance: float = 0.5):
        if as_integer(radius) is None or radius < 0:
            raise ValueError(f"radius={radius!r}: the GSD rank radius must be an integer >= 0")
        radius = as_integer(radius)  # numpy's integers too
        for name, value in (("prob_gap", prob_gap), ("max_distance", max_distance)):
            if not _number(value) or not value > 0:
                raise ValueError(f"{name}={value!r}: the GSD {name.replace('_', ' ')} must be a number > 0")
        self.codebook = _codebook(codebook, "gsd")
        self.codebook_size = self.codebook.shape[0]
        self.radius, self.prob_gap, self.max_distance = radius, float(prob_gap), float(max_distance)

    def acceptance_probability(self, draft_tokens, draft_probs, target_probs, target_sample):
        check_window(draft_tokens, draft_probs, target_probs)
        _check_codebook_size(self, target_probs)
        # q = target_probs, p = draft_probs
        q, p, x = target_probs.float(), draft_probs.float(), draft_tokens
        V = q.shape[-1]
        order = q.argsort(dim=-1, descending=True, stable=True)  # [B, W, V] token at each rank
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(V, device=q.device).expand_as(order))
        radius = min(self.radius, V - 1)  # V - 1 spans every rank: a wider radius adds only empty slots
        offsets = torch.arange(-radius, radius + 1, device=q.device)
        at = rank.gather(-1, x[..., None]) + offsets  # [B, W, 2r+1] ranks around x (r = radius)
        inside = (at >= 0) & (at < V)
        candidates = order.gather(-1, at.clamp(0, V - 1))  # [B, W, 2r+1]
        q_c, p_c = q.gather(-1, candidates), p.gather(-1, candidates)
        q_x = q.gather(-1, x[..., None])
        emb = self.codebook.to(q.device)
        distance = (emb[candidates] - emb[x][..., None, :]).pow(2).sum(-1)
        member = inside & ((q_c - q_x).abs() < self.prob_gap) & (distance < self.max_distance)
        q_sum, p_sum = (q_c * member).sum(-1), (p_c * member).sum(-1)
        return torch.where(p_sum > 0, q_sum / p_sum.clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(q_sum)).clamp(max=1.0)

    def options(self):
        return {"radius": self.radius, "prob_gap": self.prob_gap, "max_distance": self.max_distance}


class Lantern(AcceptanceRule):
    """LANTERN's latent-proximity relaxation (Jang et al., ICLR 2025), inside SJD (training-free).

    ``b = min(1, q~(x) / p(x))`` with ``q~(x) = q(x) + `` the target mass of ``x``'s nearest
    codebook neighbours, added nearest first while the added mass stays ``<= delta``.
    LANTERN++ (``cap``) bounds ``q~(x) <= cap * q(x)``. The residual stays
    ``norm(max(0, q - p))``. Lossy for ``delta > 0``. Neighbour tables: :mod:`csdgen.codebook`.
    Needs one-hot drafts (``draft_init = "onehot"``).

    Args:
        codebook: ``[V, D]`` codebook vectors (``model.codebook_embeddings()``).
        k: neighbours per token, an integer >= 1 (default 1000; above V - 1: V - 1).
        delta: added-mass budget, a number in [0, 1] (the paper uses 0.1-0.2).
        cap: LANTERN++ cap ``lambda >= 1`` on ``q~ / q``, a number; None for plain LANTERN.

    Raises:
        ValueError: missing codebook, a codebook of fewer than 2 entries, or a parameter out of range or not a
            number (naming it); at a call, a window of other shapes (:func:`check_window`) or a target over
            another V than the codebook's.
    """

    name = "lantern"
    needs_codebook = True
    draft_init = "onehot"  # LANTERN's drafts have one-hot p (a drafter's sample); uniform p accepts nearly everything

    def __init__(self, codebook: torch.Tensor | None = None, k: int = 1000, delta: float = 0.1, cap: float | None = None):
        from .codebook import neighbour_table

        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"k={k!r}: LANTERN's neighbours per token must be an integer >= 1 (above V - 1: V - 1)")
        if not _number(delta) or not 0.0 <= delta <= 1.0:
            raise ValueError(f"delta={delta!r}: the LANTERN mass budget must be a number in [0, 1]")
        if cap is not None and (not _number(cap) or not cap >= 1.0):
            raise ValueError(f"cap={cap!r}: the LANTERN++ cap must be a number >= 1 (or None)")
        codebook = _codebook(codebook, "lantern")
        if codebook.shape[0] < 2:
            raise ValueError(f"a codebook of {codebook.shape[0]} entries: LANTERN adds the mass of a token's "
                             "neighbours, so it needs a codebook of at least 2 entries")
        self.codebook_size = codebook.shape[0]
        # numpy's numbers as Python's (a record's repr said cap=np.float32(2.0)); an int stays an int: records
        # keep the rule's repr, and a folder made with cap=2 resumes
        cap = None if cap is None else int(cap) if isinstance(cap, numbers.Integral) else float(cap)
        self.k, self.delta, self.cap = min(int(k), codebook.shape[0] - 1), float(delta), cap
        self.table = neighbour_table(codebook, self.k)

    def acceptance_probability(self, draft_tokens, draft_probs, target_probs, target_sample):
        check_window(draft_tokens, draft_probs, target_probs)
        _check_codebook_size(self, target_probs)
        # q = target_probs, p = draft_probs
        q, x = target_probs.float(), draft_tokens
        q_x = q.gather(-1, x[..., None]).squeeze(-1)
        p_x = draft_probs.float().gather(-1, x[..., None]).squeeze(-1)
        q_near = q.gather(-1, self.table.neighbours(x))  # [B, W, k] nearest first
        added = torch.where(q_near.cumsum(-1) <= self.delta, q_near, torch.zeros_like(q_near)).sum(-1)
        q_tilde = q_x + added
        if self.cap is not None:
            q_tilde = torch.minimum(q_tilde, self.cap * q_x)
        ratio = q_tilde / p_x.clamp_min(torch.finfo(torch.float32).tiny)
        return torch.where(p_x > 0, ratio, torch.zeros_like(ratio)).clamp(max=1.0)

    def options(self):
        return {"k": self.k, "delta": self.delta, "cap": self.cap}


RULES: dict[str, type[AcceptanceRule]] = {rule.name: rule for rule in (SJD, CSD, Addition, JacobiMatch, GSD, Lantern)}


def make_rule(method: str | AcceptanceRule, codebook: torch.Tensor | None = None, **options) -> AcceptanceRule:
    """Build a rule from its name (any case, as ``generate``'s ``method``) and options
    (``make_rule("csd", lam=0.3)``), or pass one through.

    Args:
        method: a name of :data:`RULES` or an :class:`AcceptanceRule` instance (returned as it is).
        codebook: ``[V, D]`` codebook vectors, given to the rules that need one (GSD, LANTERN) and ignored by
            the others.
        options: the rule's constructor arguments (none with a ready rule).

    Returns:
        the :class:`AcceptanceRule`.

    Raises:
        ValueError: unknown name or not a name (listing the known ones) or an option the rule does not take.
    """
    if isinstance(method, AcceptanceRule):
        if options:
            raise ValueError(f"options {sorted(options)} given with a ready rule {method!r}; set them on the rule")
        return method
    if isinstance(method, str) and method.lower() in RULES:
        method = method.lower()  # "CSD" as the paper spells it, as generate(method="CSD") takes it
    if not isinstance(method, str) or method not in RULES:  # a list was an unhashable-type TypeError
        raise ValueError(f"unknown acceptance rule {method!r}; allowed: {', '.join(sorted(RULES))}")
    if getattr(RULES[method], "needs_codebook", False):
        options["codebook"] = codebook
    try:
        return RULES[method](**options)
    except TypeError as exc:
        raise ValueError(f"bad options {options} for rule {method!r}: {exc}") from None
