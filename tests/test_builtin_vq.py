"""Fast shape / round-trip checks of the built-in VQ tokenizer on random weights."""

import torch

from csdgen.builtin.vq import VQConfig, VQTokenizer


V = VQConfig().codebook_size  # the emoji model's 1024


def test_vq_defaults_are_the_shipped_models():
    import json

    from csdgen.builtin import DEFAULT_WEIGHTS_DIR

    assert VQConfig().to_dict() == json.loads((DEFAULT_WEIGHTS_DIR / "config.json").read_text())["vq"]


def test_vq_encode_decode_shapes():
    torch.manual_seed(0)
    vq = VQTokenizer(VQConfig()).eval()
    images = torch.rand(2, 3, 64, 64) * 2 - 1
    codes = vq.encode(images)
    assert codes.shape == (2, 16, 16) and codes.dtype == torch.long
    assert int(codes.min()) >= 0 and int(codes.max()) < V
    out = vq.decode(codes)
    assert out.shape == (2, 3, 64, 64) and out.dtype == torch.float32
    assert float(out.abs().max()) <= 1.0
    assert torch.equal(vq.decode(codes.flatten(1)), out)     # [B, 256] accepted too
    assert vq.embeddings.shape == (V, 32)
    assert torch.allclose(vq.embeddings.norm(dim=-1), torch.ones(V), atol=1e-5)


def test_vq_codes_round_trip_through_codebook():
    """Encoding a decoded code grid's latents picks the same codes (cosine lookup)."""
    torch.manual_seed(0)
    vq = VQTokenizer(VQConfig()).eval()
    codes = torch.randint(0, V, (3, 16, 16))
    z_q = vq._lookup(codes).permute(0, 2, 3, 1)
    assert torch.equal(vq._nearest(z_q), codes)


def test_vq_training_forward_backward():
    torch.manual_seed(0)
    vq = VQTokenizer(VQConfig()).train()
    images = torch.rand(2, 3, 64, 64) * 2 - 1
    recon, vq_loss, codes, z = vq(images)
    assert recon.shape == images.shape and codes.shape == (2, 16, 16) and z.shape == (2 * 256, 32)  # B * 256 encoder outputs
    (torch.nn.functional.mse_loss(recon, images) + vq_loss).backward()
    assert vq.codebook.weight.grad is not None and vq.encoder[0].weight.grad is not None
