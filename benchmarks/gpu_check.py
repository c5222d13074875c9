"""csdgen on a GPU in one command: correctness, host syncs, compiles, memory and speed, one line per check.

Not a test suite: one run on one GPU, at most ``--budget`` seconds (default 480), from the project root:

    python benchmarks/gpu_check.py                         # every check on cuda
    python benchmarks/gpu_check.py --out results           # and results/gpu_check.json (written after every check)
    python benchmarks/gpu_check.py --only logits,grow      # some checks
    python benchmarks/gpu_check.py --device cpu --quick    # reduced sizes on the CPU (the CI smoke test)

Every check prints one line ``check NAME STATUS figures [goal: ...] (seconds, peak memory)``:

* ``logits`` (correctness): the static engine (compiled and, on CUDA, CUDA-graphed) against the
  eager engine, teacher-forced (the same tokens fed, in windows of 1, 16 and 32 slots), built-in
  model, float32 (max |logit difference| <= 1e-3) and bfloat16 (total variation between the
  next-token distributions: mean <= 0.01, max <= 0.08); guidance on (both rows compared).
* ``grow`` (correctness): a static session opened for 2 images, 3 more admitted past its capacity
  (its buffers reallocated), then shrunk to 2 (the batch shape seen before the growth), fed the
  same tokens as each image's own eager session: logits within the ``logits`` tolerances, float32
  and bfloat16.
* ``continuous`` (correctness, float32 tokens): :class:`csdgen.engine.ContinuousBatch` with 2
  slots, images admitted past the capacity and leaving as they finish, against each image's solo
  ``csdgen.generate``: token agreement (one floating-point flip changes every token after it, so
  the bar is a mean of 90 % of tokens, not equality; a batch replaying into freed memory gives ~0 %).
* ``syncs`` (figure; goal 1 per iteration): host syncs per iteration of the eager engine, the
  static engine (fixed window) and ``window="auto"``: on CUDA the warnings of
  ``torch.cuda.set_sync_debug_mode("warn")``; on the CPU the host reads a dispatch mode sees
  (``.item()``, ``nonzero``, device copies), a proxy. :func:`count_syncs` is the one place to swap
  the counter.
* ``forward`` (figure; goal: graphed ms per forward at width 1 within 1.3x the floor): ms per
  forward at widths 1, 16, 32, 64 (half the image cached, guidance on: 2 rows), eager and static
  engines, of a random bfloat16 Llama the size of Janus-Pro-7B's language model (hidden 4096, 30
  layers, MLP 11008, vocabulary 102400, 16384 image codes, 576 image tokens; built on the device,
  nothing downloaded; ``--quick``: a tiny Llama), against its bandwidth floor: the weight bytes a
  forward streams over the device's copy bandwidth (measured with a large device-to-device copy).
* ``speedup`` (figure; goal: CSD's wall speed-up over AR >= 0.9x its step compression): AR, SJD
  and CSD (window 32 and auto) at batch 1 on the built-in model, the default engine.
* ``compile`` (figure): compiled shapes and compile seconds of runs at batch 4, then 3, then 4
  again (``GenerationResult.compile_seconds``, ``csdgen.models._static.COMPILE_SECONDS``).
* ``dtype`` (correctness, sanity): the built-in model in float32 against bfloat16: SJD and CSD
  step compression and the NLL of their images under the float32 model (bfloat16 compression
  >= 0.8x float32's, NLL at most 0.25 nats/token above).
* ``serve`` (figure): ``benchmarks/bench_serve.py`` at 16 clients, continuous, static and
  one-at-a-time batching (SKIP when fastapi or uvicorn cannot be imported).
* ``serve_open`` (figure; goal: continuous batching's p95 latency at most 0.7x static batching's):
  ``benchmarks/serve_replay.py``: the server's scheduler in one process, requests of n = 1..4
  images arriving as a Poisson process at 0.6 and 0.9 of the capacity (one-at-a-time throughput x
  16 slots, measured), 30 s of arrivals, continuous against static batching, CSD window auto.
* ``serve_closed`` (figure; goal: served SJD and CSD, window auto, at least 0.97x AR's images per
  second at every client count and 1.3x at one client): ``benchmarks/served_closed_loop.py``, the
  server's closed loop without HTTP (its batch of 16 slots and its image worker) at 1, 4, 16 and 32
  clients, each client's requests of n = 1..4 images one at a time, AR, SJD and CSD in turn for three
  rounds; the median over the rounds after the first of each client count (the first compiles the
  shapes it meets).
* ``quant`` (figure): ms per forward (widths 1 and 32, eager engine, batch 1 guided, half the image
  cached) and weight bytes of the Janus-Pro-7B-sized random Llama in bfloat16, torchao int8
  weight-only (:func:`csdgen.models.quantize.quantize_module`) and bitsandbytes nf4 (CUDA, when
  bitsandbytes is installed); ``--quick``: the tiny Llama, float32 and int8 on the CPU.

The peak device memory of every check is on its line and in the JSON (CUDA:
``torch.cuda.max_memory_allocated``; CPU: the process's peak resident set, which never goes down).

On CUDA every check runs in a process of its own (``--isolate``, the default there): a fault
such as an illegal memory access in one check cannot take the others down, and each check's time
bound kills only it; the figures it had recorded come back. Exit status: 0 when every correctness
check passed; 1 when one failed, crashed or ran out of time; 2 for bad arguments or no CUDA.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: this checkout's csdgen
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from bench_header import commit as checkout_commit  # noqa: E402  (the device machine's copy may have no .git, or no git)

#: float32: largest allowed |logit difference| between engines
TOL_F32_LOGIT = 1e-3
#: bfloat16: allowed total variation between the engines' next-token distributions (mean, max over positions)
TOL_BF16_TV_MEAN, TOL_BF16_TV_MAX = 0.01, 0.08
#: the goals printed beside the figures
GOAL_FLOOR_RATIO, GOAL_SPEEDUP_RATIO, GOAL_SYNCS = 1.3, 0.9, 1.0
#: the built-in classes the checks decode (spread over its 94 classes; others are taken modulo the count)
CLASSES = [0, 47, 93, 20, 75, 4, 61, 15]


# -- the run's settings and a check's record -----------------------------------------------------------


@dataclass
class Context:
    """What every check gets: the device, the sizes, and where it records figures as it goes.

    Attributes:
        device: ``torch.device`` the models run on.
        quick: reduced sizes (CPU smoke test).
        compile: whether the static engine compiles (and on CUDA graphs) its steps.
        details: the check's figures so far (kept when the check is stopped by its time bound).
        on_record: called after every :meth:`record` (a child process writes its file there).
        weights: the built-in model's weights folder (None: the shipped weights).
    """

    device: torch.device
    quick: bool
    compile: bool
    weights: Path | None = None
    details: dict = field(default_factory=dict)
    on_record: Callable[[dict], None] | None = None

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def record(self, **figures: Any) -> None:
        """Add figures to the check's details (JSON-ready values)."""
        self.details.update(figures)
        if self.on_record is not None:
            self.on_record(self.details)


