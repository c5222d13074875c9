"""How well ``window="auto"``'s acceptance model predicts the tokens per forward of other widths.

Not a test: it decodes and prints. Run from the project root:

    OMP_NUM_THREADS=1 python benchmarks/acceptance_model_check.py --images 40

For each method (SJD, CSD) it decodes the same ``--images`` images (batch 1, image ``i`` of class
``37 i`` mod the class count, seed 0) at fixed windows 4, 8, 16, 24 and 32, counting every draft
the loop reaches and rejects by depth bucket and age group as ``window="auto"`` counts them (the
loop's own bookkeeping, switched on for the fixed windows; counts summed, not decayed). Then, from
the counts of each source width, the acceptance model's tokens per forward at every width
(:meth:`csdgen.engine.window._AutoWindow.expected_tokens`) against those measured (forwards whose
window the image end did not cut), raw and calibrated as the chooser calibrates it at the width it
holds (drafts per forward scaled by measured over predicted at the source width,
:meth:`~csdgen.engine.window._AutoWindow.calibration`). Quality of the model, not speed: timings
play no part, so any thread count gives the same figures.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import csdgen
from csdgen.cli._options import count, path
from csdgen.engine import loop as engine_loop
from csdgen.engine.window import _AutoWindow, _Learned
from csdgen.models.builtin import load_builtin_model
from csdgen.sampling import SamplingConfig

WIDTHS = (4, 8, 16, 24, 32)


class _Recorder:
    """Sums the loop's draft counts and the tokens of full-width forwards while installed."""

    def __init__(self):
        self.counts = None
        self.tokens: list[float] = []
        self._original = (engine_loop._Loop._counting, engine_loop._Loop._auto_counts)

    def __enter__(self):
        recorder, original_counts = self, self._original[1]

        def counting(loop, W):  # the draft bookkeeping at fixed windows too
            return W > 1

        def auto_counts(loop, rows, r, widths, W):
            counts = original_counts(loop, rows, r, widths, W)
            if counts is not None:
                recorder.counts = counts.clone() if recorder.counts is None else recorder.counts + counts
                full = widths == W
                recorder.tokens += (r[full] + 1).double().tolist()
            return counts

        engine_loop._Loop._counting, engine_loop._Loop._auto_counts = counting, auto_counts
        return self

    def __exit__(self, *exc):
        engine_loop._Loop._counting, engine_loop._Loop._auto_counts = self._original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=count(1), default=40, help="images per width and method (default 40)")
    parser.add_argument("--first", type=count(0), default=5000, help="the first image index (default 5000)")
    parser.add_argument("--weights", type=path, default=None, help="built-in model weights folder (default: shipped with csdgen)")
    args = parser.parse_args()
    model = load_builtin_model(args.weights)
    sampling = SamplingConfig(guidance_scale=model.defaults.guidance_scale)
    print(f"built-in model, batch 1, {args.images} images (indices {args.first}..{args.first + args.images - 1}), "
          f"seed 0, guidance {sampling.guidance_scale}; tokens per forward, and the model's error from each width's counts")
    for method in ("sjd", "csd"):
        counts, measured = {}, {}
        for width in WIDTHS:
            with _Recorder() as recorder:
                for i in range(args.images):
                    index = args.first + i
                    csdgen.generate(model, [index * 37 % model.num_classes], window=width, sampling=sampling, seed=0,
                                    image_indices=[index], method=method)
            counts[width] = recorder.counts.double().reshape(2, -1).numpy()
            measured[width] = float(np.mean(recorder.tokens))
        print(f"\n{method.upper()} measured: " + "  ".join(f"W{w} {measured[w]:.2f}" for w in WIDTHS))
        for source in WIDTHS[1:]:
            auto = _AutoWindow(32, _Learned())
            shape = auto.learned.counts.reached.shape
            auto.learned.counts.reached = counts[source][0].reshape(shape)
            auto.learned.counts.rejected = counts[source][1].reshape(shape)
            raw = auto.expected_tokens()
            # the chooser's calibration (its range included) with the source width's drafts as its sums
            auto.learned.counts.measured_drafts = measured[source] - 1
            auto.learned.counts.predicted_drafts = raw[source - 1] - 1
            factor = auto.calibration()
            auto._raw = raw
            calibrated = auto._expected()
            row = lambda e: "  ".join(f"W{w} {100 * (e[w - 1] / measured[w] - 1):+4.0f} %" for w in WIDTHS)
            print(f"  from window {source:2} counts, raw:        {row(raw)}")
            print(f"  from window {source:2} counts, calibrated: {row(calibrated)}  (factor {factor:.2f})")


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
