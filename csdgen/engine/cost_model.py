"""The auto window's cost model: seconds per iteration by batch size and width, learned from the
iterations (:class:`_CostModel`, a part of :class:`csdgen.engine.window._AutoWindow`), and a served
batch's tokens per forward (:func:`batch_tokens`, :func:`batch_width`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["batch_tokens", "batch_width"]


def batch_tokens(tokens: np.ndarray, remaining) -> np.ndarray:
    """``[M]`` float64 tokens a whole batch commits in one forward of width W = 1 .. M.

    ``tokens``: ``[M]`` float64 tokens one image commits per forward at W = 1 .. M (E(W),
    :meth:`_AutoWindow.expected_tokens`, non-decreasing); ``remaining``: ``[A]`` integers >= 1, the
    image positions each row still has to commit. A window of W slots covers ``min(W, r)`` positions
    of a row ``r`` positions from its end, so the row commits ``tokens[min(W, r) - 1]``: the sum over
    rows. In a served batch the rows are at different places of their images (they joined at
    different iterations), so a row near its end gains nothing from a width past it.

    Raises:
        ValueError: ``tokens`` empty or not 1-D, or a remaining count < 1 (the value is named)."""
    tokens = np.asarray(tokens, dtype=np.float64)
    if tokens.ndim != 1 or tokens.size == 0:
        raise ValueError(f"tokens of shape {tuple(tokens.shape)}: allowed a non-empty 1-D array (one per width)")
    remaining = np.asarray(remaining, dtype=np.int64).reshape(-1)
    if remaining.size and int(remaining.min()) < 1:
        raise ValueError(f"remaining={remaining.tolist()}: allowed integers >= 1 (positions a row still has to commit)")
    widths = np.arange(1, tokens.size + 1)
    return tokens[np.minimum(widths[None, :], remaining[:, None]) - 1].sum(0)


def batch_width(tokens: np.ndarray, remaining, seconds: np.ndarray) -> int:
    """The width W (1 .. M) whose forward commits the most tokens per second for the whole batch:
    :func:`batch_tokens` over ``seconds`` (``[M]`` float64 > 0, the measured or predicted seconds of
    one iteration of this batch at W = 1 .. M); the narrowest of equals.

    Where a forward's time grows with batch x width (a compute-bound batch, a full one on a CPU)
    this is width 1 for a full batch and a wider window as the batch thins; where it is flat in the
    width (a launch- or memory-bound batch), the widest window that still gains tokens.

    Raises:
        ValueError: as :func:`batch_tokens`, or ``seconds`` of another length than ``tokens`` or not > 0."""
    seconds = np.asarray(seconds, dtype=np.float64)
    total = batch_tokens(tokens, remaining)
    if seconds.shape != total.shape or not (seconds > 0).all():
        raise ValueError(f"seconds of shape {tuple(seconds.shape)} (min {float(seconds.min()) if seconds.size else None}): "
                         f"allowed one time > 0 per width ({total.size} widths)")
    return int((total / seconds).argmax()) + 1


class _CostModel:
    """Seconds per iteration for :class:`csdgen.engine.window._AutoWindow` (which holds the state it reads:
    ``learned``, ``max_width``, ``buckets`` and the cache ``_cost_at``).

    **Time** ``t_A(W)``: seconds per iteration (forward, verify and bookkeeping, sync to sync)
    with ``A`` images decoding, an exponential average per ``(A, W)``; a width not measured is
    interpolated linearly between measured ones, and beyond the widest with the last slope
    (>= 0); a batch size never measured takes the nearest measured one's times (a larger one first).
    The machine's speed drifts: the width held keeps its time and its iterations read the pace
    instead, and every other width's seconds enter its time divided by the pace (:attr:`PACE_WEIGHT`);
    where the width held changes, a jump of the pace moves the last held width's time (:attr:`SWITCH_WEIGHT`).
    """

    TIME_WEIGHT = 0.3  # weight of a new time measurement
    #: weight of a new reading of the machine's pace (:attr:`_Learned.pace`). Each iteration of the
    #: width held reads the pace (its seconds over its kept time) instead of changing its time; every
    #: other width's seconds are divided by the pace before they enter its time. The core's speed
    #: moves by up to 25 % from one call to the next on the 2-core CPU of benchmarks/results/builtin_1911_classes.md (the same AR
    #: call 8.5-10.7 s), and a width tried for a few iterations in a slow moment was priced by that
    #: moment until tried again (SJD at batch 1: auto's 32-wide iterations measured 48.9 ms where the
    #: fixed window 32 of the same run averaged 27 ms); divided by the pace, widths are compared as if
    #: measured at one moment. Kept per batch size: each one's times were learned at moments of their
    #: own, so one size's reading does not hold for another's times (read at batch 2, the pace priced
    #: batch 16's 8-wide iterations at 19 ms where its width 1 was kept at 10.5 ms, 38 and 16 ms measured:
    #: every batch of 16 started with 4-8 iterations of width 8)
    PACE_WEIGHT = 0.3
    #: a time measured above this many times the estimate counts as this many (one iteration the
    #: machine took away from the process must not make a width look dear for the rest of the run)
    SPIKE = 1.5
    #: at a switch of the width held (same batch size), the weight of the pace's jump in the last held
    #: width's kept time, where that width read the pace for at least :attr:`SWITCH_SETTLED` iterations
    #: in a row (the pace then is its reading, not the one before). The machine's speed does not jump at
    #: a switch, so a jump is that width's kept time being off, which its own iterations never correct
    #: (they move the pace). At batch 16 on the built-in model window 8's time, taken in a warm-up, stayed
    #: 20 % low (23.1 ms at the kept pace, against 28 that width 1's 12.2 and their measured 38.4 / 16.4
    #: give): batches of 16 began with 8-11 iterations of width 8 at SJD's 1.16 tokens per forward
    SWITCH_WEIGHT = 0.5
    SWITCH_SETTLED = 5

    def _times(self, rows: int) -> dict[int, float]:
        """Seconds per iteration by width for ``rows`` images: this batch size's own measurements,
        the widths it lacks taken from the nearest larger batch size measured at two or more widths
        (else the largest smaller one), scaled by their ratio on the widths both have (a batch
        shrinking as images finish meets batch sizes measured at one or two widths only; alone,
        they would make every width cost the same, or every width below the narrowest measured
        one cost what that one costs: at 15 images measured at widths 4 and 8, width 1 looked as
        dear as width 4)."""
        times = self.learned.times
        def nearest(sizes):
            # the nearest batch size, the larger one first: a shrinking batch came from it, and its
            # curve (wide windows dear) is the safer guess than a small batch's (wide windows nearly free)
            larger = [a for a in sizes if a >= rows]
            return times[min(larger) if larger else max(sizes)]

        own = times.get(rows, {})
        known = [a for a in times if a != rows and len(times[a]) >= 2]
        if not known:
            if own:
                return own
            measured = [a for a in times if times[a]]
            return nearest(measured) if measured else {}
        base = nearest(known)
        if own and all(w in own for w in base):
            return own
        shared = [w for w in own if w in base]
        scale = float(np.mean([own[w] / base[w] for w in shared])) if shared else 1.0
        return {**{w: t * scale for w, t in base.items()}, **own}

    def pace(self, rows: int) -> float:
        """The machine's present speed relative to the one ``rows`` images' times are kept at
        (:attr:`_Learned.pace`): that batch size's own reading, else the last reading of any, else 1."""
        pace = self.learned.pace
        return pace.get(rows, pace.get(0, 1.0))

    def cost(self, rows: int) -> np.ndarray:
        """``[max_width]`` float64 estimated seconds per iteration at W = 1 .. max_width with ``rows`` images,
        at the pace the kept times are at (times the present :attr:`_Learned.pace` for seconds now).
        Read-only: the last result is kept until a time or the buckets change (the width held changes
        no time, only the pace: at batch 16 the chooser recomputed it at every width-1 iteration, 24 µs)."""
        key = (rows, self.buckets, tuple((a, tuple(by_width.items())) for a, by_width in self.learned.times.items()))
        if self._cost_at is not None and self._cost_at[0] == key:
            return self._cost_at[1]
        times = self._times(rows)
        widths = np.array([self.bucket(w) for w in range(1, self.max_width + 1)], dtype=np.float64)
        ws = sorted(times)
        if not ws:
            t = np.ones_like(widths)
        elif len(ws) == 1:
            t = np.full_like(widths, times[ws[0]])
        else:
            ts = np.array([times[w] for w in ws])
            xs = np.array(ws, dtype=np.float64)
            t = np.interp(widths, xs, ts)
            slope = max((ts[-1] - ts[-2]) / (xs[-1] - xs[-2]), 0.0)
            t = np.maximum(np.where(widths > xs[-1], ts[-1] + slope * (widths - xs[-1]), t), 1e-9)
        t.flags.writeable = False
        self._cost_at = (key, t)
        return t