@dataclass
class Outcome:
    """A check's verdict: ``status`` PASS / FAIL (correctness) or INFO (figures), ``line`` its figures,
    ``goal`` the goal printed beside them (None: none)."""

    status: str
    line: str
    goal: str | None = None


class CheckTimeout(Exception):
    """A check ran past its time bound (raised by the alarm of an in-process run)."""


# -- small helpers -------------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    """Wait for the device (CUDA); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA: ``max_memory_allocated`` since the last reset; CPU: the process's peak resident set."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # kilobytes on Linux


def builtin(device: torch.device, dtype: torch.dtype, weights: Path | None = None):
    """A private copy of the built-in model (``weights``: its folder, default the shipped one) on ``device``
    in ``dtype`` (the loader's instance is cached per process and shared: it is left as it is)."""
    from csdgen.models.builtin import load_builtin_model

    model = copy.deepcopy(load_builtin_model(weights))
    model.backbone.to(device=device, dtype=dtype)
    model.device = device
    return model


def model_name(model) -> str:
    """``built-in model`` or ``tiny random Llama`` (what a figure's line says it was measured on)."""
    return "built-in model" if hasattr(model, "components") else "tiny random Llama"


def tiny_llama(device: torch.device, dtype: torch.dtype, grid=(12, 12)):
    """A small random class-conditional Llama (the ``--quick`` stand-in for the 7B-sized one)."""
    from csdgen.models import ClassConditionalLlama

    model = ClassConditionalLlama.random(codebook_size=256, num_classes=4, grid=grid, hidden_size=64, num_layers=2,
                                         num_heads=4)
    model.backbone.to(device=device, dtype=dtype)
    model.device = device
    return model


def decoding_model(ctx: "Context", dtype: torch.dtype = torch.float32):
    """The model the decoding checks run: the built-in one; ``--quick``: a tiny random Llama of
    64 tokens (a smoke test of the code, not a figure)."""
    if ctx.quick:
        return tiny_llama(ctx.device, dtype, grid=(8, 8))
    return builtin(ctx.device, dtype, ctx.weights)


def classes_of(model, count: int) -> list[int]:
    """``count`` class ids of :data:`CLASSES` the model has (repeated where it has fewer)."""
    return [CLASSES[i % len(CLASSES)] % model.num_classes for i in range(count)]


def janus7b_sized(device: torch.device, dtype: torch.dtype = torch.bfloat16):
    """A random Llama the size of Janus-Pro-7B's language model, built on ``device`` in ``dtype`` (no
    float32 copy on the host, nothing downloaded): hidden 4096, 30 layers, MLP 11008, 32 heads, a
    102400-entry vocabulary, of which the first 16384 ids are the image codes, 24 x 24 image tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from csdgen.models import ClassConditionalLlama

    cfg = LlamaConfig(vocab_size=102400, hidden_size=4096, intermediate_size=11008, num_hidden_layers=30,
                      num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            backbone = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(previous)
    model = ClassConditionalLlama(backbone, 16384, 20, (24, 24))
    model.device = device
    return model


def streamed_weight_bytes(model) -> int:
    """Bytes of weights one decode forward reads: every parameter but the input embedding (a
    gather of a few rows), of the output layer only its codebook rows (``code_logits``)."""
    backbone = model.backbone
    total = sum(p.numel() * p.element_size() for p in backbone.parameters())  # a tied weight once
    embed, head = backbone.get_input_embeddings().weight, backbone.lm_head.weight
    codebook_rows = model.codebook_size * head.shape[1] * head.element_size()
    total -= embed.numel() * embed.element_size()
    if head is embed:  # tied: the head's codebook rows are read
        return total + codebook_rows
    return total - head.numel() * head.element_size() + codebook_rows


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int = 5) -> float:
    """Bytes per second a device-to-device copy of ``nbytes`` moves (read plus written), best of ``repeats``."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = math.inf
    for _ in range(repeats):
        sync(device)
        began = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - began)
    return 2 * nbytes / best


def open_session(model, classes, engine: str, compile: bool, capacity: int | None = None, guided: bool = True):
    """A prefilled decoding session of ``engine`` ("eager" or "static") and its prefill logits."""
    from csdgen.models._static import open_engine

    session = open_engine(model.start(list(classes), None, guided), engine, compile if engine == "static" else False,
                          capacity=capacity)
    return session, session.prefill()


def logits_of(out) -> torch.Tensor:
    """A WindowLogits -> ``[rows, W, V]`` float32 on the CPU (conditional rows, then unconditional)."""
    parts = [out.cond] + ([out.uncond] if out.uncond is not None else [])
    return torch.cat([p.float().cpu() for p in parts])


def compare_logits(got: torch.Tensor, want: torch.Tensor) -> dict:
    """Differences of two logit tensors ``[..., V]`` (float32): max |difference|, the total variation
    between their softmax distributions (mean and max over positions) and the argmax agreement."""
    if got.shape != want.shape:
        raise ValueError(f"logits of shape {tuple(got.shape)} against {tuple(want.shape)}")
    got, want = got.reshape(-1, got.shape[-1]), want.reshape(-1, want.shape[-1])
    tv = 0.5 * (got.softmax(-1) - want.softmax(-1)).abs().sum(-1)
    return {"max_abs": float((got - want).abs().max()), "tv_mean": float(tv.mean()), "tv_max": float(tv.max()),
            "argmax_agree": float((got.argmax(-1) == want.argmax(-1)).float().mean()), "positions": int(tv.numel())}


def merge_differences(parts: list[dict]) -> dict:
    """Several :func:`compare_logits` results as one (max of maxima, position-weighted means)."""
    n = sum(p["positions"] for p in parts)
    return {"max_abs": max(p["max_abs"] for p in parts), "tv_max": max(p["tv_max"] for p in parts),
            "tv_mean": sum(p["tv_mean"] * p["positions"] for p in parts) / n,
            "argmax_agree": sum(p["argmax_agree"] * p["positions"] for p in parts) / n, "positions": n}


def within_tolerance(diff: dict, dtype: torch.dtype, noise: dict | None = None) -> bool:
    """Whether a :func:`compare_logits` result is within the tolerance of ``dtype``: float32
    :data:`TOL_F32_LOGIT`; bfloat16 :data:`TOL_BF16_TV_MEAN` and :data:`TOL_BF16_TV_MAX`, or twice
    ``noise`` (the bfloat16 model's own distance from the float32 one) where that is larger."""
    if dtype == torch.float32:
        return diff["max_abs"] <= TOL_F32_LOGIT
    mean, most = bf16_tolerance(noise)
    return diff["tv_mean"] <= mean and diff["tv_max"] <= most


