"""One session forward, eager against static, with nothing around it (no loop, no verify).

Not a test: it times and prints. From the project root, one torch thread:

    OMP_NUM_THREADS=1 python benchmarks/bench_session_forward.py            # AR (1 slot), batch 1
    OMP_NUM_THREADS=1 python benchmarks/bench_session_forward.py --window 32 --batch 16
    OMP_NUM_THREADS=1 python benchmarks/bench_session_forward.py --window 16 --batch 16 --spread

``--spread``: the rows' positions spread evenly over the image (2 .. N - window - 1) instead of
all at ``--position``, as in a continuously batched server, where images joined at different
times (a ragged cache is then as wide as its longest row for every row).

Per engine (``eager``: the ragged DynamicCache session; ``static``: the preallocated cache,
uncompiled) it prefills the built-in model's session (guidance on), fills the cache to
``--position`` image tokens, then times ``forward`` of ``--window`` tokens at that position
followed by a rollback, ``--forwards`` times; it prints the median after the first five, for
each engine twice in turn (eager, static, eager, static). The difference between the engines is
their host work and cache handling per forward (the arithmetic is the same).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from csdgen.models._static import open_engine
from csdgen.models.builtin import load_builtin_model


def median_forward(model, engine: str, batch: int, window: int, position: int, forwards: int,
                   spread: bool = False) -> float:
    """Median seconds of ``forward`` + ``rollback`` at ``position`` (``spread``: positions spread over
    the image, one per row) on a fresh session of ``engine``."""
    N = model.num_image_tokens
    tokens = torch.randint(model.codebook_size, (batch, N))
    session = open_engine(model.start([3] * batch, None, True), engine, False)
    session.prefill()
    at = torch.linspace(2, N - window - 1, batch).long() if spread else torch.full((batch,), position)
    session.forward(tokens[:, : N - 1], torch.zeros(batch, dtype=torch.long))
    session.rollback(at)
    times = []
    for _ in range(forwards):
        began = time.perf_counter()
        session.forward(tokens[:, :window], at)
        session.rollback(at)
        times.append(time.perf_counter() - began)
    return statistics.median(times[5:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--position", type=int, default=127)
    parser.add_argument("--forwards", type=int, default=60)
    parser.add_argument("--spread", action="store_true", help="rows at positions spread over the image")
    args = parser.parse_args()
    model = load_builtin_model()
    where = "spread over the image" if args.spread else str(args.position)
    print(f"built-in model, batch {args.batch} (guided: {2 * args.batch} rows), window {args.window}, position "
          f"{where}, torch threads {torch.get_num_threads()}")
    for engine in ("eager", "static", "eager", "static"):
        seconds = median_forward(model, engine, args.batch, args.window, args.position, args.forwards, args.spread)
        print(f"{engine}: {1e3 * seconds:.2f} ms per forward (median of {args.forwards - 5})", flush=True)


if __name__ == "__main__":
    main()
