"""Emu3 adapter on a tiny random Emu3ForConditionalGeneration, saved and loaded back offline.

The tiny tokenizer is built with the ``tokenizers`` library: a byte-level BPE with no merges
(every byte is a token, so any prompt and the resolution text "5*6" tokenise), plus Emu3's
special tokens and 64 visual tokens ``<|visual token000000|>`` .. under their Emu3 names,
wrapped in ``PreTrainedTokenizerFast`` with the attributes ``Emu3Processor`` reads
(``boi_token``, ``image_wrapper_token``, ...). It is saved next to the model, so the adapter,
``Emu3Processor`` and the reference ``generate`` all use the same tokenizer and the same ids.
The visual tokens are added last, so the visual ids are a contiguous block; a second model
with the visual tokens interleaved checks the non-contiguous path.
"""

import shutil

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoTokenizer,
    Emu3Config,
    Emu3ForConditionalGeneration,
    Emu3ImageProcessor,
    Emu3Processor,
    PreTrainedTokenizerFast,
)

import csdgen
from csdgen import SamplingConfig
from csdgen.models.emu3 import POSITIVE_PROMPT, Emu3ImageModel, estimate_memory_from_pretrained
from kv_check import generate_checking_every_iteration

V, ROWS, COLS, FACTOR = 64, 5, 6, 2  # codebook, grid, VQ spatial factor (channel_multiplier of length 2)
HEIGHT, WIDTH = ROWS * FACTOR, COLS * FACTOR
GREEDY = SamplingConfig(temperature=0)
GUIDED_GREEDY = SamplingConfig(temperature=0, guidance_scale=3.0)
PROMPTS = ["a red cat", "two dogs on a long sunny beach"]  # different lengths: left padding in a batch
SUFFIXED = [p + POSITIVE_PROMPT for p in PROMPTS]  # what BAAI's example feeds Emu3 for PROMPTS
NEGATIVE = "blurry, low quality"
SPECIALS = ["<|endoftext|>", "<|extra_203|>", "<|extra_204|>", "<|extra_200|>", "<|extra_201|>",
            "<|image start|>", "<|image end|>", "<|image token|>", "<image>"]
VISUAL = [f"<|visual token{v:06d}|>" for v in range(V)]


def make_tokenizer(interleave: bool = False) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer with Emu3's special and visual tokens (see the module docstring)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    added = SPECIALS + VISUAL
    if interleave:  # visual ids not contiguous, not in codebook order
        added = [t for pair in zip(VISUAL[::-1], SPECIALS + [None] * V) for t in pair if t is not None]
    backend.add_special_tokens(added)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|extra_203|>", eos_token="<|extra_204|>", pad_token="<|endoftext|>",
        unk_token="<|endoftext|>", padding_side="left",
        extra_special_tokens={"boi_token": "<|image start|>", "eoi_token": "<|image end|>", "image_token": "<image>",
                              "image_wrapper_token": "<|image token|>", "eof_token": "<|extra_201|>"},
    )


def build_checkpoint(folder, interleave: bool = False, seed: int = 0):
    tokenizer = make_tokenizer(interleave)
    config = Emu3Config(
        vocabulary_map=tokenizer.get_vocab(),
        text_config=dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id),
        vq_config=dict(codebook_size=V, embed_dim=4, latent_channels=4, base_channels=32, channel_multiplier=[1, 1],
                       num_res_blocks=1, attn_resolutions=[], hidden_size=32, temporal_downsample_factor=4),
    )
    torch.manual_seed(seed)
    model = Emu3ForConditionalGeneration(config).eval()
    visual = torch.tensor([tokenizer.convert_tokens_to_ids(t) for t in VISUAL])
    with torch.no_grad():  # peaked targets, weak dependence on the last token: drafts get accepted and rejected
        model.lm_head.weight.mul_(6.0)
        model.model.text_model.embed_tokens.weight[visual] *= 0.1
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("emu3"))


@pytest.fixture(scope="module")
def emu3(checkpoint):
    return Emu3ImageModel.from_pretrained(checkpoint, height=HEIGHT, width=WIDTH, negative_prompt=NEGATIVE)


