"""Chameleon-format models (Lumina-mGPT, Anole): tiny random checkpoints saved and reloaded.

The tiny checkpoints are laid out as the released ones: the vocabulary starts as Chameleon's
(``<s>`` = 0, ``<pad>`` = 1, ``</s>`` = 2, ``<unk>`` = 3), holds the real special-token names
(``<racm3:break>``, ``<eoss>``, ``<reserved08799>``, ``<reserved08706>``, ``<reserved088NN>``)
and 48 ``IMGIMG...`` image tokens at shuffled ids (codebook order differs from id order);
config.json has no ``bos_token_id``/``pad_token_id`` (as the converters write it, so
ChameleonConfig's default 1 = ``<pad>`` would be read); the folder holds a word-level
tokenizer that knows every special token (string prompts go through it). A Lumina-mGPT copy
stores q/k norms as ``[1, head_dim]`` under architecture ``ChameleonXLLMXForConditionalGeneration``. VQGAN: ch 32, ch_mult [1, 2] (downsampling 2), so the tiny Lumina layout at 12 x 16 px is
6 x 8 tokens (resolution tokens <reserved08803>, <reserved08804>) and Anole (resolution 16)
is 8 x 8 tokens.
"""

import json
import os
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import ChameleonConfig, ChameleonForConditionalGeneration, PreTrainedTokenizerFast

import csdgen
from csdgen import SamplingConfig
from csdgen.models import auto
from csdgen.models.chameleon import ChameleonImageModel, config_memory, shared_norm_shapes
from csdgen.models.chameleon_vqgan import ChameleonVQGANDecoder, VQGANConfig, load_vqgan_decoder
from tiny_tokenizer import word_level_tokenizer
from kv_check import generate_checking_every_iteration, generate_recording_row_sequences

V = 48
SPECIAL_NAMES = ["<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>", "<image>"] + [
    f"<reserved{8800 + n:05d}>" for n in range(1, 9)]
WORDS = ["Generate", "an", "image", "of", "16x12", "according", "to", "the", "following", "prompt:", "red", "cat"]
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"] + [f"t{i}" for i in range(12)] + SPECIAL_NAMES + WORDS
BOS_ID, PAD_ID = 0, 1
PROMPTS = [[4, 9, 7, 12, 5], [6, 6, 11]]  # token ids, different lengths (left padding)
GUIDED = SamplingConfig(temperature=0, guidance_scale=3.0)
VQGAN_YAML = {"model": {"params": {"embed_dim": 8, "n_embed": V, "ddconfig": {
    "double_z": False, "z_channels": 8, "resolution": 16, "in_channels": 3, "out_ch": 3, "ch": 32,
    "ch_mult": [1, 2], "num_res_blocks": 1, "attn_resolutions": [8], "dropout": 0.0}}}}


def lumina_layout(source: str, path) -> str:
    """A copy of ``source`` as Lumina-mGPT stores it: q/k norms ``[1, head_dim]``, its architecture name."""
    shutil.copytree(source, path)
    file = os.path.join(path, "model.safetensors")
    state = load_file(file)
    for name in [k for k in state if k.endswith(("q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias"))]:
        state[name] = state[name][:1].clone()
    save_file(state, file, metadata={"format": "pt"})
    config = json.loads(open(os.path.join(path, "config.json")).read())
    config.update(architectures=["ChameleonXLLMXForConditionalGeneration"], z_loss_weight=0.0, model_parallel_size=1)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return str(path)


def image_name(code: int) -> str:
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def tiny_config() -> ChameleonConfig:
    vocab = {name: i for i, name in enumerate(SPECIALS)}
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(1)).tolist()
    vocab.update({image_name(code): len(SPECIALS) + perm[code] for code in range(V)})
    return ChameleonConfig(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, vocabulary_map=vocab,
        vq_config=dict(embed_dim=8, num_embeddings=V, latent_channels=8, resolution=16, base_channels=32,
                       channel_multiplier=[1, 2], num_res_blocks=1),
    )


def save_tokenizer(path) -> None:
    """A word-level tokenizer over the tiny vocabulary that knows every special token (as added tokens)."""
    word_level_tokenizer(tiny_config().vocabulary_map, ["<s>", "<pad>", "</s>", "<unk>"] + SPECIAL_NAMES, bos_token="<s>",
                         eos_token="</s>", pad_token="<pad>").save_pretrained(path)


