"""What a new user's trial of ``csdgen bench`` and ``compare`` found (issue 16, item 12), one test
each: a resumed bench mixing engines, a prompt file refused under another path, ``save_run``'s bad
batch sizes and empty inputs, long setting differences shown whole, non-ASCII digits, the primary
seed, repeated built-in classes, safetensors files other users cannot read, and three definitions
of the mean accepted length.

Model: the tiny random built-in weights of the CLI tests (3 classes; an image in well under a second).
"""

import json
import os
import stat
from pathlib import Path

import argparse

import pytest
import torch

from builtin_fixture import make_tiny_weights
from csdgen import cli


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return make_tiny_weights(tmp_path_factory.mktemp("builtin"))


def bench(weights_dir, out, *extra):
    return cli.main(["bench", "--weights", str(weights_dir), "--out", str(out), "--methods", "ar", "--window", "8",
                     "--floor-seed", "none", *map(str, extra)])


def test_bench_resume_with_another_engine_is_refused(weights, tmp_path, capsys):
    """The engine changes no token but every latency: a rerun with another --engine (or --compile)
    into the same folder was accepted and its rows averaged latencies of both engines."""
    assert bench(weights, tmp_path / "b", "--limit", "1", "--engine", "eager") == 0
    capsys.readouterr()
    assert bench(weights, tmp_path / "b", "--limit", "2") == 2
    err = capsys.readouterr().err
    assert 'engine: "eager" there, unset here' in err and "\n" not in err.strip()
    assert bench(weights, tmp_path / "b", "--limit", "2", "--engine", "eager") == 0  # the same engine resumes
    assert json.loads((tmp_path / "b" / "bench.json").read_text())["settings"]["engine"] == "eager"


def test_bench_resumes_a_prompt_file_named_by_another_path(weights, tmp_path, monkeypatch, capsys):
    """bench.json names a prompt file by its content: ``p.txt``, ``./p.txt``, its absolute path and a
    copy of it resume one bench (the path as typed was compared, so each of those was refused)."""
    (tmp_path / "p.txt").write_text("0\n1\n")
    monkeypatch.chdir(tmp_path)
    assert bench(weights, "b", "--prompts", "p.txt", "--limit", "1") == 0
    for spelling in ("./p.txt", str(tmp_path / "p.txt")):
        assert bench(weights, "b", "--prompts", spelling, "--limit", "1") == 0, capsys.readouterr().err
    (tmp_path / "copy.txt").write_text("0\n1\n")
    assert bench(weights, "b", "--prompts", "copy.txt") == 0
    (tmp_path / "other.txt").write_text("2\n1\n")
    assert bench(weights, "b", "--prompts", "other.txt") == 2
    assert "prompts:" in capsys.readouterr().err


def test_bench_resumes_a_folder_that_named_its_prompt_file_by_path(weights, tmp_path, monkeypatch):
    """A bench.json written before (the prompt file named by its path) still resumes with that file."""
    (tmp_path / "p.txt").write_text("0\n1\n")
    monkeypatch.chdir(tmp_path)
    assert bench(weights, "b", "--prompts", "p.txt", "--limit", "1") == 0
    manifest = json.loads(Path("b/bench.json").read_text())
    manifest["settings"]["prompts"] = "p.txt"
    Path("b/bench.json").write_text(json.dumps(manifest))
    assert bench(weights, "b", "--prompts", "p.txt") == 0


def test_bench_primary_seed_is_the_first_seed_listed(weights, tmp_path):
    """``--seeds 3,1``: the unlabelled rows are seed 3 (the primary seed was the smallest, 1, while
    the noise floor's default seed counts from the first listed)."""
    assert bench(weights, tmp_path / "b", "--limit", "1", "--seeds", "3,1") == 0
    rows = {line.split(",")[0] for line in (tmp_path / "b" / "report.csv").read_text().splitlines()[1:]}
    assert rows == {"ar", "ar@seed1"}


def test_bench_builtin_offset_past_the_last_class_is_refused(weights, tmp_path, capsys):
    """Past the last class the spread order starts again: ``--offset`` plus ``--limit`` beyond the
    model's classes gave the same classes twice (3 classes in the tiny model)."""
    assert bench(weights, tmp_path / "b", "--offset", "2", "--limit", "2") == 2
    err = capsys.readouterr().err
    assert "--offset 2 with --limit 2: allowed offset + limit <= 3" in err
    assert bench(weights, tmp_path / "c", "--offset", "3") == 2
    assert "--offset 3: allowed offset + limit <= 3" in capsys.readouterr().err


