"""GLM-Image: tiny random checkpoints in the released diffusers layout, saved and reloaded.

The tiny checkpoint is laid out as ``zai-org/GLM-Image``: ``model_index.json`` (GlmImagePipeline),
``vision_language_encoder/`` (a ``GlmImageForConditionalGeneration`` with the released vocabulary:
168064 text ids, 16512 vision outputs, codes 0..16383, image start/end 16384/16385, ``<sop>`` 167845,
``<eop>`` 167846, ``<|image|>`` 167855, pad ``<|endoftext|>`` 167841 -- GLM-4's ids shifted by the 16512
vision ids -- and the generation_config vLLM-Omni quotes: T 0.9, top-p 0.75, top-k 16512) and
``processor/`` (a ``GlmImageProcessor``: a word-level tokenizer knowing those tokens by name, the
image processor, a chat template that renders the user's text). Only the decoder test adds the
diffusers parts (DiT, VAE, glyph encoder), and skips without diffusers. Small widths (hidden 64,
2 layers), ``lm_head`` scaled up so that greedy decoding is not a tie-break of rounding noise, and
its non-code rows (16384..16511) zeroed so that the reference's argmax over all 16512 outputs
falls on a code, as csdgen's does over the codes.
"""

import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import GenerationConfig, GlmImageConfig, GlmImageForConditionalGeneration, GlmImageProcessor, PreTrainedTokenizerFast
from transformers.models.glm_image.image_processing_pil_glm_image import GlmImageImageProcessorPil

import csdgen
from csdgen import SamplingConfig
from csdgen.models import auto
from csdgen.models.defaults import FAMILY_DEFAULTS
from csdgen.models.glm_image import GlmImageLayout, GlmImageModel, glm_image_memory
from tiny_tokenizer import word_level_tokenizer
from family_law import exact_law
from kv_check import generate_checking_every_iteration
from test_lossless import P_FAIL, P_PASS, SAMPLES, ResampleFromTarget, chi_square_pvalue

SPECIAL = {"<|endoftext|>": 167841, "[gMASK]": 167843, "<sop>": 167845, "<eop>": 167846, "<|image|>": 167855}
BOS, EOS = "<|dit_token_16384|>", "<|dit_token_16385|>"
WORDS = ["red", "cat", "a", "photo", "of", "the", "dog"] + [str(i) for i in range(1, 65)]
TEXT = 16512  # GLM-4's text ids start after the vision ids
CHAT_TEMPLATE = ("{%- for m in messages -%}{%- for item in m.content -%}{%- if item.type == 'text' -%}{{ item.text }}"
                 "{%- endif -%}{%- endfor -%}{%- endfor -%}")
PROMPTS = ["red cat", "a photo of the red dog"]
GREEDY = SamplingConfig(temperature=0)
SIZE = 64  # 2 x 2 target grid, 16 x 16 preview: N = 260


def word(w: str) -> int:
    return TEXT + WORDS.index(w)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level, with the released ids of the dit tokens and of GLM-4's specials, left padding."""
    vocab = {f"<|dit_token_{i}|>": i for i in range(16512)}
    vocab.update({w: TEXT + i for i, w in enumerate(WORDS)})
    vocab["<unk>"] = TEXT + len(WORDS)
    vocab.update(SPECIAL)
    return word_level_tokenizer(vocab, [BOS, EOS, *SPECIAL], bos_token=BOS, eos_token=EOS, pad_token="<|endoftext|>",
                                image_token="<|image|>", grid_bos_token="<sop>", grid_eos_token="<eop>",
                                padding_side="left")


def tiny_config(codebook: int = 16384, hidden: int = 64) -> GlmImageConfig:
    """Released ids and vocabulary sizes; small widths. Heads of 32 (hidden 64) or 16 (hidden 16) dims, half of
    them rotary (GLM-4's ``partial_rotary_factor`` 0.5), split into temporal/height/width sections."""
    heads, section, inner = (2, [2, 3, 3], 96) if hidden == 64 else (1, [1, 1, 2], 32)
    return GlmImageConfig(
        text_config=dict(vocab_size=168064, vision_vocab_size=16512, hidden_size=hidden, intermediate_size=inner,
                         num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=1, max_position_embeddings=1024,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                          "mrope_section": section}),
        vision_config=dict(depth=1, hidden_size=32, num_heads=2, image_size=32, patch_size=8, intermediate_size=32),
        vq_config=dict(embed_dim=16, num_embeddings=codebook, latent_channels=32),
    )


