"""Quantised targets on the CPU: float32 against torchao int8 weight-only (int4 where the device runs it).

    python benchmarks/bench_quant.py --threads 1 --images 8 --out benchmarks/results/quant_cpu.md

Two models: the built-in model (its shipped weights, 256 tokens per image, its defaults) and a random
Llama-shaped class-conditional model of about 100 M parameters built here (hidden 896, 12 layers, 8 x 8
tokens over a codebook of 1024; random weights: its acceptance says nothing about a trained model, its
rows measure the forward's cost and memory at that size). For each model and dtype, AR, SJD and CSD decode the
same classes and seeds; per method: step compression (image tokens / forwards per image, AR = 1),
wall speed-up over AR in the same dtype, and for the built-in model the class agreement (how many of
the images its classifier judges the class asked for). Memory: the weights' bytes as held (torchao's
int8 tensors counted by their storages) and the memory plan's peak (csdgen plan) at the batch size.
Each speculative decoding run is exact for its own target: int8 changes the target, not the method.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch

import csdgen
from csdgen.models import ClassConditionalLlama
from csdgen.models.builtin import load_builtin_model
from csdgen.models.memory import format_bytes, module_bytes
from csdgen.models.plan import builtin_plan
from csdgen.models.quantize import check_quantize, quantize_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_header import commit as checkout_commit  # noqa: E402

METHODS = ("ar", "sjd", "csd")


def random_llama(seed: int = 0) -> ClassConditionalLlama:
    """About 100 M parameters, Llama-shaped (hidden 896, 12 layers, 14 heads, MLP 1792), 8 x 8 tokens, 1024 codes."""
    return ClassConditionalLlama.random(codebook_size=1024, num_classes=16, grid=(8, 8), hidden_size=896, num_layers=12,
                                        num_heads=14, seed=seed)


def agreement(model, tokens: torch.Tensor, classes: list[int]) -> float | None:
    """Fraction of images the built-in classifier judges the class asked for (None for a model without one)."""
    parts = getattr(model, "components", None)
    if parts is None:
        return None
    with torch.no_grad():
        images = model.decode_images(tokens)
        judged = parts.classifier(images.float()).argmax(-1)
    return float((judged == torch.tensor(classes)).float().mean())


def run_model(name: str, make, quantize: str | None, classes: list[int], batch: int, seed: int) -> list[dict]:
    model = make()
    if quantize is not None:
        quantize_module(model.backbone, quantize, model.device)
    weights = module_bytes(model.backbone)
    plan = builtin_plan(model, batch_size=batch, window=32, guided=True, quantize=quantize, free=0)
    rows, ar_seconds = [], None
    defaults = getattr(model, "defaults", None)
    window = defaults.window if defaults is not None else 16  # a fixed window: compression is not auto's trade-off
    csdgen.generate(model, classes[:1], method="ar", seed=seed)  # warm-up (first-call costs out of the timings)
    for method in METHODS:
        start = time.perf_counter()
        out = csdgen.generate(model, classes, method=method, window=window, batch_size=batch, seed=seed)
        seconds = time.perf_counter() - start
        ar_seconds = seconds if method == "ar" else ar_seconds
        steps = sum(s.steps for s in out.images) / len(out.images)
        rows.append({"model": name, "weights": quantize or "float32", "method": method, "window": window,
                     "compression": model.num_image_tokens / steps, "seconds": seconds,
                     "speedup": ar_seconds / seconds, "agreement": agreement(model, out.tokens, classes),
                     "weight_bytes": weights, "plan_peak": plan.peak()})
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| model | weights | method | window | step compression | wall s | speed-up over AR (same weights) | class agreement "
             "| weight bytes | planned peak (batch) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        agree = "-" if r["agreement"] is None else f"{r['agreement']:.2f}"
        lines.append(f"| {r['model']} | {r['weights']} | {r['method']} | {1 if r['method'] == 'ar' else r['window']} | {r['compression']:.2f}x | {r['seconds']:.1f} | "
                     f"{r['speedup']:.2f}x | {agree} | {format_bytes(r['weight_bytes'])} | {format_bytes(r['plan_peak'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--images", type=int, default=8, help="images per model, dtype and method (default 8)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-random", action="store_true", help="only the built-in model")
    p.add_argument("--out", type=Path, default=None, help="Markdown file for the results")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    quantizations = [None, "int8"]
    skipped = []
    try:
        check_quantize("int4", "cpu")
        quantizations.append("int4")
    except ValueError as exc:
        skipped.append(str(exc))
    builtin = load_builtin_model()
    classes = (builtin.default_classes or list(range(builtin.num_classes)))
    classes = [classes[i % len(classes)] for i in range(args.images)]
    rows = []
    for q in quantizations:
        rows += run_model("built-in", _fresh_builtin, q, classes, args.batch_size, args.seed)
    if not args.skip_random:
        for q in quantizations:
            rows += run_model("random Llama ~100M", random_llama, q, [i % 16 for i in range(args.images)],
                              args.batch_size, args.seed)
    params = sum(p.numel() for p in random_llama().backbone.parameters())
    commit = checkout_commit()
    import torchao

    text = "\n".join([
        "# Quantised targets on the CPU (float32 against torchao int8 weight-only)", "",
        f"Command: `python benchmarks/bench_quant.py {' '.join(argv if argv is not None else sys.argv[1:])}`  ",
        f"Machine: {platform.machine()} {platform.processor() or ''} ({torch.get_num_threads()} torch thread(s) of "
        f"{__import__('os').cpu_count()} cores, shared with other jobs), torch {torch.__version__}, torchao "
        f"{torchao.__version__}, commit {commit}  ",
        f"Images: {args.images} per model, weights and method (batch {args.batch_size}, seed {args.seed}); each model's "
        f"defaults (built-in: its guidance, temperature and measured window; random Llama window 16); random Llama: {params / 1e6:.0f} M parameters.",
        "", table(rows), "",
        *(f"Not run: {s}." for s in skipped), "",
        "Step compression is image tokens per forward of each image (AR = 1.00x); the speed-up is wall time of AR over "
        "the method, both with the same weights. Class agreement: the built-in classifier's top-1 against the class "
        "asked for. Weight bytes: the AR model's tensors as held (int8: data, scales and zero points). Planned peak: "
        "`csdgen plan`'s peak at this batch size (window 32).", ""])
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    return 0


def _fresh_builtin():
    from csdgen.builtin import load_components
    from csdgen.models.builtin import BuiltinModel

    return BuiltinModel(load_components())


if __name__ == "__main__":
    raise SystemExit(main())