def test_bench_table_mean_accepted_length_is_the_mean_of_its_records(weights, tmp_path):
    """One name, one definition: the table's mean accepted length is the mean over images of each
    record's (tokens per forward after the prefill), as compare's table; it was pooled over the
    row's steps with the prefill, below the row's step compression."""
    assert cli.main(["bench", "--weights", str(weights), "--out", str(tmp_path / "b"), "--methods", "csd", "--window", "8",
                     "--floor-seed", "none", "--limit", "3"]) == 0
    records = [json.loads(line) for line in (tmp_path / "b" / "records.jsonl").read_text().splitlines()]
    csd = [r["mean_accepted_length"] for r in records if r["method"] == "csd"]
    lines = (tmp_path / "b" / "report.csv").read_text().splitlines()
    header = lines[0].split(",")
    row = next(line.split(",") for line in lines[1:] if line.startswith("csd,"))
    assert float(row[header.index("mean_accepted_length")]) == pytest.approx(sum(csd) / len(csd), abs=1e-4)


def test_safetensors_files_get_the_mode_other_files_get(tmp_path):
    """safetensors' save_file created ``-rw-------`` files: a scoring job run as another user could
    not read a run's tensors while its PNGs and JSON were ``-rw-r--r--``."""
    from csdgen.atomic import save_safetensors, write_text_atomic

    save_safetensors({"tokens": torch.zeros(2, 3, dtype=torch.long)}, tmp_path / "t.safetensors")
    write_text_atomic(tmp_path / "r.json", "{}")
    mode = stat.S_IMODE(os.stat(tmp_path / "t.safetensors").st_mode)
    assert mode == stat.S_IMODE(os.stat(tmp_path / "r.json").st_mode)
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(tmp_path / "t.safetensors"))["tokens"], torch.zeros(2, 3, dtype=torch.long))


@pytest.mark.parametrize("kwargs, message", [
    ({"batch_size": 0}, "batch_size=0: allowed an integer >= 1"),
    ({"batch_size": -3}, "batch_size=-3: allowed an integer >= 1"),
    ({"batch_size": 2.5}, "batch_size=2.5: allowed an integer >= 1"),
    ({"conditions": []}, "conditions=[]: allowed one condition or more"),
    ({"out": ""}, "out='': an empty output folder name"),
])
def test_save_run_refuses_bad_batch_sizes_empty_conditions_and_an_empty_out(weights, tmp_path, monkeypatch, kwargs,
                                                                             message):
    """``batch_size=0`` raised "range() arg 3 must not be zero", -3 wrote an empty run, ``[]`` too,
    and ``out=""`` wrote into the current folder."""
    import csdgen
    from csdgen.models.builtin import load_builtin_model

    monkeypatch.chdir(tmp_path)
    model = load_builtin_model(weights)
    args = {"conditions": [0], "out": str(tmp_path / "run"), **kwargs}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        csdgen.save_run(model, args.pop("conditions"), args.pop("out"), **args, window=4)
    assert not list(tmp_path.glob("*.png"))


def test_long_setting_differences_show_the_differing_field():
    """compare's refusals printed two whole reprs (200 characters each) for one changed field."""
    from csdgen.runs import settings_difference

    there = "SamplingConfig(guidance_scale=3.0, temperature=1.0, top_k=None, top_p=None, guidance_schedule=None)"
    here = there.replace("temperature=1.0", "temperature=0.9")
    assert settings_difference({"sampling": there}, {"sampling": here}) == [
        'sampling: "...temperature=1.0..." there, "...temperature=0.9..." here']
    method = "{'draft_init': None, 'refresh': 'independent', 'method': CSD(lam=0.5, delta=0.65, entropy_unit='nats')}"
    line = settings_difference({"preset": method}, {"preset": method.replace("lam=0.5", "lam=0.4")})[0]
    assert '"...lam=0.5..." there, "...lam=0.4..." here' in line
    assert settings_difference({"a": "x"}, {"a": "y"}) == ['a: "x" there, "y" here']  # short values whole


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


def test_bench_help_says_window_auto_is_refused(capsys):
    """bench's --help offered "or auto", which bench refuses (compare and generate take it)."""
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "auto is refused" in text and "or auto" not in text
    with pytest.raises(SystemExit):
        cli.main(["compare", "--help"])
    assert "or auto" in " ".join(capsys.readouterr().out.split())


def test_compare_noise_floor_row_is_ar_at_the_next_seed(weights, tmp_path):
    """README: the row ``ar-seed2`` is AR at ``--seed`` + 1, whatever ``--seed`` is."""
    out = tmp_path / "cmp"
    assert cli.main(["compare", "--weights", str(weights), "-n", "2", "--methods", "sjd", "--seed", "5", "--out", str(out)]) == 0
    assert json.loads((out / "run_ar.json").read_text())["key"]["seed"] == 5
    assert json.loads((out / "run_ar-seed2.json").read_text())["key"]["seed"] == 6