def bf16_tolerance(noise: dict | None) -> tuple[float, float]:
    """The bfloat16 TV tolerance (mean, max): the fixed one, or twice the bfloat16 rounding's own ``noise``."""
    if noise is None:
        return TOL_BF16_TV_MEAN, TOL_BF16_TV_MAX
    return max(TOL_BF16_TV_MEAN, 2 * noise["tv_mean"]), max(TOL_BF16_TV_MAX, 2 * noise["tv_max"])


def tolerance_text(dtype: torch.dtype) -> str:
    if dtype == torch.float32:
        return f"max|dlogit| <= {TOL_F32_LOGIT:g}"
    return f"TV mean <= {TOL_BF16_TV_MEAN:g}, max <= {TOL_BF16_TV_MAX:g}"


def diff_text(diff: dict) -> str:
    return (f"max|dlogit| {diff['max_abs']:.2e}, TV mean {diff['tv_mean']:.1e} max {diff['tv_max']:.1e}, "
            f"argmax {100 * diff['argmax_agree']:.1f} %")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def reference_tokens(model, classes, seed: int = 0) -> torch.Tensor:
    """``[B, N]`` tokens the model itself draws (CSD, window 16, eager): realistic contexts to feed."""
    import csdgen

    return csdgen.generate(model, list(classes), method="csd", window=16, seed=seed, engine="eager").tokens


# -- host syncs ----------------------------------------------------------------------------------------

def _counted_host_syncs(run_fn: Callable[[], Any], model) -> tuple[Any, Counter, int]:
    """Run ``run_fn`` under :class:`csdgen.engine.syncs.HostSyncCounter` (what would be host syncs on a
    GPU, told apart on the CPU by which tensors derive from the model's): ``(result, where, iterations)``
    with the syncs of the decoding iterations only (setup and the end's statistics counted apart)."""
    from csdgen.engine.syncs import HostSyncCounter

    with HostSyncCounter(model) as counter:
        result = run_fn()
    where = Counter()
    for event in counter.events:
        if isinstance(event.phase, int):
            where[f"{event.kind} {event.what} at {event.where.split(' <- ')[0]}"] += 1
    return result, where, counter.iterations


def _cuda_sync_warnings(run_fn: Callable[[], Any]) -> tuple[Any, Counter]:
    """Run ``run_fn`` under ``torch.cuda.set_sync_debug_mode("warn")`` and count its sync warnings."""
    import warnings

    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = run_fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    ops = Counter()
    for w in caught:
        if "synchroniz" in str(w.message):
            ops[f"{Path(w.filename).name}:{w.lineno}"] += 1
    return result, ops


def count_syncs(run_fn: Callable[[], Any], device: torch.device, model=None) -> tuple[Any, int, Counter, int | None]:
    """``(run_fn(), syncs, where, iterations)``: the host syncs ``run_fn`` made on ``device``.

    CUDA: the sync debug mode's warnings over the whole run (``where``: file:line of each;
    ``iterations`` None: the caller divides by the run's forwards). Elsewhere:
    :class:`csdgen.engine.syncs.HostSyncCounter` over ``model``'s tensors, the decoding
    iterations only (``where``: kind, operation and line; ``iterations``: the iterations counted).
    """
    if device.type == "cuda":
        result, where = _cuda_sync_warnings(run_fn)
        return result, sum(where.values()), where, None
    result, where, iterations = _counted_host_syncs(run_fn, model)
    return result, sum(where.values()), where, iterations


# -- the checks ----------------------------------------------------------------------------------------


def teacher_forced(model, classes, tokens: torch.Tensor, width: int, upto: int, engine: str, compile: bool,
                   starts: list[int] | None = None) -> list[torch.Tensor]:
    """Logits ``[rows, W, V]`` (CPU float32) of every forward of ``tokens[:, :upto]`` fed ``width`` at a time."""
    session, first = open_session(model, classes, engine, compile)
    outs = [logits_of(first)]
    tokens = tokens.to(model.device)
    for start in range(0, upto, width):
        outs.append(logits_of(session.forward(tokens[:, start:start + width], start)))
    sync(model.device)
    return outs


def check_logits(ctx: Context) -> Outcome:
    """Static (compiled, graphed on CUDA) against eager, teacher-forced, per dtype and width."""
    reference = builtin(ctx.device, torch.float32, ctx.weights)
    classes = classes_of(reference, 2)
    widths = (1, 16, 32)
    upto = 32 if ctx.quick else 96  # within one attended-columns bucket of the compiled steps
    tokens = reference_tokens(reference, classes)
    del reference
    ok, parts, eager32 = True, [], {}
    for dtype in (torch.float32, torch.bfloat16):
        model = builtin(ctx.device, dtype, ctx.weights)
        for width in widths:
            eager = teacher_forced(model, classes, tokens, width, upto, "eager", False)
            static = teacher_forced(model, classes, tokens, width, upto, "static", ctx.compile)
            diff = merge_differences([compare_logits(s, e) for s, e in zip(static, eager)])
            noise = None
            if dtype == torch.float32:
                eager32[width] = eager
            else:  # bfloat16's own error: its eager logits against float32's
                noise = merge_differences([compare_logits(e, r) for e, r in zip(eager, eager32[width])])
            good = within_tolerance(diff, dtype, noise)
            ok &= good
            ctx.record(**{f"{dtype_name(dtype)}_W{width}": {**diff, "pass": good, "bf16_vs_f32": noise}})
            tol = "" if noise is None else " (bf16 vs f32 TV mean {:.1e} max {:.1e}; tolerance {:.1e}, {:.1e})".format(
                noise["tv_mean"], noise["tv_max"], *bf16_tolerance(noise))
            parts.append(f"{dtype_name(dtype)} W{width}: {diff_text(diff)}{tol}{'' if good else ' FAIL'}")
    engine = "static compiled + CUDA graphs" if ctx.compile and ctx.cuda else (
        "static compiled" if ctx.compile else "static (not compiled)")
    return Outcome("PASS" if ok else "FAIL", f"{engine} vs eager, teacher-forced {upto} tokens, 2 images guided: "
                   + "; ".join(parts), f"float32 {tolerance_text(torch.float32)}; bfloat16 {tolerance_text(torch.bfloat16)}"
                   " or twice bfloat16's own distance from float32")


