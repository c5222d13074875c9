"""The MoVQGAN decoder (csdgen/models/movqgan.py) against a reference computation, on random weights.

The reference below is written independently of the module: a plain function that walks the
state dict by the released parameter names (MoVQGAN's ``MOVQ`` / ``MOVQDecoder``) and computes
every step with elementary tensor operations (GroupNorm by hand, nearest resizing by index
arithmetic, attention as explicit matrix products). The tiny configuration keeps MoVQGAN's
structure: two levels (downsampling 2), a channel change (``nin_shortcut``), attention at the
lowest level, ``embed_dim`` 4 codebook vectors conditioning every norm.

When ``CSDGEN_LUMINA2_REPO`` names a git directory of Alpha-VLLM/Lumina-mGPT-2.0 (the search
tool's fetch gives one), the decoder is also compared with that repository's own
``MOVQDecoder``, imported from a temporary copy (it needs torch and numpy only).
"""

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import yaml

from csdgen.models.movqgan import MOVQGAN_270M, MoVQGANConfig, MoVQGANDecoder, find_movqgan, load_movqgan_decoder

TINY = {"model": {"params": {"embed_dim": 4, "n_embed": 16, "ddconfig": {
    "double_z": False, "z_channels": 4, "resolution": 8, "in_channels": 3, "out_ch": 3, "ch": 32, "ch_mult": [1, 2],
    "num_res_blocks": 1, "attn_resolutions": [4], "dropout": 0.0}}}}


def random_decoder(seed: int = 0) -> MoVQGANDecoder:
    """The tiny decoder with every parameter random (norm gains around 1, biases around 0)."""
    torch.manual_seed(seed)
    model = MoVQGANDecoder(MoVQGANConfig.from_dict(TINY))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_((1 + 0.2 * torch.randn_like(p)) if name.endswith("norm_layer.weight") else 0.2 * torch.randn_like(p))
    return model.eval()


# -- the reference computation ------------------------------------------------------------------


