"""Folder locks: one command writes into an output folder at a time; a killed holder releases it."""

from __future__ import annotations

import pytest

from cli_helpers import cli_error, run
from builtin_fixture import weights  # noqa: F401 (fixtures)


def test_two_generate_into_one_folder_the_second_is_refused(weights, tmp_path, capsys):
    from csdgen.folder_lock import folder_lock

    out = tmp_path / "out"
    with folder_lock(out, "csdgen generate"):  # the first run, still writing
        err = cli_error(capsys, "generate", "--weights", weights, "-n", 1, "--window", 4, "--out", out)
    assert "is in use by another csdgen run" in err and str(out) in err
    assert not (out / "record.json").exists()
    assert run("generate", "--weights", weights, "-n", 1, "--window", 4, "--no-maps", "--out", out) == 0  # once it is free


def test_two_bench_into_one_folder_the_second_is_refused(weights, tmp_path, capsys):
    from csdgen.folder_lock import folder_lock

    out = tmp_path / "bench"
    with folder_lock(out, "bench", file="records/rank0.jsonl"):
        err = cli_error(capsys, "bench", "--weights", weights, "--limit", 1, "--methods", "ar", "--floor-seed", "none",
                        "--window", 4, "--out", out)
    assert "is in use by another bench (its process of rank 0)" in err
    assert not list((out / "images").glob("*/*.png")) if (out / "images").exists() else True


def test_a_lock_is_released_when_its_process_is_killed(tmp_path):
    import subprocess
    import sys

    from csdgen.folder_lock import folder_lock

    code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); "
            "print('locked', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match="in use by another"):
            with folder_lock(tmp_path):
                pass
    finally:
        proc.kill()
        proc.wait()
    with folder_lock(tmp_path):  # kill -9 released it
        pass


def test_generate_and_bench_into_one_folder_refuse_each_other(weights, tmp_path, capsys):
    """bench locks its rank's record file (the processes of one torchrun share the folder) and holds a
    shared lock on the folder, which a whole-folder run (generate, compare, sweep) excludes either way."""
    from csdgen.folder_lock import folder_lock

    out = tmp_path / "out"
    with folder_lock(out, "bench", file="records/rank0.jsonl"):  # a bench, still writing
        err = cli_error(capsys, "generate", "--weights", weights, "-n", 1, "--window", 4, "--out", out)
        assert "is in use by another csdgen run writing into it now" in err and str(out) in err
        with folder_lock(out, "bench", file="records/rank1.jsonl"):  # its rank 1 shares the folder
            pass
    assert not (out / "record.json").exists()
    with folder_lock(out, "csdgen generate"):  # a generate, still writing
        err = cli_error(capsys, "bench", "--weights", weights, "--limit", 1, "--methods", "ar", "--floor-seed", "none",
                        "--window", 4, "--out", out)
        assert "is in use by another csdgen run writing the whole folder now" in err, err
        # a bench past that probe (the generate took its lock while the bench loaded its model) is refused by the
        # lock, and leaves nothing in the generate's folder (it made records/ there)
        from csdgen import bench
        from csdgen.folder_lock import FolderBusy

    fresh = tmp_path / "fresh"
    with folder_lock(fresh, "csdgen generate"):
        with pytest.raises(FolderBusy, match="writing the whole folder now"):
            bench.run_shard(None, fresh, rank=0, world=1)
    assert list(fresh.iterdir()) == []


@pytest.mark.parametrize("command", ["generate", "compare", "sweep"])
def test_a_busy_folder_is_refused_before_the_model_loads(weights, tmp_path, capsys, monkeypatch, command):
    """The lock was first taken when the run started writing, after the model had loaded: a second
    command into a busy folder loaded its model (seconds for the built-in model, the whole checkpoint
    with --model) before being refused. It is now refused before any weight is read."""
    import csdgen.models.builtin as builtin
    from csdgen.folder_lock import folder_lock

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded for a run into a busy folder")

    monkeypatch.setattr(builtin, "load_builtin_model", no_load)
    out = tmp_path / "out"
    with folder_lock(out, "csdgen generate"):  # the first run, still writing
        err = cli_error(capsys, command, "--weights", weights, "-n", 2, "--out", out)
    assert "is in use by another csdgen run" in err and str(out) in err


def test_the_busy_probe_refuses_what_the_lock_refuses_and_holds_nothing(tmp_path):
    from csdgen.folder_lock import FolderBusy, folder_lock, refuse_busy

    refuse_busy(tmp_path / "missing")  # not there yet: free
    with folder_lock(tmp_path, "bench", file="records/rank0.jsonl"):  # a bench, still writing
        with pytest.raises(FolderBusy, match="in use by another csdgen run writing into it now"):
            refuse_busy(tmp_path)  # a generate
        with pytest.raises(FolderBusy, match="in use by another bench running now"):
            refuse_busy(tmp_path, file="records/rank0.jsonl")  # a second bench
        refuse_busy(tmp_path, file="records/rank1.jsonl")  # its own rank 1 shares the folder
    refuse_busy(tmp_path)
    with folder_lock(tmp_path):  # the probes left nothing held
        pass


@pytest.mark.parametrize("holder", [{}, {"what": "bench", "file": "records/rank0.jsonl"}], ids=["generate", "bench"])
def test_a_bench_into_a_busy_folder_is_refused_before_the_model_loads(weights, tmp_path, capsys, monkeypatch, holder):
    """As generate, compare and sweep: a bench (also compare or sweep with --prompts) into a folder
    another run writes now loaded its model before its lock refused it."""
    import csdgen.models.builtin as builtin
    from csdgen.folder_lock import folder_lock

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded for a bench into a busy folder")

    monkeypatch.setattr(builtin, "load_builtin_model", no_load)
    out = tmp_path / "bench"
    (out / "records").mkdir(parents=True)
    with folder_lock(out, **holder):
        err = cli_error(capsys, "bench", "--weights", weights, "--limit", 1, "--methods", "ar", "--window", 4,
                        "--out", out)
    assert "is in use by another" in err and str(out) in err
