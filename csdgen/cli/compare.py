"""``csdgen compare``: every method on the same classes and seeds of the built-in model, one table.

Writes into ``--out`` (default ``./compare``): ``compare.md``, ``compare.csv`` (one row per
method: steps, step compression, wall time, speed-up over AR, class consistency, Frechet
distance, NLL), ``compare.png`` (the first 8 images of each method, side by side), and per
method ``run_<method>.json`` + ``run_<method>.safetensors`` (its tokens and statistics: a rerun
loads them instead of generating again).

With ``--model`` or ``--prompts`` it is ``csdgen bench`` with compare's methods (default: every
method the model has) and its noise floor (AR at ``--seed`` + 1): bench's files and records
(resumable) in ``--out``, and its table also as ``compare.md`` and ``compare.csv``.
"""

from __future__ import annotations

import argparse

from . import _options as opt
from ._common import builtin_model, check_draft_init, print_run_line, sampling_of, writable
from ._options import COMPARE_METHODS


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("compare", allow_abbrev=False, help="AR, SJD, CSD and the other methods on the same classes and seeds",
                       description="Run every method (or --methods) on the same classes and seeds of the built-in "
                                   "model and print one table; writes compare.md, compare.csv, compare.png and one "
                                   "cached run_<method>.json/.safetensors per method into --out. With --model and/or "
                                   "--prompts it runs as csdgen bench with these methods (records, resume, report.md) "
                                   "and writes its table as compare.md and compare.csv.")
    opt.add_builtin_model(p, n_default="64", batch_default=16, out_default="compare", n_minimum=2, spread=True,
                          seed_max=opt.MAX_SEED - 1, seed_note="the noise floor row ar-seed2 runs AR at seed + 1")
    p.add_argument("--methods", type=opt.names_of(COMPARE_METHODS, "method"), default=None,
                   help=f"comma-separated, of {','.join(COMPARE_METHODS)} (default: all; ar is always run)")
    opt.add_method_options(p, fixed_window=True)
    opt.add_preset(p)
    opt.add_sampling(p)
    from .bench import add_bench_source

    add_bench_source(p, "compare")
    p.set_defaults(run=run)
    return p


def _run_bench(args) -> int:
    """compare = bench with compare's methods and noise floor; its table copied to compare.md and compare.csv."""
    from . import bench as bench_cli

    done = bench_cli.execute(bench_cli.bench_namespace(args, seeds=[args.seed], floor_seed="auto"), title="csdgen compare")
    if done is None:
        return 0
    _, out, written = done
    table = written["report.md"].read_text().split("## Settings")[0].rstrip() + "\n"
    (out / "compare.md").write_text(table)
    (out / "compare.csv").write_text(written["report.csv"].read_text())
    print(table.rstrip())
    print(f"Wrote {out}/compare.md, compare.csv, report.md, records.jsonl and the other files of csdgen bench")
    return 0


def run(args) -> int:
    from csdgen.evaluation.compare import method_presets, runs_markdown, score_run, table_rows, to_csv
    from csdgen.evaluation.maps import image_grid, save_png, to_uint8
    from csdgen.evaluation.quality import QualityScorer
    from csdgen.folder_kinds import refuse_other_kind
    from csdgen.folder_lock import refuse_busy
    from csdgen.runs import MethodJob

    from ._common import locked_runs
    from .bench import builtin_run_or_bench

    status = builtin_run_or_bench(args, _run_bench)
    if status is not None:
        return status
    refuse_busy(args.out)  # before the model loads; locked_runs takes the lock
    refuse_other_kind(args.out, "cached runs")
    model, classes = builtin_model(args, fixed_window=True, spread=True)
    sampling = sampling_of(args)
    presets = method_presets(args.lam, args.delta, args.addition_c, model.codebook_embeddings(),
                             entropy_unit=args.entropy_unit, draft_init=args.draft_init)
    out = writable(args.out)
    names = args.methods or list(presets)
    check_draft_init(args, names, chosen=args.methods is not None)
    if "ar" not in names:
        names = ["ar"] + names
    scorer = QualityScorer(model)
    jobs = [MethodJob(n, {**presets[n], **opt.engine_kwargs(args)}, args.seed, args.window) for n in names]  # generate runs "ar" at window 1
    jobs.append(MethodJob("ar-seed2", {**presets["ar"], **opt.engine_kwargs(args)}, args.seed + 1, args.window))
    print_run_line(args)  # the run's first line: model, device, dtype and why
    with locked_runs(model, jobs, classes, args, sampling, out, "compare") as runs:  # written under the lock, as sweep
        scores, grid_rows = {}, []
        for run_ in runs:
            scores[run_.name], images = score_run(model, scorer, run_, classes)
            grid_rows.append(list(to_uint8(images[:8])))
        rows = table_rows(runs, scores)
        markdown = runs_markdown(rows, runs)
        (out / "compare.md").write_text(markdown)
        (out / "compare.csv").write_text(to_csv(rows))
        save_png(image_grid(grid_rows, [r.name for r in runs], scale=2), out / "compare.png")
    print(markdown)
    print(f"{len(classes)} images per method; noise floor: ar vs ar-seed2. Wrote {out}/compare.md, compare.csv, compare.png")
    return 0
