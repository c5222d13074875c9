"""``csdgen sweep``: every method over its relaxation parameter on the built-in model, and the frontier plot.

Writes into ``--out`` (default ``./sweep``): ``sweep.md``, ``sweep.csv``, ``sweep.json`` (one
row per setting: step compression, mean accepted length, latency, class consistency, Frechet
distance, NLL), ``frontier.png`` (step compression against each quality score, one curve per
method) and per setting ``run_<setting>.json`` + ``run_<setting>.safetensors`` (cached runs).

With ``--model`` or ``--prompts`` it is ``csdgen bench`` with one method per setting (named as
the setting, carrying its own window) at ``--seed``, no noise floor: bench's files and records
(resumable) in ``--out``, then ``sweep.md``, ``sweep.csv``, ``sweep.json`` and ``frontier.png``
from its table (scores: NLL, and CLIP/FID when bench computes them).
"""

from __future__ import annotations

import argparse

from csdgen.evaluation.sweep import BASELINES, SweepGrid

from . import _options as opt
from ._common import builtin_model, check_gsd_radii, longer_than_image, note, print_run_line, sampling_of, writable

_GRIDS = (("csd_lam", float, "CSD lambda values"), ("csd_delta", float, "CSD delta values (one curve each)"),
          ("addition_c", float, "Addition c values"), ("gsd_radius", int, "GSD radii"),
          ("lantern_delta", float, "LANTERN delta values"), ("windows", int, "windows, integers >= 1 (every method runs at each; auto is not swept)"))
#: each grid's range, checked when the command line is read, before any model loads (the rules check the
#: same ranges, but only once the model is loaded: minutes for a real checkpoint); the GSD radius's
#: upper bound, V - 1, needs the codebook (check_gsd_radii)
_RANGES = {"csd_lam": (lambda v: v >= 0, "finite numbers >= 0 (CSD's lambda)"),
           "csd_delta": (lambda v: 0 <= v <= 1, "numbers in [0, 1] (CSD's total-variation threshold)"),
           "addition_c": (lambda v: v >= 0, "finite numbers >= 0 (the Addition constant)"),
           "gsd_radius": (lambda v: v >= 0, "integers >= 0 (GSD's rank radius)"),
           "lantern_delta": (lambda v: 0 <= v <= 1, "numbers in [0, 1] (LANTERN's added-mass budget)")}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("sweep", allow_abbrev=False, help="every method over its parameter: table and speed-quality frontier plot",
                       description="Run every method over its relaxation parameter on the same classes and seeds "
                                   "of the built-in model; writes sweep.md, sweep.csv, sweep.json, frontier.png and "
                                   "one cached run_<setting>.json/.safetensors per setting into --out. With --model "
                                   "and/or --prompts it runs as csdgen bench with one method per setting (records, "
                                   "resume, report.md), then writes the sweep table and frontier.png from it.")
    opt.add_builtin_model(p, n_default="64", batch_default=16, out_default="sweep", n_minimum=2, spread=True)
    grid = SweepGrid()
    for name, kind, what in _GRIDS:
        default = getattr(grid, name)
        # every method runs at each window: an empty list of windows would run nothing but AR
        none = "" if name == "windows" else "; empty string = none"
        kind_of = opt.window_list if name == "windows" else opt.numbers(kind, check=_RANGES[name][0], allowed=_RANGES[name][1])
        p.add_argument("--" + name.replace("_", "-"), type=kind_of, default=default, metavar="LIST",
                       help=f"{what}, comma-separated (default {','.join(map(str, default))}{none})")
    p.add_argument("--draft-inits", type=opt.names_of(opt.DRAFT_INITS, "draft initialisation"), default=grid.draft_inits,
                   metavar="LIST", help=f"comma-separated, of {','.join(opt.DRAFT_INITS)} (default "
                                        f"{','.join(grid.draft_inits)}; GSD and LANTERN always use onehot)")
    p.add_argument("--baselines", type=opt.names_of(BASELINES, "baseline", empty=True), default=grid.baselines, metavar="LIST",
                   help=f"comma-separated, of {','.join(BASELINES)} (default {','.join(grid.baselines)}; "
                        f"empty string = none)")
    opt.add_sampling(p)
    opt.add_engine(p)
    from .bench import add_bench_source

    add_bench_source(p, "sweep")
    p.set_defaults(run=run)
    return p


def _grid(args) -> SweepGrid:
    return SweepGrid(args.csd_lam, args.csd_delta, args.addition_c, args.gsd_radius, args.lantern_delta,
                     args.windows, args.draft_inits, args.baselines)


def fit_windows(windows: list[int], num_tokens: int) -> list[int]:
    """``--windows`` capped at the image length, as generate caps ``--window`` and with its note, each
    width run once: ``300,400`` on a 256-token image ran twice at 256 as two rows of one setting; now
    once, as window 256, with one note naming the windows that became it."""
    longer = [w for w in windows if w > num_tokens]
    if not longer:
        return windows
    fitted = list(dict.fromkeys(min(w, num_tokens) for w in windows))
    note(longer_than_image(longer, num_tokens, "--windows", once=len(longer) > 1 or num_tokens in windows))
    return fitted


