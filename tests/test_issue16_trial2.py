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
    torch.manual_seed(0)
    codebook = torch.randn(16, 4)  # the rule: a radius above V - 1 acts as V - 1 (which spans every rank)
    q, p = torch.softmax(torch.randn(2, 5, 16), -1), torch.softmax(torch.randn(2, 5, 16), -1)
    x = torch.randint(0, 16, (2, 5))
    wide = GSD(codebook, radius=100000, prob_gap=1.0, max_distance=100.0).acceptance_probability(x, p, q, x)
    assert torch.equal(wide, GSD(codebook, radius=15, prob_gap=1.0, max_distance=100.0).acceptance_probability(x, p, q, x))


# ---- F4, F5: csdgen.save_run ------------------------------------------------------------------


@pytest.fixture(scope="module")
def builtin(weights):
    from csdgen.models.builtin import load_builtin_model

    return load_builtin_model(weights)


def test_save_run_saves_at_the_size_csdgen_generate_writes(builtin, weights, tmp_path):
    from PIL import Image

    import csdgen

    summary = csdgen.save_run(builtin, [0], tmp_path / "api", method="sjd", window=4, maps=False)
    assert run("generate", "--weights", weights, "-n", 1, "--class", 0, "--method", "sjd", "--window", 4, "--no-maps",
               "--out", tmp_path / "cli") == 0
    (api_png,) = (tmp_path / "api").glob("*.png")
    (cli_png,) = (tmp_path / "cli").glob("*.png")
    assert Image.open(api_png).size == Image.open(cli_png).size == (128, 128)
    assert summary is not None
    csdgen.save_run(builtin, [0], tmp_path / "one", method="sjd", window=4, maps=False, scale=1)
    assert Image.open(next((tmp_path / "one").glob("*.png"))).size == (64, 64)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"methd": "sjd"}, TypeError, r"unexpected keyword argument 'methd'; did you mean 'method'\?"),
    ({"scale": 0}, ValueError, r"scale=0: allowed an integer in 1..16"),
    ({"method": "sdj"}, ValueError, r"sdj"),
    ({"window": 0}, ValueError, r"window"),
    ({"engine": "fast"}, ValueError, r"fast"),
    ({"tree": (0, 0)}, ValueError, r"tree"),
])
def test_save_run_refuses_bad_arguments_before_making_the_folder(builtin, tmp_path, kwargs, error, match):
    import csdgen

    with pytest.raises(error, match=match):
        csdgen.save_run(builtin, [0], tmp_path / "never", **kwargs)
    assert not (tmp_path / "never").exists()


def test_save_run_with_out_none_names_out(builtin):
    import csdgen

    with pytest.raises(TypeError, match=r"save_run\(out=None\): allowed a folder path"):
        csdgen.save_run(builtin, [0], None)


# ---- F9: file names keep whole words --------------------------------------------------------


def test_file_names_keep_whole_words_up_to_40_characters():
    from csdgen.runs import slug

    name = slug("A close-up photo of a red-haired girl, high-quality.")
    assert name == "a-close-up-photo-of-a-red-haired-girl" and len(name) <= 40
    assert slug("x" * 50) == "x" * 40 and slug("") == "image" and slug("red apple") == "red-apple"


# ---- F7: the demo's seed field -----------------------------------------------------------------


def test_demo_seed_field_reads_exact_integers_as_seed_does(builtin):
    from csdgen.demo import _seed

    assert _seed("9007199254740993") == 9007199254740993  # 2**53 + 1: exact, a number field sent ...992
    assert _seed(" 9223372036854775807 ") == 2**63 - 1 and _seed("0") == 0 and _seed(4.0) == 4
    for bad, shown in (("1e3", "'1e3'"), ("-1", "'-1'"), ("2.0", "'2.0'"), ("", "''"),
                       ("9223372036854775808", "9223372036854775808"), ("١", "'١'")):
        with pytest.raises(ValueError) as info:
            _seed(bad)
        assert str(info.value) == f"seed={shown}: allowed: an integer in 0..9223372036854775807", bad


# ---- F8: Ctrl-C on the demo -------------------------------------------------------------------


def test_ctrl_c_on_the_demo_says_stopped_not_generates_resume_hint(monkeypatch, capsys):
    import csdgen.demo

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(csdgen.demo, "serve", interrupted)
    assert run("demo") == 130
    err = capsys.readouterr().err
    assert err.strip() == "csdgen demo: stopped", err


# ---- F9: small slips --------------------------------------------------------------------------


def test_generate_fewer_images_into_a_fuller_folder_reports_the_images_asked_for(weights, tmp_path, capsys):
    out = tmp_path / "g"
    assert run("generate", "--weights", weights, "-n", 4, "--window", 4, "--no-maps", "--out", out) == 0
    capsys.readouterr()
    assert run("generate", "--weights", weights, "-n", 2, "--window", 4, "--no-maps", "--out", out) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("2 images (2 kept from an earlier run; the folder holds 4; the figures are the folder's)"), line


def test_class_of_only_commas_is_quoted_as_given(weights, tmp_path, capsys):
    err = cli_error(capsys, "generate", "--weights", weights, "--class", ",", "--out", tmp_path / "g")
    assert err.startswith("csdgen: error: --class ',': no class given"), err


