"""``csdgen.save_run``: a run folder as ``csdgen generate`` writes it; bad arguments refused before
the folder is made."""

from __future__ import annotations

import json

import pytest
import torch

import csdgen

from builtin_fixture import builtin, weights  # noqa: F401 (fixtures)
from cli_helpers import run


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


@pytest.mark.parametrize("kwargs, match", [({"maps": "no"}, r"^maps='no': allowed True .* or False$"),
                                           ({"maps": 0}, r"^maps=0: "),
                                           ({"scale": 17}, r"^scale=17: allowed an integer in 1\.\.16")])
def test_save_run_refuses_maps_not_a_bool_and_scale_above_16_before_making_the_folder(builtin, tmp_path, kwargs, match):
    import csdgen

    with pytest.raises(ValueError, match=match):
        csdgen.save_run(builtin, [0], tmp_path / "never", window=4, **kwargs)
    assert not (tmp_path / "never").exists()


def test_save_run_draws_random_classes_as_generate_class_random_does(builtin, weights, tmp_path):
    import csdgen

    csdgen.save_run(builtin, ["random", "RANDOM"], tmp_path / "api", window=4, seed=3, maps=False)
    assert run("generate", "--weights", weights, "--class", "random", "-n", 2, "--seed", 3, "--window", 4,
               "--no-maps", "--out", tmp_path / "cli") == 0
    api, cli = (json.loads((tmp_path / d / "record.json").read_text())["images"] for d in ("api", "cli"))
    assert [api[k]["class"] for k in "01"] == [cli[k]["class"] for k in "01"]
    assert sorted(p.name for p in (tmp_path / "api").glob("*.png")) == sorted(p.name for p in (tmp_path / "cli").glob("*.png"))


def test_save_run_shows_an_over_long_folder_by_its_start_and_end_as_the_cli_does(builtin, tmp_path):
    """save_run cut an output folder it could not make after its first 80 characters, hiding the end
    (where the mistyped part usually is); the CLI showed start and end. Both use shown_path now."""
    from csdgen.class_names import SHOWN_CHARS, shown_path

    out = tmp_path / ("x" * 300) / "the-end"  # a name over 255 bytes: it cannot be made
    with pytest.raises(ValueError, match="cannot be made") as exc:
        csdgen.save_run(builtin, [0], out, window=4)
    assert repr(shown_path(out)) in str(exc.value) and "the-end" in str(exc.value)
    assert len(shown_path(out)) == SHOWN_CHARS and shown_path("short") == "short"
    # the limit is per name: the path's 311 characters where the 300-byte name was the fault
    assert "File name too long: its longest name has 300 bytes" in str(exc.value)


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


def test_save_run_records_numpy_sampling_values_as_json_numbers(builtin, tmp_path):
    """sampling={"temperature": np.float32(0.5)} wrote the first batch's PNGs and then failed on
    record.json (np.float32 is not JSON), leaving a folder with images and no record."""
    import numpy as np

    out = tmp_path / "np"
    csdgen.save_run(builtin, ["red apple"], out, window=16, sampling={"temperature": np.float32(0.5)})
    record = json.loads((out / "record.json").read_text())
    assert record["settings"]["sampling"]["temperature"] == 0.5
    again = csdgen.save_run(builtin, ["red apple"], out, window=16, sampling={"temperature": 0.5})
    assert again.resumed == 1


def test_save_run_takes_numpy_integers_for_batch_size_and_scale(builtin, tmp_path):
    """batch_size=np.int64(1) and scale=np.int64(1) were refused as 'allowed an integer'."""
    import numpy as np

    summary = csdgen.save_run(builtin, ["red apple", "dog face"], tmp_path / "np", window=16, batch_size=np.int64(1),
                              scale=np.int64(1))
    assert summary.images == 2 and len(summary.record["batches"]) == 2
    tokens = torch.zeros(1, builtin.num_image_tokens, dtype=torch.int64)
    assert csdgen.pil_images(builtin, tokens, scale=np.int64(3))[0].size == (192, 192)


