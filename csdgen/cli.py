"""The ``csdgen`` command: ``generate`` images with CSD (or another method), ``compare`` methods.

Only this module prints. Errors a user can fix end the command with exit status 2 and one
line naming the bad value and what is allowed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from csdgen.acceptance import make_rule
from csdgen.decoding import METHODS
from csdgen.drafting import DRAFT_INITS, REFRESH_MODES
from csdgen.evaluation.sweep import SweepGrid
from csdgen.sampling import SamplingConfig

#: defaults of the built-in model, chosen by measurement (docs/builtin-defaults.md)
BUILTIN_DEFAULTS = {"guidance_scale": 3.0, "temperature": 1.0, "top_k": None, "window": 16, "lam": 0.5, "delta": 0.65}


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be an integer >= 1")
    return value


def _classes(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]


def _add_model_and_sampling(p: argparse.ArgumentParser) -> None:
    d = BUILTIN_DEFAULTS
    p.add_argument("--weights", default=None, help="built-in model weights folder (default: shipped with csdgen)")
    p.add_argument("--class", dest="classes", type=_classes, action="extend", default=None,
                   help="class names or indices, comma-separated or repeated (default: every class in turn)")
    p.add_argument("-n", "--num-images", type=_count, default=8, help="number of images (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=_count, default=d["window"], help=f"Jacobi window W (default {d['window']})")
    p.add_argument("--lam", type=float, default=d["lam"], help=f"CSD lambda (default {d['lam']})")
    p.add_argument("--delta", type=float, default=d["delta"], help=f"CSD TV threshold (default {d['delta']})")
    p.add_argument("--entropy-unit", choices=["nats", "normalized"], default="nats")
    p.add_argument("--addition-c", type=float, default=0.2, help="constant of the Addition rule")
    p.add_argument("--guidance-scale", type=float, default=d["guidance_scale"])
    p.add_argument("--temperature", type=float, default=d["temperature"], help="0 = greedy")
    p.add_argument("--top-k", type=int, default=d["top_k"])
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--draft-init", choices=DRAFT_INITS, default="uniform")
    p.add_argument("--batch-size", type=_count, default=8)
    p.add_argument("--out", type=Path, default=Path("outputs"), help="output folder (default ./outputs)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="csdgen", description="Fast AR image generation with content-aware speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate images (default: CSD on the built-in model)")
    _add_model_and_sampling(gen)
    gen.add_argument("--method", choices=METHODS, default="csd")
    gen.add_argument("--refresh", choices=REFRESH_MODES, default="independent")
    gen.add_argument("--no-maps", action="store_true", help="do not write acceptance maps")
    cmp_ = sub.add_parser("compare", help="AR, SJD, CSD and the other methods on the same classes and seeds")
    _add_model_and_sampling(cmp_)
    cmp_.set_defaults(num_images=64, batch_size=16, out=Path("compare"))
    cmp_.add_argument("--methods", type=_classes, default=None, help="comma-separated (default: all)")
    sw = sub.add_parser("sweep", help="every method over its parameter: table and speed-quality frontier plot",
                        conflict_handler="resolve")  # --addition-c becomes a list here
    _add_model_and_sampling(sw)
    sw.set_defaults(num_images=64, batch_size=16, out=Path("sweep"))
    grid = SweepGrid()
    for name, kind in (("csd_lam", float), ("csd_delta", float), ("addition_c", float), ("gsd_radius", int),
                       ("lantern_delta", float), ("windows", int)):
        sw.add_argument("--" + name.replace("_", "-"), type=_numbers(kind), default=getattr(grid, name),
                        help=f"comma-separated (default {','.join(map(str, getattr(grid, name)))}; empty string = none)")
    sw.add_argument("--draft-inits", type=_classes, default=grid.draft_inits)
    sw.add_argument("--baselines", type=_classes, default=grid.baselines, help="of ar,sjd,sjd-coupled")
    return parser


def _numbers(kind):
    def parse(text: str) -> list:
        try:
            return [kind(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated {kind.__name__} values") from None
    return parse


def _writable(folder: Path) -> Path:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".csdgen-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"output folder {str(folder)!r} is not writable ({exc.strerror}); choose another with --out") from None
    return folder


def _setup(args):
    from csdgen.models.builtin import load_builtin_model

    sampling = SamplingConfig(guidance_scale=args.guidance_scale, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    csd_rule = make_rule("csd", lam=args.lam, delta=args.delta, entropy_unit=args.entropy_unit)  # validates early
    model = load_builtin_model(args.weights)
    names = args.classes or model.class_names
    ids = model.class_ids(names)  # raises on an unknown class
    classes = [ids[i % len(ids)] for i in range(args.num_images)]
    return model, sampling, csd_rule, classes


def cmd_generate(args) -> int:
    from csdgen.evaluation.maps import acceptance_map, save_png, to_uint8
    from PIL import Image
    from csdgen.evaluation.runs import generate_batches, write_json

    model, sampling, csd_rule, classes = _setup(args)
    out = _writable(args.out)
    rule = {"csd": csd_rule, "addition": make_rule("addition", c=args.addition_c)}.get(args.method, args.method)
    settings = {"model": "builtin", "weights": str(model.components.weights_dir), "method": args.method, "rule": repr(rule),
                "window": args.window, "seed": args.seed, "batch_size": args.batch_size, "draft_init": args.draft_init,
                "refresh": args.refresh, "sampling": asdict(sampling)}
    record_path = out / "record.json"
    images = {}
    if record_path.is_file():
        old = json.loads(record_path.read_text())
        if old.get("settings") != settings:
            raise ValueError(f"{str(out)!r} holds a run with other settings; use another --out or delete its record.json")
        images = {int(k): v for k, v in old["images"].items() if (out / v["file"]).is_file()}
    name = lambda i: f"{i:04d}_{model.class_names[classes[i]]}"  # noqa: E731
    N = model.num_image_tokens
    todo = [i for i in range(len(classes)) if i not in images]
    bar = tqdm(total=len(todo) * N, unit="tok", desc=f"{args.method} W={args.window}", leave=False)
    seen = {"done": 0}

    def progress(info):
        done = int(info.committed.sum())
        bar.update(done - seen["done"])
        seen["done"] = done

    began = time.perf_counter()
    for indices, result in generate_batches(model, classes, batch_size=args.batch_size, seed=args.seed,
                                            skip=lambda idx: all(i in images for i in idx), callback=progress,
                                            method=rule, window=args.window, sampling=sampling,
                                            draft_init=args.draft_init, refresh=args.refresh):
        seen["done"] = 0
        pixels = to_uint8(model.decode_images(result.tokens))
        for j, i in enumerate(indices):
            stats = result.images[j]
            save_png(Image.fromarray(pixels[j]).resize((128, 128), Image.NEAREST), out / f"{name(i)}.png")
            if not args.no_maps:
                save_png(acceptance_map(pixels[j], stats.decisions, stats.entropy, model.grid, model.codebook_size),
                         out / f"{name(i)}_map.png")
            images[i] = {"file": f"{name(i)}.png", "class": model.class_names[classes[i]],
                         "decode_seconds_batch": result.seconds, **stats.summary()}
        write_json({"settings": settings, "images": {str(k): images[k] for k in sorted(images)}}, record_path)
    bar.close()
    seconds = time.perf_counter() - began
    done = [images[i] for i in sorted(images)]
    tokens = sum(d["tokens"] for d in done)
    steps = sum(d["steps"] for d in done)
    compression = sum(d["step_compression"] for d in done) / len(done)
    print(f"{len(done)} images, {tokens} tokens, {steps} steps (per image, summed), step compression {compression:.2f}x, "
          f"{seconds:.1f} s -> {out}/")
    return 0


def cmd_compare(args) -> int:
    from csdgen.evaluation.compare import method_presets, run_method, score_run, table_rows, to_csv, to_markdown
    from csdgen.evaluation.maps import image_grid, save_png, to_uint8
    from csdgen.evaluation.quality import QualityScorer

    model, sampling, _, classes = _setup(args)
    out = _writable(args.out)
    presets = method_presets(args.lam, args.delta, args.addition_c, model.codebook_embeddings())
    names = args.methods or list(presets)
    unknown = [n for n in names if n not in presets]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; allowed: {', '.join(presets)}")
    if "ar" not in names:
        names = ["ar"] + names
    scorer = QualityScorer(model)
    plan = [(n, presets[n], args.seed) for n in names] + [("ar-seed2", presets["ar"], args.seed + 1)]
    bar = tqdm(total=len(plan) * len(classes), unit="img", desc="compare")
    runs = []
    for name, preset, seed in plan:
        bar.set_postfix_str(name)
        runs.append(run_method(model, name, preset, classes, seed=seed, batch_size=args.batch_size, window=args.window,
                               sampling=sampling, out_dir=out, progress=bar.update))
    bar.close()
    scores, grid_rows = {}, []
    for run in runs:
        scores[run.name], images = score_run(model, scorer, run, classes)
        grid_rows.append(list(to_uint8(images[:8])))
    rows = table_rows(runs, scores)
    markdown = to_markdown(rows)
    (out / "compare.md").write_text(markdown)
    (out / "compare.csv").write_text(to_csv(rows))
    save_png(image_grid(grid_rows, [r.name for r in runs], scale=2), out / "compare.png")
    print(markdown)
    print(f"{len(classes)} images per method; noise floor: ar vs ar-seed2. Wrote {out}/compare.md, compare.csv, compare.png")
    return 0


def cmd_sweep(args) -> int:
    from csdgen.drafting import check_drafting
    from csdgen.evaluation.compare import run_method, score_run, to_csv, to_markdown
    from csdgen.evaluation.quality import QualityScorer
    from csdgen.evaluation.runs import write_json
    from csdgen.evaluation.sweep import frontier_plot, settings

    model, sampling, _, classes = _setup(args)
    for init in args.draft_inits:
        check_drafting(init, "independent")
    out = _writable(args.out)
    grid = SweepGrid(args.csd_lam, args.csd_delta, args.addition_c, args.gsd_radius, args.lantern_delta,
                     args.windows, args.draft_inits, args.baselines)
    points = settings(grid, model.codebook_embeddings())
    scorer = QualityScorer(model)
    bar = tqdm(total=len(points) * len(classes), unit="img", desc="sweep")
    rows = []
    for point in points:
        bar.set_postfix_str(point.name)
        run = run_method(model, point.name, point.preset, classes, seed=args.seed, batch_size=args.batch_size,
                         window=point.window, sampling=sampling, out_dir=out, progress=bar.update)
        scores, _ = score_run(model, scorer, run, classes)
        rows.append({"method": point.method, "parameter": point.parameter, "value": point.value, "window": point.window,
                     "draft_init": point.draft_init, "images": len(classes),
                     "step_compression": sum(run.compression) / len(run.compression),
                     "mean_accepted_length": sum(run.accepted) / len(run.accepted),
                     "latency_s_per_image": run.seconds / len(classes), **scores})
        write_json(rows, out / "sweep.json")
    bar.close()
    (out / "sweep.md").write_text(to_markdown(rows))
    (out / "sweep.csv").write_text(to_csv(rows))
    frontier_plot(rows, out / "frontier.png")
    print(to_markdown(rows))
    print(f"{len(points)} settings x {len(classes)} images. Wrote {out}/sweep.md, sweep.csv, frontier.png")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"generate": cmd_generate, "compare": cmd_compare, "sweep": cmd_sweep}[args.command](args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"csdgen: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("csdgen: interrupted; images already written are kept, rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
