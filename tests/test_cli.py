"""The csdgen command on a tiny random stand-in for the built-in weights."""

import json
import os

import pytest
import torch

from csdgen import cli
from csdgen.cli._options import engine_kwargs
from csdgen.models.builtin import load_builtin_model

from builtin_fixture import CLASS_NAMES, CODEBOOK, make_tiny_weights
from cli_helpers import cli_error, run, usage_error


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return make_tiny_weights(tmp_path_factory.mktemp("weights"))


def test_generate_writes_images_maps_and_record(weights, tmp_path, capsys):
    out = tmp_path / "out"
    # "family: man, boy, boy" holds commas: the longest known name is taken, the next piece is another class
    assert run("generate", "--weights", weights, "-n", 3, "--batch-size", 2, "--out", out,
               "--class", "Family: Man, Boy, Boy,dog face") == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == ["0000_family-man-boy-boy.png", "0000_family-man-boy-boy_map.png", "0001_dog-face.png",
                     "0001_dog-face_map.png", "0002_family-man-boy-boy.png", "0002_family-man-boy-boy_map.png",
                     "record.json"]
    record = json.loads((out / "record.json").read_text())
    assert record["settings"]["method"] == "csd" and len(record["images"]) == 3
    assert [record["images"][k]["class"] for k in "012"] == ["family: man, boy, boy", "dog face", "family: man, boy, boy"]
    image = record["images"]["0"]
    assert image["tokens"] == 256 and image["steps"] >= 1 and image["step_compression"] == pytest.approx(256 / image["steps"])
    assert sum(image[f"tokens_{k}"] for k in ("sampled", "accepted", "relaxed", "resampled")) == 256
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("3 images, 768 tokens,") and "step compression" in summary


def test_generate_resumes_without_redoing_and_keeps_written_images(weights, tmp_path):
    out = tmp_path / "out"
    assert run("generate", "--weights", weights, "-n", 2, "--batch-size", 1, "--out", out, "--method", "sjd") == 0
    first = (out / "0000_dog-face.png").stat().st_mtime_ns
    (out / "0001_family-man-boy-boy.png").unlink()  # as if the run had been killed before the second batch
    assert run("generate", "--weights", weights, "-n", 2, "--batch-size", 1, "--out", out, "--method", "sjd") == 0
    assert (out / "0000_dog-face.png").stat().st_mtime_ns == first  # not regenerated
    assert (out / "0001_family-man-boy-boy.png").is_file()


def test_same_seed_same_images_other_seed_other_images(weights, tmp_path):
    def png(out, seed):
        assert run("generate", "--weights", weights, "-n", 1, "--out", out, "--class", "red apple", "--seed", seed,
                   "--window", 8) == 0  # a fixed window: bit-identical images (auto: identical in law)
        return (out / "0000_red-apple.png").read_bytes()

    assert png(tmp_path / "a", 4) == png(tmp_path / "b", 4) != png(tmp_path / "c", 5)
    assert load_builtin_model(weights).class_names == CLASS_NAMES


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--class", "dog fase"], "unknown class 'dog fase'; did you mean 'dog face'?"),
        (["--class", "red apple,teapot"], "unknown class 'teapot' (any of the 3 class names"),
        (["--class", "3"], "class index 3: allowed 0..2"),
        (["--class", " , "], "no class given"),
        (["--lam", "-1"], None),
        (["--delta", "2"], None),
        (["--addition-c", "-1"], None),
        (["--top-k", "2000"], "--top-k 2000: exceeds"),
        (["--window", "0"], None),
        (["-n", "-3"], None),
    ],
)
def test_bad_input_gives_a_clear_error(weights, tmp_path, capsys, argv, message):
    argv = ["generate", "--weights", str(weights), "--out", str(tmp_path / "o"), *argv]
    if message is None:  # argparse rejects it: exit status 2 with a usage message
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        says = {"--window": "'0': allowed an integer in 1..1000000 or auto",
                "--lam": "argument --lam: '-1': allowed a finite number >= 0 (CSD's relaxation coefficient lambda)",
                "--delta": "argument --delta: '2': allowed a number in [0, 1] (CSD's total-variation threshold)",
                "--addition-c": "argument --addition-c: '-1': allowed a finite number >= 0 (the Addition constant)",
                "-n": "must be an integer >= 1"}[argv[-2]]
        err = capsys.readouterr().err
        assert exc.value.code == 2 and says in err and "note:" not in err, err
    else:
        assert cli.main(argv) == 2
        assert message in capsys.readouterr().err


