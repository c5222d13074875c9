"""Agreement of two runs that should draw the same images: teacher-forced logits and token statistics.

Two engines, two batch sizes or two servers run the same model in another summation order; in
float32 or bfloat16 a row's logits then differ by rounding, a draw or an acceptance test that
falls within that distance of its threshold tips, and the image goes its own way from there (a
sample from the same distribution). So tokens are the wrong thing to compare outside float64:
:func:`teacher_forced_logits` feeds the same tokens to both and compares what each computes, and
:func:`token_agreement` / :func:`histogram_distance` measure how alike the runs' images and token
distributions are.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["teacher_forced_logits", "token_agreement", "histogram_distance"]


@torch.no_grad()
def teacher_forced_logits(model, conditions: Sequence, tokens: torch.Tensor, *, guided: bool, engine: str = "eager",
                          window: int = 16, compile: bool | None = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The logits of every image position of ``tokens``, fed to a fresh session window by window.

    Prefill gives position 0's logits; then windows of ``window`` tokens at starts 0, ``window``,
    ... give the logits of the next positions, every row fed the same tokens, so two engines or
    batch sizes can be compared position by position whatever they would have sampled.

    Args:
        model: an image-token model; conditions: one condition per row (class, prompt or ids).
        tokens: ``[B, N]`` int64 image tokens (N = ``model.num_image_tokens``), on any device.
        guided: run the unconditional rows too (guidance scale != 1).
        engine: ``"eager"``, ``"static"`` or ``"auto"`` (:func:`csdgen.models._static.open_engine`).
        window: tokens per forward, >= 1; compile: as ``generate(compile=...)``.

    Returns:
        ``(cond, uncond)``: ``[B, N, V]`` logits in the model's dtype on its device; ``uncond`` None
        when not ``guided``.

    Raises:
        ValueError: ``tokens`` not ``[len(conditions), N]``, or ``window < 1``.
    """
    from csdgen.models._static import open_engine

    N = model.num_image_tokens
    if tokens.dim() != 2 or tokens.shape != (len(conditions), N):
        raise ValueError(f"tokens of shape {tuple(tokens.shape)}: allowed [{len(conditions)}, {N}] (one row per condition)")
    if window < 1:
        raise ValueError(f"window={window}: allowed >= 1")
    session = open_engine(model.start(list(conditions), None, guided), engine, compile)
    first = session.prefill()
    cond, uncond = [first.cond[:, -1:]], [None if first.uncond is None else first.uncond[:, -1:]]
    B, start = len(conditions), 0
    tokens = tokens.to(model.device)
    while start < N - 1:
        width = min(window, N - 1 - start)
        out = session.forward(tokens[:, start:start + width], start=torch.full((B,), start, dtype=torch.long))
        cond.append(out.cond[:, :width])
        uncond.append(None if out.uncond is None else out.uncond[:, :width])
        start += width
    return torch.cat(cond, 1), (torch.cat(uncond, 1) if guided else None)


def token_agreement(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """``(fraction of images identical, fraction of tokens equal)`` of two ``[B, N]`` token tensors.

    Raises:
        ValueError: different shapes.
    """
    if a.shape != b.shape:
        raise ValueError(f"token tensors of shapes {tuple(a.shape)} and {tuple(b.shape)}: allowed the same shape")
    equal = a.cpu() == b.cpu()
    return float(equal.all(1).float().mean()), float(equal.float().mean())


def histogram_distance(a: torch.Tensor, b: torch.Tensor, V: int) -> float:
    """Total variation distance between the token histograms of two runs (every image and position
    pooled), in [0, 1]: 0 when both use every code equally often.

    Args:
        a, b: int64 token tensors of any shape, values in ``0 .. V - 1``; V: codebook size.
    """
    ha = torch.bincount(a.reshape(-1).cpu(), minlength=V).double()
    hb = torch.bincount(b.reshape(-1).cpu(), minlength=V).double()
    return float(0.5 * (ha / ha.sum() - hb / hb.sum()).abs().sum())
