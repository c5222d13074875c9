"""What a window width costs and commits in a served batch, and what ``window="auto"`` predicted.

Not a test: it loads the built-in model and prints. Run from the project root:

    python benchmarks/served_widths.py --threads 2

Two tables, each on a :class:`csdgen.engine.ContinuousBatch` of 16 static slots (the server's):

* **seconds per iteration**: ``--images`` K fresh images admitted at once, then the median of
  ``--iterations`` iterations at each fixed width of ``--widths`` (milliseconds);
* **tokens per forward**: K images kept decoding (a finished image replaced at the next
  boundary, as a busy server does) for ``--steady`` iterations per fixed width: the mean step
  compression of the images that finished and the image tokens committed per second (the first
  width's rate the unit: list width 1 first); then the same with ``window="auto"``: the widths it
  chose, and per chosen width the tokens per forward it predicted against those measured
  (``auto_log``'s figures, :meth:`csdgen.engine.window._AutoWindow.summary`).

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

from csdgen.cli._options import count, numbers  # noqa: E402  (the CLI's own argument checks)

positive_ints = numbers(int, empty=False, check=lambda v: v >= 1, allowed="integers >= 1")


def iteration_ms(model, method: str, images: int, width: int, iterations: int) -> float:
    from csdgen.engine import ContinuousBatch

    batch = ContinuousBatch(model, method=method, window=width, capacity=16)
    batch.admit([i % 10 for i in range(images)], list(range(images)), [0] * images)
    for _ in range(5):
        batch.step()
    times = []
    for _ in range(iterations):
        began = time.perf_counter()
        batch.step()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def steady(model, method: str, images: int, window, iterations: int) -> tuple[float, int, object, float]:
    """(mean step compression of the images that finished, their count, the batch, image tokens committed
    per second over the iterations, admissions included)."""
    from csdgen.engine import ContinuousBatch

    batch = ContinuousBatch(model, method=method, window=window, capacity=16)
    rng, seed, compression = random.Random(1), 0, []
    began = time.perf_counter()
    for _ in range(iterations):
        if batch.size < images:
            k = images - batch.size
            batch.admit([rng.randrange(10) for _ in range(k)], list(range(seed, seed + k)), [0] * k)
            seed += k
        compression += [image.stats.step_compression for image in batch.step()]
    seconds = time.perf_counter() - began
    lengths, _ = batch.progress(batch.handles) if batch.size else ([], None)
    committed = len(compression) * model.num_image_tokens + sum(lengths) - len(lengths)  # admitted at length 1
    return (statistics.mean(compression) if compression else float("nan")), len(compression), batch, committed / seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", default="csd", choices=["sjd", "csd", "addition", "gsd", "lantern"],
                   help="decoding method (default csd)")
    p.add_argument("--images", type=positive_ints, default=[4, 12], help="images in the batch (default 4,12)")
    p.add_argument("--widths", type=positive_ints, default=[1, 2, 4, 8, 16], help="fixed widths (default 1,2,4,8,16)")
    p.add_argument("--iterations", type=count(1), default=40, help="timed iterations per width (default 40)")
    p.add_argument("--steady", type=count(1), default=1200, help="iterations of the kept-busy batch per width (default 1200)")
    p.add_argument("--threads", type=count(1), default=None, help="torch threads (default: torch's)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="the built-in model's dtype (default float32)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from csdgen.models.builtin import load_builtin_model
    from csdgen.torch_threads import call_in_thread, set_threads

    threads = torch.get_num_threads()
    print(command_line("served_widths.py", argv))
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, torch threads {threads}, {args.dtype}, load average {os.getloadavg()[0]:.2f}")
    model = call_in_thread(load_builtin_model, dtype=args.dtype)

    def on_thread(fn, *a):
        def run():
            set_threads(threads)
            return fn(*a)
        return call_in_thread(run)

    print(f"\nms per iteration ({args.method}, fresh images):\n")
    print("| images | " + " | ".join(f"width {w}" for w in args.widths) + " |")
    print("|---|" + "---|" * len(args.widths))
    for k in args.images:
        row = [on_thread(iteration_ms, model, args.method, k, w, args.iterations) for w in args.widths]
        print(f"| {k} | " + " | ".join(f"{t:.1f}" for t in row) + " |", flush=True)
    print(f"\ntokens per forward ({args.method}, images kept decoding, {args.steady} iterations):\n")
    print("| images | window | step compression (images) | tokens per second (over width 1) | auto: widths chosen | "
          "auto: predicted / measured tokens per forward, by width |")
    print("|---|---|---|---|---|---|")
    for k in args.images:
        first = None
        for w in [*args.widths, "auto"]:
            compression, n, batch, rate = on_thread(steady, model, args.method, k, w, args.steady)
            first = first or rate
            chosen = predicted = ""
            if w == "auto":
                widths = batch.widths
                chosen = ", ".join(f"{x}: {widths.count(x)}" for x in sorted(set(widths), key=widths.count, reverse=True)[:4])
                summary = batch._loop.auto.summary()
                predicted = "; ".join(f"{x}: {e['predicted_tokens']:.2f} / {e['measured_tokens']:.2f}"
                                      for x, e in sorted(summary.items()) if e["iterations"] >= 5)
            made = f"{compression:.2f} ({n})" if n else "none finished (0)"  # a --steady too short for an image
            print(f"| {k} | {w} | {made} | {rate:.0f} ({rate / first:.2f}x) | {chosen} | {predicted} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
