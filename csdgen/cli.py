"""The ``csdgen`` command: ``generate`` images with CSD (or another method), ``compare`` methods.

``generate`` drives the built-in model (``--class``), or with ``--model`` a Janus, Emu3 or
Chameleon-format checkpoint (``--prompt``; sampling defaults from the family's
``FAMILY_DEFAULTS`` entry, memory checked before loading). ``compare`` and ``sweep`` use the
built-in model.

Only this module prints. Errors a user can fix end the command with exit status 2 and one
line naming the bad value and what is allowed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from csdgen.acceptance import make_rule
from csdgen.decoding import METHODS
from csdgen.drafting import DRAFT_INITS, REFRESH_MODES
from csdgen.evaluation.sweep import SweepGrid
from csdgen.models.defaults import FAMILY_DEFAULTS
from csdgen.sampling import SamplingConfig

#: defaults of the built-in model, chosen by measurement (docs/builtin.md)
BUILTIN_DEFAULTS = {key: getattr(FAMILY_DEFAULTS["builtin"], key)
                    for key in ("guidance_scale", "temperature", "top_k", "top_p", "window", "lam", "delta")}


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be an integer >= 1")
    return value


def _window(text: str) -> int | str:
    """``--window``: an integer >= 1, or "auto" (chosen per iteration from measured times)."""
    return "auto" if text.strip().lower() == "auto" else _count(text)


def _classes(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]


def _top_k(text: str) -> int:
    """``--top-k``: an integer >= 1, or 0 / "none" for no top-k (kept as 0 until defaults are filled)."""
    if text.strip().lower() == "none":
        return 0
    return int(text)


def _add_model_and_sampling(p: argparse.ArgumentParser) -> None:
    # sampling/window/lam/delta default to None: filled by _fill_defaults from BUILTIN_DEFAULTS or
    # from the model family's FAMILY_DEFAULTS, so that only values the user typed override those
    d = BUILTIN_DEFAULTS
    p.add_argument("--weights", default=None, help="built-in model weights folder (default: shipped with csdgen)")
    p.add_argument("--class", dest="classes", type=_classes, action="extend", default=None,
                   help="class names or indices, comma-separated or repeated (default: every class in turn)")
    p.add_argument("-n", "--num-images", type=_count, default=None,
                   help="number of images (default 8; with --model one per prompt), conditions taken in turn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=_window, default=None,
                   help=f"Jacobi window W, or auto (default {d['window']}; with --model the family's)")
    p.add_argument("--lam", type=float, default=None, help=f"CSD lambda (default {d['lam']}; with --model the family's)")
    p.add_argument("--delta", type=float, default=None, help=f"CSD TV threshold (default {d['delta']}; with --model the family's)")
    p.add_argument("--entropy-unit", choices=["nats", "normalized"], default="nats")
    p.add_argument("--addition-c", type=float, default=0.2, help="constant of the Addition rule")
    p.add_argument("--guidance-scale", type=float, default=None, help=f"default {d['guidance_scale']}; with --model the family's")
    p.add_argument("--temperature", type=float, default=None, help=f"0 = greedy (default {d['temperature']}; with --model the family's)")
    p.add_argument("--top-k", type=_top_k, default=None, help="0 or none = no top-k (default: none; with --model the family's)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus mass (default: none; with --model the family's)")
    p.add_argument("--draft-init", choices=DRAFT_INITS, default=None,
                   help="draft initialisation (default: what the method needs, else uniform)")
    p.add_argument("--batch-size", type=_count, default=8)
    p.add_argument("--out", type=Path, default=Path("outputs"), help="output folder (default ./outputs)")


def _add_real_model(p: argparse.ArgumentParser) -> None:
    """Options of ``generate --model`` (Janus, Emu3, Lumina-mGPT / Anole checkpoints; docs/models.md)."""
    p.add_argument("--model", default=None, help="checkpoint folder or Hugging Face repo id in the local cache (no download)")
    p.add_argument("--prompt", dest="prompts", action="append", default=None, help="text prompt (repeatable; with --model)")
    p.add_argument("--prompts-file", type=Path, default=None, help="text file, one prompt per line (with --model)")
    p.add_argument("--layout", choices=["lumina", "anole"], default=None, help="Chameleon checkpoints (default: guessed)")
    p.add_argument("--height", type=_count, default=None, help="image height in pixels (default: the family's)")
    p.add_argument("--width", type=_count, default=None, help="image width in pixels (default: the family's)")
    p.add_argument("--image-size", type=_count, default=None, help="square image side in pixels")
    p.add_argument("--negative-prompt", default=None, help="Emu3: prompt of the unconditional rows (default Emu3's own)")
    p.add_argument("--positive-prompt", default=None,
                   help="Emu3: text appended to every prompt (default Emu3's ' masterpiece, film grained, best quality.'; '' = off)")
    p.add_argument("--prompt-template", default=None,
                   help="template for each prompt with {prompt}, {width}, {height} (default: the family's, docs/models.md)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="default bfloat16 on cuda, float32 on cpu")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default cuda when available")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="csdgen", description="Fast AR image generation with content-aware speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate images (default: CSD on the built-in model)")
    _add_model_and_sampling(gen)
    _add_real_model(gen)
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
    _add_demo(sub)
    return parser


def _add_demo(sub) -> None:
    """``csdgen demo``: the local web page (csdgen/demo.py); gradio and torch are imported by the command only."""
    demo = sub.add_parser("demo", help="a local web page to watch AR, SJD, CSD, ... decode side by side")
    demo.add_argument("--model", default=None, help="checkpoint folder or cached repo id (default: the built-in model)")
    demo.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    demo.add_argument("--port", type=_port, default=None, help="TCP port (default: the first free one from 7860)")


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value}: must be a TCP port in 1..65535")
    return value


def cmd_demo(args) -> int:
    from csdgen.demo import serve

    serve(args.model, host=args.host, port=args.port)
    return 0


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


_SAMPLING_KEYS = ("guidance_scale", "temperature", "top_k", "top_p", "window", "lam", "delta")
_MODEL_ONLY = ("prompts", "prompts_file", "layout", "height", "width", "image_size", "negative_prompt", "positive_prompt",
               "prompt_template", "dtype", "device")
#: printed once when --temperature 0 is given with --model
GREEDY_WARNING = ("csdgen: warning: --temperature 0 is greedy decoding, known to give flat or black images on these "
                  "models; use it for checks (greedy equivalence), sample with the family's temperature for pictures")


def _fill_defaults(args, defaults: dict) -> None:
    """Set every sampling/window/CSD option the user left out from ``defaults``; ``--top-k 0`` -> None."""
    for key in _SAMPLING_KEYS:
        if getattr(args, key) is None:
            setattr(args, key, defaults[key])
    if args.top_k == 0:
        args.top_k = None


def _sampling_and_rule(args):
    sampling = SamplingConfig(guidance_scale=args.guidance_scale, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    csd_rule = make_rule("csd", lam=args.lam, delta=args.delta, entropy_unit=args.entropy_unit)  # validates early
    return sampling, csd_rule


def _setup(args):
    from csdgen.models.builtin import load_builtin_model

    _fill_defaults(args, BUILTIN_DEFAULTS)
    sampling, csd_rule = _sampling_and_rule(args)
    model = load_builtin_model(args.weights)
    names = args.classes or model.class_names
    ids = model.class_ids(names)  # raises on an unknown class
    classes = [ids[i % len(ids)] for i in range(args.num_images or 8)]
    return model, sampling, csd_rule, classes


@dataclass
class _Job:
    """What ``generate`` writes for one model: conditions, file names, per-image labels, settings."""

    model: object
    sampling: SamplingConfig
    rule: object
    conditions: list
    names: list[str]
    labels: list[dict]
    settings: dict
    scale: int  # PNG upscaling factor (the built-in model's 64 px images are saved at 128 px)


def _slug(text: str, limit: int = 40) -> str:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return "-".join(words)[:limit].strip("-") or "prompt"


def _rule(args, csd_rule):
    return {"csd": csd_rule, "addition": make_rule("addition", c=args.addition_c)}.get(args.method, args.method)


def _run_settings(args, rule, sampling) -> dict:
    return {"method": args.method, "rule": repr(rule), "window": args.window, "seed": args.seed, "batch_size": args.batch_size,
            "draft_init": args.draft_init, "refresh": args.refresh, "sampling": asdict(sampling)}


def _builtin_job(args) -> _Job:
    given = ["--" + {"prompts": "prompt"}.get(k, k).replace("_", "-") for k in _MODEL_ONLY if getattr(args, k) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} need --model (a Janus, Emu3 or Chameleon checkpoint); the built-in model takes --class")
    model, sampling, csd_rule, classes = _setup(args)
    rule = _rule(args, csd_rule)
    settings = {"model": "builtin", "weights": str(model.components.weights_dir), **_run_settings(args, rule, sampling)}
    labels = [{"class": model.class_names[c]} for c in classes]
    names = [f"{i:04d}_{label['class']}" for i, label in enumerate(labels)]
    return _Job(model, sampling, rule, classes, names, labels, settings, scale=2)


def _read_prompts(args) -> list[str]:
    prompts = [p for p in args.prompts or [] if p.strip()]
    if args.prompts_file is not None:
        if not args.prompts_file.is_file():
            raise FileNotFoundError(f"--prompts-file {str(args.prompts_file)!r} does not exist")
        prompts += [line.strip() for line in args.prompts_file.read_text().splitlines() if line.strip()]
    if not prompts:
        raise ValueError("--model needs prompts: give --prompt \"...\" (repeatable) or --prompts-file FILE (one per line)")
    return prompts


def _model_job(args) -> _Job:
    from csdgen.models.auto import default_device, default_dtype, family_of, load_model, resolve_checkpoint

    if args.classes:
        raise ValueError("--class is for the built-in model; with --model give --prompt or --prompts-file")
    if args.weights is not None:
        raise ValueError("--weights is for the built-in model; with --model the checkpoint folder holds the weights")
    prompts = _read_prompts(args)
    folder = resolve_checkpoint(args.model)
    family = family_of(folder, args.layout, args.model)
    _fill_defaults(args, asdict(FAMILY_DEFAULTS[family]))
    sampling, csd_rule = _sampling_and_rule(args)
    if args.temperature == 0:
        print(GREEDY_WARNING, file=sys.stderr)
    rule = _rule(args, csd_rule)
    conditions = [prompts[i % len(prompts)] for i in range(args.num_images or len(prompts))]
    device = args.device or default_device()
    dtype = args.dtype or str(default_dtype(device)).removeprefix("torch.")
    model = load_model(args.model, dtype=dtype, device=device, layout=args.layout, height=args.height,
                       width=args.width, image_size=args.image_size, batch_size=min(args.batch_size, len(conditions)),
                       window=args.window, guided=sampling.guided, negative_prompt=args.negative_prompt,
                       positive_prompt=args.positive_prompt, prompts=prompts,
                       prompt_template=args.prompt_template)  # sizes, prompt lengths and memory checked first
    if getattr(model, "vqgan", True) is None:  # a Chameleon checkpoint without Chameleon's VQGAN files
        raise ValueError(f"{str(args.model)!r} has no image decoder: copy Chameleon's vqgan.yaml and vqgan.ckpt "
                         f"(its tokenizer/ folder) into {str(folder)!r} or {str(folder / 'tokenizer')!r}")
    settings = {"model": str(args.model), "checkpoint": str(folder), "family": family, "dtype": dtype, "device": device,
                "grid": list(model.grid), "prompts": prompts, "negative_prompt": args.negative_prompt,
                "positive_prompt": args.positive_prompt, "prompt_template": args.prompt_template,
                **_run_settings(args, rule, sampling)}
    labels = [{"prompt": p} for p in conditions]
    names = [f"{i:04d}_{_slug(p)}" for i, p in enumerate(conditions)]
    return _Job(model, sampling, rule, conditions, names, labels, settings, scale=1)


def _load_record(out: Path, settings: dict, labels: list[dict]) -> dict[int, dict]:
    """Images of an earlier run with the same settings and conditions whose PNG is still there (resume).

    Raises:
        ValueError: naming the settings, or the first image's condition, that differ from the earlier run.
    """
    record_path = out / "record.json"
    if not record_path.is_file():
        return {}
    old = json.loads(record_path.read_text())
    previous = old.get("settings", {})
    differ = sorted(k for k in set(previous) | set(settings) if previous.get(k) != settings.get(k))
    if differ:
        raise ValueError(f"{str(out)!r} holds a run with other settings ({', '.join(differ)}); use another --out")
    images = {int(k): v for k, v in old["images"].items()}
    for i, image in sorted(images.items()):
        if i < len(labels) and any(image.get(k) != v for k, v in labels[i].items()):
            raise ValueError(f"{str(out)!r} holds image {i} for {image.get('class') or image.get('prompt')!r}, this run asks "
                             f"for {labels[i].get('class') or labels[i].get('prompt')!r}; use another --out")
    return {i: v for i, v in images.items() if (out / v["file"]).is_file()}


def _write_batch(job: _Job, out: Path, indices: list[int], result, images: dict, maps: bool) -> None:
    from PIL import Image

    from csdgen.evaluation.maps import acceptance_map, save_png, to_uint8

    model = job.model
    pixels = to_uint8(model.decode_images(result.tokens))
    for j, i in enumerate(indices):
        stats, name = result.images[j], job.names[i]
        image = Image.fromarray(pixels[j])
        if job.scale != 1:
            image = image.resize((image.width * job.scale, image.height * job.scale), Image.NEAREST)
        save_png(image, out / f"{name}.png")
        if maps:
            save_png(acceptance_map(pixels[j], stats.decisions, stats.entropy, model.grid, model.codebook_size, scale=job.scale),
                     out / f"{name}_map.png")
        images[i] = {"file": f"{name}.png", **job.labels[i], "decode_seconds_batch": result.seconds, **stats.summary()}


def cmd_generate(args) -> int:
    from csdgen.evaluation.runs import generate_batches, write_json

    job = _model_job(args) if args.model is not None else _builtin_job(args)
    out = _writable(args.out)
    images = _load_record(out, job.settings, job.labels)
    N = job.model.num_image_tokens
    todo = [i for i in range(len(job.conditions)) if i not in images]
    bar = tqdm(total=len(todo) * N, unit="tok", desc=f"{args.method} W={args.window}", leave=False)
    seen = {"done": 0}

    def progress(info):
        done = int(info.committed.sum())
        bar.update(done - seen["done"])
        seen["done"] = done

    began = time.perf_counter()
    for indices, result in generate_batches(job.model, job.conditions, batch_size=args.batch_size, seed=args.seed,
                                            skip=lambda idx: all(i in images for i in idx), callback=progress,
                                            method=job.rule, window=args.window, sampling=job.sampling,
                                            draft_init=args.draft_init, refresh=args.refresh):
        seen["done"] = 0
        _write_batch(job, out, indices, result, images, maps=not args.no_maps)
        write_json({"settings": job.settings, "images": {str(k): images[k] for k in sorted(images)}}, out / "record.json")
    bar.close()
    _print_summary(images, time.perf_counter() - began, out)
    return 0


def _print_summary(images: dict, seconds: float, out: Path) -> None:
    done = [images[i] for i in sorted(images)]
    tokens = sum(d["tokens"] for d in done)
    steps = sum(d["steps"] for d in done)
    compression = sum(d["step_compression"] for d in done) / len(done)
    print(f"{len(done)} images, {tokens} tokens, {steps} steps (per image, summed), step compression {compression:.2f}x, "
          f"{seconds:.1f} s -> {out}/")


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
        return {"generate": cmd_generate, "compare": cmd_compare, "sweep": cmd_sweep, "demo": cmd_demo}[args.command](args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"csdgen: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("csdgen: interrupted; images already written are kept, rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
