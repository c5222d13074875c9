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
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .guidance import GuidanceSchedule, check_guidance_scale
from .tensor_checks import described, is_integer_tensor
from .integers import as_integer, is_finite_at_least_0, is_number  # noqa: F401 (the engine and rules import them from here)

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


def _check_top_k(value) -> int | None:
    """``top_k`` as None (None or 0: no top-k, as in transformers' ``generate``) or an int >= 1, else
    :class:`SamplingConfig`'s ValueError."""
    k = as_integer(value)
    if value is not None and (k is None or k < 0):
        raise ValueError(f"top_k={value!r}: must be None or 0 (no top-k) or an integer >= 1")
    return k or None


def _check_top_p(value) -> None:
    """ValueError unless ``value`` is None or a number in (0, 1] (:class:`SamplingConfig`'s rule and message)."""
    if value is not None and (not is_number(value) or not 0.0 < value <= 1.0):
        raise ValueError(f"top_p={value!r}: must be None or in (0, 1]")


def _check_top_n_sigma(value, name: str = "top_n_sigma") -> None:
    """ValueError unless ``value`` is None or a finite number > 0 (:class:`SamplingConfig`'s rule and message)."""
    if value is not None and (not is_number(value) or not 0 < value < float("inf")):
        raise ValueError(f"{name}={value!r}: must be None or a finite number > 0")


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
        temperature: softmax temperature (logits divided by it before the softmax), a finite
            number >= 0; 0 selects greedy decoding (one-hot on the argmax).
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
        check_guidance_scale(self.guidance_scale)
        if not is_finite_at_least_0(self.temperature):
            raise ValueError(f"temperature={self.temperature!r}: must be a finite number >= 0 (0 = greedy)")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral)):
            raise ValueError(f"top_k={self.top_k!r}: must be None or 0 (no top-k) or an integer >= 1")
        # 0 is the command line's and the server's "no top-k", transformers' too: stored as None
        object.__setattr__(self, "top_k", self.top_k if self.top_k is None else _check_top_k(self.top_k))
        _check_top_p(self.top_p)
        _check_top_n_sigma(self.top_n_sigma)
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
    """Classifier-free guidance: ``l = l_u + s (l_c - l_u)`` (Ho & Salimans, 2022, "Classifier-Free
    Diffusion Guidance", arXiv 2207.12598, eq. 6, written for logits as in transformers'
    ``ClassifierFreeGuidanceLogitsProcessor``).

    Computed as ``(1 - s) l_u + s l_c``, which gives the limits of the formula where a logit is
    -inf: a token that is -inf in both rows stays -inf (a token both rows exclude stays
    excluded); -inf in the conditional row only gives -inf (``s > 0``); -inf in the
    unconditional row only gives +inf for ``s > 1`` (an ill-posed target, reported by
    :func:`invalid_logits`) and -inf for ``s < 1``. ``s = 0`` returns the unconditional logits.

    Args:
        cond_logits: ``[..., V]`` float, logits of the conditional rows.
        uncond_logits: ``[..., V]`` float of the same shape, logits of the unconditional rows
            of the same forward; None when guidance is off.
        scale: guidance scale ``s``, a finite number >= 0 (:attr:`SamplingConfig.guidance_scale`'s
            range); 1.0 returns ``cond_logits`` unchanged. A float tensor of shape ``[..., 1]``
            broadcastable to the logits gives every position its own scale (a guidance schedule,
            :mod:`csdgen.guidance`); it always needs ``uncond_logits``. Its values are not checked
            (that would read the tensor: a host sync); :func:`csdgen.guidance.guidance_table` checks a
            schedule's.

    Returns:
        ``[..., V]`` guided logits. The dtype follows ``cond_logits`` only: float64 for float64
        ``cond_logits``, float32 for every other dtype (float16, bfloat16, float32);
        ``uncond_logits`` and a tensor ``scale`` are cast to it (float64 unconditional logits with
        float32 conditional ones are computed in float32). The models return both from one forward,
        in one dtype.

    Raises:
        ValueError: ``scale`` is neither a finite number >= 0 nor a tensor of shape ``[..., 1]``
            broadcastable to the logits; guidance is requested but ``uncond_logits`` is None; the two
            logits' shapes differ.
    """
    if isinstance(scale, torch.Tensor):
        _check_scales_shape(scale, cond_logits.shape)
    else:
        check_guidance_scale(scale, "scale")
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


