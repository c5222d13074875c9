"""Liquid: tiny random checkpoints in the released layout (a GemmaForCausalLM folder), saved and reloaded.

The tiny checkpoint is laid out as ``Junfeng5/Liquid_V1_7B``: config.json of a ``GemmaForCausalLM``
(GemmaConfig's defaults but the widths and the vocabulary size), whose vocabulary is the
tokenizer's followed by 8192 image rows (``expand_vocabulary.py``: ``vocab_size + 8192``); the
tokenizer has Gemma's special ids (``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3; ``<bos>`` added
by the tokenizer), knows ``<boi>``, ``<eoi>`` and ``<unconditional>``, pads on the left; Chameleon's
``vqgan.yaml`` + ``vqgan.ckpt`` sit in ``chameleon/``, where Liquid's evaluation code keeps them
(a tiny VQGAN: ch_mult [1, 2], resolution 16, so 8 x 8 codes). The tiny text vocabulary is 59
entries instead of Gemma's 256000. The embeddings are untied (``lm_head`` image rows scaled up,
their input rows down: with tied random weights a code's own row wins every argmax and greedy
images are constant); whether the release ties them is unverified, and the adapter reads
``lm_head`` either way.
"""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from transformers import GemmaConfig, GemmaForCausalLM, PreTrainedTokenizerFast

import csdgen
from csdgen import SamplingConfig
from csdgen.models import auto
from csdgen.models.chameleon_vqgan import ChameleonVQGANDecoder, VQGANConfig
from csdgen.models.defaults import FAMILY_DEFAULTS
from csdgen.models.liquid import LiquidImageModel, liquid_memory
from tiny_tokenizer import word_level_tokenizer
from family_law import exact_law
from kv_check import generate_checking_every_iteration
from test_lossless import P_FAIL, P_PASS, SAMPLES, ResampleFromTarget, chi_square_pvalue

SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<boi>", "<eoi>", "<unconditional>"]
WORDS = ["red", "cat", "a", "photo", "of", "the", "dog", "Generate", "an", "image", "based", "on", "this", "description."]
VOCAB = {w: i for i, w in enumerate(SPECIAL + WORDS + [f"t{i}" for i in range(38)])}  # 59 text entries
PROMPTS = ["red cat", "a photo of the red dog"]
GUIDED = SamplingConfig(temperature=0, guidance_scale=7.0)


def ids(*words: str) -> list[int]:
    return [VOCAB[w] for w in words]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    return word_level_tokenizer(VOCAB, SPECIAL, prepend_bos="<bos>", bos_token="<bos>", eos_token="<eos>",
                                pad_token="<pad>", padding_side="left")


def vqgan_yaml(codebook: int, resolution: int) -> dict:
    return {"model": {"params": {"embed_dim": 8, "n_embed": codebook, "ddconfig": {
        "double_z": False, "z_channels": 8, "resolution": resolution, "in_channels": 3, "out_ch": 3, "ch": 32,
        "ch_mult": [1, 2], "num_res_blocks": 1, "attn_resolutions": [8], "dropout": 0.0}}}}


def build_checkpoint(root, codebook: int = 8192, resolution: int = 16, head_scale: float = 6.0, hidden: int = 64) -> Path:
    """A tiny Liquid folder: Gemma weights and config, tokenizer, ``chameleon/vqgan.{yaml,ckpt}``; return it."""
    root = Path(root)
    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    heads, kv_heads, inner = (4, 2, 128) if hidden == 64 else (1, 1, 32)
    config = GemmaConfig(vocab_size=len(tokenizer) + codebook, hidden_size=hidden, intermediate_size=inner, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=16, tie_word_embeddings=False,
                         architectures=["GemmaForCausalLM"])
    model = GemmaForCausalLM(config)
    with torch.no_grad():  # peaked targets, weak pull of the previous code: drafts accepted and rejected
        model.lm_head.weight[len(tokenizer):].mul_(head_scale)
        model.model.embed_tokens.weight[len(tokenizer):].mul_(0.1)
    model.save_pretrained(root)
    tokenizer.save_pretrained(root)
    (root / "chameleon").mkdir()
    spec = vqgan_yaml(codebook, resolution)
    (root / "chameleon" / "vqgan.yaml").write_text(yaml.safe_dump(spec))
    decoder = ChameleonVQGANDecoder(VQGANConfig.from_dict(spec))
    torch.save({"state_dict": {**decoder.state_dict(), "encoder.conv_in.weight": torch.zeros(1)}},
               root / "chameleon" / "vqgan.ckpt")
    return root


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("Liquid_V1_tiny"))