def build_checkpoint(path: str) -> str:
    """Save a tiny random checkpoint as the converters do, its tokenizer, and vqgan.yaml + vqgan.ckpt beside it; return ``path``.

    The q/k norms get one random row per layer shared by all heads (as Lumina-mGPT's are), so
    the same weights exist in both layouts.
    """
    torch.manual_seed(0)
    model = ChameleonForConditionalGeneration(tiny_config())
    with torch.no_grad():  # peaked targets, weak dependence on the previous token: drafts accepted and rejected
        model.lm_head.weight.mul_(6.0)
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.copy_((1 + 0.3 * torch.randn(1, norm.weight.shape[1])).expand_as(norm.weight))
                norm.bias.copy_((0.2 * torch.randn(1, norm.bias.shape[1])).expand_as(norm.bias))
    model.save_pretrained(path)
    config = json.loads(open(os.path.join(path, "config.json")).read())
    for key in ("bos_token_id", "pad_token_id", "eos_token_id"):  # the converters write none of them
        config.pop(key, None)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    save_tokenizer(path)
    with open(os.path.join(path, "vqgan.yaml"), "w") as f:
        yaml.safe_dump(VQGAN_YAML, f)
    decoder = ChameleonVQGANDecoder(VQGANConfig.from_dict(VQGAN_YAML))
    state = {**decoder.state_dict(), "encoder.conv_in.weight": torch.zeros(1), "loss.logvar": torch.zeros(1)}
    torch.save({"state_dict": state}, os.path.join(path, "vqgan.ckpt"))
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint(str(tmp_path_factory.mktemp("chameleon")))


@pytest.fixture(scope="module")
def lumina(checkpoint):
    return ChameleonImageModel.from_pretrained(checkpoint, layout="lumina", height=12, width=16)


@pytest.fixture(scope="module")
def anole(checkpoint):
    return ChameleonImageModel.from_pretrained(checkpoint, layout="anole")


def vocab_of(model):
    return model.backbone.config.vocabulary_map


def image_ids_by_code(model):
    vocab = vocab_of(model)
    return [vocab[image_name(code)] for code in range(V)]


def reference_greedy(model, prompt, scale):
    """The family's generation, plainly: no cache, full forward each step, argmax of guided image logits.

    Unconditional sequence as the families build it: Lumina-mGPT ``input_ids[:, image_start:]``
    (begin-of-image, height, width tokens, then the image); Chameleon/Anole ``[bos, begin_image]``.
    """
    vocab, ids = vocab_of(model), image_ids_by_code(model)
    lumina = model.layout.kind == "lumina"
    rows, cols = model.grid
    head = [vocab["<racm3:break>"]] + ([vocab["<reserved08803>"], vocab["<reserved08804>"]] if lumina else [])
    cond = [vocab["<s>"], *prompt, *head]
    uncond = list(head) if lumina else [vocab["<s>"], vocab["<racm3:break>"]]
    codes = []

    def last_logits(seq):
        hidden = model.backbone.model(input_ids=torch.tensor([seq])).last_hidden_state
        return model.backbone.lm_head(hidden)[0, -1, ids].float()

    with torch.no_grad():
        for i in range(rows * cols):
            lc = last_logits(cond)
            logits = lc if scale == 1.0 else (lambda lu: lu + scale * (lc - lu))(last_logits(uncond))
            code = int(logits.argmax())
            codes.append(code)
            for seq in (cond, uncond):
                seq.append(ids[code])
                if lumina and i % cols == cols - 1:
                    seq.append(vocab["<reserved08799>"])
    return codes


@pytest.fixture(scope="module")
def ar_tokens(lumina, anole):
    return {
        (kind, scale, batch): csdgen.generate(model, PROMPTS[:batch], method="ar",
                                              sampling=SamplingConfig(temperature=0, guidance_scale=scale)).tokens
        for kind, model in (("lumina", lumina), ("anole", anole)) for scale in (1.0, 3.0) for batch in (1, 2)
    }


# (1) AR greedy == the family's reference generation


@pytest.mark.parametrize("kind", ["lumina", "anole"])
@pytest.mark.parametrize("scale", [1.0, 3.0])
def test_ar_greedy_equals_reference_loop(request, ar_tokens, kind, scale):
    model = request.getfixturevalue(kind)
    tokens = ar_tokens[(kind, scale, 2)]
    for b, prompt in enumerate(PROMPTS):
        assert tokens[b].tolist() == reference_greedy(model, prompt, scale), (kind, scale, b)
    assert torch.equal(ar_tokens[(kind, scale, 1)][0], tokens[0])  # batching (left padding) changes nothing
    assert len(set(tokens[0].tolist())) > 3  # not a degenerate constant image


# (2) greedy SJD == AR


@pytest.mark.parametrize("batch", [1, 2])
def test_greedy_sjd_equals_ar_lumina_windows_across_row_ends(lumina, ar_tokens, batch):
    accepted = 0
    for window in (2, 3, 7, 8, 9, 13, 16, 47):
        out = csdgen.generate(lumina, PROMPTS[:batch], method="sjd", window=window, sampling=GUIDED)
        assert torch.equal(out.tokens, ar_tokens[("lumina", 3.0, batch)]), window
        accepted += sum(s.counts()["accepted"] for s in out.images)
    assert accepted > 0  # the accept path (multi-token commits across row ends) was exercised


def test_greedy_sjd_equals_ar_anole(anole, ar_tokens):
    for window in (4, 11, 32):
        for batch in (1, 2):
            out = csdgen.generate(anole, PROMPTS[:batch], method="sjd", window=window, sampling=GUIDED)
            assert torch.equal(out.tokens, ar_tokens[("anole", 3.0, batch)]), (window, batch)


