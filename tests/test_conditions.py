"""Each condition a text family takes is a prompt string of UTF-8 text or a token-id list: anything
else is refused naming its index, its value and what is allowed (csdgen/models/_conditions.py)."""

from __future__ import annotations

import pytest
import torch

import csdgen
from csdgen.models._conditions import check_conditions
from csdgen.prompts import check_text


@pytest.mark.parametrize("conditions, error, message", [
    ([3], TypeError, r"^conditions\[0\] = 3 \(int\); allowed: a prompt string or a list of token ids"),
    (["a", None], TypeError, r"^conditions\[1\] = None \(NoneType\); allowed: "),
    ([b"cat"], TypeError, r"^conditions\[0\] = b'cat' \(bytes\); allowed: "),
    ([[1, 2.5]], TypeError, r"^conditions\[0\]\[1\] = 2.5 \(float\); allowed: "),
    ([[1, True]], TypeError, r"^conditions\[0\]\[1\] = True \(bool\); allowed: "),
    ([torch.ones(2, 2, dtype=torch.long)], ValueError, r"^conditions\[0\]: a torch.int64 tensor of shape \(2, 2\)"),
    (["caf\udce9"], ValueError, r"^conditions\[0\] = 'caf\\udce9' is not UTF-8 text \(byte 3: b'\\xe9'\)"),
    (["x\ud800"], ValueError, r"^conditions\[0\] = 'x\\ud800' holds a lone surrogate '\\ud800' at character 1"),
])
def test_a_bad_condition_is_named_with_its_index_and_what_is_allowed(conditions, error, message):
    with pytest.raises(error, match=message):
        check_conditions(conditions)


def test_prompt_strings_and_id_lists_pass():
    conditions = ["a café", [1, 2], (3,), torch.tensor([4, 5])]
    assert check_conditions(conditions) is conditions
    assert check_text("naïve") == "naïve"


@pytest.fixture(scope="module")
def janus(tmp_path_factory):
    from test_models_janus import build_checkpoint
    from csdgen.models.auto import load_model

    return load_model(build_checkpoint(tmp_path_factory.mktemp("janus")))


@pytest.mark.parametrize("bad, error", [(3, TypeError), (None, TypeError), (b"x", TypeError),
                                        ("caf\udce9", ValueError)])
def test_generate_refuses_a_bad_condition_of_a_text_model_by_its_index(janus, bad, error):
    with pytest.raises(error, match=r"^conditions\[1\] = "):
        csdgen.generate(janus, ["a cat", bad], seed=0, window=4)
