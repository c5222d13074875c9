"""Run records (record.json, records.jsonl): what a run records, how a resume reads them, and
one-line errors for hand-edited records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from builtin_fixture import builtin, weights  # noqa: F401 (fixtures)
from cli_helpers import run, cli_error


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def one_image(weights, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    assert run("generate", "--weights", weights, "-n", 2, "--window", 4, "--no-maps", "--out", out) == 0
    return out


def settings(folder) -> dict:
    return json.loads((folder / "record.json").read_text())["settings"]


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["images"]["0"].update(file=None), 'images["0"].file is null, expected a file name in the folder'),
    (lambda r: r["images"]["1"].update(steps="many"), 'images["1"].steps is "many", expected an integer'),
    (lambda r: r["images"].update({"x": {}}), 'the key of images["x"] is "x", expected an image index'),
    (lambda r: r["images"].update({"0": [1]}), 'images["0"] is [1], expected an object'),
    (lambda r: r["batches"].append("b"), 'batches[1] is "b", expected an object'),
    (lambda r: r["images"]["0"].update(file="../x.png"), 'images["0"].file is "../x.png", expected a file name'),
])
def test_hand_edited_records_give_one_line_naming_the_file_and_entry(weights, one_image, tmp_path, capsys, edit, message):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(one_image, out)
    record = json.loads((out / "record.json").read_text())
    edit(record)
    (out / "record.json").write_text(json.dumps(record))
    err = cli_error(capsys, "generate", "--weights", weights, "-n", 2, "--window", 4, "--no-maps", "--out", out)
    assert "record.json" in err and message in err


@pytest.mark.parametrize("line, message", [
    ('{"method": "ar", "seed": "x", "prompt_id": "a", "image": "i.png", "tensors": "t"}', "'seed' is \"x\", expected an integer"),
    ('{"method": "ar", "seed": 0, "prompt_id": "a", "image": null, "tensors": "t"}', "'image' is null, expected a string"),
    ('{"method": "ar", "seed": 0, "prompt_id": "a", "image": "/etc/passwd", "tensors": "t"}', "expected a path inside"),
    ("[1, 2]", "expected a JSON object"),
    ("{not json", "not JSON"),
])
def test_bad_bench_record_lines_name_the_file_and_line(tmp_path, line, message):
    from csdgen.bench import existing_records

    (tmp_path / "records").mkdir()
    path = tmp_path / "records" / "rank0.jsonl"
    path.write_text('{"method": "ar", "seed": 0, "prompt_id": "b", "image": "i.png", "tensors": "t"}\n' + line + "\n")
    with pytest.raises(ValueError) as info:
        existing_records(tmp_path)
    assert f"{path}:2:" in str(info.value) and message in str(info.value) and "\n" not in str(info.value)
    # the advice is about that line: moving the whole file away regenerated every image it records
    assert "fix or delete that line" in str(info.value) and "move the file away" not in str(info.value)
    path.write_bytes(b'{"method": "ar"}\n\xff\xfe\n')
    with pytest.raises(ValueError, match=r"rank0\.jsonl:2: not UTF-8"):
        existing_records(tmp_path)
    path.write_bytes(b'{"method": "ar", "seed": 0, "prompt_id": "b", "image": "i.png", "tensors": "t"}\n{"torn": "\xe2\x82')
    assert existing_records(tmp_path) == {}  # a torn last line (a kill mid-write) is ignored, even mid-character


def test_reproducibility_across_processes_records_the_thread_count(weights, tmp_path):
    out = tmp_path / "gen"
    assert run("generate", "--weights", weights, "-n", 1, "--window", 4, "--no-maps", "--out", out) == 0
    record = json.loads((out / "record.json").read_text())
    assert record["batches"][0]["torch_threads"] == torch.get_num_threads()
    bench_out = tmp_path / "bench"
    assert run("bench", "--weights", weights, "--limit", 1, "--methods", "ar", "--floor-seed", "none", "--window", 4,
               "--out", bench_out) == 0
    lines = (bench_out / "records.jsonl").read_text().splitlines()
    assert all(json.loads(line)["torch_threads"] == torch.get_num_threads() for line in lines)
    from csdgen.bench import TIMING_FIELDS

    assert "torch_threads" in TIMING_FIELDS  # a machine figure: left out when records of two runs are compared
    readme = " ".join(((ROOT / "README.md").read_text() + (ROOT / "docs" / "cli.md").read_text()).split())
    assert "same number of torch threads" in readme and "torch_threads" in readme


def test_generate_ar_records_window_1_not_the_given_window(weights, tmp_path, capsys):
    out = tmp_path / "ar"
    assert run("generate", "--weights", weights, "-n", 1, "--method", "ar", "--window", 16, "--no-maps",
               "--out", out) == 0
    assert "--window 16 does not apply (window 1)" in capsys.readouterr().err
    record = json.loads((out / "record.json").read_text())
    assert record["settings"]["window"] == 1
    assert record["images"]["0"]["steps"] == 256


def test_resume_regenerates_a_corrupt_png_and_says_so(weights, tmp_path, capsys):
    out = tmp_path / "r"
    argv = ["generate", "--weights", weights, "-n", 3, "--window", 8, "--no-maps", "--out", out]
    assert run(*argv) == 0
    capsys.readouterr()
    files = sorted(out.glob("000*.png"))
    good = files[1].read_bytes()
    files[1].write_bytes(b"garbage!")  # damaged outside csdgen
    Image.new("RGB", (5, 5)).save(files[2])  # readable, the wrong size
    assert run(*argv) == 0
    err = capsys.readouterr().err
    assert f"{str(files[1])!r} is not a readable PNG" in err and "generating it again" in err
    assert f"{str(files[2])!r} is 5x5 pixels, the other images 128x128" in err
    assert files[1].read_bytes() == good  # made again, the same image
    assert Image.open(files[2]).size == (128, 128)


def test_resume_without_no_maps_in_a_no_maps_folder_says_maps_are_missing(weights, tmp_path, capsys):
    out = tmp_path / "m"
    assert run("generate", "--weights", weights, "-n", 2, "--window", 8, "--no-maps", "--out", out) == 0
    capsys.readouterr()
    assert run("generate", "--weights", weights, "-n", 2, "--window", 8, "--out", out) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "2 kept images" in err and "no acceptance map" in err and "--no-maps" in err


def test_resume_after_a_map_was_deleted_says_which_kept_image_has_none(weights, tmp_path, capsys):
    out = tmp_path / "m"
    assert run("generate", "--weights", weights, "-n", 2, "--window", 8, "--out", out) == 0
    maps = sorted(out.glob("*_map.png"))
    assert len(maps) == 2
    maps[1].unlink()
    capsys.readouterr()
    assert run("generate", "--weights", weights, "-n", 2, "--window", 8, "--out", out) == 0
    err = capsys.readouterr().err
    shown = maps[1].name.replace("_map.png", ".png")
    assert f"1 kept image ({shown}) has no acceptance map (deleted, or the earlier run wrote none: --no-maps)" in err


def test_file_names_keep_whole_words_up_to_40_characters():
    from csdgen.runs import slug

    name = slug("A close-up photo of a red-haired girl, high-quality.")
    assert name == "a-close-up-photo-of-a-red-haired-girl" and len(name) <= 40
    assert slug("x" * 50) == "x" * 40 and slug("") == "image" and slug("red apple") == "red-apple"


def test_save_run_records_the_resolved_settings_csdgen_generate_records(builtin, weights, tmp_path):
    """save_run's record held only the keyword arguments given ({'model': 'BuiltinModel', 'seed': 0, 'method': 'sjd',
    'window': 16}): not the guidance, refresh or drafts that made the images, nor what the CLI records."""
    import csdgen

    csdgen.save_run(builtin, ["dog face"], tmp_path / "api", method="sjd", window=4, maps=False)
    assert run("generate", "--weights", weights, "--class", "dog face", "-n", 1, "--method", "sjd", "--window", 4,
               "--no-maps", "--out", tmp_path / "cli") == 0
    api = settings(tmp_path / "api")
    assert api == settings(tmp_path / "cli")
    assert (api["model"], api["weights"], api["rule"], api["draft_init"], api["refresh"]) == (
        "builtin", str(weights), "'sjd'", "uniform", "coupled")
    assert api["sampling"]["guidance_scale"] == builtin.defaults.guidance_scale == 3.0


def test_save_run_with_arguments_given_at_their_defaults_resumes_the_same_run(builtin, tmp_path):
    """save_run(..., method="csd") after the same call without it: "holds a run with other settings (method: unset
    there, "csd" here)"; the same for refresh="coupled"."""
    import csdgen

    out = tmp_path / "s1"
    csdgen.save_run(builtin, ["red apple"], out, window=4, maps=False)
    again = csdgen.save_run(builtin, ["red apple"], out, window=4, maps=False, method="csd", refresh="coupled",
                            draft_init="uniform", sampling={"guidance_scale": 3.0})
    assert (again.resumed, again.run_seconds) == (1, 0.0)
    with pytest.raises(ValueError, match=r"other settings \(refresh: \"coupled\" there, \"independent\" here\)"):
        csdgen.save_run(builtin, ["red apple"], out, window=4, maps=False, refresh="independent")


