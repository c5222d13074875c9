"""``csdgen compare``: AR timed after a warm-up, its noise-floor row at another seed, a folder of
cached runs of other settings refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from csdgen import cli

from builtin_fixture import weights  # noqa: F401 (fixtures)
from cli_helpers import cli_error, one_line_usage_error, run


def _cache_state(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("run_*"))}


def test_compare_times_ar_after_a_warm_up_so_ar_and_ar_seed2_agree(weights, tmp_path, monkeypatch):
    """A one-time start-up cost (100 s of a virtual clock on the model's first session; every later
    session costs 1 s) lands in the untimed warm-up, not in ``ar``'s time, and the methods take turns
    batch by batch. The engine's clock is replaced, so the figures do not depend on the machine."""
    import csdgen.engine as engine  # its public names are what the commands import
    from csdgen.engine import loop
    from csdgen.models import llama

    clock = {"now": 0.0, "sessions": 0}

    class VirtualTime:
        @staticmethod
        def perf_counter():
            return clock["now"]

    start = llama.ClassConditionalLlama.start

    def start_with_costs(self, *args, **kwargs):
        clock["now"] += 100.0 if clock["sessions"] == 0 else 1.0
        clock["sessions"] += 1
        return start(self, *args, **kwargs)

    calls = []
    generate = engine.generate

    def spy(model, conditions, **kwargs):
        calls.append((kwargs["seed"], getattr(kwargs["method"], "name", kwargs["method"]), tuple(kwargs["image_indices"])))
        return generate(model, conditions, **kwargs)

    monkeypatch.setattr(loop, "time", VirtualTime)
    monkeypatch.setattr(llama.ClassConditionalLlama, "start", start_with_costs)
    monkeypatch.setattr(engine, "generate", spy)
    out = tmp_path / "compare"
    assert run("compare", "--weights", weights, "-n", 4, "--batch-size", 2, "--methods", "sjd", "--window", 8,
               "--out", out) == 0
    seconds = {name: json.loads((out / f"run_{name}.json").read_text())["seconds"] for name in ("ar", "ar-seed2", "sjd")}
    assert seconds == {"ar": 2.0, "ar-seed2": 2.0, "sjd": 2.0}  # two batches of one session each
    assert [c[:2] for c in calls[:2]] == [(0, "ar"), (0, "sjd")]  # one warm-up per window width (AR's 1, sjd's 8)
    assert calls[2:] == [(0, "ar", (0, 1)), (0, "sjd", (0, 1)), (1, "ar", (0, 1)),
                         (0, "ar", (2, 3)), (0, "sjd", (2, 3)), (1, "ar", (2, 3))]


def test_compare_options_given_at_their_default_resume_the_same_runs(weights, tmp_path, capsys):
    """Found by a new-user try-out: --draft-init uniform, --top-p 1 and --engine static (what the default engine
    runs for the built-in model) were refused as other settings."""
    out = tmp_path / "compare"
    common = ["compare", "--weights", weights, "--methods", "sjd", "--window", 8, "--batch-size", 2, "-n", 2,
              "--out", out]
    assert run(*common) == 0
    before = _cache_state(out)
    assert run(*common, "--draft-init", "uniform", "--top-p", 1, "--engine", "static") == 0, capsys.readouterr().err
    assert _cache_state(out) == before
    capsys.readouterr()
    err = cli_error(capsys, *common, "--draft-init", "onehot")
    assert 'holds a run with other settings (preset.draft_init: "uniform" there, "onehot" here)' in err, err