def check_grow(ctx: Context) -> Outcome:
    """A static session grown past its capacity, then shrunk, against each image's own eager session."""
    reference = builtin(ctx.device, torch.float32, ctx.weights)
    classes = classes_of(reference, 5)
    width, steps = (4, 2) if ctx.quick else (16, 2)
    tokens = reference_tokens(reference, classes)
    del reference
    ok, parts = True, []
    for dtype in (torch.float32, torch.bfloat16):
        model = builtin(ctx.device, dtype, ctx.weights)
        tk = tokens.to(ctx.device)
        got: dict[int, list[torch.Tensor]] = {i: [] for i in range(5)}
        # the batch: images 0, 1 in 2 slots; 2, 3, 4 admitted past the capacity; then all but 0 and 3 leave
        session, first = open_session(model, classes[:2], "static", ctx.compile, capacity=2)
        rows = [0, 1]
        lengths = {0: 0, 1: 0}

        def feed(rows):
            start = torch.tensor([lengths[i] for i in rows])
            chunk = torch.stack([tk[i, lengths[i]:lengths[i] + width] for i in rows])
            out = logits_of(session.forward(chunk, start))
            B = len(rows)
            for j, i in enumerate(rows):  # guided: rows j (cond) and B + j (uncond)
                got[i].append(out[[j, B + j]])
                lengths[i] += width

        for _ in range(steps):
            feed(rows)
        other, _ = open_session(model, classes[2:5], "static", ctx.compile)
        session.admit(other)
        rows += [2, 3, 4]
        lengths.update({2: 0, 3: 0, 4: 0})
        for _ in range(steps):
            feed(rows)
        keep = [0, 3]  # back to 2 slots: the shape captured before the growth, its buffers since replaced
        session.select_rows(torch.tensor([rows.index(i) for i in keep]))
        rows = keep
        for _ in range(steps):
            feed(rows)
        sync(ctx.device)
        diffs = []
        for i, outs in got.items():  # the image alone, eager, the same tokens at the same starts
            alone, _ = open_session(model, [classes[i]], "eager", False)
            for k, out in enumerate(outs):
                want = logits_of(alone.forward(tk[i:i + 1, k * width:(k + 1) * width], k * width))
                diffs.append(compare_logits(out, want))
        diff = merge_differences(diffs)
        good = within_tolerance(diff, dtype)
        ok &= good
        ctx.record(**{dtype_name(dtype): {**diff, "pass": good}})
        parts.append(f"{dtype_name(dtype)}: {diff_text(diff)}{'' if good else ' FAIL'}")
    return Outcome("PASS" if ok else "FAIL", f"static (compile {'on' if ctx.compile else 'off'}), capacity 2 -> 5 images "
                   f"-> 2, window {width}, against each image's eager session: " + "; ".join(parts),
                   f"float32 {tolerance_text(torch.float32)}; bfloat16 {tolerance_text(torch.bfloat16)}")


def check_continuous(ctx: Context) -> Outcome:
    """ContinuousBatch admitting past its capacity against solo generate: float32 tokens."""
    import csdgen
    from csdgen.engine import ContinuousBatch

    model = decoding_model(ctx)
    classes = classes_of(model, 4 if ctx.quick else 6)
    window = 16
    batch = ContinuousBatch(model, method="csd", window=window, engine="static", compile=ctx.compile, capacity=2)
    handles = {}
    pending = list(range(len(classes)))

    def admit(k):
        for i in pending[:k]:
            handles[batch.admit([classes[i]], [i], [i])[0]] = i
        del pending[:k]

    admit(2)
    finished, iterations, most = {}, 0, 2
    while batch.size or pending:
        most = max(most, batch.size)
        for f in batch.step():
            finished[handles[f.handle]] = f.tokens
            admit(1)  # one joins as one leaves
        iterations += 1
        if iterations == 3:
            admit(3)  # past the capacity: the cache grows
        if not batch.size and pending:
            admit(len(pending))
    agree = []
    for i, tokens in sorted(finished.items()):
        alone = csdgen.generate(model, [classes[i]], method="csd", window=window, seed=i, image_indices=[i],
                                engine="static", compile=ctx.compile)
        agree.append(float((alone.tokens[0].cpu() == tokens).float().mean()))
    mean = statistics.mean(agree)
    exact = sum(a == 1.0 for a in agree)
    ctx.record(agreement=agree, exact=exact, iterations=iterations, most_in_batch=most)
    ok = mean >= 0.9 and len(agree) == len(classes)
    return Outcome("PASS" if ok else "FAIL", f"{model_name(model)} float32 tokens, {len(classes)} images through 2 slots (CSD, window {window}), "
                   f"{iterations} iterations, up to {most} at once: {exact}/{len(agree)} images equal, mean token agreement "
                   f"{100 * mean:.1f} % (min {100 * min(agree):.1f} %)", "mean >= 90 % (tokens: float32 only)")


def check_syncs(ctx: Context) -> Outcome:
    """Host syncs per iteration, per engine and for window='auto'."""
    import csdgen

    model = decoding_model(ctx)
    classes = classes_of(model, 2)
    runs = [("eager W16", dict(engine="eager", window=16)),
            ("static W16", dict(engine="static", window=16, compile=ctx.compile)),
            ("static auto", dict(engine="static", window="auto", compile=ctx.compile))]
    parts, worst = [], 0.0
    for label, kwargs in runs:
        if ctx.cuda:  # compile and capture first: only the steady state is counted
            csdgen.generate(model, classes, method="csd", seed=1, **kwargs)
        run_kwargs = kwargs if ctx.cuda else {**kwargs, "compile": False}  # the CPU counter does not trace compiled code
        result, syncs, where, iterations = count_syncs(
            lambda: csdgen.generate(model, classes, method="csd", seed=0, **run_kwargs), ctx.device, model)
        iterations = result.steps if iterations is None else iterations
        per = syncs / max(iterations, 1)
        worst = max(worst, per)
        ctx.record(**{label: {"syncs": syncs, "iterations": iterations, "per_iteration": per,
                              "where": dict(where.most_common(8))}})
        parts.append(f"{label} {per:.2f} ({syncs} in {iterations})")
    how = ("sync debug mode warnings over the whole run (prefill included)" if ctx.cuda else
           "csdgen.engine.syncs.HostSyncCounter, decoding iterations")
    met = "met" if worst <= GOAL_SYNCS + 0.05 else "not met"
    return Outcome("INFO", f"syncs per iteration, {model_name(model)} CSD batch 2, {how}: " + ", ".join(parts),
                   f"<= {GOAL_SYNCS:g} per iteration: {met}")


def time_forward(model, session, half: int, width: int, repeats: int) -> float:
    """Median seconds of one forward of ``width`` slots at image position ``half`` (2 warm-ups first)."""
    batch = session.batch_size
    tokens = torch.randint(model.codebook_size, (batch, width), device=model.device)
    samples = []
    for k in range(repeats + 2):
        sync(model.device)
        began = time.perf_counter()
        session.forward(tokens, torch.full((batch,), half))
        sync(model.device)
        if k >= 2:
            samples.append(time.perf_counter() - began)
        session.rollback(torch.full((batch,), half))
    return statistics.median(samples)


