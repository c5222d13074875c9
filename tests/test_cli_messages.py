"""The CLI's one-line errors and notes: a bad value is named with what is allowed (exit status 2,
no traceback), and a note names what the command will do instead."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from csdgen import cli

from cli_helpers import run, cli_error, usage_error, one_line_usage_error
from builtin_fixture import builtin, weights  # noqa: F401 (fixtures)


@pytest.mark.parametrize("argv, option", [
    (["generate", "-n", "99999999999999999999"], "-n/--num-images"),
    (["compare", "-n", str(10**7)], "-n/--num-images"),
    (["bench", "--limit", "99999999999999999999"], "--limit"),
    (["bench", "--offset", "99999999999999999999"], "--offset"),
    (["compare", "--prompts", "parti", "--offset", str(10**30)], "--offset"),
    (["generate", "--batch-size", str(10**12)], "--batch-size"),
])
def test_huge_counts_are_refused_at_once_naming_the_option(capsys, argv, option):
    err = one_line_usage_error(capsys, *argv)
    assert option in err and "allowed at most" in err


def test_an_offset_past_the_prompt_set_names_the_option(weights, tmp_path, capsys):
    err = cli_error(capsys, "bench", "--weights", weights, "--prompts", "parti", "--offset", 5000, "--out", tmp_path)
    assert "--offset 5000: allowed an integer in 0..1631" in err or "class names" in err


def test_a_full_disk_names_the_folder_and_leaves_no_hidden_tmp_files(weights, tmp_path, capsys, monkeypatch):
    from PIL import Image

    save = Image.Image.save
    written = []

    def fill_up(self, fp, *args, **kwargs):
        written.append(fp)
        if len(written) == 2:  # the second PNG: half written, then the disk is full
            Path(fp).write_bytes(b"\x89PNG half")
            raise OSError(28, "No space left on device")
        return save(self, fp, *args, **kwargs)

    monkeypatch.setattr(Image.Image, "save", fill_up)
    out = tmp_path / "out"
    err = cli_error(capsys, "generate", "--weights", weights, "-n", 2, "--window", 4, "--out", out)
    assert "No space left on device while writing" in err and str(out) in err and "[Errno" not in err
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    assert not (out / "record.json").exists() or json.loads((out / "record.json").read_text())


@pytest.mark.parametrize("option, value", [("--guidance-scale", "1e308"), ("--temperature", "1e-300")])
def test_an_overflowing_guidance_scale_or_temperature_is_named_not_the_weights(weights, tmp_path, capsys, option, value):
    err = cli_error(capsys, "generate", "--weights", weights, "-n", 1, "--window", 4, option, value, "--out", tmp_path / "o")
    assert "overflow float32" in err and "check the model weights" not in err
    assert f"guidance scale {float(value):g}" in err if option == "--guidance-scale" else f"temperature {float(value):g}" in err


def test_an_empty_class_is_refused_not_replaced_by_every_class(weights, tmp_path, capsys):
    err = cli_error(capsys, "generate", "--weights", weights, "--class", "", "--out", tmp_path / "o")
    assert "--class '': no class given" in err
    assert not (tmp_path / "o" / "record.json").exists()


def test_classes_that_n_leaves_out_are_named_in_a_note(weights, tmp_path, capsys):
    """``--class a,b,c -n 1`` drew only the first class and said nothing of the others."""
    assert run("generate", "--weights", weights, "--class", "0,1,2", "-n", 1, "--window", 4, "--no-maps",
               "--out", tmp_path / "one") == 0
    err = capsys.readouterr().err
    assert "note: --class names 3 classes but -n 1 draws 1 image: '1', '2' not drawn (-n 3 draws every class named)" in err
    assert run("generate", "--weights", weights, "--class", "0,1", "-n", 2, "--window", 4, "--no-maps",
               "--out", tmp_path / "two") == 0
    assert "not drawn" not in capsys.readouterr().err


def test_bench_seeds_given_twice_are_refused_before_generating(capsys):
    err = one_line_usage_error(capsys, "bench", "--seeds", "0,0")
    assert "seed 0 is given twice" in err


@pytest.mark.parametrize("option, value, message", [
    ("--top-p", "2", "--top-p 2.0: must be in (0, 1]"),
    ("--guidance-scale", "-1", "--guidance-scale -1.0: must be a finite number >= 0"),
])
def test_a_sampling_value_out_of_range_is_named_by_its_option(capsys, option, value, message):
    """``--top-p 2`` said ``top_p=2.0: must be None or in (0, 1]``, the
    library's argument name and a value (None) the option cannot take."""
    import argparse

    from csdgen.cli._common import sampling_of

    args = argparse.Namespace(guidance_scale=3.0, temperature=1.0, top_k=None, top_p=None)
    setattr(args, option[2:].replace("-", "_"), float(value))
    with pytest.raises(ValueError) as raised:
        sampling_of(args)
    assert str(raised.value) == message