def _check_scales_shape(scales: torch.Tensor, logits_shape: torch.Size) -> None:
    """ValueError unless ``scales`` (per-position guidance scales) is ``[..., 1]``, broadcastable to ``logits_shape``."""
    shape = tuple(scales.shape)
    if not shape:  # one scale for every position, as a 0-d tensor
        return
    if not (shape[-1] == 1 and len(shape) <= len(logits_shape)
            and all(s in (1, t) for s, t in zip(shape[::-1], tuple(logits_shape)[::-1]))):
        raise ValueError(f"guidance scales of shape {list(shape)}: allowed a tensor [..., 1] broadcastable to the "
                         f"logits {list(logits_shape)} (one scale per position), or a 0-d tensor")


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Divide ``[..., V]`` logits by ``temperature``: the softmax of the result is ``q(v) ∝ exp(l_v / T)``
    (as transformers' ``TemperatureLogitsWarper``).

    Args:
        logits: ``[..., V]`` float logits.
        temperature: ``T``, a finite number > 0 (or a tensor broadcastable to the logits, unchecked); 1.0
            returns ``logits`` itself. Temperature 0
            (greedy decoding) is no division: :func:`target_probs` takes the argmax instead.

    Returns:
        ``[..., V]`` logits of ``logits``' dtype.

    Raises:
        ValueError: ``temperature`` is not a finite number > 0 (0 gave +-inf logits, a negative one
            reversed the distribution).
    """
    if isinstance(temperature, torch.Tensor):  # per-position temperatures, broadcast; values unchecked (a host sync)
        return logits / temperature
    if not is_finite_at_least_0(temperature) or temperature == 0:
        raise ValueError(f"temperature={temperature!r}: must be a finite number > 0 here (temperature 0, greedy "
                         f"decoding, is target_probs' argmax, not a division)")
    return logits if temperature == 1.0 else logits / temperature


def apply_top_k(logits: torch.Tensor, top_k: int | None) -> torch.Tensor:
    """Top-k filtering (Fan et al., 2018, "Hierarchical Neural Story Generation", ACL): keep the
    ``top_k`` largest of ``[..., V]`` logits, set the rest to -inf.

    Ties: every logit equal to the ``top_k``-th largest is kept, so a position whose ``top_k``-th
    logit is tied keeps more than ``top_k`` tokens (``[1, 1, 1, 0]`` with ``top_k = 1`` keeps three,
    ``q = [1/3, 1/3, 1/3, 0]``), as transformers' ``TopKLogitsWarper`` does (``logits < kth``).
    Greedy decoding (temperature 0) instead takes the first maximum.

    Args:
        logits: ``[..., V]`` float logits.
        top_k: None or 0 (no top-k, as :class:`SamplingConfig` stores 0), or an integer in ``1 .. V``
            (V keeps every token).

    Returns:
        ``[..., V]`` logits of ``logits``' dtype (``logits`` itself when nothing is removed).

    Raises:
        ValueError: ``top_k`` is not None, 0 nor an integer in ``1 .. V``.
    """
    top_k = _check_top_k(top_k)
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
    logit is always kept (``n > 0``). ``centered=False`` uses the root mean square of the finite
    logits for ``sigma`` (Lumina-mGPT 2.0's computation, see :class:`SamplingConfig`).

    Args:
        logits: ``[..., V]`` float logits.
        n: None (off) or a finite number > 0 (:attr:`SamplingConfig.top_n_sigma`).
        centered: True for the standard deviation, False for the root mean square.

    Returns:
        ``[..., V]`` logits of ``logits``' dtype.

    Raises:
        ValueError: ``n`` is neither None nor a finite number > 0 (a negative ``n`` removed every token).
    """
    _check_top_n_sigma(n)
    if n is None:
        return logits
    finite = torch.isfinite(logits)
    count = finite.sum(-1, keepdim=True).clamp(min=1)
    mean = torch.where(finite, logits, 0.0).sum(-1, keepdim=True) / count if centered else 0.0
    sigma = (torch.where(finite, logits - mean, 0.0) ** 2).sum(-1, keepdim=True).div(count).sqrt()
    return logits.masked_fill(logits < logits.max(-1, keepdim=True).values - n * sigma, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float | None) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration",
    ICLR) on ``[..., V]`` logits.

    Keeps the most probable tokens whose cumulative probability first reaches ``top_p``
    (the most probable token is always kept, ``top_p > 0``); the rest become -inf.

    Args:
        logits: ``[..., V]`` float logits.
        top_p: None or 1 (keep every token), or a number in (0, 1) (:attr:`SamplingConfig.top_p`).

    Returns:
        ``[..., V]`` logits of ``logits``' dtype (``logits`` itself when nothing is removed).

    Raises:
        ValueError: ``top_p`` is neither None nor in (0, 1] (0 removed every token: the softmax gave NaN).
    """
    _check_top_p(top_p)
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
        config: the sampling settings, a :class:`SamplingConfig` (a dict is refused: in
            :func:`csdgen.generate` it means changes to the model's defaults, and there is no model
            here; build ``SamplingConfig(**changes)``).
        valid: ``[...]`` bool, the positions :func:`invalid_logits` looks at (None: all).
        check: also return the 0-dim bool flag of :func:`invalid_logits` on the guided logits
            divided by the temperature (a huge guidance scale or a tiny temperature overflows
            float32 there).
        guidance: ``[..., 1]`` float, the guidance scale of every position (a schedule's values,
            :func:`csdgen.guidance.guidance_at`) instead of ``config.guidance_scale``, broadcastable
            to the logits; only for guided configs (ignored when ``config.guidance_scale == 1``).

    Returns:
        ``[..., V]`` float32 probabilities (float64 for float64 logits) summing to 1 on the last
        dimension; one-hot on the argmax (first one on ties) when ``config.temperature == 0``.
        With ``check``: ``(q, flag)``.

    Raises:
        ValueError: ``config`` is not a :class:`SamplingConfig`; its ``top_k`` exceeds this V;
            guidance without ``uncond_logits``, logits of two shapes, or ``guidance`` of a shape
            other than ``[..., 1]`` broadcastable to the logits (:func:`apply_guidance`).

    Non-finite logits are not raised here (that would cost a host sync per call): ask for the
    flag with ``check=True`` and test it where a sync happens anyway, as the decoding loop does.
    """
    if not isinstance(config, SamplingConfig):
        raise ValueError(_not_a_config(config))
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