# (3) special tokens where the family's decoder expects them; decoded size


def parse_lumina(model, seq):
    """Lumina-mGPT's ``FlexARItemProcessor.decode_image`` logic, by token names."""
    vocab = vocab_of(model)
    names = {i: n for n, i in vocab.items()}
    code_of = {i: c for c, i in enumerate(image_ids_by_code(model))}
    start = seq.index(vocab["<racm3:break>"])
    assert seq[-1] == vocab["<eoss>"]
    tokens = seq[start + 1 : -1]
    h_grids, w_grids = (int(names[t][len("<reserved"):-1]) - 8800 for t in tokens[:2])
    tokens = tokens[2:]
    h, w = 2 * h_grids, 2 * w_grids
    assert len(tokens) == h * (w + 1)
    codes = []
    for i, t in enumerate(tokens):
        if (i + 1) % (w + 1) == 0:
            assert t == vocab["<reserved08799>"], i
        else:
            codes.append(code_of[t])
    return (h, w), codes


def test_lumina_sequence_layout_and_decoded_size(lumina, ar_tokens):
    tokens = ar_tokens[("lumina", 3.0, 2)]
    ids = image_ids_by_code(lumina)
    for b, prompt in enumerate(PROMPTS):
        seq = lumina.layout.full_sequence(prompt, [ids[c] for c in tokens[b].tolist()])
        assert seq[: len(prompt) + 1] == [BOS_ID, *prompt]
        grid, codes = parse_lumina(lumina, seq)
        assert grid == lumina.grid == (6, 8) and codes == tokens[b].tolist()
    images = lumina.decode_images(tokens)
    assert images.shape == (2, 3, 12, 16) and images.dtype == torch.float32
    assert images.abs().max() <= 1.0 and images.std() > 0


def test_cached_sequence_is_the_family_sequence(lumina, anole, ar_tokens):
    for model in (lumina, anole):
        out, seen = generate_recording_row_sequences(model, PROMPTS, method="sjd", window=9, sampling=GUIDED)
        ids = image_ids_by_code(model)
        for b, prompt in enumerate(PROMPTS):
            full = model.layout.full_sequence(prompt, [ids[c] for c in out.tokens[b].tolist()])
            cached, uncond = seen[b]  # K = N - 1 image tokens at the end, padding skipped
            assert cached == full[: len(cached)] and len(cached) < len(full)  # a strict prefix
            region = cached[len(model.layout.prefix(prompt)) :]
            assert uncond[len(uncond) - len(region) :] == region  # uncond rows: same image ids


@pytest.mark.parametrize("kind, method, sampling", [
    ("lumina", "sjd", SamplingConfig(guidance_scale=3.0, temperature=1.0, top_k=20)),
    ("lumina", "csd", SamplingConfig(guidance_scale=3.0, temperature=1.0)),
    ("anole", "sjd", GUIDED),
])
def test_kv_state_after_every_iteration_equals_fresh_prefill(request, kind, method, sampling):
    model = request.getfixturevalue(kind)
    out, checked = generate_checking_every_iteration(model, PROMPTS, method=method, window=10, sampling=sampling,
                                                     seed=4)
    assert len(checked) == out.steps and max(checked[-1]) == model.num_image_tokens - 1


# (6) clear errors, and the memory estimate


def test_errors_name_the_bad_value(checkpoint, lumina, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ChameleonImageModel.from_pretrained(str(tmp_path / "nope"))
    tiny_config().save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="holds no weights"):
        ChameleonImageModel.from_pretrained(str(tmp_path), height=12, width=16)
    for kwargs, match in [
        (dict(height=10, width=16), "height=10: allowed positive multiples of 4"),
        (dict(height=12, width=40), r"image side 40 px: its resolution token .<reserved08810>. is not in the checkpoint.s vocabulary; allowed: sides up to 32 px \(multiples of 4\)$"),
        (dict(layout="emu3"), "layout='emu3'; allowed: lumina, anole"),
        (dict(layout="anole", height=32, width=32), "allowed only 16x16"),
        (dict(height=12, width=16, vqgan=str(tmp_path)), "vqgan.yaml"),
        (dict(height=12, width=16, prompt_template="no field"), r"has no \{prompt\}"),
        (dict(height=12, width=16, prompt_template="{prompt} {size}"), r"allowed fields: \{prompt\}, \{width\}, \{height\}"),
    ]:
        with pytest.raises(ValueError, match=match):
            ChameleonImageModel.from_pretrained(checkpoint, **kwargs)
    no_tokenizer = ChameleonImageModel(lumina.backbone, "lumina", 12, 16)
    with pytest.raises(ValueError, match="need a tokenizer"):
        csdgen.generate(no_tokenizer, ["a cat"], method="ar")
    vocab = len(SPECIALS) + V
    with pytest.raises(ValueError, match=f"token ids must be in 0..{vocab - 1}"):
        csdgen.generate(lumina, [[4, vocab]], method="ar")
    with pytest.raises(ValueError, match="batch_size=3 differs"):
        lumina.start(PROMPTS, 3, True)
    broken = {k: v for k, v in torch.load(os.path.join(checkpoint, "vqgan.ckpt"), weights_only=True)["state_dict"].items()
              if not k.startswith("decoder.conv_out")}
    torch.save(broken, tmp_path / "vqgan.ckpt")
    with pytest.raises(ValueError, match="decoder weights missing"):
        load_vqgan_decoder(os.path.join(checkpoint, "vqgan.yaml"), str(tmp_path / "vqgan.ckpt"))


