"""The taming-style VQ decoder that Chameleon's VQGAN and MoVQGAN share (codes -> pixels).

Both decoders are the taming-transformers decoder (Esser et al., 2021, "Taming Transformers
for High-Resolution Image Synthesis"): ``conv_in``, a middle of ResnetBlock / AttnBlock /
ResnetBlock, then per level (coarsest first) ``num_res_blocks + 1`` ResnetBlocks (each followed
by an AttnBlock at the attention resolutions) and a nearest-neighbour 2x upsample, then
``norm_out``, SiLU and ``conv_out``. They differ only in their normalisation: Chameleon's is a
plain GroupNorm (32 groups, eps 1e-6), MoVQGAN's a GroupNorm modulated by the quantised latent
(MoVQ, eq. 3), which every block then receives as an extra input. So the blocks here take a
*norm factory* (channels -> module) and pass their extra inputs (``*cond``: nothing for
Chameleon, ``zq`` for MoVQGAN) on to every norm. Parameter names are the checkpoints' own
(``norm1``, ``conv1``, ``norm2``, ``conv2``, ``nin_shortcut``; ``norm``, ``q``, ``k``, ``v``,
``proj_out``; ``upsample.conv``; ``mid.block_1`` / ``attn_1`` / ``block_2``; ``up.{level}``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

#: channels -> a norm module called as ``norm(x, *cond)``
NormFactory = Callable[[int], nn.Module]



@dataclass
class DecoderConfig:
    """The taming keys a VQ decoder needs (``model.params.ddconfig`` + ``n_embed``, ``embed_dim``);
    :class:`~csdgen.models.chameleon_vqgan.VQGANConfig` and :class:`~csdgen.models.movqgan.MoVQGANConfig`
    give each family's defaults (these are Chameleon's VQGAN's).

    Attributes:
        ch: base channels; ch_mult: per-level multipliers (levels = len(ch_mult)); num_res_blocks:
            ResnetBlocks per level (the decoder uses ``num_res_blocks + 1``); attn_resolutions:
            feature-map sides (for a ``resolution`` input) that get attention; z_channels: decoder
            input channels; embed_dim: codebook vector size; n_embed: codebook size V;
        resolution: nominal image side (only places the attention blocks); out_ch: 3 (RGB).
    """

    #: the family's name in error messages
    kind: ClassVar[str] = "VQ decoder"

    ch: int = 128
    ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    num_res_blocks: int = 2
    attn_resolutions: list[int] = field(default_factory=list)
    z_channels: int = 256
    embed_dim: int = 256
    n_embed: int = 8192
    resolution: int = 512
    out_ch: int = 3

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        """Read the taming YAML layout (``model.params.ddconfig``) or a flat dict of the same keys.

        Raises:
            ValueError: a required key is missing (naming them).
        """
        model = data.get("model")
        params = model.get("params", data) if isinstance(model, dict) else data
        dd = dict(params.get("ddconfig", params))
        merged = {**dd, "n_embed": params.get("n_embed"), "embed_dim": params.get("embed_dim")}
        needed = ("ch", "ch_mult", "num_res_blocks", "z_channels", "n_embed", "embed_dim", "resolution")
        missing = [k for k in needed if merged.get(k) is None]
        if missing:
            raise ValueError(f"{cls.kind} config lacks {', '.join(missing)}; needed: {', '.join(needed)}, attn_resolutions")
        return cls(ch=int(merged["ch"]), ch_mult=[int(m) for m in merged["ch_mult"]],
                   num_res_blocks=int(merged["num_res_blocks"]),
                   attn_resolutions=[int(r) for r in merged.get("attn_resolutions") or []],
                   z_channels=int(merged["z_channels"]), embed_dim=int(merged["embed_dim"]),
                   n_embed=int(merged["n_embed"]), resolution=int(merged["resolution"]),
                   out_ch=int(merged.get("out_ch", 3)))

    @property
    def downsampling(self) -> int:
        """Pixels per code along each side: ``2 ** (len(ch_mult) - 1)`` (16 for Chameleon's VQGAN, 8 for MoVQGAN)."""
        return 2 ** (len(self.ch_mult) - 1)


class ResnetBlock(nn.Module):
    """taming ResnetBlock without the time embedding: ``x + conv2(silu(norm2(conv1(silu(norm1(x))))))``
    (the shortcut through a 1x1 ``nin_shortcut`` when the channel count changes)."""

    def __init__(self, in_channels: int, out_channels: int, norm: NormFactory):
        super().__init__()
        self.norm1 = norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor, *cond: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x, *cond)))
        h = self.conv2(F.silu(self.norm2(h, *cond)))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class AttnBlock(nn.Module):
    """taming AttnBlock: single-head self-attention over the feature map with 1x1 convolutions."""

    def __init__(self, channels: int, norm: NormFactory):
        super().__init__()
        self.norm = norm(channels)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(channels, channels, 1) for _ in range(4))

    def forward(self, x: torch.Tensor, *cond: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = self.norm(x, *cond)
        q, k, v = (m(y).reshape(b, c, h * w).transpose(1, 2) for m in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]  # scale c ** -0.5
        return x + self.proj_out(out.transpose(1, 2).reshape(b, c, h, w))


class Upsample(nn.Module):
    """Nearest-neighbour 2x upsampling then a 3x3 convolution."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Decoder(nn.Module):
    """The taming decoder (``give_pre_end=False``, ``tanh_out=False``, vanilla attention).

    Args:
        cfg: a config with ``ch``, ``ch_mult``, ``num_res_blocks``, ``attn_resolutions``,
            ``resolution``, ``z_channels`` and ``out_ch`` (:class:`~csdgen.models.chameleon_vqgan.VQGANConfig`,
            :class:`~csdgen.models.movqgan.MoVQGANConfig`).
        norm: the norm factory (module docstring).

    ``forward(z [B, z_channels, rows, cols], *cond)`` -> ``[B, out_ch, rows * f, cols * f]``,
    ``f = 2 ** (len(ch_mult) - 1)``.
    """

    def __init__(self, cfg: Any, norm: NormFactory):
        super().__init__()
        levels = len(cfg.ch_mult)
        block_in = cfg.ch * cfg.ch_mult[-1]
        res = cfg.resolution // 2 ** (levels - 1)
        self.conv_in = nn.Conv2d(cfg.z_channels, block_in, 3, padding=1)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(block_in, block_in, norm)
        self.mid.attn_1 = AttnBlock(block_in, norm)
        self.mid.block_2 = ResnetBlock(block_in, block_in, norm)
        ups = []
        for level in reversed(range(levels)):
            up = nn.Module()
            up.block, up.attn = nn.ModuleList(), nn.ModuleList()
            block_out = cfg.ch * cfg.ch_mult[level]
            for _ in range(cfg.num_res_blocks + 1):
                up.block.append(ResnetBlock(block_in, block_out, norm))
                block_in = block_out
                if res in cfg.attn_resolutions:
                    up.attn.append(AttnBlock(block_in, norm))
            if level != 0:
                up.upsample = Upsample(block_in)
                res *= 2
            ups.insert(0, up)
        self.up = nn.ModuleList(ups)
        self.norm_out = norm(block_in)
        self.conv_out = nn.Conv2d(block_in, cfg.out_ch, 3, padding=1)

    def forward(self, z: torch.Tensor, *cond: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h, *cond), *cond), *cond)
        for level in reversed(range(len(self.up))):
            up = self.up[level]
            for i, block in enumerate(up.block):
                h = block(h, *cond)
                if len(up.attn):
                    h = up.attn[i](h, *cond)
            if hasattr(up, "upsample"):
                h = up.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h, *cond)))


class Quantize(nn.Module):
    """The codebook (``quantize.embedding.weight`` ``[n_embed, embed_dim]``)."""

    def __init__(self, n_embed: int, embed_dim: int):
        super().__init__()
        self.embedding = nn.Embedding(n_embed, embed_dim)


def check_codes(codes: torch.Tensor, n_embed: int) -> None:
    """Raise ValueError unless ``codes`` is ``[B, rows, cols]`` with ids in ``0 .. n_embed - 1``."""
    if codes.ndim != 3:
        raise ValueError(f"codes of shape {tuple(codes.shape)}: expected [B, rows, cols]")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= n_embed):
        raise ValueError(f"codes outside 0..{n_embed - 1}")


def read_yaml(path: Any, what: str) -> dict:
    """A decoder's YAML config as a dict; a file that is no YAML mapping is one ValueError line naming it.

    Args:
        what: what the file should be, for the message (``"Chameleon's vqgan.yaml"``).
    """
    import yaml  # a dependency of transformers

    try:
        with open(path, encoding="utf-8") as f:
            value = yaml.safe_load(f)
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
        raise ValueError(f"{str(path)!r} is not readable YAML{at}; expected {what}") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{str(path)!r} holds a {type(value).__name__}, expected {what} (a YAML mapping)")
    return value


def load_checkpoint_file(path: Any) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU; a file torch cannot read (cut short, not a checkpoint)
    is one ValueError line naming it instead of torch's multi-line error from its zip reader."""
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:  # torch's weights_only unpickler: garbage, or objects beside the tensors
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].split(". ")[0]
        raise ValueError(f"{str(path)!r} is not a readable PyTorch checkpoint (torch.load with weights_only=True: "
                         f"{first}); copy or download it again") from None
    except (RuntimeError, EOFError, ValueError, OSError):
        raise ValueError(f"{str(path)!r} is not a readable PyTorch checkpoint (cut short, or not a torch.save file); "
                         f"copy or download it again") from None


