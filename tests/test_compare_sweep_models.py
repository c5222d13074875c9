"""csdgen compare and csdgen sweep with --model/--prompts: they run through csdgen bench's runner
(records, resume, report) on the tiny random Janus checkpoint of tests/test_models_janus.py, and
give the same one-line errors as bench on the built-in model (tiny weights of tests/builtin_fixture.py).
"""

import csv
import io
import json
from pathlib import Path

import pytest

from builtin_fixture import make_tiny_weights
from csdgen import cli
from test_models_janus import build_checkpoint


@pytest.fixture(scope="module")
def janus(tmp_path_factory):
    checkpoint = build_checkpoint(tmp_path_factory.mktemp("janus"))
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    prompts.write_text("a red dog\nthe cat running in the rain\na cat\n")
    return checkpoint, prompts


def _csv(path):
    return list(csv.DictReader(io.StringIO(Path(path).read_text())))


def test_compare_with_a_checkpoint_runs_as_bench_and_writes_its_table(janus, tmp_path, capsys):
    checkpoint, prompts = janus
    out = tmp_path / "compare"
    argv = ["compare", "--model", str(checkpoint), "--prompts", str(prompts), "--limit", "2", "--methods", "csd",
            "--window", "5", "--device", "cpu", "--out", str(out)]
    assert cli.main(argv) == 0
    rows = _csv(out / "compare.csv")
    assert [r["method"] for r in rows] == ["ar", "csd", "ar@seed1"] and all(r["images"] == "2" for r in rows)
    assert all(float(r["nll"]) > 0 and float(r["step_compression"]) >= 1 for r in rows)
    printed = capsys.readouterr().out
    assert "step compression" in printed and (out / "compare.md").read_text().strip() in printed
    records = (out / "records" / "rank0.jsonl").read_text().splitlines()
    assert len(records) == 6 and all(json.loads(r)["settings"]["window"] == 5 for r in records if '"csd"' in r)
    assert cli.main(argv) == 0  # resumes: nothing generated again
    assert (out / "records" / "rank0.jsonl").read_text().splitlines() == records


def test_sweep_with_a_checkpoint_runs_each_setting_as_a_bench_method(janus, tmp_path):
    checkpoint, prompts = janus
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "--model", str(checkpoint), "--prompts", str(prompts), "--limit", "1", "--csd-lam", "0.1,1",
                     "--addition-c", "", "--gsd-radius", "", "--lantern-delta", "", "--baselines", "", "--windows", "6",
                     "--device", "cpu", "--out", str(out)]) == 0
    rows = _csv(out / "sweep.csv")
    assert [(r["method"], r["value"], r["window"]) for r in rows] == [("csd", "0.1", "6"), ("csd", "1.0", "6")]
    assert all(float(r["nll"]) > 0 for r in rows) and (out / "frontier.png").stat().st_size > 0
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert sorted(r["method"] for r in records) == ["csd_lam0.1_W6_uniform", "csd_lam1.0_W6_uniform"]
    assert all(r["settings"]["window"] == 6 for r in records)  # the setting's own window
    assert len(json.loads((out / "sweep.json").read_text())) == 2


@pytest.fixture(scope="module")
def builtin_weights(tmp_path_factory):
    return make_tiny_weights(tmp_path_factory.mktemp("builtin"))


