"""The decoding loop: AR, speculative Jacobi decoding (SJD) and its relaxed variants (CSD, ...).

One iteration (Teng et al., 2024, "Accelerating Auto-regressive Text-to-Image Generation with
Training-free Speculative Jacobi Decoding"; the CSD paper's Algorithm 1):

    draft -> verify -> accept -> commit -> roll back

* **draft**: the window's input is the image tokens at positions ``K .. K + W - 1``, where
  ``K`` is the cache length: committed tokens first, then pending drafts; new slots get
  drafts from the initialisation (:mod:`csdgen.drafting`).
* **verify**: one forward gives the target distribution ``q`` at positions
  ``K + 1 .. K + W``; the rule gives acceptance probabilities for the whole window.
* **accept**: each image walks its own drafts left to right (vectorised with
  :func:`csdgen.acceptance.first_rejection`); at its first rejection it commits a sample from
  the residual, and with no rejection it commits a *bonus* sample from ``q`` at the last slot.
* **commit / refresh**: drafts after the rejection are refreshed from ``q``.
* **roll back**: the cache keeps the positions every image has committed (``K' = min(c) - 1``).

**Per-image acceptance in a batch.** Images keep their own committed length ``c_b``; the
cache holds the positions committed by all of them, and an image that is ahead re-feeds its
extra committed tokens at the start of the next window (they are "decided" slots, never
re-verified). No image is held to the batch's minimum accepted length, as the reference code
does; an image far ahead waits (its window holds only decided tokens) until the others catch up.

AR decoding is the same loop with a window of 1 (the only slot is the bonus slot).

Randomness: the loop owns one ``torch.Generator`` and draws a fixed block of float64 uniforms
per iteration, whatever is accepted, so two rules taking the same decisions produce the same
samples (the basis of the "CSD with lambda 0 equals SJD sample for sample" test).
Host syncs: one per iteration (the new cache length, together with the NaN check).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable

import torch

from .acceptance import RULES, SJD, AcceptanceRule, first_rejection, lossless_acceptance, make_rule
from .drafting import check_drafting, init_drafts, refresh_drafts
from .models.base import DecodingSession, ImageTokenModel
from .sampling import SamplingConfig, entropy, has_nan, sample, target_probs

__all__ = ["Decision", "ImageStats", "StepInfo", "GenerationResult", "generate", "METHODS"]

#: method names ``generate`` takes: ``"ar"`` plus every acceptance rule's name
METHODS = ("ar", "sjd", "csd", "addition", "jacobi", "gsd", "lantern")

_DRAWS = 6  # uniform blocks per iteration: target sample, accept, residual, init, keep, coupled residual


class Decision(IntEnum):
    """How an image token was decided (the acceptance map's categories)."""

    SAMPLED = 0  #: plain sample from q: an AR step, the prefill token, or a window's bonus token
    ACCEPTED = 1  #: draft accepted by the exact test ``u < min(1, q/p)``
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
    """

    steps: int
    num_tokens: int
    committed_per_step: list[int]
    decisions: torch.Tensor
    entropy: torch.Tensor

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
        }


@dataclass
class StepInfo:
    """What a ``callback`` sees after every forward (prefill included)."""

    step: int
    committed: torch.Tensor  #: ``[B]`` int64 committed length per image
    tokens: torch.Tensor  #: ``[B, N]`` committed tokens and pending drafts
    session: DecodingSession  #: rolled back to the committed positions


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
    """

    tokens: torch.Tensor
    images: list[ImageStats]
    steps: int
    seconds: float
    settings: dict[str, Any] = field(default_factory=dict)
    batch_acceptance: str = "per-image"

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
            "images": [s.summary() for s in self.images],
        }


def _check_window(window: Any) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r}: must be an integer >= 1 (1 = AR)")
    return window