def _run_bench(args) -> int:
    """sweep = bench with one method per setting; the sweep table and frontier plot from bench's report."""
    import csv
    import dataclasses

    from csdgen.evaluation.compare import to_csv, to_markdown
    from csdgen.evaluation.sweep import frontier_plot, settings
    from csdgen.jsonio import write_json

    from . import bench as bench_cli

    points = []

    def adjust(plan):
        from csdgen.models.base import optional_codebook

        check_gsd_radii(args.gsd_radius, plan.model)
        args.windows = fit_windows(args.windows, plan.model.num_image_tokens)
        points.extend(settings(_grid(args), optional_codebook(plan.model), entropy_unit=args.entropy_unit))
        if not points:
            raise ValueError("nothing to sweep: every grid (--csd-lam, --addition-c, ...) and --baselines is empty")
        methods = {p.name: {**p.preset, "window": p.window, **opt.engine_kwargs(args)} for p in points}
        # bench.json records the grids the settings run at (--windows capped at the image, --csd-lam, ...), not
        # bench's one value of each, which no setting need run at (not compared on resume: the names carry them)
        grids = {"window": list(args.windows), "lam": list(args.csd_lam), "delta": list(args.csd_delta),
                 "addition_c": list(args.addition_c)}
        return dataclasses.replace(plan, methods=methods, settings={**plan.settings, "command": "sweep", **grids})

    done = bench_cli.execute(bench_cli.bench_namespace(args, seeds=[args.seed], floor_seed="none", methods=["ar"],
                                                       skip=("addition_c",)),  # the sweep's --addition-c is a grid
                             adjust=adjust, title="csdgen sweep")
    if done is None:
        return 0
    _, out, written = done
    report = {r["method"]: r for r in csv.DictReader(written["report.csv"].read_text().splitlines())}
    scores = [s for s in ("class_consistency", "frechet_distance", "clip", "fid", "nll")
              if any(report[p.name].get(s) for p in points)]
    rows = []
    for point in points:
        r = report[point.name]
        rows.append({"method": point.method, "parameter": point.parameter, "value": point.value, "window": point.window,
                     "draft_init": point.draft_init, "images": int(r["images"]),
                     **{k: float(r[k]) for k in ("step_compression", "mean_accepted_length", "latency_s_per_image")},
                     **{s: float(r[s]) if r.get(s) else None for s in scores}})
    write_json(rows, out / "sweep.json")
    (out / "sweep.md").write_text(to_markdown(rows))
    (out / "sweep.csv").write_text(to_csv(rows))
    frontier_plot(rows, out / "frontier.png", scores=tuple(scores))
    print(to_markdown(rows))
    print(f"{len(points)} settings x {rows[0]['images']} prompts. Wrote {out}/sweep.md, sweep.csv, sweep.json, "
          f"frontier.png, report.md, records.jsonl and the other files of csdgen bench")
    return 0


def run(args) -> int:
    from csdgen.evaluation.compare import runs_markdown, score_run, to_csv
    from csdgen.evaluation.quality import QualityScorer
    from csdgen.evaluation.sweep import frontier_plot, settings
    from csdgen.jsonio import write_json
    from csdgen.folder_kinds import refuse_other_kind
    from csdgen.folder_lock import refuse_busy
    from csdgen.runs import MethodJob

    from ._common import locked_runs
    from .bench import builtin_run_or_bench

    status = builtin_run_or_bench(args, _run_bench)
    if status is not None:
        return status
    args.window = args.lam = args.delta = None  # a sweep sets these per point; filled only to validate the rest
    refuse_busy(args.out)  # before the model loads; locked_runs takes the lock
    refuse_other_kind(args.out, "cached runs")
    model, classes = builtin_model(args, spread=True)
    sampling = sampling_of(args)
    args.windows = fit_windows(args.windows, model.num_image_tokens)
    grid = _grid(args)
    check_gsd_radii(args.gsd_radius, model)
    points = settings(grid, model.codebook_embeddings(), entropy_unit=args.entropy_unit)
    if not points:
        raise ValueError("nothing to sweep: every grid (--csd-lam, --addition-c, ...) and --baselines is empty")
    out = writable(args.out)
    scorer = QualityScorer(model)
    rows = []
    jobs = [MethodJob(p.name, {**p.preset, **opt.engine_kwargs(args)}, args.seed, p.window) for p in points]
    print_run_line(args)  # the run's first line: model, device, dtype and why
    with locked_runs(model, jobs, classes, args, sampling, out, "sweep") as runs:
        for point, run_ in zip(points, runs):
            scores, _ = score_run(model, scorer, run_, classes)
            rows.append({"method": point.method, "parameter": point.parameter, "value": point.value,
                         "window": point.window, "draft_init": point.draft_init, "images": len(classes),
                         "step_compression": sum(run_.compression) / len(run_.compression),
                         "mean_accepted_length": sum(run_.accepted) / len(run_.accepted),
                         "latency_s_per_image": run_.seconds / len(classes), **scores})
            write_json(rows, out / "sweep.json")
        markdown = runs_markdown(rows, runs)
    (out / "sweep.md").write_text(markdown)
    (out / "sweep.csv").write_text(to_csv(rows))
    frontier_plot(rows, out / "frontier.png")
    print(markdown)
    print(f"{len(points)} settings x {len(classes)} images. Wrote {out}/sweep.md, sweep.csv, sweep.json, frontier.png")
    return 0
