"""CLIP score on a tiny random CLIP saved to a temporary folder in the released layout."""

import pytest
import torch

from csdgen.evaluation.clip_score import ClipScorer, load_clip


def _byte_symbols() -> list[str]:
    """The 256 printable symbols byte-level BPE tokenizers (GPT-2, CLIP) use for the 256 bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + i) for i in range(len(rest))]


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    """A random CLIP (2 layers, width 32, 32 px images) with a byte-level tokenizer, saved as a folder."""
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPProcessor, CLIPTokenizer

    folder = tmp_path_factory.mktemp("tiny_clip")
    symbols = _byte_symbols()
    vocab = {s: i for i, s in enumerate(symbols + [s + "</w>" for s in symbols])}
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    tokenizer = CLIPTokenizer(vocab=vocab, merges=[])
    # the PIL image processor: what CLIPImageProcessor falls back to without torchvision
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    layers = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    config = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), max_position_embeddings=77, bos_token_id=vocab["<|startoftext|>"],
                         eos_token_id=vocab["<|endoftext|>"], pad_token_id=vocab["<|endoftext|>"], **layers),
        vision_config=dict(image_size=32, patch_size=8, **layers), projection_dim=16)
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(folder)
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return folder


def _images(count, seed=0, size=(40, 48)):
    return torch.randint(0, 256, (count, 3, *size), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


PROMPTS = ["a red cube", "two cats on a sofa", "a blue sphere in the snow", "an owl"]


def test_score_is_100_times_the_clamped_cosine_of_the_projected_embeddings(tiny_clip):
    scorer = ClipScorer(tiny_clip, batch_size=3)
    images = _images(4)
    cosine = scorer.cosine(images, PROMPTS)
    # the definition, written out with the model and processor directly
    model, processor = load_clip(tiny_clip)
    with torch.no_grad():
        inputs = processor(text=PROMPTS, images=list(images), return_tensors="pt", padding=True)
        image_embedding = model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output
        text_embedding = model.get_text_features(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).pooler_output
    expected = (image_embedding / image_embedding.norm(dim=-1, keepdim=True) * text_embedding / text_embedding.norm(dim=-1, keepdim=True)).sum(-1)
    torch.testing.assert_close(cosine, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(scorer.score(images, PROMPTS), 100 * expected.clamp_min(0), rtol=1e-4, atol=1e-3)
    assert not torch.equal(cosine[0].expand(4), cosine)  # prompts and images matter


def test_agrees_with_torchmetrics_clip_score(tiny_clip):
    """torchmetrics' CLIPScore on the same model: max(mean(100 cos), 0) over the batch."""
    from torchmetrics.multimodal.clip_score import CLIPScore

    scorer = ClipScorer(tiny_clip)
    images = _images(4, seed=1)

    class Projected(torch.nn.Module):  # transformers 5 returns output objects; torchmetrics wants tensors
        def __init__(self, clip):
            super().__init__()
            self.clip, self.config = clip, clip.config

        def get_image_features(self, *args, **kwargs):
            return self.clip.get_image_features(*args, **kwargs).pooler_output

        def get_text_features(self, *args, **kwargs):
            return self.clip.get_text_features(*args, **kwargs).pooler_output

    metric = CLIPScore(model_name_or_path=lambda: (Projected(scorer.model), scorer.processor))
    metric.update(list(images), PROMPTS)
    expected = float(metric.compute())
    assert max(float(100 * scorer.cosine(images, PROMPTS).mean()), 0.0) == pytest.approx(expected, rel=1e-4, abs=1e-3)


def test_prefix_and_long_captions(tiny_clip):
    scorer = ClipScorer(tiny_clip)
    prefixed = ClipScorer(tiny_clip, prefix="A photo depicts ")
    images = _images(2, seed=2)
    prompts = ["an owl", "a dog " * 50]  # the second is far over 77 positions: truncated, not an error
    assert not torch.allclose(scorer.cosine(images, prompts), prefixed.cosine(images, prompts))
    torch.testing.assert_close(prefixed.cosine(images, prompts),
                               scorer.cosine(images, ["A photo depicts " + p for p in prompts]))
    truncated = scorer.cosine(images[1:], ["a dog " * 50])
    torch.testing.assert_close(truncated, scorer.cosine(images[1:], ["a dog " * 40]))  # both cut at 77 tokens


