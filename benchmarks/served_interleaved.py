"""Kept-busy served batches, one per configuration, timed in interleaved segments against the first.

Not a test: it loads the built-in model and prints. Run from the project root:

    python benchmarks/served_interleaved.py --threads 2 --dtype bfloat16 --configs ar:1,sjd:1,sjd:auto,csd:auto

Each configuration (``method:window``, the first one the unit) gets its own
:class:`csdgen.engine.ContinuousBatch` of 16 static slots (the server's), kept at ``--images``
images: before every iteration the free places are filled at once with new images (classes from
one seeded generator per configuration, so every configuration gets the same classes and seeds),
as a server with a queue keeps its batch full. The configurations take turns in segments of
``--segment-iterations`` iterations (the order reversed every other segment), ``--warm`` warm-up
segments first, then ``--segments`` timed ones. A segment's rate is the image tokens its batch
committed per second of wall time, admissions included; its ratio is that rate over the first
configuration's rate in the same turn. Where a CPU's pace drifts within minutes, only such
neighbouring segments can be compared: running the configurations one after the other
(``served_widths.py``) measures the drift as much as the configurations.

Printed per configuration: the median of its segments' ratios and each segment's, image tokens per
second, milliseconds per iteration (the forward and the acceptance), image tokens committed per
row and iteration, milliseconds of admission per admitted image and admissions' share of the time,
and the widths its window chooser used (most used first).

The model loads in a thread that ends with the load and the batches run on another thread
(:mod:`csdgen.torch_threads`), as in ``csdgen serve``.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_header import command_line  # noqa: E402
from served_closed_loop import CAPACITY, configs  # noqa: E402  (the same method:window syntax)

from csdgen.cli._options import count, path  # noqa: E402  (the CLI's own argument checks)
from csdgen.jsonio import write_json  # noqa: E402


class Kept:
    """One configuration's batch, kept at ``images`` images, and what its timed segments measured."""

    def __init__(self, model, method: str, window, images: int):
        from csdgen.engine import ContinuousBatch

        self.method, self.window, self.images = method, window, images
        self.batch = ContinuousBatch(model, method=method, window=window, capacity=CAPACITY)
        self.N = model.num_image_tokens
        self.num_classes = min(10, model.num_classes)  # the first ten classes (all of them for weights with fewer)
        self.classes, self.seed = random.Random(1), 0
        self.rates: list[float] = []
        self.tokens = self.iterations = self.admitted = 0
        self.seconds = self.step_seconds = self.admit_seconds = 0.0

    def segment(self, iterations: int, timed: bool) -> float:
        """Run ``iterations`` iterations; return the image tokens committed per second."""
        batch = self.batch
        length = dict(zip(batch.handles, batch.progress(batch.handles)[0])) if batch.size else {}
        committed, admit_s, step_s, admitted = 0, 0.0, 0.0, 0
        began = time.perf_counter()
        for _ in range(iterations):
            if batch.size < self.images:
                k = self.images - batch.size
                t = time.perf_counter()
                handles = batch.admit([self.classes.randrange(self.num_classes) for _ in range(k)],
                                      list(range(self.seed, self.seed + k)), [0] * k)
                admit_s += time.perf_counter() - t
                self.seed += k
                admitted += k
                length.update(dict.fromkeys(handles, 1))  # the prefill commits an image's first token
            t = time.perf_counter()
            finished = batch.step()
            step_s += time.perf_counter() - t
            for image in finished:
                committed += self.N - length.pop(image.handle)
        seconds = time.perf_counter() - began
        if batch.size:
            now = dict(zip(batch.handles, batch.progress(batch.handles)[0]))
            committed += sum(now[h] - length[h] for h in now)
        rate = committed / seconds
        if timed:
            self.rates.append(rate)
            self.tokens += committed
            self.iterations += iterations
            self.admitted += admitted
            self.seconds += seconds
            self.step_seconds += step_s
            self.admit_seconds += admit_s
        return rate

    def widths_chosen(self, top: int = 4) -> str:
        widths = self.batch.widths
        return ", ".join(f"{w}: {widths.count(w)}" for w in sorted(set(widths), key=widths.count, reverse=True)[:top])