def test_csdgen_generate_resumes_a_save_run_folder_and_save_run_a_csdgen_generate_folder(builtin, weights, tmp_path,
                                                                                         capsys):
    """csdgen generate with the very settings of a save_run call was refused with a 12-item list of differences."""
    import csdgen

    cli = ["generate", "--weights", weights, "--class", "red apple,dog face", "-n", 2, "--method", "sjd", "--window", 4,
           "--no-maps", "--out"]
    csdgen.save_run(builtin, ["red apple", "dog face"], tmp_path / "api", method="sjd", window=4, maps=False)
    assert run(*cli, tmp_path / "api") == 0
    assert capsys.readouterr().out.startswith("2 images (2 kept from an earlier run)")
    assert run(*cli, tmp_path / "cli") == 0
    back = csdgen.save_run(builtin, ["red apple", "dog face"], tmp_path / "cli", method="sjd", window=4, maps=False)
    assert back.resumed == 2 and back.run_seconds == 0.0
    assert "seed: 0 there, 1 here" in cli_error(capsys, *cli, tmp_path / "api", "--seed", 1)  # what differs still does


def test_draft_init_given_at_its_default_resumes_and_so_does_an_older_record_without_it(weights, tmp_path, capsys):
    """--draft-init uniform (what CSD runs with when it is left out) was "other settings" (draft_init: null there);
    a record written before draft_init was recorded resolved (null) still resumes."""
    common = ["generate", "--weights", weights, "-n", 1, "--window", 4, "--no-maps", "--out", tmp_path / "o"]
    assert run(*common) == 0
    assert run(*common, "--draft-init", "uniform") == 0
    assert "1 kept from an earlier run" in capsys.readouterr().out
    record = json.loads((tmp_path / "o" / "record.json").read_text())
    record["settings"]["draft_init"] = None
    (tmp_path / "o" / "record.json").write_text(json.dumps(record))
    assert run(*common) == 0
    assert "1 kept from an earlier run" in capsys.readouterr().out
    assert "draft_init: \"uniform\" there, \"onehot\" here" in cli_error(capsys, *common, "--draft-init", "onehot")


