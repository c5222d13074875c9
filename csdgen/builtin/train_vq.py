"""The VQ stage of the built-in model's training (:mod:`csdgen.builtin.train`): train the VQ
tokenizer on augmented emoji views (L1 + edge + VQ losses), encode images to codes, decode codes
to images, and the held-out reconstruction and codebook figures.

Training-time only (never imported at run time).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .train_common import CODEBOOK_SIZE, StageClock, autocast, batch_indices, cosine_lr, log, set_lr, to_float
from .vq import VQConfig, VQTokenizer

#: the VQ tokenizer's widths (fixed: the built-in model's; codes 16 x 16 of a 64 x 64 image)
VQ_CONFIG = dict(channels=32, mid=64, hidden=128, codebook_size=CODEBOOK_SIZE, code_dim=32)


def edge_loss(recon: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean L1 distance of horizontal and vertical finite differences (outline sharpness)."""
    dx = lambda x: x[..., :, 1:] - x[..., :, :-1]
    dy = lambda x: x[..., 1:, :] - x[..., :-1, :]
    return (dx(recon) - dx(target)).abs().mean() + (dy(recon) - dy(target)).abs().mean()


def train_vq(images: torch.Tensor, args) -> VQTokenizer:
    """Train the VQ tokenizer on images uint8 [N, 3, 64, 64] (L1 + 0.5 edge + VQ losses; dead codes
    restarted in the first 80 % of the stage); returns it in eval mode.

    ``args``: train.py's options (``seed``, ``vq_lr``, ``vq_steps``, ``vq_batch``, ``max_minutes_vq``,
    ``threads``, ``log_every``); the steps run are recorded in ``args.done_steps["vq"]``."""
    torch.manual_seed(args.seed)
    vq = VQTokenizer(VQConfig(**VQ_CONFIG)).train()
    opt = torch.optim.AdamW(vq.parameters(), lr=args.vq_lr, betas=(0.9, 0.99), weight_decay=0.0)
    clock = StageClock("vq", args.vq_steps, args.max_minutes_vq, args.threads)
    for step, idx in enumerate(batch_indices(len(images), args.vq_batch, args.vq_steps, args.seed)):
        if clock.progress(step) >= 1.0:
            break
        clock.tick(step)
        args.done_steps["vq"] = step + 1
        set_lr(opt, cosine_lr(clock.progress(step), args.vq_lr, warmup=0.05))
        x = to_float(images[idx])
        recon, vq_loss, codes, z = vq(x, bf16=True)
        rec_loss = F.mse_loss(recon, x)
        loss = (recon - x).abs().mean() + 0.5 * edge_loss(recon, x) + vq_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        restarted = vq.restart_dead_codes(codes, z) if clock.progress(step) < 0.8 else 0
        if step % args.log_every == 0 or step == args.vq_steps - 1:
            psnr = 10 * math.log10(4.0 / max(rec_loss.item(), 1e-10))
            log(f"vq step {step} loss {loss.item():.4f} rec {rec_loss.item():.4f} "
                f"psnr {psnr:.2f} dB restarted {restarted}")
    return vq.eval()


@torch.no_grad()
def encode_all(vq: VQTokenizer, images: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """images uint8 or float [N, 3, 64, 64] -> codes int64 [N, 256] (raster order)."""
    conv = to_float if images.dtype == torch.uint8 else (lambda x: x)
    out = []
    for i in range(0, len(images), batch):
        with autocast():                       # the encoder in bfloat16, the code lookup in float32
            z = vq.encoder(conv(images[i:i + batch]))
        z = F.normalize(z.float().permute(0, 2, 3, 1), dim=-1)
        out.append(vq._nearest(z).flatten(1))
    return torch.cat(out)


@torch.no_grad()
def decode_u8(vq: VQTokenizer, codes: torch.Tensor, batch: int = 256) -> torch.Tensor:
    """codes int64 [N, 256] -> images uint8 [N, 3, 64, 64] (decoder in bfloat16)."""
    out = []
    for i in range(0, len(codes), batch):
        with autocast():
            x = vq.decoder(vq._lookup(codes[i:i + batch]))
        out.append(x.float().clamp(-1, 1).add(1).mul(127.5).round().to(torch.uint8))
    return torch.cat(out)


@torch.no_grad()
def eval_vq(vq: VQTokenizer, images: torch.Tensor, train_codes: torch.Tensor) -> dict:
    """Held-out PSNR (mean per-image, pixel range [0, 1]) and codebook statistics."""
    codes = encode_all(vq, images)
    recon = torch.cat([vq.decode(codes[i:i + 256]) for i in range(0, len(codes), 256)])
    mse = ((recon - to_float(images)) / 2).pow(2).flatten(1).mean(1).clamp_min(1e-10)
    counts = torch.bincount(train_codes.flatten(), minlength=CODEBOOK_SIZE).float()
    p = counts / counts.sum()
    entropy = -(p[p > 0] * p[p > 0].log()).sum().item()
    return {
        "heldout_psnr_db": float((10 * torch.log10(1.0 / mse)).mean()),
        "heldout_mse_01": float(mse.mean()),
        "codebook_usage_train": int((counts > 0).sum()),
        "codebook_usage_heldout": int(torch.unique(codes).numel()),
        "codebook_perplexity_train": float(math.exp(entropy)),
    }