def check_forward(ctx: Context) -> Outcome:
    """ms per forward of a Janus-Pro-7B-sized bfloat16 Llama against its bandwidth floor."""
    if ctx.quick:
        model, name = tiny_llama(ctx.device, torch.bfloat16), "tiny random Llama (2 layers, hidden 64), bfloat16"
        nbytes, repeats = 64 << 20, 3
    else:
        model, name = janus7b_sized(ctx.device), "random Llama of Janus-Pro-7B's size, bfloat16"
        nbytes, repeats = 2 << 30, 10
    bandwidth = copy_bandwidth(ctx.device, nbytes)
    weights = streamed_weight_bytes(model)
    floor = weights / bandwidth
    ctx.record(model=name, bandwidth_bytes_per_s=bandwidth, streamed_weight_bytes=weights, floor_s=floor)
    half = model.num_image_tokens // 2
    prefix = torch.randint(model.codebook_size, (1, half), device=ctx.device)
    engines = [("eager", "eager", False), ("static" + (" graphed" if ctx.cuda and ctx.compile else ""), "static", ctx.compile)]
    times: dict[str, dict[int, float]] = {}
    for label, engine, compile in engines:
        session, _ = open_session(model, [0], engine, compile)
        fill(session, prefix)
        times[label] = {}
        for width in (1, 32, 16, 64):  # the goal's width first: a time bound keeps what was measured
            began = time.perf_counter()
            times[label][width] = time_forward(model, session, half, width, repeats)
            ctx.record(ms_per_forward={k: {w: 1e3 * t for w, t in v.items()} for k, v in times.items()},
                       **{f"first_call_s_{label}_W{width}": time.perf_counter() - began})
    graphed = times[engines[1][0]]
    ratio = graphed[1] / floor
    line = "; ".join(f"{label} " + ", ".join(f"W{w} {1e3 * t[w]:.2f}" for w in sorted(t)) for label, t in times.items())
    return Outcome("INFO", f"{name}, batch 1 guided (2 rows), {half} tokens cached: ms per forward {line}; floor "
                   f"{1e3 * floor:.2f} ms ({weights / 1e9:.2f} GB of weights at {bandwidth / 1e9:.0f} GB/s copy bandwidth)",
                   f"{engines[1][0]} W1 <= {GOAL_FLOOR_RATIO}x floor: {ratio:.2f}x "
                   f"{'met' if ratio <= GOAL_FLOOR_RATIO else 'not met'}")


def quantize_bnb_nf4(model) -> None:
    """Replace the decoder layers' linear layers by bitsandbytes' nf4 ``Linear4bit`` (quantised when moved to CUDA):
    what ``BitsAndBytesConfig(load_in_4bit=True)`` does while reading a checkpoint, for a model built in memory."""
    import bitsandbytes as bnb

    from csdgen.models.quantize import decoder_layers_prefix

    backbone = model.backbone
    prefix = decoder_layers_prefix(backbone) + "."
    names = [n for n, m in backbone.named_modules() if isinstance(m, torch.nn.Linear) and n.startswith(prefix)]
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent, old = backbone.get_submodule(parent_name), backbone.get_submodule(name)
        new = bnb.nn.Linear4bit(old.in_features, old.out_features, bias=old.bias is not None,
                                compute_dtype=old.weight.dtype, quant_type="nf4", device="meta")
        new.weight = bnb.nn.Params4bit(old.weight.data, requires_grad=False, quant_type="nf4")  # quantised by .to()
        if old.bias is not None:
            new.bias = torch.nn.Parameter(old.bias.data, requires_grad=False)
        setattr(parent, child, new.to(model.device))
        del old


def check_quant(ctx: Context) -> Outcome:
    """ms per forward and weight memory of a Janus-Pro-7B-sized Llama, bfloat16 against torchao int8 weight-only and
    bitsandbytes nf4 (each where it runs; eager engine, batch 1 guided, half the image cached)."""
    import importlib.util

    from csdgen.models.memory import format_bytes, module_bytes
    from csdgen.models.quantize import check_quantize, quantize_module

    dtype = torch.float32 if ctx.quick and not ctx.cuda else torch.bfloat16
    build = (lambda: tiny_llama(ctx.device, dtype)) if ctx.quick else (lambda: janus7b_sized(ctx.device))
    name = "tiny random Llama" if ctx.quick else "random Llama of Janus-Pro-7B's size"
    repeats = 3 if ctx.quick else 10
    parts, skipped = [], []
    for kind in ("none", "int8", "nf4"):
        try:
            if kind == "int8":
                check_quantize("int8", ctx.device)
            if kind == "nf4" and (importlib.util.find_spec("bitsandbytes") is None or not ctx.cuda):
                raise ValueError("nf4: bitsandbytes not installed" if ctx.cuda else "nf4: CUDA only in this check")
        except ValueError as exc:
            skipped.append(str(exc))
            continue
        model = build()
        if kind == "int8":
            quantize_module(model.backbone, "int8", ctx.device)
        elif kind == "nf4":
            quantize_bnb_nf4(model)
        sync(ctx.device)
        weights = module_bytes(model.backbone)
        half = model.num_image_tokens // 2
        session, _ = open_session(model, [0], "eager", False)
        fill(session, torch.randint(model.codebook_size, (1, half), device=ctx.device))
        ms = {w: 1e3 * time_forward(model, session, half, w, repeats) for w in (1, 32)}
        label = "bfloat16" if kind == "none" and dtype == torch.bfloat16 else ("float32" if kind == "none" else kind)
        ctx.record(**{f"{label}_ms_per_forward": ms, f"{label}_weight_bytes": weights})
        parts.append(f"{label} W1 {ms[1]:.2f} ms, W32 {ms[32]:.2f} ms, weights {format_bytes(weights)}")
        del session, model
        if ctx.cuda:
            torch.cuda.empty_cache()
    line = f"{name}, eager, batch 1 guided: " + "; ".join(parts)
    if skipped:
        line += " (not run: " + "; ".join(skipped) + ")"
    return Outcome("INFO", line)


def fill(session, prefix: torch.Tensor) -> None:
    """Cache ``prefix`` ``[B, n]`` from image position 0 in windows of 64 (the static engine's widest
    bucket: the cache is never widened), through the uncompiled step (a compiled session compiles
    no shape for the prefix, only for what is timed after it)."""
    compiled = getattr(session, "compile", False)
    if compiled:
        session.compile = False
    try:
        for start in range(0, prefix.shape[1], 64):
            session.forward(prefix[:, start:start + 64], start)
    finally:
        if compiled:
            session.compile = True


