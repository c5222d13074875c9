"""What one image joining a running served batch costs, and its parts.

Not a test: it loads the built-in model and prints. From the project root:

    python benchmarks/admission_cost.py --threads 2 --dtype bfloat16

A :class:`csdgen.engine.ContinuousBatch` (CSD, window ``auto``, 16 static slots, as ``csdgen serve``
runs it) holds 15 images decoding; then, ``--admissions`` times, one image leaves (cancelled) when the
batch is full, one joins (``admit``) and the batch runs two iterations. Printed: the median
milliseconds of an admission and of its parts (the new images' session opened by the model, its
static counterpart, and either their prefill forward and the copy of their rows into the running
session or, for the built-in model's one-token prompts, their rows registered unprefilled), and of
the two iterations after it: the first takes the new image's prefill in its window where the
admission did not run it, the second is a plain 16-image iteration, so that the admission reads
against the machine's pace.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_header import command_line  # noqa: E402


def _timed(owner, name: str, label: str, times: dict) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        out = original(*args, **kwargs)
        times.setdefault(label, []).append(time.perf_counter() - began)
        return out

    setattr(owner, name, wrapper)


def main(argv: list[str] | None = None) -> None:
    from csdgen.cli._options import count
    from csdgen.engine import ContinuousBatch
    import csdgen.models._static as static
    from csdgen.models.builtin import load_builtin_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=count(), default=None, help="torch threads (default: torch's)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="the built-in model's dtype (default float32)")
    p.add_argument("--admissions", type=count(), default=40, help="admissions timed (default 40)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_builtin_model(dtype=args.dtype)
    batch = ContinuousBatch(model, method="csd", window="auto", capacity=16)
    batch.admit([i % 10 for i in range(15)], list(range(15)), [0] * 15)
    for _ in range(30):
        batch.step()
    times: dict[str, list[float]] = {}
    _timed(model, "start", "model.start (the new images' session)", times)
    _timed(static, "make_static", "make_static (its static counterpart)", times)
    _timed(batch._loop, "_prefill", "prefill forward and first tokens", times)
    _timed(static.StaticSession, "admit", "copy into the running session", times)
    _timed(static.StaticSession, "admit_unprefilled", "rows registered unprefilled", times)
    total, after = [], ([], [])
    for i in range(args.admissions):
        if batch.size >= 16:
            batch.cancel([batch.handles[0]])
        began = time.perf_counter()
        batch.admit([i % 10], [100 + i], [0])
        total.append(time.perf_counter() - began)
        for k in range(2):
            began = time.perf_counter()
            batch.step()
            after[k].append(time.perf_counter() - began)
    print(command_line("admission_cost.py", argv))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch threads "
          f"{torch.get_num_threads()}, {args.dtype}, load average {os.getloadavg()[0]:.2f}\n")
    print("| what | ms, median | count |\n|---|---|---|")
    print(f"| one image's admission into a batch of 15 | {1e3 * statistics.median(total):.2f} | {len(total)} |")
    for label, values in times.items():
        print(f"| of which: {label} | {1e3 * statistics.median(values):.2f} | {len(values)} |")
    print(f"| the iteration right after it | {1e3 * statistics.median(after[0]):.2f} | {len(after[0])} |")
    print(f"| the iteration after that, {batch.size} images | {1e3 * statistics.median(after[1]):.2f} | "
          f"{len(after[1])} |")


if __name__ == "__main__":
    main()
