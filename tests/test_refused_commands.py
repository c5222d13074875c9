"""A refused command leaves no trace: no new output folder, folders that existed before kept."""

from __future__ import annotations

import pytest

from builtin_fixture import builtin, weights  # noqa: F401 (fixtures)
from cli_helpers import cli_error, usage_error


@pytest.mark.parametrize("option", [["--top-k", "1000000"], ["--guidance-scale", "1e308"], ["--temperature", "1e-300"]])
def test_generate_refused_after_the_model_loads_leaves_no_output_folder(weights, tmp_path, capsys, option):
    out = tmp_path / "new" / "deeper" / "out"
    cli_error(capsys, "generate", "--weights", weights, "-n", 2, "--window", 8, *option, "--out", out)
    assert not (tmp_path / "new").exists()  # neither the folder nor the parents the command made


def test_generate_refused_as_a_usage_error_leaves_no_output_folder(weights, tmp_path, capsys):
    out = tmp_path / "new" / "deeper" / "out"
    usage_error(capsys, "generate", "--weights", weights, "-n", 2, "--engine", "eager", "--compile", "--out", out)
    assert not (tmp_path / "new").exists()


def test_a_refused_command_keeps_folders_that_existed_before(weights, tmp_path, capsys):
    empty, kept = tmp_path / "empty", tmp_path / "kept"
    empty.mkdir()
    kept.mkdir()
    (kept / "mine.txt").write_text("x")
    for out in (empty, kept, kept / "new"):
        cli_error(capsys, "generate", "--weights", weights, "-n", 1, "--top-k", "1000000", "--out", out)
    assert empty.is_dir() and (kept / "mine.txt").read_text() == "x" and not (kept / "new").exists()


@pytest.mark.parametrize("command", [["compare", "-n", 2], ["bench", "--limit", 2]])
def test_compare_and_bench_refused_for_top_k_above_the_codebook_leave_no_output_folder(weights, tmp_path, capsys,
                                                                                     command):
    err = cli_error(capsys, *command, "--weights", weights, "--top-k", "100000", "--out", tmp_path / "o")
    assert "--top-k 100000: exceeds" in err and "1..1024" in err, err
    assert not (tmp_path / "o").exists()


def test_save_run_refused_in_its_first_batch_leaves_no_folder(builtin, tmp_path):
    import csdgen

    with pytest.raises(ValueError, match="overflow"):
        csdgen.save_run(builtin, [0], tmp_path / "api" / "out", window=4,
                        sampling=csdgen.SamplingConfig(guidance_scale=1e308))
    assert not (tmp_path / "api").exists()


def test_undo_new_folders_removes_only_new_empty_folders(tmp_path):
    from csdgen.atomic import undo_new_folders

    with pytest.raises(RuntimeError):
        with undo_new_folders(tmp_path / "a" / "b" / "c"):
            (tmp_path / "a" / "b" / "c").mkdir(parents=True)
            (tmp_path / "a" / "side").mkdir()  # made by the block, but not empty-able: "a" holds it
            raise RuntimeError
    assert not (tmp_path / "a" / "b").exists() and (tmp_path / "a" / "side").is_dir()
    with undo_new_folders(tmp_path / "ok"):  # no error: nothing undone
        (tmp_path / "ok").mkdir()
    assert (tmp_path / "ok").is_dir()


def test_a_refused_second_run_does_not_remove_the_new_folder_the_first_run_holds(tmp_path):
    """Two commands started together into one new folder: the refused one must not remove the folder
    under the one running there (which has written nothing yet)."""
    from csdgen.atomic import undo_new_folders
    from csdgen.folder_lock import FolderBusy, folder_lock

    from contextlib import ExitStack

    out = tmp_path / "both"
    with ExitStack() as first:
        with pytest.raises(FolderBusy):
            with undo_new_folders(out):  # the second run starts while the folder is not there yet
                first.enter_context(folder_lock(out, "first run"))  # the first run makes it and holds it
                with folder_lock(out, "second run"):
                    pass
        assert out.is_dir()
    with pytest.raises(RuntimeError):  # once free, a new empty folder is removed
        with undo_new_folders(tmp_path / "alone"), folder_lock(tmp_path / "alone"):
            raise RuntimeError
    assert not (tmp_path / "alone").exists()
