"""csdgen bench: resume == uninterrupted, 2 processes under torchrun == 1 process, the table's
columns on a tiny Janus with a tiny CLIP and Inception, target NLL, one-line errors.

Models: the tiny random built-in weights of the CLI tests, and the tiny random Janus checkpoint
of tests/test_models_janus.py; CLIP and Inception weights from the fixtures of
tests/test_clip_score.py and tests/test_fid.py (imported, so they are built the same way).
"""

import csv
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from builtin_fixture import make_tiny_weights
from csdgen import bench, cli
from csdgen.evaluation.report import _COLUMNS
from test_clip_score import tiny_clip  # noqa: F401 - fixture
from test_fid import small_input, weights  # noqa: F401 - fixtures (random FID Inception weights, 75 px input)
from test_models_janus import build_checkpoint

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def builtin_weights(tmp_path_factory):
    return make_tiny_weights(tmp_path_factory.mktemp("builtin"))


def _bench(weights_dir, out, *extra):
    return cli.main(["bench", "--weights", str(weights_dir), "--out", str(out), "--limit", "3", "--methods", "csd",
                     "--window", "16", "--floor-seed", "none", *map(str, extra)])


def _records(out):
    """Merged records without the machine's fields, keyed by (method, seed, prompt id)."""
    records = {}
    for line in (Path(out) / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        for name in bench.TIMING_FIELDS:
            record.pop(name)
        records[(record["method"], record["seed"], record["prompt_id"])] = record
    return records


def _same_outputs(a, b):
    ra, rb = _records(a), _records(b)
    assert ra == rb
    for record in ra.values():
        for key in ("image", "tensors"):
            assert (Path(a) / record[key]).read_bytes() == (Path(b) / record[key]).read_bytes(), record[key]


@pytest.fixture(scope="module")
def reference(builtin_weights, tmp_path_factory):
    """One uninterrupted single-process run: ar and csd at seed 0, 3 prompts (the noise floor: the Janus test)."""
    out = tmp_path_factory.mktemp("reference") / "bench"
    assert _bench(builtin_weights, out) == 0
    return out


def test_records_files_and_report(reference):
    records = _records(reference)
    assert len(records) == 6 and {k[:2] for k in records} == {("ar", 0), ("csd", 0)}
    first = records[("csd", 0, "00000-dog-face")]
    assert first["prompt"] == "dog face" and first["prompt_index"] == 0
    # the built-in default: classes spread over the categories (ClassNames.spread: 0, 2, 1 of 3 classes)
    assert [records[("csd", 0, p)]["prompt"] for p in ("00001-red-apple", "00002-family-man-boy-boy")] == [
        "red apple", "family: man, boy, boy"]
    assert sum(first["accepted_length_histogram"]) == first["steps"] and first["num_tokens"] == 256
    assert sum(n * c for n, c in enumerate(first["accepted_length_histogram"])) == 256
    assert "seed" not in first["settings"] and first["settings"]["window"] == 16
    assert 0 < first["nll"] < 10 and 0 <= first["class_consistency"] <= 1
    raw = json.loads((reference / "records" / "rank0.jsonl").read_text().splitlines()[0])
    assert raw["latency_s"] > 0 and raw["peak_memory_bytes"] is None and raw["batch_size"] == 1
    tensors = bench.load_tensors(reference / first["tensors"])
    assert tensors["tokens"].shape == (256,) and tensors["decisions"].dtype == torch.int8
    rows = list(csv.DictReader(io.StringIO((reference / "report.csv").read_text())))
    assert [r["method"] for r in rows] == ["ar", "csd"] and list(rows[0]) == list(_COLUMNS)
    for row in rows:
        for column in ("latency_s_per_image", "acceleration", "step_compression", "nll", "class_consistency",
                       "frechet_distance"):
            assert row[column] != "", (row["method"], column)
    md = (reference / "report.md").read_text()
    assert "## Where the speed comes from" in md and "**csd**" in md
    # the header's sampling is words, not the SamplingConfig dict
    header = md.split("## Settings")[0]
    assert "guidance scale " in header and "top-p " in header and "'guidance_scale'" not in header
    assert (reference / "texture.csv").is_file() and (reference / "speed_quality_nll.png").is_file()


def test_interrupted_run_resumes_to_the_same_records(builtin_weights, reference, tmp_path, monkeypatch):
    out = tmp_path / "bench"
    calls = {"n": 0}
    append = bench.append_jsonl

    def append_then_stop(path, record):
        if calls["n"] == 3:  # a kill in the middle of a line: half a record, no newline
            with open(path, "a") as f:
                f.write(json.dumps(record)[:50])
            raise KeyboardInterrupt
        calls["n"] += 1
        append(path, record)

    monkeypatch.setattr(bench, "append_jsonl", append_then_stop)
    assert _bench(builtin_weights, out) == 130
    assert not (out / "records.jsonl").exists()
    monkeypatch.setattr(bench, "append_jsonl", append)
    written, calls = [], []
    monkeypatch.setattr(bench, "_save_tensors", lambda t, p, save=bench._save_tensors: (written.append(p), save(t, p)))
    monkeypatch.setattr(bench, "_generate", lambda *a, gen=bench._generate: (calls.append(a[1:]), gen(*a))[1])
    assert _bench(builtin_weights, out) == 0
    assert len(written) == 6 - 3  # only the missing images were generated (prompt by prompt: ar, csd, ar, csd, ...)
    # one untimed warm-up per (method, seed), then each missing image in the interleaved order
    assert calls == [("csd", 0, 1), ("ar", 0, 2)] + [("csd", 0, 1), ("ar", 0, 2), ("csd", 0, 2)]
    _same_outputs(reference, out)
    lines = (out / "records" / "rank0.jsonl").read_text().splitlines()
    assert len(lines) == 6 and all(json.loads(line) for line in lines)  # the torn line was cut off


def test_a_kept_image_or_tensors_file_cut_short_is_made_again_on_resume(builtin_weights, reference, tmp_path):
    """A finished folder whose kept PNG or safetensors file was cut short outside csdgen (a copy, a full disk) could
    not be finished: every rerun failed at the report ("image file is truncated", naming no file, or safetensors'
    traceback). The rerun makes those two images again, and the folder equals an uninterrupted run."""
    import shutil

    from csdgen.bench_records import file_complete

    out = tmp_path / "bench"
    shutil.copytree(reference, out)
    records = sorted(_records(out).values(), key=lambda r: r["image"])
    png, tensors = out / records[0]["image"], out / records[1]["tensors"]
    png.write_bytes(png.read_bytes()[:-40])
    tensors.write_bytes(tensors.read_bytes()[:-8])
    assert not file_complete(png) and not file_complete(tensors)
    assert _bench(builtin_weights, out) == 0
    _same_outputs(reference, out)


def test_a_damaged_kept_file_that_looks_whole_is_named_at_the_report(tmp_path):
    """A file whose ends are whole but whose contents are not is named in one line with what makes it again."""
    from csdgen.bench_scores import _read_png

    png = tmp_path / "x.png"
    png.write_bytes(bytes.fromhex("89504e470d0a1a0a") + b"garbage" + bytes.fromhex("0000000049454e44ae426082"))
    with pytest.raises(ValueError, match=r"x\.png' cannot be read \(.*\); delete it and rerun the same command"):
        _read_png(png)
    tensors = tmp_path / "x.safetensors"
    tensors.write_bytes(b"\x10" + b"\x00" * 7 + b"not json at all!")
    with pytest.raises(ValueError, match=r"x\.safetensors' cannot be read \(.*\); delete it and rerun"):
        bench.load_tensors(tensors)


def test_two_processes_under_torchrun_equal_one_process(builtin_weights, reference, tmp_path):
    out = tmp_path / "bench"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(port), "-m", "csdgen", "bench", "--weights", str(builtin_weights), "--out", str(out),
               "--limit", "3", "--methods", "csd", "--window", "16", "--floor-seed", "none"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = {p.name: len(p.read_text().splitlines()) for p in (out / "records").glob("*.jsonl")}
    assert ranks == {"rank0.jsonl": 4, "rank1.jsonl": 2}  # prompts 0, 2 on rank 0; prompt 1 on rank 1
    _same_outputs(reference, out)
    assert "| csd | 0 | 3 |" in done.stdout
    made = "images: 6, made by 2 processes (ranks 0, 1) on cpu, 1 torch thread each"
    report = (out / "report.md").read_text()
    assert made in report and ", 2 processes; batch size 1" in report
    # one process rerunning the finished bench writes the report again: its own line, the images' provenance kept
    # (run in this process, which is one process outside torchrun, as a second interpreter would be: no start-up)
    assert cli.main(command[command.index("-m", 4) + 2:]) == 0
    report = (out / "report.md").read_text()
    assert made in report and ", 1 process; batch size 1" in report


def test_session_nll_equals_the_teacher_forced_nll(cached_model):
    tokens = torch.randint(0, cached_model.codebook_size, (2, cached_model.num_image_tokens), generator=torch.Generator().manual_seed(0))
    expected = cached_model.token_nll(tokens, [1, 3])
    for chunk in (5, 256):
        torch.testing.assert_close(bench.session_nll(cached_model, [1, 3], tokens, chunk=chunk), expected, rtol=1e-4, atol=1e-5)


def test_janus_table_has_every_column_with_clip_fid_and_nll(tmp_path_factory, tiny_clip, weights, capsys):  # noqa: F811
    from test_fid import _write_images

    checkpoint = build_checkpoint(tmp_path_factory.mktemp("janus"))
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    prompts.write_text("a red dog\n\nthe cat running in the rain\na cat\n")
    reference_images = _write_images(tmp_path_factory.mktemp("real") / "val", seed=3, count=4)
    out = tmp_path_factory.mktemp("janus_bench") / "bench"
    assert cli.main(["bench", "--model", str(checkpoint), "--prompts", str(prompts), "--methods", "sjd,csd", "--window", "5",
                     "--clip-model", str(tiny_clip), "--inception-weights", str(weights), "--fid-reference",
                     str(reference_images), "--out", str(out), "--device", "cpu"]) == 0
    rows = list(csv.DictReader(io.StringIO((out / "report.csv").read_text())))
    assert [r["method"] for r in rows] == ["ar", "sjd", "csd", "ar@seed1"] and list(rows[0]) == list(_COLUMNS)
    for row in rows:
        assert row["images"] == "3"
        for column in ("latency_s_per_image", "acceleration", "steps", "step_compression", "mean_accepted_length",
                       "clip", "fid", "nll"):
            assert row[column] != "", (row["method"], column)
        assert 0 <= float(row["clip"]) <= 100 and float(row["fid"]) >= 0 and float(row["nll"]) > 0
    md = capsys.readouterr().out
    for header in ("latency (s/image)", "acceleration (latency)", "step compression", "CLIP", "FID", "NLL (nats/token)"):
        assert header in md
    assert "Noise floor: ar, ar@seed1" in (out / "report.md").read_text()
    assert json.loads((out / "records.jsonl").read_text().splitlines()[0])["clip"] is not None
    assert (out / "scores" / "clip.json").is_file() and (out / "scores" / "fid_reference.safetensors").is_file()


def test_fid_note_counts_the_reference_images_not_every_file_of_the_folder(builtin_weights, weights, tmp_path):  # noqa: F811
    """The report said "FID ... against 7 files" for a folder of 4 images, a text file and a subfolder: it
    counted every entry, while FID reads the images only (new-user try-out)."""
    from test_fid import _write_images

    real = _write_images(tmp_path / "val", seed=3, count=4)
    (real / "captions.json").write_text("{}")
    (real / "annotations").mkdir()
    (real / "annotations" / "0.png").write_bytes((real / "000.png").read_bytes())  # not read: not directly in the folder
    out = tmp_path / "bench"
    # AR alone: one row's FID is enough for the note (2 images: FID needs 2 per row)
    assert _bench_ar(builtin_weights, out, "--limit", 2, "--inception-weights", weights, "--fid-reference", real) == 0
    report = (out / "report.md").read_text()
    assert f"FID: Inception-v3 pool features against 4 reference images in {real}" in report


@pytest.mark.parametrize("extra, message", [
    (["--clip-model", "MISSING/clip"], "--clip-model '"),
    (["--clip-model", "csdgen-tests/no-such-clip"], "--clip-model 'csdgen-tests/no-such-clip': no such folder, and as a Hugging Face id not in the local cache"),
    (["--inception-weights", "MISSING/w.pth", "--fid-reference", "REAL"], "FID Inception weights not found at"),
    (["--inception-weights", "WEIGHTS", "--fid-reference", "MISSING/val"], "reference image folder"),
    (["--inception-weights", "WEIGHTS", "--fid-reference", "EMPTY"], "no images"),
    # one reference image: torchmetrics' RuntimeError once every image was generated, and no report
    (["--inception-weights", "WEIGHTS", "--fid-reference", "REAL"], "holds 1 image; FID needs at least 2"),
    (["--fid-reference", "REAL"], "--fid-reference needs --inception-weights FILE"),
])
def test_missing_score_files_are_refused_before_the_model_loads(tmp_path, capsys, monkeypatch, extra, message):
    """A missing --clip-model folder, Inception weights file or reference folder was reported only once the
    model had loaded (minutes for a 7B checkpoint with --model; new-user try-out): now before."""
    import csdgen.cli.bench as bench_cli

    monkeypatch.setattr(bench_cli, "_builtin_plan", lambda *a, **k: pytest.fail("the model was loaded"))
    monkeypatch.setattr(bench_cli, "_model_plan", lambda *a, **k: pytest.fail("the model was loaded"))
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "0.png").write_bytes(b"")
    (tmp_path / "empty").mkdir()
    (tmp_path / "w.pth").write_bytes(b"")
    names = {"MISSING/clip": tmp_path / "no" / "clip", "MISSING/w.pth": tmp_path / "no" / "w.pth", "REAL": tmp_path / "real",
             "MISSING/val": tmp_path / "no" / "val", "EMPTY": tmp_path / "empty", "WEIGHTS": tmp_path / "w.pth"}
    argv = ["bench", "--limit", "2", "--out", str(tmp_path / "out"), *[str(names.get(e, e)) for e in extra]]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, message", [
    (["--prompts", "coco"], "--prompts coco: the built-in model takes class names"),
    (["--prompts", "imagenet"], "unknown prompt set 'imagenet': use one of coco, parti or the path of a prompt file"),
    (["--prompts", "EMPTY"], "holds no prompts"),
    (["--prompts", "BAD_CLASS"], "unknown class 'red appel'; did you mean 'red apple'?"),
    (["--prompts", "INDEX"], "class index 7: allowed 0..2"),
    (["--clip-model", "MISSING"], "CLIP weights not found in the folder"),
    (["--inception-weights", "MISSING", "--fid-reference", "MISSING"], "FID Inception weights not found at"),
    (["--inception-weights", "MISSING"], "--inception-weights needs --fid-reference DIR"),
    (["--height", "64"], "--height needs --model PATH"),
    (["--window", "auto"], "--window auto: a bench needs a fixed window"),
])
def test_bad_input_is_one_line(builtin_weights, tmp_path, capsys, extra, message):
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "classes.txt").write_text("dog face\nred appel\n")
    (tmp_path / "index.txt").write_text("2\n7\n")
    (tmp_path / "missing").mkdir()
    names = {"EMPTY": tmp_path / "empty.txt", "BAD_CLASS": tmp_path / "classes.txt", "INDEX": tmp_path / "index.txt",
             "MISSING": tmp_path / "missing"}
    extra = [str(names.get(e, e)) for e in extra]
    assert _bench(builtin_weights, tmp_path / "out", *extra) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err
    assert not list((tmp_path / "out").glob("images/*/*.png"))  # nothing was generated


