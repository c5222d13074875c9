"""The library's ``sampling=`` argument: a dict changes only its fields, a bad one is named, a whole
config without guidance warns once."""

from __future__ import annotations

import json
import warnings

import pytest

from builtin_fixture import builtin, weights  # noqa: F401 (fixtures)
from cli_helpers import run


def settings(folder) -> dict:
    return json.loads((folder / "record.json").read_text())["settings"]


def test_sampling_given_as_a_dict_changes_only_those_fields_of_the_models_defaults(builtin):
    import csdgen

    changed = csdgen.generate(builtin, [0], window=4, seed=0, sampling={"temperature": 0.5})
    assert (changed.settings["guidance_scale"], changed.settings["temperature"]) == (3.0, 0.5)
    whole = csdgen.generate(builtin, [0], window=4, seed=0,
                            sampling=csdgen.SamplingConfig(guidance_scale=3.0, temperature=0.5))
    assert changed.tokens.equal(whole.tokens)


@pytest.mark.parametrize("sampling, message", [
    ({"temprature": 0.5}, "sampling={'temprature': 0.5}: unknown key 'temprature' (did you mean 'temperature'?); allowed keys: guidance_scale, "
                          "temperature, top_k, top_p, guidance_schedule, top_n_sigma, top_n_sigma_centered"),
    ({"temperature": "0.5"}, "temperature='0.5': must be a finite number >= 0"),
    ({"top_k": -1}, "top_k=-1: must be None or 0 (no top-k) or an integer >= 1"),
    ("temperature=0.5", "sampling='temperature=0.5': allowed None (the model's defaults), a dict of changes"),
])
def test_a_bad_sampling_dict_or_type_is_one_line_naming_it_and_what_is_allowed(builtin, sampling, message):
    import csdgen

    with pytest.raises(ValueError) as error:
        csdgen.generate(builtin, [0], window=4, sampling=sampling)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_top_k_0_means_no_top_k_as_on_the_command_line_and_the_server(builtin):
    """``--top-k 0`` and the server's ``"top_k": 0`` mean no top-k; the library refused it."""
    import csdgen

    assert csdgen.SamplingConfig(top_k=0) == csdgen.SamplingConfig(top_k=None)
    zero = csdgen.generate(builtin, [0], window=4, seed=0, sampling={"top_k": 0})
    none = csdgen.generate(builtin, [0], window=4, seed=0, sampling={"top_k": None})
    assert zero.settings["top_k"] is None and zero.tokens.equal(none.tokens)


def test_a_whole_sampling_config_without_guidance_warns_once_naming_both_ways_to_keep_it(builtin, weights, tmp_path,
                                                                                         capsys):
    import csdgen

    with pytest.warns(csdgen.UnguidedSamplingWarning) as caught:
        result = csdgen.generate(builtin, [0], window=4, sampling=csdgen.SamplingConfig(temperature=0.5))
    assert result.settings["guidance_scale"] == 1.0  # exactly what was given
    (message,) = [str(w.message) for w in caught]
    assert "\n" not in message and caught[0].filename == __file__  # points at the caller's line
    assert "not with the model's guidance_scale 3" in message
    assert "sampling={'temperature': 0.5}" in message and "SamplingConfig(guidance_scale=3, temperature=0.5)" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these warns
        csdgen.generate(builtin, [0], window=4, sampling=csdgen.SamplingConfig(guidance_scale=3.0, temperature=0.5))
        csdgen.generate(builtin, [0], window=4, sampling={"guidance_scale": 1.0, "temperature": 0.5})
        assert run("generate", "--weights", weights, "-n", 1, "--window", 4, "--guidance-scale", 1, "--no-maps",
                   "--out", tmp_path / "cli") == 0
    assert "Warning" not in capsys.readouterr().err
    with pytest.warns(csdgen.UnguidedSamplingWarning) as caught:  # once for the run, not once per batch
        csdgen.save_run(builtin, [0, 1], tmp_path / "api", window=4, batch_size=1, maps=False,
                        sampling=csdgen.SamplingConfig(temperature=0.5))
    assert len(caught) == 1 and settings(tmp_path / "api")["sampling"]["guidance_scale"] == 1.0


def test_a_sampling_dict_with_several_misspelt_keys_names_each_with_the_close_one(builtin):
    """``{"temprature": 0.5, "topk": 3}`` named only the first key and no correction."""
    import csdgen

    with pytest.raises(ValueError) as error:
        csdgen.generate(builtin, [0], window=4, sampling={"temprature": 0.5, "topk": 3})
    message = str(error.value)
    assert "unknown keys 'temprature' (did you mean 'temperature'?), 'topk' (did you mean 'top_k'?)" in message
    assert "\n" not in message
