"""Everything docs/builtin.md needs from a trained built-in model, in one command.

    python benchmarks/builtin_report.py --weights csdgen/builtin/weights --out runs/builtin_report \
        --images 64 --threads 2 --docs docs

Given a weights folder (train.py's ``--out``), it writes into ``--out``:

1. ``bench/``: ``csdgen bench`` on the model (``--images`` classes spread over the categories,
   :meth:`csdgen.class_names.ClassNames.spread`; one image per class, method and seed at batch
   size 1; methods AR, SJD, coupled SJD and CSD at the model's defaults and a fixed window; AR
   also at seed 1, the noise floor); resumable like bench (rerun the same command). Its
   ``report.md`` holds the full table and the texture/entropy tables (:mod:`csdgen.evaluation.texture`).
2. **Class consistency** of every row, from bench's PNGs: the classifier's **top-1 agreement**
   with the requested class (the measure of train.py's ``classifier_agreement`` and of issue
   19's "at least 0.8") and the mean probability of the requested class
   (:meth:`csdgen.evaluation.quality.QualityScorer.class_consistency`). A method is **inside
   the noise floor** when its gap to AR at the primary seed is at most the gap between AR at
   the two seeds (the AR noise floor of docs/builtin.md; a gap this small is not a measured
   difference).
3. **Step compression** of SJD, coupled SJD and CSD (mean over images of 256 / forwards).
4. **Entropy against texture**: per method, the Spearman rank correlation of target entropy
   with local texture (pooled over tokens, and within images), the share of relaxed tokens by
   texture quartile (1 = flattest), and whether flat regions are where CSD gains (the CSD
   paper's premise: relaxed share of the flattest quartile above that of the most textured).
5. ``builtin_grid.png``: real emoji, then AR and CSD per grid seed, for ``--grid-classes``
   (default: train.py's 20 showcase classes; at least 16 are needed for the docs), class names
   under the images (``benchmarks/builtin_grid.py``).
6. ``builtin_report.json`` (every figure above, and train.py's ``metrics.json``) and
   ``builtin_report.md`` (tables ready for docs/builtin.md, with the command, machine and
   thread count). With ``--docs DIR`` the grid is also copied to ``DIR/builtin_grid.png``.

Wall times under a shared CPU are noisy; steps, step compression and the scores are exact for
the seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from builtin_grid import grid, grid_classes, sample_rows, settings_line  # noqa: E402

from csdgen import cli  # noqa: E402
from csdgen.evaluation.quality import QualityScorer  # noqa: E402
from csdgen.evaluation.report import row_key  # noqa: E402
from csdgen.models.builtin import load_builtin_model  # noqa: E402
from csdgen.runs import write_json  # noqa: E402

METHODS = ("ar", "sjd", "sjd-coupled", "csd")


def run_bench(weights: Path, out: Path, images: int, window: int | None) -> Path:
    """``csdgen bench`` into ``out`` (resumes); returns ``out``. Raises RuntimeError if bench failed."""
    argv = ["bench", "--weights", str(weights), "--out", str(out), "--limit", str(images),
            "--methods", ",".join(METHODS)]
    if window is not None:
        argv += ["--window", str(window)]
    if cli.main(argv) != 0:
        raise RuntimeError(f"csdgen {' '.join(argv)} failed (its message is above)")
    return out


def _png(path: Path) -> torch.Tensor:
    """``[3, H, W]`` float in [-1, 1] of a PNG."""
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32)
    return torch.from_numpy(pixels).permute(2, 0, 1) / 127.5 - 1


def class_scores(model, bench_out: Path, batch: int = 64) -> dict[str, dict]:
    """Per bench row (``method`` or ``method@seedS``): images, top-1 agreement, mean p(class),
    mean step compression, mean NLL; rows in the records' order."""
    scorer = QualityScorer(model)
    records = [json.loads(line) for line in (bench_out / "records.jsonl").read_text().splitlines() if line.strip()]
    primary = min(r["seed"] for r in records)
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(row_key(r["method"], r["seed"], primary), []).append(r)
    rows = {}
    for name, group in groups.items():
        top1, probs = [], []
        for i in range(0, len(group), batch):
            chunk = group[i:i + batch]
            images = torch.stack([_png(bench_out / r["image"]) for r in chunk])
            names = [r["prompt"] for r in chunk]
            top1.append(scorer.class_agreement(images, names))
            probs.append(scorer.class_consistency(images, names))
        rows[name] = {"images": len(group),
                      "top1_agreement": float(torch.cat(top1).float().mean()),
                      "class_probability": float(torch.cat(probs).mean()),
                      "step_compression": sum(r["step_compression"] for r in group) / len(group),
                      "nll": sum(r["nll"] for r in group) / len(group) if all(r.get("nll") is not None for r in group) else None,
                      "window": group[0]["settings"].get("window")}
    return rows