@pytest.mark.parametrize("command", ["compare", "sweep"])
@pytest.mark.parametrize("extra, message", [
    (["--prompts", "coco"], "--prompts coco: the built-in model takes class names"),
    (["--prompts", "imagenet"], "unknown prompt set 'imagenet': use one of coco, parti or the path of a prompt file"),
    (["--prompts", "parti", "-n", "4"], "--class and -n/--num-images choose built-in images"),
])
def test_prompts_on_the_builtin_model_as_bench_one_line(builtin_weights, tmp_path, capsys, command, extra, message):
    assert cli.main([command, "--weights", str(builtin_weights), "--out", str(tmp_path / "o"), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_sweep_on_the_builtin_model_with_a_class_file_plots_its_offline_scores(builtin_weights, tmp_path):
    classes = tmp_path / "classes.txt"
    classes.write_text("Family: Man, Boy,Boy\napple\n")  # one class per line: commas inside a name, a short name
    out = tmp_path / "sweep"
    assert cli.main(["sweep", "--weights", str(builtin_weights), "--prompts", str(classes), "--baselines", "ar",
                     "--csd-lam", "0.5", "--addition-c", "", "--gsd-radius", "", "--lantern-delta", "", "--windows", "8",
                     "--out", str(out)]) == 0
    rows = _csv(out / "sweep.csv")
    assert [r["method"] for r in rows] == ["ar", "csd"] and all(r["images"] == "2" for r in rows)
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert {r["prompt"] for r in records} == {"family: man, boy, boy", "red apple"}
    for row in rows:
        assert 0 <= float(row["class_consistency"]) <= 1 and float(row["frechet_distance"]) >= 0 and float(row["nll"]) > 0
    assert (out / "frontier.png").is_file()


def test_compare_reads_a_chameleon_folder_in_the_layout_given(tmp_path, capsys):
    """A folder whose name does not say "anole" is guessed to be Lumina-mGPT; --layout anole reads it as Anole."""
    from test_models_chameleon import build_checkpoint

    checkpoint = build_checkpoint(str(tmp_path / "chameleon-7b"))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red dog\n")
    out = tmp_path / "compare"
    assert cli.main(["compare", "--model", checkpoint, "--layout", "anole", "--prompts", str(prompts), "--limit", "1",
                     "--methods", "sjd", "--window", "4", "--device", "cpu", "--out", str(out)]) == 0
    settings = json.loads((out / "bench.json").read_text())["settings"]
    assert settings["family"] == "anole" and settings["grid"] == [8, 8]
    assert cli.main(["compare", "--layout", "anole", "-n", "2", "--out", str(tmp_path / "builtin")]) == 2
    assert "--layout anole needs --model (a Chameleon checkpoint)" in capsys.readouterr().err


def test_a_sweeps_bench_json_records_the_windows_it_runs(janus, tmp_path):
    """bench.json of a sweep recorded bench's one window (the model's default) whatever --windows said; it
    records the sweep's windows, and a rerun with more windows (their settings named apart) or into a folder
    whose bench.json holds that one window (written before) resumes."""
    checkpoint, prompts = janus
    out = tmp_path / "sweep"
    argv = ["sweep", "--model", str(checkpoint), "--prompts", str(prompts), "--limit", "1", "--csd-lam", "1",
            "--addition-c", "", "--gsd-radius", "", "--lantern-delta", "", "--baselines", "", "--device", "cpu",
            "--out", str(out)]
    assert cli.main([*argv, "--windows", "6"]) == 0
    manifest = json.loads((out / "bench.json").read_text())
    assert manifest["settings"]["window"] == [6]
    # its other grids too, not bench's one lambda, delta and Addition constant
    assert (manifest["settings"]["lam"], manifest["settings"]["delta"], manifest["settings"]["addition_c"]) == ([1.0], [0.65], [])
    before = (out / "records" / "rank0.jsonl").read_text()
    manifest["settings"].update(window=16, lam=0.5, delta=0.65, addition_c=0.2)  # as sweeps wrote them before
    (out / "bench.json").write_text(json.dumps(manifest))
    assert cli.main([*argv, "--windows", "6,5"]) == 0
    records = [json.loads(line) for line in (out / "records" / "rank0.jsonl").read_text().splitlines()]
    assert (out / "records" / "rank0.jsonl").read_text().startswith(before)  # W6 kept, W5 added
    assert sorted(r["method"] for r in records) == ["csd_lam1.0_W5_uniform", "csd_lam1.0_W6_uniform"]
    assert json.loads((out / "bench.json").read_text())["settings"]["window"] == [6, 5]
    assert cli.main([*argv, "--windows", "4"]) == 0  # a rerun's windows are added to what the folder ran at
    assert json.loads((out / "bench.json").read_text())["settings"]["window"] == [6, 5, 4]