def _resolve_method(method: str | AcceptanceRule, window: int, model: ImageTokenModel) -> tuple[AcceptanceRule, int, str]:
    if isinstance(method, str) and method == "ar":
        return SJD(), 1, "ar"
    if isinstance(method, str) and method not in METHODS:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)} (or an AcceptanceRule)")
    needs_codebook = isinstance(method, str) and getattr(RULES[method], "needs_codebook", False)
    rule = make_rule(method, codebook=model.codebook_embeddings() if needs_codebook else None)
    return rule, window, rule.name


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def generate(
    model: ImageTokenModel,
    conditions: Any = None,
    *,
    batch_size: int | None = None,
    method: str | AcceptanceRule = "csd",
    window: int = 16,
    seed: int = 0,
    sampling: SamplingConfig | None = None,
    draft_init: str = "uniform",
    refresh: str = "independent",
    callback: Callable[[StepInfo], None] | None = None,
) -> GenerationResult:
    """Generate image tokens by AR decoding or speculative Jacobi decoding with an acceptance rule.

    Args:
        model: any :class:`~csdgen.models.base.ImageTokenModel`.
        conditions: what the model conditions on (class ids, prompts; one per image) or None.
        batch_size: number of images when ``conditions`` does not fix it.
        method: ``"ar"``, ``"sjd"``, ``"csd"``, ``"addition"``, ``"jacobi"``, ``"gsd"``,
            ``"lantern"`` (default options; the last two take the model's codebook) or an
            :class:`~csdgen.acceptance.AcceptanceRule` instance such as ``CSD(lam=0.3)``.
        window: W, input slots of one Jacobi forward; each forward commits 1..W tokens per image.
            Ignored (1) for ``"ar"``.
        seed: seed of the loop's ``torch.Generator``; the same seed gives the same images.
        sampling: guidance scale, temperature (0 = greedy), top-k, top-p.
        draft_init: ``"uniform"`` (default, CSD reference), ``"onehot"`` (SJD reference),
            ``"repeat-horizontal"`` or ``"repeat-vertical"``.
        refresh: ``"independent"`` (SJD) or ``"coupled"`` (maximal coupling); both lossless.
        callback: called with a :class:`StepInfo` after every forward (progress bars, tests).

    Returns:
        :class:`GenerationResult` with tokens ``[B, N]`` int64 and per-image statistics.

    Raises:
        ValueError: window < 1, unknown method, draft initialisation or refresh mode, bad
            sampling settings (e.g. top-k > V), conditions the model rejects, or NaN logits.
    """
    window = _check_window(window)
    rule, window, method_name = _resolve_method(method, window, model)
    check_drafting(draft_init, refresh)
    sampling = sampling or SamplingConfig()
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
    loop = _Loop(model, rule, window, seed, sampling, draft_init, refresh, callback)
    return loop.run(conditions, batch_size, settings)


