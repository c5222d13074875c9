"""The server's scheduler under open-loop arrivals, in one process, without HTTP.

Not a test: it loads the built-in model, replays arrivals and prints. Run from the project root:

    python benchmarks/serve_replay.py --capacity 2.0                     # CPU: rates of 2.0 images/s
    python benchmarks/serve_replay.py --device cuda --duration 60        # a GPU: capacity measured

``benchmarks/bench_serve.py --arrivals poisson`` measures the whole server: HTTP, the client
processes and the scheduler, all on the machine's cores. This script keeps only what decides the
latency a batching policy gives: the same :class:`csdgen.serve.scheduler.Scheduler` that
``csdgen serve`` runs (its admission, batching and image worker), fed the same arrivals
(:func:`bench_serve.poisson_arrivals`: requests of n = 1..4 images, Poisson, seeded), with the
requests submitted from an asyncio loop in this process at their arrival times. So a difference
between continuous and static batching here belongs to the batching, not to the HTTP stack, and
a run on a GPU costs one model load instead of one server start per cell.

* the **capacity** (images per second): ``--capacity``; or with ``--saturated`` the continuous
  scheduler's throughput over a burst (requests of n = 1..4 images, at least 4 x ``--max-batch``
  of them, all at once: what it sustains with its queue never empty; on a CPU, where a batch's
  forward costs more the more images it holds, one-at-a-time throughput x max batch is beyond
  what the machine serves); or measured as in ``bench_serve.py``: one-at-a-time throughput (a
  scheduler with one batch slot, requests of one image back to back for ``--capacity-seconds``)
  x ``--max-batch``;
* for every method, rate and batching: the arrivals at ``rate x capacity`` images per second for
  at most ``--duration`` seconds and ``--requests`` requests, every request waited for (with
  ``--exact-rate`` each draw's times scaled so that it offers exactly that rate); with
  ``--repeat R``, R rounds, each with arrivals of its own (seed ``--seed + round``) and the
  batchings in turn (reversed on odd rounds), so that the machine's drift over minutes falls on
  both;
* per cell: requests, images, images per second (images answered / seconds from the start of the
  arrivals to the last answer), p50 / p95 / p99 latency per request (arrival to its last image
  encoded), the mean queue wait per image (the scheduler's waiting images sampled
  every 0.1 s, integrated, over the images), mean batch occupancy (images in the batch summed over
  iterations / iterations), errors, and (``--json``) every request's arrival, images and latency;
  per rate, continuous p95 over static p95; then, pooled over the rounds, every answered
  request's latency per method, rate and batching: p50 / p95 / p99 and continuous p95 over static
  (with each round's own ratio beside it).

Before the first cell the server's ``--warmup`` runs (:func:`csdgen.cli.serve._warmup`: the
compiled steps of every batch and width bucket, where the device compiles), and each scheduler
serves one request of ``--max-batch`` images untimed, so no cell pays for a first compile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_header import commit as checkout_commit  # noqa: E402
from bench_serve import _fractions, poisson_arrivals, quantile  # noqa: E402  (the same arrivals and figures as the HTTP benchmark)

from csdgen.cli._options import count, path, real  # noqa: E402

MODES = ("continuous", "static")
positive = real(0.0, low_open=True, allowed="a number > 0")


def served_builtin(device: str, method: str, max_batch: int, dtype: str = "float32", weights: Path | None = None):
    """The built-in model as ``csdgen serve`` serves it (defaults: ``method``, window auto; up to
    ``max_batch`` images per request, for the warm-up request); ``weights``: its folder (default: shipped)."""
    from csdgen.models.builtin import load_builtin_model
    from csdgen.serve import ServeDefaults, ServedModel

    model = load_builtin_model(weights, device=device, dtype=dtype)
    defaults = ServeDefaults(method=method, window="auto", max_images=max(10, max_batch))
    return ServedModel(model, "csdgen-builtin", defaults=defaults)


async def _request(scheduler, served, body: dict, delay: float) -> tuple[float, str | None]:
    """Submit ``body`` after ``delay`` seconds; returns (seconds from submission to its last image, error)."""
    from csdgen.serve.schemas import APIError, parse_request

    await asyncio.sleep(delay)
    began = time.perf_counter()
    events: asyncio.Queue = asyncio.Queue()
    try:
        job = scheduler.submit(parse_request(body, served), asyncio.get_running_loop(), events)
    except APIError as exc:
        return time.perf_counter() - began, f"{exc.status} {exc.message}"
    del job
    while True:
        event = await events.get()
        if event[0] == "error":
            return time.perf_counter() - began, str(event[1])
        if event[0] == "done":
            return time.perf_counter() - began, None


async def _replay(scheduler, served, arrivals: list[dict], sample: float) -> dict:
    waiting: list[float] = []
    done = asyncio.Event()

    async def sampler():
        while not done.is_set():
            waiting.append(scheduler.waiting)
            await asyncio.sleep(sample)

    watch = asyncio.create_task(sampler())
    began = time.perf_counter()
    tasks = [asyncio.create_task(_request(scheduler, served, {"prompt": a["prompt"], "n": a["n"], "seed": a["seed"]},
                                          a["at"])) for a in arrivals]
    answers = await asyncio.gather(*tasks)
    seconds = time.perf_counter() - began
    done.set()
    await watch
    return {"answers": answers, "seconds": seconds, "queue_image_seconds": sum(waiting) * sample}


def replay(served, arrivals: list[dict], mode: str, max_batch: int, sample: float = 0.1) -> dict:
    """One cell: a fresh scheduler of batching ``mode`` fed ``arrivals``; returns its figures (module docstring)."""
    from csdgen.serve.metrics import ServeMetrics
    from csdgen.serve.scheduler import Scheduler

    metrics = ServeMetrics()
    scheduler = Scheduler(served, capacity=max_batch, max_queue=10**6, batching=mode, metrics=metrics)
    scheduler.start()
    try:
        warm = asyncio.run(_replay(scheduler, served, [{"at": 0.0, "n": max_batch, "prompt": "0", "seed": 1}], sample))
        if warm["answers"][0][1]:
            raise RuntimeError(f"the warm-up request failed: {warm['answers'][0][1]}")
        before = {name: _counter(metrics, name) for name in ("csdgen_batch_iterations", "csdgen_batch_rows")}
        out = asyncio.run(_replay(scheduler, served, arrivals, sample))
        iterations = _counter(metrics, "csdgen_batch_iterations") - before["csdgen_batch_iterations"]
        rows = _counter(metrics, "csdgen_batch_rows") - before["csdgen_batch_rows"]
    finally:
        scheduler.stop()
    ok = sorted(s for s, error in out["answers"] if error is None)
    images = sum(a["n"] for a, (_, error) in zip(arrivals, out["answers"]) if error is None)

    return {"mode": mode, "requests": len(arrivals), "images": images, "seconds": out["seconds"],
            "images_per_second": images / out["seconds"], "p50": statistics.median(ok) if ok else None,
            "p95": quantile(ok, 0.95) if ok else None, "p99": quantile(ok, 0.99) if ok else None,
            "queue_wait": out["queue_image_seconds"] / max(1, sum(a["n"] for a in arrivals)),
            "occupancy": rows / iterations if iterations else 0.0, "errors": len(arrivals) - len(ok),
            # per request: arrival (s from the start), images, seconds to its last image (None: an error)
            "latencies": [[round(a["at"], 3), a["n"], None if error else round(s, 3)]
                          for a, (s, error) in zip(arrivals, out["answers"])]}


def pooled(cells: list[dict]) -> list[dict]:
    """Per method, rate and batching: the p50 / p95 / p99 of every answered request of all its rounds, and
    (continuous) its p95 over static's and the rounds' own ratios."""
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["method"], c["rate"], c["mode"]), []).append(c)
    out = []
    for (method, rate, mode), group in groups.items():
        ok = sorted(s for c in group for _, _, s in c["latencies"] if s is not None)
        out.append({"method": method, "rate": rate, "mode": mode, "requests": sum(c["requests"] for c in group),
                    "p50": statistics.median(ok) if ok else float("nan"), "p95": quantile(ok, 0.95),
                    "p99": quantile(ok, 0.99)})
    by_key = {(c["method"], c["rate"], c["mode"]): c for c in out}
    for c in out:
        static = by_key.get((c["method"], c["rate"], "static"))
        if c["mode"] == "continuous" and static and static["p95"]:
            c["p95_over_static"] = c["p95"] / static["p95"]
            c["p95_over_static_by_round"] = [x["p95_over_static"] for x in cells
                                             if (x["method"], x["rate"], x["mode"]) == (c["method"], c["rate"], "continuous")
                                             and "p95_over_static" in x]
    return out


def saturated_throughput(served, max_batch: int, seed: int) -> float:
    """Images per second of a continuous scheduler of ``max_batch`` slots given requests of n = 1..4
    images totalling at least ``4 * max_batch``, all at once (after one untimed request of
    ``max_batch`` images): what the server sustains with its queue never empty."""
    burst, images = [], 0
    # requests drawn as the open loop draws them (4 x max_batch requests hold at least that many images), all at once
    for request in poisson_arrivals(1.0, 4 * max_batch, math.inf, served.model.num_classes, seed):
        if images >= 4 * max_batch:
            break
        burst.append({**request, "at": 0.0})
        images += request["n"]
    cell = replay(served, burst, "continuous", max_batch)
    if cell["errors"]:
        raise RuntimeError(f"{cell['errors']} request(s) of the capacity burst failed")
    return cell["images_per_second"]


def _counter(metrics, name: str) -> float:
    return metrics.registry.get_sample_value(name + "_total") or 0.0


def one_at_a_time_throughput(served, seconds: float) -> float:
    """Images per second of a one-slot scheduler serving requests of one image back to back."""
    from csdgen.serve.scheduler import Scheduler

    scheduler = Scheduler(served, capacity=1, max_queue=10**6, batching="continuous")
    scheduler.start()
    try:
        done, seed, began = 0, 0, None
        while began is None or time.perf_counter() - began < seconds:
            out = asyncio.run(_replay(scheduler, served, [{"at": 0.0, "n": 1, "prompt": str(seed % 10), "seed": seed}], 1.0))
            if out["answers"][0][1]:
                raise RuntimeError(f"a capacity request failed: {out['answers'][0][1]}")
            if seed == 0:  # the first one is untimed (first use of the session's shapes)
                began = time.perf_counter()
            else:
                done += 1
            seed += 1
        return done / (time.perf_counter() - began)
    finally:
        scheduler.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", default="csd", help="decoding methods, window auto (default csd)")
    p.add_argument("--modes", default=",".join(MODES), help=f"batchings (default {','.join(MODES)})")
    p.add_argument("--rate", type=_fractions, default=[0.3, 0.6, 0.9], help="fractions of the capacity (default 0.3,0.6,0.9)")
    p.add_argument("--capacity", type=positive, default=None, help="images per second (default: measured)")
    p.add_argument("--capacity-seconds", type=positive, default=20.0, help="seconds of the capacity measurement (default 20)")
    p.add_argument("--saturated", action="store_true",
                   help="capacity: the continuous scheduler's throughput over a burst of 4 x --max-batch images")
    p.add_argument("--exact-rate", action="store_true",
                   help="scale each draw's arrival times so that it offers exactly rate x capacity (bench_serve.poisson_arrivals)")
    p.add_argument("--repeat", type=count(1), default=1,
                   help="rounds per rate, each with its own arrivals (seed --seed + round), batchings in turn (default 1)")
    p.add_argument("--max-batch", type=count(1), default=16, help="batch slots (default 16)")
    p.add_argument("--duration", type=positive, default=150.0, help="most seconds of arrivals per cell (default 150)")
    p.add_argument("--requests", type=count(1), default=200, help="most requests per cell (default 200)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cpu or cuda (default cpu)")
    p.add_argument("--threads", type=count(1), default=None, help="torch threads (default: torch's)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="the built-in model's dtype, as csdgen serve --dtype (default float32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    p.add_argument("--weights", type=path, default=None, help="built-in model weights folder (default: shipped with csdgen)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        p.error(f"--modes {args.modes!r}: allowed one or more of {', '.join(MODES)}, comma-separated")
    from csdgen.engine import METHODS

    bad = [m for m in methods if m.lower() not in METHODS]
    if bad or not methods:
        p.error(f"--methods {args.methods!r}: allowed one or more of {', '.join(METHODS)}, comma-separated")
    if args.json is not None and not args.json.parent.is_dir():
        p.error(f"--json {args.json}: its folder {args.json.parent} does not exist")
    from csdgen.cli.serve import _warmup
    from csdgen.torch_threads import call_in_thread
    from csdgen.serve.schemas import parse_request

    commit = checkout_commit()
    record = {"command": "python benchmarks/serve_replay.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "commit": commit or None,
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, "
                         f"device {args.device}, {args.dtype}", "load_average_start": os.getloadavg(), "cells": []}
    print(f"# {record['command']} (commit {commit or 'unknown'})\n# {record['machine']}, load average {os.getloadavg()[0]:.2f}", flush=True)
    for method in methods:
        # loaded and warmed up in a thread that ends with them, as csdgen serve does (csdgen.torch_threads)
        served = call_in_thread(served_builtin, args.device, method, args.max_batch, args.dtype, args.weights)
        call_in_thread(_warmup, served.model, parse_request({"prompt": "0"}, served), args.max_batch,
                       served.engine_kwargs)
        capacity, how = args.capacity, "given"
        if capacity is None and args.saturated:
            capacity, how = saturated_throughput(served, args.max_batch, args.seed), "a burst's throughput"
        elif capacity is None:
            capacity = one_at_a_time_throughput(served, args.capacity_seconds) * args.max_batch
            how = "one at a time x max batch"
        print(f"# {method}: capacity {capacity:.2f} images/s ({how})", flush=True)
        record.setdefault("capacities", {})[method] = {"images_per_second": capacity, "from": how}
        # round r draws its arrivals with seed --seed + r; all checked before the first cell runs
        every = {(rate, r): poisson_arrivals(rate * capacity, args.requests, args.duration, served.model.num_classes,
                                             args.seed + r, exact=args.exact_rate)
                 for rate in args.rate for r in range(args.repeat)}
        empty = sorted({rate for (rate, _), arrivals in every.items() if not arrivals})
        if empty:
            p.error(f"--rate {','.join(map(str, empty))} of {capacity:.2f} images/s: no request arrives within "
                    f"--duration {args.duration:g} s; allowed a longer --duration or a higher rate")
        for (rate, r), arrivals in every.items():
            images = sum(a["n"] for a in arrivals)
            offered = rate * capacity if args.exact_rate else images / args.duration
            cells = {}
            for mode in (modes if r % 2 == 0 else modes[::-1]):  # odd rounds in reverse: drift falls on both
                cell = replay(served, arrivals, mode, args.max_batch)
                cell.update(method=method, rate=rate, capacity=capacity, offered_images_per_second=offered, round=r)
                cells[mode] = cell
                record["cells"].append(cell)
                print(json.dumps({k: v for k, v in cell.items() if k != "latencies"}), flush=True)
            if "continuous" in cells and "static" in cells and cells["static"]["p95"]:
                ratio = cells["continuous"]["p95"] / cells["static"]["p95"]
                cells["continuous"]["p95_over_static"] = ratio
                print(f"# {method} rate {rate} round {r}: continuous p95 {ratio:.2f}x static's", flush=True)
    record["load_average_end"] = os.getloadavg()
    record["pooled"] = pooled(record["cells"])
    print("\n| method | rate | round | requests | offered images/s | batching | images/s | p50 s | p95 s | p99 s | "
          "queue wait per image, s | mean occupancy | errors | continuous p95 over static |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in record["cells"]:
        ratio = f"{c['p95_over_static']:.2f}x" if "p95_over_static" in c else ""
        print(f"| {c['method']} | {c['rate']} | {c['round']} | {c['requests']} | {c['offered_images_per_second']:.2f} | {c['mode']} | "
              f"{c['images_per_second']:.2f} | {c['p50']:.2f} | {c['p95']:.2f} | {c['p99']:.2f} | {c['queue_wait']:.2f} | "
              f"{c['occupancy']:.1f} | {c['errors']} | {ratio} |")
    print("\nPooled over rounds (every answered request of a method, rate and batching):\n")
    print("| method | rate | batching | requests | p50 s | p95 s | p99 s | continuous p95 over static | by round |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in record["pooled"]:
        ratio = f"{c['p95_over_static']:.2f}x" if "p95_over_static" in c else ""
        rounds = ", ".join(f"{v:.2f}" for v in c.get("p95_over_static_by_round", []))
        print(f"| {c['method']} | {c['rate']} | {c['mode']} | {c['requests']} | {c['p50']:.2f} | {c['p95']:.2f} | "
              f"{c['p99']:.2f} | {ratio} | {rounds} |")
    if args.json:
        from csdgen.atomic import write_text_atomic

        write_text_atomic(args.json, json.dumps(record, indent=1))
    return 1 if any(c["errors"] for c in record["cells"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
