"""Draft tokens for speculative Jacobi decoding: initialising new window slots, refreshing old ones.

There is no draft model. A window slot that enters the window for the first time gets a draft
from an *initialisation*; a pending draft that survives a forward (it lies after the first
rejection) is *refreshed* from that forward's target distribution ``q``:

* ``independent`` (SJD, Teng et al., 2024): a fresh sample ``y ~ q``; its draft
  distribution becomes ``q``.
* ``coupled`` (maximal coupling, as in MC-SJD / speculative coupled decoding): keep the old
  draft ``x`` with probability ``min(1, q(x)/p(x))``, else sample ``norm(max(0, q - p))``.
  The result is still distributed as ``q`` (the coupling lemma), so decoding stays lossless,
  but drafts change less between iterations and are accepted more often.

Initialisations (``p`` is what the acceptance rule is told the draft was sampled from):

* ``uniform``: token uniform over the codebook, ``p`` uniform (CSD reference).
* ``onehot``: token uniform, ``p`` one-hot on it (SJD reference).
* ``repeat-horizontal``: copy the token to the left (raster order), ``p`` one-hot.
* ``repeat-vertical``: copy the token one row above, ``p`` one-hot; a random token in the
  first row.

Every initialisation is lossless under the exact rule: given the history, the draft is a
sample of the ``p`` the rule is told about (a deterministic copy is a sample of a one-hot).
"""

from __future__ import annotations

import torch

from .acceptance import lossless_acceptance, residual_distribution
from .sampling import sample

__all__ = ["DRAFT_INITS", "REFRESH_MODES", "check_drafting", "init_drafts", "refresh_drafts"]

DRAFT_INITS = ("uniform", "onehot", "repeat-horizontal", "repeat-vertical")
REFRESH_MODES = ("independent", "coupled")


def check_drafting(draft_init: str, refresh: str) -> None:
    """Raise ValueError naming the bad value if ``draft_init`` or ``refresh`` is unknown."""
    if draft_init not in DRAFT_INITS:
        raise ValueError(f"unknown draft initialisation {draft_init!r}; allowed: {', '.join(DRAFT_INITS)}")
    if refresh not in REFRESH_MODES:
        raise ValueError(f"unknown draft refresh {refresh!r}; allowed: {', '.join(REFRESH_MODES)}")


def init_drafts(
    kind: str,
    tokens: torch.Tensor,
    first: int,
    count: int,
    vocab_size: int,
    row_length: int,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafts for ``count`` new slots at image positions ``first .. first + count - 1``.

    Args:
        kind: one of :data:`DRAFT_INITS`.
        tokens: ``[B, N]`` int64, committed tokens and pending drafts; positions below
            ``first`` are filled (``first >= 1``), positions from ``first`` on are not read.
        first: image position of the first new slot.
        count: number of new slots (>= 0).
        vocab_size: V, the codebook size.
        row_length: tokens per image row (for ``repeat-vertical``).
        uniforms: ``[B, count]`` float64 in [0, 1), used for random tokens.

    Returns:
        ``(draft_tokens [B, count] int64, draft_probs [B, count, V] float32)``.
    """
    random_tokens = (uniforms * vocab_size).long().clamp_(max=vocab_size - 1)
    if kind == "uniform":
        probs = torch.full((*random_tokens.shape, vocab_size), 1.0 / vocab_size, device=tokens.device)
        return random_tokens, probs
    if kind == "onehot":
        draft = random_tokens
    elif kind == "repeat-horizontal":
        draft = tokens[:, first - 1 : first].expand(-1, count)  # every new slot copies the last known token
    elif kind == "repeat-vertical":
        positions = torch.arange(first, first + count, device=tokens.device)
        source = positions - row_length * ((positions - first) // row_length + 1)  # nearest known row above
        copied = tokens[:, source.clamp(min=0)]
        draft = torch.where(source >= 0, copied, random_tokens)
    else:
        raise ValueError(f"unknown draft initialisation {kind!r}; allowed: {', '.join(DRAFT_INITS)}")
    draft = draft.contiguous()
    return draft, torch.nn.functional.one_hot(draft, vocab_size).float()


def refresh_drafts(
    mode: str,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    target_sample: torch.Tensor,
    keep_uniforms: torch.Tensor,
    residual_uniforms: torch.Tensor,
) -> torch.Tensor:
    """New drafts for every window slot from this forward's target distribution.

    The caller keeps only those after each image's first rejection; their draft
    distribution for the next forward is ``target_probs``.

    Args:
        mode: ``"independent"`` or ``"coupled"`` (see the module docstring).
        draft_tokens: ``[B, W]`` int64, the old drafts ``x``.
        draft_probs: ``[B, W, V]`` float, ``p`` the old drafts were sampled from.
        target_probs: ``[B, W, V]`` float, this forward's ``q``.
        target_sample: ``[B, W]`` int64, ``y ~ q`` drawn by the loop.
        keep_uniforms, residual_uniforms: ``[B, W]`` float64 in [0, 1).

    Returns:
        ``[B, W]`` int64 drafts, each distributed as ``q`` given the history.
    """
    if mode == "independent":
        return target_sample
    if mode != "coupled":
        raise ValueError(f"unknown draft refresh {mode!r}; allowed: {', '.join(REFRESH_MODES)}")
    # maximal coupling of p (old draft's law) and q (new target)
    keep = keep_uniforms < lossless_acceptance(draft_tokens, draft_probs, target_probs)
    moved = sample(residual_distribution(draft_probs, target_probs), residual_uniforms)
    return torch.where(keep, draft_tokens, moved)