def run(model, chosen, images: int, segments: int, iterations: int, warm: int) -> list[Kept]:
    kept = [Kept(model, method, window, images) for method, window in chosen]
    for s in range(warm + segments):
        for k in (kept if s % 2 == 0 else kept[::-1]):
            k.segment(iterations, timed=s >= warm)
    return kept


def rows(kept: list[Kept]) -> list[dict]:
    """One dict per configuration: every printed figure."""
    unit = kept[0].rates
    out = []
    for k in kept:
        ratios = [r / u for r, u in zip(k.rates, unit)]
        out.append({"method": k.method, "window": k.window, "ratio_median": statistics.median(ratios),
                    "ratios": ratios, "tokens_per_s": k.tokens / k.seconds,
                    "ms_per_iteration": k.step_seconds / k.iterations * 1e3,
                    "tokens_per_row_iteration": k.tokens / k.iterations / k.images,
                    "admission_ms_per_image": k.admit_seconds / max(k.admitted, 1) * 1e3,
                    "admission_share": k.admit_seconds / k.seconds, "widths": k.widths_chosen()})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", type=configs, default=configs("ar:1,sjd:auto,csd:auto"),
                   help="method:window pairs, the first the unit (default ar:1,sjd:auto,csd:auto)")
    p.add_argument("--images", type=count(1, maximum=CAPACITY), default=CAPACITY,
                   help=f"images kept in each batch, 1..{CAPACITY} (default {CAPACITY})")
    p.add_argument("--segments", type=count(1), default=10, help="timed segments per configuration (default 10)")
    p.add_argument("--segment-iterations", type=count(1), default=100, help="iterations per segment (default 100)")
    p.add_argument("--warm", type=count(0), default=1, help="untimed segments first (default 1)")
    p.add_argument("--threads", type=count(1), default=None, help="torch threads (default: torch's)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16",
                   help="the built-in model's dtype (default bfloat16)")
    p.add_argument("--json", type=Path, default=None, help="write every figure here (JSON)")
    p.add_argument("--weights", type=path, default=None, help="built-in model weights folder (default: shipped with csdgen)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from csdgen.models.builtin import load_builtin_model
    from csdgen.torch_threads import call_in_thread, set_threads

    threads = torch.get_num_threads()
    header = command_line("served_interleaved.py", argv)
    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads {threads}, {args.dtype}, "
               f"load average {os.getloadavg()[0]:.2f}")
    print(header)
    print(f"# {machine}")
    model = call_in_thread(load_builtin_model, args.weights, dtype=args.dtype)

    def on_thread():
        set_threads(threads)
        return run(model, args.configs, args.images, args.segments, args.segment_iterations, args.warm)

    table = rows(call_in_thread(on_thread))
    first = table[0]
    print(f"\n{args.images} images kept decoding, {args.segments} segments of {args.segment_iterations} iterations, "
          f"unit {first['method']}:{first['window']}\n")
    print("| configuration | tokens/s over the unit, median | by segment | tokens/s | ms per iteration | "
          "tokens per row and iteration | admission ms per image | admission share | widths chosen |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['method']}:{r['window']} | {r['ratio_median']:.2f}x | {', '.join(f'{x:.2f}' for x in r['ratios'])} | "
              f"{r['tokens_per_s']:.0f} | {r['ms_per_iteration']:.1f} | {r['tokens_per_row_iteration']:.2f} | "
              f"{r['admission_ms_per_image']:.1f} | {r['admission_share']:.3f} | {r['widths']} |")
    print(f"# load average {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        write_json({"command": header, "machine": machine, "images": args.images,
                                      "segments": args.segments, "segment_iterations": args.segment_iterations,
                                      "rows": table}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
