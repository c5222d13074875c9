"""Closed-loop serving without HTTP: what a served batch's window choice is worth, alone.

Not a test: it loads the built-in model and prints. Run from the project root:

    python benchmarks/served_closed_loop.py --threads 2 --clients 1 --per-client 16 --configs ar:1,sjd:auto,sjd:16,csd:auto,csd:16

One :class:`csdgen.engine.ContinuousBatch` of 16 static slots (the server's), fed as
``benchmarks/bench_serve.py``'s closed loop feeds ``csdgen serve``: each of ``--clients`` clients
has one request of n = 1..4 images (uniform, its own random stream: the same requests for every
configuration) in the batch at a time and sends its next one, ``--per-client`` in all, when the
last image of the one before finishes. The finished images' tokens go to the server's image worker
(VQ decoding and PNG encoding on its own thread, :class:`csdgen.serve.worker.ImageWorker`), as in
``csdgen serve``. No HTTP, no JSON: the decoding engine and the worker only. Per configuration
(``method:window``, a fixed width or ``auto``): images per second (images over the seconds from
the first admission to the last image encoded), its ratio over the first configuration, and the
widths the iterations ran.

The model loads in a thread that ends with the load and the batch runs on another thread
(:mod:`csdgen.torch_threads`), as in ``csdgen serve``.
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from csdgen.cli._options import count  # noqa: E402  (the CLI's own argument checks)


def configs(text: str) -> list[tuple[str, int | str]]:
    """``method:window`` pairs, comma-separated (window: an integer >= 1 or ``auto``)."""
    out = []
    for item in text.split(","):
        method, _, window = item.partition(":")
        if not method or not (window == "auto" or window.isdigit() and int(window) >= 1):
            raise argparse.ArgumentTypeError(f"{item!r}: allowed method:window, window an integer >= 1 or auto "
                                             f"(e.g. csd:auto)")
        out.append((method, window if window == "auto" else int(window)))
    return out


def run(model, method: str, window, clients: int, per_client: int, seed: int) -> dict:
    """One closed loop (module docstring); returns images, seconds, images per second and the widths run."""
    from csdgen.engine import ContinuousBatch
    from csdgen.serve.worker import ImageWorker, Work

    batch = ContinuousBatch(model, method=method, window=window, capacity=16)
    worker = ImageWorker(model)
    streams = [random.Random(seed * 1000 + c) for c in range(clients)]
    left: dict[int, int] = {}  # client -> images of its request still decoding
    owner: dict[int, int] = {}  # batch handle -> client
    sent = collections.Counter()
    errors: list[Exception] = []

    def send(client: int) -> None:
        rng = streams[client]
        sent[client] += 1
        n = rng.randint(1, 4)
        image_seed = rng.randrange(2**31)
        handles = batch.admit([rng.randrange(model.num_classes)] * n, [image_seed] * n, list(range(n)))
        left[client] = n
        owner.update((h, client) for h in handles)

    began = time.perf_counter()
    for client in range(clients):
        send(client)
    images = 0
    while left:
        for image in batch.step():
            worker.submit(Work(image.tokens, None, lambda png: None, errors.append))
            client = owner.pop(image.handle)
            left[client] -= 1
            images += 1
            if left[client] == 0:
                del left[client]
                if sent[client] < per_client:
                    send(client)
    unfinished = worker.close(600)
    seconds = time.perf_counter() - began
    if errors or unfinished:
        raise RuntimeError(f"the image worker failed: {errors[:1]}, {len(unfinished)} unfinished")
    widths = collections.Counter(batch.widths)
    return {"images": images, "seconds": seconds, "images_per_second": images / seconds,
            "widths": dict(widths.most_common(6)), "iterations": batch.iterations}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=count(1), default=1, help="concurrent clients (default 1)")
    p.add_argument("--per-client", type=count(1), default=16, help="requests each client sends (default 16)")
    p.add_argument("--configs", type=configs, default=configs("ar:1,sjd:auto,csd:auto"),
                   help="method:window pairs, comma-separated; the first is the baseline (default ar:1,sjd:auto,csd:auto)")
    p.add_argument("--threads", type=count(1), default=None, help="torch threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    from csdgen.models.builtin import load_builtin_model
    from csdgen.torch_threads import call_in_thread, set_threads

    model = call_in_thread(load_builtin_model)
    results = []

    failed: list[BaseException] = []

    def body() -> None:
        try:
            if args.threads is not None:
                set_threads(args.threads)
            for method, window in args.configs:
                results.append((method, window, run(model, method, window, args.clients, args.per_client, args.seed)))
        except (ValueError, RuntimeError) as exc:  # a bad method or window (the engine's message), a failed worker
            failed.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if failed:
        p.error(str(failed[0]))
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    print(f"# python benchmarks/served_closed_loop.py {' '.join(argv if argv is not None else sys.argv[1:])} "
          f"(commit {commit or 'unknown'})")
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, torch threads "
          f"{args.threads or torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}\n")
    print("| method | window | images | seconds | images/s | over the first | iterations | widths run (most frequent) |")
    print("|---|---|---|---|---|---|---|---|")
    base = results[0][2]["images_per_second"] if results else 1.0
    for method, window, r in results:
        widths = ", ".join(f"{w}: {n}" for w, n in r["widths"].items())
        print(f"| {method} | {window} | {r['images']} | {r['seconds']:.1f} | {r['images_per_second']:.3f} | "
              f"{r['images_per_second'] / base:.2f}x | {r['iterations']} | {widths} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
