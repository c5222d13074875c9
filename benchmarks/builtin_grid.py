"""The built-in model's sample grid for docs/builtin.md: real emoji, AR and CSD samples, names below.

    python benchmarks/builtin_grid.py --out docs/builtin_grid.png [--weights DIR] [--seeds 0,1]

One column per class (default: train.py's 20 showcase classes, "red apple", "dog face", ...);
rows: the real emoji (its base image on white, from the npm package, see csdgen/builtin/emoji.py),
then per seed an AR sample and a CSD sample (the model's defaults: guidance, temperature, lambda,
delta; a fixed window, ``--window``, default the model's), each 64 x 64 image upscaled x2 by
nearest neighbour, the class name under each column and the row's method on the left. Prints
the settings and each method's mean step compression, for the figure's caption.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

import csdgen
from csdgen.builtin.train import SHOWCASE
from csdgen.evaluation.maps import to_uint8
from csdgen.models.builtin import load_builtin_model

CELL = 128  # pixels per image (64 x 64, x2)
LABEL_W = 56  # left column with the row labels
NAME_H = 30  # two lines of class name under each column


def real_images(model, classes: list[int]) -> np.ndarray:
    """uint8 [len(classes), 64, 64, 3]: each class's base emoji on white (first image of the class)."""
    from csdgen.builtin.emoji import load_emoji

    data = load_emoji(variants=False)
    missing = [n for n in model.class_names if n not in data.names]
    if missing:  # the model's classes are the package's emoji, or a subset of them
        raise ValueError(f"classes of the model that are not emoji of the package: {missing[:3]}; run "
                         "python -m csdgen.builtin.emoji --update-config on the weights")
    return data.images[[data.names.index(model.class_names[c]) for c in classes]]


def grid(rows: list[tuple[str, np.ndarray]], names: list[str]) -> Image.Image:
    """rows: (label, uint8 [C, H, W, 3]) -> one PNG-ready image with labels and names."""
    cols = len(names)
    img = Image.new("RGB", (LABEL_W + cols * CELL, len(rows) * CELL + NAME_H), "white")
    draw = ImageDraw.Draw(img)
    for r, (label, pixels) in enumerate(rows):
        for k, line in enumerate(label.split("\n")):
            draw.text((4, r * CELL + CELL // 2 - 12 + 12 * k), line, fill=(0, 0, 0))
        for c in range(cols):
            tile = Image.fromarray(pixels[c]).resize((CELL, CELL), Image.NEAREST)
            img.paste(tile, (LABEL_W + c * CELL, r * CELL))
    for c, name in enumerate(names):
        for k, line in enumerate(textwrap.wrap(name, 21)[:2]):
            draw.text((LABEL_W + c * CELL + 3, len(rows) * CELL + 3 + 12 * k), line, fill=(0, 0, 0))
    return img


def grid_classes(model, names: str | None = None) -> list[int]:
    """Class indices of the grid: ``names`` (comma-separated, as ``--class`` splits them), or
    train.py's showcase classes the model has."""
    if names is None:
        return [model.classes.index(n) for n in SHOWCASE if model.classes.find(n) is not None]
    return model.classes.resolve(model.classes.split(names))


def sample_rows(model, classes: list[int], seeds: list[int], window: int | None = None,
                real: np.ndarray | None = None) -> tuple[list[tuple[str, np.ndarray]], list[dict]]:
    """The grid's rows: the real emoji (``real``, default :func:`real_images`), then per seed an AR
    and a CSD row at the model's defaults (CSD at the fixed ``window``, default the model's).

    Returns:
        ``(rows, stats)``: rows as :func:`grid` takes them; stats one dict per sampled row
        (``method``, ``seed``, ``window``, ``step_compression``: mean over the row's images).
    """
    d = model.defaults
    window = window or d.window
    sampling = csdgen.SamplingConfig(guidance_scale=d.guidance_scale, temperature=d.temperature, top_k=d.top_k,
                                     top_p=d.top_p)
    rows = [("real", real_images(model, classes) if real is None else real)]
    stats = []
    for seed in seeds:
        for label, method, w in (("AR", "ar", 1), ("CSD", csdgen.CSD(lam=d.lam, delta=d.delta), window)):
            result = csdgen.generate(model, classes, method=method, window=w, sampling=sampling, seed=seed)
            images = torch.cat([model.decode_images(result.tokens[i:i + 1]) for i in range(len(classes))])
            rows.append((f"{label}\nseed {seed}", to_uint8(images)))
            stats.append({"method": label, "seed": seed, "window": w,
                          "step_compression": sum(s.step_compression for s in result.images) / len(result.images)})
    return rows, stats


def settings_line(model, window: int | None, threads: int) -> str:
    """The sampling settings of the grid, for its caption."""
    d = model.defaults
    return (f"guidance {d.guidance_scale}, temperature {d.temperature}, top-k {d.top_k}, CSD lambda {d.lam} "
            f"delta {d.delta} window {window or d.window}; torch threads {threads}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/builtin_grid.png"))
    parser.add_argument("--weights", type=Path, default=None, help="built-in weights folder (default: the shipped ones)")
    parser.add_argument("--classes", default=None,
                        help="comma-separated class names (default: train.py's 20 showcase classes)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds: one AR and one CSD row each (default 0)")
    parser.add_argument("--window", type=int, default=None, help="CSD's fixed window (default: the model's)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = load_builtin_model(args.weights)
    classes = grid_classes(model, args.classes)
    rows, stats = sample_rows(model, classes, [int(s) for s in args.seeds.split(",") if s.strip()], args.window)
    for s in stats:
        print(f"{s['method']} seed {s['seed']}: window {s['window']}, mean step compression {s['step_compression']:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    grid(rows, [model.class_names[c] for c in classes]).save(args.out)
    print(f"{len(classes)} classes; {settings_line(model, args.window, args.threads)}; wrote {args.out}")

if __name__ == "__main__":
    main()
