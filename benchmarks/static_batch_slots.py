"""Seconds per iteration of the uncompiled static engine by images decoding: exact batch slots
against power-of-two buckets.

Not a test: it times and prints. Run from the project root:

    python benchmarks/static_batch_slots.py --images 4,6,9,12,16 --widths 1,4 --threads 2

For every image count ``k`` and width ``W``: a :class:`csdgen.engine.ContinuousBatch` of 16 slots
(the server's ``--max-batch``) on the built-in model, ``k`` images admitted at once, CSD at the fixed
width ``W``; the mean seconds of ``--iterations`` iterations after 3 untimed ones, once with the
batch slots the engine runs now (uncompiled: exactly the images) and once with the slots rounded
up to a power of two (what compiled sessions run), alternating ``--repeats`` times; the median of
each is printed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from csdgen.cli._options import count
from csdgen.engine import ContinuousBatch
from csdgen.models import _static
from csdgen.models._static_shapes import batch_bucket
from csdgen.models.builtin import load_builtin_model


def seconds_per_iteration(model, images: int, width: int, iterations: int, power_of_two: bool) -> float:
    exact = _static.StaticSession._batch_bucket
    if power_of_two:
        _static.StaticSession._batch_bucket = lambda self, n: batch_bucket(n, self.capacity, True)
    try:
        batch = ContinuousBatch(model, method="csd", window=width, capacity=16, compile=False)
        batch.admit([i % model.num_classes for i in range(images)], list(range(images)), [0] * images)
        for _ in range(3):
            batch.step()
        began = time.perf_counter()
        for _ in range(iterations):
            batch.step()
        return (time.perf_counter() - began) / iterations
    finally:
        _static.StaticSession._batch_bucket = exact


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", default="4,6,9,12,16")
    p.add_argument("--widths", default="1,4")
    p.add_argument("--iterations", type=count(1), default=30)
    p.add_argument("--repeats", type=count(1), default=3)
    p.add_argument("--threads", type=count(1), default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_builtin_model()
    print(f"# built-in model, float32, {torch.get_num_threads()} threads, {args.iterations} iterations per run, "
          f"median of {args.repeats}")
    print("| images | width | slots run now | ms per iteration | power-of-two slots | ms per iteration | now over power of two |")
    print("|---|---|---|---|---|---|---|")
    for images in [int(v) for v in args.images.split(",")]:
        for width in [int(v) for v in args.widths.split(",")]:
            runs = {False: [], True: []}
            for _ in range(args.repeats):
                for pow2 in (False, True):
                    runs[pow2].append(seconds_per_iteration(model, images, width, args.iterations, pow2))
            now, pow2 = statistics.median(runs[False]) * 1e3, statistics.median(runs[True]) * 1e3
            print(f"| {images} | {width} | {images} | {now:.1f} | {batch_bucket(images, 16)} | {pow2:.1f} | "
                  f"{now / pow2:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