@pytest.fixture(scope="module")
def liquid(checkpoint):
    return LiquidImageModel.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def ar_tokens(liquid):
    return {(scale, b): csdgen.generate(liquid, PROMPTS[:b], method="ar",
                                        sampling=SamplingConfig(temperature=0, guidance_scale=scale)).tokens
            for scale in (1.0, 7.0) for b in (1, 2)}


def reference_generate(model, prompt: str, scale: float) -> list[int]:
    """transformers' greedy generation: the cond row, its CFG on the uncond row, text ids suppressed (the GenAI-Bench
    script's ``logits[:, :256000] = -inf``), codes = ids - len(tokenizer) (``inference_t2i.py``)."""
    tok = model.tokenizer
    cond = tok(prompt + " Generate an image based on this description.<boi>", return_tensors="pt")
    guidance = {} if scale == 1.0 else {"guidance_scale": scale,
                                        "negative_prompt_ids": tok("<unconditional><boi>", return_tensors="pt").input_ids}
    out = model.backbone.generate(**cond, do_sample=False, max_new_tokens=model.num_image_tokens,
                                  suppress_tokens=list(range(len(tok))), **guidance)
    return (out[0, cond.input_ids.shape[1]:] - len(tok)).tolist()


# the released layout loads; rows are the reference's


def test_release_layout_loads(checkpoint, liquid):
    config = json.loads((checkpoint / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("gemma", ["GemmaForCausalLM"])
    assert auto.family_of(checkpoint) == "liquid" and liquid.defaults is FAMILY_DEFAULTS["liquid"]
    assert (liquid.offset, liquid.codebook_size, liquid.grid, liquid.image_size) == (59, 8192, (8, 8), (16, 16))
    assert liquid.vqgan is not None and liquid.vqgan.config.n_embed == 8192  # found in chameleon/
    d = liquid.defaults
    assert (d.guidance_scale, d.temperature, d.top_k, d.top_p) == (7.0, 0.99, 4096, 0.96)
    bare = LiquidImageModel(liquid.backbone, liquid.tokenizer)  # no VQGAN: Liquid's 512 px, 32 x 32 codes
    assert (bare.grid, bare.image_size, bare.codebook_embeddings()) == ((32, 32), (512, 512), None)


def test_rows_equal_the_hand_written_ids(liquid):
    """inference_t2i.py: ``prompt + ' Generate an image based on this description.<boi>'`` and
    ``'<unconditional><boi>'``, each tokenised with the tokenizer's BOS."""
    suffix = ids("Generate", "an", "image", "based", "on", "this", "description.", "<boi>")
    cond, uncond = liquid.prompt_rows(["red cat"])
    assert cond == [[2, *ids("red", "cat"), *suffix]] and uncond == [[2, VOCAB["<unconditional>"], VOCAB["<boi>"]]]
    assert liquid.prompt_rows([ids("red", "cat")])[0] == cond  # token ids: BOS + ids + the suffix's ids
    session = liquid.start(PROMPTS, None, True)
    assert session.rows.ids[0].tolist()[:4] == [0] * 4 and session.rows.ids[2].tolist()[-3:] == uncond[0]  # left padding
    templated = LiquidImageModel(liquid.backbone, liquid.tokenizer, prompt_template="a photo of {prompt}")
    assert templated.prompt_rows(["the dog"])[0][0][:6] == [2, *ids("a", "photo", "of", "the", "dog")]


# greedy: transformers' generate, SJD, batches


@pytest.mark.parametrize("scale", [1.0, 7.0])
def test_ar_greedy_equals_transformers_generate(liquid, ar_tokens, scale):
    tokens = ar_tokens[(scale, 2)]
    for b, prompt in enumerate(PROMPTS):
        assert tokens[b].tolist() == reference_generate(liquid, prompt, scale), b
    assert torch.equal(ar_tokens[(scale, 1)][0], tokens[0])  # left padding changes nothing
    assert len(set(tokens[0].tolist())) > 10  # not a constant image


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0, guidance_scale=0.5), {"guidance_scale": 0.5,
                                                                                          "temperature": 0}])
