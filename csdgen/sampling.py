"""Target distributions from logits, and the measures the acceptance rules use.

Letters used for tensor shapes throughout csdgen:

* ``B`` batch (images), ``W`` window (slots of one Jacobi forward), ``V`` image vocabulary
  (codebook size), ``N`` image tokens per image, ``T`` sequence length, ``D`` width.

Everything here works on the last dimension of ``[..., V]`` tensors, so the same warpers
apply to one position (``[B, V]``) or to a whole window (``[B, W, V]``).

Order of operations (as in transformers' logits processors and the SJD/CSD reference code):
classifier-free guidance -> temperature -> top-k -> top-n-sigma -> top-p -> softmax in float32.
Temperature 0 means greedy decoding: the target distribution is one-hot on the argmax.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from .guidance import GuidanceSchedule
from .integers import as_integer  # noqa: F401 (the engine and rules import it from here)

__all__ = [
    "SamplingConfig",
    "UnguidedSamplingWarning",
    "is_number",
    "as_integer",
    "apply_guidance",
    "apply_temperature",
    "apply_top_k",
    "apply_top_p",
    "apply_top_n_sigma",
    "target_probs",
    "has_nan",
    "invalid_logits",
    "MAX_SEED",
    "check_seed",
    "stream_uniforms",
    "sample",
    "BLOCKED_SAMPLING_MIN_V",
    "SAMPLE_BLOCK",
    "entropy",
    "ENTROPY_EPS",
    "total_variation",
]


def is_number(value) -> bool:
    """True for a real number (int, float, numpy's): not a bool and not a string. Sampling settings
    and rule parameters are checked with it before any comparison, so a wrong type gets the
    one-line error naming its argument, not a bare TypeError naming none."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class UnguidedSamplingWarning(UserWarning):
    """:func:`csdgen.generate` was given a :class:`SamplingConfig` with ``guidance_scale`` 1.0 (no
    guidance, the field's default) for a model whose default guidance is above 1. Give the changes
    as a dict (``sampling={"temperature": 0.5}``: the model's defaults for the rest) to keep the
    model's guidance. The CLI, whose options are explicit, does not show it."""


@dataclass(frozen=True)
class SamplingConfig:
    """How logits become the target distribution ``q``.

    Given to :func:`csdgen.generate` whole, it means exactly these settings: a field left out takes
    the default below, not the model's (``guidance_scale`` 1.0 runs unguided); a dict of changes
    (``sampling={"temperature": 0.5}``) keeps the model's defaults for the rest.

    Attributes:
        guidance_scale: classifier-free guidance scale ``s`` in ``l_u + s (l_c - l_u)``;
            1.0 disables guidance (no unconditional rows are run). Must be >= 0.
        temperature: softmax temperature; 0 selects greedy decoding (one-hot on argmax).
        top_k: keep the ``top_k`` largest logits per position (None or 0 = all, as in transformers'
            ``generate``; 0 is stored as None). 1 <= top_k <= V otherwise.
        top_p: keep the smallest set of tokens whose probability reaches ``top_p``
            (None = all). 0 < top_p <= 1.
        top_n_sigma: keep the tokens whose logit is at least ``max - n sigma`` (sigma: the
            standard deviation of the finite logits; Tang et al., 2024, "Top-nσ: Not All Logits
            Are You Need", eq. 4), applied after top-k (None = off). n > 0. Lumina-mGPT 2.0's
            own SJD script samples with n = 1 (``TopnsigmaLogitsWarper3d``); its AR path does not.
        top_n_sigma_centered: True (the paper's sigma, the standard deviation); False: the root
            mean square of the finite logits instead, what Lumina-mGPT 2.0's
            ``get_statistics_with_invalid_values`` computes (its in-place write of zeros into an
            expanded view of the mean zeroes the whole mean), so its threshold depends on the
            logits' offset. Only to reproduce that script's target.
        guidance_schedule: a :class:`csdgen.guidance.GuidanceSchedule`: the guidance scale as a
            function of the image position, starting from ``guidance_scale`` (guided runs
            only); None = ``guidance_scale`` at every position.

    Raises:
        ValueError: for a value outside the ranges above (checked on construction; top_k
            against V is checked when logits arrive).
    """

    guidance_scale: float = 1.0
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    guidance_schedule: GuidanceSchedule | None = None
    top_n_sigma: float | None = None
    top_n_sigma_centered: bool = True

    def __post_init__(self) -> None:
        if not is_number(self.guidance_scale) or not math.isfinite(self.guidance_scale) or self.guidance_scale < 0:
            raise ValueError(f"guidance_scale={self.guidance_scale!r}: must be a finite number >= 0")
        if not is_number(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature={self.temperature!r}: must be a finite number >= 0 (0 = greedy)")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral)
                                       or self.top_k < 0):
            raise ValueError(f"top_k={self.top_k!r}: must be None or 0 (no top-k) or an integer >= 1")
        if self.top_k == 0:  # the command line's and the server's "no top-k", transformers' too
            object.__setattr__(self, "top_k", None)
        if self.top_p is not None and (not is_number(self.top_p) or not (0.0 < self.top_p <= 1.0)):
            raise ValueError(f"top_p={self.top_p!r}: must be None or in (0, 1]")
        if self.top_n_sigma is not None and (not is_number(self.top_n_sigma) or not 0 < self.top_n_sigma < float("inf")):
            raise ValueError(f"top_n_sigma={self.top_n_sigma!r}: must be None or a finite number > 0")
        for name in ("guidance_scale", "temperature", "top_k", "top_p", "top_n_sigma"):
            # numpy's numbers as Python's: a record.json or a server reply writes them as JSON
            # (np.float32 is no JSON number: save_run failed after writing its first images)
            value = getattr(self, name)
            if value is not None and type(value) not in (int, float):
                object.__setattr__(self, name, int(value) if isinstance(value, numbers.Integral) else float(value))
        if isinstance(self.top_n_sigma_centered, str) or self.top_n_sigma_centered not in (True, False):
            # "False" is truthy: it ran the centred sigma
            raise ValueError(f"top_n_sigma_centered={self.top_n_sigma_centered!r}: must be True (the standard deviation) "
                             f"or False (the root mean square)")
        object.__setattr__(self, "top_n_sigma_centered", bool(self.top_n_sigma_centered))
        if self.guidance_schedule is not None and not isinstance(self.guidance_schedule, GuidanceSchedule):
            raise ValueError(f"guidance_schedule={self.guidance_schedule!r}: must be None or a "
                             "csdgen.guidance.GuidanceSchedule (e.g. LinearGuidance(floor=1.0))")

    @property
    def guided(self) -> bool:
        """True when unconditional rows are needed (guidance scale != 1)."""
        return self.guidance_scale != 1.0

    @property
    def greedy(self) -> bool:
        """True for temperature 0 (argmax decoding)."""
        return self.temperature == 0.0


def apply_guidance(cond_logits: torch.Tensor, uncond_logits: torch.Tensor | None,
                   scale: float | torch.Tensor) -> torch.Tensor:
    """Classifier-free guidance: ``l = l_u + s (l_c - l_u)`` (Ho & Salimans, 2022, eq. 6 in logit form).

    Computed as ``(1 - s) l_u + s l_c``, which gives the limits of the formula where a logit is
    -inf: a token that is -inf in both rows stays -inf (a token both rows exclude stays
    excluded); -inf in the conditional row only gives -inf (``s > 0``); -inf in the
    unconditional row only gives +inf for ``s > 1`` (an ill-posed target, reported by
    :func:`invalid_logits`) and -inf for ``s < 1``. ``s = 0`` returns the unconditional logits.

    Args:
        cond_logits: ``[..., V]`` float, logits of the conditional rows.
        uncond_logits: ``[..., V]`` float of the same shape, logits of the unconditional rows
            of the same forward; None when guidance is off.
        scale: guidance scale ``s``; 1.0 returns ``cond_logits`` unchanged. A tensor
            broadcastable to the logits (``[..., 1]``) gives every position its own scale (a
            guidance schedule, :mod:`csdgen.guidance`); it always needs ``uncond_logits``.

    Returns:
        ``[..., V]`` guided logits in float32 (float64 for float64 inputs).

    Raises:
        ValueError: if guidance is requested but no unconditional logits are given, or shapes differ.
    """
    dtype = torch.promote_types(cond_logits.dtype, torch.float32)
    cond = cond_logits.to(dtype)
    per_position = isinstance(scale, torch.Tensor)
    if not per_position and scale == 1.0:
        return cond
    if uncond_logits is None:
        raise ValueError(f"guidance_scale={scale} needs unconditional logits, but the model returned none")
    if uncond_logits.shape != cond_logits.shape:
        raise ValueError(f"unconditional logits {tuple(uncond_logits.shape)} do not match conditional {tuple(cond_logits.shape)}")
    uncond = uncond_logits.to(dtype)
    if not per_position and scale == 0.0:
        return uncond
    if per_position:
        scale = scale.to(dtype)
    guided = (1.0 - scale) * uncond + scale * cond
    both_excluded = torch.isneginf(cond) & torch.isneginf(uncond)
    return guided.masked_fill(both_excluded, float("-inf"))


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Divide ``[..., V]`` logits by ``temperature`` (> 0). Temperature 0 is handled by :func:`target_probs`."""
    return logits if temperature == 1.0 else logits / temperature


def apply_top_k(logits: torch.Tensor, top_k: int | None) -> torch.Tensor:
    """Keep the ``top_k`` largest of ``[..., V]`` logits, set the rest to -inf.

    Raises:
        ValueError: if ``top_k`` exceeds V.
    """
    if top_k is None:
        return logits
    vocab = logits.shape[-1]
    if top_k > vocab:
        raise ValueError(f"top_k={top_k} exceeds the image vocabulary size V={vocab}; allowed: 1..{vocab} or None")
    if top_k == vocab:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_n_sigma(logits: torch.Tensor, n: float | None, centered: bool = True) -> torch.Tensor:
    """Top-nσ filtering (Tang et al., 2024, arXiv 2411.07641, eq. 4) on ``[..., V]`` logits.

    Keeps ``l_v >= max(l) - n sigma``, with ``sigma`` the population standard deviation of the
    finite logits of the position (those top-k left; -inf ones excluded, as Lumina-mGPT 2.0's
    ``get_statistics_with_invalid_values`` excludes them); the rest become -inf. The largest
    logit is always kept. ``centered=False`` uses the root mean square of the finite logits for
    ``sigma`` (Lumina-mGPT 2.0's computation, see :class:`SamplingConfig`).
    """
    if n is None:
        return logits
    finite = torch.isfinite(logits)
    count = finite.sum(-1, keepdim=True).clamp(min=1)
    mean = torch.where(finite, logits, 0.0).sum(-1, keepdim=True) / count if centered else 0.0
    sigma = (torch.where(finite, logits - mean, 0.0) ** 2).sum(-1, keepdim=True).div(count).sqrt()
    return logits.masked_fill(logits < logits.max(-1, keepdim=True).values - n * sigma, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float | None) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al., 2020) on ``[..., V]`` logits.

    Keeps the most probable tokens whose cumulative probability first reaches ``top_p``
    (the most probable token is always kept); the rest become -inf.
    """
    if top_p is None or top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p  # mass before this token already reached top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def target_probs(
    cond_logits: torch.Tensor, uncond_logits: torch.Tensor | None, config: SamplingConfig, *, valid: torch.Tensor | None = None,
    check: bool = False, guidance: torch.Tensor | None = None,
):
    """The target distribution ``q`` for every position: guidance, temperature, top-k, top-n-sigma, top-p, softmax.

    Args:
        cond_logits: ``[..., V]`` logits (any float dtype) of the conditional rows.
        uncond_logits: ``[..., V]`` logits of the unconditional rows, or None without guidance.
        config: the sampling settings.
        valid: ``[...]`` bool, the positions :func:`invalid_logits` looks at (None: all).
        check: also return the 0-dim bool flag of :func:`invalid_logits` on the guided logits
            divided by the temperature (a huge guidance scale or a tiny temperature overflows
            float32 there).
        guidance: ``[..., 1]`` float, the guidance scale of every position (a schedule's values,
            :func:`csdgen.guidance.guidance_at`) instead of ``config.guidance_scale``; only for
            guided configs (ignored when ``config.guidance_scale == 1``).

    Returns:
        ``[..., V]`` float32 probabilities (float64 for float64 logits) summing to 1 on the last
        dimension; one-hot on the argmax (first one on ties) when ``config.temperature == 0``.
        With ``check``: ``(q, flag)``.

    Raises:
        ValueError: an invalid ``top_k`` for this V.

    Non-finite logits are not raised here (that would cost a host sync per call): ask for the
    flag with ``check=True`` and test it where a sync happens anyway, as the decoding loop does.
    """
    scale = guidance if guidance is not None and config.guided else config.guidance_scale
    logits = apply_guidance(cond_logits, uncond_logits, scale)
    if config.greedy:
        flag = invalid_logits(logits, valid) if check else None
        index = logits.argmax(-1, keepdim=True)
        q = torch.zeros_like(logits).scatter_(-1, index, 1.0)
    else:
        logits = apply_temperature(logits, config.temperature)
        flag = invalid_logits(logits, valid) if check else None  # after the temperature: 1 / T can overflow too
        logits = apply_top_k(logits, config.top_k)
        logits = apply_top_n_sigma(logits, config.top_n_sigma, config.top_n_sigma_centered)
        logits = apply_top_p(logits, config.top_p)
        q = logits.softmax(-1)
    return (q, flag) if check else q


def invalid_logits(logits: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """0-dim bool tensor, True if some position has no valid target distribution. No host sync.

    A position is invalid when its ``[V]`` logits hold a NaN or +inf, or are -inf everywhere
    (no token allowed). -inf alone is fine: it excludes a token.

    Args:
        logits: ``[..., V]`` float (guided) logits.
        valid: ``[...]`` bool, positions to look at (None: all).
    """
    bad = (torch.isnan(logits) | torch.isposinf(logits)).any(-1) | torch.isneginf(logits).all(-1)
    if valid is not None:
        bad = bad & valid
    return bad.any()


def has_nan(*tensors: torch.Tensor | None) -> torch.Tensor:
    """A 0-dim bool tensor, True if any of ``tensors`` (None skipped) holds a NaN. No host sync."""
    flags = [torch.isnan(t).any() for t in tensors if t is not None]
    return torch.stack(flags).any() if flags else torch.tensor(False)


#: vocabularies at least this large are sampled in two levels (:func:`sample`); smaller ones by one float64 cumsum
BLOCKED_SAMPLING_MIN_V = 4096
#: tokens per block of the two-level sampler
SAMPLE_BLOCK = 128


def sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: one token per row of ``probs`` from one uniform number each.

    Using given uniforms (instead of ``torch.multinomial``) makes the draws of a whole
    iteration independent of which tokens were accepted, so two rules that agree on a
    decision also agree on every sample ("sample for sample" comparisons).

    Precision: every token keeps its probability to about 1e-6 relative, the smallest included.
    A float32 cumulative sum would not: past a large mass its rounding steps (3e-8 at a sum of 0.5)
    swallow or double tokens of probability 1e-8. Below :data:`BLOCKED_SAMPLING_MIN_V` tokens the
    cumulative sum is float64; from there on (image codebooks of 8192-32768 tokens) the draw takes two
    levels: a block of :data:`SAMPLE_BLOCK` tokens by the float64 cumsum of the blocks' float32
    masses, then a token inside it by the float64 cumsum of the block alone: one float32 pass over
    ``V`` instead of a float64 copy and cumsum (``[16, 32, 16384]`` float32 targets, one thread of
    the 2-core CPU of benchmarks/results/builtin_1911_classes.md: 0.40-0.51 s in float64, 0.022 s in two levels).

    Args:
        probs: ``[..., V]`` non-negative weights (need not be normalised; a row must have
            positive mass).
        uniforms: ``[...]`` float64 numbers in [0, 1).

    Returns:
        ``[...]`` int64 token ids; a token with zero weight is never returned.
    """
    if probs.shape[-1] >= BLOCKED_SAMPLING_MIN_V:
        return _sample_blocked(probs, uniforms)
    cdf = probs.double().cumsum(-1)
    target = (uniforms * cdf[..., -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return index.clamp_(max=probs.shape[-1] - 1)


def _sample_blocked(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """:func:`sample` in two levels (blocks of :data:`SAMPLE_BLOCK` tokens, then a token of the block)."""
    V, L = probs.shape[-1], SAMPLE_BLOCK
    n = -(-V // L)
    weights = probs if probs.dtype == torch.float64 else probs.float()
    if n * L != V:
        weights = torch.nn.functional.pad(weights, (0, n * L - V))
    blocks = weights.unflatten(-1, (n, L))  # [..., n, L]
    mass = blocks.sum(-1)  # [..., n]
    cdf = mass.double().cumsum(-1)
    target = uniforms.unsqueeze(-1) * cdf[..., -1:]  # [..., 1]
    j = torch.searchsorted(cdf, target, right=True).clamp_(max=n - 1)  # the block: cdf[j - 1] <= target < cdf[j]
    before = torch.where(j > 0, cdf.gather(-1, (j - 1).clamp(min=0)), torch.zeros_like(target))
    chunk = blocks.gather(-2, j.unsqueeze(-1).expand(*j.shape, L)).squeeze(-2)  # [..., L]
    inner = chunk.double().cumsum(-1)
    # the target's place in block j, uniform in [0, 1), carried over to the block's own float64 sum
    # (its float32 mass differs by ~1e-7 relative) and kept strictly below it: a token of positive weight
    share = ((target - before) / mass.gather(-1, j).double().clamp_min(torch.finfo(torch.float64).tiny)).clamp(0, 1)
    end = inner[..., -1:]
    inside = torch.minimum(share * end, torch.nextafter(end, torch.zeros_like(end)))
    k = torch.searchsorted(inner, inside, right=True).clamp_(max=L - 1)
    return (j * L + k).squeeze(-1).clamp_(max=V - 1)


_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """``x * constant mod 2**32`` for int64 ``x`` in [0, 2**32), with no int64 overflow."""
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (C. Wellons' "lowbias32") on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


#: the largest seed csdgen takes: seeds are 0 .. 2**63 - 1 (int64), so no two seeds share a random stream
#: and every record holds the seed that made its images
MAX_SEED = 2**63 - 1


def check_seed(seed, name: str = "seed") -> int:
    """``seed`` as an int if it is one in ``0 .. MAX_SEED`` (2**63 - 1), else a one-line ValueError.

    Numpy and torch integers are accepted (``operator.index``); bools, floats and strings are not.

    Raises:
        ValueError: naming ``name``, the value and the allowed range.
    """
    import operator

    allowed = f"allowed: an integer in 0..{MAX_SEED} (2**63 - 1)"
    if isinstance(seed, bool):
        raise ValueError(f"{name}={seed!r}: {allowed}")
    try:
        value = operator.index(seed)
    except TypeError:
        raise ValueError(f"{name}={seed!r}: {allowed}") from None
    if not 0 <= value <= MAX_SEED:
        raise ValueError(f"{name}={value}: outside the seed range; {allowed}")
    return value


def stream_uniforms(seed: int | torch.Tensor, image: torch.Tensor, step: torch.Tensor, kinds: int, width: int) -> torch.Tensor:
    """Counter-based uniforms: a pure function of (seed, image index, step, draw kind, slot).

    Every number is a hash of its key, so an image's numbers do not depend on which other
    images share its batch, on the batch size, or on how many numbers were drawn before: the
    basis of "same seed, same image index, same condition -> same image" at any batch size.
    Keys are chained through a 32-bit integer mixer (Wellons' lowbias32); each float64 takes
    53 bits from two hashes.

    Args:
        seed: the run's seed, ``0 .. MAX_SEED`` (2**63 - 1; :func:`check_seed`), or ``[A]`` int64
            seeds, one per image (images of several runs in one batch,
            :class:`csdgen.engine.ContinuousBatch`; each already checked): the same numbers as
            the int seed.
        image: ``[A]`` int64 image indices (>= 0).
        step: ``[A]`` int64, the image's own forward count (0 = prefill).
        kinds: number of draw kinds K (slot streams per step).
        width: number of slots S.

    Returns:
        ``[K, A, S]`` float64 uniforms in [0, 1) on ``image``'s device.

    Raises:
        ValueError: a seed outside ``0 .. MAX_SEED`` (it would alias another seed's stream).
    """
    if isinstance(seed, torch.Tensor):
        seed = seed.to(image.device, torch.long)
        h = _hash32((seed & _MASK32) ^ 0x2545F491)
        h = _hash32(h ^ ((seed >> 32) & _MASK32))  # seeds are >= 0 (check_seed), so this is seed >> 32
    else:
        seed = check_seed(seed)
        h = _hash32(torch.full_like(image, seed & _MASK32) ^ 0x2545F491)
        h = _hash32(h ^ (seed >> 32))
    h = _hash32(h ^ (image & _MASK32))
    h = _hash32(h ^ (image >> 32) ^ 0x68E31DA4)
    h = _hash32(h ^ (step & _MASK32))  # [A]
    kind = torch.arange(kinds, device=image.device)[:, None, None]
    slot = torch.arange(width, device=image.device)[None, None, :]
    h = _hash32(h[None, :, None] ^ ((kind << 16) | slot))  # slot < 2**16
    high = _hash32(h ^ 0x1B873593) >> 6  # 26 bits
    low = _hash32(h ^ 0x5BD1E995) >> 5  # 27 bits
    return ((high << 27) | low).double() * (2.0**-53)


#: the clamping floor of the CSD reference's entropy and TV distance; the decoding loop's entropy (its
#: statistics, and CSD's relaxation, computed once per iteration) clamps at it too: ``V * 2.3e-9`` nats
#: at most above the exact entropy (4e-5 nats for V = 16384)
ENTROPY_EPS = 1e-10


def entropy(probs: torch.Tensor, *, normalized: bool = False, eps: float = 0.0) -> torch.Tensor:
    """Shannon entropy ``H(q) = -sum_v q(v) ln q(v)`` of ``[..., V]`` distributions, in nats.

    Args:
        probs: ``[..., V]`` probabilities.
        normalized: divide by ``ln V`` so the result lies in [0, 1] (csdgen's option; the CSD
            reference uses nats).
        eps: clamp probabilities to at least ``eps`` first (the CSD reference uses 1e-10);
            0 leaves them as they are, with ``0 ln 0 = 0``.

    Returns:
        ``[...]`` float32 entropy (nats, or nats / ln V when normalised).
    """
    p = probs.float().clamp_min(eps) if eps > 0 else probs.float()
    h = -(p * torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))).sum(-1)
    return h / math.log(probs.shape[-1]) if normalized else h


def total_variation(p: torch.Tensor, q: torch.Tensor, *, eps: float = 0.0) -> torch.Tensor:
    """Total variation distance ``TV(p, q) = 1/2 sum_v |p(v) - q(v)|`` over the last dimension.

    Args:
        p, q: ``[..., V]`` probabilities of the same shape.
        eps: clamp both to at least ``eps`` first (the CSD reference uses 1e-10).

    Returns:
        ``[...]`` float32 in [0, 1] (slightly above 1 is possible after clamping).
    """
    if eps > 0:
        p, q = p.clamp_min(eps), q.clamp_min(eps)
    return 0.5 * (p.float() - q.float()).abs().sum(-1)
