"""The auto window's acceptance model: E(W), the tokens one image commits per forward at each width,
from the decayed draft counts by depth and age (:class:`_AcceptanceModel`, a part of
:class:`csdgen.engine.window._AutoWindow`).
"""

from __future__ import annotations

import numpy as np

from .window_state import AGE_GROUPS, DEPTH_EDGES


class _AcceptanceModel:
    """E(W) for :class:`csdgen.engine.window._AutoWindow` (which holds the state it reads: ``learned``,
    ``max_width``, ``count``, the last forward's width ``_run_width`` and the caches below).

    **Tokens** ``E(W)``: a forward commits ``1 + R`` tokens per image, ``R`` the drafts accepted
    before the first rejection. Whether the draft at *depth* ``k`` (``k`` drafts already
    accepted in this forward) passes depends on where the image is (a long run of acceptances
    means a flat region, where the next draft passes too: acceptances are strongly correlated)
    and on the draft's *age*: a fresh draft is a guess (it almost never passes), one refined by
    one forward often does, one refined twice or more more often still. The loop counts drafts
    reached and rejected per (depth bucket, age group) (:data:`DEPTH_EDGES`, :data:`AGE_GROUPS`;
    a cell's counts decay by :attr:`DECAY` at every forward that reaches it, so the estimate
    follows the image, while depths a narrow window does not reach keep what a wide one taught);
    the pass rate of each cell is estimated from its counts (plus :attr:`PRIOR_WEIGHT` pseudo-drafts
    passing at :attr:`PRIOR`: one forward's few drafts do not decide), a thin cell taking the deepest
    thinner-depth estimate of its age group, a depth that no draft has reached often enough at
    least :attr:`OPTIMISM` (acceptances run in long bursts where the image is flat, so a narrow
    window's shallow rates under-predict a wide one: on the built-in emoji model the chooser
    settled at width 4, 1.8 tokens per forward, where window 32 committed 4.7; optimism gets the
    wide window tried and then measured), a group never seen :attr:`PRIOR`. In a steady
    state at width ``W`` committing ``L`` tokens per forward the draft at depth ``k`` has age
    ``floor((W - 1 - k) / L)``, and ``L = 1 + sum_k prod_{s<=k} pass(s, age_s)`` is solved by a
    damped fixed-point iteration for every W at once. On the built-in model (CSD, batch 1, 8
    images per width) this predicts the measured tokens per forward at widths 4..32 within 11 %
    from counts gathered at any one of them; the model before it (acceptance by age alone,
    ignoring the correlation with depth) predicted 2.1 tokens for window 32 from window-32
    counts, against 4.9 measured.

    **Calibration**: the drafts per forward ``E(W) - 1`` are scaled by measured over predicted at
    the width held, in its steady iterations (:meth:`calibration`).

    **Ramp**: a width wider than the last forward's starts from the drafts that forward left, its
    other slots fresh, and reaches its steady state after two forwards; it is priced by its tokens
    averaged over the forwards it has left before the image end (:meth:`ramp_tokens`), which near
    the end is its first forward or two.
    """

    DECAY = 0.97  # draft counts, per iteration
    #: pass rate assumed for an age group not seen (optimistic: an untried width gets tried; at 0.5
    #: a fresh process on the built-in model started at width 4 and took ~20 iterations to reach 16)
    PRIOR = 0.8
    MIN_REACHED = 8.0  # counts a (depth, age) cell needs for its own estimate
    #: pseudo-drafts at :attr:`PRIOR` added to every cell's counts (a Beta prior: the estimate is the
    #: posterior mean). Without it one batch-8 forward at the images' top rows (age-2 drafts at depth
    #: 0: 2 of 8 passed) set the rate every depth inherits, E(16) fell from 4.9 to 3.0 and then 2.0,
    #: and the README's first command (CSD, 8 images, a fresh process, two threads) ran width 1 and 4
    #: at 1.5-2.5x step compression: 4.85 s against window 16's 4.33 s over 11 runs; with 8: 4.19 s
    #: against 4.10 (8 runs, interleaved). 16 over-predicted fresh drafts (width 4 by 12 % from
    #: window-32 counts, tests/test_auto_window.py)
    PRIOR_WEIGHT = 8.0
    OPTIMISM = 0.9  # pass rate assumed at depths deeper than any seen (an untried wide window gets tried)
    #: per steady iteration of the width held, the decay of the calibration's sums (:meth:`calibration`):
    #: slow, a memory of about 500 iterations (five images at batch 1), because the counts already
    #: follow the image (:attr:`DECAY`); at 0.97 the factor followed it too, swung from 0.5 to 1.2
    #: within one image, and SJD at batch 1 ran width 4 for 54 of an image's 139 forwards
    CALIBRATION_DECAY = 0.998
    CALIBRATION_RANGE = (0.7, 1.3)  # the calibration factor is kept within these
    ITERATIONS = 12  # fixed-point iterations for E(W)
    REFRESH_EVERY = 4  # iterations between recomputations of E(W) while the counts change (it costs ~0.8 ms)

    def pass_rates(self) -> np.ndarray:
        """``[buckets, AGE_GROUPS]`` float64 estimated chance that a reached draft passes (class docstring)."""
        reached, rejected = self.learned.counts.reached, self.learned.counts.rejected
        rates = np.empty_like(reached)
        any_seen = np.flatnonzero(reached.sum(1) >= self.MIN_REACHED)
        deepest = int(any_seen[-1]) if any_seen.size else len(DEPTH_EDGES)  # nothing seen: PRIOR everywhere
        for g in range(AGE_GROUPS):
            seen = reached[:, g] >= self.MIN_REACHED
            total = reached[:, g].sum()
            a = self.PRIOR_WEIGHT
            pooled = (total - rejected[:, g].sum() + a * self.PRIOR) / (total + a) if total >= self.MIN_REACHED else self.PRIOR
            last = None
            for b in range(len(DEPTH_EDGES)):
                if seen[b]:
                    last = (reached[b, g] - rejected[b, g] + a * self.PRIOR) / (reached[b, g] + a)
                if b > deepest and last is not None:  # a depth no draft reached often enough: optimistic
                    rates[b, g] = max(last, self.OPTIMISM)
                else:
                    rates[b, g] = last if last is not None else pooled
        return rates.clip(0.0, 1.0)

    def _grid(self):
        """``(widths [M, 1], depth [1, M - 1], drafts [M, M - 1] bool, bucket [1, M - 1])`` of E(W)'s
        arrays: every width W = 1 .. M against every draft depth, whether W holds a draft at that depth,
        and the depth's bucket (:data:`DEPTH_EDGES`)."""
        if self._grid_arrays is None:
            M = self.max_width
            widths = np.arange(1, M + 1, dtype=np.float64)[:, None]
            depth = np.arange(max(M - 1, 1))[None]
            bucket = np.searchsorted(np.asarray(DEPTH_EDGES[1:]), depth, side="right")
            self._grid_arrays = (widths, depth, depth <= widths - 2, bucket)
        return self._grid_arrays

    def _one_forward(self, rates: np.ndarray, age: np.ndarray) -> np.ndarray:
        """``[M]`` float64 tokens one forward commits per image at W = 1 .. M when the draft at depth
        ``k`` has age group ``age[W - 1, k]`` (``[M, M - 1]`` int64): ``1 + sum_k prod_{s<=k} pass(s, age_s)``."""
        _, _, drafts, bucket = self._grid()
        passes = np.where(drafts, rates[bucket, age], 0.0)
        return 1.0 + np.cumprod(passes, axis=1).sum(1)

    def _steady_ages(self, tokens: np.ndarray) -> np.ndarray:
        """``[M, M - 1]`` int64 age group of the draft at depth ``k`` in a steady run of width W committing
        ``tokens[W - 1]`` (``[M]``) tokens per forward: ``floor((W - 1 - k) / L)`` (class docstring)."""
        widths, depth, _, _ = self._grid()
        return np.minimum(np.floor((widths - 1 - depth) / tokens[:, None]), AGE_GROUPS - 1).clip(0).astype(np.int64)

    def expected_tokens(self) -> np.ndarray:
        """``[max_width]`` float64: E(W), tokens committed per image and forward, for W = 1 .. max_width."""
        rates = self.pass_rates()
        tokens = np.ones(self.max_width)
        for _ in range(self.ITERATIONS):
            tokens = 0.5 * tokens + 0.5 * self._one_forward(rates, self._steady_ages(tokens))
        # a wider window commits at least as many tokens (its drafts at every depth are as old or older,
        # and it has more of them); the fixed point of a wider one can land a hair lower: keep it monotone
        return np.maximum.accumulate(tokens)

    def ramp_tokens(self, last: int, limit: int) -> np.ndarray:
        """``[max_width]`` float64: E(W) (uncalibrated, :meth:`expected_tokens`) averaged over the forwards
        a switch from width ``last`` (the last forward's) to W has left before the image end, ``limit``
        positions away: ``n = ceil(limit / E(W))`` forwards, the first two of which hold younger drafts.

        The drafts a width-``last`` forward leaves have the ages of its steady run; a wider window's
        other slots start fresh, and every forward refines every draft once, so forward ``j`` after the
        switch (0, 1) sees at depth ``k`` the age ``min(steady_W(k), steady_last(k) + j)``, and from the
        third on (:data:`AGE_GROUPS` = 3) the steady one: the mean is ``(E_0 + E_1 + (n - 2) E(W)) / n``
        (``E_0`` where ``n`` is 1). Widths up to ``last`` keep E(W). Near the image end the steady state
        never comes: batch 16 on the built-in model ran width 1, then at 8 positions from the end widths
        8, 7, 6, 5, 3 (predicted 2.3 tokens per forward at width 8, 1.2-1.4 measured: every draft was
        fresh), six iterations of the 8-wide bucket, 2.3 times a width-1 iteration each, about 3 % of the batch."""
        steady = self._raw if self._raw is not None else self.expected_tokens()
        key = (self._tokens_at, last)
        if self._ramp_at != key:
            rates = self.pass_rates()
            ages = self._steady_ages(steady)  # row last - 1: the ages the last forward's drafts have
            first, second = (self._one_forward(rates, np.minimum(ages, ages[last - 1] + j)) for j in (0, 1))
            wider = np.arange(1, self.max_width + 1) > last
            # kept per key: the first forward's tokens, and what the first two forwards differ from two
            # steady ones by (0 up to width last), so a call is seven array operations, not thirteen
            # (cold after a forward, each costs µs: this was half of choose's time at batch 16)
            self._ramp = [np.where(wider, first, steady), np.where(wider, first + second - 2.0 * steady, 0.0)]
            self._ramp_at = key
        first, gap = self._ramp
        n = np.maximum(np.ceil(limit / steady), 1.0)
        return np.where(n >= 2, steady + gap / n, first)  # (E_0 + E_1 + (n - 2) E(W)) / n

    def calibration(self) -> float:
        """The factor the acceptance model's drafts per forward (``E(W) - 1``) are multiplied by:
        drafts accepted per image and forward as measured over as predicted, summed (decayed by
        :attr:`CALIBRATION_DECAY`) over the iterations of the width held once its window holds only
        drafts refined in the run (``ceil(W / E(W))`` iterations in a row at it), both sums starting
        at 16 drafts (:class:`_Counts`: a ratio of a few forwards' drafts is noise, one forward accepts
        anything from 0 to W - 1), kept within :attr:`CALIBRATION_RANGE`.

        The model predicts the width its counts come from too high: on the built-in model (16 images,
        fixed windows 8..32) by +1 to +7 % for SJD and 0 to +7 % for CSD, its steady-state draft ages
        (``floor((W - 1 - k) / L)``) being older than the ages the drafts have. Scaled where it is
        measured, what is left of its error at another width is that of its ratio ``E(W) / E(held)``
        (``benchmarks/acceptance_model_check.py``; benchmarks/results/builtin_1911_classes.md, issue 16 item 6)."""
        counts = self.learned.counts
        low, high = self.CALIBRATION_RANGE
        return min(max(counts.measured_drafts / max(counts.predicted_drafts, 1e-9), low), high)

    def _expected(self, limit: int | None = None) -> np.ndarray:
        """``[max_width]`` float64: :meth:`expected_tokens` with its drafts scaled by :meth:`calibration`;
        given ``limit`` (positions left to the image end), the widths wider than the last forward's
        (1 before the first: the prefill leaves no draft) averaged over the forwards they have left
        (:meth:`ramp_tokens`).
        E(W) is recomputed only when the counts changed, and then at most every :attr:`REFRESH_EVERY`
        iterations (the counts move by a few percent per iteration; the fixed point costs about 0.8 ms,
        5-7 % of a batch-1 iteration of the built-in model)."""
        version = self.learned.counts.version
        at_version, at_count = self._tokens_at
        if self._raw is None or (version != at_version and self.count - at_count >= self.REFRESH_EVERY):
            self._raw = self.expected_tokens()
            self._tokens_at = (version, self.count)
        raw = self._raw if limit is None else self.ramp_tokens(self._run_width or 1, limit)
        return 1.0 + (raw - 1.0) * self._factors()

    def _factors(self):
        """What :meth:`_expected` multiplies the drafts per forward by: :meth:`calibration` (a float); a
        chooser that calibrates width by width returns ``[max_width]`` float64 factors instead."""
        return self.calibration()
