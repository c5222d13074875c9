"""Latency of AR, SJD and CSD on a CUDA GPU, eager engine against the static engine with CUDA graphs.

Not a test. On a machine with a CUDA GPU, from the project root:

    python benchmarks/bench_gpu.py                                        # built-in model, batches 1, 16
    python benchmarks/bench_gpu.py --model janus7b --batches 1            # Janus-Pro-7B-sized random Llama, bf16
    python benchmarks/bench_gpu.py --batches 1,16,64 --repeats 5 --json gpu.json
    python benchmarks/bench_gpu.py --device cpu --model random --batches 1 --repeats 1 --engines static-eager \
        --methods csd                                                     # smoke test without a GPU

``benchmarks/gpu_check.py`` is the one command a short GPU loan runs (correctness, syncs,
compiles, memory, the goal figures, within 8 minutes); this benchmark is the longer latency table
behind its ``forward`` and ``speedup`` lines, for more batch sizes, methods and repeats. Its
defaults (built-in model, batches 1 and 16, 3 repeats) take a few minutes on a GPU; the
``janus7b`` model compiles each of its shapes (30 layers) on first use, which takes minutes more.

Without CUDA it refuses (exit status 2, one line) unless ``--device cpu`` is given.

Engines (``--engines``, comma-separated):

* ``eager``: ``generate(engine="eager")``, the ragged ``DynamicCache`` session;
* ``static``: ``generate(engine="static", compile=True)``: the preallocated per-row cache
  (:mod:`csdgen.models._static`), every (batch slots, window bucket) shape ``torch.compile``\\ d
  on first use and, on CUDA, captured as a CUDA graph and replayed (what
  ``torch.compile(mode="reduce-overhead")`` does, captured by the session itself so the cache
  buffers it writes are the session's own);
* ``static-eager``: ``generate(engine="static", compile=False)``.

Models (``--model``): ``builtin`` (the shipped weights), ``random`` (a random Llama, 8 layers,
hidden 256), ``janus7b`` (a random Llama with the language model of Janus-Pro-7B:
:func:`gpu_check.janus7b_sized`, 30 layers, hidden 4096, MLP 11008, 32 heads, a 102400-entry
vocabulary of which 16384 image codes, 24 x 24 = 576 image tokens; bf16 by default; not the
Janus adapter, whose vision encoder and prompt rows change nothing in a decode step).

Per batch size and engine it prints the forward time ``t(W)`` for W = 1, 16, 32, 64 (half the
image cached, filled in windows of 64 so that no wider shape is compiled) and the bandwidth
floor (:func:`gpu_check.streamed_weight_bytes` over the measured copy bandwidth), then per
method (``--methods``: AR, SJD and CSD at ``--window``, CSD at ``window="auto"``): latency per batch (median of
``--repeats`` runs after one warm-up run, which also compiles and captures; device
synchronised: ``GenerationResult.seconds``), ms per image, ms per step (latency / steps),
step compression, speed-up over AR of the same engine and over eager AR, the ratio speed-up /
step compression (1.0: every saved forward is saved time; SCD's Janus-Pro-7B figures give
2.45 / 3.74 = 0.65), and the warm-up's compile seconds. VQ decoding is not included.
``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys

import torch

import gpu_check  # benchmarks/, beside this file (its path puts csdgen's checkout first)
import csdgen
from csdgen.models._static import open_engine
from csdgen.sampling import SamplingConfig

ENGINES = {"eager": {"engine": "eager"}, "static": {"engine": "static", "compile": True},
           "static-eager": {"engine": "static", "compile": False}}


def load(kind: str, device: str, dtype: str):
    dtype = getattr(torch, dtype)
    if kind == "builtin":
        from csdgen.models.builtin import load_builtin_model

        model, name = load_builtin_model(), "built-in (trained)"
        model.backbone.to(device=device, dtype=dtype)
    elif kind == "random":
        from csdgen.models import ClassConditionalLlama

        model, name = ClassConditionalLlama.random(codebook_size=1024, num_classes=1911, grid=(16, 16), hidden_size=256,
                                                   num_layers=8, num_heads=8), "random Llama (8 layers, hidden 256, V 1024)"
        model.backbone.to(device=device, dtype=dtype)
    else:  # built on the device in its dtype: no 28 GB float32 copy on the host
        model, name = gpu_check.janus7b_sized(torch.device(device), dtype), "random Llama, Janus-Pro-7B language-model size"
    model.device = torch.device(device)
    return model, name


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def forward_time(model, batch: int, width: int, guided: bool, engine: dict, repeats: int = 10) -> float:
    """Median seconds of one forward of ``width`` slots at half the image (two warm-up forwards first)."""
    session = model.start([i % model.num_classes for i in range(batch)], None, guided)
    session = open_engine(session, engine["engine"], engine.get("compile"))
    session.prefill()
    half = model.num_image_tokens // 2
    tokens = torch.randint(model.codebook_size, (batch, half), device=model.device)
    gpu_check.fill(session, tokens)
    return gpu_check.time_forward(model, session, half, min(width, model.num_image_tokens - 1 - half), repeats)


METHODS = {"ar": ("AR", "ar", None), "sjd": ("SJD", "sjd", None), "csd": ("CSD", "csd", None),
           "csd-auto": ("CSD", "csd", "auto")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["builtin", "random", "janus7b"], default="builtin")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="default bfloat16 for janus7b, else float32")
    parser.add_argument("--engines", default="eager,static", help=f"comma-separated, of {','.join(ENGINES)}")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {','.join(METHODS)}")
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--guidance-scale", type=float, default=3.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    engines = args.engines.split(",")
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        parser.error(f"--engines {bad[0]!r}: allowed {', '.join(ENGINES)}")
    methods = args.methods.split(",")
    bad = [m for m in methods if m not in METHODS]
    if bad:
        parser.error(f"--methods {bad[0]!r}: allowed {', '.join(METHODS)}")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print(f"bench_gpu: --device {args.device}: CUDA is not available on this machine (torch {torch.__version__}); "
              "run it where a GPU is, or give --device cpu for a smoke test", file=sys.stderr)
        return 2
    dtype = args.dtype or ("bfloat16" if args.model == "janus7b" else "float32")
    model, name = load(args.model, args.device, dtype)
    sampling = SamplingConfig(guidance_scale=args.guidance_scale)
    cuda = torch.device(args.device).type == "cuda"
    device_name = torch.cuda.get_device_name(args.device) if cuda else platform.processor() or "cpu"
    print(f"model {name}, {dtype}, on {args.device} ({device_name}), torch {torch.__version__}; "
          f"N={model.num_image_tokens}, guidance {args.guidance_scale}; latency = median of {args.repeats} runs after a "
          f"warm-up run (compiles and captures), device synchronised")
    runs = [(label, method, 1 if method == "ar" else window or args.window) for label, method, window in
            (METHODS[m] for m in methods)]
    floor = gpu_check.streamed_weight_bytes(model) / gpu_check.copy_bandwidth(
        torch.device(args.device), (2 << 30) if cuda else (64 << 20))
    print(f"bandwidth floor of one forward: {floor * 1e3:.2f} ms (weights streamed / device copy bandwidth)")
    record = {"model": name, "device": device_name, "dtype": dtype, "window": args.window, "floor_seconds": floor,
              "batches": {}}
    for batch in [int(b) for b in args.batches.split(",")]:
        classes = [i % model.num_classes for i in range(batch)]
        record["batches"][batch] = {}
        eager_ar = None
        for engine in engines:
            kwargs = ENGINES[engine]
            times = {w: forward_time(model, batch, w, sampling.guided, kwargs) for w in (1, 16, 32, 64)}
            print(f"\nbatch {batch}, engine {engine}: " + ", ".join(f"t({w}) = {t * 1e3:.2f} ms" for w, t in times.items()))
            print(f"{'method':6} {'window':>6} {'latency s':>10} {'ms/image':>9} {'ms/step':>8} {'step compr.':>11} "
                  f"{'speed-up':>9} {'vs eager AR':>11} {'s-up/compr.':>11} compile s")
            rows, ar_latency = [], None
            for label, method, window in runs:
                warm = csdgen.generate(model, classes, method=method, window=window, sampling=sampling, seed=99, **kwargs)
                outs = [csdgen.generate(model, classes, method=method, window=window, sampling=sampling, seed=s, **kwargs)
                        for s in range(args.repeats)]
                latency = statistics.median(o.seconds for o in outs)
                steps = statistics.mean(o.steps for o in outs)
                ar_latency = ar_latency or latency
                eager_ar = eager_ar or latency
                compression = statistics.mean(o.step_compression for o in outs)
                compile_s = sum(warm.compile_seconds.values())
                print(f"{label:6} {str(window):>6} {latency:10.3f} {1e3 * latency / batch:9.1f} "
                      f"{1e3 * latency / steps:8.2f} {compression:11.2f} {ar_latency / latency:8.2f}x "
                      f"{eager_ar / latency:10.2f}x {ar_latency / latency / compression:11.2f} {compile_s:.1f}",
                      flush=True)
                rows.append({"method": label, "window": window, "latency_s": latency, "ms_per_step": 1e3 * latency / steps,
                             "step_compression": compression, "speed_up": ar_latency / latency,
                             "speed_up_vs_eager_ar": eager_ar / latency,
                             "speed_up_over_compression": ar_latency / latency / compression,
                             "compile_seconds": warm.compile_seconds,
                             "widths": outs[0].widths if window == "auto" else None})
            record["batches"][batch][engine] = {"forward_seconds": times, "runs": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
