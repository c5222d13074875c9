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
import json
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


def record_times(model, batches: tuple[int, ...], widths: tuple[int, ...], seed: int) -> dict:
    """Seconds per iteration (wall time of a whole ``generate`` call over its iterations, model loaded
    and warmed) of CSD at each fixed window in ``widths`` for each batch size in ``batches``, guided
    (the model's defaults): ``{images: {width: seconds}}``."""
    classes = model.default_classes or list(range(model.num_classes))
    csdgen.generate(model, classes[:1], method="csd", window=4, seed=seed)  # warm caches and allocator
    out: dict[int, dict[int, float]] = {}
    for rows in batches:
        for width in widths:
            t = time.perf_counter()
            result = csdgen.generate(model, [classes[i % len(classes)] for i in range(rows)], method="csd",
                                     window=width, seed=seed)
            out.setdefault(rows, {})[width] = (time.perf_counter() - t) / max(len(result.widths), 1)
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
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_builtin_model(args.weights)
    model.auto_window_prior = None  # record from the process's own runs only
    prior = {"times": {"guided": record_times(model, tuple(int(b) for b in args.batches.split(",")),
                                              tuple(int(w) for w in args.widths.split(",")), args.seed)}}
    for method, refresh in METHODS:
        got = record(model, method, refresh, args.images, args.batch, args.seed)
        scale = args.total / max(got["reached"].sum(), 1e-9)
        rate = 1 - got["rejected"].sum() / max(got["reached"].sum(), 1e-9)
        prior[f"{method}/{refresh}"] = {"reached": (got["reached"] * scale).round(3).tolist(),
                                        "rejected": (got["rejected"] * scale).round(3).tolist()}
        print(f"{method}/{refresh}: pass rate over the kept counts {rate:.3f}", flush=True)
    command = "python benchmarks/builtin_auto_prior.py " + " ".join(sys.argv[1:] if argv is None else argv)
    how = (f"seconds per iteration of CSD at fixed windows {args.widths} for {args.batches} images; "
           f"acceptance counts window='auto' kept after {args.images} images per method (batches of {args.batch}, "
           f"seed {args.seed}, the model's defaults), scaled to {args.total:g} reached drafts; {command}; "
           f"{platform.machine()}, {args.threads} threads, torch {torch.__version__}")
    print(how)
    if args.write:
        path = args.weights / "config.json"
        config = read_json(path)
        config["auto_window_prior"] = {"how": how, **prior}
        write_json(config, path)
        print(f"wrote auto_window_prior into {path}")
    return prior


if __name__ == "__main__":
    main()