@pytest.fixture(scope="module")
def reference(checkpoint):
    """Emu3's own model, tokenizer and processor, loaded from the same folder."""
    model = Emu3ForConditionalGeneration.from_pretrained(checkpoint).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    tokenizer.padding_side = "left"
    return model, tokenizer, Emu3Processor(Emu3ImageProcessor(), tokenizer)


def processor_inputs(processor, prompts):
    """``Emu3Processor(..., return_for_image_generation=True)`` at ROWS x COLS tokens.

    The processor derives the token grid from ``ratio`` and ``image_area`` with its own factor
    (``downsample_ratio`` = 8), so the area is given in those units.
    """
    ds = processor.downsample_ratio
    return processor(text=prompts, return_for_image_generation=True, ratio=f"{COLS}:{ROWS}",
                     image_area=ROWS * COLS * ds * ds, padding=True, return_tensors="pt")


def prefix_allowed_tokens_fn(tokenizer, visual_tokens):
    """The constraint of the transformers Emu3 docs (image generation example), for ROWS x COLS."""
    eol = tokenizer.convert_tokens_to_ids("<|extra_200|>")

    def fn(batch_id, input_ids):
        position = torch.nonzero(input_ids == tokenizer.image_wrapper_token_id, as_tuple=True)[0][0]
        offset = input_ids.shape[0] - position
        if offset % (COLS + 1) == 0:
            return (eol,)
        if offset == (COLS + 1) * ROWS + 1:
            return (tokenizer.eof_token_id,)
        if offset == (COLS + 1) * ROWS + 2:
            return (tokenizer.eoi_token_id,)
        if offset == (COLS + 1) * ROWS + 3:
            return (tokenizer.eos_token_id,)
        if offset > (COLS + 1) * ROWS + 3:
            return (tokenizer.pad_token_id,)
        return visual_tokens

    return fn


def reference_generate(reference, prompts, **kwargs):
    """Emu3's ``generate`` with its prefix constraint, greedy: the generated part ``[B, ROWS*(COLS+1)+3]``."""
    model, tokenizer, processor = reference
    inputs = processor_inputs(processor, prompts)
    assert inputs.pop("image_sizes") == [[ROWS, COLS]] * len(prompts)
    fn = prefix_allowed_tokens_fn(tokenizer, model.vocabulary_mapping.image_tokens)
    out = model.generate(**inputs, max_new_tokens=ROWS * (COLS + 1) + 3, do_sample=False,
                         prefix_allowed_tokens_fn=fn, **kwargs)
    return out[:, inputs["input_ids"].shape[1]:]


@pytest.fixture(scope="module")
def ar_greedy(emu3):
    return {b: csdgen.generate(emu3, PROMPTS[:b], method="ar", sampling=GREEDY).tokens for b in (1, 2)}


# (1) csdgen AR greedy == Emu3's own generate with its prefix constraint ------------------------


@pytest.mark.parametrize("batch", [1, 2])
def test_ar_greedy_equals_emu3_generate(emu3, reference, ar_greedy, batch):
    expected = reference_generate(reference, SUFFIXED[:batch])
    model = reference[0]
    codes = model.vocabulary_mapping.convert_bpe2img(expected[:, :-3].view(batch, ROWS, COLS + 1)).flatten(1)
    assert torch.equal(ar_greedy[batch], codes.long())
    assert len(set(ar_greedy[batch][0].tolist())) > 3  # not a degenerate constant image
    # (3) the special tokens land where Emu3's constraint put them
    assert torch.equal(emu3.image_sequence(ar_greedy[batch]), expected)


def test_ar_guided_greedy_equals_emu3_generate_with_its_cfg(emu3, reference):
    """transformers' CFG (a separate forward over the negative prompt) gives the same tokens."""
    _, tokenizer, processor = reference
    negative = processor_inputs(processor, [NEGATIVE])
    expected = reference_generate(reference, SUFFIXED[:1], guidance_scale=GUIDED_GREEDY.guidance_scale,
                                  negative_prompt_ids=negative["input_ids"],
                                  negative_prompt_attention_mask=negative["attention_mask"])
    tokens = csdgen.generate(emu3, PROMPTS[:1], method="ar", sampling=GUIDED_GREEDY).tokens
    assert torch.equal(emu3.image_sequence(tokens), expected)


