"""Regression tests of the second newcomer trial's findings (issue 16, item 12), one test per
finding, each named after it: a command and the library agree on what they accept, and a bad
value gets one line naming it and what is allowed."""

from __future__ import annotations

import json

import pytest

from builtin_fixture import make_tiny_weights
from cli_helpers import cli_error, run


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return make_tiny_weights(tmp_path_factory.mktemp("weights"))


# ---- F1: --preset paper with GSD / LANTERN ------------------------------------------------------


@pytest.mark.parametrize("method", ["gsd", "lantern"])
def test_preset_paper_with_gsd_or_lantern_runs_with_one_hot_drafts_as_the_api_does(weights, tmp_path, method):
    import csdgen
    from csdgen.models.builtin import load_builtin_model

    out = tmp_path / method
    assert run("generate", "--weights", weights, "-n", 1, "--method", method, "--preset", "paper", "--no-maps",
               "--out", out) == 0
    record = json.loads((out / "record.json").read_text())
    s, image = record["settings"], record["images"]["0"]
    model = load_builtin_model(weights)
    api = csdgen.generate(model, [model.class_names.index(image["class"])], method=method, preset="paper", seed=0)
    assert api.settings["draft_init"] == "onehot"
    assert (s["window"], s["refresh"]) == (api.settings["window"], api.settings["refresh"]) == (16, "independent")
    assert image["steps"] == api.steps  # the same drafts, the same decoding


# ---- F3: an explicit --draft-init that GSD / LANTERN cannot take --------------------------------


@pytest.mark.parametrize("command", ["generate", "compare", "bench"])
def test_explicit_draft_init_uniform_with_gsd_is_refused_by_every_command(weights, tmp_path, capsys, command):
    method = ["--method", "gsd"] if command == "generate" else ["--methods", "gsd"]
    count = ["--limit", 2] if command == "bench" else ["-n", 2]
    err = cli_error(capsys, command, "--weights", weights, *count, *method, "--draft-init", "uniform",
                    "--out", tmp_path / command)
    assert "--draft-init uniform" in err and "gsd" in err and "onehot" in err, err


def test_compare_default_methods_with_draft_init_uniform_notes_gsd_and_lantern_run_onehot(weights, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert run("compare", "--weights", weights, "-n", 2, "--window", 2, "--draft-init", "uniform", "--out", out) == 0
    err = capsys.readouterr().err
    assert "--draft-init uniform is not used by gsd, lantern" in err, err
    for name, init in (("gsd", "onehot"), ("lantern", "onehot"), ("sjd", "uniform"), ("csd", "uniform")):
        assert json.loads((out / f"run_{name}.json").read_text())["settings"]["draft_init"] == init, name


# ---- F2: sweep --gsd-radius had no upper bound -------------------------------------------------


def test_sweep_gsd_radius_above_the_codebook_is_refused_naming_the_option(weights, tmp_path, capsys):
    import torch

    from csdgen.acceptance import GSD

    err = cli_error(capsys, "sweep", "--weights", weights, "-n", 2, "--gsd-radius", "3,100000", "--out", tmp_path / "s")
    assert "--gsd-radius 100000" in err and "0..1023" in err, err
    assert not (tmp_path / "s").exists()  # refused before anything ran
    codebook = torch.randn(16, 4)
    assert GSD(codebook, radius=15).radius == 15  # V - 1 spans every rank
    with pytest.raises(ValueError, match=r"radius=16: the GSD rank radius must be 0\.\.15"):
        GSD(codebook, radius=16)