MODEL_INDEX = {"_class_name": "GlmImagePipeline", "_diffusers_version": "0.37.0.dev0",
               "processor": ["transformers", "GlmImageProcessor"], "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
               "text_encoder": ["transformers", "T5EncoderModel"], "tokenizer": ["transformers", "ByT5Tokenizer"],
               "transformer": ["diffusers", "GlmImageTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"],
               "vision_language_encoder": ["transformers", "GlmImageForConditionalGeneration"]}


def build_checkpoint(root, codebook: int = 16384, head_scale: float = 30.0, hidden: int = 64) -> Path:
    """The AR model, its processor and model_index.json in the released folder layout; return the root."""
    root = Path(root)
    torch.manual_seed(0)
    model = GlmImageForConditionalGeneration(tiny_config(codebook, hidden))
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
        model.lm_head.weight[codebook:] = 0  # non-code outputs never win an argmax (see the module docstring)
    model.generation_config = GenerationConfig(do_sample=True, temperature=0.9, top_p=0.75, top_k=16512, eos_token_id=16385,
                                               pad_token_id=167841)
    model.save_pretrained(root / "vision_language_encoder")
    GlmImageProcessor(image_processor=GlmImageImageProcessorPil(), tokenizer=tiny_tokenizer(),
                      chat_template=CHAT_TEMPLATE).save_pretrained(root / "processor")
    (root / "model_index.json").write_text(json.dumps(MODEL_INDEX, indent=2))
    return root


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("GLM-Image"))


@pytest.fixture(scope="module")
def glm(checkpoint):
    return GlmImageModel.from_pretrained(checkpoint, height=SIZE, width=SIZE)


def reference_generate(model, prompt: str) -> list[int]:
    """transformers' greedy generation from the processor's inputs, as diffusers' generate_prior_tokens calls it."""
    messages = [[{"role": "user", "content": [{"type": "text", "text": prompt}]}]]
    inputs = model.processor.apply_chat_template(messages, tokenize=True, target_h=model.layout.height,
                                                 target_w=model.layout.width, return_dict=True, return_tensors="pt")
    N = model.num_image_tokens
    out = model.backbone.generate(**inputs, max_new_tokens=N + 1, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:][:N].tolist()


@pytest.fixture(scope="module")
def ar_tokens(glm):
    return {b: csdgen.generate(glm, PROMPTS[:b], method="ar", sampling=GREEDY).tokens for b in (1, 2)}


# the released layout loads; rows and positions are the reference's


def test_release_layout_loads_from_the_pipeline_folder_or_the_ar_folder(checkpoint, glm):
    config = json.loads((checkpoint / "vision_language_encoder" / "config.json").read_text())
    assert config["model_type"] == "glm_image" and (config["image_start_token_id"], config["image_end_token_id"]) == (16384, 16385)
    assert config["text_config"]["vision_vocab_size"] == 16512 and config["text_config"]["vocab_size"] == 168064
    assert auto.family_of(checkpoint) == "glm-image" and auto.family_of(checkpoint / "vision_language_encoder") == "glm-image"
    assert auto.read_config(checkpoint)["model_type"] == "glm_image"
    assert glm.codebook_size == 16384 and glm.special == {"image_start": 16384, "image_end": 16385, "pad": 167841,
                                                          "grid_bos": 167845, "grid_eos": 167846}
    assert glm.num_image_tokens == 256 + 4 and glm.layout.preview == (16, 16) and glm.grid == (13, 20)
    assert glm.pipeline_folder == checkpoint and glm.defaults is FAMILY_DEFAULTS["glm-image"]
    inner = GlmImageModel.from_pretrained(checkpoint / "vision_language_encoder", height=SIZE, width=SIZE)
    assert inner.pipeline_folder == checkpoint and inner.prompt_rows(PROMPTS) == glm.prompt_rows(PROMPTS)
    default = GlmImageLayout.build()  # 1024 x 1024: a 16 x 16 preview, then 32 x 32
    assert (default.target, default.preview, default.num_image_tokens, default.maps_grid()) == ((32, 32), (16, 16), 1280, (40, 32))
    assert [GlmImageLayout.build(side, side).num_image_tokens for side in (512, 2048)] == [512, 4352]
    d = glm.defaults
    assert (d.guidance_scale, d.temperature, d.top_p, d.top_k) == (1.0, 0.9, 0.75, None)


