"""Regression tests of the third newcomer trial's findings 6, 7, 15 (issue 16, item 12)"""

from __future__ import annotations

import json
import warnings

import pytest

from builtin_fixture import builtin, weights  # noqa: F401 (fixtures)
from cli_helpers import cli_error, run


def settings(folder) -> dict:
    return json.loads((folder / "record.json").read_text())["settings"]


# ---- 6: save_run records the resolved settings, as csdgen generate does --------------------------


def test_save_run_records_the_resolved_settings_csdgen_generate_records(builtin, weights, tmp_path):
    """save_run's record held only the keyword arguments given ({'model': 'BuiltinModel', 'seed': 0, 'method': 'sjd',
    'window': 16}): not the guidance, refresh or drafts that made the images, nor what the CLI records."""
    import csdgen

    csdgen.save_run(builtin, ["dog face"], tmp_path / "api", method="sjd", window=4, maps=False)
    assert run("generate", "--weights", weights, "--class", "dog face", "-n", 1, "--method", "sjd", "--window", 4,
               "--no-maps", "--out", tmp_path / "cli") == 0
    api = settings(tmp_path / "api")
    assert api == settings(tmp_path / "cli")
    assert (api["model"], api["weights"], api["rule"], api["draft_init"], api["refresh"]) == (
        "builtin", str(weights), "'sjd'", "uniform", "coupled")
    assert api["sampling"]["guidance_scale"] == builtin.defaults.guidance_scale == 3.0


def test_save_run_with_arguments_given_at_their_defaults_resumes_the_same_run(builtin, tmp_path):
    """save_run(..., method="csd") after the same call without it: "holds a run with other settings (method: unset
    there, "csd" here)"; the same for refresh="coupled"."""
    import csdgen

    out = tmp_path / "s1"
    csdgen.save_run(builtin, ["red apple"], out, window=4, maps=False)
    again = csdgen.save_run(builtin, ["red apple"], out, window=4, maps=False, method="csd", refresh="coupled",
                            draft_init="uniform", sampling={"guidance_scale": 3.0})
    assert (again.resumed, again.run_seconds) == (1, 0.0)
    with pytest.raises(ValueError, match=r"other settings \(refresh: \"coupled\" there, \"independent\" here\)"):
        csdgen.save_run(builtin, ["red apple"], out, window=4, maps=False, refresh="independent")


def test_csdgen_generate_resumes_a_save_run_folder_and_save_run_a_csdgen_generate_folder(builtin, weights, tmp_path,
                                                                                         capsys):
    """csdgen generate with the very settings of a save_run call was refused with a 12-item list of differences."""
    import csdgen

    cli = ["generate", "--weights", weights, "--class", "red apple,dog face", "-n", 2, "--method", "sjd", "--window", 4,
           "--no-maps", "--out"]
    csdgen.save_run(builtin, ["red apple", "dog face"], tmp_path / "api", method="sjd", window=4, maps=False)
    assert run(*cli, tmp_path / "api") == 0
    assert capsys.readouterr().out.startswith("2 images (2 kept from an earlier run)")
    assert run(*cli, tmp_path / "cli") == 0
    back = csdgen.save_run(builtin, ["red apple", "dog face"], tmp_path / "cli", method="sjd", window=4, maps=False)
    assert back.resumed == 2 and back.run_seconds == 0.0
    assert "seed: 0 there, 1 here" in cli_error(capsys, *cli, tmp_path / "api", "--seed", 1)  # what differs still does