# (2) SJD greedy == AR greedy, windows spanning row ends -----------------------------------------


@pytest.mark.parametrize("batch", [1, 2])
def test_sjd_greedy_equals_ar(emu3, ar_greedy, batch):
    for window in (2, 5, 6, 7, 13, 40):
        for init in ("uniform", "repeat-vertical"):
            out = csdgen.generate(emu3, PROMPTS[:batch], method="sjd", window=window, sampling=GREEDY, draft_init=init)
            assert torch.equal(out.tokens, ar_greedy[batch]), (window, init)


def test_sjd_greedy_saves_steps_and_guided_sjd_equals_guided_ar(emu3, ar_greedy):
    out = csdgen.generate(emu3, PROMPTS, method="sjd", window=8, sampling=GREEDY)
    assert torch.equal(out.tokens, ar_greedy[2]) and out.steps < ROWS * COLS
    ar = csdgen.generate(emu3, PROMPTS, method="ar", sampling=GUIDED_GREEDY).tokens
    for window in (4, 7, 16):
        assert torch.equal(csdgen.generate(emu3, PROMPTS, method="sjd", window=window, sampling=GUIDED_GREEDY).tokens, ar)


# (3) layout: prompt, forced end-of-line tokens, decoding ----------------------------------------


def test_prompt_ids_equal_emu3_processor(emu3, reference):
    processor = reference[2]
    for prompt in PROMPTS + [NEGATIVE, ""]:
        expected = processor_inputs(processor, [prompt])["input_ids"][0].tolist()
        assert emu3.prompt_ids(prompt) == expected
        assert processor.tokenizer.decode(expected).endswith("<|image start|>5*6<|image token|>")
    body = reference[1](PROMPTS[0])["input_ids"]
    assert emu3.prompt_ids(body) == emu3.prompt_ids(PROMPTS[0])  # token-id conditions: the prompt body
    no_tokenizer = Emu3ImageModel(emu3.model, None, HEIGHT, WIDTH)  # ids from config.vocabulary_map only
    assert no_tokenizer.prompt_ids(body) == emu3.prompt_ids(PROMPTS[0])
    with pytest.raises(ValueError, match="no tokenizer"):
        no_tokenizer.prompt_ids("a red cat")


