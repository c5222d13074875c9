"""The README's first command in fresh processes: its step compression, and its time against ``--window 16``.

    python benchmarks/builtin_first_command.py --quiet 20 --loaded 10 --json benchmarks/results/first_command.json

Each round runs ``csdgen generate --out DIR`` (CSD, ``window="auto"``, the built-in model's eight
default classes in one batch) and the same with ``--window 16``, each in a fresh process (``python -m
csdgen``), in alternating order from round to round so drift of the machine's speed falls on both.
``--quiet`` rounds run with nothing else started; ``--loaded`` rounds with one other process keeping
both cores busy (a float32 matrix product loop on two threads). From each run's summary line it
takes the step compression and the decoding seconds (model loading left out), and prints per
round and per condition: the step compression of the first command (min, median), its decoding
seconds against window 16's (the ratio per round, the worst and the median), and the command.
``--control N`` and ``--control-loaded N`` add N rounds (quiet, loaded) of ``--window 16`` against
itself, the same alternation: the spread of the per-round ratio that the machine alone makes (its
noise floor; the first ``--window 16`` run of a control round is recorded under ``"auto"``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_header import commit as checkout_commit  # noqa: E402

SUMMARY = re.compile(r"step compression ([0-9.]+)x, decoding ([0-9.]+) s in all")


def busy(threads: int) -> None:  # pragma: no cover - runs in a child process
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(512, 512)
    while True:
        a = (a @ a).clamp_(-1, 1)


def run_once(extra: list[str], env: dict) -> dict:
    """One fresh ``csdgen generate`` -> ``{"step_compression", "decoding_s", "process_s"}``.

    Raises:
        RuntimeError: the command failed or printed no summary line (with its output's tail)."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "csdgen", "generate", "--out", out, *extra]
        t = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
        elapsed = time.perf_counter() - t
    found = SUMMARY.search(done.stdout + done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {(done.stdout + done.stderr)[-800:]}")
    return {"step_compression": float(found.group(1)), "decoding_s": float(found.group(2)), "process_s": elapsed}


def rounds(count: int, loaded: bool, env: dict, control: bool = False) -> list[dict]:
    load = None
    if loaded:
        load = multiprocessing.get_context("spawn").Process(target=busy, args=(2,), daemon=True)
        load.start()
        time.sleep(3)
    out = []
    try:
        for i in range(count):
            order = [("auto", ["--window", "16"] if control else []), ("window16", ["--window", "16"])]
            if i % 2:
                order.reverse()
            got = {name: run_once(extra, env) for name, extra in order}
            got["ratio"] = got["auto"]["decoding_s"] / got["window16"]["decoding_s"]
            out.append(got)
            label = ("control " if control else "") + ("loaded" if loaded else "quiet")
            print(f"{label} {i + 1}/{count}: auto {got['auto']['step_compression']:.2f}x "
                  f"{got['auto']['decoding_s']:.2f} s, window 16 {got['window16']['step_compression']:.2f}x "
                  f"{got['window16']['decoding_s']:.2f} s, ratio {got['ratio']:.3f}", flush=True)
    finally:
        if load is not None:
            load.terminate()
            load.join()
    return out


def summary(rows: list[dict]) -> dict:
    compression = [r["auto"]["step_compression"] for r in rows]
    ratios = [r["ratio"] for r in rows]
    return {"runs": len(rows), "auto_step_compression_min": min(compression),
            "auto_step_compression_median": statistics.median(compression),
            "window16_step_compression_median": statistics.median(r["window16"]["step_compression"] for r in rows),
            "time_ratio_max": max(ratios), "time_ratio_median": statistics.median(ratios),
            "auto_decoding_s_median": statistics.median(r["auto"]["decoding_s"] for r in rows),
            "window16_decoding_s_median": statistics.median(r["window16"]["decoding_s"] for r in rows)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quiet", type=int, default=20)
    p.add_argument("--loaded", type=int, default=10)
    p.add_argument("--control", type=int, default=0,
                   help="quiet rounds of --window 16 against itself (the per-round ratio's noise floor)")
    p.add_argument("--control-loaded", type=int, default=0, help="the same, loaded")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    env = dict(os.environ)
    commit = checkout_commit()
    result = {"command": "csdgen generate --out DIR (and --window 16), fresh processes, alternating",
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "commit": commit,
              "threads": "torch default", "dtype": "float32"}
    for name, count, loaded, control in (("quiet", args.quiet, False, False), ("loaded", args.loaded, True, False),
                                         ("control", args.control, False, True),
                                         ("control_loaded", args.control_loaded, True, True)):
        if count:
            rows = rounds(count, loaded, env, control)
            result[name] = {"rounds": rows, "summary": summary(rows)}
            print(f"{name}: {json.dumps(result[name]['summary'])}", flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(args.json)
    return result


if __name__ == "__main__":
    main()
