"""The decoder half of MoVQGAN (codes -> pixels), Lumina-mGPT 2.0's image tokenizer.

MoVQGAN (SberAI, ai-forever/MoVQGAN; Zheng et al., 2022, "MoVQ: Modulating Quantized Vectors
for High-Fidelity Image Generation") is a taming-style VQGAN whose decoder normalises every
feature map with a *spatially conditioned* GroupNorm: ``SpatialNorm(f, zq) = GroupNorm(f) *
conv_y(zq') + conv_b(zq')``, ``zq'`` the quantised latent resized (nearest) to ``f``'s size
(MoVQ, eq. 3). Lumina-mGPT 2.0 decodes its image tokens with the 270M model
(``lumina_mgpt/movqgan/__init__.py``: ``movqgan_270M.ckpt``; ``MOVQ.decode_code``). No
maintained PyPI package ships it, so the decoder is written here, following the parameter
layout of that checkpoint's state dict (``MOVQ`` in ``movqgan/models/vqgan.py``,
``MOVQDecoder`` in ``movqgan/modules/vqvae/movq_modules.py``):

``quantize.embedding.weight`` ``[n_embed, embed_dim]``, ``post_quant_conv.*`` (embed_dim ->
z_channels), ``decoder.conv_in.*``, ``decoder.mid.block_1.*`` / ``attn_1.*`` / ``block_2.*``,
``decoder.up.{level}.block.{i}.*``, ``decoder.up.{level}.attn.{i}.*``,
``decoder.up.{level}.upsample.conv.*``, ``decoder.norm_out.*``, ``decoder.conv_out.*``; every
norm is ``{name}.norm_layer.{weight,bias}`` (GroupNorm, 32 groups, eps 1e-6) plus
``{name}.conv_y.*`` and ``{name}.conv_b.*`` (1x1 convolutions from ``embed_dim`` channels).

Decoding (``MOVQ.decode_code``): ``zq = embedding[codes]`` as ``[B, embed_dim, rows, cols]``,
``z = post_quant_conv(zq)``, ``image = decoder(z, zq)``; the decoder's ``zq`` input stays the
un-convolved codebook vectors. Downsampling ``2 ** (len(ch_mult) - 1)``: 8 for the released
models, so Lumina-mGPT 2.0's 96 x 96 codes decode to 768 x 768 pixels.

Assumed, not checked against the real file (no download possible here): ``movqgan_270M.ckpt``
is a bare state dict (what both reference loaders hand to ``load_state_dict``) or
``{"state_dict": ...}``; the 270M hyper-parameters are those of the reference's ``MODELS``
table (:data:`MOVQGAN_270M`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ._vq_decoder import Decoder, DecoderConfig, Quantize, check_codes, load_checked_state, read_yaml

__all__ = ["MoVQGANConfig", "MOVQGAN_270M", "MoVQGANDecoder", "load_movqgan_decoder", "find_movqgan"]

#: file names the loader looks for (the reference's ``lumina_mgpt/movqgan/270M/movqgan_270M.ckpt``)
CHECKPOINT_NAME = "movqgan_270M.ckpt"
#: optional config beside it (the MoVQGAN repo's ``configs/movqgan_270M.yaml`` layout, or flat keys)
CONFIG_NAME = "movqgan.yaml"


@dataclass
class MoVQGANConfig(DecoderConfig):
    """The MoVQGAN keys the decoder needs (``model.params.ddconfig`` + ``n_embed``, ``embed_dim``).

    Attributes:
        ch: base channels; ch_mult: per-level multipliers; num_res_blocks: ResnetBlocks per level
            (the decoder uses ``num_res_blocks + 1``); attn_resolutions: feature-map sides (for a
            ``resolution`` input) that get attention; z_channels: decoder input channels;
        embed_dim: codebook vector size (the SpatialNorm condition); n_embed: codebook size V;
        resolution: nominal image side (only places the attention blocks); out_ch: 3.
    """

    kind = "MoVQGAN"

    ch: int = 256
    ch_mult: list[int] = field(default_factory=lambda: [1, 2, 2, 4])
    num_res_blocks: int = 2
    attn_resolutions: list[int] = field(default_factory=lambda: [32])
    z_channels: int = 4
    embed_dim: int = 4
    n_embed: int = 16384
    resolution: int = 256
    out_ch: int = 3


#: the 270M model Lumina-mGPT 2.0 uses (the reference's ``MODELS["270M"]``)
MOVQGAN_270M = MoVQGANConfig()


class _SpatialNorm(nn.Module):
    """``GroupNorm(f) * conv_y(zq') + conv_b(zq')``, ``zq'`` = ``zq`` resized (nearest) to ``f`` (MoVQ eq. 3)."""

    def __init__(self, channels: int, zq_channels: int):
        super().__init__()
        self.norm_layer = nn.GroupNorm(num_groups=32, num_channels=channels, eps=1e-6, affine=True)
        self.conv_y = nn.Conv2d(zq_channels, channels, 1)
        self.conv_b = nn.Conv2d(zq_channels, channels, 1)

    def forward(self, f: torch.Tensor, zq: torch.Tensor) -> torch.Tensor:
        zq = F.interpolate(zq, size=f.shape[-2:], mode="nearest")
        return self.norm_layer(f) * self.conv_y(zq) + self.conv_b(zq)