def test_too_long_prompt_is_refused_before_the_first_forward_naming_both_lengths(lumina, anole):
    # lumina 6 x 8: <racm3:break>, 2 resolution tokens, 6 x 9 region, <eoss> = 58 positions of 128
    ok, too_long = [[4] * (128 - 58 - 1)], [[4] * (128 - 58)]
    lumina.start(ok, None, True)
    with pytest.raises(ValueError, match=r"^prompt of 71 tokens \+ image of 58 positions = 129 > max_position_embeddings=128; "
                                         r"allowed: prompts up to 70 tokens$"):
        lumina.start(too_long, None, True)
    # anole 8 x 8: <racm3:break>, 64 codes, <eoss> = 66 positions
    with pytest.raises(ValueError, match=r"prompt of 63 tokens \+ image of 66 positions = 129 > max_position_embeddings=128"):
        csdgen.generate(anole, [[4] * 62], method="ar")


def test_memory_estimate_counts_parameters_cache_and_buffers(lumina):
    config = lumina.backbone.config
    params = sum(p.numel() for p in lumina.backbone.parameters())
    one = lumina.memory_estimate(1, 16, torch.float32)
    seq = 128 + 1 + 2 + 6 * 9 + 1  # prompt (BOS included), <racm3:break>, 2 resolution tokens, region, <eoss>
    kv = 2 * 2 * 2 * seq * 2 * 16 * 4
    assert one == (params + V * 64) * 4 + kv + (2 + 3) * 17 * V * 4
    estimate = lumina.memory(16)
    assert [estimate.bytes(b) for b in (1, 2, 5)] == [lumina.memory_estimate(b, 16, torch.float32) for b in (1, 2, 5)]
    assert estimate.bytes(2) - estimate.bytes(1) == estimate.per_image == kv + 5 * 17 * V * 4  # linear in the batch
    assert lumina.memory_estimate(1, 16, torch.float32, prompt_length=10) < one
    assert lumina.memory_estimate(2, 16, torch.float32) > one > lumina.memory_estimate(1, 16, torch.bfloat16)
    assert config_memory(config, lumina.layout, 16, torch.float32, guided=False).bytes(1) < one


# (7) the released on-disk layouts: Lumina-mGPT's q/k norms, BOS by name, prompts by the reference templates


def test_lumina_layout_loads_and_gives_the_same_logits_as_the_expanded_layout(checkpoint, tmp_path):
    folder = lumina_layout(checkpoint, tmp_path / "Lumina-mGPT-tiny")
    with pytest.raises(RuntimeError, match="size mismatch|mismatch"):  # what a plain transformers load does
        ChameleonForConditionalGeneration.from_pretrained(folder)
    config = ChameleonConfig.from_pretrained(folder)
    assert shared_norm_shapes(folder, config) == {f"model.layers.{i}.self_attn.{n}_norm.{w}": (1, 16)
                                                  for i in range(2) for n in "qk" for w in ("weight", "bias")}
    assert shared_norm_shapes(checkpoint, config) == {}
    lumina_model = ChameleonImageModel.from_pretrained(folder, height=12, width=16)
    expanded = ChameleonImageModel.from_pretrained(checkpoint, height=12, width=16)
    assert lumina_model.backbone.model.layers[0].self_attn.q_norm.weight.shape == (4, 16)
    assert lumina_model.backbone.model.layers[1].self_attn.k_norm.bias.shape == (2, 16)
    torch.manual_seed(5)
    codes = torch.randint(0, V, (2, 13))
    a, b = lumina_model.start(PROMPTS, None, True), expanded.start(PROMPTS, None, True)
    for x, y in ((a.prefill(), b.prefill()), (a.forward(codes, 0), b.forward(codes, 0))):
        assert torch.equal(x.cond, y.cond) and torch.equal(x.uncond, y.uncond)
    assert auto.family_of(folder) == "lumina-mgpt"


