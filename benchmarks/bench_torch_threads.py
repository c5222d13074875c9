"""Seconds per iteration of a served batch with one OpenMP pool in the process against several.

Not a test: it loads the built-in model and prints. Run from the project root:

    python benchmarks/bench_torch_threads.py --threads 2

Each layout runs in a fresh process (a thread's OpenMP pool lives as long as the thread), and times
width-1 AR iterations of a :class:`csdgen.engine.ContinuousBatch` (static session of 16 slots,
the server's) holding 4 and 12 images:

* ``one thread``: the model loaded and the iterations run on the main thread, nothing else (the
  floor: one pool, no other thread);
* ``pools``: the model loaded on the main thread, a long-lived helper thread that decoded one
  image at the process's thread count, the iterations on a third thread (three pools: what
  ``csdgen serve`` ran before :mod:`csdgen.torch_threads`);
* ``one pool``: the model loaded in a thread that ended (:func:`csdgen.torch_threads.call_in_thread`),
  the helper on one torch thread (:func:`~csdgen.torch_threads.single_threaded`), the iterations on a
  third thread at the process's count (what ``csdgen serve`` runs now).

It prints milliseconds per iteration (the median of ``--repeats`` runs of ``--iterations``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_header import command_line, commit as checkout_commit  # noqa: E402

from csdgen.cli._options import count  # noqa: E402  (the CLI's own argument check)

LAYOUTS = ("one thread", "pools", "one pool")

_CHILD = r"""
import json, statistics, sys, threading, time, torch
layout, threads, iterations, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
from csdgen.engine import ContinuousBatch
from csdgen.models.builtin import load_builtin_model
from csdgen.serve import images
from csdgen.torch_threads import call_in_thread, set_threads, single_threaded

def time_batches(model):
    out = {}
    for size in (4, 12):
        runs = []
        for _ in range(repeats):
            batch = ContinuousBatch(model, method="ar", window=1, capacity=16)
            batch.admit([i % 10 for i in range(size)], list(range(size)), [0] * size)
            for _ in range(10):
                batch.step()
            began = time.perf_counter()
            for _ in range(iterations):
                batch.step()
            runs.append((time.perf_counter() - began) / iterations * 1e3)
        out[size] = statistics.median(runs)
    return out

if layout == "one thread":
    result = time_batches(load_builtin_model())
else:
    model = load_builtin_model() if layout == "pools" else call_in_thread(load_builtin_model)
    decoded, stop = threading.Event(), threading.Event()
    def helper():
        if layout == "one pool":
            single_threaded()
        images.png_bytes(model, torch.zeros(model.num_image_tokens, dtype=torch.long))
        decoded.set()
        stop.wait()
    threading.Thread(target=helper, daemon=True).start()
    decoded.wait()
    torch.set_num_threads(threads)
    box = {}
    def decode():
        set_threads(threads)
        box["result"] = time_batches(model)
    worker = threading.Thread(target=decode)
    worker.start()
    worker.join()
    stop.set()
    result = box["result"]
print(json.dumps(result))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=count(1), default=2, help="torch threads (default 2)")
    p.add_argument("--iterations", type=count(1), default=100, help="timed iterations per run (default 100)")
    p.add_argument("--repeats", type=count(1), default=3, help="runs per batch size (default 3; the median is printed)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    commit = checkout_commit()
    print(command_line("bench_torch_threads.py", argv))
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, torch threads {args.threads}, load average "
          f"{os.getloadavg()[0]:.2f}")
    rows = {}
    for layout in LAYOUTS:
        out = subprocess.run([sys.executable, "-c", _CHILD, layout, str(args.threads), str(args.iterations),
                              str(args.repeats)], cwd=ROOT, capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return 1
        rows[layout] = {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
    print("\n| layout | ms per iteration, 4 images | ms per iteration, 12 images |\n|---|---|---|")
    for layout, figures in rows.items():
        print(f"| {layout} | {figures[4]:.2f} | {figures[12]:.2f} |")
    if args.json is not None:
        args.json.write_text(json.dumps({"commit": commit, "threads": args.threads, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