def check_speedup(ctx: Context) -> Outcome:
    """AR, SJD and CSD wall speed-up over AR against step compression, batch 1, built-in model."""
    import csdgen

    model = decoding_model(ctx)
    repeats = 1 if ctx.quick else 3
    classes = classes_of(model, len(CLASSES))
    runs = [("AR", "ar", 1), ("SJD", "sjd", 32), ("CSD", "csd", 32), ("CSD", "csd", "auto")]
    rows, ar, parts = {}, None, []
    for label, method, window in runs:
        if not ctx.quick:  # a warm-up call compiles and captures
            csdgen.generate(model, classes[:1], method=method, window=window, seed=99)
        outs = [csdgen.generate(model, [classes[k % len(classes)]], method=method, window=window, seed=k)
                for k in range(repeats)]
        seconds = statistics.median(o.seconds for o in outs)
        compression = statistics.mean(o.step_compression for o in outs)
        ar = ar or seconds
        speedup = ar / seconds
        key = f"{label} W{window}" if window != "auto" else f"{label} auto"
        rows[key] = {"seconds": seconds, "step_compression": compression, "speedup": speedup,
                     "ratio": speedup / compression, "engine": outs[0].settings.get("engine")}
        ctx.record(runs=rows)
        if method != "ar":
            parts.append(f"{key} {speedup:.2f}x of {compression:.2f}x ({speedup / compression:.2f})")
    csd = rows["CSD W32"]["ratio"]
    return Outcome("INFO", f"{model_name(model)} float32 batch 1, engine {rows['AR W1']['engine']}, median of {repeats}: AR "
                   f"{1e3 * ar:.0f} ms; speed-up of step compression: " + ", ".join(parts),
                   f"CSD W32 speed-up >= {GOAL_SPEEDUP_RATIO}x its compression: {csd:.2f} "
                   f"{'met' if csd >= GOAL_SPEEDUP_RATIO else 'not met'}")


def compiled_shape_count() -> int:
    """Compiled static shapes this process has run (``csdgen.models._static.COMPILE_SECONDS``)."""
    from csdgen.models import _static

    return len(getattr(_static, "COMPILE_SECONDS", {}))


def check_compile(ctx: Context) -> Outcome:
    """Shapes compiled and compile seconds of runs at batch 4, 3, then 4 again."""
    import csdgen

    from csdgen.models import _static_steps

    model = decoding_model(ctx)
    parts = []
    backend = _static_steps.COMPILE_BACKEND
    if not ctx.compile:  # trace the same shapes with dynamo's eager backend: the count, in seconds not minutes
        _static_steps.COMPILE_BACKEND = "eager"
    try:
        for k, batch in enumerate((4, 3, 4)):
            before = compiled_shape_count()
            result = csdgen.generate(model, classes_of(model, batch), method="csd", window="auto", seed=k,
                                     engine="static", compile=True)
            seconds = sum(result.compile_seconds.values())
            new = compiled_shape_count() - before
            ctx.record(**{f"run{k + 1}_batch{batch}": {"shapes_first_called": len(result.compile_seconds),
                                                       "new_shapes": new, "compile_seconds": seconds,
                                                       "run_seconds": result.seconds, "widths": sorted(set(result.widths))}})
            parts.append(f"batch {batch}: {new} new shapes, {len(result.compile_seconds)} first calls, {seconds:.1f} s of "
                         f"{result.seconds:.1f} s")
    finally:
        _static_steps.COMPILE_BACKEND = backend
    visited, bound = compiled_shape_bound(model)
    ctx.record(visited_shapes=visited, documented_bound=bound)
    goal = None
    if bound:
        goal = f"compiled shapes within step_shapes' bound: {visited} of {bound} ({'met' if visited <= bound else 'not met'})"
    how = f"compiled ({backend})" if ctx.compile else "traced with dynamo's eager backend"
    return Outcome("INFO", f"{model_name(model)}, {how}, CSD auto: " + "; ".join(parts)
                   + f"; {compiled_shape_count()} shapes in all", goal)


def compiled_shape_bound(model) -> tuple[int, int]:
    """``(visited, bound)``: the compiled steps ``model``'s buffer sets hold and the documented bound
    for those sets (:func:`csdgen.models._static.step_shapes` of each set's capacity, prompt bucket
    and cache width, every window bucket); ``(0, 0)`` where nothing was compiled."""
    from csdgen.models._static import model_buffers, step_shapes

    visited, bound = set(), set()
    for buffers in model_buffers(model):
        for shape in buffers.steps:
            visited.add(shape)
            bound.update(step_shapes(guided=shape.guided, capacity=shape.slots, prompt_width=shape.prompt,
                                     image_columns=0, columns=shape.columns))
    return len(visited), len(bound)


def check_dtype(ctx: Context) -> Outcome:
    """Built-in model float32 against bfloat16: step compression and NLL under the float32 model."""
    import csdgen
    from csdgen.bench import target_nll

    reference = builtin(ctx.device, torch.float32, ctx.weights)
    classes = classes_of(reference, 1 if ctx.quick else len(CLASSES))
    figures, ok, parts = {}, True, []
    for method in ("sjd", "csd"):
        for dtype in (torch.float32, torch.bfloat16):
            model = reference if dtype == torch.float32 else builtin(ctx.device, dtype, ctx.weights)
            result = csdgen.generate(model, classes, method=method, window=32, seed=0)
            nll = float(target_nll(reference, classes, result.tokens).mean())
            figures[f"{method} {dtype_name(dtype)}"] = {"step_compression": result.step_compression, "nll": nll}
            ctx.record(runs=figures)
        f32, b16 = figures[f"{method} float32"], figures[f"{method} bfloat16"]
        good = b16["step_compression"] >= 0.8 * f32["step_compression"] and b16["nll"] <= f32["nll"] + 0.25
        ok &= good
        parts.append(f"{method.upper()} W32 compression {f32['step_compression']:.2f} / {b16['step_compression']:.2f}, "
                     f"NLL {f32['nll']:.3f} / {b16['nll']:.3f}{'' if good else ' FAIL'}")
    return Outcome("PASS" if ok else "FAIL", f"built-in model float32 / bfloat16, {len(classes)} images: " + "; ".join(parts),
                   "bfloat16 compression >= 0.8x float32's, NLL (nats/token, float32 model) <= float32's + 0.25")


def serve_missing() -> list[str]:
    """The server's modules that cannot be imported here."""
    import importlib.util

    return [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]


def serve_skip() -> Outcome | None:
    """SKIP, naming the server's modules that cannot be imported here; None when they all can."""
    missing = serve_missing()
    if missing:
        return Outcome("SKIP", f"{', '.join(missing)} cannot be imported here: carry their wheels (benchmarks/gpu_wheels.sh)")
    return None