def test_a_table_whose_times_come_from_more_than_one_run_says_so(weights, tmp_path, capsys):
    """A new user's try-out: a compare grown from -n 2 to -n 3 (or resumed after a kill) timed the new image alone,
    and its table gave AR a speed-up over AR at the next seed of 2.12x without a word."""
    out = tmp_path / "compare"
    common = ["compare", "--weights", weights, "--methods", "sjd", "--window", 8, "--batch-size", 2, "--out", out]
    assert run(*common, "-n", 2) == 0
    assert "caveat" not in capsys.readouterr().out and "caveat" not in (out / "compare.md").read_text()
    assert run(*common, "-n", 2) == 0  # nothing new timed: the table's times are still one run's
    assert "caveat" not in capsys.readouterr().out
    assert run(*common, "-n", 3) == 0
    printed = capsys.readouterr().out
    assert "caveat: the wall times come from 2 runs of this command" in printed, printed
    assert "caveat: the wall times come from 2 runs" in (out / "compare.md").read_text()
    sweep_out = tmp_path / "sweep"
    sweep = ["sweep", "--weights", weights, "--csd-lam", "0.5", "--addition-c", "", "--gsd-radius", "",
             "--lantern-delta", "", "--windows", 8, "--baselines", "", "--batch-size", 2,
             "--out", sweep_out]  # AR and one CSD point: the caveat is the runs', not the grid's
    assert run(*sweep, "-n", 2) == 0 and "caveat" not in capsys.readouterr().out
    assert run(*sweep, "-n", 3) == 0
    assert "caveat: the wall times come from 2 runs of this command" in (sweep_out / "sweep.md").read_text()


def test_compare_into_a_folder_with_other_settings_refuses_and_loses_no_cached_run(weights, tmp_path, capsys):
    out = tmp_path / "compare"
    common = ["compare", "--weights", weights, "--methods", "csd", "--window", 8, "--batch-size", 3, "--out", out]
    assert run(*common, "-n", 3) == 0  # one batch
    before = _cache_state(out)
    assert run(*common, "-n", 2) == 0  # fewer images: read from the cache, which stays as it was
    assert _cache_state(out) == before
    assert "| csd | 2 |" in capsys.readouterr().out.replace("  ", " ")
    err = cli_error(capsys, *common, "-n", 3, "--lam", 0.3)
    assert "run_csd.json" in err and "holds a run with other settings (preset.method.lam: 0.5 there, 0.3 here)" in err
    err = cli_error(capsys, *common, "-n", 3, "--delta", 0.3)
    assert "(preset.method.delta: 0.65 there, 0.3 here)" in err
    err = cli_error(capsys, *common, "-n", 3, "--entropy-unit", "normalized")
    assert '(preset.method.entropy_unit: "nats" there, "normalized" here)' in err
    err = cli_error(capsys, *common, "-n", 3, "--class", "red apple")  # image 0 of the cache is "dog face"
    assert "holds image 0 for class" in err
    assert _cache_state(out) == before
    assert run(*common, "-n", 5) == 0  # more images (a second batch): the cache is continued, its first three kept
    meta = json.loads((out / "run_csd.json").read_text())
    assert len(meta["steps"]) == 5 and meta["steps"][:3] == json.loads(before["run_csd.json"])["steps"]


def test_ar_cache_is_kept_when_only_settings_ar_does_not_use_change(weights, tmp_path, capsys):
    """AR has no drafts and decodes one token a step: another --draft-init or --window reruns only the
    methods that use them, and reads AR's rows from their caches."""
    out = tmp_path / "compare"
    common = ["compare", "--weights", weights, "-n", 2, "--batch-size", 2, "--out", out]
    assert run(*common, "--methods", "sjd", "--window", 8) == 0
    ar = {k: v for k, v in _cache_state(out).items() if k.startswith("run_ar")}
    assert len(ar) == 4
    assert run(*common, "--methods", "csd", "--window", 4, "--draft-init", "onehot") == 0, capsys.readouterr().err
    assert {k: v for k, v in _cache_state(out).items() if k.startswith("run_ar")} == ar  # read, not regenerated
    capsys.readouterr()
    err = cli_error(capsys, *common, "--methods", "sjd", "--window", 8, "--draft-init", "onehot")
    assert 'run_sjd.json' in err and '(preset.draft_init: "uniform" there, "onehot" here)' in err


def test_floor_seed_equal_to_a_run_seed_is_refused(weights, capsys, tmp_path):
    err = cli_error(capsys, "bench", "--weights", weights, "--limit", 1, "--methods", "ar", "--floor-seed", 0,
                    "--out", tmp_path / "b")
    assert "--floor-seed 0 is also a run seed (--seeds 0); the noise floor needs another seed" in err
    assert not (tmp_path / "b").exists()