def _not_a_config(config) -> str:
    """target_probs' message for a ``config`` that is not a SamplingConfig (a dict: the form generate takes)."""
    shown = repr(config) if len(repr(config)) <= 60 else f"<{type(config).__name__} object>"
    hint = (f"; a dict of changes is what csdgen.generate takes (the rest from the model's defaults, and there "
            f"is no model here): give csdgen.SamplingConfig(**{shown})") if isinstance(config, Mapping) else ""
    return f"config={shown}: allowed a csdgen.SamplingConfig, e.g. SamplingConfig(guidance_scale=3.0){hint}"


def invalid_logits(logits: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """0-dim bool tensor, True if some position has no valid target distribution. No host sync.

    A position is invalid when its ``[V]`` logits hold a NaN or +inf, or are -inf everywhere
    (no token allowed). -inf alone is fine: it excludes a token.

    Args:
        logits: ``[..., V]`` float (guided) logits.
        valid: ``[...]`` bool of shape ``logits.shape[:-1]``, positions to look at (None: all).

    Returns:
        ``[]`` bool tensor on ``logits``' device.

    Raises:
        ValueError: ``valid`` is not a bool tensor of shape ``logits.shape[:-1]``.
    """
    if valid is not None and (not isinstance(valid, torch.Tensor) or valid.dtype != torch.bool
                              or valid.shape != logits.shape[:-1]):
        raise ValueError(f"valid: got {described(valid)}; allowed None or a bool tensor {list(logits.shape[:-1])} "
                         f"(the logits' shape without V)")
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

    Preconditions, not checked (a check would read the tensors: a host sync per call; the decoding
    loop guarantees them: its targets come from logits whose :func:`invalid_logits` flag it reads
    once per iteration, its uniforms from :func:`stream_uniforms`): every row of ``probs`` holds
    finite weights >= 0 with a positive finite sum, and every uniform lies in [0, 1). Under them
    the returned token is the one whose interval of the cumulative weights holds ``u`` times the
    row's total, so a token with zero weight is never returned. Outside them the result is a token id in ``0 .. V - 1`` of no
    meaning, possibly of zero weight: a row of zeros, a row with a NaN or +inf weight, or
    ``u >= 1`` gives ``V - 1``; ``u < 0`` gives 0.

    Args:
        probs: ``[..., V]`` finite non-negative weights, any float dtype (need not be normalised;
            every row must have positive mass).
        uniforms: ``[...]`` (``probs.shape[:-1]``) float64 numbers in [0, 1).

    Returns:
        ``[...]`` int64 token ids in ``0 .. V - 1``; under the preconditions, never a token of zero weight.

    Raises:
        ValueError: ``uniforms``' shape is not ``probs.shape[:-1]``.
    """
    if uniforms.shape != probs.shape[:-1]:
        raise ValueError(f"sample: uniforms {list(uniforms.shape)} do not match probs {list(probs.shape)}; allowed: "
                         f"one uniform per row, {list(probs.shape[:-1])}")
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


def _broadcasts_to(shape, target) -> bool:
    """Whether a tensor of ``shape`` broadcasts to ``target`` (a 0-d tensor, ``[1]`` or ``target`` itself)."""
    try:
        return tuple(torch.broadcast_shapes(tuple(shape), tuple(target))) == tuple(target)
    except RuntimeError:
        return False


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
        image: ``[A]`` int64 image indices, ``0 .. 2**63 - 1`` (values not checked: that would
            read the tensor; a negative index is hashed as its two's complement, another image's key).
        step: ``[A]`` int64, the image's own forward count (0 = prefill), ``0 .. 2**32 - 1``
            (only its low 32 bits enter the key).
        kinds: number of draw kinds K (slot streams per step), an integer in ``0 .. 2**16 - 1``.
        width: number of slots S, an integer in ``0 .. 2**16 - 1``: kind and slot share one
            32-bit key word (``kind << 16 | slot``), so a slot of ``2**16`` or more would repeat the
            numbers of the next kind's stream.

    Returns:
        ``[K, A, S]`` float64 uniforms in [0, 1) on ``image``'s device.

    Raises:
        ValueError: a seed outside ``0 .. MAX_SEED`` (it would alias another seed's stream); ``kinds`` or
            ``width`` that is not an integer in ``0 .. 65535``; ``image``, ``step`` or a tensor ``seed``
            that is not an integer tensor (``step`` and a tensor ``seed`` of ``image``'s shape).
    """
    for name, value in (("kinds", kinds), ("width", width)):
        number = as_integer(value)
        if number is None or not 0 <= number < 2**16:
            raise ValueError(f"{name}={value!r}: allowed an integer in 0..65535 (2**16 - 1): the draw kind and "
                             f"the slot share one 32-bit word of the key")
    for name, value in (("image", image), ("step", step)) + ((("seed", seed),) if isinstance(seed, torch.Tensor) else ()):
        if not is_integer_tensor(value) or (name != "image" and not _broadcasts_to(value.shape, image.shape)):
            raise ValueError(f"{name}: got {described(value)}; allowed an integer tensor [A] (int64)"
                             + ("" if name == "image" or not isinstance(image, torch.Tensor)
                                else f" of image's shape {list(image.shape)} (or one that broadcasts to it)")
                             + (", or an int seed" if name == "seed" else ""))
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
    """Shannon entropy ``H(q) = -sum_v q(v) ln q(v)`` of ``[..., V]`` distributions, in nats (Shannon,
    1948, "A Mathematical Theory of Communication", Theorem 2, with the natural logarithm).

    The input is taken as given: values are not checked (that would read the tensor: a host sync),
    so logits or unnormalised weights give a number that is no entropy (negative, or above ``ln V``).

    Args:
        probs: ``[..., V]`` probabilities (each row >= 0, summing to 1), any float dtype.
        normalized: divide by ``ln V`` so the result lies in [0, 1] (csdgen's option; the CSD
            reference uses nats); needs V >= 2.
        eps: a finite number >= 0: clamp probabilities to at least ``eps`` first (the CSD reference
            uses 1e-10, :data:`ENTROPY_EPS`); 0 leaves them as they are, with ``0 ln 0 = 0``.

    Returns:
        ``[...]`` float32 entropy (nats, or nats / ln V when normalised).

    Raises:
        ValueError: ``eps`` is not a finite number >= 0; ``normalized`` with V = 1 (``ln 1 = 0``).
    """
    if not is_finite_at_least_0(eps):
        raise ValueError(f"eps={eps!r}: must be a finite number >= 0 (the clamping floor of the probabilities)")
    if normalized and probs.shape[-1] < 2:
        raise ValueError(f"entropy(normalized=True) of probs {list(probs.shape)}: V = {probs.shape[-1]}; allowed V >= 2 "
                         f"(the result is divided by ln V)")
    p = probs.float().clamp_min(eps) if eps > 0 else probs.float()
    h = -(p * torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))).sum(-1)
    return h / math.log(probs.shape[-1]) if normalized else h


