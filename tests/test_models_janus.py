"""Janus adapter: greedy equality with transformers' own image generation, SJD == AR, layout,
batched guidance, KV state after rollback, errors.

The checkpoint is a tiny random Janus (llama text model, 6 x 6 = 36 image tokens, V = 256,
24 px images) with a word-level tokenizer and a JanusProcessor, saved to a tmp dir and loaded
back offline. The generation head is scaled up (peaked, well-separated logits: argmax is not
decided by rounding) and the image-token embeddings scaled down (drafts get accepted).
"""

import contextlib
import json

import pytest
import torch
import transformers
from transformers import GenerationConfig, JanusConfig, JanusForConditionalGeneration, JanusProcessor

try:  # the PIL image processor's name since transformers 5.x; before, JanusImageProcessor was that one
    from transformers import JanusImageProcessorPil
except ImportError:
    from transformers import JanusImageProcessor as JanusImageProcessorPil

import csdgen
from csdgen import SamplingConfig
from csdgen.models.janus import JanusImageModel, estimate_memory_from_pretrained
from tiny_tokenizer import word_level_tokenizer
from kv_check import generate_checking_every_iteration

PAD, BOS, EOS, IMAGE, BOI, EOI = 0, 1, 2, 3, 4, 5
SPECIALS = ["<pad>", "<bos>", "<eos>", "<image_placeholder>", "<begin_of_image>", "<end_of_image>", "<|User|>", "<|Assistant|>"]
WORDS = ["a", "red", "dog", "cat", "running", "in", "the", "rain", ":", "<unk>"]
CHAT = (
    "{% for m in messages %}<|User|>: {{ m['content'][0]['text'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}<|Assistant|>:{% endif %}"
)
GRID, SIZE, V = 6, 24, 256
PROMPTS = ["a red dog", "the cat running in the rain"]  # different lengths: left padding
GUIDED = SamplingConfig(temperature=0, guidance_scale=3.0)
EXTRA_TOKENS = {"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>", "eoi_token": "<end_of_image>"}


def tiny_tokenizer():
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    return word_level_tokenizer(vocab, SPECIALS, prepend_bos="<bos>", bos_token="<bos>", eos_token="<eos>",
                                pad_token="<pad>", extra_special_tokens=EXTRA_TOKENS)


def tiny_janus(seed=0):
    config = JanusConfig(
        text_config=dict(model_type="llama", vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS),
        vision_config=dict(image_size=SIZE, patch_size=4, num_image_tokens=GRID * GRID, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=1, num_attention_heads=2, projection_dim=64),
        vq_config=dict(embed_dim=8, num_embeddings=V, base_channels=32, channel_multiplier=[1, 1, 2],
                       image_token_embed_dim=64, projection_dim=64, num_patches=GRID),
        image_token_id=IMAGE,
    )
    torch.manual_seed(seed)
    model = JanusForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.model.generation_head.vision_head.weight.mul_(30.0)
        model.model.generation_embeddings.weight.mul_(0.1)
    model.generation_config = GenerationConfig(bos_token_id=BOS, pad_token_id=PAD, eos_token_id=EOS,
                                               generation_kwargs={"boi_token_id": BOI})
    return model


def build_checkpoint(folder):
    """Save the tiny Janus and its processor (tokenizer + chat template) to ``folder``; return it."""
    tiny_janus().save_pretrained(folder)
    processor = JanusProcessor(JanusImageProcessorPil(size={"height": SIZE, "width": SIZE}), tiny_tokenizer(),
                               chat_template=CHAT, num_image_tokens=GRID * GRID)
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("janus"))


@pytest.fixture(scope="module")
def janus(checkpoint):
    return JanusImageModel.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def ar_tokens(janus):
    return {b: csdgen.generate(janus, PROMPTS[:b], method="ar", sampling=GUIDED).tokens for b in (1, 2)}


def reference_inputs(janus, prompts):
    """The inputs of the transformers Janus example: chat template, then processor(generation_mode="image")."""
    chats = [janus.processor.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": p}]}],
                                                 add_generation_prompt=True) for p in prompts]
    return janus.processor(text=chats, generation_mode="image", return_tensors="pt", padding=True)


# (1) the family's own greedy generation