class _HalfRelaxed(csdgen.AcceptanceRule):
    """A rule of the caller's own: SJD's ratio raised halfway to 1."""

    name = "half"

    def acceptance_probability(self, draft_tokens, draft_probs, target_probs, target_sample):
        from csdgen.acceptance import lossless_acceptance

        return 0.5 + 0.5 * lossless_acceptance(draft_tokens, draft_probs, target_probs)


def test_save_run_takes_a_rule_of_the_callers_own_as_generate_does(builtin, tmp_path):
    """save_run(..., method=MyRule()) was refused as "unknown method 'half'" though generate runs it:
    the record's rule text looked the rule's name up among the method names."""
    out = tmp_path / "own"
    summary = csdgen.save_run(builtin, ["red apple"], out, window=16, method=_HalfRelaxed())
    settings = json.loads((out / "record.json").read_text())["settings"]
    assert summary.images == 1 and settings["method"] == "half" and settings["rule"] == "_HalfRelaxed()"
    assert csdgen.save_run(builtin, ["red apple"], out, window=16, method=_HalfRelaxed()).resumed == 1


def test_a_folder_without_a_record_keeps_files_a_run_would_overwrite(builtin, tmp_path):
    """A file named as the run's image, in a folder with no record.json, is not csdgen's: refused, kept."""
    csdgen.save_run(builtin, ["red apple"], tmp_path / "names", window=16, maps=False)
    (name,) = [p.name for p in (tmp_path / "names").glob("*.png")]
    out = tmp_path / "mine"
    out.mkdir()
    (out / name).write_bytes(b"a photo of the user's own")
    (out / "notes.txt").write_text("unrelated files are fine")
    with pytest.raises(ValueError, match=rf"holds '{name}' but no record.json.*use another --out"):
        csdgen.save_run(builtin, ["red apple"], out, window=16)
    assert (out / name).read_bytes() == b"a photo of the user's own"
    assert sorted(p.name for p in out.iterdir()) == sorted([name, "notes.txt"])
    summary = csdgen.save_run(builtin, ["dog face"], out, window=16)  # other names: no clash
    assert summary.images == 1 and (out / name).read_bytes() == b"a photo of the user's own"


def test_a_run_killed_while_writing_its_first_images_resumes(builtin, tmp_path, monkeypatch):
    """The record is written before the first image, so files of a first batch cut short are the run's own."""
    import csdgen.evaluation.maps as maps

    out, real, calls = tmp_path / "cut", maps.save_png, []

    def save_then_die(image, path):
        assert (out / "record.json").is_file()
        real(image, path)
        calls.append(path)
        if len(calls) == 2:  # the first image and its map written, the record not yet updated
            raise KeyboardInterrupt

    monkeypatch.setattr(maps, "save_png", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        csdgen.save_run(builtin, ["red apple", "dog face"], out, window=16)
    monkeypatch.setattr(maps, "save_png", real)
    assert json.loads((out / "record.json").read_text())["images"] == {}
    summary = csdgen.save_run(builtin, ["red apple", "dog face"], out, window=16)
    assert summary.images == 2 and summary.resumed == 0


def test_save_run_refuses_a_model_without_an_image_decoder_before_decoding(tmp_path):
    """A FunctionModel decoded every image and then failed at the first PNG, leaving a folder behind."""
    from csdgen.models import FunctionModel

    calls = []
    model = FunctionModel(lambda prefix: calls.append(1) or torch.zeros(prefix.shape[0], 4), 16, 4, grid=(4, 4))
    with pytest.raises(ValueError, match=r"^FunctionModel has no image decoder \(it makes tokens only\); save_run "
                                         r"writes PNG images: use csdgen.generate for the tokens"):
        csdgen.save_run(model, [None, None], tmp_path / "never", maps=False)
    assert not calls and not (tmp_path / "never").exists()
    with pytest.raises(TypeError, match=r"^fn=None: allowed a function"):
        FunctionModel(None, 16, 4)