def test_prompt_rows_equal_the_hand_written_ids_and_the_processors(glm, checkpoint):
    """``"red cat"`` at 64 x 96 px: prompt, ``<sop>2 3<eop>`` (target grid, height first), ``<sop>13 19<eop>``
    (preview: int(sqrt(2/3) * 16), int(sqrt(3/2) * 16)), image start; no unconditional row."""
    wide = GlmImageModel(glm.backbone, glm.processor, height=64, width=96)
    sop, eop = SPECIAL["<sop>"], SPECIAL["<eop>"]
    expected = [word("red"), word("cat"), sop, word("2"), word("3"), eop, sop, word("13"), word("19"), eop, 16384]
    cond, uncond = wide.prompt_rows(["red cat"])
    assert cond == [expected] and uncond == []
    assert wide.layout.preview == (13, 19) and wide.num_image_tokens == 13 * 19 + 6
    inputs = glm.processor.apply_chat_template([[{"role": "user", "content": [{"type": "text", "text": "red cat"}]}]],
                                               tokenize=True, target_h=64, target_w=96, return_dict=True)
    assert inputs["input_ids"] == [expected]  # the pipeline's own path gives the same row
    assert wide.prompt_rows([[word("red"), word("cat")]])[0] == [expected]  # token-id prompt: suffix appended
    templated = GlmImageModel(glm.backbone, glm.processor, height=64, width=96, prompt_template="a {prompt} of the dog")
    assert templated.prompt_rows(["photo"])[0][0][:5] == [word("a"), word("photo"), word("of"), word("the"), word("dog")]


def test_mrope_positions_equal_transformers_get_rope_index(glm):
    """Every prompt and image position of a left-padded batch: the session's (t, h, w) = get_rope_index's
    prefill positions, then its cached decode positions (preview grid, then the target grid)."""
    session = glm.start(PROMPTS, None, False)
    ids, mask = session.rows.ids, session.rows.mask
    B, P, N = ids.shape[0], ids.shape[1], glm.num_image_tokens
    grids = torch.cat([glm.layout.image_grid_thw()] * B)
    prefill, _ = glm.backbone.model.get_rope_index(ids, image_grid_thw=grids, images_per_sample=torch.tensor([2] * B),
                                                   attention_mask=mask)
    decode = glm.backbone.model._cached_decode_position_ids  # [B, 3, N + 1]
    lengths = mask.sum(1)
    flat = torch.cat([(mask.cumsum(1) - 1).clamp(min=0), lengths[:, None] + torch.arange(N)], dim=1)  # [B, P + N] 1-D positions
    ours = session.mrope_positions(flat)
    valid = mask.bool()
    assert torch.equal(ours[:, :, :P][:, valid], prefill[:, valid])
    assert torch.equal(ours[:, :, P:], decode[:, :, :N].permute(1, 0, 2))
    preview_base, target_base = int(lengths[0]), int(lengths[0]) + 16
    assert ours[:, 0, P + 255].tolist() == [preview_base, preview_base + 15, preview_base + 15]  # last preview code
    assert ours[:, 0, P + 256].tolist() == [target_base] * 3  # first target code: its grid's own origin


# greedy: transformers' generate, SJD, batches


def test_ar_greedy_equals_transformers_generate(glm, ar_tokens):
    tokens = ar_tokens[2]
    for b, prompt in enumerate(PROMPTS):
        reference = reference_generate(glm, prompt)
        assert max(reference) < glm.codebook_size  # the reference argmax fell on codes: the comparison is not vacuous
        assert tokens[b].tolist() == reference, b
    assert torch.equal(ar_tokens[1][0], tokens[0])  # left padding changes nothing
    assert len(set(tokens[0].tolist())) > 10  # not a constant image


@pytest.mark.parametrize("batch, windows", [(1, (7, 33)), (2, (4, 16))])
def test_greedy_sjd_equals_ar_across_the_grid_boundary(glm, ar_tokens, batch, windows):
    accepted = 0
    for window in windows:  # the windows slide over position 256, where the target grid starts
        out = csdgen.generate(glm, PROMPTS[:batch], method="sjd", window=window, sampling=GREEDY)
        assert torch.equal(out.tokens, ar_tokens[batch]), window
        accepted += sum(s.counts()["accepted"] for s in out.images)
    assert accepted > 0
    if batch == 2:
        tree = csdgen.generate(glm, PROMPTS, method="sjd", window=8, tree=(2, 2), sampling=GREEDY)
        assert torch.equal(tree.tokens, ar_tokens[batch])


