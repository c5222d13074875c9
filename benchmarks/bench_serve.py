"""``csdgen serve`` under load: continuous batching against one-at-a-time and static batching.

Not a test: it starts servers, loads them and prints. Run from the project root:

    python benchmarks/bench_serve.py                                  # the full table (about 45 minutes)
    python benchmarks/bench_serve.py --clients 1,16 --methods csd --duration 20   # a quick look

For every decoding method (AR, SJD, CSD; window "auto") and every batching it starts one
``csdgen serve`` process on the built-in model (its own port, ``--threads`` threads):

* ``continuous``: ``--max-batch B`` (images join the running batch at every iteration);
* ``one-at-a-time``: ``--max-batch 1`` (one image decodes at a time: requests one at a time);
* ``static``: ``--batching static --max-batch B`` (a batch filled from the queue, run to its
  end, then the next);

then, for every number of concurrent clients, runs the clients for ``--duration`` seconds (the
clock starts when every client is ready, so each sends at least one request): each
client sends requests of n = 1..4 images (uniform, its own random stream) back to back, a random
class and seed each, and waits for the answer. Requests still open at the end are waited for and
counted. Per cell: requests, images, images per second (images / seconds from the first request
to the last answer), p50 / p95 latency per request, mean batch occupancy (from the server's
/metrics: images in the batch summed over iterations / iterations) and errors (non-200 answers
and failed connections; must be 0).

After the load, a check phase per server: ``--check`` concurrent requests with a fixed window
(16) and their tokens; each image is compared with ``csdgen.generate(seed=s,
image_indices=[i])`` offline (token agreement: float32 batching lets a few tokens differ; the
goal is >= 99 %).

``--url URL`` loads a server already running instead (one ``csdgen serve``, or ``csdgen serve
--replicas N`` on Ray Serve), for every method and client count, without the offline check.

The table (Markdown) and every figure (``--json``) are printed / written at the end, with the
command, the machine (CPU count, load average at the start and end) and the batch sizes.
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


def run_clients(url: str, clients: int, duration: float, method: str, num_classes: int, seed: int) -> dict:
    """``clients`` threads sending requests back to back for ``duration`` seconds (module docstring)."""
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
            while time.perf_counter() < clock["stop_at"]:
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

    def quantile(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else float("nan")

    return {"requests": len(ok), "images": images, "seconds": end - began,
            "images_per_second": images / (end - began) if end > began else 0.0,
            "p50": quantile(0.5), "p95": quantile(0.95), "errors": len(results) - len(ok)}


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", default="1,4,16,32", help="concurrent clients per cell (default 1,4,16,32)")
    p.add_argument("--methods", default="ar,sjd,csd", help="decoding methods, window auto (default ar,sjd,csd)")
    p.add_argument("--modes", default=",".join(MODES), help=f"batchings (default {','.join(MODES)})")
    p.add_argument("--max-batch", type=int, default=16, help="--max-batch of continuous and static (default 16)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load per cell (default 60)")
    p.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "2")),
                   help="the server's torch threads (default $OMP_NUM_THREADS or 2)")
    p.add_argument("--check", type=int, default=4, help="fixed-window requests checked against offline per server (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    p.add_argument("--note", default="", help="a line about the machine's state (e.g. 'under load')")
    p.add_argument("--url", default=None, help="load this running server instead of starting servers (any csdgen "
                   "serve: one process, or Ray Serve replicas); --modes is then its label in the table (default url)")
    args, extra = p.parse_known_args(argv)
    if args.url:
        return load_url(args, argv)
    clients = [int(c) for c in args.clients.split(",")]
    methods = args.methods.split(",")
    modes = args.modes.split(",")
    load_start = os.getloadavg()
    model = None
    if args.check:
        import torch

        from csdgen.models.builtin import load_builtin_model

        torch.set_num_threads(args.threads)
        model = load_builtin_model()
    num_classes = model.num_classes if model is not None else _num_classes()
    rows, checks = [], []
    for method in methods:
        for mode in modes:
            proc, url = start_server(mode, method, args.max_batch, args.threads, extra)
            try:
                httpx.post(url + "/v1/images/generations", json={"prompt": "0", "method": method, "seed": 0},
                           timeout=3600)  # warm-up
                for count in clients:
                    before = metrics(url)
                    cell = run_clients(url, count, args.duration, method, num_classes, args.seed)
                    after = metrics(url)
                    iterations = after["csdgen_batch_iterations_total"] - before["csdgen_batch_iterations_total"]
                    rows_fed = after["csdgen_batch_rows_total"] - before["csdgen_batch_rows_total"]
                    cell.update(method=method, mode=mode, clients=count,
                                max_batch=1 if mode == "one-at-a-time" else args.max_batch,
                                occupancy=rows_fed / iterations if iterations else 0.0)
                    rows.append(cell)
                    print(json.dumps(cell), flush=True)
                if args.check and model is not None:
                    check = check_offline(url, model, method, args.check, args.seed)
                    check.update(method=method, mode=mode)
                    checks.append(check)
                    print(json.dumps(check), flush=True)
            finally:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    load_end = os.getloadavg()
    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, server threads {args.threads}, "
               f"load average {load_start[0]:.1f} at start, {load_end[0]:.1f} at end{'; ' + args.note if args.note else ''}")
    command = "python benchmarks/bench_serve.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"\n{command}\n{machine}\n")
    print(table(rows))
    if checks:
        print("\n| method | batching | images checked | exact | min token agreement | errors |\n|---|---|---|---|---|---|")
        for c in checks:
            print(f"| {c['method']} | {c['mode']} | {c['images']} | {c['exact']} | {c['min_agreement']:.3f} | {c['errors']} |")
    if args.json:
        args.json.write_text(json.dumps({"command": command, "machine": machine, "rows": rows, "checks": checks}, indent=2))
    return 0


def load_url(args, argv) -> int:
    """``--url``: every method and client count against the running server at ``args.url`` (no
    offline check; mean occupancy from its /metrics, which behind Ray Serve's proxy is one replica's
    at a time, so not reported there)."""
    label = args.modes if args.modes != ",".join(MODES) else "url"
    url, rows = args.url.rstrip("/").removesuffix("/v1"), []
    for method in args.methods.split(","):
        httpx.post(url + "/v1/images/generations", json={"prompt": "0", "method": method, "seed": 0}, timeout=3600)
        for count in [int(c) for c in args.clients.split(",")]:
            cell = run_clients(url, count, args.duration, method, _num_classes(), args.seed)
            cell.update(method=method, mode=label, clients=count, max_batch=args.max_batch, occupancy=float("nan"))
            rows.append(cell)
            print(json.dumps(cell), flush=True)
    command = "python benchmarks/bench_serve.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"\n{command}\n{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at end{'; ' + args.note if args.note else ''}\n")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"command": command, "rows": rows}, indent=2))
    return 0


def _num_classes() -> int:
    config = json.loads((ROOT / "csdgen" / "builtin" / "weights" / "config.json").read_text())
    return int(config["num_classes"])


def table(rows: list[dict]) -> str:
    """Markdown: one row per (method, batching, clients), with continuous's speed-up over the others."""
    lines = ["| method | batching | max batch | clients | requests | images | images/s | p50 s | p95 s | mean occupancy | "
             "errors | continuous / this |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    index = {(r["method"], r["mode"], r["clients"]): r for r in rows}
    for r in rows:
        cont = index.get((r["method"], "continuous", r["clients"]))
        ratio = f"{cont['images_per_second'] / r['images_per_second']:.2f}x" if cont and r["images_per_second"] else "-"
        lines.append(f"| {r['method']} | {r['mode']} | {r['max_batch']} | {r['clients']} | {r['requests']} | {r['images']} | "
                     f"{r['images_per_second']:.2f} | {r['p50']:.1f} | {r['p95']:.1f} | {r['occupancy']:.1f} | {r['errors']} | "
                     f"{ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
