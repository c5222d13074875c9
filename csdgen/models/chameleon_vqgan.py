"""The decoder half of Chameleon's VQGAN (codes -> pixels), which transformers does not ship.

``transformers.ChameleonVQVAE`` holds only the encoder and the quantizer, so it cannot turn
image tokens back into pixels. Chameleon's original release (``tokenizer/vqgan.yaml`` and
``tokenizer/vqgan.ckpt``, also used by Lumina-mGPT and Anole) decodes with the taming-transformers
VQGAN (Esser et al., 2021, "Taming Transformers for High-Resolution Image Synthesis"). No
maintained PyPI package provides it: ``taming-transformers`` 0.0.1 and
``taming-transformers-rom1504`` 0.0.6 are 2021 snapshots that pull in pytorch-lightning and
torchvision. So the architecture is written here, decoder only, following
``chameleon/inference/vqgan.py`` of facebookresearch/chameleon (itself taming-transformers'
``taming/modules/diffusionmodules/model.py``). Parameter names match that checkpoint's state
dict: ``quantize.embedding.weight``, ``post_quant_conv.*``, ``decoder.conv_in.*``,
``decoder.mid.block_1.*``, ``decoder.mid.attn_1.*``, ``decoder.mid.block_2.*``,
``decoder.up.{level}.block.{i}.*``, ``decoder.up.{level}.attn.{i}.*``,
``decoder.up.{level}.upsample.conv.*``, ``decoder.norm_out.*``, ``decoder.conv_out.*``.

Assumed, not checked against the real file (no download possible here): the released
``vqgan.yaml`` has the taming layout ``model.params.{ddconfig: {ch, out_ch, ch_mult,
num_res_blocks, attn_resolutions, z_channels, resolution, in_channels, ...}, n_embed,
embed_dim}`` with ch 128, ch_mult [1, 1, 2, 2, 4], num_res_blocks 2, attn_resolutions [],
z_channels 256, embed_dim 256, n_embed 8192, resolution 512 (the values transformers'
``ChameleonVQVAEConfig`` defaults to); ``vqgan.ckpt`` is ``{"state_dict": {...}}`` (what the
original loader reads) or a bare state dict. Downsampling factor ``2 ** (len(ch_mult) - 1)``:
16 for the real model, so ``rows x cols`` codes decode to ``16 rows x 16 cols`` pixels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from ._vq_decoder import Decoder, DecoderConfig, Quantize, check_codes, load_checked_state, read_yaml

__all__ = ["VQGANConfig", "ChameleonVQGANDecoder", "load_vqgan_decoder", "vqgan_files"]


@dataclass
class VQGANConfig(DecoderConfig):
    """The taming VQGAN keys the decoder needs (``vqgan.yaml``: ``model.params.ddconfig`` + two more).

    Attributes:
        ch: base channel count; ch_mult: per-level multipliers (levels = len(ch_mult)).
        num_res_blocks: ResnetBlocks per level (the decoder uses ``num_res_blocks + 1``).
        attn_resolutions: feature-map sizes (for a ``resolution`` input) that get attention.
        z_channels: latent channels; embed_dim: codebook vector size; n_embed: codebook size V.
        resolution: nominal image side (only used to place attention blocks); out_ch: 3 (RGB).
    """

    kind = "VQGAN"  # the defaults are Chameleon's (those of DecoderConfig)



def _norm(channels: int) -> nn.GroupNorm:
    """Chameleon's norm: GroupNorm, 32 groups, eps 1e-6 (called with the feature map alone)."""
    return nn.GroupNorm(num_groups=32, num_channels=channels, eps=1e-6, affine=True)