def test_a_guidance_scale_at_or_below_1_runs_unguided_as_the_reference(liquid, ar_tokens, monkeypatch, sampling):
    """The reference guides only when ``cfg_scale > 1``: at 0.5 it samples the cond rows alone. csdgen
    opens an unguided session (no unconditional rows) and decodes the scale-1 tokens."""
    opened = []
    start = type(liquid).start
    monkeypatch.setattr(type(liquid), "start", lambda self, c, b, guided: opened.append(guided) or start(self, c, b, guided))
    result = csdgen.generate(liquid, PROMPTS, method="ar", sampling=sampling)
    assert opened == [False]
    assert torch.equal(result.tokens, ar_tokens[(1.0, 2)])


@pytest.mark.parametrize("batch, windows", [(1, (9,)), (2, (3, 64))])
def test_greedy_sjd_equals_ar(liquid, ar_tokens, batch, windows):
    accepted = 0
    for window in windows:
        out = csdgen.generate(liquid, PROMPTS[:batch], method="sjd", window=window, sampling=GUIDED)
        assert torch.equal(out.tokens, ar_tokens[(7.0, batch)]), window
        accepted += sum(s.counts()["accepted"] for s in out.images)
    assert accepted > 0
    if batch == 2:
        tree = csdgen.generate(liquid, PROMPTS, method="sjd", window=6, tree=(2, 2), sampling=GUIDED)
        assert torch.equal(tree.tokens, ar_tokens[(7.0, batch)])


@pytest.mark.parametrize("method, tree", [("csd", None), ("sjd", (2, 2))])
def test_kv_state_after_every_iteration_equals_fresh_prefill(liquid, method, tree):
    sampling = SamplingConfig(guidance_scale=7.0, temperature=0.99, top_k=64)
    out, checked = generate_checking_every_iteration(liquid, PROMPTS, method=method, window=10, tree=tree, sampling=sampling,
                                                     seed=4)
    assert len(checked) == out.steps and max(checked[-1]) == liquid.num_image_tokens - 1


# exact in distribution on a guided Liquid session (V = 3 codes, 2 x 2 codes)


LAW_SAMPLING = SamplingConfig(guidance_scale=3.0, temperature=0.99, top_p=0.96)
LAW_SAMPLES = SAMPLES // 2


@pytest.fixture(scope="module")
def law_model(tmp_path_factory):
    return LiquidImageModel.from_pretrained(build_checkpoint(tmp_path_factory.mktemp("Liquid-law"), codebook=3, resolution=4,
                                                             head_scale=3.0, hidden=16))


@pytest.fixture(scope="module")
def law(law_model):
    model = law_model
    (cond,), (uncond,) = model.prompt_rows(["red cat"])

    def last(row, prefix):
        seq = torch.tensor([row + [model.offset + c for c in prefix]])
        with torch.no_grad():
            return model.backbone(input_ids=seq).logits[0, -1, model.offset : model.offset + model.codebook_size]

    return exact_law(lambda prefix: (last(cond, prefix), last(uncond, prefix)), LAW_SAMPLING)


@pytest.mark.parametrize("window, tree", [(3, None), (4, (2, 2))])
def test_sjd_on_the_session_reproduces_the_exact_law(law_model, law, window, tree):
    assert (law_model.codebook_size, law_model.num_image_tokens) == (3, 4)
    assert min(law.values()) > 1e-4 and max(law.values()) < 0.2  # a spread law: every bin is tested
    out = csdgen.generate(law_model, ["red cat"] * LAW_SAMPLES, method="sjd", window=window, tree=tree,
                          sampling=LAW_SAMPLING, seed=11)
    assert len({s.steps for s in out.images}) > 1
    assert chi_square_pvalue(out.tokens, law) > P_PASS


def test_the_law_test_fails_a_wrong_rule_on_this_session(law_model, law):
    out = csdgen.generate(law_model, ["red cat"] * LAW_SAMPLES, method=ResampleFromTarget(), window=3, draft_init="uniform",
                          sampling=LAW_SAMPLING, seed=11)
    assert chi_square_pvalue(out.tokens, law) < P_FAIL


# images, refusals, memory, the command line