@pytest.mark.parametrize("scale", [3.0, 5.0])
def test_ar_equals_transformers_generate_image_mode(janus, ar_tokens, scale):
    inputs = reference_inputs(janus, PROMPTS)
    assert inputs["attention_mask"].min() == 0  # the batch is left-padded
    try:
        reference = janus.model.generate(**inputs, generation_mode="image", do_sample=False, guidance_scale=scale)
    except TypeError as error:  # transformers 5.16 and 5.17: _prepare_static_cache() missing an argument
        if "_prepare_static_cache" not in str(error):
            raise
        pytest.skip(f"transformers {transformers.__version__}'s own Janus image generation fails ({error}): no reference")
    ours = ar_tokens[2] if scale == 3.0 else csdgen.generate(
        janus, PROMPTS, method="ar", sampling=SamplingConfig(temperature=0, guidance_scale=scale)).tokens
    assert reference.shape == ours.shape == (2, GRID * GRID)
    assert torch.equal(reference, ours)


def test_token_id_conditions_equal_the_prompt_strings(janus, ar_tokens):
    ids = [janus.encode_conditions([p])[0] for p in PROMPTS]
    out = csdgen.generate(janus, [ids[0], ids[1][:-1]], method="ar", sampling=GUIDED)  # BOI appended when missing
    assert torch.equal(out.tokens, ar_tokens[2])


# (2) speculative greedy == AR


@pytest.mark.parametrize("batch", [1, 2])
def test_greedy_sjd_equals_ar(janus, ar_tokens, batch):
    steps = []
    for window in (2, 5, 7, 13, 36):  # 5, 7, 13 span rows of 6
        out = csdgen.generate(janus, PROMPTS[:batch], method="sjd", window=window, sampling=GUIDED)
        assert torch.equal(out.tokens, ar_tokens[batch]), window
        steps.append(out.steps)
    assert min(steps) < GRID * GRID  # drafts were accepted somewhere
    csd = csdgen.generate(janus, PROMPTS[:batch], method="csd", window=7, sampling=GUIDED, refresh="coupled")
    assert torch.equal(csd.tokens, ar_tokens[batch])


# (3) sequence layout and image size


def test_prompt_and_uncond_rows_are_laid_out_as_generate_does(janus):
    ids = janus.encode_conditions(PROMPTS)
    tok = janus.processor.tokenizer
    assert ids[0] == [BOS] + tok.convert_tokens_to_ids(["<|User|>", ":", "a", "red", "dog", "<|Assistant|>", ":"]) + [BOI]
    session = janus.start(PROMPTS, None, guided=True)
    P = len(ids[1])
    pad = P - len(ids[0])
    uncond0 = [BOS] + [PAD] * (len(ids[0]) - 2) + [BOI]
    expected = [[PAD] * pad + ids[0], ids[1], [PAD] * pad + uncond0, [BOS] + [PAD] * (P - 2) + [BOI]]
    assert session.input_ids.tolist() == expected  # cond rows first, then uncond, left-padded
    assert session.prompt_mask.tolist() == [[0] * pad + [1] * len(ids[0]), [1] * P] * 2


def test_window_logits_equal_one_teacher_forced_forward_of_the_full_sequence(janus, ar_tokens):
    """Prompt ids, then image tokens through the generation embeddings, in one cache-free forward."""
    ids, tokens = janus.encode_conditions(PROMPTS[1:]), ar_tokens[2][1:]
    model = janus.model
    with torch.no_grad():
        embeds = torch.cat([model.get_input_embeddings()(torch.tensor(ids)),
                            model.prepare_embeddings_for_image_generation(tokens[:, :-1])], dim=1)
        full = model.model.generation_head(model.model.language_model(inputs_embeds=embeds).last_hidden_state)
    session = janus.start(PROMPTS[1:], None, guided=False)
    first = session.prefill().cond
    rest = torch.cat([session.forward(tokens[:, k : k + 7], k).cond for k in range(0, 35, 7)], dim=1)
    P = len(ids[0])
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full[:, P - 1 :], atol=1e-4, rtol=1e-4)


def test_decode_images_size_range_and_equality_with_decode_image_tokens(janus, ar_tokens):
    images = janus.decode_images(ar_tokens[2])
    assert images.shape == (2, 3, SIZE, SIZE) and images.dtype == torch.float32
    assert images.min() >= -1 and images.max() <= 1 and not images.requires_grad
    with torch.no_grad():
        nhwc = janus.model.decode_image_tokens(ar_tokens[2])
    assert torch.equal(images, nhwc.permute(0, 3, 1, 2).clamp(-1, 1))
    assert janus.grid == (GRID, GRID) and janus.num_image_tokens == 36 and janus.codebook_size == V
    assert janus.image_size == SIZE
    codes = janus.codebook_embeddings()
    assert codes.shape == (V, 8)
    torch.testing.assert_close(codes.norm(dim=-1), torch.ones(V))