def test_a_missing_prompts_file_is_called_a_missing_file(weights, tmp_path, capsys):
    missing = tmp_path / "prompts.txt"
    err = cli_error(capsys, "bench", "--weights", weights, "--prompts", missing, "--out", tmp_path / "b")
    assert f"prompt file {str(missing)!r} does not exist" in err and "unknown prompt set" not in err, err
    err = cli_error(capsys, "bench", "--weights", weights, "--prompts", "cocoo", "--out", tmp_path / "b")
    assert "unknown prompt set 'cocoo'" in err, err


def test_a_missing_weights_folder_is_not_told_to_train(tmp_path, capsys):
    err = cli_error(capsys, "generate", "--weights", tmp_path / "nowhere", "--out", tmp_path / "g")
    assert "no such folder" in err and "train" not in err, err


@pytest.mark.parametrize("argv, expected", [
    (["--method", "sjd", "--lam", "0.3"], "--lam 0.3 does not apply to --method sjd (only csd uses it)"),
    (["--method", "ar", "--refresh", "coupled"], "--refresh coupled does not apply to --method ar (AR has no drafts)"),
    (["--method", "csd", "--addition-c", "0.5"], "--addition-c 0.5 does not apply to --method csd (only addition uses it)"),
])
def test_options_the_method_does_not_use_get_a_note(weights, tmp_path, capsys, argv, expected):
    assert run("generate", "--weights", weights, "-n", 1, "--window", 4, "--no-maps", *argv, "--out", tmp_path / "g") == 0
    err = capsys.readouterr().err
    assert f"csdgen: note: {expected}; it is not used" in err, err


def test_preset_paper_with_ar_gives_no_note_about_a_window_the_user_did_not_give(weights, tmp_path, capsys):
    assert run("generate", "--weights", weights, "-n", 1, "--method", "ar", "--preset", "paper", "--no-maps",
               "--out", tmp_path / "g") == 0
    assert "note" not in capsys.readouterr().err


@pytest.fixture(scope="module")
def server(builtin):
    from csdgen.serve import BackgroundServer, ServedModel, create_app

    with BackgroundServer(create_app(ServedModel(builtin, "csdgen-builtin"), capacity=2)) as background:
        yield background


def test_serve_refuses_a_bad_addition_c_whatever_the_method(server):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    for method in ("csd", "sjd", "addition"):
        with pytest.raises(openai.BadRequestError) as info:
            client.images.generate(model="csdgen-builtin", prompt="red apple",
                                   extra_body={"method": method, "addition_c": -1, "window": 4})
        error = info.value.body
        assert error["param"] == "addition_c" and "c=-1" in error["message"], error


def test_serve_top_p_error_says_null_not_none(server):
    import httpx

    r = httpx.post(server.url + "/v1/images/generations", json={"prompt": "red apple", "top_p": 2}, timeout=60)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "top_p" and "must be null or in (0, 1]" in error["message"] and "None" not in error["message"]


def test_one_option_needing_model_says_needs(capsys, tmp_path):
    err = cli_error(capsys, "demo", "--vqgan", tmp_path)
    assert "--vqgan needs --model" in err, err
    err = cli_error(capsys, "serve", "--layout", "anole")
    assert "--layout needs --model" in err, err
    err = cli_error(capsys, "serve", "--dtype", "bfloat16")  # float32 is the built-in model's own
    assert "--dtype bfloat16: the built-in model runs in float32 only; allowed for it: auto, float32" in err, err


# ---- the third trial (this stop), #4: digits are an index, not a short name -------------------


def test_class_given_as_digits_is_that_index_even_where_a_short_name_is_those_digits():
    from csdgen.class_names import ClassNames

    classes = ClassNames(["a", "b", "c", "hundred points symbol"], aliases=[[], [], [], ["2"]])
    assert classes.index("2") == 2 and classes.index(" 2 ") == 2 and classes.index(2) == 2
    assert classes.index("hundred points symbol") == 3
    from csdgen.models.builtin import load_builtin_model

    model = load_builtin_model()  # the shipped emoji model knows the short names "100" and "1234" (emoji it does not draw)
    assert model.class_ids(["10", 10]) == [10, 10]
    with pytest.raises(ValueError, match=r"class index 100: allowed 0\.\."):  # an index, not the emoji "100"
        model.class_ids(["100"])


# ---- the third trial, #1 and #3 ---------------------------------------------------------------


def test_list_classes_into_a_closed_pipe_stops_quietly():
    import subprocess
    import sys

    proc = subprocess.run(f"{sys.executable} -m csdgen generate --list-classes | head -2", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert len(proc.stdout.splitlines()) == 2 and proc.stderr == "", proc.stderr


def test_a_bad_window_names_auto_as_allowed(capsys, tmp_path):
    from cli_helpers import usage_error

    # one wording for every bad value (a newcomer's trial found two: "must be an integer >= 1, or auto"
    # for 0 and -1, "expected an integer in 1..1000000, or auto" for 1.5 and nan)
    for value in ("nan", "0", "-1", "1.5", "99999999"):
        err = usage_error(capsys, "generate", "--window", value, "--out", tmp_path / "g", one_line=True)
        assert f"argument --window: '{value}': allowed an integer in 1..1000000 or auto" in err, err
