"""bfloat16 runs of every family's tiny checkpoint: they complete with sane step compression, and the
acceptance arithmetic stays float32 whatever the model's dtype.

Every family's reference code runs bfloat16 on a GPU (csdgen.models.dtypes.FAMILY_GPU_DTYPES), so
this is the dtype users decode in. The tests are marked ``device``: ``CSDGEN_TEST_DEVICE=cuda
python -m pytest -m device`` builds the models on the GPU (tests/conftest.py).
"""

import math

import pytest
import torch

import csdgen
from csdgen.models.auto import load_model

pytestmark = pytest.mark.device


def _janus(folder):
    from test_models_janus import PROMPTS, build_checkpoint

    return build_checkpoint(folder), {}, PROMPTS[:1]


def _emu3(folder):
    from test_models_emu3 import HEIGHT, NEGATIVE, PROMPTS, WIDTH, build_checkpoint

    return build_checkpoint(folder), dict(height=HEIGHT, width=WIDTH, negative_prompt=NEGATIVE, positive_prompt=""), PROMPTS[:1]


def _chameleon(layout):
    def build(folder):
        from test_models_chameleon import build_checkpoint

        size = dict(height=12, width=16) if layout == "lumina" else {}
        return build_checkpoint(str(folder)), dict(layout=layout, **size), [" ".join(["red", "cat"])]
    return build


def _lumina2(folder):
    from test_models_lumina2 import HEIGHT, WIDTH, build_checkpoint

    return build_checkpoint(folder), dict(height=HEIGHT, width=WIDTH), ["red cat"]


def _glm_image(folder):
    from test_models_glm_image import PROMPTS, build_checkpoint

    # a 1 x 2 preview instead of the family's 16 x 16 keeps the image at 4 tokens (GlmImageModel's own option)
    return build_checkpoint(folder), dict(height=32, width=64, preview=(1, 2)), PROMPTS[:1]


def _liquid(folder):
    from test_models_liquid import PROMPTS, build_checkpoint

    return build_checkpoint(folder, codebook=64, resolution=8), {}, PROMPTS[:1]


#: family -> builder of (checkpoint folder, load_model size/layout options, prompts)
BUILDERS = {"janus": _janus, "emu3": _emu3, "lumina-mgpt": _chameleon("lumina"), "anole": _chameleon("anole"),
            "lumina-mgpt-2": _lumina2, "glm-image": _glm_image, "liquid": _liquid}


@pytest.fixture(scope="module")
def bf16_models(tmp_path_factory, test_device):
    """Each family's tiny checkpoint loaded in bfloat16 on the test device (built on first use)."""
    cache = {}

    def get(family):
        if family not in cache:
            folder, options, prompts = BUILDERS[family](tmp_path_factory.mktemp(family.replace("-", "_")))
            if "preview" in options:
                from csdgen.models.glm_image import GlmImageModel

                model = GlmImageModel.from_pretrained(folder, dtype=torch.bfloat16, device=test_device, **options)
            else:
                model = load_model(str(folder), dtype="bfloat16", device=test_device, **options)
            cache[family] = model, prompts
        return cache[family]
    return get


@pytest.mark.parametrize("family", list(BUILDERS))
def test_bfloat16_run_of_every_family_completes_with_sane_step_compression(bf16_models, family):
    model, prompts = bf16_models(family)
    assert model.dtype == torch.bfloat16
    results = {method: csdgen.generate(model, prompts, method=method, window=8, seed=1) for method in ("ar", "sjd", "csd")}
    assert results["ar"].step_compression == 1.0
    for method, out in results.items():
        assert out.tokens.shape == (len(prompts), model.num_image_tokens)
        assert int(out.tokens.min()) >= 0 and int(out.tokens.max()) < model.codebook_size
        assert math.isfinite(out.step_compression) and all(bool(torch.isfinite(s.entropy).all()) for s in out.images)
        if method != "ar":
            assert out.step_compression > 1.0, (method, out.step_compression)


@pytest.mark.parametrize("family", ["llama", "janus"])
def test_acceptance_arithmetic_is_float32_for_a_bfloat16_model(bf16_models, cached_model, test_device, monkeypatch, family):
    """The probabilities the acceptance rules see (drafts p and targets q at every verify) are float32
    though the model computes in bfloat16: the class-conditional Llama hands over bfloat16 logits
    (sampling.target_probs promotes them), Janus's adapter float32 ones."""
    import csdgen.engine.loop as loop
    from conftest import on_device

    seen = []
    verify = loop.verify

    def recording(rule, refresh, draft_tokens, draft_probs, target_probs, widths, uniforms, **kwargs):
        seen.append((draft_probs.dtype, target_probs.dtype))
        return verify(rule, refresh, draft_tokens, draft_probs, target_probs, widths, uniforms, **kwargs)

    monkeypatch.setattr(loop, "verify", recording)
    if family == "llama":
        model, prompts = on_device(cached_model, test_device, torch.bfloat16), [0, 3]
        session = model.start(prompts, None, False)
        assert session.prefill().cond.dtype == torch.bfloat16  # what the rules would see without the promotion
    else:
        model, prompts = bf16_models(family)
        assert model.dtype == torch.bfloat16
    for method in ("sjd", "csd"):
        csdgen.generate(model, prompts, method=method, window=8, seed=0)
    assert seen and set(seen) == {(torch.float32, torch.float32)}, set(seen)


def test_the_builders_cover_every_family():
    from csdgen.models.auto import FAMILIES

    assert set(BUILDERS) == set(FAMILIES)