def test_the_default_floor_seed_skips_run_seeds():
    """``--seeds 0,1`` was refused (the default floor, the first seed + 1, is a run seed) although a
    free seed was there to take: the default is now the next seed up that is not a run seed."""
    import argparse

    from csdgen.cli.bench import _floor
    from csdgen.cli._options import MAX_SEED

    def floor(seeds, given="auto"):
        return _floor(argparse.Namespace(seeds=seeds, floor_seed=given))

    assert floor([0]) == 1 and floor([0, 1]) == 2 and floor([5, 6, 7, 9]) == 8 and floor([3, 0]) == 4
    assert floor([0, 1], "none") is None and floor([0, 1], 7) == 7
    with pytest.raises(ValueError, match="--floor-seed 1 is also a run seed"):
        floor([0, 1], 1)
    with pytest.raises(ValueError, match="none is left"):
        floor([MAX_SEED])


def test_compare_noise_floor_row_is_ar_at_the_next_seed(weights, tmp_path):
    """README: the row ``ar-seed2`` is AR at ``--seed`` + 1, whatever ``--seed`` is."""
    out = tmp_path / "cmp"
    assert cli.main(["compare", "--weights", str(weights), "-n", "2", "--methods", "sjd", "--seed", "5", "--out", str(out)]) == 0
    assert json.loads((out / "run_ar.json").read_text())["key"]["seed"] == 5
    assert json.loads((out / "run_ar-seed2.json").read_text())["key"]["seed"] == 6


def test_a_sweep_grid_without_draft_inits_is_refused():
    """Every method but AR runs once per draft initialisation: an empty list left a sweep of AR alone."""
    from csdgen.evaluation.sweep import SweepGrid, settings

    with pytest.raises(ValueError, match=r"draft_inits=\[\]: .* allowed: at least one of uniform, onehot"):
        settings(SweepGrid(draft_inits=[]))
    assert len(settings(SweepGrid(draft_inits=["uniform"]))) > 1  # the control


def test_sweep_runs_gsd_and_lantern_once_per_window_whatever_the_draft_inits():
    """sweep --draft-inits uniform,onehot listed every GSD and LANTERN point twice under one name (they
    draft one-hot whatever the list says): duplicate rows and points, one run done twice (new-user try-out)."""
    from csdgen.evaluation.sweep import SweepGrid, settings

    grid = SweepGrid(csd_lam=[0.5], addition_c=[], gsd_radius=[1, 3], lantern_delta=[0.1], windows=[8, 16],
                     draft_inits=["uniform", "onehot"], baselines=["ar", "sjd"])
    points = settings(grid, torch.randn(10, 4))
    names = [p.name for p in points]
    assert len(names) == len(set(names))
    for method, per_window in (("gsd", 2), ("lantern", 1), ("csd", 2), ("sjd", 2)):
        assert sum(p.method == method for p in points) == per_window * 2, method
    assert {p.draft_init for p in points if p.method in ("gsd", "lantern")} == {"onehot"}
    assert [p.draft_init for p in points if p.method == "ar"] == [""]  # AR runs no drafts: none named


def test_a_sweep_names_a_single_delta_other_than_csds_default(weights, tmp_path, capsys):  # noqa: F811
    """sweep --csd-delta 0.3 named its settings as the default delta's (csd_lam1.0_W4_uniform): a rerun with
    another delta into the same folder was refused by the cached run (or bench record) of that name. A
    delta other than CSD's default is named now, so the rerun adds its settings; the default's names stay."""
    import inspect

    from csdgen.acceptance import CSD
    from csdgen.evaluation.sweep import SweepGrid, settings

    assert SweepGrid().csd_delta == [inspect.signature(CSD).parameters["delta"].default]
    grid = dict(csd_lam=[1.0], addition_c=[], gsd_radius=[], lantern_delta=[], windows=[4], baselines=[])
    assert [p.name for p in settings(SweepGrid(**grid))] == ["csd_lam1.0_W4_uniform"]  # as before
    assert [p.name for p in settings(SweepGrid(**grid, csd_delta=[0.3]))] == ["csd_lam1.0_delta0.3_W4_uniform"]
    # the tables and curves name it too (they said "csd", as for the default delta)
    assert [p.method for p in settings(SweepGrid(**grid, csd_delta=[0.3]))] == ["csd (delta 0.3)"]
    assert [p.method for p in settings(SweepGrid(**grid))] == ["csd"]
    out = tmp_path / "sweep"
    argv = ["sweep", "--weights", weights, "-n", 2, "--batch-size", 2, "--csd-lam", "1", "--addition-c", "",
            "--gsd-radius", "", "--lantern-delta", "", "--baselines", "", "--windows", 4, "--out", out]
    assert run(*argv) == 0
    assert run(*argv, "--csd-delta", "0.3") == 0
    assert sorted(p.name for p in out.glob("run_*.json")) == ["run_csd_lam1.0_W4_uniform.json",
                                                               "run_csd_lam1.0_delta0.3_W4_uniform.json"]
    assert json.loads((out / "sweep.json").read_text())[0]["step_compression"] > 0