def test_draft_init_given_at_its_default_resumes_and_so_does_an_older_record_without_it(weights, tmp_path, capsys):
    """--draft-init uniform (what CSD runs with when it is left out) was "other settings" (draft_init: null there);
    a record written before draft_init was recorded resolved (null) still resumes."""
    common = ["generate", "--weights", weights, "-n", 1, "--window", 4, "--no-maps", "--out", tmp_path / "o"]
    assert run(*common) == 0
    assert run(*common, "--draft-init", "uniform") == 0
    assert "1 kept from an earlier run" in capsys.readouterr().out
    record = json.loads((tmp_path / "o" / "record.json").read_text())
    record["settings"]["draft_init"] = None
    (tmp_path / "o" / "record.json").write_text(json.dumps(record))
    assert run(*common) == 0
    assert "1 kept from an earlier run" in capsys.readouterr().out
    assert "draft_init: \"uniform\" there, \"onehot\" here" in cli_error(capsys, *common, "--draft-init", "onehot")


# ---- 7: SamplingConfig(temperature=0.5) silently dropped the model's guidance ----------------------


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
    ({"top_k": 0}, "top_k=0: must be None or an integer >= 1"),
    ("temperature=0.5", "sampling='temperature=0.5': allowed None (the model's defaults), a dict of changes"),
])
def test_a_bad_sampling_dict_or_type_is_one_line_naming_it_and_what_is_allowed(builtin, sampling, message):
    import csdgen

    with pytest.raises(ValueError) as error:
        csdgen.generate(builtin, [0], window=4, sampling=sampling)
    assert message in str(error.value) and "\n" not in str(error.value)


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


# ---- 15: --preset paper and the same settings spelt out ---------------------------------------------


def test_preset_paper_and_the_same_settings_spelt_out_are_the_same_run(builtin, weights, tmp_path, capsys):
    """Only the preset's name differed, and the resume was refused ("preset: "paper" there, unset here")."""
    import csdgen

    common = ["generate", "--weights", weights, "-n", 2, "--no-maps", "--out", tmp_path / "pp"]
    spelt = ["--window", 16, "--draft-init", "uniform", "--refresh", "independent", "--lam", 0.5, "--delta", 0.65]
    assert run(*common, "--preset", "paper") == 0
    capsys.readouterr()
    assert run(*common, *spelt) == 0
    assert capsys.readouterr().out.startswith("2 images (2 kept from an earlier run)")
    assert settings(tmp_path / "pp")["preset"] == "paper"  # kept, for information
    again = csdgen.save_run(builtin, [0, 1], tmp_path / "pp", preset="paper", maps=False)
    assert again.resumed == 2
    assert "other settings (rule: " in cli_error(capsys, *common, "--preset", "paper", "--lam", 0.4)  # a real change
    assert run(*common[:-1], tmp_path / "spelt", *spelt) == 0  # and the other way round
    assert run(*common[:-1], tmp_path / "spelt", "--preset", "paper") == 0
    assert "2 kept from an earlier run" in capsys.readouterr().out


def test_the_demo_run_unguided_by_its_user_gives_no_unguided_sampling_warning(builtin):
    """The demo's guidance field is its user's explicit choice: guidance 1 there is no library mistake, and
    the warning (from the demo's worker thread) only cluttered the demo's log."""
    import threading
    import warnings

    import csdgen
    from csdgen.demo import parse_inputs, watch

    settings_ = parse_inputs(builtin, condition="red apple", methods=["csd"], window="8", lam=0.5, delta=0.65,
                             guidance_scale=1.0, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        events = list(watch(builtin, settings_, csdgen.SamplingConfig(), threading.Event(), min_interval=0.0))
    assert events[-1][0] == "end"
    assert not [w for w in caught if issubclass(w.category, csdgen.UnguidedSamplingWarning)]


def test_a_sampling_dict_with_several_misspelt_keys_names_each_with_the_close_one(builtin):
    """A newcomer's trial: ``{"temprature": 0.5, "topk": 3}`` named only the first key and no correction."""
    import csdgen

    with pytest.raises(ValueError) as error:
        csdgen.generate(builtin, [0], window=4, sampling={"temprature": 0.5, "topk": 3})
    message = str(error.value)
    assert "unknown keys 'temprature' (did you mean 'temperature'?), 'topk' (did you mean 'top_k'?)" in message
    assert "\n" not in message