def test_window_logits_equal_one_teacher_forced_forward_of_the_full_sequence(emu3, reference):
    """Every window slot returns the logits Emu3 computes at the right place of its own sequence."""
    model = reference[0]
    tokens = torch.randint(0, V, (1, ROWS * COLS), generator=torch.Generator().manual_seed(3))
    full = torch.cat([torch.tensor([emu3.condition_ids(PROMPTS[1])]), emu3.image_sequence(tokens)], dim=1)
    with torch.no_grad():
        logits = model(input_ids=full).logits[0][:, emu3.visual_ids]
    P = len(emu3.condition_ids(PROMPTS[1]))
    # the position whose output predicts image token i+1: the EOL after a row end, else token i
    source = [P - 1] + [P + i + i // COLS + (1 if (i + 1) % COLS == 0 else 0) for i in range(ROWS * COLS - 1)]
    assert all(full[0, s] == emu3.special["eol"] for i, s in enumerate(source[1:]) if (i + 1) % COLS == 0)
    session = emu3.start([PROMPTS[1]], None, guided=False)
    got = [session.prefill().cond[0]]
    for start, width in ((0, 4), (4, 9), (13, 1), (14, 15)):  # several windows cross row ends
        got.append(session.forward(tokens[:, start : start + width], start).cond[0])
    torch.testing.assert_close(torch.cat(got), logits[source], atol=1e-4, rtol=1e-4)


def test_decode_images_goes_through_emu3_decode_image_tokens(emu3, reference, ar_greedy):
    images = emu3.decode_images(ar_greedy[2])
    assert images.shape == (2, 3, HEIGHT, WIDTH) and images.dtype == torch.float32
    assert emu3.image_size == (HEIGHT, WIDTH) and images.abs().max() <= 1
    expected = reference[0].decode_image_tokens(image_tokens=emu3.image_sequence(ar_greedy[2]), height=ROWS, width=COLS)
    torch.testing.assert_close(images, expected.clamp(-1, 1))
    assert emu3.codebook_embeddings().shape == (V, 4)


def test_visual_ids_are_resolved_from_the_vocabulary(tmp_path, reference):
    folder = build_checkpoint(tmp_path / "interleaved", interleave=True)
    model = Emu3ImageModel.from_pretrained(folder, height=HEIGHT, width=WIDTH)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert model.visual_ids.tolist() == [tokenizer.convert_tokens_to_ids(t) for t in VISUAL]
    assert model.visual_ids.tolist() != sorted(model.visual_ids.tolist())
    session = model.start(["x"], None, guided=False)
    cond = session.prefill().cond
    hidden = model.model.model(input_ids=torch.tensor([model.condition_ids("x")])).last_hidden_state[:, -1:]
    torch.testing.assert_close(cond, model.model.lm_head(hidden)[..., model.visual_ids])


# (4) guidance in one batched forward == separate cond and uncond forwards -----------------------


def test_batched_guidance_equals_unbatched_forwards(emu3):
    tokens = torch.randint(0, V, (2, ROWS * COLS), generator=torch.Generator().manual_seed(1))
    guided = emu3.start(PROMPTS, None, guided=True)
    cond = [emu3.start([p], None, guided=False) for p in PROMPTS]
    plain = Emu3ImageModel(emu3.model, emu3.tokenizer, HEIGHT, WIDTH, NEGATIVE, positive_prompt="")
    uncond = [plain.start([NEGATIVE], None, guided=False) for _ in PROMPTS]  # the negative prompt, alone, unpadded

    def check(batched, b, single, uncond_single):
        torch.testing.assert_close(batched.cond[b : b + 1], single.cond, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(batched.uncond[b : b + 1], uncond_single.cond, atol=1e-5, rtol=1e-5)

    first = guided.prefill()
    for b in range(2):
        check(first, b, cond[b].prefill(), uncond[b].prefill())
    for start, width in ((0, 7), (7, 5), (12, 11)):
        out = guided.forward(tokens[:, start : start + width], start)
        for b in range(2):
            window = tokens[b : b + 1, start : start + width]
            check(out, b, cond[b].forward(window, start), uncond[b].forward(window, start))
    assert guided.input_ids.shape[0] == 4 and not guided.prompt_mask.all()  # really padded, 2B rows


# (5) KV cache after rollback == fresh prefill of the committed tokens ---------------------------


@pytest.mark.parametrize("method, sampling, window", [("sjd", SamplingConfig(guidance_scale=3.0), 9), ("csd", GUIDED_GREEDY, 7)])
def test_kv_state_after_every_iteration_equals_fresh_prefill(emu3, method, sampling, window):
    emu3 = Emu3ImageModel(emu3.model, emu3.tokenizer, HEIGHT, WIDTH, NEGATIVE, positive_prompt="")  # the prompts that hit row ends
    # independent refresh: the trajectory (seed 0) that reaches both rollback cases below
    out, checked = generate_checking_every_iteration(emu3, PROMPTS, method=method, window=window, sampling=sampling,
                                                     seed=0, refresh="independent")
    assert len(checked) == out.steps and max(checked[-1]) == ROWS * COLS - 1
    # rollbacks to just after a row's EOL and to just before it happened
    every = [k for lengths in checked for k in lengths]
    assert any(k % COLS == 0 and k for k in every) and any(k % COLS == COLS - 1 for k in every)


# (6) clear errors ---------------------------------------------------------------------------------


def test_missing_path_and_missing_weights(tmp_path, checkpoint):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Emu3ImageModel.from_pretrained(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    for f in broken.glob("*.safetensors*"):
        f.unlink()
    with pytest.raises(FileNotFoundError, match="holds no weights"):
        Emu3ImageModel.from_pretrained(broken, height=HEIGHT, width=WIDTH)


@pytest.mark.parametrize(
    "size, match",
    [
        ((11, WIDTH), r"height=11 px: allowed positive multiples of 2 px"),
        ((HEIGHT, 0), r"width=0 px: allowed positive multiples of 2 px"),
        ((HEIGHT, 12.0), r"width=12.0 px"),
        ((40, 40), r"max_position_embeddings=128; allowed: .* up to 20 x 20 px"),
        ((None, None), r"720 x 720 px .* max_position_embeddings=128"),  # Emu3's default is too big here
    ],
)
def test_bad_resolution_raises_value_error_naming_what_is_allowed(checkpoint, size, match):
    with pytest.raises(ValueError, match=match):
        Emu3ImageModel.from_pretrained(checkpoint, height=size[0], width=size[1])


def test_a_negative_prompt_too_long_for_the_positions_is_named_as_such(checkpoint):
    """With the default negative prompt (its row longer than the tiny model's positions) the refusal blamed a
    9-character prompt: 'prompt of 203 tokens ...; allowed: prompts up to 83 tokens'."""
    from csdgen.models.auto import load_model

    with pytest.raises(ValueError, match=r"^the negative prompt's row of \d+ tokens \+ image of \d+ positions = \d+ > "
                                         r"max_position_embeddings=128; allowed: a negative prompt \(negative_prompt=, "
                                         r"--negative-prompt\) whose row takes at most \d+ tokens$"):
        load_model(checkpoint, height=HEIGHT, width=WIDTH, prompts=["a red cat"])
    with pytest.raises(ValueError, match=r"^prompt of \d+ tokens"):  # control: a short negative prompt, a long prompt
        load_model(checkpoint, height=HEIGHT, width=WIDTH, negative_prompt=NEGATIVE, prompts=["x" * 100])


def test_bad_conditions_and_dtype(emu3, checkpoint):
    with pytest.raises(ValueError, match="non-empty list"):
        emu3.start(None, 2, guided=False)
    with pytest.raises(ValueError, match="batch_size=3 differs"):
        emu3.start(PROMPTS, 3, guided=False)
    with pytest.raises(ValueError, match=r"token ids \[1000000\]: allowed a non-empty list of ids in 0.."):
        emu3.start([[10**6]], None, guided=False)
    # 5 x 6 image: 5 x 7 visual and end-of-line tokens + 3 end tokens = 38 positions of 128
    with pytest.raises(ValueError, match=r"^prompt of 247 tokens \+ image of 38 positions = 285 > max_position_embeddings=128; "
                                         r"allowed: prompts up to 90 tokens$"):
        emu3.start(["x" * 200], None, guided=False)
    emu3.start([[5] * (90 - 6)], None, guided=False)  # BOS + 84 + the 5-token image prefix = 90: accepted
    with pytest.raises(ValueError, match=r"prompt of 91 tokens"):
        emu3.start([[5] * (91 - 6)], None, guided=False)
    with pytest.raises(ValueError, match="dtype='int8'"):
        Emu3ImageModel.from_pretrained(checkpoint, dtype="int8", height=HEIGHT, width=WIDTH)


def test_memory_estimate_from_config_equals_loaded_model(emu3, checkpoint):
    params = sum(p.numel() for p in emu3.model.parameters()) * 4
    loaded = emu3.memory_estimate(2, 16, torch.float32)
    assert loaded == estimate_memory_from_pretrained(checkpoint, 2, 16, torch.float32, height=HEIGHT, width=WIDTH)
    assert params < emu3.memory_estimate(2, 16, torch.float32, guided=False) < loaded
    assert emu3.memory_estimate(2, 16, torch.bfloat16) < loaded


# (7) prompts as BAAI's Emu3-Gen example builds them ------------------------------------------------


def byte_ids(tokenizer, text):
    """The byte-level tokenizer's id of each character (space is the byte-level "Ġ")."""
    return [tokenizer.convert_tokens_to_ids("Ġ" if c == " " else c) for c in text]


def test_cond_and_uncond_rows_equal_the_hand_written_sequence(emu3, checkpoint):
    """``<|extra_203|>`` + prompt + " masterpiece, film grained, best quality." + ``<|image start|>5*6<|image token|>``;
    the uncond row: the negative prompt in the same layout, without the positive prompt."""
    tok = emu3.tokenizer
    bos, boi, wrapper = (tok.convert_tokens_to_ids(t) for t in ("<|extra_203|>", "<|image start|>", "<|image token|>"))
    image = [boi, *byte_ids(tok, "5*6"), wrapper]
    cond, uncond = emu3.prompt_rows(["red cat"])
    assert cond == [[bos, *byte_ids(tok, "red cat masterpiece, film grained, best quality."), *image]]
    assert uncond == [[bos, *byte_ids(tok, NEGATIVE), *image]]
    off = Emu3ImageModel.from_pretrained(checkpoint, height=HEIGHT, width=WIDTH, negative_prompt=NEGATIVE, positive_prompt="",
                                         prompt_template="{prompt}, {width}x{height}")
    assert off.prompt_rows(["red cat"])[0] == [[bos, *byte_ids(tok, "red cat, 12x10"), *image]]
    assert emu3.prompt_rows([[7, 8]])[0] == [[bos, 7, 8, *image]]  # token ids: no template, no positive prompt


# prompt tokens as BAAI's tokenizer makes them (Qwen's pre-tokenization)

QWEN_TEXT = "A close-up photo of a red-haired girl, high-quality."
#: QWEN_TEXT split by BAAI's Emu3 tokenizer's rule (PAT_STR, Qwen's): an optional non-letter joins the letters
#: after it ("-up", " close"), a comma or full stop before a space or the end stands alone: 13 pieces
QWEN_PIECES = ["A", " close", "-up", " photo", " of", " a", " red", "-haired", " girl", ",", " high", "-quality", "."]
#: what the GPT-2 rule of transformers' converted tokenizer.json makes of the parts that differ
GPT2_ONLY = ["up", "haired", "quality", "12"]


def merged_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE whose vocabulary holds every piece of QWEN_PIECES (merge chains, ranked first), GPT-2's
    pieces and "12", plus Emu3's special and visual tokens: one token per piece under either split."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = []
    as_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    for piece in QWEN_PIECES + GPT2_ONLY:
        text = "".join(w for w, _ in as_bytes.pre_tokenize_str(piece))
        for i in range(2, len(text) + 1):
            if (text[: i - 1], text[i - 1]) not in merges:
                merges.append((text[: i - 1], text[i - 1]))
            vocab.setdefault(text[:i], len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # convert_emu3_weights_to_hf.py's
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIALS + VISUAL)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|extra_203|>", eos_token="<|extra_204|>", pad_token="<|endoftext|>",
        extra_special_tokens={"boi_token": "<|image start|>", "eoi_token": "<|image end|>", "image_token": "<image>",
                              "image_wrapper_token": "<|image token|>", "eof_token": "<|extra_201|>"})


def test_emu3_prompt_tokens_qwen_split(tmp_path):
    from csdgen.models.emu3 import Emu3Prompts

    tokenizer = merged_tokenizer()
    config = Emu3Config(
        vocabulary_map=tokenizer.get_vocab(),
        text_config=dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256),
        vq_config=dict(codebook_size=V, embed_dim=4, latent_channels=4, base_channels=32, channel_multiplier=[1, 1],
                       num_res_blocks=1, attn_resolutions=[], hidden_size=32, temporal_downsample_factor=4))
    config.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    prompts = Emu3Prompts.from_folder(tmp_path, height=24, width=24, positive_prompt="")  # 12 x 12 tokens
    vocab = tokenizer.get_vocab()
    byte = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    ids = [vocab["".join(w for w, _ in byte.pre_tokenize_str(p))] for p in QWEN_PIECES]
    prefix = [vocab["<|image start|>"], vocab["1"], vocab["2"], vocab["*"], vocab["1"], vocab["2"], vocab["<|image token|>"]]
    cond, _ = prompts.prompt_rows([QWEN_TEXT])
    assert len(ids) == 13 and cond == [[vocab["<|extra_203|>"], *ids, *prefix]]  # BOS, 13 pieces, "12*12" digit by digit
    # the loaded tokenizer itself still splits by GPT-2's rule (16 pieces): the adapter uses a copy
    assert len(AutoTokenizer.from_pretrained(tmp_path)(QWEN_TEXT)["input_ids"]) == 16
    # BAAI normalises to NFC first: a decomposed e + combining acute encodes as the composed letter
    assert prompts.tokenizer("e\u0301")["input_ids"] == prompts.tokenizer("\u00e9")["input_ids"]