def test_generate_sets_gsd_radius_and_lantern_delta_and_records_them(weights, tmp_path, capsys):
    """GSD's radius and LANTERN's delta could be set by sweep and the Python API but not by generate."""
    def rule(out):
        return json.loads((out / "record.json").read_text())["settings"]["rule"]

    base = ["generate", "--weights", weights, "-n", 1, "--window", 4, "--no-maps"]
    assert run(*base, "--method", "lantern", "--lantern-delta", 0.3, "--out", tmp_path / "l") == 0
    assert "delta=0.3" in rule(tmp_path / "l")
    assert run(*base, "--method", "gsd", "--gsd-radius", 2, "--out", tmp_path / "g") == 0
    assert "radius=2" in rule(tmp_path / "g")
    assert run(*base, "--method", "gsd", "--out", tmp_path / "default") == 0
    assert rule(tmp_path / "default") == "'gsd'"  # no option: the rule the name makes
    capsys.readouterr()
    # another delta into the same folder is another run: refused, not mixed
    err = cli_error(capsys, *base, "--method", "lantern", "--lantern-delta", 0.2, "--out", tmp_path / "l")
    assert "holds a run with other settings" in err and "delta=0.2" in err
    err = cli_error(capsys, *base, "--method", "gsd", "--gsd-radius", CODEBOOK, "--out", tmp_path / "big")
    assert f"--gsd-radius {CODEBOOK}: the GSD rank radius must be 0..{CODEBOOK - 1}" in err
    assert run(*base, "--gsd-radius", 2, "--out", tmp_path / "csd") == 0
    assert "note: --gsd-radius 2 does not apply to --method csd (only gsd uses it)" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_output_folder_is_refused(weights, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert run("generate", "--weights", weights, "--out", locked / "x") == 2
    assert "not writable" in capsys.readouterr().err


def test_output_path_that_is_a_file_is_refused(weights, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert run("generate", "--weights", weights, "--out", blocker / "sub") == 2
    assert "is inside" in capsys.readouterr().err
    assert run("generate", "--weights", weights, "--out", blocker) == 2  # it said "not writable (File exists)"
    err = capsys.readouterr().err
    assert "is a file, not a folder" in err and "File exists" not in err


def test_output_folder_check_holds_when_many_processes_check_it_at_once(tmp_path):
    """Ranks under torchrun check the same --out together: no check may see another's probe file vanish."""
    import threading

    from csdgen.cli._common import writable

    folder, errors = tmp_path / "shared", []

    def check():
        for _ in range(200):
            try:
                writable(folder)
            except ValueError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=check) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and list(folder.iterdir()) == []


def test_missing_weights_folder_is_a_clear_error(tmp_path, capsys):
    assert run("generate", "--weights", tmp_path / "nowhere", "--out", tmp_path / "o") == 2
    assert "no built-in weights" in capsys.readouterr().err


def test_compare_prints_and_saves_one_table(weights, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", "--weights", weights, "-n", 3, "--batch-size", 3, "--out", out, "--methods", "sjd,csd",
            "--class", "Family: Man, Boy, Boy,apple"]  # a name holding commas, then a short name
    assert run(*argv) == 0
    assert json.loads((out / "run_ar.json").read_text())["key"]["classes"] == ["1", "2", "1"]  # in turn
    table = (out / "compare.md").read_text()
    for name in ("| ar |", "| sjd |", "| csd |", "| ar-seed2 |"):
        assert name in table
    assert (out / "compare.csv").read_text().startswith("method,images,steps,step_compression,mean_accepted_length,wall_s,speedup_vs_ar,")
    assert (out / "compare.png").is_file()
    # a second run loads every method from disk
    before = (out / "run_csd.safetensors").stat().st_mtime_ns
    assert run(*argv) == 0
    assert (out / "run_csd.safetensors").stat().st_mtime_ns == before


def test_token_nll_matches_a_manual_computation(weights):
    model = load_builtin_model(weights)
    V = CODEBOOK
    tokens = torch.randint(V, (2, 256), generator=torch.Generator().manual_seed(0))
    nll = model.token_nll(tokens, [0, "red apple"])
    ids = torch.tensor([[V], [V + 2]])
    logits = model.backbone(input_ids=torch.cat([ids, tokens[:, :-1]], 1)).logits[..., :V]
    manual = torch.nn.functional.cross_entropy(logits.reshape(-1, V), tokens.reshape(-1), reduction="none").reshape(2, -1).mean(-1)
    torch.testing.assert_close(nll, manual.detach(), rtol=1e-4, atol=1e-4)


def test_sweep_writes_table_and_frontier_plot(weights, tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["sweep", "--weights", weights, "-n", 2, "--batch-size", 2, "--out", out, "--csd-lam", "0.1,1",
            "--addition-c", "0.2", "--gsd-radius", "3", "--lantern-delta", "0.1", "--baselines", "ar,sjd"]
    assert run(*argv) == 0
    rows = (out / "sweep.csv").read_text().splitlines()
    assert rows[0].startswith("method,parameter,value,window,draft_init,images,step_compression,mean_accepted_length,")
    methods = [r.split(",")[0] for r in rows[1:]]
    assert methods == ["ar", "sjd", "csd", "csd", "addition", "gsd", "lantern"]
    assert (out / "frontier.png").stat().st_size > 1000


def test_sweep_rejects_bad_lists(weights, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["sweep", "--weights", str(weights), "--csd-lam", "a,b"])
    assert "expected comma-separated float values" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # refused by the option's parser, before the model loads
        cli.main(["sweep", "--weights", str(weights), "--out", str(tmp_path), "--csd-lam", "-1", "-n", "2"])
    assert "value -1.0 is out of range; allowed: finite numbers >= 0" in capsys.readouterr().err


def test_resume_refuses_other_classes_or_settings_in_the_same_folder(weights, tmp_path, capsys):
    """Regression: a rerun with another --class used to reuse the old images and exit 0."""
    out = tmp_path / "out"
    assert run("generate", "--weights", weights, "-n", 2, "--batch-size", 2, "--out", out) == 0
    assert run("generate", "--weights", weights, "-n", 2, "--batch-size", 2, "--out", out, "--class", "red apple") == 2
    assert "holds image 0 for 'dog face', this run asks for 'red apple'" in capsys.readouterr().err
    assert run("generate", "--weights", weights, "-n", 2, "--batch-size", 1, "--out", out, "--seed", 3) == 2
    assert "other settings (seed: 0 there, 3 here)" in capsys.readouterr().err
    assert run("generate", "--weights", weights, "-n", 2, "--batch-size", 1, "--out", out) == 0  # batch size: resumes


def test_engine_option_reaches_generate_and_bad_values_are_refused(weights, tmp_path, monkeypatch, capsys):
    """--engine / --compile arrive in csdgen.generate (absent when left at the defaults, so earlier run
    keys stay the same); the engine that ran is the one asked for; bad combinations are one-line errors."""
    import csdgen.engine as engine  # its public names are what the commands import

    real, seen = engine.generate, []

    def spy(*args, **kwargs):
        result = real(*args, **kwargs)
        seen.append((kwargs.get("engine"), kwargs.get("compile"), result.settings["engine"]))
        return result

    monkeypatch.setattr(engine, "generate", spy)
    for i, extra in enumerate([[], ["--engine", "eager"], ["--engine", "static", "--no-compile"]]):
        assert run("generate", "--weights", weights, "-n", 1, "--out", tmp_path / str(i), "--method", "sjd",
                   "--window", 8, *extra) == 0
    assert seen == [(None, None, "static"), ("eager", None, "eager"), ("static", False, "static")]
    assert "--compile with --engine eager: compiled forwards need the static engine" in usage_error(
        capsys, "generate", "--weights", weights, "-n", 1, "--out", tmp_path / "x", "--engine", "eager", "--compile")
    assert "invalid choice: 'fast'" in usage_error(capsys, "generate", "--weights", weights, "--engine", "fast")
    parser = cli.build_parser()
    for command in ("compare", "bench", "sweep"):
        args = parser.parse_args([command, "--engine", "eager", "--no-compile"])
        assert engine_kwargs(args) == {"engine": "eager", "compile": False}


EMOJI_CONFIG = {"class_emoji": [["\U0001F436"], ["\U0001F468\u200D\U0001F466\u200D\U0001F466"], ["\U0001F34E"]],
                "default_classes": ["red apple", "dog face"],
                "other_classes": {"names": ["green apple"], "aliases": [["\U0001F34F"]], "nearest": [[2, 0, 1]]}}


@pytest.fixture(scope="module")
def emoji_weights(tmp_path_factory):
    return make_tiny_weights(tmp_path_factory.mktemp("emoji_weights"), extra=EMOJI_CONFIG)


def test_generate_without_class_draws_the_weights_default_classes_in_turn(emoji_weights, tmp_path):
    out = tmp_path / "out"
    assert run("generate", "--weights", emoji_weights, "-n", 3, "--out", out, "--window", 4) == 0
    record = json.loads((out / "record.json").read_text())
    assert [record["images"][k]["class"] for k in "012"] == ["red apple", "dog face", "red apple"]


def test_generate_takes_the_emoji_itself_and_its_skin_tones(emoji_weights, tmp_path):
    out = tmp_path / "out"
    assert run("generate", "--weights", emoji_weights, "-n", 2, "--out", out, "--window", 4,
               "--class", "\U0001F34E,\U0001F436\U0001F3FF") == 0
    assert sorted(p.name for p in out.glob("*.png") if "_map" not in p.name) == ["0000_red-apple.png", "0001_dog-face.png"]


def test_generate_answers_an_emoji_it_does_not_draw_with_the_nearest_it_draws(emoji_weights, tmp_path, capsys):
    err = cli_error(capsys, "generate", "--weights", emoji_weights, "--out", tmp_path / "o", "--class", "green apple")
    assert "'green apple' is not one of the 3 classes this model draws; the nearest it draws: 'red apple', " \
           "'dog face', 'family: man, boy, boy'" in err


def test_list_classes_shows_the_emoji_and_counts_the_names_known_but_not_drawn(emoji_weights, capsys):
    assert run("generate", "--weights", emoji_weights, "--list-classes") == 0
    out = capsys.readouterr().out
    assert "red apple  (also: apple, \U0001F34E)" in out and "1 other emoji names are known but not drawn" in out