def test_a_top_k_beyond_the_codebook_is_named_by_its_option(capsys, tmp_path):
    """The codebook is known once the model is loaded, so the library refuses ``top_k=1025``; the
    command said so in the library's words (``top_k=1025 exceeds ...``), not by its option."""
    assert run("generate", "--top-k", 1025, "-n", 1, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err == "csdgen generate: error: --top-k 1025: exceeds the codebook size V=1024; allowed: 1..1024\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("library, cli_text", [
    ("engine='static' cannot be used: the model is split across devices; allowed: engine='eager' for this model",
     "--engine static cannot be used: the model is split across devices; allowed: --engine eager for this model"),
    ("vqgan_dir='ck/x' lacks vqgan.yaml or vqgan.ckpt", "--vqgan 'ck/x' lacks vqgan.yaml or vqgan.ckpt"),
    ("top_p=2.0: must be None or in (0, 1]", "--top-p 2.0: must be in (0, 1]"),
    ("prompt of 9 tokens + image of 20 positions", "prompt of 9 tokens + image of 20 positions"),  # no argument: as is
])
def test_library_messages_reach_the_user_with_the_options_names(library, cli_text):
    """Refusals raised by the library once the model is loaded named its arguments (engine='eager',
    vqgan_dir=) where the user typed options."""
    from csdgen.cli._common import option_named

    assert option_named(library) == cli_text


@pytest.mark.parametrize("command", ["compare", "bench"])
@pytest.mark.parametrize("methods, message", [("", "no method given; allowed: ar, sjd,"),
                                              (",,", "',,': an empty item; allowed: ar, sjd,")])
def test_empty_methods_are_refused_with_the_allowed_list(capsys, tmp_path, command, methods, message):
    err = one_line_usage_error(capsys, command, "--methods", methods, "--out", tmp_path)
    assert message in err and "csd-coupled" in err