class _Loop:
    """State of one ``generate`` call (see the module docstring for the algorithm)."""

    def __init__(self, model, rule, window, seed, sampling, draft_init, refresh, callback):
        self.model, self.rule, self.window, self.sampling = model, rule, window, sampling
        self.draft_init, self.refresh, self.callback = draft_init, refresh, callback
        self.device = torch.device(model.device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

    def _uniforms(self, width: int) -> torch.Tensor:
        """``[_DRAWS, B, width]`` float64 uniforms; always ``window`` wide so draws line up across rules."""
        u = torch.rand(_DRAWS, self.B, self.window, dtype=torch.float64, device=self.device, generator=self.generator)
        return u[..., :width]

    def run(self, conditions, batch_size, settings) -> GenerationResult:
        model = self.model
        N, V = model.num_image_tokens, model.codebook_size
        _synchronize(self.device)
        began = time.perf_counter()
        session = model.start(conditions, batch_size, self.sampling.guided)
        self.B = B = session.batch_size
        self.tokens = torch.zeros(B, N, dtype=torch.long, device=self.device)
        self.decisions = torch.full((B, N), int(Decision.SAMPLED), dtype=torch.int8, device=self.device)
        self.entropy = torch.zeros(B, N, device=self.device)
        self.steps_per_image = torch.ones(B, dtype=torch.long, device=self.device)
        self.commit_log = [torch.ones(B, dtype=torch.long, device=self.device)]

        logits = session.prefill()
        q = target_probs(logits.cond, logits.uncond, self.sampling)[:, 0]  # [B, V]
        self.tokens[:, 0] = sample(q, self._uniforms(1)[0, :, 0])
        self.entropy[:, 0] = entropy(q)
        self.committed = torch.ones(B, dtype=torch.long, device=self.device)
        self.steps = 1
        c_min = self._check(has_nan(logits.cond, logits.uncond))
        session.rollback(0)  # checks once that this model's cache can roll back
        self._notify(session)

        K, prev_q, prev_start = 0, None, 1  # cache length; last forward's q and its first position
        while c_min < N:
            prev_q, prev_start, nan_flag = self._iterate(session, K, prev_q, prev_start)
            self.steps += 1
            c_min = self._check(nan_flag)
            K = c_min - 1
            session.rollback(K)
            self._notify(session)
        _synchronize(self.device)
        seconds = time.perf_counter() - began
        return GenerationResult(self.tokens, self._image_stats(), self.steps, seconds, settings)

    def _check(self, nan_flag: torch.Tensor) -> int:
        """The one host sync per iteration: minimum committed length, and the NaN check."""
        c_min, nan = torch.stack([self.committed.min(), nan_flag.long()]).tolist()
        if nan:
            raise ValueError("the model returned NaN logits; allowed: finite or -inf logits (check the model weights and inputs)")
        return c_min

    def _notify(self, session) -> None:
        if self.callback is not None:
            self.callback(StepInfo(self.steps, self.committed, self.tokens, session))

    def _drafts(self, K: int, width: int, prev_q, prev_start: int, u_init: torch.Tensor):
        """Draft probabilities ``[B, width, V]`` for output slots (positions ``K+1 ..``); new slots initialised."""
        shift = K + 1 - prev_start
        carried = 0 if prev_q is None else max(0, min(prev_q.shape[1] - shift, width))
        parts = [prev_q[:, shift : shift + carried]] if carried else []
        if carried < width:
            first = K + 1 + carried
            new_tokens, new_probs = init_drafts(
                self.draft_init, self.tokens, first, width - carried, self.model.codebook_size,
                self.model.grid[1], u_init[:, carried:],
            )
            self.tokens[:, first : K + 1 + width] = new_tokens
            parts.append(new_probs)
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    def _iterate(self, session, K: int, prev_q, prev_start: int):
        """One forward at cache length K; returns this forward's q, its first position and a NaN flag."""
        N = self.model.num_image_tokens
        width = min(self.window, N - 1 - K)  # output positions K+1 .. K+width
        u = self._uniforms(width)
        draft_probs = self._drafts(K, width, prev_q, prev_start, u[3])  # p
        logits = session.forward(self.tokens[:, K : K + width], start=K)
        q = target_probs(logits.cond, logits.uncond, self.sampling)  # [B, width, V]
        x = self.tokens[:, K + 1 : K + 1 + width]  # drafts (committed tokens where decided)
        y = sample(q, u[0])

        b = self.rule.acceptance_probability(x, draft_probs, q, y)
        slot = torch.arange(width, device=self.device)
        first_open = (self.committed - K - 1)[:, None]  # [B, 1] first undecided slot per image
        decided = slot < first_open
        passes = (u[1] < b) & (slot < width - 1)  # the last slot has no draft: bonus slot
        r = first_rejection(decided | passes)  # [B] in 0..width
        r_col = r[:, None]

        z = sample(self.rule.residual(draft_probs, q, y), u[2])
        new_token = torch.where(slot == width - 1, y, z)
        fresh = refresh_drafts(self.refresh, x, draft_probs, q, y, u[4], u[5])
        fresh[:, -1] = y[:, -1]
        self.tokens[:, K + 1 : K + 1 + width] = torch.where(slot < r_col, x, torch.where(slot == r_col, new_token, fresh))

        newly = (slot >= first_open) & (slot <= r_col)
        exact = u[1] < lossless_acceptance(x, draft_probs, q)
        code = torch.where(
            slot < r_col,
            torch.where(exact, int(Decision.ACCEPTED), int(Decision.RELAXED)),
            torch.where(slot == width - 1, int(Decision.SAMPLED), int(Decision.RESAMPLED)),
        ).to(torch.int8)
        view = slice(K + 1, K + 1 + width)
        self.decisions[:, view] = torch.where(newly, code, self.decisions[:, view])
        self.entropy[:, view] = torch.where(newly, entropy(q), self.entropy[:, view])

        active = self.committed < N
        new_committed = torch.where(r < width, K + 2 + r, self.committed)
        self.commit_log.append(torch.where(active, new_committed - self.committed, -1))
        self.steps_per_image += active.long()
        self.committed = new_committed
        return q, K + 1, has_nan(logits.cond, logits.uncond)

    def _image_stats(self) -> list[ImageStats]:
        log = torch.stack(self.commit_log, dim=1).cpu()  # [B, steps]; -1 after an image finished
        tokens_n = self.model.num_image_tokens
        stats = []
        for b in range(self.B):
            row = log[b]
            stats.append(
                ImageStats(
                    steps=int(self.steps_per_image[b]),
                    num_tokens=tokens_n,
                    committed_per_step=row[row >= 0].tolist(),
                    decisions=self.decisions[b].cpu(),
                    entropy=self.entropy[b].cpu(),
                )
            )
        return stats