def decoder_state(raw: Any, path: str) -> dict[str, torch.Tensor]:
    """The decoder's tensors (``decoder.*``, ``post_quant_conv.*``, ``quantize.embedding.*``) of a
    loaded checkpoint: a bare state dict or ``{"state_dict": ...}``. Raises ValueError otherwise."""
    state = raw.get("state_dict", raw) if isinstance(raw, dict) else None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: not a state dict nor {{'state_dict': ...}}")
    keep = ("decoder.", "post_quant_conv.", "quantize.embedding.")
    return {k: v for k, v in state.items() if k.startswith(keep)}


def load_checked_state(model: nn.Module, ckpt_path: str, *, what: str = "decoder", missing_hint: str = "",
                       shape_hint: str = "", shape_advice: str = "") -> None:
    """Load the decoder weights of the checkpoint ``ckpt_path`` (:func:`decoder_state`) into ``model``,
    every parameter present and of its shape.

    Raises:
        ValueError: ``"PATH: N WHAT weights missing, e.g. [...]MISSING_HINT"`` or ``"PATH: shapes differ
            SHAPE_HINT for [...]SHAPE_ADVICE"``.
    """
    state = decoder_state(load_checkpoint_file(ckpt_path), ckpt_path)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ValueError(f"{ckpt_path}: {len(missing)} {what} weights missing, e.g. {missing[:3]}{missing_hint}")
    bad = [k for k in expected if tuple(state[k].shape) != tuple(expected[k].shape)]
    if bad:
        raise ValueError(f"{ckpt_path}: shapes differ{' ' + shape_hint if shape_hint else ''} for {bad[:3]}{shape_advice}")
    model.load_state_dict({k: state[k] for k in expected})