def test_decode_images_with_the_chameleon_vqgan(liquid, ar_tokens):
    images = liquid.decode_images(ar_tokens[(7.0, 2)])
    assert images.shape == (2, 3, 16, 16) and images.dtype == torch.float32 and images.abs().max() <= 1 and images.std() > 0
    assert torch.equal(liquid.codebook_embeddings(), liquid.vqgan.quantize.embedding.weight.float())
    with pytest.raises(NotImplementedError, match="no VQGAN decoder"):
        LiquidImageModel(liquid.backbone, liquid.tokenizer).decode_images(ar_tokens[(7.0, 1)])


def test_refusals_name_the_bad_value(checkpoint, liquid, tmp_path):
    plain = tmp_path / "gemma"
    shutil.copytree(checkpoint, plain, ignore=shutil.ignore_patterns("chameleon"))
    config = json.loads((plain / "config.json").read_text())
    (plain / "config.json").write_text(json.dumps({**config, "vocab_size": len(VOCAB)}))
    with pytest.raises(ValueError, match=r"vocab_size 59 - len\(tokenizer\) 59 = 0 image rows; allowed: Liquid's 8192"):
        LiquidImageModel.from_pretrained(plain)
    # the folder is named (found by a new-user try-out: the line did not say which checkpoint), from load_model too
    for load in (LiquidImageModel.from_pretrained, lambda f: auto.load_model(f, device="cpu")):
        with pytest.raises(ValueError, match=rf"^{re.escape(repr(str(plain)))}: vocab_size 59 - len\(tokenizer\) 59"):
            load(plain)
    cut = tmp_path / "cut-vqgan"  # a vqgan.ckpt cut short: refused before the weights are read (here they could not be)
    shutil.copytree(checkpoint, cut)
    (cut / "chameleon" / "vqgan.ckpt").write_bytes((cut / "chameleon" / "vqgan.ckpt").read_bytes()[:2000])
    header = json.dumps({"x": {"dtype": "NOT-A-DTYPE", "shape": [1], "data_offsets": [0, 1]}}).encode()
    (cut / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0")  # whole, unloadable
    with pytest.raises(ValueError, match=r"vqgan.ckpt' is not a readable PyTorch checkpoint \(cut short"):
        LiquidImageModel.from_pretrained(cut)
    with pytest.raises(ValueError, match="allowed: the VQGAN's n_embed 48"):
        other = tmp_path / "vq48"
        other.mkdir()
        spec = vqgan_yaml(48, 16)
        (other / "vqgan.yaml").write_text(yaml.safe_dump(spec))
        torch.save(ChameleonVQGANDecoder(VQGANConfig.from_dict(spec)).state_dict(), other / "vqgan.ckpt")
        LiquidImageModel.from_pretrained(checkpoint, vqgan_dir=other)
    with pytest.raises(ValueError, match="Liquid image size 32: allowed only 16"):
        LiquidImageModel.from_pretrained(checkpoint, image_size=32)
    with pytest.raises(ValueError, match="needs its tokenizer"):
        LiquidImageModel(liquid.backbone, None)
    with pytest.raises(ValueError, match="Liquid makes square images only"):
        auto.load_model(checkpoint, device="cpu", height=16, width=32)
    with pytest.raises(ValueError, match="batch_size=3 differs"):
        liquid.start(PROMPTS, 3, True)


def test_load_model_detects_liquid_and_checks_before_the_weights(checkpoint, tmp_path):
    model = auto.load_model(checkpoint, device="cpu", prompts=PROMPTS)
    assert isinstance(model, LiquidImageModel) and model.grid == (8, 8) and model.vqgan is not None
    empty = tmp_path / "no-weights"
    shutil.copytree(checkpoint, empty, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(FileNotFoundError, match="holds no weights"):
        auto.load_model(empty, device="cpu")
    with pytest.raises(ValueError, match="Liquid image size 512: allowed only 16"):
        auto.load_model(checkpoint, device="cpu", image_size=512)
    with pytest.raises(ValueError, match="liquid at batch size 2, window 16, .* needs about"):
        auto.load_model(checkpoint, device="cpu", batch_size=2, max_memory_bytes=10**6)


def test_a_liquid_folder_without_vqgan_files_is_refused_naming_its_chameleon_folder(checkpoint, tmp_path, capsys):
    """Found by a new-user try-out: the refusal named the folder and its tokenizer/ only, not chameleon/, where
    Liquid's evaluation code keeps the VQGAN and csdgen looks too."""
    from csdgen import cli

    bare = tmp_path / "Liquid-no-vqgan"
    shutil.copytree(checkpoint, bare, ignore=shutil.ignore_patterns("chameleon"))
    assert cli.main(["generate", "--model", str(bare), "--prompt", "red cat", "--device", "cpu",
                     "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and (f"copy those two files into {str(bare)!r}, {str(bare / 'chameleon')!r} or "
                              f"{str(bare / 'tokenizer')!r}") in err[0], err
    assert not (tmp_path / "o").exists()


def test_memory_estimate_from_the_config_equals_the_models(checkpoint, liquid):
    expected = liquid.memory(window=16, prompt_length=20)
    assert auto.estimate_memory(checkpoint, "liquid", 16, "float32", prompt_length=20) == expected
    assert expected.per_image == 2 * 2 * 2 * (20 + 64) * 2 * 16 * 4 + (2 + 3) * 17 * 8192 * 4  # 2 rows of KV + buffers
    released = GemmaConfig(vocab_size=256000 + 8192)  # Gemma-7B's defaults, Liquid's vocabulary
    big = liquid_memory(released, 1024, 8192, 16, "bfloat16")
    assert round(big.fixed / 2**30, 1) == 15.9 and round(big.per_image / 2**20) == 1011  # docs/models.md's figures


def test_cli_names_a_guidance_scale_below_1_that_liquid_decodes_unguided(checkpoint, tmp_path, capsys):
    from csdgen import cli

    assert cli.main(["generate", "--model", str(checkpoint), "--prompt", "red cat", "--device", "cpu", "--window", "8",
                     "--guidance-scale", "0.5", "--no-maps", "--out", str(tmp_path / "o")]) == 0
    assert ("--guidance-scale 0.5: Liquid's reference guides only above 1; this run decodes the conditional rows alone, "
            "as at --guidance-scale 1") in capsys.readouterr().err
    assert cli.main(["plan", "--model", str(checkpoint), "--guidance-scale", "0.5"]) in (0, 1)
    assert " x 1 row, window" in capsys.readouterr().out  # planned unguided, as it decodes


def test_cli_generate_uses_the_family_defaults(checkpoint, tmp_path):
    from csdgen import cli

    out = tmp_path / "out"
    assert cli.main(["generate", "--model", str(checkpoint), "--prompt", "red cat", "--device", "cpu", "--window", "8",
                     "--out", str(out)]) == 0
    s = json.loads((out / "record.json").read_text())["settings"]
    assert s["family"] == "liquid" and s["grid"] == [8, 8]
    assert (s["sampling"]["guidance_scale"], s["sampling"]["temperature"], s["sampling"]["top_k"], s["sampling"]["top_p"]) == (
        7.0, 0.99, 4096, 0.96)
    from PIL import Image

    assert Image.open(out / "0000_red-cat.png").size == (16, 16)
    bare = tmp_path / "no-vqgan"
    shutil.copytree(checkpoint, bare, ignore=shutil.ignore_patterns("chameleon"))
    assert cli.main(["generate", "--model", str(bare), "--prompt", "red cat", "--device", "cpu", "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()


def test_compare_and_demo_run_liquid(checkpoint, tmp_path):
    import csv
    import threading

    from csdgen import cli
    from csdgen.demo import load_demo_model, parse_inputs, watch

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("red cat\n")
    assert cli.main(["compare", "--model", str(checkpoint), "--prompts", str(prompts), "--limit", "1", "--methods", "csd",
                     "--window", "8", "--device", "cpu", "--out", str(tmp_path / "compare")]) == 0
    rows = list(csv.DictReader((tmp_path / "compare" / "compare.csv").open()))
    assert [r["method"] for r in rows] == ["ar", "csd", "ar@seed1"] and all(float(r["nll"]) > 0 for r in rows)
    model, name, defaults = load_demo_model(str(checkpoint))
    assert name.startswith("liquid") and defaults is FAMILY_DEFAULTS["liquid"]
    settings = parse_inputs(model, condition="red cat", methods=["ar", "csd"], window="8", lam=0.5, delta=0.65,
                            guidance_scale=7.0, seed=0)
    events = list(watch(model, settings, SamplingConfig(guidance_scale=7.0, temperature=0.99, top_k=4096, top_p=0.96),
                        threading.Event()))
    assert events[-1][0] == "end" and [r["method"] for r in events[-1][1]] == ["ar", "csd"]
    assert events[-1][1][0]["forwards"] == model.num_image_tokens
