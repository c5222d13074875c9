"""Regression tests of the fourth newcomer trial's leftovers (issue 16, item 12): method names in
capitals, numpy integer windows, partial images without a stream, the Ctrl-C message."""

from __future__ import annotations

import numpy as np
import pytest

import csdgen
from builtin_fixture import builtin, weights  # noqa: F401 (fixtures)
from cli_helpers import run


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


def test_the_server_notes_partial_images_asked_for_without_a_stream():
    from csdgen.serve.schemas import unused_fields

    assert unused_fields({"prompt": "a", "partial_every": 4}, "csd") == [
        "partial_every 4 applies to streamed requests only (stream true); it is not used"]
    assert unused_fields({"prompt": "a", "partial_images": 2, "stream": False}, "csd") == [
        "partial_images 2 applies to streamed requests only (stream true); it is not used"]
    assert unused_fields({"prompt": "a", "partial_images": 2, "partial_every": 4, "stream": True}, "csd") == []


def test_ctrl_c_before_anything_is_written_does_not_say_something_was(monkeypatch, capsys, tmp_path):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("csdgen.cli.generate.builtin_job", interrupted)
    assert run("generate", "--out", tmp_path / "o") == 130
    err = capsys.readouterr().err
    assert "anything already written is kept" in err and "what was written" not in err
    assert not (tmp_path / "o").exists()


def test_ar_records_no_drafting_and_top_p_1_is_the_same_run_as_no_top_p(builtin, weights, tmp_path, capsys):
    """AR's record listed a draft_init and refresh it does not use; ``--top-p 1`` (every token kept,
    the same images) was refused as another run than no ``--top-p``."""
    import json

    from csdgen.runs import _comparable, run_settings

    ar = run_settings(builtin, method="ar")
    assert "draft_init" not in ar and "refresh" not in ar
    older = {**ar, "draft_init": "uniform", "refresh": "coupled"}  # as records of AR were written before
    assert _comparable(older) == _comparable(ar)
    out = tmp_path / "o"
    common = ("generate", "--weights", weights, "-n", "1", "--class", "0", "--out", out, "--method", "sjd",
              "--window", "8", "--no-maps")
    assert run(*common) == 0
    first = (out / json.loads((out / "record.json").read_text())["images"]["0"]["file"]).read_bytes()
    assert run(*common, "--top-p", "1", "-n", "2") == 0, capsys.readouterr().err  # resumes: one image more
    images = json.loads((out / "record.json").read_text())["images"]
    assert sorted(images) == ["0", "1"] and (out / images["0"]["file"]).read_bytes() == first
    assert run(*common, "--top-p", "0.9", "-n", "3") == 2
    assert "other settings" in capsys.readouterr().err


def test_save_run_shows_an_over_long_folder_by_its_start_and_end_as_the_cli_does(builtin, tmp_path):
    """save_run cut an output folder it could not make after its first 80 characters, hiding the end
    (where the mistyped part usually is); the CLI showed start and end. Both use shown_path now."""
    from csdgen.class_names import SHOWN_CHARS, shown_path

    out = tmp_path / ("x" * 300) / "the-end"  # a name over 255 bytes: it cannot be made
    with pytest.raises(ValueError, match="cannot be made") as exc:
        csdgen.save_run(builtin, [0], out, window=4)
    assert repr(shown_path(out)) in str(exc.value) and "the-end" in str(exc.value)
    assert len(shown_path(out)) == SHOWN_CHARS and shown_path("short") == "short"
    # the limit is per name: the fifth trial read the path's 311 characters where the 300-byte name was the fault
    assert "File name too long: its longest name has 300 bytes" in str(exc.value)


def test_the_cli_names_the_over_long_name_not_only_the_paths_length(tmp_path, capsys):
    out = tmp_path / ("x" * 300) / "y"
    assert run("generate", "-n", "1", "--out", out) == 2
    err = capsys.readouterr().err
    assert "File name too long: its longest name has 300 bytes, the path" in err and "choose another with --out" in err


def test_method_and_auto_in_any_case_in_the_cli_the_server_and_the_library(builtin, capsys):
    """The fifth trial: ``method="CSD"`` was taken by the library only (the CLI's ``--method CSD`` and
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