class MoVQGANDecoder(nn.Module):
    """Codebook lookup + ``post_quant_conv`` + the spatially normalised decoder: codes ``[B, rows, cols]`` -> RGB.

    Args:
        config: a :class:`MoVQGANConfig` (default :data:`MOVQGAN_270M`).
    """

    def __init__(self, config: MoVQGANConfig | None = None):
        super().__init__()
        self.config = config = config or MoVQGANConfig()
        self.quantize = Quantize(config.n_embed, config.embed_dim)
        self.post_quant_conv = nn.Conv2d(config.embed_dim, config.z_channels, 1)
        self.decoder = Decoder(config, lambda channels: _SpatialNorm(channels, config.embed_dim))

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codebook ids ``[B, rows, cols]`` int64 -> images ``[B, 3, rows*f, cols*f]`` float32 in [-1, 1].

        ``f`` = :attr:`MoVQGANConfig.downsampling`. Clamped to [-1, 1], as Lumina-mGPT 2.0's
        ``show_images`` does when it makes 8-bit pixels (``(x + 1) * 127.5``, clamped to 0..255).

        Raises:
            ValueError: codes not 3-D or outside ``0 .. n_embed - 1``.
        """
        check_codes(codes, self.config.n_embed)
        weight = self.post_quant_conv.weight
        zq = self.quantize.embedding(codes.to(weight.device)).permute(0, 3, 1, 2).to(weight.dtype)
        pixels = self.decoder(self.post_quant_conv(zq), zq)
        return pixels.float().clamp(-1.0, 1.0)


def load_movqgan_decoder(ckpt_path: str | os.PathLike, config: MoVQGANConfig | str | os.PathLike | None = None,
                         device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> MoVQGANDecoder:
    """Build the decoder and load ``movqgan_270M.ckpt`` (encoder, EMA and loss keys are ignored).

    Args:
        ckpt_path: a ``torch.load(..., weights_only=True)``-able file: a state dict or ``{"state_dict": ...}``.
        config: a :class:`MoVQGANConfig`, a YAML file (MoVQGAN's ``configs/*.yaml`` or flat keys),
            or None: ``movqgan.yaml`` beside the checkpoint when present, else :data:`MOVQGAN_270M`.

    Raises:
        ValueError: a missing file, or decoder weights missing / of other shapes than the config's.
    """
    ckpt_path = str(ckpt_path)
    if not os.path.isfile(ckpt_path):
        raise ValueError(f"MoVQGAN checkpoint {ckpt_path!r} does not exist; Lumina-mGPT 2.0 decodes with "
                         f"{CHECKPOINT_NAME} (SberAI's MoVQGAN, ai-forever/MoVQGAN)")
    if config is None:
        beside = os.path.join(os.path.dirname(ckpt_path), CONFIG_NAME)
        config = beside if os.path.isfile(beside) else MoVQGANConfig()
    if not isinstance(config, MoVQGANConfig):
        if not os.path.isfile(config):
            raise ValueError(f"MoVQGAN config {str(config)!r} does not exist")
        config = MoVQGANConfig.from_dict(read_yaml(config, f"MoVQGAN's {CONFIG_NAME}"))
    model = MoVQGANDecoder(config)
    load_checked_state(model, ckpt_path, what="MoVQGAN decoder",
                       missing_hint=f" (config ch={config.ch}, ch_mult={config.ch_mult}, num_res_blocks="
                                    f"{config.num_res_blocks}; another model size needs its {CONFIG_NAME} beside the file)",
                       shape_hint=f"from the config (ch={config.ch}, ch_mult={config.ch_mult}, n_embed={config.n_embed})",
                       shape_advice=f"; put the model's {CONFIG_NAME} beside the file")
    model.source = str(ckpt_path)  #: the file read, for messages
    return model.to(device=device, dtype=dtype).eval()


def find_movqgan(folder: str | os.PathLike, vqgan_dir: str | os.PathLike | None = None) -> str | None:
    """The MoVQGAN checkpoint to use: ``vqgan_dir/movqgan_270M.ckpt`` when given (it must exist),
    else the first of ``folder``, ``folder/movqgan``, ``folder/movqgan/270M`` holding it, else None.

    Raises:
        ValueError: ``vqgan_dir`` given without the file.
    """
    if vqgan_dir is not None:
        path = os.path.join(str(vqgan_dir), CHECKPOINT_NAME)
        if not os.path.isfile(path):
            raise ValueError(f"--vqgan {str(vqgan_dir)!r} holds no {CHECKPOINT_NAME} (Lumina-mGPT 2.0's MoVQGAN)")
        return path
    for sub in ("", "movqgan", os.path.join("movqgan", "270M")):
        path = os.path.join(str(folder), sub, CHECKPOINT_NAME)
        if os.path.isfile(path):
            return path
    return None
