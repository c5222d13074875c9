"""``csdgen serve`` under load: continuous batching against one-at-a-time and static batching.

Not a test: it starts servers, loads them and prints. Run from the project root:

    python benchmarks/bench_serve.py                                  # the full table (about 45 minutes)
    python benchmarks/bench_serve.py --clients 1,16 --methods csd --duration 20   # a quick look

For every decoding method (AR, SJD, CSD; window "auto") and every batching it starts one
``csdgen serve`` process on the built-in model (its own port, ``--threads`` threads; all of them
first, an idle one using no CPU):

* ``continuous``: ``--max-batch B`` (images join the running batch at every iteration);
* ``one-at-a-time``: ``--max-batch 1`` (one image decodes at a time: requests one at a time);
* ``static``: ``--batching static --max-batch B`` (a batch filled from the queue, run to its
  end, then the next);

then, for every number of concurrent clients, with the servers in turn (``--repeat R``: R rounds
of it; this CPU's speed drifts by up to a quarter between runs minutes apart, so each cell is
compared with its neighbours, the table's last column), runs the clients for ``--duration`` seconds (the
clock starts when every client is ready, so each sends at least one request): each
client sends requests of n = 1..4 images (uniform, its own random stream) back to back, a random
class and seed each, and waits for the answer. Requests still open at the end are waited for and
counted. With ``--per-client K`` each client sends exactly K requests instead: the same ones for
every method and batching, so every cell decodes the same images (at 1 client a 30-second window
holds a dozen requests of 1 to 4 images, and which of them fall inside it moves images/s). Per
cell: requests, images, images per second (images / seconds from the first request to the last
answer), p50 / p95 latency per request, mean batch occupancy (from the server's
/metrics: images in the batch summed over iterations / iterations) and errors (non-200 answers
and failed connections; must be 0).

After the load, a check phase per server: ``--check`` concurrent requests with a fixed window
(16) and their tokens; each image is compared with ``csdgen.generate(seed=s,
image_indices=[i])`` offline (token agreement: float32 batching lets a few tokens differ; the
goal is >= 99 %).

``--url URL`` loads a server already running instead (one ``csdgen serve``, or ``csdgen serve
--replicas N`` on Ray Serve), for every method and client count, without the offline check; the
table's batching and max batch are the server's own, as its ``/health`` answers them, and its
classes those of ``--weights`` (the weights the server runs).

The table (Markdown) and every figure (``--json``) are printed / written at the end, with the
command, the machine (CPU count, load average at the start and end) and the batch sizes.

**Open loop** (``--arrivals poisson``): the clients above adapt the load to the server (each waits
for its answer); users do not. Here requests arrive independently, a Poisson process, whatever the
server is doing:

    python benchmarks/bench_serve.py --arrivals poisson --rate 0.3,0.6,0.9 --methods csd --modes continuous,static

* the **capacity** of each method (images per second) is measured first: a one-at-a-time server
  (``--max-batch 1``) loaded by one closed-loop client for ``--capacity-seconds``, times
  ``--max-batch``; or given (``--capacity``, images per second, the same for every method);
* every ``--rate`` (fractions of the capacity) is an arrival rate of images: requests of n = 1..4
  images (uniform, mean 2.5) arrive at ``rate x capacity / 2.5`` per second, exponential gaps, a
  random class and seed each (all seeded by ``--seed``, the same arrivals for every batching),
  for at most ``--requests`` requests and ``--duration`` seconds; then the open requests are waited
  for up to ``--drain`` seconds, and those still open then are **lost** (the client gives up);
* per cell: requests, lost, errors (non-200 answers and failed connections), images answered,
  images per second (images answered / seconds from the first arrival to the last answer), p50 /
  p95 / p99 latency per answered request, the mean **queue wait** per image (Little's law: the
  server's queue depth, read from /metrics every ``--sample`` seconds, integrated over the cell
  and divided by the images that arrived) and the mean batch occupancy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
MODES = ("continuous", "one-at-a-time", "static")
ARRIVALS = ("closed", "poisson")
MEAN_IMAGES = 2.5  # images per request: n uniform in 1..4


def start_server(mode: str, method: str, max_batch: int, threads: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    """A ``csdgen serve`` subprocess on a free port; returns it and its base URL once it serves."""
    argv = [sys.executable, "-m", "csdgen", "serve", "--port", "0", "--method", method, "--window", "auto",
            "--max-queue", "100000", "--max-images", "4"]
    if mode == "one-at-a-time":
        argv += ["--max-batch", "1"]
    else:
        argv += ["--max-batch", str(max_batch)]
    if mode == "static":
        argv += ["--batching", "static"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    proc = subprocess.Popen(argv + extra, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    deadline = time.monotonic() + 600
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        found = re.search(r"on (http://[^/\s]+)/v1", line)
        if found:
            return proc, found.group(1)
    proc.kill()
    raise RuntimeError(f"the server did not start: {''.join(seen)}")


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=60).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def run_clients(url: str, clients: int, duration: float, method: str, num_classes: int, seed: int,
                per_client: int | None = None) -> dict:
    """``clients`` threads sending requests back to back for ``duration`` seconds, or ``per_client``
    requests each where given (module docstring)."""
    results: list[tuple[float, float, int, int]] = []  # (sent, answered, status, images)
    lock = threading.Lock()
    clock: dict[str, float] = {}

    def go() -> None:  # the clock starts once every client is ready (thread started, HTTP client built)
        clock["began"] = time.perf_counter()
        clock["stop_at"] = clock["began"] + duration

    ready = threading.Barrier(clients, action=go)

    def client(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        with httpx.Client(timeout=3600) as http:
            ready.wait()
            sent_count = 0
            while (sent_count < per_client) if per_client else (time.perf_counter() < clock["stop_at"]):
                sent_count += 1
                n = rng.randint(1, 4)
                body = {"prompt": str(rng.randrange(num_classes)), "n": n, "seed": rng.randrange(2**31),
                        "method": method, "window": "auto"}
                sent = time.perf_counter()
                try:
                    status = http.post(url + "/v1/images/generations", json=body).status_code
                except httpx.HTTPError:
                    status = -1
                with lock:
                    results.append((sent, time.perf_counter(), status, n if status == 200 else 0))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    began = clock["began"]
    ok = [r for r in results if r[2] == 200]
    latencies = sorted(r[1] - r[0] for r in ok)
    end = max((r[1] for r in results), default=began)
    images = sum(r[3] for r in results)

    return {"requests": len(ok), "images": images, "seconds": end - began,
            "images_per_second": images / (end - began) if end > began else 0.0,
            "p50": quantile(latencies, 0.5), "p95": quantile(latencies, 0.95), "errors": len(results) - len(ok)}


def quantile(ordered: list[float], q: float) -> float:
    """The value at rank ``int(q * n)`` of ``ordered`` (sorted ascending, ``n`` values; the last one
    at most); NaN when empty. Every latency quantile of the serving benchmarks."""
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def poisson_arrivals(rate: float, requests: int, duration: float, num_classes: int, seed: int,
                     exact: bool = False) -> list[dict]:
    """Open-loop arrivals: ``rate`` images per second (> 0) as requests of n = 1..4 images at exponential
    gaps (mean ``MEAN_IMAGES / rate`` seconds), at most ``requests`` of them and none after ``duration``
    seconds. Returns one dict per request, in order: ``at`` (seconds from the start), ``n``, ``prompt``
    (a class id as text) and ``seed``; the same for the same arguments.

    A draw of a few minutes offers up to a fifth more or less than ``rate`` (the count of requests and
    their sizes vary). With ``exact`` the draw's arrival times are scaled by one factor so that its
    images over ``images / rate`` seconds are exactly ``rate`` (the draw's order and relative gaps
    kept, the last arrival at most ``images / rate`` seconds in): "0.9 of capacity" then offers 0.9
    of it in every draw.

    Raises:
        ValueError: a rate, duration or request count <= 0, or fewer than one class."""
    if not rate > 0 or not duration > 0 or requests < 1 or num_classes < 1:
        raise ValueError(f"rate={rate!r}, duration={duration!r}, requests={requests!r}, num_classes={num_classes!r}: "
                         f"allowed rate > 0 images/s, duration > 0 s, requests >= 1, num_classes >= 1")
    rng = random.Random(seed)
    out, at = [], 0.0
    while len(out) < requests:
        at += rng.expovariate(rate / MEAN_IMAGES)
        if at > duration:
            break
        out.append({"at": at, "n": rng.randint(1, 4), "prompt": str(rng.randrange(num_classes)),
                    "seed": rng.randrange(2**31)})
    if exact and out:
        factor = sum(a["n"] for a in out) / rate / duration
        for a in out:
            a["at"] *= factor
    return out


def run_open_loop(url: str, arrivals: list[dict], method: str, drain: float, sample: float) -> dict:
    """Send every request of ``arrivals`` at its time (each on its own thread: nobody waits for an answer
    to send the next), wait for the answers up to ``drain`` seconds after the last arrival, and sample the
    server's queue depth every ``sample`` seconds meanwhile (module docstring)."""
    results: list[tuple[float, float, str, int]] = []  # (sent, answered, outcome: ok / error / lost, images)
    lock = threading.Lock()
    depth: list[tuple[float, float]] = []  # (seconds, images waiting)
    last = arrivals[-1]["at"] if arrivals else 0.0
    began = time.perf_counter()
    give_up = began + last + drain

    def send(http: httpx.Client, item: dict) -> None:
        body = {"prompt": item["prompt"], "n": item["n"], "seed": item["seed"], "method": method, "window": "auto"}
        sent = time.perf_counter()
        try:
            status = http.post(url + "/v1/images/generations", json=body,
                               timeout=max(give_up - sent, 1.0)).status_code
            outcome = "ok" if status == 200 else "error"
        except httpx.TimeoutException:
            outcome = "lost"
        except httpx.HTTPError:
            outcome = "error"
        with lock:
            results.append((sent, time.perf_counter(), outcome, item["n"] if outcome == "ok" else 0))

    done = threading.Event()

    def sampler() -> None:
        with httpx.Client(timeout=30) as http:
            while not done.is_set():
                try:
                    text = http.get(url + "/metrics").text
                    value = next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                                 if line.startswith("csdgen_queue_depth "))
                    depth.append((time.perf_counter() - began, value))
                except (httpx.HTTPError, StopIteration, ValueError):
                    pass
                done.wait(sample)

    watcher = threading.Thread(target=sampler, daemon=True)
    watcher.start()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    with httpx.Client(limits=limits) as http:
        threads = []
        for item in arrivals:
            time.sleep(max(0.0, began + item["at"] - time.perf_counter()))
            t = threading.Thread(target=send, args=(http, item))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
    done.set()
    watcher.join()
    ok = [r for r in results if r[2] == "ok"]
    latencies = sorted(r[1] - r[0] for r in ok)
    end = max((r[1] for r in ok), default=began)
    images = sum(r[3] for r in ok)
    # Little's law: the queue's time integral (images x seconds) over the images that arrived
    area = sum(v * (t1 - t0) for (t0, v), (t1, _) in zip(depth, depth[1:]))
    arrived = sum(item["n"] for item in arrivals)

    return {"requests": len(arrivals), "answered": len(ok), "lost": sum(r[2] == "lost" for r in results),
            "errors": sum(r[2] == "error" for r in results), "images": images, "seconds": end - began,
            "offered_images_per_second": arrived / last if last > 0 else float("nan"),
            "images_per_second": images / (end - began) if end > began else 0.0,
            "p50": quantile(latencies, 0.5), "p95": quantile(latencies, 0.95), "p99": quantile(latencies, 0.99),
            "queue_wait": area / arrived if arrived else float("nan")}