def test_lumina_shard_rows_are_repeated_per_head(checkpoint, tmp_path):
    """model_parallel_size 2: each shard's row serves its heads (Lumina-mGPT ``repeat_param``)."""
    folder = lumina_layout(checkpoint, tmp_path / "mp2")
    file = os.path.join(folder, "model.safetensors")
    state = load_file(file)
    rows = torch.tensor([[1.0] * 16, [2.0] * 16])
    state["model.layers.0.self_attn.q_norm.weight"] = rows
    save_file(state, file, metadata={"format": "pt"})
    model = ChameleonImageModel.from_pretrained(folder, height=12, width=16)
    assert model.backbone.model.layers[0].self_attn.q_norm.weight[:, 0].tolist() == [1.0, 1.0, 2.0, 2.0]
    state["model.layers.0.self_attn.q_norm.weight"] = torch.ones(3, 16)
    save_file(state, file, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"q_norm.weight has shape \[3, 16\]: allowed \[4, 16\] .* or \[model_parallel_size, 16\]"):
        ChameleonImageModel.from_pretrained(folder, height=12, width=16)


def test_bos_and_pad_come_from_the_vocabulary_not_the_config_default(checkpoint, lumina, anole):
    config = json.loads(open(os.path.join(checkpoint, "config.json")).read())
    assert "bos_token_id" not in config and ChameleonConfig.from_pretrained(checkpoint).bos_token_id == 1  # the trap: <pad>
    for model in (lumina, anole):
        assert (model.layout.bos, model.layout.pad) == (BOS_ID, PAD_ID)
        ids = model.start(PROMPTS, None, False).prefix_ids  # row 0 the longest, row 1 left-padded by 2
        assert ids[0, 0] == BOS_ID and ids[1].tolist()[:3] == [PAD_ID, PAD_ID, BOS_ID]


def test_string_prompts_give_the_reference_rows(lumina, anole, checkpoint):
    """Cond and uncond rows for "red cat", written out by hand from the reference code.

    Lumina-mGPT (demos, ``Conversation``, ``xllmx`` item processor): ``<s>`` + "Generate an image of
    {W}x{H} according to the following prompt:\n{prompt}" + ``<reserved08706>``, then (forced
    here) ``<racm3:break>`` and the height/width tokens; uncond = from ``<racm3:break>`` on.
    Anole (``text2image.py``, ``tokens_from_ui``, ``_split_inputs_for_cfg``): ``<s>`` + prompt +
    ``<reserved08706>`` + ``<racm3:break>``; uncond = ``[<s>, <racm3:break>]``.
    """
    v = tiny_config().vocabulary_map
    words = [v[w] for w in ["Generate", "an", "image", "of", "16x12", "according", "to", "the", "following", "prompt:"]]
    boi, eot, h, w = v["<racm3:break>"], v["<reserved08706>"], v["<reserved08803>"], v["<reserved08804>"]
    red, cat = v["red"], v["cat"]
    cond, uncond = lumina.prompt_rows(["red cat"])
    assert cond == [[0, *words, red, cat, eot, boi, h, w]] and uncond == [[boi, h, w]]
    cond, uncond = anole.prompt_rows(["red cat"])
    assert cond == [[0, red, cat, eot, boi]] and uncond == [[0, boi]]
    assert (eot, boi) == (SPECIALS.index("<reserved08706>"), SPECIALS.index("<racm3:break>"))
    custom = ChameleonImageModel.from_pretrained(checkpoint, height=12, width=16, prompt_template="t0 {prompt} t1")
    assert custom.prompt_ids(["t5 t3 t8"]) == [[4, 9, 7, 12, 5]] == [PROMPTS[0]]
    out = csdgen.generate(custom, ["t5 t3 t8"], method="sjd", window=6, sampling=GUIDED)
    assert torch.equal(out.tokens, csdgen.generate(lumina, PROMPTS[:1], method="ar", sampling=GUIDED).tokens)


# (8) what the released checkpoints say (size, VQ weights) and how their tokenizers load


SIZE_TOKENS = [f"<reserved{8800 + n:05d}>" for n in (16, 24, 32)]  # 512, 768, 1024 px in 32 px units


def sized_checkpoint(path) -> str:
    """A tiny Lumina-mGPT checkpoint with the real VQ downsampling (16 px per token: 5 levels), so a
    512 / 768 / 1024 px image has the released grids (32, 48, 64 tokens a side), in Lumina's layout."""
    config = tiny_config()
    vocab = dict(config.vocabulary_map)
    vocab.update({name: len(vocab) + i for i, name in enumerate(SIZE_TOKENS)})
    config = ChameleonConfig(**{**config.to_dict(), "vocabulary_map": vocab, "vocab_size": len(vocab),
                                "max_position_embeddings": 4400,
                                "vq_config": {**config.vq_config.to_dict(), "resolution": 512,
                                              "channel_multiplier": [1, 1, 2, 2, 4]}})
    torch.manual_seed(0)
    ChameleonForConditionalGeneration(config).save_pretrained(path)
    data = json.loads(open(os.path.join(path, "config.json")).read())
    for key in ("bos_token_id", "pad_token_id", "eos_token_id"):
        data.pop(key, None)
    data["architectures"] = ["ChameleonXLLMXForConditionalGeneration"]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(data, f)
    word_level_tokenizer(vocab, ["<s>", "<pad>", "</s>", "<unk>"] + SPECIAL_NAMES + SIZE_TOKENS, bos_token="<s>",
                         eos_token="</s>", pad_token="<pad>").save_pretrained(path)
    return str(path)