def group_norm(x, weight, bias, groups=32, eps=1e-6):
    b, c, h, w = x.shape
    g = x.reshape(b, groups, c // groups * h * w)
    mean = g.mean(-1, keepdim=True)
    var = ((g - mean) ** 2).mean(-1, keepdim=True)
    return ((g - mean) / torch.sqrt(var + eps)).reshape(b, c, h, w) * weight[None, :, None, None] + bias[None, :, None, None]


def nearest(x, size):
    rows = (torch.arange(size[0]) * x.shape[2] // size[0]).long()
    cols = (torch.arange(size[1]) * x.shape[3] // size[1]).long()
    return x[:, :, rows][:, :, :, cols]


def conv(s, name, x, padding):
    return F.conv2d(x, s[name + ".weight"], s[name + ".bias"], padding=padding)


def spatial_norm(s, name, f, zq):
    z = nearest(zq, f.shape[-2:])
    normed = group_norm(f, s[name + ".norm_layer.weight"], s[name + ".norm_layer.bias"])
    return normed * conv(s, name + ".conv_y", z, 0) + conv(s, name + ".conv_b", z, 0)


def silu(x):
    return x * torch.sigmoid(x)


def resnet(s, name, x, zq):
    h = conv(s, name + ".conv1", silu(spatial_norm(s, name + ".norm1", x, zq)), 1)
    h = conv(s, name + ".conv2", silu(spatial_norm(s, name + ".norm2", h, zq)), 1)
    shortcut = conv(s, name + ".nin_shortcut", x, 0) if name + ".nin_shortcut.weight" in s else x
    return shortcut + h


def attention(s, name, x, zq):
    b, c, hh, ww = x.shape
    y = spatial_norm(s, name + ".norm", x, zq)
    q, k, v = (conv(s, f"{name}.{m}", y, 0).reshape(b, c, hh * ww) for m in "qkv")
    weights = torch.softmax(torch.bmm(q.transpose(1, 2), k) / math.sqrt(c), dim=2)  # [b, query, key]
    out = torch.bmm(v, weights.transpose(1, 2)).reshape(b, c, hh, ww)
    return x + conv(s, name + ".proj_out", out, 0)


def reference_decode(state, codes, levels, blocks):
    """MOVQ.decode_code written out: embedding, post_quant_conv, MOVQDecoder(z, zq), clamped."""
    s = state
    zq = s["quantize.embedding.weight"][codes].permute(0, 3, 1, 2)
    h = conv(s, "decoder.conv_in", conv(s, "post_quant_conv", zq, 0), 1)
    h = resnet(s, "decoder.mid.block_2", attention(s, "decoder.mid.attn_1", resnet(s, "decoder.mid.block_1", h, zq), zq), zq)
    for level in reversed(range(levels)):
        for i in range(blocks + 1):
            h = resnet(s, f"decoder.up.{level}.block.{i}", h, zq)
            if f"decoder.up.{level}.attn.{i}.q.weight" in s:
                h = attention(s, f"decoder.up.{level}.attn.{i}", h, zq)
        if level != 0:
            h = conv(s, f"decoder.up.{level}.upsample.conv", h.repeat_interleave(2, 2).repeat_interleave(2, 3), 1)
    out = conv(s, "decoder.conv_out", silu(spatial_norm(s, "decoder.norm_out", h, zq)), 1)
    return out.clamp(-1, 1)


# -- tests --------------------------------------------------------------------------------------


def test_decoder_equals_the_reference_computation_on_random_weights():
    model = random_decoder()
    state = model.state_dict()
    assert "decoder.mid.block_1.norm1.conv_y.weight" in state and "decoder.up.1.attn.0.q.weight" in state
    assert "decoder.up.1.block.0.nin_shortcut.weight" not in state and "decoder.up.0.block.0.nin_shortcut.weight" in state
    codes = torch.randint(0, 16, (2, 3, 4), generator=torch.Generator().manual_seed(1))
    images = model.decode(codes)
    assert images.shape == (2, 3, 6, 8) and images.dtype == torch.float32
    assert images.std() > 0.1 and images.abs().max() <= 1.0
    with torch.no_grad():
        expected = reference_decode(state, codes, levels=2, blocks=1)
    torch.testing.assert_close(images, expected, atol=1e-5, rtol=1e-5)


def test_270m_constants_and_downsampling():
    assert (MOVQGAN_270M.ch, MOVQGAN_270M.ch_mult, MOVQGAN_270M.num_res_blocks, MOVQGAN_270M.attn_resolutions) == \
        (256, [1, 2, 2, 4], 2, [32])
    assert (MOVQGAN_270M.z_channels, MOVQGAN_270M.embed_dim, MOVQGAN_270M.n_embed, MOVQGAN_270M.downsampling) == (4, 4, 16384, 8)
    with torch.device("meta"):
        decoder = MoVQGANDecoder()
    assert tuple(decoder.quantize.embedding.weight.shape) == (16384, 4)
    assert tuple(decoder.decoder.conv_in.weight.shape) == (1024, 4, 3, 3)  # ch * ch_mult[-1] from z_channels
    assert len(decoder.decoder.up[3].attn) == 3 and len(decoder.decoder.up[0].attn) == 0  # attention at 32 px of 256


def test_loading_the_released_file_layouts_and_the_errors(tmp_path):
    model = random_decoder(seed=2)
    full = {**model.state_dict(), "encoder.conv_in.weight": torch.zeros(1), "quant_conv.weight": torch.zeros(1),
            "loss.logvar": torch.zeros(1)}
    (tmp_path / "movqgan.yaml").write_text(yaml.safe_dump(TINY))
    codes = torch.randint(0, 16, (1, 2, 2))
    for i, raw in enumerate((full, {"state_dict": full})):  # a bare state dict, or Lightning's wrapper
        path = tmp_path / "movqgan_270M.ckpt"
        torch.save(raw, path)
        loaded = load_movqgan_decoder(path)  # movqgan.yaml beside the file
        assert torch.equal(loaded.decode(codes), model.decode(codes)), i
        assert loaded.source == str(path)  # named when it does not fit a checkpoint
    assert find_movqgan(tmp_path) == str(tmp_path / "movqgan_270M.ckpt")
    (tmp_path / "movqgan" / "270M").mkdir(parents=True)
    other = tmp_path / "other"
    other.mkdir()
    assert find_movqgan(other) is None
    with pytest.raises(ValueError, match="holds no movqgan_270M.ckpt"):
        find_movqgan(other, vqgan_dir=other)
    broken = {k: v for k, v in full.items() if not k.startswith("decoder.conv_out")}
    torch.save(broken, other / "movqgan_270M.ckpt")
    with pytest.raises(ValueError, match="2 MoVQGAN decoder weights missing"):
        load_movqgan_decoder(other / "movqgan_270M.ckpt", config=MoVQGANConfig.from_dict(TINY))
    with pytest.raises(ValueError, match=r"weights missing, .* \(config ch=256, ch_mult=\[1, 2, 2, 4\]"):
        load_movqgan_decoder(tmp_path / "movqgan_270M.ckpt", config=MOVQGAN_270M)
    with pytest.raises(ValueError, match=r"shapes differ from the config \(ch=32, ch_mult=\[1, 2\], n_embed=8\)"):
        load_movqgan_decoder(tmp_path / "movqgan_270M.ckpt", config=MoVQGANConfig(ch=32, ch_mult=[1, 2], num_res_blocks=1,
                                                                                   attn_resolutions=[4], n_embed=8, resolution=8))
    with pytest.raises(ValueError, match="does not exist"):
        load_movqgan_decoder(tmp_path / "nope.ckpt")
    with pytest.raises(ValueError, match="lacks ch, ch_mult"):
        MoVQGANConfig.from_dict({"n_embed": 3})
    with pytest.raises(ValueError, match="codes outside 0..15"):
        model.decode(torch.full((1, 2, 2), 16))


def test_a_cut_or_garbage_decoder_file_is_refused_in_one_line_naming_it(tmp_path):
    """Found by a new-user try-out: a movqgan_270M.ckpt / vqgan.ckpt cut short, or a vqgan.yaml / movqgan.yaml that is
    no YAML, ended in torch's zip-reader or yaml's multi-line traceback; now one ValueError line names the file."""
    from csdgen.models.chameleon_vqgan import ChameleonVQGANDecoder, VQGANConfig, load_vqgan_decoder

    model = random_decoder(seed=2)
    (tmp_path / "movqgan.yaml").write_text(yaml.safe_dump(TINY))
    torch.save(model.state_dict(), tmp_path / "whole.ckpt")
    whole = (tmp_path / "whole.ckpt").read_bytes()
    ckpt = tmp_path / "movqgan_270M.ckpt"
    for data, says in ((whole[: len(whole) // 2], "cut short, or not a torch.save file"), (b"", "cut short"),
                       (b"\x80\x02garbage" * 50, "torch.load with weights_only=True: ")):
        ckpt.write_bytes(data)
        with pytest.raises(ValueError) as info:
            load_movqgan_decoder(ckpt)
        message = str(info.value)
        assert message.startswith(f"{str(ckpt)!r} is not a readable PyTorch checkpoint (") and says in message
        assert message.endswith("; copy or download it again") and "\n" not in message
    ckpt.write_bytes(whole)
    (tmp_path / "movqgan.yaml").write_text("model: [\n")
    with pytest.raises(ValueError, match=r"^'.*movqgan.yaml' is not readable YAML \(line 2, column 1\); expected "
                                         r"MoVQGAN's movqgan.yaml$"):
        load_movqgan_decoder(ckpt)
    (tmp_path / "movqgan.yaml").write_text("- a list\n")
    with pytest.raises(ValueError, match=r"holds a list, expected MoVQGAN's movqgan.yaml \(a YAML mapping\)$"):
        load_movqgan_decoder(ckpt)
    spec = {"model": {"params": {"embed_dim": 8, "n_embed": 16, "ddconfig": {
        "double_z": False, "z_channels": 8, "resolution": 16, "in_channels": 3, "out_ch": 3, "ch": 32,
        "ch_mult": [1, 2], "num_res_blocks": 1, "attn_resolutions": [8], "dropout": 0.0}}}}
    vq = tmp_path / "vq"
    vq.mkdir()
    (vq / "vqgan.yaml").write_text(yaml.safe_dump(spec))
    torch.save({"state_dict": ChameleonVQGANDecoder(VQGANConfig.from_dict(spec)).state_dict()}, vq / "vqgan.ckpt")
    load_vqgan_decoder(str(vq / "vqgan.yaml"), str(vq / "vqgan.ckpt"))
    (vq / "vqgan.ckpt").write_bytes((vq / "vqgan.ckpt").read_bytes()[:2000])
    with pytest.raises(ValueError, match=r"vqgan.ckpt' is not a readable PyTorch checkpoint \(cut short"):
        load_vqgan_decoder(str(vq / "vqgan.yaml"), str(vq / "vqgan.ckpt"))
    (vq / "vqgan.yaml").write_text("model: {params: [\n")
    with pytest.raises(ValueError, match=r"vqgan.yaml' is not readable YAML .*; expected Chameleon's vqgan.yaml$"):
        load_vqgan_decoder(str(vq / "vqgan.yaml"), str(vq / "vqgan.ckpt"))


REPO = os.environ.get("CSDGEN_LUMINA2_REPO")


@pytest.mark.skipif(not REPO, reason="CSDGEN_LUMINA2_REPO (a git dir of Alpha-VLLM/Lumina-mGPT-2.0) not set")
def test_decoder_equals_the_reference_repositorys_own_module(tmp_path):
    source = subprocess.run(["git", f"--git-dir={REPO}", "show", "HEAD:lumina_mgpt/movqgan/modules/vqvae/movq_modules.py"],
                            capture_output=True, text=True, check=True).stdout
    (tmp_path / "peer_movq_modules.py").write_text(source)
    sys.path.insert(0, str(tmp_path))
    try:
        import peer_movq_modules
    finally:
        sys.path.remove(str(tmp_path))
    dd = TINY["model"]["params"]["ddconfig"]
    peer = peer_movq_modules.MOVQDecoder(zq_ch=4, **dd).eval()
    model = random_decoder(seed=3)
    state = model.state_dict()
    peer.load_state_dict({k[len("decoder."):]: v for k, v in state.items() if k.startswith("decoder.")})
    codes = torch.randint(0, 16, (2, 3, 4))
    with torch.no_grad():
        zq = state["quantize.embedding.weight"][codes].permute(0, 3, 1, 2)
        expected = peer(F.conv2d(zq, state["post_quant_conv.weight"], state["post_quant_conv.bias"]), zq).clamp(-1, 1)
    torch.testing.assert_close(model.decode(codes), expected, atol=1e-5, rtol=1e-5)