def noise_floor(rows: dict[str, dict], key: str) -> dict:
    """AR's gap between its two seeds on ``key`` and, per other method, its gap to AR and whether
    it lies inside that gap. Empty if AR lacks a second seed."""
    floor_rows = [n for n in rows if n.startswith("ar@")]
    if "ar" not in rows or not floor_rows:
        return {}
    ar = rows["ar"][key]
    floor = abs(rows[floor_rows[0]][key] - ar)
    return {"floor_row": floor_rows[0], "ar_gap": floor,
            "methods": {n: {"gap": rows[n][key] - ar, "inside": abs(rows[n][key] - ar) <= floor}
                        for n in rows if n.split("@")[0] != "ar"}}


def texture_evidence(bench_out: Path) -> dict[str, dict]:
    """From bench's texture.csv: per method, Spearman(entropy, texture) and the relaxed / accepted
    shares by texture quartile (1 = flattest), and whether the flattest quartile relaxes more
    tokens than the most textured (the CSD paper's premise)."""
    import csv

    path = bench_out / "texture.csv"
    if not path.is_file():
        return {}
    out: dict[str, dict] = {}
    for row in csv.DictReader(path.open()):
        m = out.setdefault(row["method"], {"spearman_pooled": float(row["spearman_pooled"]),
                                           "spearman_within_image": float(row["spearman_within_image"]),
                                           "relaxed_by_texture": [], "accepted_by_texture": [],
                                           "entropy_by_texture": []})
        if row["by"] == "texture":
            m["relaxed_by_texture"].append(float(row["relaxed"]))
            m["accepted_by_texture"].append(float(row["accepted"]))
            m["entropy_by_texture"].append(float(row["mean_entropy_nats"]))
    for m in out.values():
        relaxed = m["relaxed_by_texture"]
        m["flat_relaxes_more"] = bool(relaxed and relaxed[0] > relaxed[-1])
    return out


def metrics_table(metrics: dict) -> list[str]:
    """docs/builtin.md's "What it learned" table from train.py's metrics.json."""
    vq, ar, cls, samples = (metrics.get(k, {}) for k in ("vq", "ar", "classifier", "samples"))

    def f(value, fmt):
        return "n/a" if value is None else fmt.format(value)

    return ["| measure | value |", "|---|---|",
            f"| held-out NLL per token, true class | {f(ar.get('heldout_nll_per_token_cond'), '{:.3f}')} nats "
            f"(ln 1024 = {f(ar.get('ln_codebook_size'), '{:.2f}')}) |",
            f"| held-out NLL per token, null class | {f(ar.get('heldout_nll_per_token_uncond'), '{:.3f}')} nats |",
            f"| tokenizer PSNR on held-out views | {f(vq.get('heldout_psnr_db'), '{:.2f}')} dB |",
            f"| codebook usage (train / held-out), perplexity | {vq.get('codebook_usage_train', 'n/a')} / "
            f"{vq.get('codebook_usage_heldout', 'n/a')} of 1024, {f(vq.get('codebook_perplexity_train'), '{:.1f}')} |",
            f"| classifier held-out accuracy (real views / VQ reconstructions) | "
            f"{f(cls.get('heldout_accuracy'), '{:.3f}')} / {f(cls.get('heldout_accuracy_vq_reconstructions'), '{:.3f}')} "
            f"({cls.get('n_heldout', 'n/a')} views) |",
            f"| classifier agrees with the requested class on AR samples (guidance {samples.get('guidance', 'n/a')}, "
            f"{samples.get('n', 'n/a')} samples) | {f(samples.get('classifier_agreement'), '{:.3f}')} |"]