# (4) guidance in one batched forward == separate cond-only and uncond-only forwards


def test_batched_guidance_equals_separate_forwards(janus, ar_tokens):
    ids = janus.encode_conditions(PROMPTS)
    tokens = ar_tokens[2][:, :9]
    both = janus.start(PROMPTS, None, guided=True)
    cond = janus.start(ids, None, guided=False)
    uncond = janus.start([janus.uncond_ids(i) for i in ids], None, guided=False)
    runs = [(s.prefill(), s.forward(tokens, 0)) for s in (both, cond, uncond)]
    for step in range(2):
        torch.testing.assert_close(runs[0][step].cond, runs[1][step].cond, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(runs[0][step].uncond, runs[2][step].cond, atol=1e-5, rtol=1e-5)
        assert runs[1][step].uncond is None
    # a padded row gives what the same prompt gives alone
    alone = janus.start(PROMPTS[:1], None, guided=True)
    alone.prefill()
    single = alone.forward(tokens[:1], 0)
    torch.testing.assert_close(single.cond, runs[0][1].cond[:1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(single.uncond, runs[0][1].uncond[:1], atol=1e-5, rtol=1e-5)


# (5) KV cache after rollback == fresh prefill of the committed tokens


@pytest.mark.parametrize("method, sampling", [("sjd", SamplingConfig(guidance_scale=3.0)), ("csd", GUIDED)])
def test_kv_state_after_every_iteration_equals_fresh_prefill(janus, method, sampling):
    out, checked = generate_checking_every_iteration(janus, PROMPTS, method=method, window=8, sampling=sampling, seed=1)
    assert len(checked) == out.steps and max(checked[-1]) == 35


# (6) errors


def test_missing_folder_and_missing_weights(tmp_path, checkpoint):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        JanusImageModel.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text((checkpoint / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="holds no weights"):
        JanusImageModel.from_pretrained(tmp_path)


def test_tokenizer_files_without_their_config_are_one_line_naming_the_folder(tmp_path, checkpoint):
    """tokenizer.json without tokenizer_config.json (which defines the image tokens) ended in
    transformers' AttributeError traceback from inside JanusProcessor."""
    import shutil

    from csdgen.models.auto import load_model

    folder = tmp_path / "partial"
    shutil.copytree(checkpoint, folder)
    (folder / "tokenizer_config.json").unlink()
    with pytest.raises(ValueError, match=r"partial': its tokenizer files \(tokenizer.json, processor_config.json\) do "
                                         r"not make a JanusProcessor \(.*image_token\); copy the checkpoint's tokenizer_config.json"):
        load_model(folder)


@pytest.mark.parametrize("key, change, message", [
    ("num_hidden_layers", 1, r"config.json asks for weights its files do not hold \(9, e.g. model.language_model.layers.2\."),
    ("vocab_size", 1, r"config.json does not fit its weights \(1 of another shape: model.language_model.embed_tokens.weight "
                      r"is \[64, 64\] in the files, \[65, 64\] by config.json\)"),
])
def test_a_config_that_does_not_fit_the_weights_is_refused(tmp_path, checkpoint, key, change, message):
    """A config.json naming a layer more than the files hold decoded with a layer transformers started at
    random (saying so only in its load report); another vocab_size ended in its RuntimeError traceback. The
    refusal is the one line: transformers' load report table, which printed before it, is held back."""
    import json
    import shutil

    from csdgen.models.auto import load_model

    folder = tmp_path / "edited"
    shutil.copytree(checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"][key] += change
    (folder / "config.json").write_text(json.dumps(config))
    with _load_reports() as reports, pytest.raises(ValueError, match=message):
        load_model(folder)
    assert reports == []


@contextlib.contextmanager
def _load_reports():
    """The load reports transformers logs while the block runs (its messages)."""
    import logging

    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage()) if "LOAD REPORT" in record.getMessage() else None
    logger = logging.getLogger("transformers.modeling_utils")
    logger.addHandler(handler)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)


def test_a_load_that_is_not_refused_still_shows_transformers_load_report(tmp_path, checkpoint):
    import json
    import shutil

    from csdgen.models.auto import load_model

    folder = tmp_path / "fewer-layers"
    shutil.copytree(checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] -= 1  # the files hold a layer more: transformers reports, csdgen loads
    (folder / "config.json").write_text(json.dumps(config))
    with _load_reports() as reports:
        load_model(folder)
    assert len(reports) == 1 and "UNEXPECTED" in reports[0]


def test_bad_resolution(checkpoint, janus):
    with pytest.raises(ValueError, match="image_size=384: .* allowed: 24"):
        JanusImageModel.from_pretrained(checkpoint, image_size=384)
    with pytest.raises(ValueError, match="allowed: 24"):
        janus.start(PROMPTS, None, True, image_size=48)
    assert janus.start(PROMPTS, None, True, image_size=SIZE).batch_size == 2


def test_bad_conditions_and_dtype(janus, checkpoint):
    with pytest.raises(ValueError, match="needs conditions"):
        janus.start(None, 2, True)
    with pytest.raises(ValueError, match="batch_size=3 differs"):
        janus.start(PROMPTS, 3, True)
    with pytest.raises(ValueError, match="ids in 0..63"):
        janus.start([[BOS, 64]], None, True)
    with pytest.raises(ValueError, match="non-empty list"):
        janus.start("a red dog", None, True)
    with pytest.raises(ValueError, match="dtype='int8'"):
        JanusImageModel.from_pretrained(checkpoint, dtype="int8")
    with pytest.raises(ValueError, match=r"start\[0\]=3: allowed 0..0"):
        session = janus.start(PROMPTS, None, True)
        session.prefill()
        session.forward(torch.zeros(2, 1, dtype=torch.long), 3)


def test_strings_need_a_processor_and_generation_config_needs_special_ids(tmp_path):
    model = tiny_janus()
    model.save_pretrained(tmp_path)
    janus = JanusImageModel.from_pretrained(tmp_path)  # no tokenizer: ids only
    with pytest.raises(ValueError, match="no processor/tokenizer"):
        janus.start(["a red dog"], None, True)
    assert janus.start([[BOS, 7, BOI]], None, True).batch_size == 1
    (tmp_path / "generation_config.json").write_text(json.dumps({"bos_token_id": BOS, "pad_token_id": PAD}))
    with pytest.raises(ValueError, match="boi_token_id not found"):
        JanusImageModel.from_pretrained(tmp_path)


def test_memory_estimate_counts_parameters_kv_cache_and_buffers(janus, checkpoint):
    params = sum(p.numel() for p in janus.model.parameters())
    kv = 2 * 2 * 4 * (10 + 36) * 2 * 16 * 4  # layers, k+v, 2B rows, positions, kv heads, head dim, bytes
    buffers = 2 * (2 + 3) * 17 * V * 4  # per image: its 2 rows of logits + target, draft, residual over W + 1 slots
    assert janus.memory_estimate(2, 16, torch.float32, prompt_length=10) == params * 4 + kv + buffers
    assert estimate_memory_from_pretrained(checkpoint, 2, 16, "float32", prompt_length=10) == params * 4 + kv + buffers
    estimate = janus.memory(16, prompt_length=10)
    assert estimate.fixed == params * 4 and estimate.per_image * 2 == kv + buffers  # linear in the batch size
    assert estimate.largest_batch(int((params * 4 + 3 * estimate.per_image) / 0.9) + 1) == 3  # 10 % headroom kept


# (7) the reference prompt, prefill through the generation head, refusals before the first forward


def test_cond_and_uncond_rows_equal_the_hand_written_sequence(janus):
    """deepseek-ai/Janus generation_inference.py: ``<|User|>: {prompt}\\n\\n<|Assistant|>:`` + ``<begin_of_image>``
    after BOS; the uncond row keeps BOS and begin-of-image and pads the rest (``tokens[i, 1:-1] = pad_id``)."""
    tok = janus.processor.tokenizer
    user, assistant, colon, red, cat = tok.convert_tokens_to_ids(["<|User|>", "<|Assistant|>", ":", "red", "cat"])
    cond, uncond = janus.prompt_rows(["red cat"])
    assert cond == [[BOS, user, colon, red, cat, assistant, colon, BOI]]
    assert uncond == [[BOS, PAD, PAD, PAD, PAD, PAD, PAD, BOI]]
    assert (janus.bos_token_id, janus.boi_token_id, janus.pad_token_id) == (BOS, BOI, PAD)


def test_prompt_template_applies_before_the_chat_template(checkpoint):
    model = JanusImageModel.from_pretrained(checkpoint, prompt_template="{prompt} in the rain")
    assert model.prompt_rows(["a cat"])[0] == JanusImageModel.from_pretrained(checkpoint).prompt_rows(["a cat in the rain"])[0]


def test_prefill_sends_only_the_last_position_through_the_generation_head(janus):
    shapes = []
    hook = janus.model.model.generation_head.register_forward_hook(lambda m, args, out: shapes.append(tuple(args[0].shape)))
    try:
        session = janus.start(PROMPTS, None, True)
        first = session.prefill()
        session.forward(torch.zeros(2, 3, dtype=torch.long), 0)
    finally:
        hook.remove()
    assert shapes == [(4, 1, 64), (4, 3, 64)] and first.cond.shape == (2, 1, V)


def test_too_long_prompt_is_refused_before_the_first_forward(janus):
    limit = janus.config.text_config.max_position_embeddings
    with pytest.raises(ValueError, match=rf"^prompt of {limit - 35} tokens \+ image of 36 positions = {limit + 1} > "
                                         rf"max_position_embeddings={limit}; allowed: prompts up to {limit - 36} tokens$"):
        janus.start([[BOS] + [7] * (limit - 37)], None, True)
    assert janus.start([[BOS] + [7] * (limit - 38)], None, True).batch_size == 1


def test_unsupported_size_is_refused_before_the_weights_are_read(checkpoint, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    header = json.dumps({"x": {"dtype": "NOT-A-DTYPE", "shape": [1], "data_offsets": [0, 1]}}).encode()
    (broken / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0")  # whole, unloadable
    with pytest.raises(ValueError, match="image_size=48: this Janus checkpoint makes 24 x 24 images only"):
        JanusImageModel.from_pretrained(broken, image_size=48)


def test_janus_pad_id_check(tmp_path):
    """Issue 16 item 5: the pad id is the ``<｜▁pad▁｜>`` token's (deepseek-ai/Janus ``VLChatProcessor.pad_id``;
    transformers' converter writes it as generation_config.pad_token_id), not the tokenizer's ``pad_token``,
    and a generation_config.pad_token_id that disagrees with it is refused in one line at load time."""
    from csdgen.models.janus import JanusPrompts

    PAD_TOKEN = "<\uff5c\u2581pad\u2581\uff5c>"  # VLChatProcessor.pad_tag
    pad = len(SPECIALS) + len(WORDS)  # the converted tokenizer's "<｜▁pad▁｜>", after the words
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS + [PAD_TOKEN])}
    tokenizer = word_level_tokenizer(vocab, SPECIALS + [PAD_TOKEN], prepend_bos="<bos>", bos_token="<bos>", eos_token="<eos>",
                                     pad_token="<pad>", extra_special_tokens=EXTRA_TOKENS)  # its pad_token is another token
    model = tiny_janus()
    model.generation_config = GenerationConfig(bos_token_id=BOS, pad_token_id=pad, eos_token_id=EOS,
                                               generation_kwargs={"boi_token_id": BOI})
    model.save_pretrained(tmp_path)
    JanusProcessor(JanusImageProcessorPil(size={"height": SIZE, "width": SIZE}), tokenizer, chat_template=CHAT,
                   num_image_tokens=GRID * GRID).save_pretrained(tmp_path)
    janus = JanusImageModel.from_pretrained(tmp_path)
    assert janus.pad_token_id == pad != tokenizer.pad_token_id
    assert janus.prompt_rows(["red cat"])[1] == [[BOS, pad, pad, pad, pad, pad, pad, BOI]]
    settings = json.loads((tmp_path / "generation_config.json").read_text())
    (tmp_path / "generation_config.json").write_text(json.dumps({**settings, "pad_token_id": PAD}))
    with pytest.raises(ValueError) as exc:
        JanusPrompts.from_folder(tmp_path)
    message = str(exc.value)
    assert f"the Janus pad token {PAD_TOKEN!r} is id {pad} in the tokenizer but generation_config's pad_token_id is {PAD}" \
        in message and "\n" not in message
    with pytest.raises(ValueError, match="pad_token_id is 0"):
        JanusImageModel.from_pretrained(tmp_path)
    from csdgen.models.janus import PAD_TOKEN as named

    assert named == PAD_TOKEN
