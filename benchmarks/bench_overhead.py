"""Milliseconds per decoding iteration of the engines against a floor: what the framework costs.

Not a test. From the project root (one torch thread unless --threads):

    python benchmarks/bench_overhead.py                                  # every case below
    python benchmarks/bench_overhead.py --models builtin --batches 1 --engines eager,static,floor
    python benchmarks/bench_overhead.py --json overhead.json

Cases: the built-in model and a random Llama of about 100 M parameters (12 layers, hidden 768,
MLP 2560, 12 heads, codebook 1024, 16 x 16 tokens), at batch 1 and 16, guidance on (so a batch
of B images is 2B rows), AR (``method="ar"``) and a window of 32 (``method="sjd", window=32``).
Per case and engine it prints one line

    overhead <model> B=<batch> <AR|W32> <engine>: <ms> ms/iteration, <ratio> x floor

* ``eager``: ``generate(engine="eager")``, the ragged DynamicCache session;
* ``static``: ``generate(engine="static", compile=False)``, the preallocated per-row cache;
* ``compile``: ``generate(engine="static", compile=True)`` (its compile seconds, the first call
  of every shape, are printed from the warm-up run);
* ``floor``: the same matmuls and attention with no framework around them: embedding, then per
  layer RMSNorm, q/k/v projections, rotary embedding (tables looked up), the new keys and
  values written into a preallocated cache, scaled-dot-product attention over the cached
  positions, output projection, RMSNorm, SwiGLU MLP; final norm and the head on the window's
  positions. One forward, all rows at the same length ``N // 2`` (the median iteration's
  cache), median of ``--floor-repeats`` forwards. No verify, no sampling: the floor of an
  iteration's forward.

An engine's ms/iteration is the median of the gaps between consecutive ``callback`` calls
(one per forward, prefill excluded) over ``--repeats`` runs after a warm-up run (which compiles);
``--iterations K`` stops every run after K forwards (a reduced run, for a loaded machine).
Every image of a batch has the same class and its own image index (an index given twice is
refused: one seed and index is one random stream); a run's gaps are timed until its first image
finishes, so every timed forward has the batch's full shape (AR: all 255; window 32: the
iterations before the fastest image ends).

Then (unless ``--no-csd``), per model, batch and engine, the wall time per image of CSD with
``window="auto"`` (the model's default rule), images of different classes (so they finish at
different iterations and leave the batch), median of ``--repeats`` runs after a warm-up run:

    csd-auto <model> B=<batch> <engine>: <s> s/image, step compression <x>, <ratio> x eager

Wall times depend on the machine's load: the load average is printed at the start and the end;
say how loaded it was with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F

import csdgen
from csdgen.sampling import SamplingConfig

CASES = {"AR": {"method": "ar"}, "W32": {"method": "sjd", "window": 32}}


def load(kind: str):
    if kind == "builtin":
        from csdgen.models.builtin import load_builtin_model

        return load_builtin_model()
    from transformers import LlamaConfig, LlamaForCausalLM

    from csdgen.models import ClassConditionalLlama

    cfg = LlamaConfig(vocab_size=1024 + 20 + 1, hidden_size=768, intermediate_size=2560, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=257)
    torch.manual_seed(0)
    backbone = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        backbone.lm_head.weight.mul_(4.0)
    return ClassConditionalLlama(backbone, 1024, 20, (16, 16))


# -- the floor ------------------------------------------------------------------------------------


class Floor:
    """The forward of a Llama-architecture model as bare tensor operations over its weights."""

    def __init__(self, model, rows: int, cache_length: int, width: int):
        backbone = model.backbone
        cfg = backbone.config
        self.V, self.eps = model.codebook_size, cfg.rms_norm_eps
        self.H, self.Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.D = cfg.hidden_size // self.H
        m = backbone.model
        self.embed = m.embed_tokens.weight
        self.layers = [(l.input_layernorm.weight, l.self_attn.q_proj.weight, l.self_attn.k_proj.weight,
                        l.self_attn.v_proj.weight, l.self_attn.o_proj.weight, l.post_attention_layernorm.weight,
                        l.mlp.gate_proj.weight, l.mlp.up_proj.weight, l.mlp.down_proj.weight) for l in m.layers]
        self.norm, self.head = m.norm.weight, backbone.lm_head.weight[: self.V]
        dtype, dev = self.embed.dtype, self.embed.device
        L, W = cache_length, width
        self.L, self.W = L, W
        self.keys = [torch.randn(rows, self.Hkv, L + W, self.D, dtype=dtype, device=dev) for _ in self.layers]
        self.values = [torch.randn(rows, self.Hkv, L + W, self.D, dtype=dtype, device=dev) for _ in self.layers]
        inv = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, self.D, 2, dtype=torch.float32) / self.D))
        freqs = torch.arange(L, L + W, dtype=torch.float32)[:, None] * inv
        emb = torch.cat([freqs, freqs], -1)
        self.cos, self.sin = emb.cos().to(device=dev, dtype=dtype), emb.sin().to(device=dev, dtype=dtype)
        causal = torch.arange(L + W, device=dev)[None] <= (L + torch.arange(W, device=dev))[:, None]
        self.mask = None if W == 1 else torch.zeros(W, L + W, dtype=dtype, device=dev).masked_fill_(~causal, torch.finfo(dtype).min)
        self.ids = torch.randint(self.V, (rows, W), device=dev)

    def _rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def _rope(self, x):
        half = x.shape[-1] // 2
        return x * self.cos + torch.cat([-x[..., half:], x[..., :half]], -1) * self.sin

    @torch.no_grad()
    def __call__(self) -> torch.Tensor:
        R, W, L, H, Hkv, D = self.ids.shape[0], self.W, self.L, self.H, self.Hkv, self.D
        x = F.embedding(self.ids, self.embed)
        for (w_in, wq, wk, wv, wo, w_post, wg, wu, wd), kc, vc in zip(self.layers, self.keys, self.values):
            h = self._rms(x, w_in)
            q = self._rope(F.linear(h, wq).view(R, W, H, D).transpose(1, 2))
            k = self._rope(F.linear(h, wk).view(R, W, Hkv, D).transpose(1, 2))
            kc[:, :, L:] = k
            vc[:, :, L:] = F.linear(h, wv).view(R, W, Hkv, D).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, kc, vc, attn_mask=self.mask, enable_gqa=Hkv != H)
            x = x + F.linear(a.transpose(1, 2).reshape(R, W, H * D), wo)
            h = self._rms(x, w_post)
            x = x + F.linear(F.silu(F.linear(h, wg)) * F.linear(h, wu), wd)
        return F.linear(self._rms(x, self.norm), self.head)


def floor_ms(model, rows: int, width: int, repeats: int) -> float:
    floor = Floor(model, rows, model.num_image_tokens // 2, width)
    samples = []
    for k in range(repeats + 3):
        began = time.perf_counter()
        floor()
        if k >= 3:
            samples.append(time.perf_counter() - began)
    return 1e3 * statistics.median(samples)


# -- the engines ----------------------------------------------------------------------------------


class _Enough(Exception):
    """Raised from the callback to end a run after ``--iterations`` forwards."""


def _run(model, conditions, indices, sampling, case, kwargs, iterations: int) -> tuple[list[float], dict]:
    """One generate; the time stamps of its callbacks while every image still decodes, and its
    compile seconds (after ``iterations`` forwards the run is stopped: its compile seconds are then
    those of the session's shapes so far)."""
    from csdgen.models._static import COMPILE_SECONDS

    stamps: list[float] = []
    seen: dict = {}
    before = set(COMPILE_SECONDS)
    full = len(conditions)

    def callback(info):
        if info.rows is not None and len(info.rows) < full:
            raise _Enough  # an image finished: the batch would change shape from here on
        stamps.append(time.perf_counter())
        if iterations and len(stamps) > iterations + 1:
            raise _Enough

    try:
        out = csdgen.generate(model, conditions, image_indices=indices, sampling=sampling, seed=1, **case, **kwargs,
                              callback=callback)
        assert out.settings["engine"] == kwargs["engine"]
        seen = out.compile_seconds
    except _Enough:  # the shapes first compiled by this run
        seen = {f"{k[2]}x{k[3]}": v for k, v in COMPILE_SECONDS.items() if k not in before}
    return stamps, seen


def engine_ms(model, batch: int, case: dict, engine: str, repeats: int, sampling, iterations: int = 0) -> tuple[float, dict]:
    """Median ms between consecutive forwards of generate (prefill excluded), and the warm-up's compile seconds."""
    kwargs = {"engine": "eager"} if engine == "eager" else {"engine": "static", "compile": engine == "compile"}
    # one class, B image indices (one index per image: csdgen refuses an index twice); the gaps are
    # timed while all B images decode (_run), so every timed forward has the batch's full shape
    conditions, indices = [3] * batch, list(range(batch))
    _, compiled = _run(model, conditions, indices, sampling, case, kwargs, iterations)  # warm-up (compiles)
    gaps = []
    for r in range(repeats):
        stamps, _ = _run(model, conditions, indices, sampling, case, kwargs, iterations)
        gaps += [b - a for a, b in zip(stamps[1:], stamps[2:])]
    return 1e3 * statistics.median(gaps), compiled


def csd_seconds(model, batch: int, engine: str, repeats: int, sampling) -> tuple[float, float]:
    """Median wall seconds per image of CSD (window="auto") and the mean step compression."""
    kwargs = {"engine": "eager"} if engine == "eager" else {"engine": "static", "compile": engine == "compile"}
    classes = [i % model.num_classes for i in range(batch)]
    csdgen.generate(model, classes, method="csd", window="auto", sampling=sampling, seed=99, **kwargs)
    outs = [csdgen.generate(model, classes, method="csd", window="auto", sampling=sampling, seed=s, **kwargs)
            for s in range(repeats)]
    return statistics.median(o.seconds for o in outs) / batch, statistics.mean(o.step_compression for o in outs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="builtin,llama100m")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--cases", default="AR,W32")
    parser.add_argument("--engines", default="eager,static,compile,floor")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--floor-repeats", type=int, default=40)
    parser.add_argument("--iterations", type=int, default=0,
                        help="stop each run after this many forwards (0, the default: the whole image); a reduced "
                             "run: its iterations see shorter caches than the floor's N // 2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--guidance-scale", type=float, default=2.0)
    parser.add_argument("--csd", action=argparse.BooleanOptionalAction, default=True,
                        help="also the wall time per image of CSD (window=auto) per engine (default on)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    unknown = [m for m in args.models.split(",") if m not in ("builtin", "llama100m")]
    if unknown:  # any other name ran the random 100M model under that name
        parser.error(f"--models {args.models}: unknown {', '.join(map(repr, unknown))}; allowed: builtin, llama100m")
    torch.set_num_threads(args.threads)
    sampling = SamplingConfig(guidance_scale=args.guidance_scale)
    load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"torch {torch.__version__}, {args.threads} thread(s), {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, load average {load_avg:.1f} at the start; guidance {args.guidance_scale}")
    record = {"threads": args.threads, "load_average": load_avg, "iterations": args.iterations, "cases": []}
    if args.iterations:
        print(f"reduced: every run stopped after {args.iterations} forwards")
    for name in args.models.split(","):
        model = load(name)
        params = sum(p.numel() for p in model.backbone.parameters()) / 1e6
        print(f"\n{name}: {params:.1f} M parameters, N={model.num_image_tokens}, V={model.codebook_size}")
        for batch in [int(b) for b in args.batches.split(",")]:
            for case_name in [c for c in args.cases.split(",") if c]:  # --cases "": only the csd-auto lines
                case = CASES[case_name]
                width = case.get("window", 1)
                rows = 2 * batch if sampling.guided else batch
                floor = floor_ms(model, rows, width, args.floor_repeats)
                for engine in args.engines.split(","):
                    compiled = {}
                    ms = floor if engine == "floor" else None
                    if ms is None:
                        ms, compiled = engine_ms(model, batch, case, engine, args.repeats, sampling, args.iterations)
                    label = f"{name} B={batch} {case_name} {engine}"
                    print(f"overhead {label}: {ms:.2f} ms/iteration, {ms / floor:.2f} x floor", flush=True)
                    if compiled:
                        print("  compile seconds (first call per rows x columns shape): "
                              + ", ".join(f"{k}: {v:.1f}" for k, v in compiled.items()), flush=True)
                    record["cases"].append({"model": name, "batch": batch, "case": case_name, "engine": engine,
                                            "ms_per_iteration": ms, "floor_ms": floor, "ratio": ms / floor,
                                            "compile_seconds": compiled})
            if args.csd:
                eager = None
                for engine in [e for e in args.engines.split(",") if e != "floor"]:
                    seconds, compression = csd_seconds(model, batch, engine, args.repeats, sampling)
                    eager = eager or (seconds if engine == "eager" else None)
                    ratio = f", {seconds / eager:.2f} x eager" if eager else ""
                    print(f"csd-auto {name} B={batch} {engine}: {seconds:.3f} s/image, step compression "
                          f"{compression:.2f}{ratio}", flush=True)
                    record["cases"].append({"model": name, "batch": batch, "case": "csd-auto", "engine": engine,
                                            "seconds_per_image": seconds, "step_compression": compression})
    record["load_average_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nload average {record['load_average_end']:.1f} at the end ({os.cpu_count()} cores): wall times above that "
          f"are under load when it exceeds the cores")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