def markdown(report: dict) -> str:
    rows, floor, texture = report["rows"], report["noise_floor"], report["texture"]
    md = ["# Built-in model report", "",
          f"- Command: `{report['command']}`",
          f"- Weights: `{report['weights']}`; machine: {report['machine']}; torch threads {report['threads']}.",
          f"- {report['images']} classes spread over the categories, one image per class, method and seed, batch size 1; "
          "AR at the second seed is the noise floor. Wall times (bench/report.md) were taken on a shared CPU.", "",
          "## What it learned (train.py's metrics.json)", "", *metrics_table(report["train_metrics"]), "",
          "## Class consistency and step compression", "",
          "| row | images | window | step compression | top-1 agreement | p(class) | NLL (nats/token) | inside AR noise floor (top-1) |",
          "|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        inside = floor.get("methods", {}).get(name)
        cell = "" if inside is None else f"{'yes' if inside['inside'] else 'no'} ({inside['gap']:+.3f})"
        nll = "n/a" if r["nll"] is None else f"{r['nll']:.3f}"
        md.append(f"| {name} | {r['images']} | {r['window']} | {r['step_compression']:.2f} | {r['top1_agreement']:.3f} | "
                  f"{r['class_probability']:.3f} | {nll} | {cell} |")
    if floor:
        md += ["", f"AR noise floor on top-1 agreement: |ar - {floor['floor_row']}| = {floor['ar_gap']:.3f}."]
    md += ["", "## Entropy against texture", "",
           "| method | Spearman pooled | Spearman within images | relaxed share by texture quartile (1 flattest .. 4) | flat regions relax more |",
           "|---|---|---|---|---|"]
    for name, t in texture.items():
        shares = " / ".join(f"{s:.1%}" for s in t["relaxed_by_texture"])
        md.append(f"| {name} | {t['spearman_pooled']:+.2f} | {t['spearman_within_image']:+.2f} | {shares} | "
                  f"{'yes' if t['flat_relaxes_more'] else 'no'} |")
    g = report["grid"]
    md += ["", "## Samples", "", f"![samples]({Path(g['path']).name})", "",
           f"{g['classes']} classes; rows: real emoji, then AR and CSD per seed ({', '.join(map(str, g['seeds']))}); "
           f"{g['settings']}; step compression per row: "
           + ", ".join(f"{s['method']} seed {s['seed']} {s['step_compression']:.2f}" for s in g["rows"]) + "."]
    return "\n".join(md) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", type=Path, required=True, help="built-in weights folder (train.py's --out)")
    parser.add_argument("--out", type=Path, default=Path("runs/builtin_report"))
    parser.add_argument("--images", type=int, default=64, help="classes (one image per method and seed) for bench")
    parser.add_argument("--window", type=int, default=None, help="fixed window of SJD/CSD (default: the model's)")
    parser.add_argument("--grid-classes", default=None,
                        help="comma-separated class names for the grid (default: train.py's 20 showcase classes)")
    parser.add_argument("--grid-seeds", default="0,1", help="comma-separated seeds of the grid's AR and CSD rows")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (1 when the machine is shared)")
    parser.add_argument("--docs", type=Path, default=None, help="also copy the grid to DOCS/builtin_grid.png")
    args = parser.parse_args(argv)
    if args.images < 2:
        parser.error(f"--images {args.images}: need at least 2 (the Frechet distance of bench needs 2 per row)")
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    model = load_builtin_model(args.weights)
    try:  # a bad class name fails in one line before anything is generated
        classes = grid_classes(model, args.grid_classes)
    except ValueError as exc:
        parser.error(f"--grid-classes: {exc}")
    bench_out = run_bench(args.weights, args.out / "bench", args.images, args.window)
    rows = class_scores(model, bench_out)
    seeds = [int(s) for s in args.grid_seeds.split(",") if s.strip()]
    grid_rows, grid_stats = sample_rows(model, classes, seeds, args.window)
    grid_path = args.out / "builtin_grid.png"
    grid(grid_rows, [model.class_names[c] for c in classes]).save(grid_path)
    if len(classes) < 16:
        print(f"note: the grid has {len(classes)} classes; docs/builtin.md needs at least 16 (--grid-classes)")
    metrics_path = args.weights / "metrics.json"
    report = {
        "command": "python benchmarks/builtin_report.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "weights": str(args.weights), "machine": f"{platform.machine()} {os.cpu_count()} CPUs ({platform.platform()})",
        "threads": torch.get_num_threads(), "images": args.images,
        "train_metrics": json.loads(metrics_path.read_text()) if metrics_path.is_file() else {},
        "rows": rows, "noise_floor": noise_floor(rows, "top1_agreement"),
        "noise_floor_class_probability": noise_floor(rows, "class_probability"),
        "texture": texture_evidence(bench_out),
        "grid": {"path": str(grid_path), "classes": len(classes), "names": [model.class_names[c] for c in classes],
                 "seeds": seeds, "settings": settings_line(model, args.window, torch.get_num_threads()),
                 "rows": grid_stats},
    }
    write_json(report, args.out / "builtin_report.json")
    text = markdown(report)
    (args.out / "builtin_report.md").write_text(text)
    if args.docs is not None:
        args.docs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(grid_path, args.docs / "builtin_grid.png")
    print(text)
    print(f"Wrote {args.out}/builtin_report.md, builtin_report.json, builtin_grid.png and bench/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
