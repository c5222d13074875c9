"""What the engine reports: how each image token was decided (:class:`Decision`), the statistics
of one image (:class:`ImageStats`), what a ``callback`` sees after every forward
(:class:`StepInfo`) and what ``generate`` returns (:class:`GenerationResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..decisions import Decision
from ..models.base import DecodingSession

__all__ = ["Decision", "ImageStats", "StepInfo", "GenerationResult"]


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
    """What a ``callback`` sees after every forward (prefill included): the tensors are copies of
    that moment, so a kept StepInfo still shows it; ``session`` is the live session (read it during
    the call).

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
        auto_log: with ``window="auto"``: per width chosen by the model (warm-up widths left out),
            ``iterations`` and the mean ``predicted_tokens`` / ``measured_tokens`` per image and
            ``predicted_seconds`` / ``measured_seconds`` per iteration (the check of the width
            chooser's cost and acceptance models; ``benchmarks/bench_decoding.py`` prints it).
        compile_seconds: with the static engine and ``compile``: ``{"rows x columns": seconds}``,
            the first call of every forward shape (compilation, warm-up and CUDA graph capture
            included; a shape compiled by an earlier call of the same model costs little). Part
            of :attr:`seconds`.
    """

    tokens: torch.Tensor
    images: list[ImageStats]
    steps: int
    seconds: float
    settings: dict[str, Any] = field(default_factory=dict)
    batch_acceptance: str = "per-image"
    widths: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    auto_log: dict[int, dict[str, float]] = field(default_factory=dict)
    compile_seconds: dict[str, float] = field(default_factory=dict)

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
            **({"compile_seconds": self.compile_seconds} if self.compile_seconds else {}),
            "images": [s.summary() for s in self.images],
        }