@pytest.mark.parametrize("argv, message", [
    (["sweep", "--csd-lam", "0.5,,1"], "argument --csd-lam: '0.5,,1': an empty item; allowed: finite numbers >= 0"),
    (["sweep", "--csd-lam", ",0.5"], "argument --csd-lam: ',0.5': an empty item; allowed: finite numbers >= 0"),
    (["sweep", "--gsd-radius", "1, ,3"], "argument --gsd-radius: '1, ,3': an empty item; allowed: integers >= 0"),
    (["sweep", "--windows", "16,,32"], "argument --windows: '16,,32': an empty item; allowed: integers >= 1"),
    (["sweep", "--windows", "16,"], "argument --windows: '16,': an empty item; allowed: integers >= 1"),
    (["sweep", "--baselines", "ar,,sjd"], "argument --baselines: 'ar,,sjd': an empty item; allowed: ar, sjd, sjd-coupled"),
    (["sweep", "--draft-inits", "uniform,"], "argument --draft-inits: 'uniform,': an empty item; allowed: uniform, onehot"),
    # every method but AR runs once per draft initialisation: none would leave a sweep of AR alone
    (["sweep", "--draft-inits", ""], "argument --draft-inits: '': no draft initialisation given; allowed: uniform, onehot"),
    (["bench", "--methods", "ar,,csd"], "argument --methods: 'ar,,csd': an empty item; allowed: ar, sjd,"),
    (["bench", "--seeds", "0,,1"], "argument --seeds: '0,,1': an empty item; allowed: integer seeds in 0.."),
])
def test_an_empty_list_item_is_refused_not_dropped(capsys, argv, message):
    """``--csd-lam 0.5,,1`` ran as ``0.5,1`` and ``--windows 16,,32`` as ``16,32``: the user probably
    meant a value there. An entirely empty string still means none where the option says so."""
    with pytest.raises(SystemExit) as stop:  # the parser alone: before the fix the command would run
        cli.build_parser().parse_known_args(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and message in err, err
    from csdgen.cli._options import names_of, numbers

    assert numbers(float)("") == numbers(float)("  ") == []
    assert names_of(("ar", "sjd"), "baseline", empty=True)("") == []
    assert numbers(float)(" 0.5 , 1") == [0.5, 1.0]


@pytest.mark.parametrize("argv, twice", [
    (["compare", "--methods", "csd,csd"], "method 'csd' is given twice"),
    (["bench", "--methods", "sjd,ar,sjd"], "method 'sjd' is given twice"),
    (["sweep", "--csd-lam", "0.5,0.5"], "value 0.5 is given twice"),
    (["sweep", "--windows", "4,8,4"], "value 4 is given twice"),
    (["sweep", "--baselines", "ar,ar"], "baseline 'ar' is given twice"),
])
def test_duplicate_methods_and_grid_values_are_refused_naming_the_duplicate(capsys, tmp_path, argv, twice):
    err = one_line_usage_error(capsys, *argv, "--out", tmp_path)
    assert twice in err and "allowed: distinct values" in err


def test_sweep_with_no_window_is_refused_while_other_grids_may_be_empty(capsys, tmp_path):
    """``--windows ''`` ran a sweep of AR alone without a word (every method runs at each window)."""
    err = one_line_usage_error(capsys, "sweep", "--windows", "", "--out", tmp_path / "s")
    assert "argument --windows: '': no window given; allowed: at least one" in err
    assert not (tmp_path / "s").exists()
    from csdgen.cli._options import numbers

    assert numbers(float)("") == []  # e.g. --csd-lam '' = no CSD curve


@pytest.mark.parametrize("option, values, bad, allowed", [
    ("--csd-lam", "0.1,-1", "-1.0", "finite numbers >= 0"),
    ("--csd-lam", "nan", "nan", "finite numbers >= 0"),
    ("--csd-delta", "0.65,2", "2.0", "numbers in [0, 1]"),
    ("--addition-c", "inf", "inf", "finite numbers >= 0"),
    ("--lantern-delta", "5", "5.0", "numbers in [0, 1]"),
    ("--gsd-radius", "3,-1", "-1", "integers >= 0"),
])
def test_sweep_grid_value_out_of_range_is_refused_naming_the_option_before_any_model_loads(
        capsys, tmp_path, monkeypatch, option, values, bad, allowed):
    """A sweep's grid values were checked only by the rules, after the model had loaded (minutes for a
    real checkpoint with --model), and the error named ``lam=-1.0``, not the option (new-user try-out)."""
    import csdgen.cli.sweep as sweep

    monkeypatch.setattr(sweep, "builtin_model", lambda *a, **k: pytest.fail("the model was loaded"))
    err = one_line_usage_error(capsys, "sweep", "-n", 2, option, values, "--out", tmp_path / "s")
    assert f"argument {option}: '{values}': value {bad} is out of range; allowed: {allowed}" in err
    assert not (tmp_path / "s").exists()


def test_compile_prints_one_line_before_the_first_compiled_call(weights, tmp_path, capsys, monkeypatch):
    import csdgen.models._static_steps as static  # the compiled steps

    calls = []
    monkeypatch.setattr(static, "_compiled", lambda name, fn: calls.append(name) or fn)  # no real compile
    assert run("generate", "--weights", weights, "-n", 1, "--window", 16, "--compile", "--no-maps",
               "--out", tmp_path / "c") == 0
    err = capsys.readouterr().err
    assert err.count("compiling the static engine's forwards (first call per shape; on CPU tens of seconds each)") == 1
    assert calls  # the compiled path ran, through the fake
    assert run("generate", "--weights", weights, "-n", 1, "--window", 16, "--no-maps", "--out", tmp_path / "e") == 0
    assert "compiling" not in capsys.readouterr().err


@pytest.mark.parametrize("command", ["generate", "compare", "bench", "sweep"])
def test_empty_out_is_refused(capsys, command):
    err = one_line_usage_error(capsys, command, "--out", "")
    assert "argument --out: '': an empty output folder; allowed: a folder path" in err


@pytest.mark.parametrize("command", ["compare", "sweep"])
@pytest.mark.parametrize("option, value", [("--limit", 3), ("--offset", 2)])
def test_compare_limit_without_prompts_is_refused_naming_the_option(weights, capsys, tmp_path, command, option, value):
    err = cli_error(capsys, command, "--weights", weights, option, value, "--out", tmp_path / "o")
    assert f"{option} {value} needs --prompts FILE" in err
    assert not (tmp_path / "o").exists()


def test_long_class_names_are_truncated_in_error_lines(weights, capsys, tmp_path, builtin):
    long = "a" * 100_000
    err = cli_error(capsys, "generate", "--weights", weights, "--class", long, "--out", tmp_path / "o")
    assert f"unknown class '{'a' * 80}...'" in err and len(err) < 1000
    with pytest.raises(ValueError) as info:
        builtin.classes.index("9" * 100_000)
    assert len(str(info.value)) < 1000


def test_generate_model_with_an_empty_prompts_file_says_it_holds_no_prompts(capsys, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    err = cli_error(capsys, "generate", "--model", tmp_path / "nothing", "--prompts-file", empty, "--out", tmp_path / "o")
    assert f"--prompts-file {str(empty)!r} holds no prompts" in err


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


def test_generate_fewer_images_into_a_fuller_folder_reports_the_images_asked_for(weights, tmp_path, capsys):
    out = tmp_path / "g"
    assert run("generate", "--weights", weights, "-n", 4, "--window", 4, "--no-maps", "--out", out) == 0
    capsys.readouterr()
    assert run("generate", "--weights", weights, "-n", 2, "--window", 4, "--no-maps", "--out", out) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("2 images (2 kept from an earlier run; the folder holds 4; the figures are the folder's)"), line


def test_class_of_only_commas_is_quoted_as_given(weights, tmp_path, capsys):
    err = cli_error(capsys, "generate", "--weights", weights, "--class", ",", "--out", tmp_path / "g")
    assert err.startswith("csdgen generate: error: --class ',': no class given"), err


def test_a_missing_prompts_file_is_called_a_missing_file(weights, tmp_path, capsys):
    missing = tmp_path / "prompts.txt"
    err = cli_error(capsys, "bench", "--weights", weights, "--prompts", missing, "--out", tmp_path / "b")
    assert f"prompt file {str(missing)!r} does not exist" in err and "unknown prompt set" not in err, err
    err = cli_error(capsys, "bench", "--weights", weights, "--prompts", "cocoo", "--out", tmp_path / "b")
    assert "unknown prompt set 'cocoo'" in err, err


def test_a_missing_weights_folder_is_not_told_to_train(tmp_path, capsys):
    err = cli_error(capsys, "generate", "--weights", tmp_path / "nowhere", "--out", tmp_path / "g")
    assert "no such folder" in err and "train" not in err, err


def test_a_weights_folder_without_config_says_what_is_missing(tmp_path, capsys):
    """(It said "no built-in weights in DIR; run python -m csdgen.builtin.train": not what was missing.)"""
    (tmp_path / "w").mkdir()
    err = cli_error(capsys, "generate", "--weights", tmp_path / "w", "-n", 1, "--out", tmp_path / "g")
    assert "it holds no config.json; give the folder that holds config.json and the .safetensors files" in err, err


def _shipped_copy(folder: Path) -> Path:
    import shutil

    from csdgen.builtin import DEFAULT_WEIGHTS_DIR

    shutil.copytree(DEFAULT_WEIGHTS_DIR, folder)
    return folder


def test_a_weights_file_is_told_a_folder_is_needed(tmp_path, capsys):
    afile = tmp_path / "weights.safetensors"
    afile.write_bytes(b"x")
    err = cli_error(capsys, "generate", "--weights", afile, "-n", 1, "--out", tmp_path / "g")
    assert "it is a file, not a folder" in err and "no such folder" not in err, err


def test_a_weights_config_without_its_keys_names_them(tmp_path, capsys):
    folder = tmp_path / "emptyw"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    err = cli_error(capsys, "generate", "--weights", folder, "-n", 1, "--out", tmp_path / "g")
    assert "missing keys 'codebook_size'" in err and "'vq', 'llama', 'classifier' in " in err, err
    assert str(folder / "config.json") in err, err


def test_a_truncated_safetensors_file_is_named_in_one_line(tmp_path, capsys):
    folder = _shipped_copy(tmp_path / "w")
    path = folder / "ar.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    err = cli_error(capsys, "generate", "--weights", folder, "-n", 1, "--out", tmp_path / "g")
    assert f"unreadable safetensors file {path}: " in err and "header" in err, err


def test_weights_that_do_not_match_their_config_are_named_in_one_line(tmp_path, capsys):
    folder = _shipped_copy(tmp_path / "w")
    config = json.loads((folder / "config.json").read_text())
    config["llama"]["intermediate_size"] += 8
    (folder / "config.json").write_text(json.dumps(config))
    err = cli_error(capsys, "generate", "--weights", folder, "-n", 1, "--out", tmp_path / "g")
    assert f"{folder / 'ar.safetensors'} does not match config.json: size mismatch" in err, err


def test_one_option_needing_model_says_needs(capsys, tmp_path):
    err = cli_error(capsys, "demo", "--vqgan", tmp_path)
    assert "--vqgan needs --model" in err, err
    err = cli_error(capsys, "serve", "--layout", "anole", "--port", 0)
    assert "--layout needs --model" in err, err
    for command in ("demo", "sweep"):
        err = cli_error(capsys, command, "--layout", "anole")
        assert "--layout anole needs --model (a Chameleon checkpoint)" in err, err
    # --port 0: serve binds its port before the model loads, and 8000 may be another test's at this moment
    err = cli_error(capsys, "serve", "--dtype", "float16", "--port", 0)  # float32 and bfloat16 are the built-in model's
    assert "--dtype float16: the built-in model runs in float32 or bfloat16; allowed for it: auto, float32, bfloat16" \
        in err, err


def test_list_classes_into_a_closed_pipe_stops_quietly():
    import subprocess
    import sys

    proc = subprocess.run(f"{sys.executable} -m csdgen generate --list-classes | head -2", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert len(proc.stdout.splitlines()) == 2 and proc.stderr == "", proc.stderr


def test_a_bad_window_names_auto_as_allowed(capsys, tmp_path):
    from cli_helpers import usage_error

    # one wording for every bad value (there were two: "must be an integer >= 1, or auto"
    # for 0 and -1, "expected an integer in 1..1000000, or auto" for 1.5 and nan)
    for value in ("nan", "0", "-1", "1.5", "99999999"):
        err = usage_error(capsys, "generate", "--window", value, "--out", tmp_path / "g", one_line=True)
        assert f"argument --window: '{value}': allowed an integer in 1..1000000 or auto" in err, err


@pytest.mark.parametrize("windows", ["0", "8,auto"])
def test_sweep_windows_error_says_integers_only_and_makes_no_folder(capsys, tmp_path, windows):
    err = usage_error(capsys, "sweep", "-n", 2, "--windows", windows, "--out", tmp_path / "sw", one_line=True)
    assert "allowed: integers" in err and "auto is not swept" in err and "or 'auto'" not in err, err
    assert not (tmp_path / "sw").exists()


def test_sweep_help_says_windows_are_integers():
    from csdgen.cli import build_parser

    help_text = " ".join(build_parser().commands["sweep"].format_help().split())
    assert "--windows LIST windows, integers >= 1" in help_text and "auto is not swept" in help_text


def test_empty_model_paths_are_refused_not_read_as_the_current_folder(tmp_path, monkeypatch):
    from csdgen.models import load_model
    from csdgen.models.builtin import load_builtin_model

    monkeypatch.chdir(tmp_path)
    for path in ("", "  "):
        with pytest.raises(ValueError, match=r"an empty path; allowed: a checkpoint folder"):
            load_model(path)
    with pytest.raises(ValueError, match=r"^weights_dir='': an empty path"):
        load_builtin_model("")


@pytest.mark.parametrize("tail", ["/".join(["y" * 200] * 25), "y" * 300])
def test_an_over_long_out_is_shortened_with_the_out_hint(weights, tmp_path, capsys, tail):
    out = tmp_path / "a" / tail
    err = cli_error(capsys, "generate", "--weights", weights, "-n", 1, "--window", 8, "--out", out)
    assert "File name too long" in err and "choose another with --out" in err and "..." in err, err
    assert len(err) < 300, err
    assert not (tmp_path / "a").exists()  # the parent mkdir made on the way is removed again


def test_ctrl_c_before_anything_is_written_does_not_say_something_was(monkeypatch, capsys, tmp_path):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("csdgen.cli.generate.builtin_job", interrupted)
    assert run("generate", "--out", tmp_path / "o") == 130
    err = capsys.readouterr().err
    assert "the images already written are kept" in err and "what was written" not in err
    assert not (tmp_path / "o").exists()


def test_the_cli_names_the_over_long_name_not_only_the_paths_length(tmp_path, capsys):
    out = tmp_path / ("x" * 300) / "y"
    assert run("generate", "-n", "1", "--out", out) == 2
    err = capsys.readouterr().err
    assert "File name too long: its longest name has 300 bytes, the path" in err and "choose another with --out" in err


@pytest.mark.parametrize("text", ["\u0661", "\u0663\u0662", "\uff15"])
def test_integer_options_refuse_digits_of_other_scripts(text):
    """``--limit ١`` (an Arabic-Indic one) ran as 1: Python's int() reads every script's digits."""
    from csdgen.cli import _options as opt

    for parse in (opt.count(), opt.seed, opt.top_k):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)
    assert opt.count()("3") == 3 and opt.seed("7") == 7


@pytest.mark.parametrize("argv", [["bench", "--nonsense"], ["compare", "stray"], ["generate", "--out", "o", "--x", "1"]])
def test_unknown_options_point_to_the_commands_own_help(capsys, argv):
    """``csdgen bench --nonsense`` pointed to ``csdgen --help``, which does not list bench's options."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert f"csdgen {argv[0]}: error: unrecognized arguments:" in err and f"(options: csdgen {argv[0]} --help)" in err


@pytest.mark.parametrize("argv", [["bench", "--weights", ""], ["bench", "--model", ""], ["bench", "--clip-model", " "],
                                  ["generate", "--model", ""], ["serve", "--weights", ""], ["demo", "--model", ""]])
def test_empty_paths_are_refused_not_read_as_the_current_folder(capsys, argv):
    """``--weights ''`` said "no built-in weights in ." (an empty path is the current folder)."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert f"argument {argv[1]}: {argv[2]!r}: an empty path" in err and "\n" not in err


def test_a_real_option_refuses_values_outside_its_interval_naming_what_is_allowed():
    """``_options.real`` (the benchmarks' --tolerance, --capacity, ...): open and closed bounds, no
    infinity or NaN, and the message names what is allowed."""
    from csdgen.cli._options import real

    fraction = real(0.0, 1.0)
    assert fraction("0") == 0.0 and fraction("0.5") == 0.5
    for bad in ("1", "-0.1", "nan", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"allowed a number in \[0, 1\)"):
            fraction(bad)
    positive = real(0.0, low_open=True, allowed="a number > 0")
    assert positive("2.5") == 2.5
    for bad in ("0", "inf", "-3"):
        with pytest.raises(argparse.ArgumentTypeError, match="allowed a number > 0"):
            positive(bad)


def test_help_texts_name_the_real_auto_widest_window_and_an_existing_section():
    """plan's help said the widest auto window was 64 (it is 32) and refused --window auto; generate's
    and serve's --window help pointed to a README section that does not exist and serve's spoke of --batch-size."""
    from csdgen.cli import plan as plan_cli
    from csdgen.engine import AUTO_MAX_WINDOW

    parser = cli.build_parser()
    assert plan_cli.AUTO_WIDEST == AUTO_MAX_WINDOW
    plan_help = " ".join(parser.commands["plan"].format_help().split())
    assert f"the widest window='auto' runs, {AUTO_MAX_WINDOW};" in plan_help, plan_help
    generate_help = " ".join(parser.commands["generate"].format_help().split())
    serve_help = " ".join(parser.commands["serve"].format_help().split())
    assert "(docs/library.md, Batches)" in generate_help and "README, Batches" not in generate_help
    assert "## Batches" in (Path(__file__).parents[1] / "docs" / "library.md").read_text()
    assert "--batch-size" not in serve_help.split("--window W")[1].split("--lam")[0] and "(docs/serve.md)" in serve_help


def test_plan_takes_window_auto_as_the_widest_auto_window(capsys, monkeypatch):
    monkeypatch.setattr("csdgen.models.memory_check.available_memory", lambda device: 8 * 2**30)  # one reading for both
    assert run("plan", "--batch-size", 2, "--window", "auto") == 0
    auto = capsys.readouterr().out
    assert run("plan", "--batch-size", 2, "--window", 32) == 0
    assert capsys.readouterr().out == auto
    err = one_line_usage_error(capsys, "plan", "--window", "wide")
    assert "--window: 'wide': expected an integer in 1..1024, or auto" in err


@pytest.mark.parametrize("argv, option", [
    (["generate", "--model", "M", "--prompt", "caf\udce9"], "--prompt"),
    (["generate", "--model", "M", "--prompt", "a", "--negative-prompt", "caf\udce9"], "--negative-prompt"),
    (["bench", "--model", "M", "--positive-prompt", "caf\udce9"], "--positive-prompt"),
    (["bench", "--model", "M", "--prompt-template", "caf\udce9 {prompt}"], "--prompt-template"),
    (["serve", "--model", "M", "--prompt-template", "caf\udce9 {prompt}"], "--prompt-template"),
])
def test_prompt_text_that_is_not_utf8_is_refused_naming_the_option_and_the_byte(capsys, argv, option):
    # Python hands argv bytes that are not UTF-8 over as lone surrogates (surrogateescape): b'\xe9' -> '\udce9'
    err = one_line_usage_error(capsys, *argv)
    assert f"argument {option}:" in err and "is not UTF-8 text (byte 3: b'\\xe9')" in err and "Traceback" not in err


@pytest.fixture(scope="module")
def janus_folder(tmp_path_factory):
    from test_models_janus import build_checkpoint

    return str(build_checkpoint(tmp_path_factory.mktemp("janus")))


@pytest.mark.parametrize("change, differs", [(["--dtype", "bfloat16"], 'dtype: "float32" there, "bfloat16" here'),
                                             (["--method", "sjd"], 'method: "csd" there, "sjd" here'),
                                             (["--lam", 0.3], "rule: ")])
def test_a_model_run_into_a_folder_of_other_settings_is_refused_before_the_weights_are_read(
        janus_folder, tmp_path, capsys, monkeypatch, change, differs):
    out = tmp_path / "out"
    common = ["generate", "--model", janus_folder, "--prompt", "a cat", "-n", 1, "--window", 4, "--out", out]
    assert run(*common, "--method", "csd") == 0
    assert run(*common, "--method", "csd") == 0  # the same settings resume
    capsys.readouterr()
    import csdgen.models.auto

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were read before the refusal")

    monkeypatch.setattr(csdgen.models.auto, "load_model", no_load)
    err = cli_error(capsys, *common, "--method", "csd", *change)
    assert "holds a run with other settings" in err and differs in err


def test_a_model_run_dropping_or_adding_quantize_is_refused_before_the_weights_are_read(
        janus_folder, tmp_path, capsys, monkeypatch):
    """Found by a new-user try-out: a record keeps ``quantize`` only when set, so a rerun without --quantize into
    a quantised run's folder was refused only after the weights were read."""
    quantised, plain = tmp_path / "q", tmp_path / "p"
    common = ["generate", "--model", janus_folder, "--prompt", "a cat", "-n", 1, "--window", 4, "--no-maps"]
    assert run(*common, "--quantize", "int8", "--out", quantised) == 0
    assert run(*common, "--out", plain) == 0
    capsys.readouterr()
    import csdgen.models.auto

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were read before the refusal")

    monkeypatch.setattr(csdgen.models.auto, "load_model", no_load)
    err = cli_error(capsys, *common, "--out", quantised)
    assert 'holds a run with other settings (quantize: "int8" there, null here)' in err, err
    err = cli_error(capsys, *common, "--quantize", "int8", "--out", plain)
    assert 'holds a run with other settings (quantize: null there, "int8" here)' in err, err


def test_a_model_run_whose_out_is_a_file_is_refused_before_the_weights_are_read(janus_folder, tmp_path, capsys,
                                                                                   monkeypatch):
    import csdgen.models.auto

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were read before the refusal")

    monkeypatch.setattr(csdgen.models.auto, "load_model", no_load)
    (tmp_path / "file").write_text("")
    for out in (tmp_path / "file", tmp_path / "file" / "inside"):
        err = cli_error(capsys, "generate", "--model", janus_folder, "--prompt", "a cat", "--out", out)
        assert "a file, not a folder; choose another with --out" in err, err


def test_an_out_that_is_a_broken_link_or_a_loop_of_links_is_named_so(tmp_path, capsys):
    """A new user's try-out: both were "not writable (File exists)"."""
    import os

    os.symlink(tmp_path / "nowhere" / "x", tmp_path / "dangling")
    os.symlink(tmp_path / "loop2", tmp_path / "loop1")
    os.symlink(tmp_path / "loop1", tmp_path / "loop2")
    for out, inside in ((tmp_path / "dangling", ""), (tmp_path / "loop1", ""), (tmp_path / "dangling" / "in", "is inside")):
        err = cli_error(capsys, "generate", "-n", 1, "--out", out)
        assert "a symbolic link to " in err and "which does not exist (or is a loop of links)" in err, err
        assert inside in err and "File exists" not in err, err
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o555)
    try:
        if os.access(read_only, os.W_OK):  # root writes anyway
            return
        err = cli_error(capsys, "generate", "-n", 1, "--out", read_only / "new" / "deeper")
        assert f"({str(read_only)!r} is not writable)" in err, err
    finally:
        read_only.chmod(0o755)


def test_a_checkpoint_spelt_another_way_resumes_its_run(janus_folder, tmp_path, capsys, monkeypatch):
    """The same folder with a trailing slash, relative or absolute, from another working folder: the same run
    (the record keeps the folder resolved); a record that kept it relative still resumes from where it ran."""
    out = tmp_path / "out"
    common = ["--prompt", "a cat", "-n", 1, "--window", 4, "--no-maps", "--out", out]
    assert run("generate", "--model", janus_folder, *common) == 0
    record = json.loads((out / "record.json").read_text())["settings"]
    assert record["checkpoint"] == str(Path(janus_folder).resolve()) and record["model"] == janus_folder
    folder = Path(janus_folder)
    monkeypatch.chdir(folder.parent)
    for spelt in (janus_folder + "/", folder.name, f"./{folder.name}/"):
        capsys.readouterr()
        assert run("generate", "--model", spelt, *common) == 0, capsys.readouterr().err
    assert len(list(out.glob("*.png"))) == 1
    # a record written when the folder was kept as given (relative), resumed from the same working folder
    data = json.loads((out / "record.json").read_text())
    data["settings"].update(checkpoint=folder.name, model=folder.name)
    (out / "record.json").write_text(json.dumps(data))
    assert run("generate", "--model", janus_folder, *common) == 0, capsys.readouterr().err
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat\n")
    bench = ["bench", "--prompts", prompts, "--methods", "sjd", "--window", 4, "--out", tmp_path / "b"]
    assert run(*bench, "--model", janus_folder) == 0
    assert run(*bench, "--model", f"./{folder.name}/") == 0, capsys.readouterr().err


def test_generate_and_demo_take_model_builtin_as_the_built_in_model(weights, tmp_path, capsys):
    out = tmp_path / "g"
    assert run("generate", "--model", "builtin", "--weights", weights, "--class", "dog face", "-n", 1, "--window", 4,
               "--no-maps", "--out", out) == 0, capsys.readouterr().err
    assert json.loads((out / "record.json").read_text())["settings"]["model"] == "builtin"
    err = cli_error(capsys, "demo", "--model", "builtin", "--vqgan", tmp_path)  # the built-in model: no --vqgan
    assert "--vqgan needs --model" in err, err
    from csdgen.cli import build_parser

    assert build_parser().parse_args(["serve", "--model", "builtin"]).model is None  # serve's default, the built-in model


@pytest.mark.parametrize("given", [["--prompt", "a cat"], [], ["--class", "red apple"]])
def test_the_built_in_weights_folder_given_as_model_is_told_to_use_weights(weights, tmp_path, capsys, given):
    """Said first, whatever else is missing or built-in only (it said "--model needs prompts" first)."""
    err = cli_error(capsys, "generate", "--model", weights, *given, "--out", tmp_path / "g")
    assert "is a built-in model's weights folder, not a checkpoint: give it as --weights FOLDER" in err, err


@pytest.mark.parametrize("option, value", [("--class", "cat"), ("-n", 2)])
def test_docs_say_compare_with_prompts_refuses_class_and_n_as_it_does(capsys, tmp_path, option, value):
    prompts = tmp_path / "classes.txt"
    prompts.write_text("dog face\n")
    err = cli_error(capsys, "compare", "--prompts", prompts, option, value, "--out", tmp_path / "c")
    assert "choose built-in images; with --model or --prompts give --limit N" in err
    docs = " ".join((Path(__file__).parents[1] / "docs" / "cli.md").read_text().split())
    assert "`--class` and `-n` are then refused" in docs and "`--batch-size` is not used" in docs


def test_an_empty_prompt_is_called_empty_not_missing(capsys, tmp_path):
    err = cli_error(capsys, "generate", "--model", tmp_path, "--prompt", " ", "--out", tmp_path / "g")
    assert err.startswith("csdgen generate: error: --prompt ' ' is empty; allowed: a prompt with some text"), err


def test_a_model_bench_into_a_folder_of_other_settings_is_refused_before_the_weights_are_read(
        janus_folder, tmp_path, capsys, monkeypatch):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat\n")
    common = ["bench", "--model", janus_folder, "--prompts", prompts, "--methods", "sjd", "--window", 4,
              "--out", tmp_path / "b"]
    assert run(*common) == 0
    assert run(*common) == 0  # the same settings resume
    capsys.readouterr()
    import csdgen.models.auto

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were read before the refusal")

    monkeypatch.setattr(csdgen.models.auto, "load_model", no_load)
    err = cli_error(capsys, *common, "--dtype", "bfloat16")
    assert 'holds a bench with other settings (dtype: "float32" there, "bfloat16" here)' in err


def test_the_run_line_says_split_only_for_a_device_map_of_several_places():
    """--device-map '{"": "cpu"}' puts the whole model on one device, and the run's first line said it was split."""
    import argparse

    from csdgen.cli._common import choose_dtype

    def line(placed):
        args = argparse.Namespace(dtype=None, device_map=placed, command="generate", model="ck")
        choose_dtype(args, "liquid", "cpu")
        return args.run_line

    assert line({"": "cpu"}).endswith(", placed on cpu by --device-map") and "split" not in line({"": "cpu"})
    assert line({"model.layers.0": "cpu", "model.layers.1": "disk"}).endswith(", split by --device-map")
    assert line("auto").endswith(", split by --device-map")  # placed by accelerate while loading
    assert "--device-map" not in line(None)
