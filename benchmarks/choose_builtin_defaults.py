"""Measure the settings that choose the built-in model's defaults; print one Markdown table.

    python benchmarks/choose_builtin_defaults.py --images 64 --out runs/defaults > docs/builtin-defaults-table.md

1. AR quality against guidance scale, temperature and top-k (class consistency, Frechet
   distance, NLL), with AR at a second seed as the noise floor;
2. at the chosen sampling settings, CSD's step compression and quality against lambda,
   delta and the window, next to SJD.

The images' classes are spread over all the model's classes and categories
(:meth:`csdgen.class_names.ClassNames.spread`, the order ``csdgen compare`` and ``bench`` use;
the built-in model's first classes in turn would all be faces), the same for every row. Runs
are cached under ``--out`` (rerunning resumes).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from csdgen.acceptance import CSD
from csdgen.evaluation.compare import score_run, to_markdown
from csdgen.runs import run_method
from csdgen.evaluation.quality import QualityScorer
from csdgen.models.builtin import load_builtin_model
from csdgen.sampling import SamplingConfig


def measure(model, scorer, classes, out, name, preset, sampling, window, seed=0, batch_size=16):
    run = run_method(model, name, preset, classes, seed=seed, batch_size=batch_size, window=window,
                     sampling=sampling, out_dir=out)
    scores, _ = score_run(model, scorer, run, classes)
    return {"setting": name, "step_compression": sum(run.compression) / len(run.compression),
            "latency_s_per_image": run.seconds / len(classes), **scores}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("runs/defaults"))
    parser.add_argument("--weights", type=Path, default=None, help="built-in weights folder (default: the shipped ones)")
    parser.add_argument("--guidance", type=float, default=None, help="skip part 1 and use this guidance scale")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (1 when the machine is shared)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # oversubscribed threads are much slower
    args.out.mkdir(parents=True, exist_ok=True)
    model = load_builtin_model(args.weights)
    scorer = QualityScorer(model)
    classes = model.classes.spread(args.images)
    print(f"{args.images} images over {len(set(classes))} classes of {model.num_classes} "
          f"({len({model.classes.categories[c] for c in classes}) if model.classes.categories else '?'} categories), "
          f"codebook {model.codebook_size}, threads {torch.get_num_threads()}\n")
    rows = []
    ar = {"method": "ar"}
    if args.guidance is None:
        for g in (1.0, 2.0, 3.0, 5.0, 7.0, 10.0):
            rows.append(measure(model, scorer, classes, args.out, f"ar_g{g}", ar, SamplingConfig(guidance_scale=g), 1))
        rows.append(measure(model, scorer, classes, args.out, "ar_g3.0_seed2", ar, SamplingConfig(guidance_scale=3.0), 1, seed=1))
        for t in (0.9,):
            rows.append(measure(model, scorer, classes, args.out, f"ar_g3.0_T{t}", ar, SamplingConfig(guidance_scale=3.0, temperature=t), 1))
        for k in (64, 256):  # of a codebook of model.codebook_size
            rows.append(measure(model, scorer, classes, args.out, f"ar_g3.0_topk{k}", ar, SamplingConfig(guidance_scale=3.0, top_k=k), 1))
        print(to_markdown(rows))
        rows = []
    g = args.guidance or 3.0
    sampling = SamplingConfig(guidance_scale=g)
    rows.append(measure(model, scorer, classes, args.out, f"ar_g{g}", ar, sampling, 1))
    rows.append(measure(model, scorer, classes, args.out, f"ar_g{g}_seed2", ar, sampling, 1, seed=1))
    rows.append(measure(model, scorer, classes, args.out, f"sjd_g{g}_W16", {"method": "sjd"}, sampling, 16))
    for lam, delta in ((0.1, 0.65), (0.25, 0.65), (0.5, 0.65), (1.0, 0.65), (0.5, 0.5), (0.5, 0.8)):
        rows.append(measure(model, scorer, classes, args.out, f"csd_g{g}_W16_lam{lam}_delta{delta}",
                            {"method": CSD(lam=lam, delta=delta)}, sampling, 16))
    for window in (8, 32):
        rows.append(measure(model, scorer, classes, args.out, f"csd_g{g}_W{window}_lam0.5_delta0.65",
                            {"method": CSD()}, sampling, window))
    print(to_markdown(rows))


if __name__ == "__main__":
    main()