def test_compare_refuses_the_last_seed_before_the_model_loads(tmp_path, capsys, monkeypatch):
    """compare --seed 2**63 - 1 (no seed + 1 for the noise floor) was refused only after the built-in
    model had loaded (new-user try-out); argparse refuses it now, naming compare's own range, as it
    does a negative seed."""
    import csdgen.cli.compare as compare_cli
    from csdgen.cli._options import MAX_SEED

    monkeypatch.setattr(compare_cli, "builtin_model", lambda *a, **k: pytest.fail("the model was loaded"))
    for bad in (MAX_SEED, -1):
        err = one_line_usage_error(capsys, "compare", "-n", 2, "--seed", bad, "--out", tmp_path / "c")
        assert f"argument --seed: {bad}: outside the seed range; allowed: an integer in 0..{MAX_SEED - 1} (2**63 - 2)" \
            in err, err
    assert not (tmp_path / "c").exists()


def test_compare_help_and_docs_give_the_seeds_compare_takes():
    """compare --help said "run seed, 0..2**63 - 1" and docs/cli.md "--seed + 1, whatever --seed is",
    but compare refuses 2**63 - 1 (its ar-seed2 row runs at seed + 1); both now say 0..2**63 - 2."""
    import argparse

    from csdgen.cli._options import MAX_SEED

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {name: next(a.help for a in sub.choices[name]._actions if a.dest == "seed") for name in ("compare", "generate")}
    assert f"0..{MAX_SEED - 1}" in helps["compare"] and f"0..{MAX_SEED}" not in helps["compare"]
    assert f"0..{MAX_SEED}" in helps["generate"]
    doc = " ".join((Path(__file__).parents[1] / "docs" / "cli.md").read_text().split())
    assert "whatever `--seed` is" not in doc and "compare takes seeds up to 2^63 - 2" in doc


def test_compare_scores_the_images_bench_scores_from_its_pngs(weights, tmp_path):
    """The same tokens give the same Frechet distance and class consistency in ``compare`` (decoded
    in memory) as in ``bench`` (written as 8-bit PNGs and read back): both score the 8-bit images."""
    from csdgen.bench_scores import _read_png
    from csdgen.evaluation.compare import score_run
    from csdgen.evaluation.maps import save_png
    from csdgen.evaluation.quality import QualityScorer
    from csdgen.models.builtin import load_builtin_model
    from csdgen.runs import MethodRun, pil_images

    model = load_builtin_model(weights)
    scorer = QualityScorer(model)
    tokens = torch.randint(0, model.codebook_size, (6, model.num_image_tokens), generator=torch.Generator().manual_seed(0))
    classes = [i % model.num_classes for i in range(len(tokens))]
    run_ = MethodRun("sjd", tokens, [1] * 6, [1.0] * 6, [1.0] * 6, 1.0, {})
    scores, _ = score_run(model, scorer, run_, classes, batch=4)
    for i, image in enumerate(pil_images(model, tokens)):
        save_png(image, tmp_path / f"{i}.png")
    read = torch.stack([_read_png(tmp_path / f"{i}.png") for i in range(len(tokens))]).float() / 127.5 - 1
    assert scores["frechet_distance"] == scorer.frechet_distance(read)
    assert scores["class_consistency"] == float(scorer.class_consistency(read, classes).mean())
    unrounded = torch.cat([model.decode_images(tokens[:4]), model.decode_images(tokens[4:])])
    assert scorer.frechet_distance(unrounded) != scores["frechet_distance"]  # control: the rounding shows