def measure_capacity(method: str, args, extra: list[str], num_classes: int) -> dict:
    """Images per second the open loop's rates are fractions of: one-at-a-time throughput (one
    closed-loop client for ``--capacity-seconds``) times ``--max-batch``."""
    proc, url = start_server("one-at-a-time", method, 1, args.threads, extra)
    try:
        httpx.post(url + "/v1/images/generations", json={"prompt": "0", "method": method, "seed": 0}, timeout=3600)
        cell = run_clients(url, 1, args.capacity_seconds, method, num_classes, args.seed)
    finally:
        stop_server(proc)
    one = cell["images_per_second"]
    return {"method": method, "one_at_a_time": one, "max_batch": args.max_batch, "capacity": one * args.max_batch}


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def open_loop(args, extra: list[str], methods: list[str], modes: list[str], rates: list[float],
              num_classes: int) -> tuple[list[dict], list[dict]]:
    """Every method x batching x rate (module docstring); returns the cells and the capacities."""
    rows, capacities = [], []
    for method in methods:
        if args.capacity is not None:
            capacity = {"method": method, "one_at_a_time": None, "max_batch": args.max_batch, "capacity": args.capacity}
        else:
            capacity = measure_capacity(method, args, extra, num_classes)
        capacities.append(capacity)
        print(json.dumps({"capacity": capacity}), flush=True)
        for mode in modes:
            proc, url = start_server(mode, method, args.max_batch, args.threads, extra)
            try:
                httpx.post(url + "/v1/images/generations", json={"prompt": "0", "method": method, "seed": 0},
                           timeout=3600)  # warm-up
                for k, rate in enumerate(rates):
                    arrivals = poisson_arrivals(rate * capacity["capacity"], args.requests, args.duration, num_classes,
                                                args.seed * 1000 + k)
                    before = metrics(url)
                    cell = run_open_loop(url, arrivals, method, args.drain, args.sample)
                    after = metrics(url)
                    iterations = after["csdgen_batch_iterations_total"] - before["csdgen_batch_iterations_total"]
                    rows_fed = after["csdgen_batch_rows_total"] - before["csdgen_batch_rows_total"]
                    cell.update(method=method, mode=mode, rate=rate, capacity=capacity["capacity"],
                                max_batch=1 if mode == "one-at-a-time" else args.max_batch,
                                occupancy=rows_fed / iterations if iterations else 0.0)
                    rows.append(cell)
                    print(json.dumps(cell), flush=True)
            finally:
                stop_server(proc)
    return rows, capacities