def test_lumina_resolution_from_checkpoint(tmp_path, capsys):
    """Issue 16 item 1: the size comes from the checkpoint's name (Lumina-mGPT-7B-512 / -768 / -1024, folder or
    repo id), never the old 768 default; a name without one is refused asking for --image-size."""
    from csdgen import cli

    source = sized_checkpoint(tmp_path / "source")
    snapshot = tmp_path / "hub" / "models--Alpha-VLLM--Lumina-mGPT-7B-1024" / "snapshots" / "0123abcd"
    snapshot.parent.mkdir(parents=True)
    for link in (tmp_path / "Lumina-mGPT-7B-512", tmp_path / "my-lumina", snapshot):
        os.symlink(source, link)
    model = auto.load_model(tmp_path / "Lumina-mGPT-7B-512", device="cpu")
    assert model.layout.kind == "lumina" and model.grid == (32, 32) and model.pixel_size == (512, 512)
    v = model.backbone.config.vocabulary_map
    assert model.layout.resolution_tokens == (v["<reserved08816>"], v["<reserved08816>"])
    assert auto.prompts_for(snapshot, "lumina-mgpt").layout.rows == 64  # a Hugging Face cache snapshot: its repo name
    assert auto.estimate_memory(tmp_path / "Lumina-mGPT-7B-512", "lumina-mgpt", 16, "float32").per_image == \
        model.memory(16).per_image
    assert ChameleonImageModel.from_pretrained(str(tmp_path / "Lumina-mGPT-7B-512")).grid == (32, 32)
    from csdgen.models.chameleon import lumina_size_from_names

    assert [lumina_size_from_names(n) for n in ("Alpha-VLLM/Lumina-mGPT-7B-768", "Lumina-mGPT-7B-768-Omni",
                                                "Lumina-mGPT-34B-512", "lumina_step1024", "Lumina-mGPT-7B")] == \
        [768, 768, 512, None, None]
    # nothing in the name: refused before any weight is read, asking for --image-size; given, it is used
    for attempt in (lambda: auto.load_model(tmp_path / "my-lumina", device="cpu"),
                    lambda: ChameleonImageModel.from_pretrained(str(tmp_path / "my-lumina")),
                    lambda: auto.estimate_memory(tmp_path / "my-lumina", "lumina-mgpt", 16, "float32")):
        with pytest.raises(ValueError, match=r"Lumina-mGPT image size unknown: .*my-lumina.* give --image-size S"):
            attempt()
    assert auto.load_model(tmp_path / "my-lumina", image_size=768, device="cpu").grid == (48, 48)
    assert auto.load_model(tmp_path / "Lumina-mGPT-7B-512", height=768, device="cpu").grid == (48, 32)  # one side given
    capsys.readouterr()
    assert cli.main(["generate", "--model", str(tmp_path / "my-lumina"), "--prompt", "red cat", "--device", "cpu",
                     "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "give --image-size S" in err and len(err.splitlines()) == 1 and not (tmp_path / "o").exists()
    with pytest.raises(ValueError, match=r"different Lumina-mGPT image sizes: 512 .*768"):
        lumina_size_from_names("Lumina-mGPT-7B-512", "/ckpts/Lumina-mGPT-7B-768")


def without_vq_weights(checkpoint, path) -> str:
    """A Lumina-mGPT copy as its fine-tuning saves it: ``model.vqmodel`` deleted, so no ``model.vqmodel.*``
    tensors, and no VQGAN files beside it."""
    folder = lumina_layout(checkpoint, path)
    file = os.path.join(folder, "model.safetensors")
    state = {k: v for k, v in load_file(file).items() if not k.startswith("model.vqmodel.")}
    save_file(state, file, metadata={"format": "pt"})
    for name in ("vqgan.yaml", "vqgan.ckpt"):
        os.remove(os.path.join(folder, name))
    return folder


def test_lumina_without_vq_weights(checkpoint, tmp_path, capsys):
    """Issue 16 item 2: a checkpoint without vqmodel weights is detected at load; GSD, LANTERN and image decoding
    then refuse naming --vqgan PATH, and with the VQGAN given they use its codebook (never the random one)."""
    from csdgen import cli

    folder = without_vq_weights(checkpoint, tmp_path / "Lumina-mGPT-tuned")
    model = ChameleonImageModel.from_pretrained(folder, height=12, width=16)
    with pytest.raises(ValueError, match=r"holds no model.vqmodel.quantize.embedding.weight .* --vqgan PATH"):
        model.codebook_embeddings()  # not transformers' random initialisation of the missing table
    from csdgen.models.base import CodebookUnavailable
    from csdgen.models.chameleon import stores_codebook

    with pytest.raises(CodebookUnavailable):
        model.codebook_embeddings()
    assert stores_codebook(checkpoint) and not stores_codebook(folder)
    assert model.codebook_stored is False and model.vqgan is None
    for method in ("gsd", "lantern"):
        with pytest.raises(ValueError, match=r"--vqgan PATH"):
            csdgen.generate(model, PROMPTS, method=method, window=4, sampling=GUIDED)
    with pytest.raises(NotImplementedError, match=r"--vqgan PATH"):
        model.decode_images(torch.zeros(1, 48, dtype=torch.long))
    assert csdgen.generate(model, PROMPTS, method="sjd", window=4, sampling=GUIDED).tokens.shape == (2, 48)  # no codebook needed
    reference = load_vqgan_decoder(os.path.join(checkpoint, "vqgan.yaml"), os.path.join(checkpoint, "vqgan.ckpt"))
    assert reference.source == os.path.join(checkpoint, "vqgan.ckpt")  # named when it does not fit a checkpoint
    from csdgen.models.chameleon_vqgan import vqgan_files

    release = tmp_path / "chameleon" / "tokenizer"  # Chameleon's release folder: the files in its tokenizer/
    release.mkdir(parents=True)
    for name in ("vqgan.yaml", "vqgan.ckpt"):
        os.symlink(os.path.join(checkpoint, name), release / name)
    assert vqgan_files(release.parent) == (str(release / "vqgan.yaml"), str(release / "vqgan.ckpt"))
    for given in (checkpoint, os.path.join(checkpoint, "vqgan.ckpt"), os.path.join(checkpoint, "vqgan.yaml")):
        # the folder, or either file with the other beside it
        fixed = auto.load_model(folder, vqgan=given, height=12, width=16, device="cpu")
        assert torch.equal(fixed.codebook_embeddings(), reference.quantize.embedding.weight.float())
        assert fixed.decode_images(torch.zeros(1, 48, dtype=torch.long)).shape == (1, 3, 12, 16)
    assert csdgen.generate(fixed, PROMPTS, method="gsd", window=4, sampling=GUIDED).tokens.shape == (2, 48)
    with pytest.raises(ValueError, match=r"VQGAN .* holds no vqgan.yaml \+ vqgan.ckpt"):
        auto.load_model(folder, vqgan=tmp_path, height=12, width=16, device="cpu")
    # the command line: refused with --vqgan in the message, then run with it
    capsys.readouterr()
    argv = ["generate", "--model", folder, "--prompt", "red cat", "--height", "12", "--width", "16", "--method", "gsd",
            "--window", "4", "--top-k", "8", "--device", "cpu", "--no-maps", "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 2
    assert "give --vqgan PATH" in capsys.readouterr().err
    assert cli.main([*argv, "--vqgan", os.path.join(checkpoint, "vqgan.ckpt")]) == 0
    assert cli.main(["bench", "--model", folder, "--prompts", str(write_prompts(tmp_path)), "--methods", "gsd",
                     "--height", "12", "--width", "16", "--top-k", "8", "--device", "cpu", "--out", str(tmp_path / "b")]) == 2
    assert "--vqgan PATH" in capsys.readouterr().err


def write_prompts(tmp_path):
    file = tmp_path / "prompts.txt"
    file.write_text("red cat\n")
    return file


def byte_level_checkpoint(path) -> str:
    """The tiny checkpoint with a byte-level BPE tokenizer ("Ġred", "Ġcat" merged) declared as
    ``LlamaTokenizer`` in tokenizer_config.json, as Chameleon's converter declares it (LlamaTokenizerFast)."""
    from tokenizers import decoders

    config = tiny_config()
    vocab = dict(config.vocabulary_map)
    merges = []
    for word in ("Ġred", "Ġcat"):
        for ch in word:
            vocab.setdefault(ch, len(vocab))
        for i in range(2, len(word) + 1):
            merges.append((word[: i - 1], word[i - 1]))
            vocab.setdefault(word[:i], len(vocab))
    vocab.setdefault("a", len(vocab))
    config = ChameleonConfig(**{**config.to_dict(), "vocabulary_map": vocab, "vocab_size": len(vocab)})
    torch.manual_seed(0)
    ChameleonForConditionalGeneration(config).save_pretrained(path)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>"] + SPECIAL_NAMES)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            pad_token="<pad>").save_pretrained(path)
    settings = json.loads(open(os.path.join(path, "tokenizer_config.json")).read())
    settings["tokenizer_class"] = "LlamaTokenizer"
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(settings, f)
    return str(path)


def test_chameleon_metaspace_tokenizer_check(tmp_path, monkeypatch):
    """Issue 16 item 5: a byte-level Chameleon tokenizer that loads as a Metaspace LlamaTokenizer (transformers 5
    without its ByteLevel routing, or LlamaTokenizer.from_pretrained) must re-encode "a red cat" to the ids of
    its tokenizer.json, else it is refused at load time in one line."""
    from transformers import LlamaTokenizerFast
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    from csdgen.models.chameleon import ChameleonPrompts

    folder = byte_level_checkpoint(tmp_path / "Anole-bytes")
    v = json.loads(open(os.path.join(folder, "config.json")).read())["vocabulary_map"]
    expected = [v["a"], v["Ġred"], v["Ġcat"]]
    assert Tokenizer.from_file(os.path.join(folder, "tokenizer.json")).encode("a red cat").ids == expected
    prompts = ChameleonPrompts.from_folder(folder, layout="anole", prompt_template="{prompt}")  # AutoTokenizer 5.24: fine
    assert prompts.prompt_ids(["a red cat"]) == [expected]
    if not hasattr(TokenizersBackend, "_tokenizer_json_has_byte_level"):  # 5.16 has none (and loads it right, above)
        pytest.skip("this transformers has no ByteLevel routing to switch off: the refusal cannot be provoked")
    monkeypatch.setattr(TokenizersBackend, "_tokenizer_json_has_byte_level", classmethod(lambda cls, *a, **k: False))
    for attempt in (lambda: ChameleonPrompts.from_folder(folder, layout="anole"),
                    lambda: ChameleonImageModel.from_pretrained(folder, layout="anole")):
        with pytest.raises(ValueError) as exc:
            attempt()
        message = str(exc.value)
        assert "\n" not in message and "loads as LlamaTokenizer (pre-tokenizer Metaspace" in message
        assert f"its tokenizer.json gives {expected}" in message and "TokenizersBackend" in message
    from csdgen.models._transformers import check_tokenizer

    with pytest.raises(ValueError, match=r"no '▁' pieces \(a byte-level vocabulary\)"):  # no file to compare with
        check_tokenizer(LlamaTokenizerFast.from_pretrained(folder))


def test_an_unknown_lumina_size_names_each_name_once():
    from csdgen.models.chameleon import lumina_pixel_size

    with pytest.raises(ValueError, match=r"^Lumina-mGPT image size unknown: the name 'tinycham' holds none of 512, "):
        lumina_pixel_size(None, None, "tinycham", None, "tinycham")
    with pytest.raises(ValueError, match=r"^Lumina-mGPT image size unknown: the names 'a', 'b' hold none of "):
        lumina_pixel_size(None, None, "a", "b", "a")


def test_vqgan_is_recorded_and_another_decoder_is_refused_on_resume(checkpoint, tmp_path, capsys):
    """--vqgan makes other PNGs from the same tokens: a run (and a bench) records it, and a rerun into the same
    folder with another decoder is refused naming both; a record without it (the default decoder, as
    folders written before it was recorded hold) resumes without --vqgan and is refused with one."""
    from cli_helpers import cli_error, run

    other = tmp_path / "other-vqgan"
    other.mkdir()
    for name in ("vqgan.yaml", "vqgan.ckpt"):
        shutil.copy(os.path.join(checkpoint, name), other / name)
    out = tmp_path / "o"
    argv = ["generate", "--model", checkpoint, "--prompt", "red cat", "--height", "12", "--width", "16", "--method",
            "sjd", "--window", "4", "--top-k", "8", "--device", "cpu", "--no-maps", "--out", out]
    assert run(*argv) == 0  # the default decoder: no vqgan in the record, as before it was recorded
    assert "vqgan" not in json.loads((out / "record.json").read_text())["settings"]
    assert run(*argv) == 0  # resumed
    assert "1 kept from an earlier run" in capsys.readouterr().out
    err = cli_error(capsys, *argv, "--vqgan", other)
    assert "other settings (vqgan: the default decoder" in err and repr(str(other))[1:-1] in err, err
    given = tmp_path / "given"
    assert run(*argv[:-1], given, "--vqgan", checkpoint) == 0
    assert json.loads((given / "record.json").read_text())["settings"]["vqgan"] == os.path.realpath(checkpoint)
    capsys.readouterr()
    # the decoder's checkpoint file is the same decoder as its folder (the option takes either)
    assert run(*argv[:-1], given, "--vqgan", os.path.join(checkpoint, "vqgan.ckpt")) == 0
    assert "1 kept from an earlier run" in capsys.readouterr().out
    err = cli_error(capsys, *argv[:-1], given, "--vqgan", other)
    assert f'vqgan: "{os.path.realpath(checkpoint)}" there, "{os.path.realpath(other)}" here' in err, err
    err = cli_error(capsys, *argv[:-1], given)
    assert f'vqgan: "{os.path.realpath(checkpoint)}" there, the default decoder' in err, err
    # a bench the same way
    bench = ["bench", "--model", checkpoint, "--prompts", write_prompts(tmp_path), "--methods", "sjd", "--seeds", "0",
             "--floor-seed", "none", "--height", "12", "--width", "16", "--window", "4", "--top-k", "8", "--device", "cpu", "--out", tmp_path / "b"]
    assert run(*bench, "--vqgan", checkpoint) == 0
    capsys.readouterr()
    err = cli_error(capsys, *bench, "--vqgan", other)
    assert f'vqgan: "{os.path.realpath(checkpoint)}" there, "{os.path.realpath(other)}" here' in err, err