def run_benchmark(ctx: Context, script: str, options: list[str]) -> dict | Outcome:
    """Run ``benchmarks/SCRIPT`` with ``options``, ``--device`` and ``--json`` into a temporary file;
    returns what it wrote, or a FAIL outcome naming its exit status and last error line (its
    stderr recorded) when it failed or wrote nothing."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        argv = [sys.executable, str(ROOT / "benchmarks" / script), *options, "--device", ctx.device.type, "--json", str(out)]
        if ctx.weights is not None:
            argv += ["--weights", str(ctx.weights)]
        run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        if run.returncode != 0 or not out.is_file():
            ctx.record(stderr=run.stderr[-2000:])
            return Outcome("FAIL", f"{Path(script).stem} exited {run.returncode}: "
                                   f"{(run.stderr.strip().splitlines() or [''])[-1][:200]}")
        return json.loads(out.read_text())


def check_serve(ctx: Context) -> Outcome:
    """bench_serve at 16 clients: continuous, static and one-at-a-time batching."""
    skip = serve_skip()
    if skip is not None:
        return skip
    clients, duration, modes = (2, 2, "continuous") if ctx.quick else (16, 10, "continuous,static,one-at-a-time")
    report = run_benchmark(ctx, "bench_serve.py", ["--clients", str(clients), "--methods", "csd", "--modes", modes,
                                                    "--duration", str(duration), "--check", "0", "--max-batch", "16"])
    if isinstance(report, Outcome):
        return report
    rows = report["rows"]
    ctx.record(rows=rows)
    errors = sum(r["errors"] for r in rows)
    parts = [f"{r['mode']} {r['images_per_second']:.2f} images/s (p50 {r['p50']:.1f} s, occupancy {r['occupancy']:.1f})"
             for r in rows]
    return Outcome("FAIL" if errors else "INFO", f"CSD auto, {clients} clients, {duration} s each: " + "; ".join(parts)
                   + f"; {errors} errors")


def check_serve_open(ctx: Context) -> Outcome:
    """The server's scheduler under open-loop arrivals (benchmarks/serve_replay.py): continuous
    against static batching, p95 latency at 0.6 and 0.9 of the capacity."""
    skip = serve_skip()
    if skip is not None:
        return skip
    goal = "continuous p95 <= 0.7x static's at every rate"
    if ctx.quick:
        options = ["--rate", "0.6", "--capacity", "4.0", "--duration", "3", "--requests", "2", "--max-batch", "2"]
    else:
        options = ["--rate", "0.6,0.9", "--capacity-seconds", "8", "--duration", "30", "--requests", "120"]
    report = run_benchmark(ctx, "serve_replay.py", ["--methods", "csd", *options])
    if isinstance(report, Outcome):
        return report
    cells = [{k: v for k, v in c.items() if k != "latencies"} for c in report["cells"]]
    ctx.record(cells=cells)
    errors = sum(c["errors"] for c in cells)
    parts = [f"{c['rate']}: continuous p95 {c['p95']:.2f} s = {c['p95_over_static']:.2f}x static's"
             for c in cells if "p95_over_static" in c]
    capacity = cells[0]["capacity"] if cells else float("nan")
    how = "given" if ctx.quick else "measured"
    return Outcome("FAIL" if errors else "INFO", f"CSD auto, capacity {capacity:.1f} images/s ({how}), rate " + "; ".join(parts)
                   + f"; {errors} errors", goal)


def check_serve_closed(ctx: Context) -> Outcome:
    """The server's closed loop without HTTP (benchmarks/served_closed_loop.py): SJD's and CSD's images per
    second (window auto) over AR's at 1, 4, 16 and 32 clients."""
    skip = serve_skip()
    if skip is not None:
        return skip
    goal = "SJD and CSD >= 0.97x AR at every client count, >= 1.3x at 1 client"
    if ctx.quick:
        options = ["--clients", "1", "--per-client", "1", "--rounds", "1", "--configs", "ar:1,csd:4"]
    else:
        options = ["--clients", "1,4,16,32", "--per-client", "3,1,1,1", "--rounds", "3", "--configs",
                   "ar:1,sjd:auto,csd:auto"]
    report = run_benchmark(ctx, "served_closed_loop.py", options)
    if isinstance(report, Outcome):
        return report
    cells = report["cells"]
    ctx.record(cells=cells)
    by_clients: dict[int, list[str]] = {}
    for cell in cells:
        if cell["method"] == "ar":
            continue
        ratios = [r["over_first"] for r in cell["rounds"]]
        kept = ratios[1:] or ratios  # the first round of a client count compiles the shapes it meets
        by_clients.setdefault(cell["clients"], []).append(f"{cell['method'].upper()} {statistics.median(kept):.2f}x")
    parts = [f"{clients} client{'s' if clients > 1 else ''}: {', '.join(figures)}" for clients, figures in by_clients.items()]
    return Outcome("INFO", "images/s over AR (auto window, median of rounds): " + "; ".join(parts), goal)


@dataclass(frozen=True)
class Check:
    """A check: its function, its time bound on a GPU in seconds, and whether a failure is a failed run."""

    run: Callable[[Context], Outcome]
    bound_s: float
    correctness: bool


#: the checks in the order they run (the most telling first: a spent budget skips the last)
CHECKS: dict[str, Check] = {
    "logits": Check(check_logits, 100, True),
    "grow": Check(check_grow, 60, True),
    "continuous": Check(check_continuous, 45, True),
    "syncs": Check(check_syncs, 45, False),
    "forward": Check(check_forward, 180, False),  # 4 compiles of a 30-layer model
    "speedup": Check(check_speedup, 60, False),
    "serve_open": Check(check_serve_open, 150, False),
    "serve_closed": Check(check_serve_closed, 300, False),  # the first round of each client count compiles its shapes
    "dtype": Check(check_dtype, 40, True),
    "compile": Check(check_compile, 45, False),
    "serve": Check(check_serve, 90, False),
    "quant": Check(check_quant, 150, False),  # three 7B-sized models in turn (bf16, int8, nf4)
}


# -- running the checks --------------------------------------------------------------------------------


def run_in_process(name: str, ctx: Context, bound: float) -> dict:
    """Run check ``name`` here, stopped by an alarm after ``bound`` seconds (figures so far kept)."""
    def alarm(signum, frame):
        raise CheckTimeout(f"{name} ran past its bound of {bound:.0f} s")

    reset_peak_memory(ctx.device)
    began = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, max(bound, 1.0))
    try:
        outcome = CHECKS[name].run(ctx)
        record = {"status": outcome.status, "line": outcome.line, "goal": outcome.goal}
    except CheckTimeout as error:
        record = {"status": "TIMEOUT", "line": str(error)}
    except Exception as error:  # a crash is a finding: reported, and the next check runs
        record = {"status": "ERROR", "line": f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}",
                  "traceback": traceback.format_exc()[-4000:]}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    record.update(seconds=time.perf_counter() - began, peak_memory_bytes=peak_memory_bytes(ctx.device),
                  details=ctx.details)
    return record


