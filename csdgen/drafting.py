"""Draft tokens for speculative Jacobi decoding: initialising new window slots, refreshing old ones.

There is no draft model. A window slot that enters the window for the first time gets a draft
from an *initialisation*; a pending draft that survives a forward (it lies after the first
rejection) is *refreshed* from that forward's target distribution ``q``:

* ``independent`` (SJD, Teng et al., 2024): a fresh sample ``y ~ q``; its draft
  distribution becomes ``q``.
* ``coupled`` (maximal coupling, as in MC-SJD / speculative coupled decoding, arXiv 2510.24211, and
  SJD-PAC's adaptive continuation, arXiv 2603.18599): keep the old
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
from .sampling import as_integer, sample
from .tensor_checks import described, is_integer_tensor

__all__ = ["DRAFT_INITS", "ONE_HOT_INITS", "REFRESH_MODES", "check_drafting", "resolve_draft_init", "init_drafts",
           "refresh_drafts"]

DRAFT_INITS = ("uniform", "onehot", "repeat-horizontal", "repeat-vertical")
#: initialisations whose draft distribution is one-hot on the draft (what ``draft_init = "onehot"`` rules need)
ONE_HOT_INITS = ("onehot", "repeat-horizontal", "repeat-vertical")
REFRESH_MODES = ("independent", "coupled")


def resolve_draft_init(given: str | None, needed: str | None, rule_name: str) -> str:
    """The initialisation to use: ``given`` if compatible with what the rule needs, else an error.

    Args:
        given: the caller's choice, or None.
        needed: the rule's :attr:`~csdgen.acceptance.AcceptanceRule.draft_init` (None = any).
        rule_name: for the message.

    Returns:
        ``given``; when it is None, ``needed`` or ``"uniform"`` (the CSD reference).

    Raises:
        ValueError: ``given`` is unknown, or conflicts with ``needed`` (a rule needing
            ``"onehot"`` accepts every one-hot initialisation of :data:`ONE_HOT_INITS`).
    """
    if given is None:
        return needed or "uniform"
    if given not in DRAFT_INITS:
        raise ValueError(f"unknown draft initialisation {given!r}; allowed: {', '.join(DRAFT_INITS)}")
    allowed = DRAFT_INITS if needed is None else ONE_HOT_INITS if needed == "onehot" else (needed,)
    if given not in allowed:
        raise ValueError(f"draft_init={given!r} conflicts with the {rule_name} rule, which needs {needed!r} drafts; "
                         f"allowed: {', '.join(allowed)} (or leave draft_init unset)")
    return given


def check_drafting(draft_init: str, refresh: str) -> None:
    """Check a run's drafting settings.

    Args:
        draft_init: one of :data:`DRAFT_INITS`; refresh: one of :data:`REFRESH_MODES`.

    Raises:
        ValueError: ``draft_init`` or ``refresh`` is unknown (naming it and the allowed values).
    """
    if draft_init not in DRAFT_INITS:
        raise ValueError(f"unknown draft initialisation {draft_init!r}; allowed: {', '.join(DRAFT_INITS)}")
    if refresh not in REFRESH_MODES:
        raise ValueError(f"unknown draft refresh {refresh!r}; allowed: {', '.join(REFRESH_MODES)}")


def init_drafts(
    kind: str,
    tokens: torch.Tensor,
    first: int | torch.Tensor,
    count: int,
    vocab_size: int,
    row_length: int,
    uniforms: torch.Tensor,
    *,
    positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drafts for new slots: image positions ``first .. first + count - 1`` of every image.

    Args:
        kind: one of :data:`DRAFT_INITS`.
        tokens: ``[B, L]`` int64, committed tokens and pending drafts; positions below
            ``first`` are filled (``first >= 1``), positions from ``first`` on are not read.
        first: image position of the first new slot, ``>= 1`` (the copies read position
            ``first - 1``): an int, or an integer tensor ``[B]`` (per image) or ``[]``, whose values
            are not checked (that would read the tensor: a host sync; a 0 copies position 0).
        count: number of new slots S, an integer >= 0.
        vocab_size: V, the codebook size, an integer >= 1.
        row_length: tokens per image row, an integer >= 1 (read by ``repeat-vertical``; the
            model's ``grid[1]``).
        uniforms: ``[B, S]`` float64 in [0, 1), used for random tokens (a uniform ``u`` gives
            token ``floor(u V)``; values not checked: ``u >= 1`` gives V - 1).
        positions: ``[B, S]`` int64 image positions of the slots, each ``>= first`` of its image
            (default ``first + arange(S)``); the decoding loop passes its window positions.

    Returns:
        ``(draft_tokens [B, S] int64, draft_probs [B, S, V] float32)``.

    Raises:
        ValueError: an unknown ``kind``; ``count``, ``vocab_size``, ``row_length`` or an int ``first``
            outside its range above; ``tokens`` not ``[B, L]``, ``first`` not an integer tensor ``[B]``
            or ``[]``, ``uniforms`` or ``positions`` not ``[B, count]`` (``positions`` integer). The
            message names the argument and what is allowed.
    """
    if kind not in DRAFT_INITS:
        raise ValueError(f"unknown draft initialisation {kind!r}; allowed: {', '.join(DRAFT_INITS)}")
    for name, value, low in (("count", count, 0), ("vocab_size", vocab_size, 1), ("row_length", row_length, 1)):
        number = as_integer(value)
        if number is None or number < low:
            raise ValueError(f"init_drafts: {name}={value!r}; allowed an integer >= {low}")
    count, vocab_size, row_length = as_integer(count), as_integer(vocab_size), as_integer(row_length)
    if tokens.dim() != 2:
        raise ValueError(f"init_drafts: tokens {list(tokens.shape)}; allowed [B, L]")
    B = tokens.shape[0]
    if isinstance(first, torch.Tensor):
        if not is_integer_tensor(first) or first.shape not in ((), (B,)):
            raise ValueError(f"init_drafts: first is {first.dtype} {list(first.shape)}; allowed an int >= 1 or an "
                             f"integer tensor [B] = [{B}] (per image) or []")
    elif as_integer(first) is None or as_integer(first) < 1:
        raise ValueError(f"init_drafts: first={first!r}; allowed an int >= 1 (the copies read position first - 1) "
                         f"or an integer tensor [B]")
    if tuple(uniforms.shape) != (B, count):
        raise ValueError(f"init_drafts: uniforms {list(uniforms.shape)}; allowed [B, count] = [{B}, {count}]")
    if positions is not None and (not is_integer_tensor(positions) or tuple(positions.shape) != (B, count)):
        raise ValueError(f"init_drafts: positions is {described(positions)}; allowed None or an integer tensor [B, count] = [{B}, {count}]")
    device = tokens.device
    first = torch.as_tensor(first, device=device).reshape(-1, 1).expand(tokens.shape[0], 1)  # [B, 1]
    if positions is None:
        positions = first + torch.arange(count, device=device)
    random_tokens = (uniforms * vocab_size).long().clamp_(max=vocab_size - 1)
    if kind == "uniform":
        probs = torch.full((*random_tokens.shape, vocab_size), 1.0 / vocab_size, device=device)
        return random_tokens, probs
    if kind == "onehot":
        draft = random_tokens
    elif kind == "repeat-horizontal":
        draft = tokens.gather(1, (first - 1).clamp(min=0)).expand_as(positions)  # the last known token
    else:  # "repeat-vertical"
        source = positions - row_length * ((positions - first) // row_length + 1)  # nearest known row above
        copied = tokens.gather(1, source.clamp(min=0))
        draft = torch.where(source >= 0, copied, random_tokens)
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

    Raises:
        ValueError: an unknown ``mode`` (naming it and :data:`REFRESH_MODES`).
    """
    if mode == "independent":
        return target_sample
    if mode != "coupled":
        raise ValueError(f"unknown draft refresh {mode!r}; allowed: {', '.join(REFRESH_MODES)}")
    # maximal coupling of p (old draft's law) and q (new target)
    keep = keep_uniforms < lossless_acceptance(draft_tokens, draft_probs, target_probs)
    moved = sample(residual_distribution(draft_probs, target_probs), residual_uniforms)
    return torch.where(keep, draft_tokens, moved)