def test_preset_paper_and_the_same_settings_spelt_out_are_the_same_run(builtin, weights, tmp_path, capsys):
    """Only the preset's name differed, and the resume was refused ("preset: "paper" there, unset here")."""
    import csdgen

    common = ["generate", "--weights", weights, "-n", 2, "--no-maps", "--out", tmp_path / "pp"]
    spelt = ["--window", 16, "--draft-init", "uniform", "--refresh", "independent", "--lam", 0.5, "--delta", 0.65]
    assert run(*common, "--preset", "paper") == 0
    capsys.readouterr()
    assert run(*common, *spelt) == 0
    assert capsys.readouterr().out.startswith("2 images (2 kept from an earlier run)")
    assert settings(tmp_path / "pp")["preset"] == "paper"  # kept, for information
    again = csdgen.save_run(builtin, [0, 1], tmp_path / "pp", preset="paper", maps=False)
    assert again.resumed == 2
    assert "other settings (rule: " in cli_error(capsys, *common, "--preset", "paper", "--lam", 0.4)  # a real change
    assert run(*common[:-1], tmp_path / "spelt", *spelt) == 0  # and the other way round
    assert run(*common[:-1], tmp_path / "spelt", "--preset", "paper") == 0
    assert "2 kept from an earlier run" in capsys.readouterr().out


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