@pytest.mark.parametrize("method, tree", [("csd", None), ("sjd", (2, 2))])
def test_kv_state_after_every_iteration_equals_fresh_prefill(glm, method, tree):
    sampling = SamplingConfig(temperature=1.0, top_k=20)
    out, checked = generate_checking_every_iteration(glm, PROMPTS, method=method, window=10, tree=tree, sampling=sampling,
                                                     seed=4)
    assert len(checked) == out.steps and max(checked[-1]) == glm.num_image_tokens - 1


# exact in distribution on a GLM-Image session (V = 3 codes, N = 4: a 1 x 2 preview, a 1 x 2 target grid)


LAW_SAMPLING = SamplingConfig(temperature=0.9, top_p=0.9)
LAW_SAMPLES = SAMPLES // 2  # 81 bins of ~150 expected samples; the wrong rule still fails far below P_FAIL


@pytest.fixture(scope="module")
def law_model(tmp_path_factory):
    root = build_checkpoint(tmp_path_factory.mktemp("GLM-Image-law"), codebook=3, head_scale=10.0, hidden=16)
    return GlmImageModel.from_pretrained(root, height=32, width=64, preview=(1, 2))


@pytest.fixture(scope="module")
def law(law_model):
    model = law_model
    prompt = torch.tensor([model.prompt_ids("red cat")])
    prefill, _ = model.backbone.model.get_rope_index(prompt, image_grid_thw=model.layout.image_grid_thw(),
                                                     images_per_sample=torch.tensor([2]),
                                                     attention_mask=torch.ones_like(prompt))
    decode = model.backbone.model._cached_decode_position_ids.permute(1, 0, 2)  # [3, 1, N + 1]

    def next_logits(prefix):
        ids = torch.cat([prompt, torch.tensor([list(prefix)], dtype=torch.long)], dim=1)
        positions = torch.cat([prefill, decode[:, :, : len(prefix)]], dim=2)
        with torch.no_grad():
            logits = model.backbone(input_ids=ids, position_ids=positions).logits[0, -1, : model.codebook_size]
        return logits, None

    return exact_law(next_logits, LAW_SAMPLING)


@pytest.mark.parametrize("window, tree", [(3, None), (4, (2, 2))])
def test_sjd_on_the_session_reproduces_the_exact_law(law_model, law, window, tree):
    assert (law_model.codebook_size, law_model.num_image_tokens) == (3, 4)
    assert min(law.values()) > 1e-4 and max(law.values()) < 0.2  # a spread law: every bin is tested
    out = csdgen.generate(law_model, ["red cat"] * LAW_SAMPLES, method="sjd", window=window, tree=tree, sampling=LAW_SAMPLING,
                          seed=11)
    assert len({s.steps for s in out.images}) > 1  # drafts accepted and rejected
    assert chi_square_pvalue(out.tokens, law) > P_PASS


def test_the_law_test_fails_a_wrong_rule_on_this_session(law_model, law):
    out = csdgen.generate(law_model, ["red cat"] * LAW_SAMPLES, method=ResampleFromTarget(), window=3, draft_init="uniform",
                          sampling=LAW_SAMPLING, seed=11)
    assert chi_square_pvalue(out.tokens, law) < P_FAIL


# refusals, memory


def test_guidance_sizes_and_templates_are_refused_clearly(glm, checkpoint, tmp_path):
    with pytest.raises(ValueError, match="runs without classifier-free guidance .* allowed guidance_scale 1"):
        csdgen.generate(glm, PROMPTS, method="ar", sampling=SamplingConfig(guidance_scale=3.0))
    for kwargs, match in [
        (dict(height=48, width=64), r"height=48 px: allowed positive multiples of 32 px"),
        (dict(height=32, width=32 * 300), "the preview grid would be 0 x"),
        (dict(height=64, width=64, prompt_template="no field"), r"has no \{prompt\}"),
    ]:
        with pytest.raises(ValueError, match=match):
            GlmImageModel.from_pretrained(checkpoint, **kwargs)
    with pytest.raises(FileNotFoundError, match="neither model_index.json"):
        GlmImageModel.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="batch_size=3 differs"):
        glm.start(PROMPTS, 3, False)
    with pytest.raises(ValueError, match=r"prompt of 1019 tokens \+ image of 19 positions = 1038 > max_position_embeddings=1024"):
        glm.start([[word("red")] * 1010], None, False)


