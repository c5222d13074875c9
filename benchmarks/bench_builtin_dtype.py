"""The built-in model in float32 against bfloat16 on this machine: kernels, one forward, whole runs.

Not a test: it times and prints. From the project root:

    python benchmarks/bench_builtin_dtype.py --threads 2

Four tables, every figure a median, the two dtypes timed in turn (float32, bfloat16, float32,
bfloat16) so that both see the machine at the same pace:

1. kernels: a cache write of one column per row (``scatter_`` against ``index_put_``, 8 rows, 8 heads of
   32, 300 columns) and attention at one query (torch's ``scaled_dot_product_attention`` against two
   matmuls and a float32 softmax, transformers' ``eager`` attention) at 2 and 24 rows, 320 columns;
2. one static-session forward of the built-in model (``bench_session_forward.median_forward``) at
   batch 1, 4, 12 and 16 and the widths the auto window runs there (guided: twice the rows);
3. attention: the same bfloat16 forwards with transformers' ``eager`` attention and with ``sdpa``, the
   rows at one position and spread over the image (as a served batch's are), the two in turn;
4. ``csdgen.generate`` of 1 and 4 images (the default classes, seeds 0..``--seeds``-1) with AR, SJD
   and CSD at window ``auto``: seconds, and each method's speed over AR's in the same dtype.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_header import command_line  # noqa: E402
from bench_session_forward import median_forward  # noqa: E402

import csdgen  # noqa: E402
from csdgen.models.builtin import load_builtin_model  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16)
FORWARDS = ((1, (1, 8, 16, 32)), (4, (1, 4, 8, 16)), (12, (1, 2, 4)), (16, (1, 2)))


def _median_us(fn, repeats: int = 200) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return 1e6 * statistics.median(times)


def kernels() -> list[str]:
    lines = ["| kernel | shape | float32 us | bfloat16 us |", "|---|---|---|---|"]
    cells: dict[tuple[str, str], list[float]] = {}
    for dtype in DTYPES + DTYPES:
        R, H, T, D = 8, 8, 300, 32
        keys = torch.zeros(R, H, T, D, dtype=dtype)
        new = torch.randn(R, H, 1, D, dtype=dtype)
        write = torch.full((R, 1), 150)
        index = write[:, None, :, None].expand(R, H, 1, D)
        rows = torch.arange(R)[:, None]
        shape = "8 rows x 8 heads x 300 columns, 1 column written"
        cells.setdefault(("cache write: scatter_", shape), []).append(
            _median_us(lambda: keys.scatter_(2, index, new)))
        cells.setdefault(("cache write: index_put_", shape), []).append(
            _median_us(lambda: keys.transpose(1, 2).index_put_((rows, write), new.transpose(1, 2))))
        for R in (2, 24):
            q = torch.randn(R, 8, 1, 32, dtype=dtype)
            k, v = torch.randn(R, 8, 320, 32, dtype=dtype), torch.randn(R, 8, 320, 32, dtype=dtype)
            mask = torch.zeros(R, 1, 1, 320, dtype=dtype)
            mask[..., 300:] = torch.finfo(dtype).min
            shape = f"{R} rows, 1 query, 8 heads of 32, 320 columns"

            def matmuls():
                weights = (q @ k.transpose(-1, -2)) * 32 ** -0.5 + mask
                return torch.softmax(weights, -1, dtype=torch.float32).to(dtype) @ v

            cells.setdefault(("attention: scaled_dot_product_attention", shape), []).append(
                _median_us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))
            cells.setdefault(("attention: matmuls (eager)", shape), []).append(_median_us(matmuls))
    for (kernel, shape), t in cells.items():
        lines.append(f"| {kernel} | {shape} | {min(t[0], t[2]):.0f} | {min(t[1], t[3]):.0f} |")
    return lines


def forwards(models) -> list[str]:
    lines = ["| batch | width | float32 ms | bfloat16 ms | bfloat16 over float32 | width over width 1, float32 | "
             "width over width 1, bfloat16 |", "|---|---|---|---|---|---|---|"]
    for batch, widths in FORWARDS:
        first = None
        for width in widths:
            t = [median_forward(m, "static", batch, width, 127, 40) for m in models + models]
            f32, b16 = min(t[0], t[2]), min(t[1], t[3])
            first = first or (f32, b16)
            lines.append(f"| {batch} | {width} | {1e3 * f32:.2f} | {1e3 * b16:.2f} | {b16 / f32:.2f}x | "
                         f"{f32 / first[0]:.2f}x | {b16 / first[1]:.2f}x |")
    return lines


def attention(models) -> list[str]:
    """bfloat16 forwards with each transformers attention (the other implementation set for its forwards,
    then the chosen one back): which one :func:`csdgen.models.builtin.cpu_bfloat16_attention` should pick here."""
    model = models[1]
    backbone = model.components.ar
    chosen = backbone.config._attn_implementation
    lines = ["| batch | width | eager ms | sdpa ms | sdpa over eager | rows' positions |", "|---|---|---|---|---|---|"]
    try:
        for batch, widths in FORWARDS:
            for width in widths:
                for spread in (False, True):
                    t = {}
                    for name in ("eager", "sdpa", "eager", "sdpa"):
                        backbone.set_attn_implementation(name)
                        t.setdefault(name, []).append(median_forward(model, "static", batch, width, 127, 40, spread=spread))
                    eager, sdpa = min(t["eager"]), min(t["sdpa"])
                    lines.append(f"| {batch} | {width} | {1e3 * eager:.2f} | {1e3 * sdpa:.2f} | {sdpa / eager:.2f}x | "
                                 f"{'spread over the image' if spread else 'all at 127'} |")
    finally:
        backbone.set_attn_implementation(chosen)
    return lines


def runs(models, seeds: int) -> list[str]:
    lines = ["| images | method | float32 s | bfloat16 s | float32 over AR | bfloat16 over AR | "
             "step compression float32 / bfloat16 |", "|---|---|---|---|---|---|---|"]
    classes = list(models[0].default_classes or range(4))
    for images in (1, 4):
        seconds: dict[tuple[str, int], list[float]] = {}
        compression: dict[tuple[str, int], list[float]] = {}
        for seed in range(seeds):
            for method in ("ar", "sjd", "csd"):
                for i, model in enumerate(models):
                    picked = [classes[(seed * images + j) % len(classes)] for j in range(images)]
                    window = 1 if method == "ar" else "auto"
                    began = time.perf_counter()
                    result = csdgen.generate(model, picked, method=method, window=window, seed=seed)
                    seconds.setdefault((method, i), []).append(time.perf_counter() - began)
                    compression.setdefault((method, i), []).append(result.step_compression)
        total = {k: sum(v) for k, v in seconds.items()}
        for method in ("ar", "sjd", "csd"):
            lines.append(f"| {images} | {method} | {total[method, 0]:.2f} | {total[method, 1]:.2f} | "
                         f"{total['ar', 0] / total[method, 0]:.2f}x | {total['ar', 1] / total[method, 1]:.2f}x | "
                         f"{statistics.mean(compression[method, 0]):.2f} / "
                         f"{statistics.mean(compression[method, 1]):.2f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--seeds", type=int, default=4, help="seeds per run size (default 4)")
    p.add_argument("--skip", choices=["kernels", "forwards", "attention", "runs"], action="append", default=[])
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = [load_builtin_model(dtype=d) for d in DTYPES]
    print(command_line("bench_builtin_dtype.py", argv))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"{args.threads} threads, load average {os.getloadavg()[0]:.2f}")
    print(f"# bfloat16 attention on this CPU: {models[1].components.ar.config._attn_implementation} "
          f"(csdgen.models.builtin.cpu_bfloat16_attention)\n")
    for name, table in (("kernels", lambda: kernels()), ("forwards", lambda: forwards(models)),
                        ("attention", lambda: attention(models)),
                        ("runs", lambda: runs(models, args.seeds))):
        if name not in args.skip:
            print("\n".join(table()) + "\n", flush=True)
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
