"""Each method's defaults (one table), ``--preset paper``, options a method does not use, and
method names in any case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import numpy as np
import torch

import csdgen

from builtin_fixture import builtin, weights  # noqa: F401 (fixtures)
from cli_helpers import run, cli_error


ROOT = Path(__file__).resolve().parents[1]


def test_best_defaults_each_methods_refresh_comes_from_one_table(cached_model):
    from csdgen.models.defaults import METHOD_REFRESH

    assert METHOD_REFRESH["sjd"] == "coupled" and METHOD_REFRESH["csd"] == "coupled"
    for method in ("sjd", "csd", "addition", "jacobi"):
        out = csdgen.generate(cached_model, [0], method=method, window=4, seed=0)
        assert out.settings["refresh"] == METHOD_REFRESH[method]
    coupled = csdgen.generate(cached_model, [0, 1], method="sjd", window=4, seed=5, refresh="coupled")
    default = csdgen.generate(cached_model, [0, 1], method="sjd", window=4, seed=5)
    assert torch.equal(coupled.tokens, default.tokens)
    assert csdgen.generate(cached_model, [0], method=csdgen.CSD(), window=4).settings["refresh"] == "coupled"


def test_best_defaults_compare_and_sweep_rows_name_their_refresh():
    from csdgen.evaluation.compare import method_presets
    from csdgen.evaluation.sweep import SweepGrid, settings

    presets = method_presets()
    assert presets["sjd"]["refresh"] == presets["csd"]["refresh"] == "independent"  # the papers' rows
    assert presets["sjd-coupled"]["refresh"] == presets["csd-coupled"]["refresh"] == "coupled"
    for point in settings(SweepGrid()):
        if point.method != "ar":
            assert point.preset["refresh"] == ("coupled" if point.name.startswith("sjd-coupled") else "independent")


def test_best_defaults_preset_paper_gives_the_papers_settings(cached_model):
    out = csdgen.generate(cached_model, [0], method="csd", seed=0, preset="paper")
    s = out.settings
    assert (s["window"], s["draft_init"], s["refresh"], s["preset"]) == (16, "uniform", "independent", "paper")
    assert s["rule"]["lam"] == 0.5 and s["rule"]["delta"] == 0.65
    given = csdgen.generate(cached_model, [0], method="csd", seed=0, preset="paper", window=8, refresh="coupled")
    assert (given.settings["window"], given.settings["refresh"]) == (8, "coupled")  # given arguments win
    with pytest.raises(ValueError, match="preset='fast': allowed None or 'paper'"):
        csdgen.generate(cached_model, [0], preset="fast")


def test_best_defaults_the_cli_default_refresh_and_preset_paper(weights, tmp_path):
    default, paper = tmp_path / "default", tmp_path / "paper"
    assert run("generate", "--weights", weights, "-n", 1, "--method", "sjd", "--window", 4, "--no-maps", "--out", default) == 0
    assert json.loads((default / "record.json").read_text())["settings"]["refresh"] == "coupled"
    assert run("generate", "--weights", weights, "-n", 1, "--preset", "paper", "--no-maps", "--out", paper) == 0
    s = json.loads((paper / "record.json").read_text())["settings"]
    assert (s["window"], s["draft_init"], s["refresh"], s["preset"]) == (16, "uniform", "independent", "paper")
    assert "lam=0.5" in s["rule"] and "delta=0.65" in s["rule"]
    readme = " ".join(((ROOT / "README.md").read_text() + (ROOT / "docs" / "cli.md").read_text()).split())
    assert "--preset paper" in readme and "coupled" in readme


def test_best_defaults_the_measurement_behind_them_is_documented():
    """docs/cli.md and METHOD_REFRESH point at the "Default refresh" section of the record of the built-in
    model's earlier weights (where the choice was measured): it exists and holds the figures the
    choice rests on (SJD 2.09x / 3.30x, CSD 2.81x / 3.87x, batch 1 SJD 2.86x / 5.16x)."""
    import re

    from csdgen.models import defaults

    docs = (ROOT / "benchmarks" / "results" / "builtin_1911_classes.md").read_text()
    section = re.search(r"^## (\(earlier weights\) )?Default refresh.*?(?=^## |\Z)", docs, re.S | re.M)
    assert section, "benchmarks/results/builtin_1911_classes.md has no 'Default refresh' section"
    for figure in ("2.09", "3.30", "2.81", "3.87", "2.86", "5.16"):
        assert figure in section.group(0), figure
    readme = " ".join(((ROOT / "README.md").read_text() + (ROOT / "docs" / "cli.md").read_text()).split())
    assert '"Default refresh"' in readme and "equal quality" not in readme.split("Defaults and the paper's settings")[1][:1500]
    source = Path(defaults.__file__).read_text()
    assert '"Default refresh"' in source


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


@pytest.mark.parametrize("argv, expected", [
    (["--method", "sjd", "--lam", "0.3"], "--lam 0.3 does not apply to --method sjd (only csd uses it)"),
    (["--method", "ar", "--refresh", "coupled"], "--refresh coupled does not apply to --method ar (AR has no drafts)"),
    (["--method", "csd", "--addition-c", "0.5"], "--addition-c 0.5 does not apply to --method csd (only addition uses it)"),
])
def test_options_the_method_does_not_use_get_a_note(weights, tmp_path, capsys, argv, expected):
    assert run("generate", "--weights", weights, "-n", 1, "--window", 4, "--no-maps", *argv, "--out", tmp_path / "g") == 0
    err = capsys.readouterr().err
    assert f"csdgen generate: note: {expected}; it is not used" in err, err


def test_preset_paper_with_ar_gives_no_note_about_a_window_the_user_did_not_give(weights, tmp_path, capsys):
    assert run("generate", "--weights", weights, "-n", 1, "--method", "ar", "--preset", "paper", "--no-maps",
               "--out", tmp_path / "g") == 0
    assert "note" not in capsys.readouterr().err


def test_method_names_in_capitals_are_the_same_method(builtin):
    """``method="CSD"`` (the paper's spelling) was refused as an unknown method."""
    lower = csdgen.generate(builtin, [0], method="csd", window=8, seed=3)
    upper = csdgen.generate(builtin, [0], method="CSD", window=8, seed=3)
    assert upper.settings["method"] == "csd"
    assert upper.tokens.equal(lower.tokens)
    assert csdgen.generate(builtin, [0], method="Ar", seed=3).settings["method"] == "ar"
    with pytest.raises(ValueError, match="unknown method 'CSDX'; allowed: ar, sjd, csd"):
        csdgen.generate(builtin, [0], method="CSDX")


def test_a_numpy_integer_window_is_taken_and_recorded_as_an_int(builtin):
    """``window=np.int64(8)`` (a width taken from an array) was refused while numpy floats were taken
    for lambda."""
    result = csdgen.generate(builtin, [0], method="sjd", window=np.int64(8), seed=1)
    assert result.settings["window"] == 8 and type(result.settings["window"]) is int
    assert result.tokens.equal(csdgen.generate(builtin, [0], method="sjd", window=8, seed=1).tokens)
    for bad in (np.float64(8.0), np.bool_(True), True, 0):
        with pytest.raises(ValueError, match="must be an integer >= 1"):
            csdgen.generate(builtin, [0], window=bad)


def test_method_and_auto_in_any_case_in_the_cli_the_server_and_the_library(builtin, capsys):
    """``method="CSD"`` was taken by the library only (the CLI's ``--method CSD`` and
    the server's ``"method": "CSD"`` were refused), and ``--window AUTO`` by the CLI only."""
    from csdgen.cli import build_parser
    from csdgen.serve import ServedModel
    from csdgen.serve.schemas import parse_request

    assert build_parser().parse_args(["generate", "--method", "CSD"]).method == "csd"
    assert build_parser().parse_args(["serve", "--method", "Sjd"]).method == "sjd"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--method", "CSDX"])
    assert "unknown method 'CSDX'; allowed: ar, sjd, csd" in capsys.readouterr().err  # as given, not lower-cased
    served = ServedModel(builtin, "builtin")
    request = parse_request({"prompt": "red apple", "method": "CSD", "window": "AUTO"}, served)
    assert isinstance(request.batch_kwargs["method"], csdgen.CSD) and request.batch_kwargs["window"] == "auto"
    assert csdgen.generate(builtin, [0], method="sjd", window="AUTO", seed=2).settings["window"] == "auto"
    with pytest.raises(ValueError, match="window='autos': must be an integer >= 1"):
        csdgen.generate(builtin, [0], window="autos")


def test_sweep_draft_inits_help_names_every_rule_that_forces_onehot():
    """docs/frontier.md and sweep's --draft-inits help said only LANTERN runs with one-hot drafts; GSD does too
    (a new-user try-out's sweep table showed gsd ... onehot). The help now names each rule the grid forces."""
    from csdgen.cli import sweep as sweep_cli
    from csdgen.evaluation.sweep import SweepGrid, settings

    codebook = torch.randn(16, 4)
    forced = {p.method for p in settings(SweepGrid(draft_inits=["uniform"]), codebook) if p.draft_init == "onehot"}
    assert forced == {"gsd", "lantern"}
    import argparse
    parser = sweep_cli.add_parser(argparse.ArgumentParser().add_subparsers())
    help_text = " ".join(parser.format_help().split())
    assert "GSD and LANTERN always use onehot" in help_text
