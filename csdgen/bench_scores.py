"""The scores of a bench: the target NLL of every image (teacher-forced through the model's own
session), CLIP score per image, FID or the built-in Frechet distance per row, and how many images
a row needs for each distance to mean anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from csdgen.jsonio import read_json, write_json

__all__ = ["session_nll", "target_nll", "Scorers", "FID_MIN_IMAGES", "min_images"]


def _start_argument(session, start: int, batch: int):
    """``forward``'s ``start``: an int for lock-step sessions, a ``[B]`` int64 tensor for per-row ones."""
    if getattr(session, "per_row", False):
        import torch

        return torch.full((batch,), start, dtype=torch.long)
    return start


def session_nll(model, conditions: Sequence, tokens, chunk: int = 256):
    """Target NLL through the model's decoding session: prefill, then the committed tokens fed
    ``chunk`` positions at a time (conditional rows only, no guidance, no warping).

    Args:
        model: any image-token model; conditions: ``B`` conditions; tokens: ``[B, N]`` int64.
        chunk: image positions per forward (bounds the memory of the ``[B, chunk, V]`` logits).

    Returns:
        ``[B]`` float32 on the CPU: ``-(1/N) sum_n log q(x_n | condition, x_<n)``, nats per token.
    """
    import torch

    B, N = tokens.shape
    tokens = tokens.to(model.device)
    with torch.no_grad():
        session = model.start(list(conditions), B, False)
        logp = session.prefill().cond[:, 0].float().log_softmax(-1)  # [B, V], position 0
        total = logp.gather(-1, tokens[:, :1]).squeeze(-1)
        for start in range(0, N - 1, chunk):
            fed = tokens[:, start : min(start + chunk, N - 1)]
            logits = session.forward(fed, _start_argument(session, start, B)).cond.float()  # positions start+1 ..
            target = tokens[:, start + 1 : start + 1 + fed.shape[1]]
            total = total + logits.log_softmax(-1).gather(-1, target[..., None]).squeeze(-1).sum(-1)
    return (-total / N).cpu()


def target_nll(model, conditions: Sequence, tokens):
    """Mean NLL per token, in nats, of image tokens under the target model (teacher-forced,
    conditional, no guidance): the model's ``token_nll`` where it has one (the built-in model),
    else :func:`session_nll`.

    Args:
        model: the image-token model; conditions: ``B`` conditions; tokens: ``[B, N]`` int64.

    Returns:
        ``[B]`` float32 on the CPU (compare with ``ln V``, the NLL of uniform tokens).
    """
    if hasattr(model, "token_nll"):
        return model.token_nll(tokens, list(conditions)).float().cpu()
    return session_nll(model, conditions, tokens)


@dataclass
class Scorers:
    """The quality scorers of a report; None = that score is not computed.

    Attributes:
        clip: a :class:`~csdgen.evaluation.clip_score.ClipScorer` (per-image CLIP score).
        fid: a :class:`~csdgen.evaluation.fid.FidScorer` (FID per row).
        builtin: a :class:`~csdgen.evaluation.quality.QualityScorer` (Frechet distance on the
            built-in classifier's features, per row).
    """

    clip: Any = None
    fid: Any = None
    builtin: Any = None
    notes: list[str] = field(default_factory=list)


def _read_png(path: Path):
    import numpy as np
    import torch
    from PIL import Image

    try:
        with Image.open(path) as image:
            return torch.from_numpy(np.asarray(image.convert("RGB")).copy()).permute(2, 0, 1)  # [3, H, W] uint8
    except (OSError, SyntaxError, ValueError) as error:  # PIL: truncated or not an image (damaged outside csdgen)
        raise ValueError(unreadable(path, error)) from None


def unreadable(path, error: Exception) -> str:
    """The one line for a kept image or tensors file that cannot be read (damaged outside csdgen: its writes are
    atomic): the file, the reader's reason and what makes it again."""
    return f"{str(path)!r} cannot be read ({error}); delete it and rerun the same command to make it again"


def _clip_scores(records: list[dict], out: Path, clip, batch: int = 32) -> None:
    """Fill ``clip`` per record, reusing ``scores/clip.json`` (keyed by CLIP model, image, size, mtime)."""
    import torch

    cache_path = out / "scores" / "clip.json"
    cache = read_json(cache_path) if cache_path.is_file() else {}
    table = cache.setdefault(clip.name, {})

    def key(record):
        stat = (out / record["image"]).stat()
        return f"{record['image']}|{stat.st_size}|{stat.st_mtime_ns}|{record['prompt']}"

    todo = [r for r in records if key(r) not in table]
    for start in range(0, len(todo), batch):
        chunk = todo[start : start + batch]
        images = torch.stack([_read_png(out / r["image"]) for r in chunk])
        for record, value in zip(chunk, clip.score(images, [r["prompt"] for r in chunk]).tolist()):
            table[key(record)] = value
    if todo:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        write_json(cache, cache_path)
    for record in records:
        record["clip"] = table[key(record)]


#: the images a row needs for FID to mean anything: the Inception pool features are 2048-d, and with fewer
#: images than dimensions the generated images' covariance is singular (rank < 2048), so the trace term of
#: FID measures the sample size more than the images (FID's bias grows as 1 / images; papers use 5000+)
FID_MIN_IMAGES = 2048


def min_images(scorers: Scorers) -> dict[str, int]:
    """Per score, the images a row needs for it to mean anything: FID :data:`FID_MIN_IMAGES`; the built-in
    model's Frechet distance as many as its classifier's feature dimensions (the same singular-covariance
    reason; 256 for the shipped weights)."""
    needed = {"fid": FID_MIN_IMAGES}
    if scorers.builtin is not None:
        needed["frechet_distance"] = int(scorers.builtin.classifier.feature_dim)
    return needed