class ChameleonVQGANDecoder(nn.Module):
    """Codebook lookup + ``post_quant_conv`` + taming decoder: codes ``[B, rows, cols]`` -> RGB.

    Args:
        config: a :class:`VQGANConfig`.
    """

    def __init__(self, config: VQGANConfig):
        super().__init__()
        self.config = config
        self.quantize = Quantize(config.n_embed, config.embed_dim)
        self.post_quant_conv = nn.Conv2d(config.embed_dim, config.z_channels, 1)
        self.decoder = Decoder(config, _norm)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codebook ids ``[B, rows, cols]`` int64 -> images ``[B, 3, rows*f, cols*f]`` float32 in [-1, 1].

        ``f`` = :attr:`VQGANConfig.downsampling`. Clamped to [-1, 1] as Chameleon's
        ``_pil_from_chw_tensor`` does before making a PIL image.

        Raises:
            ValueError: codes not 3-D or outside ``0 .. n_embed - 1``.
        """
        check_codes(codes, self.config.n_embed)
        z = self.quantize.embedding(codes.to(self.post_quant_conv.weight.device)).permute(0, 3, 1, 2)
        pixels = self.decoder(self.post_quant_conv(z.to(self.post_quant_conv.weight.dtype)))
        return pixels.float().clamp(-1.0, 1.0)


def vqgan_files(path: str | os.PathLike) -> tuple[str, str]:
    """``(vqgan.yaml, vqgan.ckpt)`` of a VQGAN given as a folder or one of its two files.

    Accepted: a folder holding ``vqgan.yaml`` and ``vqgan.ckpt`` (Chameleon's ``tokenizer/``
    folder), a folder whose ``tokenizer/`` holds them (Chameleon's release folder), the
    ``vqgan.ckpt`` file (``vqgan.yaml`` beside it) or the ``vqgan.yaml`` file (``vqgan.ckpt``
    beside it).

    Raises:
        ValueError: naming the path and what is allowed (one line).
    """
    path = os.fspath(path)
    allowed = ("allowed: a folder holding vqgan.yaml and vqgan.ckpt (Chameleon's tokenizer/ folder), or its "
               "vqgan.ckpt with vqgan.yaml beside it")
    if os.path.isdir(path):
        for folder in (path, os.path.join(path, "tokenizer")):
            pair = os.path.join(folder, "vqgan.yaml"), os.path.join(folder, "vqgan.ckpt")
            if all(os.path.isfile(f) for f in pair):
                return pair
        raise ValueError(f"VQGAN {path!r}: the folder holds no vqgan.yaml + vqgan.ckpt (nor does its tokenizer/); {allowed}")
    if os.path.isfile(path):
        folder, name = os.path.split(path)
        if name.endswith((".yaml", ".yml")):
            pair = path, os.path.join(folder, "vqgan.ckpt")
        else:
            pair = os.path.join(folder, "vqgan.yaml"), path
        missing = [f for f in pair if not os.path.isfile(f)]
        if missing:
            raise ValueError(f"VQGAN {path!r}: {missing[0]!r} does not exist; {allowed}")
        return pair
    raise ValueError(f"VQGAN {path!r} does not exist; {allowed}")


def load_vqgan_decoder(config_path: str, ckpt_path: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> ChameleonVQGANDecoder:
    """Build the decoder from ``vqgan.yaml`` and load ``vqgan.ckpt`` (encoder/loss keys are ignored).

    Args:
        config_path: YAML (taming layout or flat keys, see :class:`VQGANConfig`).
        ckpt_path: ``torch.load(..., weights_only=True)``-able file: a state dict or ``{"state_dict": ...}``.

    Raises:
        ValueError: a file is missing, or decoder weights are missing / of the wrong shape.
    """
    for p in (config_path, ckpt_path):
        if not os.path.isfile(p):
            raise ValueError(f"VQGAN file {p!r} does not exist; need vqgan.yaml and vqgan.ckpt (Chameleon's tokenizer/ folder)")
    config = VQGANConfig.from_dict(read_yaml(config_path, "Chameleon's vqgan.yaml"))
    model = ChameleonVQGANDecoder(config)
    load_checked_state(model, ckpt_path, shape_hint=f"from {config_path}")
    model.source = str(ckpt_path)  #: the file read, for messages
    return model.to(device=device, dtype=dtype).eval()
