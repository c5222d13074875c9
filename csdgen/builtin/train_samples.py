"""Samples of a trained built-in model at the end of its training (:mod:`csdgen.builtin.train`):
plain guided AR sampling, the classifier agreement of guided samples (metrics.json's
``samples``) and the PNG grids of showcase classes (``--docs``: real emoji with samples, and
with their VQ reconstructions).

Training-time only (never imported at run time).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from .classifier import CropClassifier
from .train_classifier import classify
from .train_common import CODEBOOK_SIZE, to_float
from .train_vq import encode_all
from .vq import VQTokenizer


@torch.no_grad()
def sample_ar(model, class_ids: torch.Tensor, null_id: int, guidance: float = 3.0,
              temperature: float = 1.0, seed: int = 0, n_tokens: int = 256) -> torch.Tensor:
    """Plain AR sampling with classifier-free guidance and a KV cache (private helper).

    class_ids int64 [B] (token ids CODEBOOK_SIZE + c) -> codes int64 [B, n_tokens].
    Guided logits = uncond + guidance * (cond - uncond), restricted to the CODEBOOK_SIZE codes.
    """
    from transformers import DynamicCache

    from ..models._transformers import cache_kwargs

    gen = torch.Generator().manual_seed(seed)
    b = class_ids.shape[0]
    tokens = torch.cat([class_ids, torch.full_like(class_ids, null_id)])[:, None]
    cache = DynamicCache(config=model.config)
    out = []
    for pos in range(n_tokens):
        position_ids = torch.full((2 * b, tokens.shape[1]), pos, dtype=torch.long)
        logits = model(input_ids=tokens, **cache_kwargs(cache), position_ids=position_ids,
                       use_cache=True).logits[:, -1, :CODEBOOK_SIZE].float()
        cond, uncond = logits[:b], logits[b:]
        guided = (uncond + guidance * (cond - uncond)) / temperature
        nxt = torch.multinomial(F.softmax(guided, dim=-1), 1, generator=gen)
        out.append(nxt)
        tokens = torch.cat([nxt, nxt])
    return torch.cat(out, dim=1)


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """float [N, 3, H, W] in [-1, 1] -> uint8 [N, H, W, 3]."""
    x = ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).numpy()


def save_grid(images: torch.Tensor, rows: int, path: Path, scale: int = 2) -> None:
    """Save float [rows*cols, 3, H, W] in [-1, 1] (row-major) as a PNG grid."""
    arr = to_uint8(images)
    n, h, w, _ = arr.shape
    cols = n // rows
    grid = arr[:rows * cols].reshape(rows, cols, h, w, 3).transpose(0, 2, 1, 3, 4)
    img = Image.fromarray(grid.reshape(rows * h, cols * w, 3))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.resize((cols * w * scale, rows * h * scale), Image.NEAREST).save(path)


#: the classes of the --docs grids (those the model has), in this order
SHOWCASE = ("red apple", "dog face", "rocket", "grinning face", "cat face", "pizza", "house",
            "sun", "snowman", "fire", "automobile", "banana", "butterfly", "pile of poo",
            "four leaf clover", "hot beverage", "watermelon", "ghost", "bicycle", "panda face")




@torch.no_grad()
def classifier_agreement(ar, vq: VQTokenizer, clf: CropClassifier, num_classes: int, n: int,
                         guidance: float, seed: int) -> dict:
    """Share of ``n`` guided samples (temperature 1) that ``clf`` classifies as the class asked.

    The classes asked cycle through a random order of all ``num_classes`` (every class, as evenly
    as ``n`` allows); samples are drawn 64 at a time. Returns metrics.json's ``samples``:
    ``{"n", "guidance", "temperature", "classifier_agreement"}`` (agreement in [0, 1])."""
    null_id = CODEBOOK_SIZE + num_classes
    gen = torch.Generator().manual_seed(seed + 8)
    rounds = -(-n // num_classes)  # every class, as evenly as the count allows
    pick = torch.randperm(num_classes, generator=gen).repeat(rounds)[:n]
    preds = []
    for i in range(0, len(pick), 64):
        codes = sample_ar(ar, pick[i:i + 64] + CODEBOOK_SIZE, null_id, guidance=guidance,
                          seed=seed + 7 + i)
        preds.append(classify(clf, vq.decode(codes)))
    return {"n": len(pick), "guidance": guidance, "temperature": 1.0,
            "classifier_agreement": float((torch.cat(preds) == pick).float().mean())}


@torch.no_grad()
def write_sample_grids(ar, vq: VQTokenizer, names: list[str], images: torch.Tensor, labels: torch.Tensor,
                       guidance: float, seed: int, docs: Path) -> None:
    """Write ``docs/builtin_samples.png`` (a row of real emoji, then three rows of guided samples of
    the same classes) and ``docs/builtin_reconstructions.png`` (the real emoji and their VQ
    reconstructions).

    The classes: those of :data:`SHOWCASE` among ``names``, else the first 20. The real emoji: the
    first of ``images`` (uint8 [N, 3, 64, 64], held-out views) of each class in ``labels`` (int64 [N]);
    every class shown needs one. ``docs`` is created if missing."""
    show = torch.tensor([names.index(n) for n in SHOWCASE if n in names] or list(range(min(20, len(names)))))
    real = [images[(labels == c).nonzero()[0, 0]] for c in show]
    codes = sample_ar(ar, show.repeat(3) + CODEBOOK_SIZE, CODEBOOK_SIZE + len(names), guidance=guidance,
                      seed=seed + 9)
    samples = vq.decode(codes)
    save_grid(torch.cat([to_float(torch.stack(real)), samples]), 4, docs / "builtin_samples.png")
    recon = vq.decode(encode_all(vq, torch.stack(real)))
    save_grid(torch.cat([to_float(torch.stack(real)), recon]), 2, docs / "builtin_reconstructions.png")