def open_table(rows: list[dict]) -> str:
    """Markdown: one row per (method, batching, rate), with continuous's p95 latency over this one's."""
    lines = ["| method | batching | max batch | rate x capacity | offered images/s | requests | lost | errors | images | "
             "images/s | p50 s | p95 s | p99 s | queue wait s | mean occupancy | continuous p95 / this |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    index = {(r["method"], r["mode"], r["rate"]): r for r in rows}
    for r in rows:
        cont = index.get((r["method"], "continuous", r["rate"]))
        ratio = f"{cont['p95'] / r['p95']:.2f}x" if cont and r["p95"] == r["p95"] and r["p95"] > 0 else "-"
        lines.append(f"| {r['method']} | {r['mode']} | {r['max_batch']} | {r['rate']:g} | {r['offered_images_per_second']:.2f} | "
                     f"{r['requests']} | {r['lost']} | {r['errors']} | {r['images']} | {r['images_per_second']:.2f} | "
                     f"{r['p50']:.1f} | {r['p95']:.1f} | {r['p99']:.1f} | {r['queue_wait']:.1f} | {r['occupancy']:.1f} | {ratio} |")
    return "\n".join(lines)


def check_offline(url: str, model, method: str, requests: int, seed: int) -> dict:
    """Fixed-window (16) requests sent together; each image against generate(seed, image_indices=[i])."""
    import csdgen

    rng = random.Random(seed)
    bodies = [{"prompt": str(rng.randrange(model.num_classes)), "n": rng.randint(1, 4), "seed": rng.randrange(2**31),
               "method": method, "window": 16, "return_tokens": True} for _ in range(requests)]
    answers: list = [None] * requests

    def send(i: int) -> None:
        answers[i] = httpx.post(url + "/v1/images/generations", json=bodies[i], timeout=3600)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    agreements, exact, errors = [], 0, 0
    N = model.num_image_tokens
    for body, answer in zip(bodies, answers):
        if answer.status_code != 200:
            errors += 1
            continue
        for i, item in enumerate(answer.json()["data"]):
            offline = csdgen.generate(model, [int(body["prompt"])], method=method, window=16, seed=body["seed"],
                                      image_indices=[i])
            served = item["csdgen"]["tokens"]
            agree = sum(int(a == b) for a, b in zip(served, offline.tokens[0].tolist())) / N
            agreements.append(agree)
            exact += agree == 1.0
    return {"images": len(agreements), "exact": exact, "min_agreement": min(agreements, default=float("nan")),
            "errors": errors}


def per_client_counts(parser: argparse.ArgumentParser, per_client: list[int], clients: list[int]) -> list[int]:
    """``--per-client``, one count per ``--clients`` entry: a single number stands for every entry;
    another length exits through ``parser.error`` naming both."""
    if len(per_client) == 1:
        return per_client * len(clients)
    if len(per_client) != len(clients):
        parser.error(f"--per-client {','.join(map(str, per_client))}: allowed one number, or one per --clients "
                     f"entry ({len(clients)})")
    return per_client


def main(argv: list[str] | None = None) -> int:
    from csdgen.cli._options import METHODS, count, names_of, numbers, real
    from csdgen.jsonio import write_json

    positive = real(0.0, low_open=True, allowed="a number > 0")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=numbers(int, empty=False, check=lambda v: v >= 1, allowed="integers >= 1"),
                   default=[1, 4, 16, 32], help="concurrent clients per cell (default 1,4,16,32)")
    p.add_argument("--methods", type=names_of(METHODS, "method"), default=["ar", "sjd", "csd"],
                   help="decoding methods, window auto (default ar,sjd,csd)")
    p.add_argument("--modes", type=names_of(MODES, "batching"), default=list(MODES),
                   help=f"batchings (default {','.join(MODES)})")
    p.add_argument("--max-batch", type=count(1), default=16, help="--max-batch of continuous and static (default 16)")
    p.add_argument("--duration", type=positive, default=60.0, help="seconds of load per cell (default 60)")
    p.add_argument("--per-client", type=numbers(int, empty=False, check=lambda v: v >= 1, allowed="integers >= 1",
                                                distinct=False),
                   default=None,
                   help="closed loop: each client sends this many requests instead of loading for --duration (the "
                        "same requests for every method and batching: their image counts, classes and seeds); one "
                        "number, or one per --clients entry")
    p.add_argument("--repeat", type=count(1), default=1,
                   help="closed loop: rounds of every cell (each round runs every client count with the methods and "
                        "batchings in turn: the machine's speed drifts, and each cell's ratio over the first method "
                        "compares neighbours)")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")),
                   help="the server's torch threads (default $OMP_NUM_THREADS or 2)")
    p.add_argument("--check", type=int, default=4, help="fixed-window requests checked against offline per server (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    p.add_argument("--note", default="", help="a line about the machine's state (e.g. 'under load')")
    p.add_argument("--url", default=None, help="load this running server instead of starting servers (any csdgen "
                   "serve: one process, or Ray Serve replicas); its batching and max batch are read from its /health")
    p.add_argument("--weights", type=Path, default=None,
                   help="built-in model weights folder, for the servers and the check (default: shipped with csdgen)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="the built-in model's dtype, for the servers and the check (default float32)")
    g = p.add_argument_group("open loop (--arrivals poisson; module docstring)")
    g.add_argument("--arrivals", choices=ARRIVALS, default="closed",
                   help="closed: --clients send back to back (default); poisson: requests arrive at --rate")
    g.add_argument("--rate", type=_fractions, default=[0.3, 0.6, 0.9],
                   help="arrival rates, fractions of the capacity (images/s), comma-separated (default 0.3,0.6,0.9)")
    g.add_argument("--capacity", type=positive, default=None,
                   help="images per second the rates are fractions of (default: measured per method, one-at-a-time "
                        "throughput x --max-batch)")
    g.add_argument("--capacity-seconds", type=positive, default=30.0,
                   help="seconds of the one-at-a-time load that measures the capacity (default 30)")
    g.add_argument("--requests", type=count(1), default=200, help="most requests per cell (default 200; --duration bounds them too)")
    g.add_argument("--drain", type=positive, default=600.0,
                   help="seconds after the last arrival the open requests are waited for; later ones are lost (default 600)")
    g.add_argument("--sample", type=positive, default=0.5, help="seconds between reads of the queue depth (default 0.5)")
    args, extra = p.parse_known_args(argv)
    if args.weights is not None:
        extra += ["--weights", str(args.weights)]
    extra += ["--dtype", args.dtype]
    clients = args.clients
    per_client = None if args.per_client is None else per_client_counts(p, args.per_client, clients)
    if args.url:
        return load_url(args, argv, clients, per_client)
    methods, modes = args.methods, args.modes
    load_start = os.getloadavg()
    model = None
    if args.check and args.arrivals == "closed":
        import torch

        from csdgen.models.builtin import load_builtin_model

        torch.set_num_threads(args.threads)
        model = load_builtin_model(args.weights, dtype=args.dtype)
    num_classes = model.num_classes if model is not None else _num_classes(args.weights)
    rows, checks = [], []
    if args.arrivals == "poisson":
        open_rows, capacities = open_loop(args, extra, methods, modes, args.rate, num_classes)
        load_end = os.getloadavg()
        machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, server threads {args.threads}, {args.dtype}, "
                   f"load average {load_start[0]:.1f} at start, {load_end[0]:.1f} at end{'; ' + args.note if args.note else ''}")
        command = "python benchmarks/bench_serve.py " + " ".join(argv if argv is not None else sys.argv[1:])
        print(f"\n{command}\n{machine}\n")
        for c in capacities:
            measured = (f"one at a time {c['one_at_a_time']:.3f} images/s x max batch {c['max_batch']}"
                        if c["one_at_a_time"] is not None else "given")
            print(f"capacity {c['method']}: {c['capacity']:.3f} images/s ({measured})")
        print()
        print(open_table(open_rows))
        if args.json:
            write_json({"command": command, "machine": machine, "capacities": capacities, "rows": open_rows}, args.json)
        return 0
    # every server starts first and stays up (an idle one waits on its queue, using no CPU); then every
    # cell runs with the methods and batchings in turn, so that neighbouring cells share the machine's pace
    servers: dict[tuple[str, str], str] = {}
    procs = []
    try:
        for method in methods:
            for mode in modes:
                proc, url = start_server(mode, method, args.max_batch, args.threads, extra)
                procs.append(proc)
                servers[(method, mode)] = url
                httpx.post(url + "/v1/images/generations", json={"prompt": "0", "method": method, "seed": 0},
                           timeout=3600)  # warm-up
        for round_ in range(args.repeat):
            for k, n_clients in enumerate(clients):
                for (method, mode), url in servers.items():
                    before = metrics(url)
                    cell = run_clients(url, n_clients, args.duration, method, num_classes, args.seed,
                                       per_client[k] if per_client else None)
                    after = metrics(url)
                    iterations = after["csdgen_batch_iterations_total"] - before["csdgen_batch_iterations_total"]
                    rows_fed = after["csdgen_batch_rows_total"] - before["csdgen_batch_rows_total"]
                    cell.update(method=method, mode=mode, clients=n_clients, round=round_,
                                max_batch=1 if mode == "one-at-a-time" else args.max_batch,
                                occupancy=rows_fed / iterations if iterations else 0.0)
                    rows.append(cell)
                    print(json.dumps(cell), flush=True)
        for (method, mode), url in servers.items():
            if args.check and model is not None:
                check = check_offline(url, model, method, args.check, args.seed)
                check.update(method=method, mode=mode)
                checks.append(check)
                print(json.dumps(check), flush=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    load_end = os.getloadavg()
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, server threads {args.threads}, {args.dtype}, "
               f"load average {load_start[0]:.1f} at start, {load_end[0]:.1f} at end{'; ' + args.note if args.note else ''}")
    command = "python benchmarks/bench_serve.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"\n{command}\n{machine}\n")
    print(table(rows))
    if checks:
        print("\n| method | batching | images checked | exact | min token agreement | errors |\n|---|---|---|---|---|---|")
        for c in checks:
            print(f"| {c['method']} | {c['mode']} | {c['images']} | {c['exact']} | {c['min_agreement']:.3f} | {c['errors']} |")
    if args.json:
        write_json({"command": command, "machine": machine, "rows": rows, "checks": checks}, args.json)
    return 0


def load_url(args, argv, clients: list[int], per_client: list[int] | None) -> int:
    """``--url``: every method and client count against the running server at ``args.url`` (no
    offline check; mean occupancy from its /metrics, which behind Ray Serve's proxy is one replica's
    at a time, so not reported there). ``clients``: the client counts; ``per_client``: the requests
    each client sends at each of them (None: ``--duration`` seconds of load), as main resolved them."""
    url, rows = args.url.rstrip("/").removesuffix("/v1"), []
    # the server's own batching and batch capacity (--max-batch, capped by its memory), as its /health
    # answers them (behind Ray Serve's proxy: one replica's, every replica started alike)
    health = httpx.get(url + "/health", timeout=60).json()
    label = health.get("batching", "url")
    for method in args.methods:
        httpx.post(url + "/v1/images/generations", json={"prompt": "0", "method": method, "seed": 0}, timeout=3600)
        for k, count in enumerate(clients):
            cell = run_clients(url, count, args.duration, method, _num_classes(args.weights), args.seed,
                               per_client[k] if per_client else None)
            cell.update(method=method, mode=label, clients=count, max_batch=health.get("capacity", "?"),
                        occupancy=float("nan"))
            rows.append(cell)
            print(json.dumps(cell), flush=True)
    command = "python benchmarks/bench_serve.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"\n{command}\n{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at end{'; ' + args.note if args.note else ''}\n")
    print(table(rows))
    if args.json:
        from csdgen.jsonio import write_json

        write_json({"command": command, "rows": rows}, args.json)
    return 0


def _num_classes(weights: Path | None = None) -> int:
    folder = weights if weights is not None else ROOT / "csdgen" / "builtin" / "weights"
    config = json.loads((folder / "config.json").read_text())
    return int(config["num_classes"])


def _fractions(text: str) -> list[float]:
    """``--rate``: comma-separated fractions > 0 of the capacity."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(v > 0 and v == v and v != float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: allowed fractions > 0 of the capacity, comma-separated (e.g. 0.3,0.6,0.9)")
    return values


def table(rows: list[dict]) -> str:
    """Markdown: one row per (round, method, batching, clients), with continuous's speed-up over the
    others and the images/s over the first method's in the same round, batching and clients."""
    first = rows[0]["method"] if rows else ""
    lines = ["| round | method | batching | max batch | clients | requests | images | images/s | p50 s | p95 s | "
             f"mean occupancy | errors | continuous / this | over {first} |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    index = {(r["method"], r["mode"], r["clients"], r.get("round", 0)): r for r in rows}
    for r in rows:
        key = r.get("round", 0)
        cont = index.get((r["method"], "continuous", r["clients"], key))
        ratio = f"{cont['images_per_second'] / r['images_per_second']:.2f}x" if cont and r["images_per_second"] else "-"
        base = index.get((first, r["mode"], r["clients"], key))
        over = f"{r['images_per_second'] / base['images_per_second']:.2f}x" if base and base["images_per_second"] else "-"
        lines.append(f"| {key} | {r['method']} | {r['mode']} | {r['max_batch']} | {r['clients']} | {r['requests']} | "
                     f"{r['images']} | {r['images_per_second']:.2f} | {r['p50']:.1f} | {r['p95']:.1f} | {r['occupancy']:.1f} | "
                     f"{r['errors']} | {ratio} | {over} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