def test_memory_estimate_from_the_config_equals_the_models(glm, checkpoint):
    expected = glm.memory(window=16, prompt_length=20)
    assert auto.estimate_memory(checkpoint, "glm-image", 16, "float32", height=SIZE, width=SIZE, prompt_length=20) == expected
    per_image = 2 * 2 * (20 + 260) * 1 * 32 * 4 + (1 + 3) * 17 * 16384 * 4  # KV of one row + logit buffers
    assert expected.per_image == per_image
    released = GlmImageConfig(text_config=dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                 "partial_rotary_factor": 0.5, "mrope_section": [8, 12, 12]}))
    big = glm_image_memory(released, GlmImageLayout.build(), 16, "bfloat16")
    assert round(big.fixed / 2**30, 1) == 18.8 and round(big.per_image / 2**20) == 59  # docs/models.md's figures


def test_load_model_reads_the_pipeline_folder_and_checks_before_the_weights(checkpoint, tmp_path):
    import shutil

    model = auto.load_model(checkpoint, device="cpu", height=SIZE, width=SIZE, prompts=PROMPTS)
    assert isinstance(model, GlmImageModel) and model.grid == (13, 20) and model.dtype == torch.float32
    empty = tmp_path / "no-weights"
    shutil.copytree(checkpoint, empty, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(FileNotFoundError, match="vision_language_encoder' holds no weights"):
        auto.load_model(empty, device="cpu")
    with pytest.raises(ValueError, match="height=40 px: allowed positive multiples of 32 px"):
        auto.load_model(checkpoint, device="cpu", height=40, width=SIZE)
    with pytest.raises(ValueError, match="glm-image at batch size 4, window 16, .* needs about"):
        auto.load_model(checkpoint, device="cpu", batch_size=4, max_memory_bytes=10**6)
    with pytest.raises(ValueError, match="vqgan applies to Chameleon"):
        auto.load_model(checkpoint, device="cpu", vqgan=str(tmp_path))
    other = tmp_path / "other-pipeline"
    other.mkdir()
    (other / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
    with pytest.raises(ValueError, match="is a diffusers 'FluxPipeline' pipeline; csdgen drives GlmImagePipeline"):
        auto.family_of(other)


# the image: diffusers' GlmImagePipeline from csdgen's tokens


def test_decoder_needs_its_pipeline_folder_and_diffusers(glm, checkpoint, monkeypatch):
    alone = GlmImageModel(glm.backbone, glm.processor, height=SIZE, width=SIZE)
    assert "has no diffusers pipeline" in alone.decoder_problem
    with pytest.raises(NotImplementedError, match="has no diffusers pipeline"):
        alone.decode_images(torch.zeros(1, glm.num_image_tokens, dtype=torch.long))
    monkeypatch.setitem(sys.modules, "diffusers", None)  # as if not installed
    assert "pip install" in glm.decoder_problem and '".[glm]" in the csdgen checkout' in glm.decoder_problem


def test_a_pipeline_folder_without_its_decoder_folders_is_refused_before_generating(glm, checkpoint, tmp_path, capsys):
    """model_index.json alone (transformer/, vae/, ... not copied) is named as such, not left to diffusers' error after
    the tokens are generated (found by a new-user try-out: "no file named config.json found in directory <root>")."""
    assert glm.pipeline_folder == Path(checkpoint)
    problem = glm.decoder_problem
    assert problem is not None and str(checkpoint) in problem
    for name in ("transformer/", "vae/", "text_encoder/", "tokenizer/", "scheduler/"):
        assert name in problem
    assert "vision_language_encoder/" not in problem and "processor/" not in problem
    from csdgen import cli

    out = tmp_path / "out"
    assert cli.main(["generate", "--model", str(checkpoint), "--prompt", "red cat", "--height", str(SIZE), "--width",
                     str(SIZE), "--method", "ar", "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "lacks " in err and "transformer/" in err and str(checkpoint) in err
    assert not out.exists()  # refused before generating


def add_tiny_decoder(root: Path, glm: GlmImageModel) -> Path:
    """Save a whole tiny GlmImagePipeline (diffusers writes every folder and model_index.json) into ``root``."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, GlmImagePipeline, GlmImageTransformer2DModel
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    torch.manual_seed(0)
    text_encoder = T5EncoderModel(T5Config(vocab_size=384, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2))
    transformer = GlmImageTransformer2DModel(patch_size=2, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=8,
                                             num_attention_heads=2, text_embed_dim=16, time_embed_dim=16, condition_dim=8,
                                             prior_vq_quantizer_codebook_size=glm.codebook_size)
    vae = AutoencoderKL(block_out_channels=(4, 8, 16, 16), in_channels=3, out_channels=3, latent_channels=4, norm_num_groups=4,
                        down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
                        latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    pipe = GlmImagePipeline(tokenizer=ByT5Tokenizer(), processor=glm.processor, text_encoder=text_encoder,
                            vision_language_encoder=glm.backbone, vae=vae, transformer=transformer,
                            scheduler=FlowMatchEulerDiscreteScheduler())
    pipe.save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def decoder_root(glm, tmp_path_factory):
    pytest.importorskip("diffusers")
    return add_tiny_decoder(tmp_path_factory.mktemp("with-decoder") / "GLM-Image", glm)


def test_a_pipeline_folder_with_an_empty_or_weightless_component_is_refused_naming_it(decoder_root, tmp_path):
    """Found by a new-user try-out: an empty transformer/ (a copy cut short) passed the folder check and diffusers
    refused it after the whole prior had run ("no file named config.json found in directory .../transformer")."""
    import shutil

    from csdgen.models.glm_image import missing_components, pipeline_problem

    assert missing_components(decoder_root, given=("vision_language_encoder",)) == []
    cut = tmp_path / "GLM-Image"
    shutil.copytree(decoder_root, cut)
    shutil.rmtree(cut / "transformer")
    (cut / "transformer").mkdir()
    for f in (cut / "vae").glob("*.safetensors"):
        f.unlink()
    assert missing_components(cut, given=("vision_language_encoder", "processor")) == \
        ["transformer (empty: no config)", "vae (no weights)"]
    assert f"{str(cut)!r} lacks transformer/ (empty: no config), vae/ (no weights) (model_index.json" in pipeline_problem(cut)


def test_a_model_with_a_layer_on_disk_decodes_its_images(decoder_root, tmp_path):
    """Found by a new-user try-out: with --device-map sending a decoder layer to disk, the tokens were made and then
    diffusers' pipe.to(device) refused the pipeline ("You can't move a model that has some modules offloaded")."""
    split = auto.load_model(decoder_root, device="cpu", batch_size=None, height=SIZE, width=SIZE,
                            device_map={"model.language_model.layers.1": "disk"}, offload_folder=tmp_path / "o")
    whole = auto.load_model(decoder_root, device="cpu", batch_size=None, height=SIZE, width=SIZE)
    tokens = csdgen.generate(whole, PROMPTS[:1], method="ar", sampling=GREEDY).tokens
    assert torch.equal(csdgen.generate(split, PROMPTS[:1], method="ar", sampling=GREEDY).tokens, tokens)
    torch.testing.assert_close(split.decode_images(tokens, prompts=PROMPTS[:1]),
                               whole.decode_images(tokens, prompts=PROMPTS[:1]), atol=1e-5, rtol=0)


def test_images_come_from_diffusers_pipeline_with_csdgens_tokens(decoder_root, monkeypatch):
    from diffusers import GlmImagePipeline

    model = GlmImageModel.from_pretrained(decoder_root, height=SIZE, width=SIZE, dit_steps=2)
    assert model.decoder_problem is None and auto.family_of(decoder_root) == "glm-image"
    monkeypatch.setattr(GlmImagePipeline, "generate_prior_tokens", lambda *a, **k: pytest.fail("the AR step ran in diffusers"))
    seen = []
    forward = type(model.decoder().transformer).forward

    def spy(self, *args, **kwargs):
        seen.append(kwargs["prior_token_id"].clone())
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(model.decoder().transformer), "forward", spy)
    tokens = csdgen.generate(model, PROMPTS, method="sjd", window=8, sampling=SamplingConfig(temperature=1.0), seed=0).tokens
    images = model.decode_images(tokens, prompts=PROMPTS)
    assert images.shape == (2, 3, SIZE, SIZE) and images.dtype == torch.float32 and images.abs().max() <= 1
    target = tokens[:, 256:].reshape(2, 2, 2)  # the 2 x 2 target grid, upsampled 2x by nearest neighbour
    upsampled = target.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2).reshape(2, 16)
    assert seen and all(torch.equal(s, upsampled) for s in seen)
    assert model.decoder().vision_language_encoder is model.backbone  # the AR model is not loaded twice
    single = model.decode_images(tokens[:1], prompts=PROMPTS[:1])  # fixed DiT noise: an image is a function of its tokens
    assert torch.equal(model.decode_images(tokens[:1], prompts=PROMPTS[:1]), single)
    torch.testing.assert_close(single, images[:1], atol=1e-4, rtol=0)  # the batch changes only rounding


def test_cli_generate_and_bench_on_glm_image_and_guidance_refused(decoder_root, tmp_path, capsys):
    import csv

    from csdgen import cli

    out = tmp_path / "out"
    size = ["--height", "64", "--width", "64", "--device", "cpu"]
    assert cli.main(["generate", "--model", str(decoder_root), "--prompt", "red cat", *size, "--window", "8",
                     "--out", str(out)]) == 0
    s = json.loads((out / "record.json").read_text())["settings"]
    assert s["family"] == "glm-image" and s["grid"] == [13, 20] and s["sampling"]["top_p"] == 0.75
    assert (out / "0000_red-cat.png").is_file() and (out / "0000_red-cat_map.png").is_file()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("red cat\n")
    assert cli.main(["bench", "--model", str(decoder_root), "--prompts", str(prompts), "--limit", "1", "--methods", "csd",
                     "--floor-seed", "none", *size, "--window", "8", "--top-p", "1", "--out", str(tmp_path / "bench")]) == 0  # no top-p sort
    rows = list(csv.DictReader((tmp_path / "bench" / "report.csv").open()))
    assert [r["method"] for r in rows] == ["ar", "csd"] and all(float(r["nll"]) > 0 for r in rows)
    assert cli.main(["generate", "--model", str(decoder_root), "--prompt", "red cat", *size, "--guidance-scale", "3",
                     "--out", str(tmp_path / "o")]) == 2
    assert "GLM-Image's AR prior runs without classifier-free guidance" in capsys.readouterr().err
    assert cli.main(["plan", "--model", str(decoder_root), *size, "--guidance-scale", "3"]) == 2  # planned as 1 row
    assert "--guidance-scale 3: GLM-Image's AR prior runs without classifier-free guidance" in capsys.readouterr().err
    alone = decoder_root.parent / "AR-only"
    import shutil

    shutil.copytree(decoder_root / "vision_language_encoder", alone / "vision_language_encoder")
    shutil.copytree(decoder_root / "processor", alone / "processor")
    for command in ("generate", "bench"):  # refused before generating
        assert cli.main([command, "--model", str(alone / "vision_language_encoder"), "--prompt" if command == "generate"
                         else "--prompts", "red cat" if command == "generate" else str(prompts), *size,
                         "--out", str(tmp_path / f"refused-{command}")]) == 2
        assert "has no diffusers pipeline" in capsys.readouterr().err and not (tmp_path / f"refused-{command}").exists()


def test_demo_runs_glm_image(decoder_root):
    import threading

    from csdgen.demo import load_demo_model, parse_inputs, watch

    model, name, defaults = load_demo_model(str(decoder_root))
    assert name.startswith("glm-image") and defaults.guidance_scale == 1.0
    model.dit_steps = 1  # a preview frame runs the whole DiT: one step is enough here
    settings = parse_inputs(model, condition="red cat", methods=["ar", "csd"], window="32", lam=0.5, delta=0.65,
                            guidance_scale=1.0, seed=0)
    decodes = []
    decode = model.decode_images
    model.decode_images = lambda tokens, **kw: decodes.append(1) or decode(tokens, **kw)
    # no top-p: a sort over the 168,064-token vocabulary at every forward doubled the test's time
    events = list(watch(model, settings, SamplingConfig(guidance_scale=1.0, temperature=0.9), threading.Event(), min_interval=0.5))
    rows = events[-1][1]
    assert events[-1][0] == "end" and [r["method"] for r in rows] == ["ar", "csd"]
    assert rows[0]["forwards"] == model.num_image_tokens
    frames = [e[2] for e in events if e[0] == "frame"]
    assert len(frames) > 2 and len(decodes) == 2  # live maps in every frame; the DiT ran once per method, at the end
    assert frames[-1].image.shape == frames[0].image.shape and frames[-1].image.std() > 0