def test_unknown_prompt_set_for_a_checkpoint_is_one_line(tmp_path, capsys):
    checkpoint = tmp_path / "no-checkpoint"
    assert cli.main(["bench", "--model", str(checkpoint), "--prompts", "imagenet", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown prompt set 'imagenet': use one of coco, parti or the path of a prompt file" in err and "\n" not in err


def test_options_given_at_their_default_resume_the_same_bench(builtin_weights, reference, tmp_path, capsys):
    """Found by a new-user try-out: --draft-init uniform, --top-p 1, --no-compile (on a CPU) and --engine static
    (what the default engine runs for the built-in model) were refused as other settings, though each is what
    the run used ("compared resolved", docs/cli.md)."""
    import shutil

    from csdgen.bench_records import file_complete

    out = tmp_path / "bench"
    shutil.copytree(reference, out)
    before = (out / "records.jsonl").read_text()
    assert _bench(builtin_weights, out, "--draft-init", "uniform", "--top-p", "1", "--no-compile", "--engine",
                  "static") == 0, \
        capsys.readouterr().err
    assert (out / "records.jsonl").read_text() == before  # every image resumed, none made again
    assert _bench(builtin_weights, out, "--draft-init", "onehot") == 2
    assert 'holds a bench with other settings (draft_init: "uniform" there, "onehot" here)' in capsys.readouterr().err


def test_other_settings_are_refused_naming_the_difference(builtin_weights, reference, capsys):
    assert _bench(builtin_weights, reference, "--lam", "0.9") == 2
    assert "holds a bench with other settings (lam: 0.5 there, 0.9 here)" in capsys.readouterr().err


def test_bench_commands_in_readme_and_docs_parse():
    import re
    import shlex

    parser = cli.build_parser()
    found = 0
    for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        for line in re.findall(r"^(?:torchrun .*?-m )?(csdgen bench.*)$", doc.read_text(), re.M):
            args = parser.parse_args(shlex.split(line, comments=True)[1:])
            assert args.command == "bench"
            found += 1
    assert found >= 3


def test_bench_image_is_csdgen_generate_image_at_the_same_seed_and_window(builtin_weights, reference, tmp_path):
    import numpy as np
    from PIL import Image

    out = tmp_path / "generate"
    assert cli.main(["generate", "--weights", str(builtin_weights), "-n", "2", "--batch-size", "2", "--method", "csd",
                     "--window", "16", "--no-maps", "--class", "dog face,red apple", "--out", str(out)]) == 0
    for i, name in enumerate(["dog-face", "red-apple"]):
        upscaled = np.asarray(Image.open(out / f"{i:04d}_{name}.png"))  # generate saves the built-in 64 px images x2
        own = np.asarray(Image.open(reference / "images" / "csd-seed0" / f"{i:05d}-{name}.png"))
        assert np.array_equal(upscaled[::2, ::2], own)


def _bench_ar(weights_dir, out, *extra):
    return cli.main(["bench", "--weights", str(weights_dir), "--out", str(out), "--methods", "ar", "--window", "8",
                     "--floor-seed", "none", *map(str, extra)])


def test_a_paper_preset_bench_resumes_with_its_settings_given_one_by_one(builtin_weights, tmp_path, capsys):
    """docs/cli.md: the record's "preset" is for information, and the same settings spelt out resume the run
    (the name was compared: 'preset: "paper" there, unset here')."""
    out = tmp_path / "b"
    assert _bench_ar(builtin_weights, out, "--limit", "1", "--preset", "paper", "--window", "16") == 0
    before = (out / "records.jsonl").read_text()
    assert json.loads((out / "bench.json").read_text())["settings"]["preset"] == "paper"
    capsys.readouterr()
    assert _bench_ar(builtin_weights, out, "--limit", "1", "--draft-init", "uniform", "--lam", "0.5", "--delta", "0.65",
                     "--window", "16") == 0, capsys.readouterr().err
    assert (out / "records.jsonl").read_text() == before  # resumed, nothing made again
    assert _bench_ar(builtin_weights, out, "--limit", "1", "--preset", "paper", "--window", "8") == 2
    assert "(window: 16 there, 8 here)" in capsys.readouterr().err  # the control: another setting is still refused


def test_bench_resume_with_another_engine_is_refused(builtin_weights, tmp_path, capsys):
    """The engine changes no token but every latency: a rerun with another --engine (or --compile)
    into the same folder was accepted and its rows averaged latencies of both engines."""
    assert _bench_ar(builtin_weights, tmp_path / "b", "--limit", "1", "--engine", "eager") == 0
    capsys.readouterr()
    assert _bench_ar(builtin_weights, tmp_path / "b", "--limit", "2") == 2
    err = capsys.readouterr().err
    assert 'engine: "eager" there, "auto" (the default) here' in err and "\n" not in err.strip()
    assert _bench_ar(builtin_weights, tmp_path / "b", "--limit", "2", "--engine", "eager") == 0  # the same engine resumes
    assert json.loads((tmp_path / "b" / "bench.json").read_text())["settings"]["engine"] == "eager"


def test_bench_resume_in_another_dtype_is_refused(builtin_weights, tmp_path, capsys):
    """The built-in model's bench left its dtype out of bench.json, so a bfloat16 rerun resumed a float32
    folder and its images joined the float32 rows; bfloat16 is recorded now (float32 left out, as
    generate does, so older folders resume)."""
    assert _bench_ar(builtin_weights, tmp_path / "b", "--limit", "1") == 0
    assert "dtype" not in json.loads((tmp_path / "b" / "bench.json").read_text())["settings"]
    capsys.readouterr()
    assert _bench_ar(builtin_weights, tmp_path / "b", "--limit", "2", "--dtype", "bfloat16") == 2
    assert 'other settings (dtype: "float32" (the default) there, "bfloat16" here)' in capsys.readouterr().err
    assert _bench_ar(builtin_weights, tmp_path / "c", "--limit", "1", "--dtype", "bfloat16") == 0
    assert json.loads((tmp_path / "c" / "bench.json").read_text())["settings"]["dtype"] == "bfloat16"
    assert _bench_ar(builtin_weights, tmp_path / "b", "--limit", "2", "--dtype", "float32") == 0  # the same dtype resumes


def test_bench_resumes_a_prompt_file_named_by_another_path(builtin_weights, tmp_path, monkeypatch, capsys):
    """bench.json names a prompt file by its content: ``p.txt``, ``./p.txt``, its absolute path and a
    copy of it resume one bench (the path as typed was compared, so each of those was refused)."""
    (tmp_path / "p.txt").write_text("0\n1\n")
    monkeypatch.chdir(tmp_path)
    assert _bench_ar(builtin_weights, "b", "--prompts", "p.txt", "--limit", "1") == 0
    for spelling in ("./p.txt", str(tmp_path / "p.txt")):
        assert _bench_ar(builtin_weights, "b", "--prompts", spelling, "--limit", "1") == 0, capsys.readouterr().err
    (tmp_path / "copy.txt").write_text("0\n1\n")
    assert _bench_ar(builtin_weights, "b", "--prompts", "copy.txt") == 0
    (tmp_path / "other.txt").write_text("2\n1\n")
    assert _bench_ar(builtin_weights, "b", "--prompts", "other.txt") == 2
    assert "prompts:" in capsys.readouterr().err


def test_bench_resumes_a_folder_that_named_its_prompt_file_by_path(builtin_weights, tmp_path, monkeypatch):
    """A bench.json written before (the prompt file named by its path) still resumes with that file."""
    (tmp_path / "p.txt").write_text("0\n1\n")
    monkeypatch.chdir(tmp_path)
    assert _bench_ar(builtin_weights, "b", "--prompts", "p.txt", "--limit", "1") == 0
    manifest = json.loads(Path("b/bench.json").read_text())
    manifest["settings"]["prompts"] = "p.txt"
    Path("b/bench.json").write_text(json.dumps(manifest))
    assert _bench_ar(builtin_weights, "b", "--prompts", "p.txt") == 0


def test_bench_primary_seed_is_the_first_seed_listed(builtin_weights, tmp_path):
    """``--seeds 3,1``: the unlabelled rows are seed 3 (the primary seed was the smallest, 1, while
    the noise floor's default seed counts from the first listed)."""
    assert _bench_ar(builtin_weights, tmp_path / "b", "--limit", "1", "--seeds", "3,1") == 0
    rows = {line.split(",")[0] for line in (tmp_path / "b" / "report.csv").read_text().splitlines()[1:]}
    assert rows == {"ar", "ar@seed1"}


def test_bench_builtin_offset_past_the_last_class_is_refused(builtin_weights, tmp_path, capsys):
    """Past the last class the spread order starts again: ``--offset`` plus ``--limit`` beyond the
    model's classes gave the same classes twice (3 classes in the tiny model)."""
    assert _bench_ar(builtin_weights, tmp_path / "b", "--offset", "2", "--limit", "2") == 2
    err = capsys.readouterr().err
    assert "--offset 2 with --limit 2: allowed offset + limit <= 3" in err
    assert _bench_ar(builtin_weights, tmp_path / "c", "--offset", "3") == 2
    assert "--offset 3: allowed offset + limit <= 3" in capsys.readouterr().err


def test_bench_table_mean_accepted_length_is_the_mean_of_its_records(builtin_weights, tmp_path):
    """One name, one definition: the table's mean accepted length is the mean over images of each
    record's (tokens per forward after the prefill), as compare's table; it was pooled over the
    row's steps with the prefill, below the row's step compression."""
    assert cli.main(["bench", "--weights", str(builtin_weights), "--out", str(tmp_path / "b"), "--methods", "csd", "--window", "8",
                     "--floor-seed", "none", "--limit", "3"]) == 0
    records = [json.loads(line) for line in (tmp_path / "b" / "records.jsonl").read_text().splitlines()]
    csd = [r["mean_accepted_length"] for r in records if r["method"] == "csd"]
    lines = (tmp_path / "b" / "report.csv").read_text().splitlines()
    header = lines[0].split(",")
    row = next(line.split(",") for line in lines[1:] if line.startswith("csd,"))
    assert float(row[header.index("mean_accepted_length")]) == pytest.approx(sum(csd) / len(csd), abs=1e-4)


def test_bench_help_says_window_auto_is_refused(capsys):
    """bench's --help offered "or auto", which bench refuses (compare and generate take it)."""
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "auto is refused" in text and "or auto" not in text
    with pytest.raises(SystemExit):
        cli.main(["compare", "--help"])
    assert "or auto" in " ".join(capsys.readouterr().out.split())


def test_methods_run_interleaved_prompt_by_prompt_with_the_speed_noise_floor_and_a_few_images_caveat(builtin_weights,
                                                                                                      tmp_path):
    """Each prompt runs AR, then every other method, then AR at the floor seed, before the next prompt
    (a drift of the machine's speed lands on every method alike); the report prints AR's latency at
    the floor seed over its latency at seed 0, and says the Frechet distance of 2 images means nothing."""
    out = tmp_path / "bench"
    assert cli.main(["bench", "--weights", str(builtin_weights), "--out", str(out), "--limit", "2", "--methods", "csd",
                     "--window", "16"]) == 0
    lines = [json.loads(line) for line in (out / "records" / "rank0.jsonl").read_text().splitlines()]
    prompts = sorted({r["prompt_id"] for r in lines}, key=lambda p: [r["prompt_id"] for r in lines].index(p))
    assert [(r["method"], r["seed"], r["prompt_id"]) for r in lines] == [
        (m, s, p) for p in prompts for m, s in (("ar", 0), ("csd", 0), ("ar", 1))]
    latency = {}
    for r in lines:
        latency.setdefault((r["method"], r["seed"]), []).append(r["latency_s"])
    ratio = (sum(latency[("ar", 1)]) / 2) / (sum(latency[("ar", 0)]) / 2)
    md = (out / "report.md").read_text()
    assert f"- Speed noise floor: latency ar@seed1 / ar = {ratio:.3f} " in md
    assert "Frechet distance (classifier features) rests on too few images to mean anything: 2 per row" in md


def test_a_limit_past_the_prompt_file_says_how_many_prompts_run(builtin_weights, tmp_path, capsys):
    """Found by a new-user try-out: --limit 5 on a file of 2 prompts ran 2 without a word."""
    prompts = tmp_path / "classes.txt"
    prompts.write_text("0\n1\n")  # the tiny weights' first two classes
    assert _bench_ar(builtin_weights, tmp_path / "b", "--prompts", prompts, "--limit", 5) == 0
    assert f"csdgen bench: note: --limit 5: {prompts} holds 2 prompt(s); running those" in capsys.readouterr().err
    assert len((tmp_path / "b" / "records.jsonl").read_text().splitlines()) == 2


def test_bench_generate_and_compare_folders_refuse_each_other(builtin_weights, tmp_path, capsys):
    """generate into a finished bench's folder wrote a run beside the bench (record.json and its images)."""
    bench_out, run_out = tmp_path / "b", tmp_path / "g"
    assert _bench_ar(builtin_weights, bench_out, "--limit", "1") == 0
    before = sorted(p.name for p in bench_out.iterdir())
    capsys.readouterr()
    assert cli.main(["generate", "--weights", str(builtin_weights), "-n", "1", "--out", str(bench_out)]) == 2
    assert "holds a csdgen bench (bench.json)" in capsys.readouterr().err
    assert sorted(p.name for p in bench_out.iterdir()) == before
    assert cli.main(["generate", "--weights", str(builtin_weights), "-n", "1", "--out", str(run_out)]) == 0
    capsys.readouterr()
    assert _bench_ar(builtin_weights, run_out, "--limit", "1") == 2
    assert "holds a run of generate or save_run (record.json)" in capsys.readouterr().err
    assert not (run_out / "bench.json").exists() and not (run_out / "records").exists(), sorted(p.name for p in run_out.iterdir())
    # compare on the built-in classes keeps cached runs: neither a bench's folder nor a run's, and neither takes its
    # folder (a plain compare replaced a bench-mode compare's compare.md)
    cached = tmp_path / "c"
    compare = ["compare", "--weights", str(builtin_weights), "-n", "2", "--methods", "sjd", "--window", "4"]
    assert cli.main([*compare, "--out", str(cached)]) == 0
    for out, holds in ((bench_out, "holds a csdgen bench (bench.json)"), (run_out, "holds a run of generate or save_run")):
        capsys.readouterr()
        assert cli.main([*compare, "--out", str(out)]) == 2
        assert holds in capsys.readouterr().err
        assert not list(out.glob("run_*.json")) and not (out / "compare.md").exists()
    before = sorted(p.name for p in cached.iterdir())
    capsys.readouterr()
    assert cli.main(["generate", "--weights", str(builtin_weights), "-n", "1", "--out", str(cached)]) == 2
    assert "holds the cached runs of compare or sweep (run_*.json)" in capsys.readouterr().err
    assert _bench_ar(builtin_weights, cached, "--limit", "1") == 2
    assert "holds the cached runs of compare or sweep (run_*.json)" in capsys.readouterr().err
    assert sorted(p.name for p in cached.iterdir()) == before


def test_a_prompt_file_edited_between_runs_is_named_as_other_contents(builtin_weights, tmp_path, capsys):
    """The prompt file is recorded by content: an edit was refused with two bare sha256 strings."""
    prompts = tmp_path / "classes.txt"
    prompts.write_text("0\n")
    assert _bench_ar(builtin_weights, tmp_path / "b", "--prompts", prompts, "--limit", 1) == 0
    prompts.write_text("1\n")
    capsys.readouterr()
    assert _bench_ar(builtin_weights, tmp_path / "b", "--prompts", prompts, "--limit", 1) == 2
    err = capsys.readouterr().err
    assert "(prompts: a file of other contents (" in err and "here by sha256)" in err, err


def test_a_fresh_bench_folder_holding_a_report_is_refused_and_mixed_threads_get_a_caveat(builtin_weights, tmp_path,
                                                                                         capsys):
    """A user's report.md in a folder without bench.json was overwritten; a resume under another thread count
    mixed the timings without a word beyond the thread list."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("my own notes")
    assert _bench(builtin_weights, out) == 2
    assert "holds 'report.md' but no bench.json, so they are not a bench's" in capsys.readouterr().err
    assert (out / "report.md").read_text() == "my own notes" and not (out / "bench.json").exists()
    records = [{"torch_threads": 1, "rank": 0, "device": "cpu"}, {"torch_threads": 2, "rank": 0, "device": "cpu"}]
    assert bench.made_by(records) == "images: 2, made by 1 process (rank 0) on cpu, 1 or 2 torch threads each"
    assert bench.thread_caveat(records).startswith("caveat: the images were timed at 1 and 2 torch threads")
    assert bench.thread_caveat(records[:1]) is None


def test_a_folder_made_by_a_torchrun_and_a_single_process_says_so():
    """A folder begun by a torchrun of 2 processes and finished by a single process was reported as "made by 2
    processes (ranks 0, 1)": rank 0 of either run counted as one process. Each record keeps its command's size."""
    records = [{"rank": 0, "world": 2, "device": "cpu", "torch_threads": 1},
               {"rank": 1, "world": 2, "device": "cpu", "torch_threads": 1},
               {"rank": 0, "world": 1, "device": "cpu", "torch_threads": 1}]
    assert bench.made_by(records) == ("images: 3, made over several runs: 1 image by runs of 1 process (rank 0), 2 images by "
                                      "runs of 2 processes (ranks 0, 1); on cpu, 1 torch thread each")
    assert bench.made_by(records[:2]) == "images: 2, made by 2 processes (ranks 0, 1) on cpu, 1 torch thread each"
    older = {"rank": 0, "device": "cpu", "torch_threads": 1}  # a record from before the size was kept
    assert bench.made_by([older, records[2]]) == ("images: 2, made over several runs: 1 image by runs of 1 process (rank 0), 1 "
                                                  "image by runs of an unrecorded number of processes (rank 0); on cpu, "
                                                  "1 torch thread each")
    assert bench.made_by([older]) == "images: 1, made by 1 process (rank 0) on cpu, 1 torch thread each"
    assert "world" in bench.TIMING_FIELDS  # a machine figure: left out when records of two runs are compared


def test_records_copied_into_a_folder_without_bench_json_are_refused_not_resumed(builtin_weights, tmp_path, capsys):
    """A new user's try-out: a bench's records/ and images/ copied into a fresh folder were resumed by a bench of
    another window (no bench.json to compare), and its report gave the other window's figures as this one's."""
    import shutil

    first, copy = tmp_path / "first", tmp_path / "copy"
    assert _bench_ar(builtin_weights, first, "--limit", "1") == 0
    copy.mkdir()
    shutil.copytree(first / "records", copy / "records")
    for folder in first.iterdir():
        if folder.is_dir() and folder.name != "records" and folder.name != "scores":
            shutil.copytree(folder, copy / folder.name)
    capsys.readouterr()
    assert _bench_ar(builtin_weights, copy, "--limit", "1", "--temperature", "0.5") == 2
    err = capsys.readouterr().err
    assert "holds 'records/rank0.jsonl' but no bench.json, so they are not a bench's" in err, err
    assert not (copy / "bench.json").exists() and not (copy / "report.md").exists()
    # a rank file of this bench's other processes (torchrun) may be written before rank 0 reads the folder
    from csdgen.bench_records import check_settings

    fresh = tmp_path / "fresh"
    (fresh / "records").mkdir(parents=True)
    (fresh / "records" / "rank1.jsonl").write_text("{}\n")
    check_settings(fresh, {"window": 8}, write=True, world=2)
    assert (fresh / "bench.json").exists()


def test_a_rank_file_of_other_settings_copied_into_a_bench_is_refused(builtin_weights, tmp_path, capsys):
    """A try-out of the check above: a window-4 bench's rank file copied in as records/rank7.jsonl (no process of
    this bench writes it) was resumed by a window-8 bench, and its figures reported as window 8's."""
    import shutil

    other, out = tmp_path / "w4", tmp_path / "w8"
    common = ["bench", "--weights", str(builtin_weights), "--methods", "csd", "--floor-seed", "none", "--limit", "1"]
    assert cli.main([*common, "--window", "4", "--out", str(other)]) == 0
    assert cli.main([*common, "--window", "8", "--out", str(out)]) == 0
    shutil.copy(other / "records" / "rank0.jsonl", out / "records" / "rank7.jsonl")
    capsys.readouterr()
    assert cli.main([*common, "--window", "8", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds a record of csd for prompt " in err and "made with other settings (window: 4 there, 8 here)" in err, err
    (out / "records" / "rank7.jsonl").unlink()
    assert cli.main([*common, "--window", "8", "--out", str(out)]) == 0  # its own records resume


def test_an_option_of_methods_not_made_yet_does_not_refuse_the_resume(builtin_weights, tmp_path, capsys):
    """A bench of --methods ar recorded --lam (CSD's only), and a rerun adding csd at another lambda was refused as
    other settings, though no CSD image had been made at the recorded one. It resumes now and the folder records the
    new lambda; once CSD's images are made, another lambda is refused."""
    from csdgen.method_options import KNOWN_METHODS
    from csdgen.engine.methods import METHODS

    assert KNOWN_METHODS == METHODS
    out = tmp_path / "b"
    assert _bench_ar(builtin_weights, out, "--limit", "1", "--lam", "0.5") == 0
    made = (out / "records" / "rank0.jsonl").read_text()
    assert _bench_ar(builtin_weights, out, "--limit", "1", "--methods", "ar,csd", "--lam", "0.9") == 0, \
        capsys.readouterr().err
    assert (out / "records" / "rank0.jsonl").read_text().startswith(made)  # the AR image resumed
    assert json.loads((out / "bench.json").read_text())["settings"]["lam"] == 0.9
    capsys.readouterr()
    assert _bench_ar(builtin_weights, out, "--limit", "1", "--lam", "0.5") == 2
    assert "holds a bench with other settings (lam: 0.9 there, 0.5 here)" in capsys.readouterr().err


def test_an_option_of_speculative_methods_resumes_over_ar_images_and_a_refused_run_leaves_bench_json(
        builtin_weights, tmp_path, capsys):
    """--draft-init (every method but AR) changed over a folder of AR images only: the manifest let it pass, and the
    AR record's own settings then refused it, after bench.json had taken the new value. AR draws its images alike at
    any draft initialisation, so the run resumes; a run refused by its records leaves bench.json as it was."""
    out = tmp_path / "b"
    assert _bench_ar(builtin_weights, out, "--limit", "1") == 0
    made = (out / "records" / "rank0.jsonl").read_text()
    assert _bench_ar(builtin_weights, out, "--limit", "1", "--methods", "ar,sjd", "--draft-init", "onehot") == 0, \
        capsys.readouterr().err
    assert (out / "records" / "rank0.jsonl").read_text().startswith(made)  # the AR image resumed
    assert json.loads((out / "bench.json").read_text())["settings"]["draft_init"] == "onehot"
    # an SJD record of another draft initialisation copied in: refused by the records, bench.json untouched
    lines = (out / "records" / "rank0.jsonl").read_text().splitlines()
    sjd = [json.loads(line) for line in lines if json.loads(line).get("method") == "sjd"]
    assert sjd, lines
    sjd[0]["settings"]["draft_init"] = "uniform"
    (out / "records" / "rank0.jsonl").write_text("\n".join(line for line in lines if json.loads(line).get("method") != "sjd")
                                                + "\n" + json.dumps(sjd[0]) + "\n")
    manifest = (out / "bench.json").read_text()
    capsys.readouterr()
    assert _bench_ar(builtin_weights, out, "--limit", "1", "--methods", "ar,sjd", "--draft-init", "onehot",
                     "--lam", "0.3") == 2
    assert "made with other settings (draft_init" in capsys.readouterr().err
    assert (out / "bench.json").read_text() == manifest


def test_bench_compares_built_in_weights_by_content_not_by_path(builtin_weights, tmp_path, capsys):
    import shutil

    from safetensors.torch import load_file, save_file

    folder, copy, out = tmp_path / "w", tmp_path / "copy", tmp_path / "b"
    shutil.copytree(builtin_weights, folder)
    shutil.copytree(builtin_weights, copy)
    assert _bench_ar(folder, out, "--limit", "1") == 0
    assert _bench_ar(copy, out, "--limit", "1") == 0  # the same weights in another folder: resumed
    state = load_file(str(folder / "ar.safetensors"))
    name = next(iter(state))
    state[name] = state[name] + 1  # other weights in the same folder
    save_file(state, str(folder / "ar.safetensors"))
    capsys.readouterr()
    assert _bench_ar(folder, out, "--limit", "1") == 2
    err = capsys.readouterr().err
    assert "holds a bench with other settings (" in err and "weights_digest: " in err, err
