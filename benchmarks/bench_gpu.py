"""Latency of AR, SJD and CSD (fixed window and window="auto") on an accelerator, ready to run.

Not a test. On a machine with a CUDA GPU, from the project root:

    python benchmarks/bench_gpu.py                              # built-in model on cuda, batches 1, 16, 64
    python benchmarks/bench_gpu.py --batches 1,16 --repeats 5 --json gpu.json
    python benchmarks/bench_gpu.py --device cpu --model random --batches 1 --repeats 1   # smoke test

Per batch size it prints the forward time ``t(W)`` for W = 1, 8, 32, 64 (``t(W)/t(1)`` is what
decides whether a wide window pays), then per method: latency per batch (median of
``--repeats`` runs after one warm-up run, device synchronised before the clock starts and
stops: ``GenerationResult.seconds``), milliseconds per image, step compression, speed-up over
AR, and the share of an iteration spent in :func:`csdgen.engine.verify` as it runs inside the
loop (a separate ``generate(profile=True)`` run, whose extra syncs would distort the latency).
VQ decoding is not included. ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

import csdgen
from csdgen.sampling import SamplingConfig


def load(kind: str, device: str, dtype: str):
    if kind == "builtin":
        from csdgen.models.builtin import load_builtin_model

        model, name = load_builtin_model(), "built-in (trained)"
    else:
        from csdgen.models import ClassConditionalLlama

        model, name = ClassConditionalLlama.random(codebook_size=1024, num_classes=1911, grid=(16, 16), hidden_size=256,
                                                   num_layers=8, num_heads=8), "random Llama (8 layers, hidden 256, V 1024)"
    model.backbone.to(device=device, dtype=getattr(torch, dtype))
    model.device = torch.device(device)
    return model, name


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def forward_time(model, batch: int, width: int, guided: bool, repeats: int = 10) -> float:
    session = model.start([i % model.num_classes for i in range(batch)], None, guided)
    session.prefill()
    half = model.num_image_tokens // 2
    tokens = torch.randint(model.codebook_size, (batch, model.num_image_tokens), device=model.device)
    session.forward(tokens[:, :half], torch.zeros(batch, dtype=torch.long))
    width = min(width, model.num_image_tokens - 1 - half)
    samples = []
    for k in range(repeats + 2):
        sync(model.device)
        began = time.perf_counter()
        session.forward(tokens[:, half : half + width], torch.full((batch,), half))
        sync(model.device)
        if k >= 2:
            samples.append(time.perf_counter() - began)
        session.rollback(torch.full((batch,), half))
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["builtin", "random"], default="builtin")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--guidance-scale", type=float, default=3.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    model, name = load(args.model, args.device, args.dtype)
    sampling = SamplingConfig(guidance_scale=args.guidance_scale)
    device_name = torch.cuda.get_device_name(args.device) if torch.device(args.device).type == "cuda" else platform.processor() or "cpu"
    print(f"model {name}, {args.dtype}, on {args.device} ({device_name}); N={model.num_image_tokens}, guidance "
          f"{args.guidance_scale}; latency = median of {args.repeats} runs after a warm-up run, device synchronised")
    runs = [("AR", "ar", 1), ("SJD", "sjd", args.window), ("CSD", "csd", args.window), ("CSD", "csd", "auto")]
    record = {"model": name, "device": device_name, "dtype": args.dtype, "window": args.window, "batches": {}}
    for batch in [int(b) for b in args.batches.split(",")]:
        classes = [i % model.num_classes for i in range(batch)]
        times = {w: forward_time(model, batch, w, sampling.guided) for w in (1, 8, 32, 64)}
        print(f"\nbatch {batch}: " + ", ".join(f"t({w}) = {t * 1e3:.2f} ms" for w, t in times.items())
              + f"; t({args.window})/t(1) = {times.get(args.window, times[32]) / times[1]:.2f}")
        print(f"{'method':6} {'window':>6} {'latency s':>10} {'ms/image':>9} {'step compr.':>11} {'speed-up':>9} {'verify %':>9}")
        rows, ar_latency = [], None
        for label, method, window in runs:
            csdgen.generate(model, classes, method=method, window=window, sampling=sampling, seed=99)  # warm-up
            outs = [csdgen.generate(model, classes, method=method, window=window, sampling=sampling, seed=s) for s in range(args.repeats)]
            latency = statistics.median(o.seconds for o in outs)
            ar_latency = ar_latency or latency
            compression = statistics.mean(o.step_compression for o in outs)
            prof = csdgen.generate(model, classes, method=method, window=window, sampling=sampling, seed=0, profile=True).timings
            share = prof["verify"] / (prof["forward"] + prof["verify"])
            print(f"{label:6} {str(window):>6} {latency:10.3f} {1e3 * latency / batch:9.1f} {compression:11.2f} "
                  f"{ar_latency / latency:8.2f}x {100 * share:8.1f}%")
            rows.append({"method": label, "window": window, "latency_s": latency, "step_compression": compression,
                         "speed_up": ar_latency / latency, "verify_share": share,
                         "widths": outs[0].widths if window == "auto" else None})
        record["batches"][batch] = {"forward_seconds": times, "runs": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
