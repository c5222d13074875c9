"""The pieces the adapters share (csdgen/models/_transformers.py), against plain loops."""

import pytest
import torch

from csdgen.models._transformers import (
    MemoryEstimate, PaddedRows, RowEnds, check_checkpoint, check_sequence_length, format_prompt, token_id,
)


@pytest.mark.parametrize("cols", [1, 3, 8])
def test_row_ends_insert_equals_the_token_by_token_layout(cols):
    ends = RowEnds(cols, token=99)
    for start in range(0, 2 * cols + 1):
        for W in range(1, 3 * cols + 2):
            ids = torch.arange(100, 100 + W).repeat(2, 1)
            seq, out = ends.insert(ids, start)
            expected, slots = [], []
            for j in range(W):  # the layout written out: token, then its row end when it closes a row
                expected.append(100 + j)
                if ends.is_row_end(start + j):
                    expected.append(99)
                slots.append(len(expected) - 1)
            assert seq[0].tolist() == expected and seq[1].tolist() == expected and out.tolist() == slots
            assert ends.region_length(start + W) - ends.region_length(start) == len(expected)
    none = RowEnds(cols, None)
    seq, out = none.insert(torch.ones(1, 5, dtype=torch.long), 2)
    assert seq.shape == (1, 5) and out.tolist() == list(range(5)) and none.region_length(7) == 7


def test_padded_rows_positions_masks_and_holes():
    rows = PaddedRows([[5, 6, 7], [8]], pad=0, visible=[[True] * 3, [True]])
    assert rows.ids.tolist() == [[5, 6, 7], [0, 0, 8]] and rows.mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert rows.positions.tolist() == [[0, 1, 2], [0, 0, 0]] and rows.lengths.tolist() == [3, 1]
    assert rows.region_positions(4, 2).tolist() == [[7, 8], [5, 6]]
    assert rows.attention_mask(2).tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    holes = PaddedRows([[1, 2, 3, 4]], pad=0, visible=[[True, False, False, True]])  # Anole's uncond row
    assert holes.positions.tolist() == [[0, 0, 0, 1]] and holes.lengths.tolist() == [2]
    assert PaddedRows([[1, 2]], pad=0).attention_mask(3) is None  # nothing masked: plain causal attention


def test_memory_estimate_is_linear_and_keeps_the_headroom():
    m = MemoryEstimate(fixed=1000, per_image=100, headroom=0.1)
    assert [m.bytes(b) for b in (0, 1, 5)] == [1000, 1100, 1500]
    assert m.usable(2000) == 1800 and m.largest_batch(2000) == 8 and m.largest_batch(1000) == 0


def test_refusals_are_one_line_naming_the_value_and_what_is_allowed(tmp_path):
    with pytest.raises(ValueError, match=r"^prompt of 10 tokens \+ image of 20 positions = 30 > max_position_embeddings=25; "
                                         r"allowed: prompts up to 5 tokens$"):
        check_sequence_length(10, 20, 25)
    check_sequence_length(5, 20, 25)
    with pytest.raises(ValueError, match=r"has no \{prompt\}"):
        format_prompt("a picture", "x", 1, 1)
    assert format_prompt("{prompt} at {width}x{height}", "x", 16, 12) == "x at 16x12"
    # a template reaching into a field prompted the model with "<class 'str'> x"; "{prompt!r:>4}" holds a
    # {prompt} field (it was said to have none)
    for template in ("{prompt.__class__} {prompt}", "{prompt[0]}", "{width.real} {prompt}"):
        with pytest.raises(ValueError, match=r"reaches into a field; allowed fields: \{prompt\}, \{width\}, \{height\}"):
            format_prompt(template, "x", 1, 1)
    assert format_prompt("{prompt!r:>4}", "x", 1, 1) == " 'x'"
    with pytest.raises(ValueError, match=r"'<s>' is not in the checkpoint's vocabulary"):
        token_id("<s>", {"<pad>": 1})
    assert token_id("<s>", {"<s>": 0, "<pad>": 1}) == 0

    class Tok:
        unk_token, unk_token_id = "<unk>", 3

        def convert_tokens_to_ids(self, name):
            return {"<s>": 1}.get(name, 3)

    with pytest.raises(ValueError, match=r"'<s>': the tokenizer says id 1, the config's vocabulary 0; allowed: equal ids"):
        token_id("<s>", {"<s>": 0}, Tok())
    assert token_id("<s>", None, Tok()) == 1
    for folder, match in ((tmp_path / "none", "does not exist"), (tmp_path, "has no config.json")):
        with pytest.raises(FileNotFoundError, match=match):
            check_checkpoint(folder, "Emu3")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="holds no weights"):
        check_checkpoint(tmp_path, "Emu3")


def test_an_image_too_big_for_any_prompt_is_refused_naming_the_size_not_a_prompt():
    """Found by a new-user try-out: a size check with prompt length 1 said "prompt of 1 tokens + 32x32 image ...
    allowed: prompts up to 0 tokens", blaming a prompt nobody gave."""
    with pytest.raises(ValueError, match=r"^32x32 image of 276 positions leaves no room for a prompt within "
                                         r"max_position_embeddings=128; allowed: a smaller size, whose image part takes "
                                         r"at most 127 positions$"):
        check_sequence_length(1, 276, 128, "32x32 image")
    with pytest.raises(ValueError, match="leaves no room for a prompt"):
        check_sequence_length(1, 128, 128)
    check_sequence_length(1, 127, 128)


def test_the_cache_goes_under_the_keyword_the_installed_transformers_forward_takes():
    """transformers 5.24 renamed ``past_key_values`` to ``cache``; a name the forward does not take lands in
    its ``**kwargs`` unseen and the model silently runs without the KV cache (wrong logits, no error)."""
    import inspect

    from transformers import LlamaModel

    from csdgen.models._transformers import cache_kwargs

    (keyword,) = cache_kwargs(None)
    assert keyword in inspect.signature(LlamaModel.forward).parameters
    from csdgen.models import ClassConditionalLlama

    model = ClassConditionalLlama.random(codebook_size=16, num_classes=2, grid=(2, 2))
    session = model.start([0], None, False)
    session.prefill()
    session.forward(torch.tensor([[3, 5]]), 0)
    assert session.kv.cache.get_seq_length() == 3  # the prompt and the two image tokens were cached


def test_cache_kwargs_traces_under_torch_compile_without_a_warning():
    """A new-user try-out of `csdgen generate --compile` (docs/engine.md) saw Dynamo's UserWarning about an
    lru_cache-wrapped function in cache_kwargs, with a code excerpt, on stderr; the keyword is now memoised in a
    plain global, which Dynamo traces silently."""
    import warnings

    import torch

    from csdgen.models._transformers import cache_kwargs

    torch._dynamo.reset()

    def forward(x):
        return next(iter(cache_kwargs(x).values())) + 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(forward, backend="eager")(torch.zeros(2))
    assert torch.equal(out, torch.ones(2))
    assert not [w for w in caught if "lru_cache" in str(w.message)], [str(w.message)[:200] for w in caught]