def total_variation(p: torch.Tensor, q: torch.Tensor, *, eps: float = 0.0) -> torch.Tensor:
    """Total variation distance ``TV(p, q) = 1/2 sum_v |p(v) - q(v)|`` over the last dimension (Levin,
    Peres & Wilmer, "Markov Chains and Mixing Times", Proposition 4.2).

    The inputs are taken as given: values are not checked (that would read the tensors: a host sync).

    Args:
        p, q: ``[..., V]`` probabilities of the same shape (no broadcasting), any float dtype.
        eps: a finite number >= 0: clamp both to at least ``eps`` first (the CSD reference uses
            1e-10); 0 leaves them as they are.

    Returns:
        ``[...]`` float32 in [0, 1] for distributions (slightly above 1 is possible after clamping).

    Raises:
        ValueError: ``p`` and ``q`` differ in shape; ``eps`` is not a finite number >= 0.
    """
    if p.shape != q.shape:
        raise ValueError(f"total_variation: p {list(p.shape)} and q {list(q.shape)} differ in shape; allowed: two "
                         f"[..., V] tensors of one shape")
    if not is_finite_at_least_0(eps):
        raise ValueError(f"eps={eps!r}: must be a finite number >= 0 (the clamping floor of the probabilities)")
    if eps > 0:
        p, q = p.clamp_min(eps), q.clamp_min(eps)
    return 0.5 * (p.float() - q.float()).abs().sum(-1)
