"""Draft trees on the built-in model: SJD, coupled SJD, trees over a K x D grid, CSD with and without a tree.

Not a test: it times, scores and prints. Run from the project root:

    python benchmarks/bench_trees.py                          # batch 1 (8 images) and 16 (64 images)
    python benchmarks/bench_trees.py --grid 2x2,3x2 --images-b1 4 --images-b16 32

For every batch size and setting: step compression (mean over images of N / forwards), wall
seconds per image (device synchronised, whole ``generate`` calls), the wall speed-up over AR at
the same batch size, and at batch 16 the quality scores of ``csdgen.evaluation.quality``
(class consistency, Frechet distance of classifier features, NLL) with the AR-vs-AR noise floor
(AR at a second seed). Settings are interleaved: every chunk of images runs every setting in
turn, so a shared machine slows them alike. Guidance 3, temperature 1, uniform draft
initialisation, a fixed window (default 32 main-path slots; a tree adds its side nodes).
Writes a JSON record (``--out``) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import csdgen
from csdgen.sampling import SamplingConfig


def settings(grid: list[tuple[int, int]], csd_tree: tuple[int, int]) -> list[tuple[str, dict]]:
    rows = [("ar", {"method": "ar"}), ("ar, seed 2 (noise floor)", {"method": "ar", "seed": 1}),
            # the refresh named in every row: generate's default for SJD is the coupled one
            ("sjd", {"method": "sjd", "refresh": "independent"}), ("sjd coupled", {"method": "sjd", "refresh": "coupled"})]
    rows += [(f"sjd coupled + tree {k}x{d}", {"method": "sjd", "refresh": "coupled", "tree": (k, d)}) for k, d in grid]
    rows += [("csd coupled", {"method": "csd", "refresh": "coupled"}),
             (f"csd coupled + tree {csd_tree[0]}x{csd_tree[1]}", {"method": "csd", "refresh": "coupled", "tree": csd_tree})]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", default="2x2,3x2,4x2,3x3,8x1", help="tree shapes KxD, comma-separated")
    parser.add_argument("--csd-tree", default="3x2")
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--images-b1", type=int, default=8, help="images at batch 1 (timing)")
    parser.add_argument("--images-b16", type=int, default=64, help="images at batch 16 (timing and quality)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/bench_trees.json"))
    args = parser.parse_args()

    def shape(text: str, option: str) -> tuple[int, int]:
        try:
            k, d = (int(v) for v in text.split("x"))
        except ValueError:
            parser.error(f"{option} {text!r}: allowed KxD, two integers >= 1 (e.g. 3x2)")
        if k < 1 or d < 1:
            parser.error(f"{option} {text!r}: allowed KxD, two integers >= 1 (e.g. 3x2)")
        return k, d

    grid = [shape(s, "--grid") for s in args.grid.split(",")]
    csd_tree = shape(args.csd_tree, "--csd-tree")
    if args.images_b16 < 2 or args.images_b1 < 1 or args.window < 1:  # the Frechet distance needs two images
        parser.error(f"--images-b1 {args.images_b1}, --images-b16 {args.images_b16}, --window {args.window}: allowed "
                     f"--images-b1 >= 1, --images-b16 >= 2 (the Frechet distance needs two images), --window >= 1")
    torch.set_num_threads(args.threads)
    from csdgen.evaluation.quality import QualityScorer
    from csdgen.models.builtin import load_builtin_model

    model = load_builtin_model()
    scorer = QualityScorer(model)
    sampling = SamplingConfig(guidance_scale=3.0, temperature=1.0)
    configs = settings(grid, csd_tree)
    plan = {1: args.images_b1, 16: args.images_b16}
    results = {(b, name): {"tokens": [], "seconds": 0.0, "compression": []} for b in plan for name, _ in configs}
    csdgen.generate(model, [0, 1], method="sjd", window=4, tree=(2, 1), sampling=sampling)  # warm-up
    for batch, total in plan.items():
        for first in range(0, total, batch):
            indices = list(range(first, min(first + batch, total)))
            classes = model.classes.spread(len(indices), offset=indices[0])  # spread over the categories
            for name, kw in configs:
                kw = dict(kw)
                seed = kw.pop("seed", 0)
                began = time.perf_counter()
                out = csdgen.generate(model, classes, window=args.window, sampling=sampling, seed=seed, draft_init="uniform",
                                      image_indices=indices, **kw)
                record = results[(batch, name)]
                record["seconds"] += time.perf_counter() - began
                record["tokens"].append(out.tokens.cpu())
                record["compression"] += [s.step_compression for s in out.images]
                if "tree" in kw:
                    record.setdefault("tree", []).extend(s.tree_summary() for s in out.images)
            print(f"batch {batch}: images {indices[0]}..{indices[-1]} done", flush=True)
    table, record_out = [], []
    for batch, total in plan.items():
        classes = model.classes.spread(total)
        ar_seconds = results[(batch, "ar")]["seconds"]
        for name, _ in configs:
            r = results[(batch, name)]
            row = {"batch": batch, "setting": name, "images": total,
                   "step_compression": sum(r["compression"]) / len(r["compression"]),
                   "seconds_per_image": r["seconds"] / total, "speedup_vs_ar": ar_seconds / r["seconds"]}
            if "tree" in r:
                n = len(r["tree"])
                D = len(r["tree"][0]["tokens_per_level"])
                row["tokens_per_level_per_image"] = [sum(t["tokens_per_level"][d] for t in r["tree"]) / n for d in range(D)]
                row["side_tokens_per_image"] = sum(t["side_tokens"] for t in r["tree"]) / n
            if batch == 16:
                tokens = torch.cat(r["tokens"])
                images = torch.cat([model.decode_images(t) for t in tokens.split(16)])
                row["class_consistency"] = float(scorer.class_consistency(images, classes).mean())
                row["frechet_distance"] = float(scorer.frechet_distance(images))
                row["nll"] = float(scorer.nll(tokens, classes).mean())
            record_out.append(row)
            q = (f" | {row['class_consistency']:.3f} | {row['frechet_distance']:.1f} | {row['nll']:.3f}" if batch == 16
                 else " | | | ")
            table.append(f"| {batch} | {name} | {row['step_compression']:.2f} | {row['seconds_per_image']:.3f} | "
                         f"{row['speedup_vs_ar']:.2f}{q} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"window": args.window, "sampling": "guidance 3, temperature 1", "rows": record_out}, indent=1))
    tmp.replace(args.out)
    print("| batch | setting | step compression | s/image | wall speed-up vs AR | class consistency | Frechet distance | NLL |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(table))


if __name__ == "__main__":
    main()
