"""Latency of AR, SJD and CSD on a CUDA GPU, eager engine against the static engine with CUDA graphs.

Not a test. On a machine with a CUDA GPU, from the project root:

    python benchmarks/bench_gpu.py                                        # built-in model, batches 1, 16, 64
    python benchmarks/bench_gpu.py --model janus7b --batches 1,16         # Janus-Pro-7B-sized random Llama, bf16
    python benchmarks/bench_gpu.py --batches 1,16 --repeats 5 --json gpu.json
    python benchmarks/bench_gpu.py --device cpu --model random --batches 1 --repeats 1 --engines eager,static-eager
                                                                          # smoke test without a GPU

Without CUDA it refuses (exit status 2, one line) unless ``--device cpu`` is given.

Engines (``--engines``, comma-separated):

* ``eager``: ``generate(engine="eager")``, the ragged ``DynamicCache`` session;
* ``static``: ``generate(engine="static", compile=True)``: the preallocated per-row cache
  (:mod:`csdgen.models._static`), every (batch slots, window bucket) shape ``torch.compile``\\ d
  on first use and, on CUDA, captured as a CUDA graph and replayed (what
  ``torch.compile(mode="reduce-overhead")`` does, captured by the session itself so the cache
  buffers it writes are the session's own);
* ``static-eager``: ``generate(engine="static", compile=False)``.

Models (``--model``): ``builtin`` (the shipped weights), ``random`` (a random Llama, 6 layers,
hidden 256), ``janus7b`` (a random Llama with the language model of Janus-Pro-7B: 30 layers,
hidden 4096, MLP 11008, 32 heads, a 16384-entry image codebook, 24 x 24 = 576 image tokens;
bf16 by default; not the Janus adapter, whose vision encoder and prompt rows change nothing
in a decode step).

Per batch size and engine it prints the forward time ``t(W)`` for W = 1, 8, 32, 64, then per
method (AR, SJD and CSD at ``--window``, CSD at ``window="auto"``): latency per batch (median of
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
import time

import torch

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
        from transformers import LlamaConfig, LlamaForCausalLM

        from csdgen.models import ClassConditionalLlama

        V, classes, grid = 16384, 20, (24, 24)
        cfg = LlamaConfig(vocab_size=V + classes + 1, hidden_size=4096, intermediate_size=11008, num_hidden_layers=30,
                          num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096)
        torch.manual_seed(0)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                backbone = LlamaForCausalLM(cfg).eval()
        finally:
            torch.set_default_dtype(previous)
        model, name = ClassConditionalLlama(backbone, V, classes, grid), "random Llama, Janus-Pro-7B language-model size"
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["builtin", "random", "janus7b"], default="builtin")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="default bfloat16 for janus7b, else float32")
    parser.add_argument("--engines", default="eager,static", help=f"comma-separated, of {','.join(ENGINES)}")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--window", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--guidance-scale", type=float, default=3.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    engines = args.engines.split(",")
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        parser.error(f"--engines {bad[0]!r}: allowed {', '.join(ENGINES)}")
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
    runs = [("AR", "ar", 1), ("SJD", "sjd", args.window), ("CSD", "csd", args.window), ("CSD", "csd", "auto")]
    record = {"model": name, "device": device_name, "dtype": dtype, "window": args.window, "batches": {}}
    for batch in [int(b) for b in args.batches.split(",")]:
        classes = [i % model.num_classes for i in range(batch)]
        record["batches"][batch] = {}
        eager_ar = None
        for engine in engines:
            kwargs = ENGINES[engine]
            times = {w: forward_time(model, batch, w, sampling.guided, kwargs) for w in (1, 8, 32, 64)}
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
