"""What a new user meets on the command line, one test per point."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

import csdgen
from csdgen import cli
from csdgen.cli import _options
from csdgen.models.builtin import load_builtin_model

from builtin_fixture import make_tiny_weights
from cli_helpers import run, usage_error

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return make_tiny_weights(tmp_path_factory.mktemp("weights"))


def helptext(capsys, command) -> str:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    return " ".join(capsys.readouterr().out.split())  # unwrapped


# ---- 3. compare and sweep: their own options, their own defaults, every option honoured ----

def test_compare_and_sweep_help_show_their_own_defaults_and_bench_model_options(capsys):
    compare = helptext(capsys, "compare")
    assert "(default 64" in compare and "(default ./compare)" in compare and "(default 16;" in compare
    assert "(default 8" not in compare and "./outputs" not in compare
    sweep = helptext(capsys, "sweep")
    assert "(default 64" in sweep and "(default ./sweep)" in sweep
    for text in (compare, sweep):  # --model/--prompts: the command runs as csdgen bench
        for option in ("--model MODEL", "--prompts PROMPTS", "--limit N", "--offset K", "runs as csdgen bench"):
            assert option in text, option
    for option in ("--window ", "--lam ", "--delta ", "--draft-init ", "--addition-c C"):
        assert option not in sweep, option
    generate = helptext(capsys, "generate")
    assert "(default ./outputs)" in generate and "--model" in generate


def test_sweep_refuses_options_it_does_not_honour(capsys):
    """Regression: `sweep --window 32 --lam 0.3` ran at window 16 and lambda 0.5."""
    for option in ("--window", "--lam", "--draft-init"):
        err = usage_error(capsys, "sweep", option, "3")
        assert f"unrecognized arguments: {option}" in err


def test_compare_honours_window_lambda_draft_init_and_entropy_unit(weights, tmp_path):
    """Regression: `compare --draft-init onehot --entropy-unit normalized` recorded uniform / nats."""
    out = tmp_path / "cmp"
    assert run("compare", "--weights", weights, "-n", 2, "--methods", "csd", "--window", 8, "--lam", 0.3, "--delta", 0.5,
               "--draft-init", "onehot", "--entropy-unit", "normalized", "--out", out) == 0
    run_csd = json.loads((out / "run_csd.json").read_text())
    assert run_csd["key"]["classes"] == ["0", "2"]  # no --class: classes spread over the categories (ClassNames.spread)
    settings = run_csd["settings"]
    assert settings["window"] == 8 and settings["draft_init"] == "onehot"
    assert settings["rule"] == {"lam": 0.3, "delta": 0.5, "entropy_unit": "normalized"}


def test_sweep_honours_entropy_unit_and_sampling(weights, tmp_path):
    out = tmp_path / "sw"
    assert run("sweep", "--weights", weights, "-n", 2, "--csd-lam", "0.3", "--addition-c", "", "--gsd-radius", "",
               "--lantern-delta", "", "--baselines", "", "--windows", 4, "--entropy-unit", "normalized",
               "--guidance-scale", 2, "--out", out) == 0
    settings = json.loads((out / "run_csd_lam0.3_W4_uniform.json").read_text())["settings"]
    assert settings["rule"]["entropy_unit"] == "normalized" and settings["window"] == 4
    assert settings["guidance_scale"] == 2.0


# ---- 4. validation before running ----

def test_compare_with_one_image_is_refused_before_running(capsys, tmp_path):
    """Regression: `compare -n 1` generated everything for minutes, then failed in the Frechet distance."""
    err = usage_error(capsys, "compare", "-n", "1", "--out", str(tmp_path / "c"))
    assert "must be an integer >= 2 (the Frechet distance" in err and not (tmp_path / "c").exists()


def test_sweep_unknown_baseline_and_empty_grids_are_clear_errors(weights, tmp_path, capsys):
    """Regression: `sweep --baselines foo` with empty grids ended in an IndexError traceback."""
    assert "unknown baseline 'foo'; allowed: ar, sjd, sjd-coupled" in usage_error(capsys, "sweep", "--baselines", "foo")
    empty = ["--csd-lam", "", "--addition-c", "", "--gsd-radius", "", "--lantern-delta", "", "--baselines", ""]
    assert run("sweep", "--weights", weights, "-n", 2, *empty, "--out", tmp_path / "s") == 2
    assert "nothing to sweep" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [("{not json", "is not valid JSON (line 1, column 2"),
                                           ("[1, 2]", "holds a list, expected a JSON object")])
def test_malformed_builtin_config_names_the_file(weights, tmp_path, capsys, text, message):
    folder = tmp_path / "w"
    folder.mkdir()
    for f in weights.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / "config.json").write_text(text)
    assert run("generate", "--weights", folder, "-n", 1, "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert str(folder / "config.json") in err and message in err and "Traceback" not in err


@pytest.mark.parametrize("text, message", [("{", "is not valid JSON"), ("[]", "holds a list"),
                                           ('{"a": 1}', "is not a csdgen run record")])
def test_malformed_record_names_the_file(weights, tmp_path, capsys, text, message):
    out = tmp_path / "o"
    out.mkdir()
    (out / "record.json").write_text(text)
    assert run("generate", "--weights", weights, "-n", 1, "--out", out) == 2
    err = capsys.readouterr().err
    assert str(out / "record.json") in err and message in err


@pytest.mark.parametrize("text, message", [
    ('{"model_type": "multi_modality"}', "DeepSeek's original Janus format (model_type 'multi_modality'); "
                                         "csdgen loads the transformers-format copy"),
    ("[1]", "holds a list, expected a JSON object"),
    ("{,}", "is not valid JSON"),
])
def test_checkpoint_config_problems_name_the_file(tmp_path, capsys, text, message):
    folder = tmp_path / "Janus-Pro-7B"
    folder.mkdir()
    (folder / "config.json").write_text(text)
    assert run("generate", "--model", folder, "--prompt", "a fox", "--device", "cpu", "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert message in err and str(folder / "config.json") in err


def test_ctrl_c_during_start_up_is_one_line(monkeypatch, capsys, tmp_path):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("csdgen.cli.generate.builtin_job", interrupted)
    assert run("generate", "--out", tmp_path / "o") == 130
    err = capsys.readouterr().err
    assert err.startswith("csdgen generate: interrupted;") and err.count("\n") == 1


@pytest.mark.parametrize("command, kept", [("compare", "the images already decoded are kept (run_*.json"),
                                           ("sweep", "the images already decoded are kept (run_*.json"),
                                           ("bench", "the records and images already written are kept")])
def test_ctrl_c_says_what_the_interrupted_command_keeps(command, kept, monkeypatch, capsys, tmp_path):
    """(bench and sweep said "images, or compare's finished methods", the words of generate and compare.)"""
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(f"csdgen.cli.{command}.run", interrupted)
    assert run(command, "--out", tmp_path / "o") == 130
    err = capsys.readouterr().err
    assert err.startswith(f"csdgen {command}: interrupted; {kept}") and err.count("\n") == 1, err
    assert err.endswith(": rerun the same command to resume\n"), err


def test_sigint_while_importing_gives_no_traceback(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "csdgen", "generate", "-n", "1", "--out", str(tmp_path / "o")],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal
    time.sleep(2.0)  # inside the heavy imports (torch: seconds) or the first batch: both must end in one line
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and re.search(r"^csdgen( generate)?: interrupted;", err, re.M), err


def test_sigterm_stops_a_run_as_ctrl_c_does_and_the_rerun_resumes(tmp_path):
    """SIGTERM (a batch scheduler's stop; torchrun's when another process of a bench fails) ended generate
    with status -15 and no line."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "o"
    argv = [sys.executable, "-m", "csdgen", "generate", "-n", "64", "--batch-size", "2", "--no-maps", "--out", str(out)]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    deadline = time.monotonic() + 240
    while len(list(out.glob("*.png"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the first batch's images are written (the record comes before them)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and re.search(r"^csdgen generate: interrupted \(SIGTERM\); the images already written "
                                                r"are kept: rerun the same command to resume$", err, re.M), err
    kept = len(list(out.glob("*.png")))
    assert 2 <= kept < 64


def test_a_torchrun_process_stopped_by_sigterm_says_another_process_ended(monkeypatch, capsys):
    """A bench whose rank 0 was refused (its folder in use) had its rank 1 stopped by torchrun, and rank 1 said
    only "interrupted (SIGTERM); ... rerun the same command to resume", as if it had been stopped from outside."""
    from csdgen import cli
    from csdgen.cli import bench as bench_cli

    def stopped(args):
        raise cli._Terminated()

    monkeypatch.setattr(bench_cli, "run", stopped)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["bench", "--limit", "1"]) == 143
    err = capsys.readouterr().err
    assert "interrupted (SIGTERM: torchrun stops every process of a run when one of them ends; its line says why)" in err
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert cli.main(["bench", "--limit", "1"]) == 143
    assert "interrupted (SIGTERM); " in capsys.readouterr().err


@pytest.mark.parametrize("stop", ["KeyboardInterrupt", "cli._Terminated"])
def test_a_stop_that_lands_in_a_finaliser_is_delivered_again(stop):
    """A try-out: a SIGTERM that landed inside a garbage-collected object's __del__ was printed as "Exception
    ignored" and dropped, and compare ran on to its end with status 0 (Ctrl-C alike). In a process of its own:
    the command's main thread is where signals are handled."""
    code = f"""
import signal, sys, time
from csdgen import cli
class Finalised:
    def __del__(self):
        raise {stop}()
hook = sys.unraisablehook
try:
    with cli._stops_handled("compare"):
        for _ in range(3):  # three stops swallowed before the first is delivered again
            thing = Finalised()
            del thing  # the finaliser's stop is dropped by Python, then delivered again
        for _ in range(2000):  # the handler runs between lines
            time.sleep(0.001)
    print("swallowed")
except KeyboardInterrupt as stop:
    print("delivered", type(stop).__name__)
print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL and sys.unraisablehook is hook
      and signal.getsignal(signal.SIGALRM) == signal.SIG_DFL)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split("\n")[:2] == [f"delivered {stop.split('.')[-1]}", "True"], (done.stdout, done.stderr)


def test_error_during_a_run_starts_its_own_line(weights, tmp_path, capsys, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("csdgen.runs._write_batch", disk_full)
    assert run("generate", "--weights", weights, "-n", 2, "--batch-size", 1, "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err
    last = err.rstrip("\n").split("\n")[-1]
    assert last == "csdgen generate: error: No space left on device"  # the reason, without [Errno 28]


# ---- 5. fast help: no torch before a command runs ----

def test_help_and_usage_errors_do_not_import_torch():
    code = ("import sys; from csdgen.cli import build_parser\n"
            "for argv in (['generate'], ['compare', '-n', '5'], ['sweep', '--csd-lam', '0.1']):\n"
            "    build_parser().parse_args(argv)\n"
            "print(sorted(m for m in ('torch', 'transformers', 'numpy', 'PIL') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_returns_within_a_generous_bound():
    """`csdgen --help` and a usage error: well under a second when nothing heavy is imported (bound 5 s)."""
    for argv in (["--help"], ["generate", "--help"], ["generate", "--window", "0"]):
        began = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "csdgen", *argv], capture_output=True, text=True)
        assert time.perf_counter() - began < 5.0 and proc.returncode in (0, 2)


def test_cli_choices_equal_the_engines():
    from csdgen.decoding import METHODS
    from csdgen.drafting import DRAFT_INITS, ONE_HOT_INITS, REFRESH_MODES
    from csdgen.engine import resolve_method
    from csdgen.evaluation.compare import method_presets
    from csdgen.models.defaults import FAMILY_DEFAULTS

    import torch

    assert _options.METHODS == METHODS and _options.DRAFT_INITS == DRAFT_INITS and _options.REFRESH_MODES == REFRESH_MODES
    assert _options.ONE_HOT_INITS == ONE_HOT_INITS
    from csdgen.serve.schemas import GUIDANCE_SCHEDULES

    assert _options.GUIDANCE_SCHEDULES == GUIDANCE_SCHEDULES  # what serve's --guidance-schedule offers, its defaults take
    model = load_builtin_model()
    for name in METHODS:  # the table the command line reads without torch says what each rule needs
        assert _options.method_draft_init(name) == resolve_method(name, model, {})[0].draft_init, name
    assert list(method_presets(codebook=torch.zeros(4, 2))) == list(cli.compare.COMPARE_METHODS)
    assert _options.family_defaults("builtin") == FAMILY_DEFAULTS["builtin"]
    assert _options.builtin_class_names() == load_builtin_model().class_names
    from csdgen.decoding import AUTO_MAX_WINDOW

    assert f"picks 1..{AUTO_MAX_WINDOW} per iteration" in " ".join(cli.build_parser()._subparsers._group_actions[0]
                                                                   .choices["generate"].format_help().split())


# ---- 6. size guard on the built-in path ----

def test_batch_is_capped_by_memory_and_written_batch_by_batch(weights, tmp_path, capsys, monkeypatch):
    model = load_builtin_model(weights)
    from csdgen.runs import builtin_bytes_per_image

    per_image = builtin_bytes_per_image(model, 32, True)  # window 32: the built-in default; guided
    monkeypatch.setattr("csdgen.models.memory_check.available_memory", lambda device: 4 * per_image + 1)  # half of it: 2 images
    out = tmp_path / "o"
    assert run("generate", "--weights", weights, "-n", 5, "--batch-size", 100000, "--no-maps", "--out", out) == 0
    err = capsys.readouterr().err
    assert "--batch-size 100000: about 2 images fit" in err
    record = json.loads((out / "record.json").read_text())
    assert [b["images"] for b in record["batches"]] == [[0, 1], [2, 3], [4]]


# ---- 7. the API saves a run as the CLI does and gives PIL images ----

def test_api_save_run_and_pil_images(weights, tmp_path):
    model = load_builtin_model(weights)
    # conditions by name (any case and spacing, or a short name) or index
    summary = csdgen.save_run(model, ["Family: Man,Boy,Boy", 0], tmp_path / "api", method="sjd", window=8, seed=1, scale=2)
    assert summary.images == 2 and summary.line().startswith("2 images, 512 tokens")
    names = sorted(p.name for p in (tmp_path / "api").iterdir())
    assert names == ["0000_family-man-boy-boy.png", "0000_family-man-boy-boy_map.png", "0001_dog-face.png",
                     "0001_dog-face_map.png", "record.json"]
    record = json.loads((tmp_path / "api" / "record.json").read_text())
    assert record["images"]["0"]["class"] == "family: man, boy, boy" and record["settings"]["window"] == 8
    result = csdgen.generate(model, [1, 0], method="sjd", window=8, seed=1)  # images 0 and 1 of the run
    pictures = csdgen.pil_images(model, result, scale=2)
    assert [p.size for p in pictures] == [(128, 128)] * 2 and pictures[0].mode == "RGB"
    assert pictures[0].tobytes() == Image.open(tmp_path / "api" / "0000_family-man-boy-boy.png").convert("RGB").tobytes()
    again = csdgen.save_run(model, ["man-boy-boy", "dog face"], tmp_path / "api", method="sjd", window=8, seed=1, scale=2)
    assert again.resumed == 2 and again.run_seconds == 0.0


# ---- 8. records ----

def test_record_has_version_date_totals_and_relative_weights(weights, tmp_path):
    out = tmp_path / "o"
    assert run("generate", "--weights", weights, "-n", 3, "--batch-size", 2, "--out", out) == 0
    record = json.loads((out / "record.json").read_text())
    assert record["csdgen_version"] == csdgen.__version__ and record["created"].endswith("+00:00")
    assert record["settings"]["weights"] == str(weights)  # as given, not resolved
    totals = record["totals"]
    assert totals["images"] == 3 and totals["tokens"] == 768 and totals["runs"] == 1
    assert totals["steps"] == sum(i["steps"] for i in record["images"].values())
    assert totals["decode_seconds"] == pytest.approx(sum(b["decode_seconds"] for b in record["batches"]))
    assert all("seconds" not in k for image in record["images"].values() for k in image)  # batch time once, per batch
    out2 = tmp_path / "shipped"
    assert run("generate", "-n", 1, "--window", 4, "--no-maps", "--out", out2) == 0
    assert json.loads((out2 / "record.json").read_text())["settings"]["weights"] == "shipped"


def test_resume_summary_counts_the_time_of_kept_images(weights, tmp_path, capsys):
    """Regression: after a resume the summary counted kept images but only this run's time ("... 0.0 s")."""
    out = tmp_path / "o"
    argv = ["generate", "--weights", weights, "-n", 2, "--batch-size", 1, "--out", out]
    assert run(*argv) == 0
    first = json.loads((out / "record.json").read_text())
    (out / "0001_family-man-boy-boy.png").unlink()
    capsys.readouterr()
    assert run(*argv) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    record = json.loads((out / "record.json").read_text())
    kept = next(b for b in first["batches"] if b["batch"] == 0)["decode_seconds"]
    assert line.startswith("2 images (1 kept from an earlier run), 512 tokens")
    assert record["totals"]["runs"] == 2 and record["totals"]["decode_seconds"] > kept
    assert f"decoding {record['totals']['decode_seconds']:.1f} s in all" in line
    assert record["created"] == first["created"]


def test_refusal_names_the_values_that_differ(weights, tmp_path, capsys):
    out = tmp_path / "o"
    assert run("generate", "--weights", weights, "-n", 1, "--window", 4, "--out", out) == 0
    assert run("generate", "--weights", weights, "-n", 1, "--window", 8, "--guidance-scale", 2, "--out", out) == 2
    err = capsys.readouterr().err
    assert "window: 4 there, 8 here" in err and "sampling.guidance_scale: 3.0 there, 2.0 here" in err


# ---- 9. smaller points ----

def test_window_longer_than_the_image_is_clamped_with_a_note(weights, tmp_path, capsys):
    out = tmp_path / "o"
    assert run("generate", "--weights", weights, "-n", 1, "--window", 100000, "--no-maps", "--out", out) == 0
    assert "--window 100000 is longer than the image (256 tokens): using 256" in capsys.readouterr().err
    assert json.loads((out / "record.json").read_text())["settings"]["window"] == 256


def test_sweep_windows_longer_than_the_image_run_once_at_its_length_with_a_note(weights, tmp_path, capsys):
    """``sweep --windows 300,400`` capped both at the 256-token image without a word and printed two rows
    of one setting, labelled 300 and 400; now they run once, as window 256, with generate's note."""
    out = tmp_path / "s"
    assert run("sweep", "--weights", weights, "-n", 2, "--batch-size", 2, "--windows", "300,16,400",
               "--csd-lam", "0.5", "--addition-c", "", "--gsd-radius", "", "--lantern-delta", "",
               "--baselines", "", "--out", out) == 0
    assert "csdgen sweep: note: --windows 300,400 are longer than the image (256 tokens): using 256 once\n" in capsys.readouterr().err
    rows = json.loads((out / "sweep.json").read_text())
    assert [(r["method"], r["window"]) for r in rows] == [("csd", 256), ("csd", 16)]
    from csdgen.cli._common import longer_than_image
    from csdgen.cli.sweep import fit_windows

    assert fit_windows([16, 32], 256) == [16, 32]
    assert fit_windows([256, 300], 256) == [256]
    assert longer_than_image([300], 256, "--windows", once=True) == \
        "--windows 300 is longer than the image (256 tokens): using 256 once"


def test_top_k_that_is_not_a_number_names_the_value(capsys):
    err = usage_error(capsys, "generate", "--top-k", "abc")
    assert "argument --top-k: 'abc': expected an integer >= 1, or 0 / none for no top-k" in err
    assert "invalid" not in err


def test_missing_repo_names_the_real_cache_folder(tmp_path, capsys, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert run("generate", "--model", "nobody/no-such-model", "--prompt", "x", "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "hub") in err and "$HF_HUB_CACHE" not in err


def test_model_only_option_grammar(tmp_path, capsys):
    assert run("generate", "--prompt", "a dog", "--out", tmp_path / "o") == 2
    assert "--prompt needs --model" in capsys.readouterr().err
    assert run("generate", "--prompt", "a dog", "--layout", "anole", "--out", tmp_path / "o") == 2
    assert "--prompt, --layout need --model" in capsys.readouterr().err
    # --dtype is no checkpoint-only option: the built-in model says which dtypes it takes
    assert run("generate", "--dtype", "float16", "--out", tmp_path / "o") == 2
    assert ("--dtype float16: the built-in model runs in float32 or bfloat16; allowed for it: auto, float32, bfloat16"
            in capsys.readouterr().err)


def test_class_names_any_case_and_the_help_says_how_to_list_them(weights, tmp_path, capsys):
    assert run("generate", "--weights", weights, "-n", 2, "--class", "RED  APPLE,Dog Face", "--no-maps",
               "--out", tmp_path / "o") == 0
    assert sorted(p.name for p in (tmp_path / "o").glob("*.png")) == ["0000_red-apple.png", "0001_dog-face.png"]
    capsys.readouterr()
    text = helptext(capsys, "generate").replace("--list- classes", "--list-classes")  # argparse wraps at hyphens
    shipped = _options.builtin_class_names()
    assert f"the {len(shipped):,} classes of the shipped model" in text and "List them: --list-classes" in text
    assert "--list-classes [CATEGORY]" in text and "random" in text
    assert sum(name in text for name in shipped[:50]) <= 3  # examples, not the list (1,911 names)
    assert len(text) < 20_000


def test_device_is_accepted_for_the_builtin_model(weights, tmp_path, capsys):
    assert run("generate", "--weights", weights, "-n", 1, "--device", "cpu", "--no-maps", "--out", tmp_path / "o") == 0
    import torch

    if not torch.cuda.is_available():
        assert run("generate", "--weights", weights, "--device", "cuda", "--out", tmp_path / "g") == 2
        assert "no CUDA device is visible" in capsys.readouterr().err


def test_png_size_and_map_panels_are_as_documented(weights, tmp_path):
    from csdgen.evaluation.maps import LEGEND_H, PANEL_TITLES, TITLE_H

    out = tmp_path / "o"
    assert run("generate", "--weights", weights, "-n", 1, "--class", "red apple", "--out", out) == 0
    assert Image.open(out / "0000_red-apple.png").size == (128, 128)  # 64 x 64, nearest neighbour x2
    map_ = Image.open(out / "0000_red-apple_map.png").convert("L")
    assert map_.size == (3 * 128 + 8, TITLE_H + 128 + LEGEND_H)
    title_strip = map_.crop((0, 0, map_.width, TITLE_H))
    assert min(title_strip.tobytes()) < 100  # titles are drawn
    scale_row = map_.crop((132, TITLE_H + 128 + 17, 132 + 128, TITLE_H + 128 + 23))
    assert scale_row.getpixel((0, 2)) < 10 and scale_row.getpixel((127, 2)) > 245  # grey scale 0 .. ln V
    readme = (ROOT / "README.md").read_text()
    assert "upscaled x2 by nearest neighbour: 128 x 128" in readme and PANEL_TITLES[1].split(" (")[0] in readme


def test_malformed_cached_run_of_compare_names_the_file(weights, tmp_path, capsys):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "run_ar.json").write_text("{oops")
    (out / "run_ar.safetensors").write_bytes(b"")
    assert run("compare", "--weights", weights, "-n", 2, "--methods", "sjd", "--out", out) == 2
    err = capsys.readouterr().err
    assert str(out / "run_ar.json") in err and "is not valid JSON" in err


def test_another_batch_size_resumes_the_same_images(weights, tmp_path, capsys):
    """Regression: a smaller --batch-size after an out-of-memory stop could not resume."""
    fresh, resumed = tmp_path / "fresh", tmp_path / "resumed"
    common = ["generate", "--weights", weights, "-n", 4, "--window", 8, "--no-maps"]
    assert run(*common, "--batch-size", 1, "--out", fresh) == 0
    assert run(*common, "--batch-size", 4, "--out", resumed) == 0
    for name in ("0002_red-apple.png", "0003_dog-face.png"):
        (resumed / name).unlink()  # as if stopped
    capsys.readouterr()
    assert run(*common, "--batch-size", 2, "--out", resumed) == 0
    assert capsys.readouterr().out.startswith("4 images (2 kept from an earlier run)")
    for name in ("0000_dog-face.png", "0001_family-man-boy-boy.png", "0002_red-apple.png", "0003_dog-face.png"):
        assert (fresh / name).read_bytes() == (resumed / name).read_bytes(), name  # batch size never changes an image
    record = json.loads((resumed / "record.json").read_text())
    assert [b["images"] for b in record["batches"]] == [[0, 1, 2, 3], [2, 3]] and record["totals"]["runs"] == 2


def test_api_and_cli_use_the_models_defaults(weights, tmp_path):
    """Regression: csdgen.generate(model, ["coffee"]) ran window 16, guidance 1 where the CLI ran window 32, guidance 3."""
    model = load_builtin_model(weights)
    api = csdgen.generate(model, ["red apple"]).settings
    assert run("generate", "--weights", weights, "-n", 1, "--class", "red apple", "--no-maps", "--out", tmp_path / "o") == 0
    cli_settings = json.loads((tmp_path / "o" / "record.json").read_text())["settings"]
    d = model.defaults
    assert api["window"] == cli_settings["window"] == "auto"
    assert api["guidance_scale"] == cli_settings["sampling"]["guidance_scale"] == d.guidance_scale
    assert api["temperature"] == cli_settings["sampling"]["temperature"] == d.temperature
    assert api["rule"] == {"lam": d.lam, "delta": d.delta, "entropy_unit": "nats"}
    assert cli_settings["rule"] == f"CSD(lam={d.lam}, delta={d.delta}, entropy_unit='nats')"
    summary = csdgen.save_run(model, ["red apple"], tmp_path / "api", maps=False)
    assert json.loads((tmp_path / "api" / "record.json").read_text())["images"]["0"]["steps"] == summary.steps


@pytest.mark.parametrize("argv", [("generate", "--window", "0"), ("generate", "--method", "foo"), ("bogus",),
                                  ("generate", "--batch-size", "0"), ("demo", "--port", "70000")])
def test_usage_errors_are_one_line_naming_the_value(capsys, argv):
    """A bad option value: one line (no usage block) naming the value, and where the options are listed."""
    err = usage_error(capsys, *argv)
    assert err.count("\n") == 1 and "error:" in err and "--help" in err
    assert argv[-1] in err


# ---- 10. classes by name (1,911 emoji, names with commas and colons) ----

def test_random_classes_come_from_the_seed_and_aliases_and_repeats_work(weights, tmp_path):
    from builtin_fixture import CLASS_NAMES

    def classes(*argv, out):
        assert run("generate", "--weights", weights, "--no-maps", "--window", 4, "--out", tmp_path / out, *argv) == 0
        record = json.loads((tmp_path / out / "record.json").read_text())
        return [record["images"][str(i)]["class"] for i in range(len(record["images"]))]

    drawn = classes("-n", 3, "--class", "random", "--seed", 7, out="r")
    assert sorted(drawn) == sorted(CLASS_NAMES)  # three images, three different classes
    model = load_builtin_model(weights)
    assert drawn == [CLASS_NAMES[i] for i in model.classes.assign(["random"], 3, seed=7)]
    assert classes("-n", 3, "--class", "apple", "--class", "dog face,2", out="a") == ["red apple", "dog face", "red apple"]


def test_list_classes_by_category_without_loading_the_model(weights, tmp_path, capsys):
    assert run("generate", "--weights", weights, "--list-classes") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["Animals & Nature (1):", "  0  dog face  (also: dog)"]
    assert "  1  family: man, boy, boy  (also: man-boy-boy)" in out and out[-1].startswith("3 classes in all")
    assert run("compare", "--weights", weights, "--list-classes", "FOOD") == 0
    assert capsys.readouterr().out.splitlines()[:2] == ["Food & Drink (1):", "  2  red apple  (also: apple)"]
    assert run("generate", "--weights", weights, "--list-classes", "plants") == 2
    err = capsys.readouterr().err
    assert "no class category matches 'plants'; allowed: Animals & Nature, People & Body, Food & Drink" in err
    assert not (tmp_path / "outputs").exists()
    code = ("import sys; from csdgen import cli\n"
            "assert cli.main(['generate', '--list-classes', 'food']) == 0\n"
            "print('torch' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert proc.stderr.strip() == "False"  # the shipped model's list, read from its config.json alone
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("Food & Drink (") and any(line.split("  ")[2:3] == ["red apple"] for line in lines)


def test_every_shipped_class_name_is_found_whole_and_by_its_short_names():
    """The shipped config: unique names, each found whole, in any case; a short name or the emoji
    itself reaches its class; every other emoji's name (some hold commas: "family: man, boy, boy")
    is read whole and answered with the nearest classes drawn."""
    classes = _options.class_lookup()
    names = classes.names
    assert len(names) == len(set(names)) and len(names) == load_builtin_model().num_classes
    for i, name in enumerate(names):
        assert classes.split(name) == [name] and classes.index(name.upper()) == i, name
    assert names[classes.index("apple")] == "red apple" and names[classes.index("\U0001F34E")] == "red apple"
    assert classes.num_elsewhere > 1800  # the package's other emoji
    assert classes.split("family: man, boy, boy,dog face") == ["family: man, boy, boy", "dog face"]
    with pytest.raises(ValueError, match=r"'family: man, boy, boy' is not one of the \d+ classes this model draws; "
                                         r"the nearest it draws: '"):
        classes.index("family: man, boy, boy")


@pytest.mark.parametrize("command", ["compare", "sweep"])
def test_compare_and_sweep_over_a_prompt_set_name_a_benchs_files_when_interrupted(command, tmp_path, capsys, monkeypatch):
    """A new-user try-out: with --model or --prompts they write a bench's records and images, but the Ctrl-C line named
    run_*.json and .safetensors."""
    from csdgen import cli

    def stopped(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(getattr(cli, command), "run", stopped)
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red dog\n")
    assert cli.main([command, "--prompts", str(prompts), "--out", str(tmp_path / "o")]) == 130
    err = capsys.readouterr().err
    assert "interrupted; the records and images already written are kept" in err and "run_*.json" not in err, err
    assert cli.main([command, "--out", str(tmp_path / "b")]) == 130  # the built-in run keeps its cached runs
    assert "run_*.json and .safetensors in --out" in capsys.readouterr().err