def run_isolated(name: str, args, bound: float) -> dict:
    """Run check ``name`` in a child process of its own, killed (with its process group) after ``bound`` seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        argv = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--child-result", str(result),
                "--device", args.device, "--compile", args.compile] + (["--quick"] if args.quick else []) \
            + (["--weights", str(args.weights)] if args.weights is not None else [])
        began = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=bound)
            timed_out = False
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            timed_out = True
        seconds = time.perf_counter() - began
        record = json.loads(result.read_text()) if result.is_file() else {}
    if timed_out:
        record.update(status="TIMEOUT", line=f"{name} ran past its bound of {bound:.0f} s (killed)")
    elif "status" not in record:
        tail = (output or "").strip().splitlines()[-1:] or [""]
        record.update(status="ERROR", line=f"the check's process exited {proc.returncode}: {tail[0][:300]}")
    record["seconds"] = seconds
    record.setdefault("details", {})
    if record["status"] in ("ERROR", "TIMEOUT"):
        record["output_tail"] = (output or "")[-4000:]
    return record


def child_main(args) -> int:
    """``--child NAME``: run one check and write its record to ``--child-result`` (after every figure too)."""
    from csdgen.atomic import write_text_atomic

    path = Path(args.child_result)

    def save(details: dict) -> None:
        write_text_atomic(path, json.dumps({"details": details}, default=str))

    ctx = make_context(args)
    ctx.on_record = save
    record = run_in_process(args.child, ctx, CHECKS[args.child].bound_s * 10)  # the parent's bound kills it
    write_text_atomic(path, json.dumps(record, default=str))
    return 0


def make_context(args) -> Context:
    device = torch.device(args.device)
    compile = {"on": True, "off": False}.get(args.compile, device.type == "cuda")
    return Context(device=device, quick=args.quick, compile=compile, weights=args.weights)


def line_of(name: str, record: dict) -> str:
    """The check's printed line: name, status, figures, goal, seconds and peak memory."""
    goal = f" [goal: {record['goal']}]" if record.get("goal") else ""
    peak = record.get("peak_memory_bytes")
    memory = f", peak {peak / 2**30:.2f} GiB" if peak else ""
    return f"check {name:10} {record['status']:7} {record['line']}{goal} ({record['seconds']:.1f} s{memory})"


def environment(device: torch.device) -> dict:
    """What the run ran on: device name, torch, transformers, Python, the commit when known."""
    import transformers

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    return {"device": str(device), "device_name": name, "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "commit": checkout_commit() or None, "threads": torch.get_num_threads()}


def parse_args(argv):
    from csdgen.cli._options import path  # the CLI's path check: an empty --weights is refused, not read as "."

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--quick", action="store_true", help="reduced sizes (a tiny Llama for 'forward'; the CPU smoke test)")
    p.add_argument("--only", default=None, help=f"comma-separated checks, of {','.join(CHECKS)}")
    p.add_argument("--out", default=None, help="folder for gpu_check.json (written atomically after every check)")
    p.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run (default 480)")
    p.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                   help="compile the static engine's steps (auto: on CUDA only, as csdgen does)")
    p.add_argument("--isolate", choices=["auto", "on", "off"], default="auto",
                   help="each check in a process of its own (auto: on CUDA)")
    p.add_argument("--weights", type=path, default=None, help="built-in model weights folder (default: shipped with csdgen)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.only is not None:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        bad = [n for n in names if n not in CHECKS]
        if bad or not names:
            p.error(f"--only {args.only!r}: allowed a comma-separated list of {', '.join(CHECKS)}")
        args.checks = names
    else:
        args.checks = list(CHECKS)
    if not args.budget > 0:
        p.error(f"--budget {args.budget}: allowed seconds > 0")
    try:
        torch.device(args.device)
    except RuntimeError:
        p.error(f"--device {args.device!r}: allowed cuda, cuda:N or cpu")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: --device {args.device}: CUDA is not available here (torch {torch.__version__}); run it where "
              "a GPU is, or give --device cpu --quick for the smoke test", file=sys.stderr)
        return 2
    isolate = {"on": True, "off": False}.get(args.isolate, device.type == "cuda")
    began = time.perf_counter()
    env = environment(device)
    command = "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"gpu_check on {env['device_name']} ({env['device']}), torch {env['torch']}, transformers "
          f"{env['transformers']}, Python {env['python']}, commit {env['commit']}; budget {args.budget:.0f} s, "
          f"{'quick' if args.quick else 'full'} sizes, checks in {'their own processes' if isolate else 'this process'}",
          flush=True)
    report = {"command": command, **env, "quick": args.quick, "checks": {}}
    out = Path(args.out) / "gpu_check.json" if args.out else None
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in args.checks:
        check = CHECKS[name]
        left = args.budget - (time.perf_counter() - began)
        bound = min(check.bound_s * (1 if device.type == "cuda" else 3), left)  # the CPU is slower
        if left < 5:
            record = {"status": "SKIP", "line": f"the budget of {args.budget:.0f} s is spent", "seconds": 0.0}
        elif isolate:
            record = run_isolated(name, args, bound)
        else:
            record = run_in_process(name, make_context(args), bound)
        if check.correctness and record["status"] in ("FAIL", "ERROR", "TIMEOUT", "SKIP"):
            failed += 1
        elif record["status"] in ("FAIL", "ERROR"):
            failed += 1
        report["checks"][name] = record
        print(line_of(name, record), flush=True)
        if out is not None:
            from csdgen.atomic import write_text_atomic

            write_text_atomic(out, json.dumps(report, indent=1, default=str))
    seconds = time.perf_counter() - began
    peaks = [f"{n} {r['peak_memory_bytes'] / 2**30:.2f}" for n, r in report["checks"].items() if r.get("peak_memory_bytes")]
    if peaks:
        print(f"memory peak GiB ({'max_memory_allocated' if device.type == 'cuda' else 'process peak RSS'}): "
              + ", ".join(peaks))
    report["seconds"] = seconds
    if out is not None:
        from csdgen.atomic import write_text_atomic

        write_text_atomic(out, json.dumps(report, indent=1, default=str))
    statuses = Counter(r["status"] for r in report["checks"].values())
    print(f"gpu_check: {len(report['checks'])} checks ({', '.join(f'{v} {k}' for k, v in sorted(statuses.items()))}) in "
          f"{seconds:.0f} s; {'every correctness check passed' if not failed else f'{failed} failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