def test_save_run_records_a_quantised_model_as_csdgen_generate_quantize_does(weights, tmp_path, capsys):
    """save_run recorded no quantize: a quantised model resumed (and extended) a float32 folder with its
    own images, and csdgen generate --quantize int8 refused a save_run folder of the same quantised run
    ('quantize: unset there, "int8" here')."""
    pytest.importorskip("torchao")
    import csdgen
    from csdgen.models.builtin import load_builtin_model

    plain, quantized = load_builtin_model(weights), load_builtin_model(weights, quantize="int8")
    csdgen.save_run(plain, ["red apple"], tmp_path / "float", window=4, maps=False)
    with pytest.raises(ValueError, match=r"other settings \(quantize: unset there, \"int8\" here\)"):
        csdgen.save_run(quantized, ["red apple"], tmp_path / "float", window=4, maps=False)
    csdgen.save_run(quantized, ["red apple"], tmp_path / "int8", window=4, maps=False)
    cli = ["generate", "--weights", weights, "--class", "red apple", "-n", 1, "--window", 4, "--no-maps",
           "--quantize", "int8", "--out", tmp_path / "int8"]
    assert run(*cli) == 0
    assert capsys.readouterr().out.startswith("1 image (1 kept from an earlier run)")


def test_save_run_records_a_checkpoint_by_its_folder_dtype_and_grid_and_refuses_another_checkpoints_folder(
        tmp_path, capsys):
    """save_run records a checkpoint model (load_model) by its class name, folder, dtype and grid, so
    a folder written with one checkpoint is refused to another checkpoint of the same family (it
    resumed it, mixing two targets' images); csdgen generate --model records more and refuses the
    folder too, as docs/library.md says."""
    import csdgen
    from csdgen.models.auto import load_model
    from test_models_janus import PROMPTS, build_checkpoint

    first, second = build_checkpoint(tmp_path / "janus-a"), build_checkpoint(tmp_path / "janus-b")
    csdgen.save_run(load_model(first), PROMPTS[:1], tmp_path / "out", window=4, maps=False)
    settings = json.loads((tmp_path / "out" / "record.json").read_text())["settings"]
    assert settings["model"] == "JanusImageModel" and settings["checkpoint"] == str(Path(first))
    assert settings["dtype"] == "float32" and len(settings["grid"]) == 2
    csdgen.save_run(load_model(first), PROMPTS[:1], tmp_path / "out", window=4, maps=False)  # the same: resumes
    with pytest.raises(ValueError, match="checkpoint"):
        csdgen.save_run(load_model(second), PROMPTS[:1], tmp_path / "out", window=4, maps=False)
    capsys.readouterr()
    assert run("generate", "--model", first, "--prompt", PROMPTS[0], "-n", 1, "--window", 4, "--no-maps",
               "--out", tmp_path / "out") == 2
    library = (Path(__file__).resolve().parents[1] / "docs" / "library.md").read_text()
    assert "its folder, dtype and grid" in library


def test_weights_are_compared_by_content_not_by_path(weights, tmp_path, capsys):
    """New weights written into the same folder resumed its images (mixing two models' images in one run);
    a copy of the same weights elsewhere was refused as another folder."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "w"
    shutil.copytree(weights, folder)
    out = tmp_path / "g"
    argv = ["generate", "-n", 2, "--class", "0,1", "--window", 4, "--no-maps", "--out", out]
    assert run(*argv, "--weights", folder) == 0
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    assert run(*argv, "--weights", copy, "-n", 3) == 0  # the same weights elsewhere: resumed
    assert "2 kept from an earlier run" in capsys.readouterr().out
    state = load_file(str(folder / "ar.safetensors"))
    name = next(iter(state))
    state[name] = state[name] + 1  # other weights in the same folder
    save_file(state, str(folder / "ar.safetensors"))
    err = cli_error(capsys, *argv, "--weights", folder)
    assert "holds a run with other settings (" in err and "weights_digest: " in err, err
    old = json.loads((out / "record.json").read_text())  # a record written before digests: compared by path
    old["settings"].pop("weights_digest")
    (out / "record.json").write_text(json.dumps(old))
    assert run(*argv, "--weights", copy, "-n", 3) == 0


def test_a_refusal_shows_a_recorded_repr_once_quoted():
    """A new user's try-out: 'rule: "CSD(lam=0.5, ...)" there, "'sjd'" here' quoted the method's name twice."""
    from csdgen.run_settings import settings_difference

    assert settings_difference({"rule": "CSD(lam=0.5)"}, {"rule": "'sjd'"}) == ['rule: "CSD(lam=0.5)" there, \'sjd\' here']
    assert settings_difference({"window": 16}, {"window": 8}) == ["window: 16 there, 8 here"]
