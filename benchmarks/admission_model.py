"""What batching policy a measured throughput curve allows: open-loop p95 latency, by a queueing model.

Not a test: it computes and prints (no model is loaded, a few seconds). Run from the project root:

    python benchmarks/admission_model.py --curve 1:0.55,2:0.86,4:1.16,8:1.65,12:1.86,16:1.91
    python benchmarks/admission_model.py --memory-bound 0.55        # every row at one image's speed

``bench_serve.py --arrivals poisson`` and ``serve_replay.py`` measure continuous and static batching
on the machine at hand. Whether continuous batching *can* bring its p95 latency to a given fraction
of static batching's depends on how the batch's throughput grows with its rows, and that is a
property of the device: this script asks the question of the curve alone.

**The model.** A served batch of ``b`` images commits ``thr(b)`` images per second (``--curve``:
``rows:images_per_second`` pairs, one of them at 1 row and the last at ``--max-batch`` rows or
more, interpolated linearly; measure them with ``served_widths.py
--images ... --widths 1`` plus ``auto``, tokens per second over the image's tokens; or
``--memory-bound S``: ``thr(b) = S * b``, a forward of ``b`` rows costing what one row's does, as
on a device that reads the same weights for any batch up to ``--max-batch``). Every image in the
batch advances at ``thr(b) / b`` (one forward for all rows: processor sharing). An image's work is
1 times a factor drawn from a normal distribution of mean 1 and standard deviation ``--spread``
(step compression varies between images; at least 0.3). Requests of n = 1..4 images arrive as in
``bench_serve.poisson_arrivals`` (the same function) at ``rate x capacity`` images per second,
``capacity`` = ``thr(--max-batch)``; a request's latency runs from its arrival to its last image.

Policies:

* ``static``: when the batch is empty, up to ``--max-batch`` waiting images join it (first come,
  first served), and it runs to its last image;
* ``continuous c``: at every moment waiting images join while the batch holds fewer than ``c``
  (``c = --max-batch`` is ``csdgen serve``'s continuous batching; a smaller ``c`` trades
  throughput for speed per image);
* ``continuous c..C``: ``c`` while at most ``--hold`` images wait, ``C`` = ``--max-batch`` beyond.

Per rate and policy: p50 and p95 latency (the mean over ``--seeds`` arrival draws of
``--duration`` seconds each), the p95 over static batching's, and served over offered (``--duration``
over the time of the last answer: 1 when the policy keeps up; a row marked "queue grew" serves
less than is offered, so its p95 grows with ``--duration`` and a ratio against it holds for that
duration only: static batching's own capacity is below ``thr(--max-batch)``, its batches drain).

It models the batch only: no admission cost (a prefill forward on a CPU costs about half an
iteration of 16 images), no window choice (the curve's own), no HTTP.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serve import _fractions, poisson_arrivals, quantile  # noqa: E402  (the same arrivals and quantiles)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from csdgen.cli._options import count, numbers, real  # noqa: E402  (the CLI's own argument checks)


QUEUE_GREW = 0.9  #: served / offered below this: the policy's queue grew through the run


def parse_curve(text: str) -> tuple[np.ndarray, np.ndarray]:
    """``"1:0.55,2:0.86,..."`` -> (rows ``[K]`` int, images per second ``[K]`` float), rows increasing.

    Raises:
        ValueError: a pair that is not ``rows:images_per_second``, rows < 1 or repeated, a rate that is
            not a finite number > 0, fewer than two pairs, or no pair at 1 row (the curve is read
            between its rows only: one image alone must be measured, not assumed)."""
    rows, rates = [], []
    for part in text.split(","):
        try:
            b, r = part.split(":")
            b, r = int(b), float(r)
        except ValueError:
            raise ValueError(f"--curve {text!r}: {part!r} is not rows:images_per_second (e.g. 16:1.9)") from None
        if b < 1 or not 0 < r < math.inf or b in rows:
            raise ValueError(f"--curve {text!r}: {part!r}: allowed rows >= 1, each once, and images per second "
                             f"a finite number > 0")
        rows.append(b)
        rates.append(r)
    if len(rows) < 2 or 1 not in rows:
        raise ValueError(f"--curve {text!r}: allowed two or more pairs, one of them at 1 row (e.g. 1:0.8,16:2.9)")
    order = np.argsort(rows)
    return np.array(rows)[order], np.array(rates)[order]


def simulate(arrivals: list[dict], thr, policy: tuple, max_batch: int, spread: float, seed: int) -> list[float]:
    """Latency (seconds) of every request of ``arrivals`` under ``policy`` (module docstring), exactly:
    between events (an arrival, an image finishing) the batch's rows and their speed are constant.

    ``policy``: ``("static",)``, ``("continuous", c)`` or ``("continuous", c, C, hold)``."""
    rng = random.Random(10**9 + seed)  # the images' work: a stream apart from the arrivals' (seeded 0, 1, ...)
    queue: list[tuple[int, float]] = []  # (request, work) waiting, first come first served
    batch: list[list] = []  # [request, work left]
    left = [a["n"] for a in arrivals]
    latency = [0.0] * len(arrivals)
    t, i, head = 0.0, 0, 0
    while i < len(arrivals) or head < len(queue) or batch:
        # admission at this moment
        if policy[0] == "static":
            cap = max_batch if not batch else 0
        elif len(policy) == 2:
            cap = policy[1]
        else:
            cap = policy[2] if len(queue) - head > policy[3] else policy[1]
        while head < len(queue) and len(batch) < cap:
            r, w = queue[head]
            head += 1
            batch.append([r, w])
        speed = thr(len(batch)) / len(batch) if batch else 0.0
        finish = min(x[1] for x in batch) / speed if batch else float("inf")
        arrive = arrivals[i]["at"] - t if i < len(arrivals) else float("inf")
        dt = min(finish, arrive)
        t += dt
        for x in batch:
            x[1] -= speed * dt
        if arrive <= finish:
            for _ in range(arrivals[i]["n"]):
                queue.append((i, max(0.3, rng.gauss(1.0, spread))))
            i += 1
        for x in [x for x in batch if x[1] <= 1e-12]:
            batch.remove(x)
            left[x[0]] -= 1
            if left[x[0]] == 0:
                latency[x[0]] = t - arrivals[x[0]]["at"]
    return latency


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--curve", help="rows:images_per_second pairs, comma-separated (the batch's measured throughput)")
    g.add_argument("--memory-bound", type=real(0.0, low_open=True, allowed="images per second, a finite number > 0"),
                   metavar="S", help="thr(b) = S x b: one row's images per second")
    p.add_argument("--max-batch", type=count(1), default=16, help="batch slots (default 16)")
    p.add_argument("--rate", type=_fractions, default=[0.3, 0.6, 0.9], help="fractions of thr(max batch) (default 0.3,0.6,0.9)")
    p.add_argument("--caps", type=numbers(int, empty=False, what="cap", check=lambda c: c >= 1, allowed="integers >= 1"),
                   default=[16, 12, 8], help="continuous caps c, 1 .. --max-batch (default 16,12,8)")
    p.add_argument("--hold", type=count(0), default=4, help="continuous c..C: images waiting beyond which C applies (default 4)")
    p.add_argument("--spread", type=real(0.0, allowed="a finite number >= 0"), default=0.15, help="standard deviation of an image's work (default 0.15)")
    p.add_argument("--duration", type=real(0.0, low_open=True, allowed="a finite number > 0"), default=300.0, help="seconds of arrivals per draw (default 300)")
    p.add_argument("--seeds", type=count(1), default=8, help="arrival draws per cell (default 8)")
    args = p.parse_args(argv)
    if args.memory_bound is not None:
        rows, rates = np.array([1, args.max_batch]), np.array([args.memory_bound, args.memory_bound * args.max_batch])
    else:
        try:
            rows, rates = parse_curve(args.curve)
        except ValueError as exc:
            p.error(str(exc))
        if rows[-1] < args.max_batch:
            p.error(f"--max-batch {args.max_batch}: beyond the curve's last row {rows[-1]}; allowed --max-batch <= {rows[-1]} "
                    f"or a curve measured up to it")

    def thr(b: int) -> float:
        return float(np.interp(b, rows, rates))

    caps = sorted(args.caps, reverse=True)
    if caps[0] > args.max_batch:
        p.error(f"--caps {','.join(map(str, args.caps))}: cap {caps[0]} is beyond --max-batch {args.max_batch}; "
                f"allowed integers 1 .. {args.max_batch}, comma-separated")
    policies = [("static",)] + [("continuous", c) for c in caps]
    policies += [("continuous", c, args.max_batch, args.hold) for c in caps if c < args.max_batch]
    capacity = thr(args.max_batch)
    print(f"# python benchmarks/admission_model.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    print(f"# capacity thr({args.max_batch}) = {capacity:.2f} images/s; per row at 1 / {args.max_batch} rows: "
          f"{thr(1):.2f} / {capacity / args.max_batch:.2f} images/s")
    print("\n| rate | policy | p50 s | p95 s | p95 over static | served / offered |\n|---|---|---|---|---|---|")
    for rate in args.rate:
        draws = [poisson_arrivals(rate * capacity, 10**6, args.duration, 1, seed) for seed in range(args.seeds)]
        figures = {}
        for policy in policies:
            p50s, p95s, served = [], [], []
            for seed, arrivals in enumerate(draws):
                latency = simulate(arrivals, thr, policy, args.max_batch, args.spread, seed)
                # served / offered: the images over the time to the last answer, over the images over --duration
                last = max(a["at"] + s for a, s in zip(arrivals, latency))
                served.append(args.duration / max(last, args.duration))
                latency.sort()
                p50s.append(statistics.median(latency))
                p95s.append(quantile(latency, 0.95))
            figures[policy] = (statistics.mean(p50s), statistics.mean(p95s), statistics.mean(served))
        static = figures[("static",)][1]
        for policy, (p50, p95, served) in figures.items():
            name = "static" if policy[0] == "static" else (f"continuous {policy[1]}" if len(policy) == 2
                                                           else f"continuous {policy[1]}..{policy[2]}")
            mark = " (queue grew)" if served < QUEUE_GREW else ""
            print(f"| {rate:g} | {name} | {p50:.1f} | {p95:.1f} | {p95 / static:.2f}x | {served:.2f}{mark} |")
    print(f"\n(queue grew): the last answer came more than {1 / QUEUE_GREW - 1:.0%} of --duration after the arrivals "
          f"ended: that policy serves less than is offered, its queue grows through the run and its p95 grows with "
          f"--duration (a ratio against it holds for this --duration only).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
