"""Closed-loop serving without HTTP: what a served batch's window choice is worth, alone.

Not a test: it loads the built-in model and prints. Run from the project root:

    python benchmarks/served_closed_loop.py --threads 2 --clients 1 --per-client 4 --rounds 6 --configs ar:1,sjd:auto,csd:auto

One :class:`csdgen.engine.ContinuousBatch` of 16 static slots (the server's), fed as
``benchmarks/bench_serve.py``'s closed loop feeds ``csdgen serve``: each of ``--clients`` clients
has one request of n = 1..4 images (uniform, its own random stream: the same requests for every
configuration) in the server at a time and sends its next one, ``--per-client`` in all, when the
last image of the one before finishes. As in the server, images beyond the 16 slots wait in a queue
and join the batch, oldest first, at the next iteration boundary after a slot frees. The finished images' tokens go to the server's image worker
(VQ decoding and PNG encoding on its own thread, :class:`csdgen.serve.worker.ImageWorker`), as in
``csdgen serve``. No HTTP, no JSON: the decoding engine and the worker only. Per configuration
(``method:window``, a fixed width or ``auto``): images per second (images over the seconds from
the first admission to the last image encoded), its ratio over the first configuration, and the
widths the iterations ran.

With ``--rounds R`` every configuration runs ``--per-client`` requests per client in turn, R times,
each keeping its batch (its ``auto`` state) and its clients' streams from one round to the next, as a
running server would: each round's ratio compares configurations run next to each other in time
(this 2-core CPU's speed drifts by up to a quarter between runs minutes apart), and the table gives
each round's ratio and their median. ``--clients 1,4,16,32`` runs one cell per client count (each with
its own ``--per-client``, one number or one per entry), the batches kept from one cell to the next;
``--device cuda`` runs the model there; ``--json PATH`` writes every round's figures.

The model loads in a thread that ends with the load and the batch runs on another thread
(:mod:`csdgen.torch_threads`), as in ``csdgen serve``.
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import random
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_header import commit as checkout_commit  # noqa: E402
from bench_serve import per_client_counts  # noqa: E402  (--per-client read as the HTTP benchmark reads it)
from csdgen.cli._options import METHODS, count, numbers, one_of, path  # noqa: E402  (the CLI's own argument checks)


def configs(text: str) -> list[tuple[str, int | str]]:
    """``method:window`` pairs, comma-separated (method: one of csdgen's, any case; window: an integer
    >= 1 or ``auto``), refused in one line before the model loads."""
    out = []
    for item in text.split(","):
        method, _, window = item.partition(":")
        if not method or not (window == "auto" or window.isdigit() and int(window) >= 1):
            raise argparse.ArgumentTypeError(f"{item!r}: allowed method:window, window an integer >= 1 or auto "
                                             f"(e.g. csd:auto)")
        out.append((one_of(METHODS, "method")(method), window if window == "auto" else int(window)))
    return out


#: the batch's slots: ``csdgen serve``'s default --max-batch (more images wait in its queue)
CAPACITY = 16


class Loop:
    """One configuration's closed loop (module docstring): its batch, its image worker and its clients'
    random streams, kept from one round to the next as a running server keeps them."""

    def __init__(self, model, method: str, window, seed: int):
        from csdgen.engine import ContinuousBatch
        from csdgen.serve.worker import ImageWorker

        self.model, self.seed = model, seed
        self.batch = ContinuousBatch(model, method=method, window=window, capacity=CAPACITY)
        self.worker = ImageWorker(model)
        self.streams: dict[tuple[int, int], random.Random] = {}  # (clients, client) -> its requests

    def round(self, clients: int, per_client: int) -> dict:
        """Each of ``clients`` clients sends ``per_client`` requests (the next ones of its stream: the
        same for every configuration), one at a time; returns images, seconds (first admission to the
        last image encoded), images per second, iterations and the widths run."""
        from csdgen.serve.worker import Work

        batch, model = self.batch, self.model
        left: dict[int, int] = {}  # client -> images of its request still waiting or decoding
        owner: dict[int, int] = {}  # batch handle -> client
        waiting: collections.deque = collections.deque()  # (client, class, seed, image index), oldest first
        sent = collections.Counter()
        errors: list[Exception] = []
        encoded = threading.Condition()
        counts = {"submitted": 0, "ended": 0}  # images handed to the worker; encoded or failed (under encoded)

        def send(client: int) -> None:
            key = (clients, client)
            rng = self.streams.setdefault(key, random.Random(self.seed * 100_000 + clients * 1000 + client))
            sent[client] += 1
            n = rng.randint(1, 4)
            image_seed = rng.randrange(2**31)
            condition = rng.randrange(model.num_classes)
            waiting.extend((client, condition, image_seed, i) for i in range(n))
            left[client] = n

        def admit() -> None:  # the server's admission: the oldest waiting images, up to the free slots, one prefill
            take = [waiting.popleft() for _ in range(min(len(waiting), CAPACITY - batch.size))]
            if take:
                handles = batch.admit([t[1] for t in take], [t[2] for t in take], [t[3] for t in take])
                owner.update((h, t[0]) for h, t in zip(handles, take))

        def ended(result) -> None:  # the worker's thread: a PNG, or the exception of a failed decode
            with encoded:
                counts["ended"] += 1
                if isinstance(result, Exception):
                    errors.append(result)
                encoded.notify()

        began, start = time.perf_counter(), len(batch.widths)
        for client in range(clients):
            send(client)
        images = 0
        while left:
            admit()
            for image in batch.step():
                counts["submitted"] += 1
                self.worker.submit(Work(image.tokens, None, ended, ended))
                client = owner.pop(image.handle)
                left[client] -= 1
                images += 1
                if left[client] == 0:
                    del left[client]
                    if sent[client] < per_client:
                        send(client)
        with encoded:
            finished = encoded.wait_for(lambda: counts["ended"] == counts["submitted"], 600)
        if not finished or errors:
            raise RuntimeError(f"the image worker failed: {errors[:1] or 'images not encoded in 600 s'}")
        seconds = time.perf_counter() - began
        return {"images": images, "seconds": seconds, "images_per_second": images / seconds,
                "widths": collections.Counter(batch.widths[start:]), "iterations": len(batch.widths) - start}

    def close(self) -> None:
        self.worker.close(600)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=numbers(int, empty=False, check=lambda v: v >= 1, allowed="integers >= 1"),
                   default=[1], help="concurrent clients, one number or several comma-separated, each a cell (default 1)")
    p.add_argument("--per-client", type=numbers(int, empty=False, check=lambda v: v >= 1, allowed="integers >= 1",
                                                distinct=False), default=[16],
                   help="requests each client sends in each round: one number, or one per --clients entry (default 16)")
    p.add_argument("--rounds", type=count(1), default=1,
                   help="rounds: every configuration runs one round in turn, keeping its batch (default 1)")
    p.add_argument("--configs", type=configs, default=configs("ar:1,sjd:auto,csd:auto"),
                   help="method:window pairs, comma-separated; the first is the baseline (default ar:1,sjd:auto,csd:auto)")
    p.add_argument("--threads", type=count(1), default=None, help="torch threads (default: torch's)")
    p.add_argument("--device", default="cpu", help="where the model runs: cpu (default), cuda or cuda:N")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="the built-in model's dtype (default float32)")
    p.add_argument("--json", type=Path, default=None, help="write every figure here (JSON)")
    p.add_argument("--weights", type=path, default=None, help="built-in model weights folder (default: shipped with csdgen)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    per_client = per_client_counts(p, args.per_client, args.clients)
    if args.json is not None and not args.json.parent.is_dir():
        p.error(f"--json {args.json}: its folder {args.json.parent} does not exist")

    import torch

    from csdgen.jsonio import write_json
    from csdgen.models.builtin import load_builtin_model
    from csdgen.models.dtypes import check_device
    from csdgen.torch_threads import call_in_thread, set_threads

    try:
        device = torch.device(check_device(args.device))
    except ValueError as exc:
        p.error(f"--device: {exc}")
    model = call_in_thread(load_builtin_model, args.weights, device=device, dtype=args.dtype)
    #: per client count, per configuration, one result per round
    results = {c: [[] for _ in args.configs] for c in args.clients}
    failed: list[BaseException] = []

    def body() -> None:
        loops = []
        try:
            if args.threads is not None:
                set_threads(args.threads)
            loops.extend(Loop(model, method, window, args.seed) for method, window in args.configs)
            for clients, requests in zip(args.clients, per_client):
                for _ in range(args.rounds):
                    for k, loop in enumerate(loops):
                        results[clients][k].append(loop.round(clients, requests))
        except (ValueError, RuntimeError) as exc:  # a bad method or window (the engine's message), a failed worker
            failed.append(exc)
        finally:
            for loop in loops:
                loop.close()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if failed:
        p.error(str(failed[0]))
    for by_config in results.values():  # each round's ratio over the first configuration's same round
        for rounds in by_config:
            for r, first in zip(rounds, by_config[0]):
                r["over_first"] = r["images_per_second"] / first["images_per_second"]

    commit = checkout_commit()
    command = f"python benchmarks/served_closed_loop.py {' '.join(argv if argv is not None else sys.argv[1:])}"
    threads = args.threads or torch.get_num_threads()
    print(f"# {command} (commit {commit or 'unknown'})")
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, torch threads {threads}, "
          f"device {device}, {args.dtype}, load average {os.getloadavg()[0]:.2f}\n")
    for clients in args.clients:
        print(f"{clients} client{'s' if clients > 1 else ''}:\n")
        print(table(args.configs, results[clients]) + "\n")
    if args.json is not None:
        cells = [{"clients": clients, "method": method, "window": window,
                  "rounds": [{**r, "widths": {str(w): n for w, n in r["widths"].most_common()}} for r in rounds]}
                 for clients in args.clients for (method, window), rounds in zip(args.configs, results[clients])]
        write_json({"command": command, "commit": commit, "device": str(device), "threads": threads, "cells": cells},
                   args.json)  # atomic: a reader never sees half a file
    return 0


def table(configs: list[tuple[str, int | str]], results: list[list[dict]]) -> str:
    """The markdown table of one client count: per configuration, its images and seconds over all rounds,
    images per second, its ratio over the first configuration in each round (the rounds run in turn, so
    each ratio compares neighbours in time: this CPU's speed drifts between runs) and their median,
    iterations and widths."""
    lines = ["| method | window | images | seconds | images/s | over the first, by round | median | iterations "
             "| widths run (most frequent) |", "|---|---|---|---|---|---|---|---|---|"]
    for (method, window), rounds in zip(configs, results):
        images = sum(r["images"] for r in rounds)
        seconds = sum(r["seconds"] for r in rounds)
        ratios = [r["over_first"] for r in rounds]
        widths = sum((r["widths"] for r in rounds), collections.Counter())
        shown = ", ".join(f"{w}: {n}" for w, n in widths.most_common(6))
        lines.append(f"| {method} | {window} | {images} | {seconds:.1f} | {images / seconds:.3f} | "
                     f"{', '.join(f'{x:.2f}' for x in ratios)} | {statistics.median(ratios):.2f}x | "
                     f"{sum(r['iterations'] for r in rounds)} | {shown} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
