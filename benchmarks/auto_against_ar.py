"""``window="auto"`` against AR in interleaved pairs, and where auto's extra time per iteration goes.

Not a test. From the project root (one torch thread unless OMP_NUM_THREADS says otherwise):

    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/auto_against_ar.py                  # batch 16, SJD, 6 pairs
    OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/auto_against_ar.py --batch 16 --method csd --pairs 8

The built-in model, ``--batch`` images per call (class ids and image indices ``r * 1000 + i`` in
round ``r``, seed ``r``), the model's guidance scale. After one warm-up call of AR and two of auto
(auto learns its times and acceptance there, as in ``bench_decoding.py``), every round runs AR
(``method="ar"``) and ``--method`` with ``window="auto"`` on the same images, the order reversed
every other round. Per round it prints both calls' seconds, auto's gap to AR and auto's widths;
then the mean and standard deviation of the gaps, and per iteration (summed over the rounds,
divided by the iterations):

* ``forward``: the model session's ``forward`` (the static session's window step);
* ``outside``: the rest of an iteration (drafts, targets, verify, commit, the host sync, and for
  auto its chooser): ``_Loop._advance`` less ``forward``;
* ``choose``, ``observe``, ``laggard_ratio``: auto's chooser calls, timed where they run in the
  loop (after a forward, with its caches cold: several times what a loop of calls alone measures).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

import csdgen
from csdgen.cli._options import count, path
from csdgen.engine import loop as engine_loop
from csdgen.engine import window as engine_window
from csdgen.models import _static
from csdgen.models.builtin import load_builtin_model
from csdgen.sampling import SamplingConfig


class _Timers:
    """Seconds and calls per (window, part), from wrappers installed on enter and removed on exit."""

    def __init__(self):
        self.seconds = collections.defaultdict(float)
        self.calls = collections.defaultdict(int)
        self.window = None
        self._saved = []

    def _wrap(self, owner, name, part, tag_window=False):
        original = getattr(owner, name)
        timers = self

        def timed(*args, **kwargs):
            if tag_window:
                timers.window = args[0].window
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                key = (timers.window, part)
                timers.seconds[key] += time.perf_counter() - began
                timers.calls[key] += 1

        self._saved.append((owner, name, original))
        setattr(owner, name, timed)

    def __enter__(self):
        self._wrap(engine_loop._Loop, "_advance", "iteration", tag_window=True)
        self._wrap(_static.StaticSession, "forward", "forward")
        for name in ("choose", "observe", "laggard_ratio"):
            self._wrap(engine_window._AutoWindow, name, name)
        return self

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)

    def per_iteration(self, window) -> dict[str, float]:
        """Microseconds per iteration of each part for calls at ``window``."""
        iterations = self.calls[(window, "iteration")]
        if not iterations:
            return {}
        parts = {part: self.seconds[(window, part)] for part in ("forward", "choose", "observe", "laggard_ratio")}
        parts["outside"] = self.seconds[(window, "iteration")] - parts["forward"]
        return {part: 1e6 * seconds / iterations for part, seconds in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=count(1), default=16, help="images per call (default 16)")
    parser.add_argument("--method", default="sjd", help="auto's method (default sjd)")
    parser.add_argument("--pairs", type=count(1), default=6, help="rounds of one AR and one auto call (default 6)")
    parser.add_argument("--weights", type=path, default=None, help="built-in model weights folder (default: shipped with csdgen)")
    args = parser.parse_args()
    model = load_builtin_model(args.weights)
    sampling = SamplingConfig(guidance_scale=model.defaults.guidance_scale)
    B = args.batch

    def run(method, window, r):
        return csdgen.generate(model, [(r * 1000 + i) % model.num_classes for i in range(B)], method=method,
                               window=window, sampling=sampling, seed=r, image_indices=[r * 1000 + i for i in range(B)])

    print(f"built-in model, batch {B}, AR against {args.method.upper()} auto, {args.pairs} interleaved pairs, "
          f"torch threads {torch.get_num_threads()}, guidance {sampling.guidance_scale}")
    for method, window, r in (("ar", 1, 99), (args.method, "auto", 99), (args.method, "auto", 98)):
        run(method, window, r)  # warm-up: auto learns its times and acceptance
    gaps = []
    with _Timers() as timers:
        for r in range(args.pairs):
            cells = [("ar", 1), (args.method, "auto")]
            out = {window: run(method, window, r) for method, window in (cells if r % 2 == 0 else cells[::-1])}
            ar, auto = out[1].seconds, out["auto"].seconds
            gaps.append(auto / ar - 1)
            widths = dict(sorted(collections.Counter(out["auto"].widths).items()))
            print(f"round {r}: AR {ar:.3f} s, auto {auto:.3f} s, {100 * gaps[-1]:+.1f} %; auto's widths {widths}", flush=True)
    spread = statistics.stdev(gaps) if len(gaps) > 1 else float("nan")
    print(f"auto against AR: mean of the pairs' gaps {100 * statistics.mean(gaps):+.2f} %, standard deviation {100 * spread:.2f} %")
    for window, name in ((1, "AR"), ("auto", "auto")):
        parts = timers.per_iteration(window)
        print(f"{name:>4} per iteration: " + ", ".join(f"{part} {us:.0f} us" for part, us in parts.items()
                                                      if window == "auto" or part in ("forward", "outside")))


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
