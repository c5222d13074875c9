"""Small VQ image tokenizer of the built-in model (runtime module, torch only).

64 x 64 RGB images in [-1, 1] <-> 16 x 16 grids of codes in [0, codebook_size) (1024 for the emoji model).
Codes and encoder outputs are L2-normalised (cosine-similarity lookup), the quantiser
uses the straight-through estimator with commitment loss, and unused codes can be
restarted from encoder outputs during training.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class VQConfig:
    """Hyperparameters of :class:`VQTokenizer` (stored in config.json)."""

    channels: int = 32          # width at full resolution (64 px)
    mid: int = 64               # width at 1/2 resolution (32 px)
    hidden: int = 128           # width at 1/4 resolution (16 px, the token grid)
    codebook_size: int = 1024
    code_dim: int = 32
    commitment: float = 0.25
    image_size: int = 64
    downsample: int = 4

    def to_dict(self) -> dict:
        return asdict(self)


class ResBlock(nn.Module):
    """GroupNorm-SiLU-conv3x3 twice, plus identity. Shape preserving [B, C, H, W]."""

    def __init__(self, ch: int):
        super().__init__()
        self.body = nn.Sequential(
            nn.GroupNorm(8, ch), nn.SiLU(), nn.Conv2d(ch, ch, 3, padding=1),
            nn.GroupNorm(8, ch), nn.SiLU(), nn.Conv2d(ch, ch, 3, padding=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def _encoder(cfg: VQConfig) -> nn.Sequential:
    """[B, 3, 64, 64] -> [B, code_dim, 16, 16] (unnormalised)."""
    c, m, h = cfg.channels, cfg.mid, cfg.hidden
    return nn.Sequential(
        nn.Conv2d(3, c, 3, padding=1),
        nn.Conv2d(c, m, 4, stride=2, padding=1), ResBlock(m),
        nn.Conv2d(m, h, 4, stride=2, padding=1), ResBlock(h), ResBlock(h),
        nn.GroupNorm(8, h), nn.SiLU(), nn.Conv2d(h, cfg.code_dim, 1),
    )


def _decoder(cfg: VQConfig) -> nn.Sequential:
    """[B, code_dim, 16, 16] -> [B, 3, 64, 64] (unclamped)."""
    c, m, h = cfg.channels, cfg.mid, cfg.hidden
    return nn.Sequential(
        nn.Conv2d(cfg.code_dim, h, 3, padding=1), ResBlock(h), ResBlock(h),
        nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(h, m, 3, padding=1), ResBlock(m),
        nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(m, c, 3, padding=1),
        nn.GroupNorm(8, c), nn.SiLU(), nn.Conv2d(c, 3, 3, padding=1),
    )


class VQTokenizer(nn.Module):
    """Conv VQ tokenizer: 64 px images <-> 16 x 16 code grids, codebook ``codebook_size`` x ``code_dim``
    (the emoji model's defaults: 1024 x 32)."""

    def __init__(self, config: VQConfig | None = None):
        super().__init__()
        self.config = config or VQConfig()
        cfg = self.config
        self.encoder = _encoder(cfg)
        self.decoder = _decoder(cfg)
        self.codebook = nn.Embedding(cfg.codebook_size, cfg.code_dim)
        nn.init.normal_(self.codebook.weight)
        # Exponential moving average of code usage (training only, for dead-code restarts).
        self.register_buffer("usage", torch.ones(cfg.codebook_size), persistent=False)

    @property
    def grid(self) -> tuple[int, int]:
        """Token grid (rows, cols), e.g. (16, 16)."""
        side = self.config.image_size // self.config.downsample
        return side, side

    @property
    def embeddings(self) -> torch.Tensor:
        """L2-normalised codebook, float32 [codebook_size, code_dim] (detached)."""
        return F.normalize(self.codebook.weight.detach().float(), dim=-1)

    def _latents(self, images: torch.Tensor) -> torch.Tensor:
        """images float [B, 3, 64, 64] -> normalised latents float [B, 16, 16, code_dim]."""
        return F.normalize(self.encoder(images).permute(0, 2, 3, 1), dim=-1)

    def _nearest(self, z: torch.Tensor) -> torch.Tensor:
        """Normalised latents [..., D] -> code ids LongTensor [...] (max cosine)."""
        codes = F.normalize(self.codebook.weight, dim=-1)
        return (z @ codes.t()).argmax(dim=-1)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images float [B, 3, 64, 64] in [-1, 1] -> codes int64 [B, 16, 16]."""
        return self._nearest(self._latents(images))

    def _lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """codes int [B, 16, 16] or [B, 256] -> quantised latents [B, code_dim, 16, 16]."""
        rows, cols = self.grid
        codes = codes.reshape(codes.shape[0], rows, cols)
        z_q = F.normalize(self.codebook(codes), dim=-1)
        return z_q.permute(0, 3, 1, 2)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes int [B, 16, 16] or [B, 256] -> images float32 [B, 3, 64, 64] in [-1, 1]."""
        return self.decoder(self._lookup(codes.long())).clamp(-1.0, 1.0)

    def forward(self, images: torch.Tensor, bf16: bool = False):
        """Training pass.

        images float [B, 3, 64, 64] in [-1, 1] -> (recon float32 [B, 3, 64, 64] unclamped,
        vq_loss float32 scalar (codebook + commitment), codes int64 [B, 16, 16], z float32
        [B*256, code_dim] normalised encoder outputs, detached). With ``bf16`` the encoder
        and decoder run under bfloat16 autocast; the code lookup and losses stay float32.
        """
        amp = torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=bf16)
        with amp:
            z = self.encoder(images)
        z = F.normalize(z.float().permute(0, 2, 3, 1), dim=-1)
        codes = self._nearest(z.detach())
        z_q = F.normalize(self.codebook(codes), dim=-1)
        vq_loss = F.mse_loss(z_q, z.detach()) + self.config.commitment * F.mse_loss(z, z_q.detach())
        z_st = z + (z_q - z).detach()
        with amp:
            recon = self.decoder(z_st.permute(0, 3, 1, 2))
        return recon.float(), vq_loss, codes, z.detach().reshape(-1, z.shape[-1])

    @torch.no_grad()
    def restart_dead_codes(self, codes: torch.Tensor, z: torch.Tensor,
                           decay: float = 0.99, threshold: float = 0.03) -> int:
        """Update usage EMA with ``codes`` (int [...]) and re-seed codes whose EMA usage
        (expected hits per batch) is below ``threshold`` with random rows of ``z``
        ([N, code_dim]). Returns the number of restarted codes."""
        counts = torch.bincount(codes.flatten(), minlength=self.config.codebook_size).float()
        self.usage.mul_(decay).add_(counts, alpha=1 - decay)
        dead = (self.usage < threshold).nonzero().flatten()
        if dead.numel() == 0:
            return 0
        pick = torch.randint(0, z.shape[0], (dead.numel(),), device=z.device)
        self.codebook.weight[dead] = z[pick] + 0.01 * torch.randn_like(z[pick])
        self.usage[dead] = 1.0
        return int(dead.numel())
