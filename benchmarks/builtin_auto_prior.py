"""Record what ``window="auto"`` learns on a built-in weights folder, and ship it as the auto window's prior.

    python benchmarks/builtin_auto_prior.py --weights csdgen/builtin/weights [--images 16] [--write]

For CSD and SJD with coupled (their default) and independent refresh, at the model's defaults: ``--images``
images of the weights' default classes (or every class in turn), batches of 8, ``window="auto"``,
in one process; then the acceptance counts the auto window kept for that method
(:func:`csdgen.engine.window.prior_counts` reads them back), scaled to ``--total`` reached drafts.
Prints them; with ``--write`` stores them as ``auto_window_prior`` in the folder's config.json
(atomically), with the command and settings, so a fresh process's auto window starts from them.
It also stores CSD's seconds per iteration at fixed windows (``--widths``) for a few batch sizes
(``--batches``): their ratios are where a fresh process's auto window starts
(:func:`csdgen.engine.window.prior_times`); the process corrects their scale, and each width's
time, from its own iterations. Record them on a quiet machine.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

import csdgen
from csdgen.engine import window as window_module
from csdgen.models.builtin import load_builtin_model
from csdgen.jsonio import read_json, write_json

#: (method, refresh) recorded: the defaults (coupled) first
METHODS = (("csd", "coupled"), ("sjd", "coupled"), ("csd", "independent"), ("sjd", "independent"))


def record(model, method: str, refresh: str, images: int, batch: int, seed: int) -> dict:
    """The auto window's counts for ``method`` with ``refresh`` after ``images`` images (a fresh state)."""
    window_module._STATES.pop(model, None)
    classes = model.default_classes or list(range(model.num_classes))
    conditions = [classes[i % len(classes)] for i in range(images)]
    for start in range(0, images, batch):
        csdgen.generate(model, conditions[start:start + batch], method=method, refresh=refresh, window="auto", seed=seed,
                        image_indices=list(range(start, start + len(conditions[start:start + batch]))))
    counts = list(window_module._STATES[model]["counts"].values())
    if len(counts) != 1:
        raise RuntimeError(f"{method}/{refresh}: {len(counts)} count sets recorded, expected 1")
    return {"reached": counts[0].reached, "rejected": counts[0].rejected}


def record_times(model, batches: tuple[int, ...], widths: tuple[int, ...], seed: int, repeats: int = 1) -> dict:
    """Seconds per iteration (wall time of a whole ``generate`` call over its iterations, model loaded
    and warmed) of CSD at each fixed window in ``widths`` for each batch size in ``batches``, guided
    (the model's defaults), the fastest of ``repeats`` calls after one untimed call at the batch size:
    ``{images: {width: seconds}}``."""
    classes = model.default_classes or list(range(model.num_classes))
    csdgen.generate(model, classes[:1], method="csd", window=4, seed=seed)  # warm caches and allocator
    out: dict[int, dict[int, float]] = {}
    for rows in batches:
        conditions = [classes[i % len(classes)] for i in range(rows)]
        # a batch size's first call pays for its buffers (the static session's cache, allocator growth):
        # at 16 images a first width-1 call measured 153 ms per iteration where the next took about 35
        csdgen.generate(model, conditions, method="csd", window=widths[0], seed=seed)
        for width in widths:
            best = float("inf")
            for _ in range(repeats):  # the fastest of the repeats: pauses of the machine are not the width's cost
                t = time.perf_counter()
                result = csdgen.generate(model, conditions, method="csd", window=width, seed=seed)
                best = min(best, (time.perf_counter() - t) / max(len(result.widths), 1))
            out.setdefault(rows, {})[width] = best
        print(f"times at {rows} images: " + ", ".join(f"{w}: {1000 * s:.1f} ms" for w, s in out[rows].items()),
              flush=True)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", type=Path, required=True)
    p.add_argument("--images", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--total", type=float, default=256.0, help="reached drafts the stored counts are scaled to")
    p.add_argument("--seed", type=int, default=1000, help="run seed (not the seeds users start from)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", default="1,8", help="batch sizes whose seconds per iteration are recorded")
    p.add_argument("--widths", default="1,4,16,32", help="windows whose seconds per iteration are recorded")
    p.add_argument("--wide-margin", type=float, default=0.3,
                   help="share of predicted speed traded for step compression in near ties (csdgen.engine.window."
                        "prior_wide_margin), written with the prior")
    p.add_argument("--repeats", type=int, default=1, help="timed calls per batch size and width; the fastest is kept")
    p.add_argument("--times-only", action="store_true",
                   help="record the seconds per iteration of --batches only and add them to the shipped prior "
                        "(its acceptance counts and other batch sizes kept)")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_builtin_model(args.weights)
    shipped = model.auto_window_prior or {}
    model.auto_window_prior = None  # record from the process's own runs only
    times = record_times(model, tuple(int(b) for b in args.batches.split(",")),
                         tuple(int(w) for w in args.widths.split(",")), args.seed, args.repeats)
    command = "python benchmarks/builtin_auto_prior.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.times_only:
        guided = {**(shipped.get("times") or {}).get("guided", {}), **{str(r): {str(w): s for w, s in by.items()}
                                                                     for r, by in times.items()}}
        path = args.weights / "config.json"
        config = read_json(path)
        old = config.get("auto_window_prior") or {}
        how = (f"{old.get('how', '')}; seconds per iteration for {args.batches} images added by {command} "
               f"({platform.machine()}, {args.threads} threads, torch {torch.__version__})")
        print(how)
        if args.write:
            config["auto_window_prior"] = {**old, "how": how, "times": {**(old.get("times") or {}), "guided": guided}}
            write_json(config, path)
            print(f"wrote the times into {path}")
        return config.get("auto_window_prior")
    prior = {"times": {"guided": times}}
    for method, refresh in METHODS:
        got = record(model, method, refresh, args.images, args.batch, args.seed)
        scale = args.total / max(got["reached"].sum(), 1e-9)
        rate = 1 - got["rejected"].sum() / max(got["reached"].sum(), 1e-9)
        prior[f"{method}/{refresh}"] = {"reached": (got["reached"] * scale).round(3).tolist(),
                                        "rejected": (got["rejected"] * scale).round(3).tolist()}
        print(f"{method}/{refresh}: pass rate over the kept counts {rate:.3f}", flush=True)
    how = (f"seconds per iteration of CSD at fixed windows {args.widths} for {args.batches} images; "
           f"acceptance counts window='auto' kept after {args.images} images per method (batches of {args.batch}, "
           f"seed {args.seed}, the model's defaults), scaled to {args.total:g} reached drafts; {command}; "
           f"{platform.machine()}, {args.threads} threads, torch {torch.__version__}")
    print(how)
    if args.write:
        path = args.weights / "config.json"
        config = read_json(path)
        config["auto_window_prior"] = {"how": how, "wide_margin": args.wide_margin, **prior}
        write_json(config, path)
        print(f"wrote auto_window_prior into {path}")
    return prior


if __name__ == "__main__":
    main()