def test_pil_images_score_like_tensors(tiny_clip):
    from PIL import Image

    scorer = ClipScorer(tiny_clip)
    images = _images(2, seed=3)
    pil = [Image.fromarray(a.permute(1, 2, 0).numpy()) for a in images]
    torch.testing.assert_close(scorer.score(pil, PROMPTS[:2]), scorer.score(images, PROMPTS[:2]))


def test_bad_inputs_are_one_line_errors(tiny_clip):
    scorer = ClipScorer(tiny_clip)
    with pytest.raises(ValueError, match="one prompt per image"):
        scorer.score(_images(2), ["one"])
    with pytest.raises(ValueError, match=r"uint8 tensor \[B, 3, H, W\].*to_uint8"):
        scorer.score(torch.zeros(2, 3, 8, 8), ["a", "b"])


def test_what_the_float_image_error_advises_is_accepted_the_to_uint8_array(tiny_clip):
    """The error for float images says csdgen.evaluation.maps.to_uint8 converts them, but its
    [B, H, W, 3] uint8 array was refused ("got a list of ndarray"; new-user try-out)."""
    from csdgen.evaluation.maps import to_uint8

    scorer = ClipScorer(tiny_clip)
    floats = _images(2).float() / 127.5 - 1
    with pytest.raises(ValueError, match="to_uint8"):
        scorer.score(floats, PROMPTS[:2])
    array = to_uint8(floats)  # [2, H, W, 3] uint8
    assert torch.allclose(scorer.score(array, PROMPTS[:2]), scorer.score(_images(2), PROMPTS[:2]))
    with pytest.raises(ValueError, match=r"uint8 array \[B, H, W, 3\]"):
        scorer.score(array.astype("float32"), PROMPTS[:2])


def test_missing_weights_say_what_to_download_and_where_to_point(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError) as info:
        ClipScorer("csdgen-tests/no-such-clip")  # not in any cache, and never fetched
    message = str(info.value)
    assert "\n" not in message
    assert "hf download csdgen-tests/no-such-clip" in message and "--clip-model DIR" in message
    (tmp_path / "folder").mkdir()
    with pytest.raises(FileNotFoundError) as info:
        ClipScorer(tmp_path / "folder", option="--clip")
    assert f"the folder {tmp_path / 'folder'}" in str(info.value) and "--clip DIR" in str(info.value)
    assert "hf download openai/clip-vit-large-patch14" in str(info.value)  # a folder: the default model is named
    assert "\n" not in str(info.value)


def test_a_file_given_for_the_clip_folder_is_called_a_file(tmp_path):
    """--clip-model weights.pth (a file that is there) was called "no such folder"."""
    from csdgen.evaluation.clip_score import check_clip_path

    (tmp_path / "weights.pth").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match=r"weights.pth': a file, not a folder; allowed: a folder holding"):
        check_clip_path(str(tmp_path / "weights.pth"))


def test_a_cut_short_weight_file_or_a_broken_config_is_one_line_naming_it(tiny_clip, tmp_path):
    """A model.safetensors cut short ended in safetensors' traceback ("invalid header length"); a config.json
    that is no JSON was called "CLIP weights not found"."""
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(tiny_clip, cut)
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[:5000])
    with pytest.raises(ValueError) as info:
        ClipScorer(cut)
    assert "model.safetensors" in str(info.value) and "\n" not in str(info.value)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_clip, broken)
    (broken / "config.json").write_text("{")
    with pytest.raises(ValueError) as info:
        ClipScorer(broken)
    assert "config.json" in str(info.value) and "not found" not in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("value", ["./nonexist", "../clip", "~/no-such-clip", "models/clip/vit", "C:\\clip"])
def test_a_path_that_is_not_there_is_called_no_such_folder_not_a_repo_to_download(tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        load_clip(value, option="--clip-model")
    message = str(info.value)
    assert message.startswith(f"--clip-model {value!r}: no such folder; allowed: ") and "hf download" not in message
