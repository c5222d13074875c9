"""``window="auto"``: each iteration's width chosen from measured times and from the acceptance
seen so far (:class:`_AutoWindow`; the algorithm in :mod:`csdgen.engine`).

The chooser here; its acceptance model in :mod:`csdgen.engine.acceptance_model`, its cost model in
:mod:`csdgen.engine.cost_model`, what it keeps between calls and the priors a model ships in
:mod:`csdgen.engine.window_state`.
"""

from __future__ import annotations

import numpy as np
import torch

from .acceptance_model import _AcceptanceModel
from .cost_model import _CostModel, batch_tokens, batch_width
# the state and the priors are read through this module too (the loop, tests, benchmarks)
from .window_state import (AGE_GROUPS, AUTO_MAX_WINDOW, DEPTH_EDGES, _STATES, _Counts, _Learned,  # noqa: F401
                           _shared_state, depth_bucket, prior_counts, prior_times, prior_wide_margin)

__all__ = ["AUTO_MAX_WINDOW", "batch_tokens", "batch_width"]


class _AutoWindow(_AcceptanceModel, _CostModel):
    """Chooses each iteration's width from measured times and the acceptance seen so far (:mod:`csdgen.engine`).

    The acceptance model (**Tokens**, **Calibration**, **Ramp**): :class:`~csdgen.engine.acceptance_model._AcceptanceModel`;
    the cost model (**Time**): :class:`~csdgen.engine.cost_model._CostModel`.

    The width maximising ``E(W) / t_A(W)`` wins, except that the better of width 1 and the widest
    window is kept while within :attr:`HOME_MARGIN` of it, and then the width held while within
    :attr:`SWITCH_MARGIN` of it (with a wide margin, :attr:`wide_margin` > 0 from the model's prior,
    outside a served batch: the widest width predicted within it of the best, :meth:`_widest_tie`); every :attr:`EXPLORE_EVERY` iterations (every
    :attr:`EXPLORE_EVERY_EARLY` while few drafts are counted; the interval doubles, up to
    :attr:`EXPLORE_EVERY_MAX`, after each turn that left the held width where it was, and falls
    back when the held width moves) a neighbouring width (x1.5 or
    /1.5, in turn, a narrower one only every :attr:`DOWN_EVERY`-th time; with buckets the next
    bucket) is tried when predicted within :attr:`EXPLORE_WITHIN` of the best, so that the times
    stay measured around the choice, and at every :attr:`ONE_EVERY`-th other turn down width 1
    for one iteration whatever its prediction (the drafts past its end wait for the next wide
    forward); a wider one for about ``width / tokens per forward`` iterations (at least
    :attr:`EXPLORE_RUN`, at most :attr:`EXPLORE_RUN_MAX`: its new slots start as fresh drafts,
    and a short trial under-measures it) where it costs at most :attr:`LONG_TRIAL_COST` times
    the width held, else :attr:`EXPLORE_RUN`. A batch size borrows the widths it has not measured
    from the nearest larger batch size measured at more, scaled (:meth:`_times`); a time above
    :attr:`SPIKE` times the estimate is taken as that (the machine's pauses are not the width's cost).
    ``log`` collects, per chosen width, the predicted and the measured tokens per image and
    seconds per iteration (:attr:`GenerationResult.auto_log`).

    Several images decoding together end with the slowest: where ``rows > 1`` the drafts E(W)
    counts (``E(W) - 1``) are scaled by ``1 - LAG_WEIGHT * (1 - r)`` (:attr:`LAG_WEIGHT`), ``r`` the
    laggard's accepted drafts per forward over the batch's mean, each plus :attr:`LAG_PRIOR` drafts
    at the ratio the last batch of the same size ended with (``lag``, :meth:`laggard_ratio`, from
    the committed lengths the loop already has on the host), so a width that raises the mean while
    the laggard keeps its pace is not chosen (SJD at batch 16 held width 8 on a mean-rate tie with
    width 1 and took 140 forwards where AR takes 256 and the mean image 113: 9.25 s against AR's 8.03).

    A served batch (:class:`csdgen.engine.continuous.ContinuousBatch`: images join and leave between
    iterations, so no batch ends with its slowest image and there is no laggard discount) is priced
    for the batch it runs (:meth:`choose`'s ``remaining``): its tokens per forward at W are the sum over
    its rows of E(min(W, r)), ``r`` a row's positions left (:func:`batch_tokens`; its rows are at
    different places of their images), and its seconds those of its batch bucket
    (:attr:`csdgen.models._static.StaticSession.batch_slots`: the power-of-two bucket of its images),
    one time table per bucket: images joining and leaving within one bucket leave the forward's cost
    where it was (compiled) or within the bucket's range (uncompiled, the forward runs the images
    alone), and every iteration of the bucket measures it. A bucket met with fewer than two
    widths measured gets its own warm-up (:attr:`WARM_PLAN`), not only the first one. Where the
    forward's time grows with batch x width (a full batch on a CPU) the choice is then width 1, and
    wider as the batch thins. Its predicted drafts are calibrated width by width, each by its own settled
    iterations (:meth:`served_calibration`), and its trials of a wider width last until their drafts
    settle and are then measured (:attr:`SERVED_MEASURE`), the least measured width predicted near the
    best first (the one calibration of the width held, measured on trials that ended while their drafts
    were fresh, held a batch of 4 images at width 1 where width 8 commits 1.19x its tokens per second).
    Admissions are not priced: a joining image costs one prefill whatever
    the width (on the built-in model, 2-core CPU under load, one thread: 21-33 ms for one image
    joining a running static batch of 15, whose iterations took 25-45 ms), a cost per image, so per
    token the same at every width, which moves no choice.

    A batch's near ties are not given to width 1: a margin of 10 % for width 1 where ``rows > 1``
    (tried in 1aaa363) made the README's first command (CSD, 8 images in one batch, two threads)
    run width 1 for most iterations, at 1.06-1.29x step compression and 5.3-6.2 s against
    5.0-5.6 s without it and 3.9-4.5 s at window 16 (benchmarks/results/builtin_1911_classes.md, issue 16 item 6).

    Where the image end cuts the held width, the window takes the whole rest of the image (its
    drafts were refined by the wider forwards before; E(W)'s steady-state ages would call them fresh).

    Buckets (the static engine, :mod:`csdgen.models._static`): a window of W slots costs what its
    bucket (the smallest of ``buckets`` >= W) costs, so times are kept per bucket and ``t_A(W)``
    is a step function; among the widths of one bucket the widest (most tokens) wins unless the
    image end caps it.
    """
    EXPLORE_EVERY = 16  # try a neighbouring width this often, when it is predicted close to the best
    #: ... doubled after each turn that left the held width where it was, up to this: at batch 1
    #: (SJD, built-in model, 10 images) turns every 16 iterations cost 3 % against the same
    #: chooser exploring never (1.574 against 1.529 s per image), while its width stayed at 16
    EXPLORE_EVERY_MAX = 64
    EXPLORE_EVERY_EARLY = 4  # ... and this often while fewer than THIN_COUNTS drafts have been counted
    THIN_COUNTS = 256.0
    EXPLORE_WITHIN = 0.9
    #: widths of the warm-up, when this batch size has fewer than two times: one iteration each,
    #: narrow to wide, up to the widest (capped at :attr:`max_width`). A batch where wide windows
    #: are slow (16 images: window 32 costs 9-13 width-1 iterations on the built-in model) pays
    #: one 32-wide iteration, not three; and the widest width is measured, not extrapolated (at
    #: batch 1 the slope from 4 to 16 put window 32 20 % dearer than it is, so it was never tried);
    #: it ends early where widening stopped paying (:meth:`_warm_stops`)
    WARM_PLAN = (1, 4, 16, 32)
    EXPLORE_RUN = 3  # fewest iterations a wider neighbour is kept when explored (its new slots start fresh)
    #: most iterations a wider neighbour is kept: about ``width / tokens per forward`` iterations
    #: until its last slots hold drafts refined as often as in a steady run (SJD on the built-in
    #: model at batch 1: three 32-wide iterations after width 16 committed 3.6 tokens per forward,
    #: a steady window 32 commits 4.6)
    EXPLORE_RUN_MAX = 8
    #: ... and only when its iteration costs at most this many of the width held (at batch 16,
    #: 8-iteration trials of width 16 cost 4 width-1 iterations each and lost 13 % to AR)
    LONG_TRIAL_COST = 1.5
    FORCE_EVERY = 4  # from width 1 with enough counts, the next width up is forced every this many explorations
    #: a narrower neighbour is explored only every this many explorations down, and only when
    #: predicted within EXPLORE_WITHIN (trying one at every turn down measured 18-24 % behind
    #: window 32 at batch 1: the acceptance model over-predicts narrow widths right after a wide
    #: run, whose drafts they inherit, so a trial of width 8 tied with 16 and stuck there)
    DOWN_EVERY = 4
    #: ... and at every this many-th other turn down, width 1 for one iteration, whatever its
    #: predicted rate: its time is what a wider width must beat (at batch 16 one slow width-1
    #: iteration left its time 40 % high, and auto ran width 4, 20 % behind AR, never measuring
    #: width 1 again); one width-1 iteration in 64 costs under 1 % at batch 1
    ONE_EVERY = 2
    #: the width held is kept while its predicted rate is within this fraction of the best one
    #: (predictions a few percent apart are noise, and a wide window's last slots need a few
    #: forwards to hold refined drafts again)
    SWITCH_MARGIN = 0.05
    #: the better (by predicted rate) of width 1 and the widest window the image allows, the fixed
    #: choices a user would otherwise make, is kept while its predicted rate is within this fraction
    #: of the best: a width between them must be predicted this much faster. The acceptance model's
    #: error per width is of this order (SJD on the built-in model, batch 1, 8 images: from window-16
    #: counts it predicted window 16 +7 % and 32 -3 % against the measured tokens per forward, from
    #: window-32 counts +13 % and +4 %), so a predicted near-tie cannot tell the widths apart, and
    #: taking the fixed choice there costs what that choice costs (issue 16 item 6 compares auto with them)
    HOME_MARGIN = 0.05
    #: the width held is kept while within the wide margin (:attr:`wide_margin`, :meth:`_widest_tie`) and
    #: at least the widest width within it over this (a switch up refills the new slots with fresh drafts)
    HOLD_SPAN = 1.5
    #: weight of the laggard's discount (:meth:`choose`'s ``lag``): 1 prices a batch as if it ran at
    #: its slowest image's pace to the end; 0 at its mean (at batch 16 on the built-in model SJD held
    #: width 8, predicted 2.30 tokens per image and forward, measured 2.27 on the mean, while its
    #: slowest image took 140 forwards against the mean's 113: the batch took 9.25 s against AR's 8.03).
    #: Half: the batch shrinks, and gets cheaper per forward, once its leaders finish, and a laggard
    #: behind in a hard region catches up in flat ones; at 1 the pair of a batch of 2 priced every
    #: wide window below width 1 once one image had accepted half the other's drafts (ratio 0.48),
    #: width 1 then froze the ratio (no draft is tested there) and passed it on as the next batch's
    #: prior: CSD at batch 2 ran width 1 for 2102 of its iterations, 8.4 % behind window 32
    LAG_WEIGHT = 0.5
    LAG_PRIOR = 16.0  # drafts added to the laggard's and the mean's count (:meth:`laggard_ratio`)
    #: a served batch calibrates each width on its own (:meth:`served_calibration`): the decay, per
    #: counted iteration of that width, of its sums of measured and predicted drafts (a memory of about
    #: 50 iterations: images come and go, so the batch's acceptance moves with them)
    SERVED_DECAY = 0.98
    #: ... the drafts at the one factor of the width held (:meth:`calibration`) each width's sums start from
    SERVED_PRIOR = 4.0
    #: ... the range a width's factor is kept in: wider than :attr:`CALIBRATION_RANGE`, because short trials
    #: from width 1 (their slots start fresh, every draft twice refined at most) pull the age counts down:
    #: on the built-in model at 4 images the counts predicted 2.17 tokens per forward at width 16, where a
    #: steady width 16 commits 3.40 (benchmarks/results/served_widths.md)
    SERVED_RANGE = (0.4, 3.0)
    #: ... an iteration of width W counts once W has run ``ceil(W / E(W))`` iterations in a row (every slot
    #: then holds a draft of the run) plus this many (its last slots' drafts refined twice)
    SERVED_SETTLE = 2
    #: ... and a served batch's trial of a wider width runs its settling plus this many counted iterations
    #: (at most :attr:`SERVED_RUN_MAX`), whatever it costs: a trial that ends before its drafts settle
    #: measures the fresh drafts of its first forwards, never the width (at 4 images the 3-8-iteration
    #: trials of width 8 committed 1.34 tokens per forward where steady width 8 commits 2.37, and the batch
    #: held width 1 for 1180 of 1200 iterations at 0.84x width 8's tokens per second)
    SERVED_MEASURE = 4
    SERVED_RUN_MAX = 16
    #: ... where an iteration of it costs at most this many of the width held; a dearer one gets a trial of
    #: :attr:`EXPLORE_RUN` iterations, which measures its time only (16 slots on the built-in model, 2-core
    #: CPU: three 11-iteration trials of width 16, 4x a width-1 iteration each, cost about 4 % of a 50-second load)
    SERVED_TRIAL_COST = 2.5
    #: ... and counts only where at most this share of its rows are within two windows of their image's
    #: start (a row's first forwards test fresh drafts: a batch of new images is no width's steady state)
    SERVED_YOUNG = 0.25

    def __init__(self, max_width: int, learned: _Learned | None = None, wide_margin: float = 0.0):
        self.max_width = max_width
        #: outside a served batch, the share of predicted speed traded for tokens per forward (step
        #: compression): the widest width predicted within it of the best rate is chosen (:meth:`_widest_tie`);
        #: 0 (default): the best rate, with the home and switch margins. A model sets it with its prior
        #: (:func:`prior_wide_margin`)
        self.wide_margin = wide_margin
        self.learned = learned if learned is not None else _Learned()
        self.plan: list[int] = []
        self.count = 0
        self.log: dict[int, dict[str, float]] = {}
        self._pending: tuple[int, float, float] | None = None
        self._rows: int | None = None
        self.buckets: tuple[int, ...] | None = None
        self._held: int | None = None  # the width last chosen as the best (SWITCH_MARGIN)
        self._warm_left = 0  # warm-up iterations still planned
        self._tokens_at = (-1, 0)  # (counts version, iteration) it was computed at
        self._warmed: list[int] = []  # the buckets the warm-up measured, in order (:meth:`_warm_stops`)
        self._warmed_rows: frozenset[int] = frozenset()  # the batch sizes (slots) a warm-up began at
        self._left: np.ndarray | None = None  # a served batch: each row's positions left at the last choose
        #: a served batch: width -> [measured, predicted] decayed drafts per row and forward (served_calibration)
        self._served: dict[int, list[float]] = {}
        self._image_len = 0  # a served batch: the most positions a row was seen with left (its image's length)
        self._remeasure: int | None = None  # a bucket measured again: its smaller time is kept
        #: (rows, bucket) whose held iterations last read the pace, and how many in a row (:attr:`SWITCH_WEIGHT`)
        self._pace_reader: tuple[int, int] | None = None
        self._pace_reads = 0
        self._last_turn = 0  # the iteration of the last exploration turn
        self._turns = 0  # exploration turns so far (odd: up, even: down)
        self._held_at_turn: int | None = None  # the width held at the last turn (EXPLORE_EVERY_MAX)
        self._batch: int | None = None  # images at the first laggard_ratio call (the batch's size)
        self._lag_full: float | None = None  # the last laggard ratio while all of them were decoding
        # (rows, ratio) of the last laggard_ratio call, kept by observe through a width-1 iteration
        self._lag_pending: tuple[int, float] | None = None
        self._lag_kept: tuple[int, float] | None = None
        self._run_width: int | None = None  # the width of the last iterations, and how many in a row
        self._run = 0
        self._raw: np.ndarray | None = None  # E(W) before calibration, cached (:meth:`_expected`)
        self._ramp: list[np.ndarray] = []  # ramp_tokens' first forward and the first two's gap, for the key _ramp_at
        self._ramp_at: tuple | None = None
        self._cost_at: tuple | None = None  # (key, cost) of the last cost() (:meth:`cost`)
        self._grid_arrays: tuple | None = None  # E(W)'s index arrays (:meth:`_grid`; max_width is fixed)
        self._one_held: tuple | None = None  # what lets choose keep width 1 without its evaluation (set at its end)

    def bucket(self, width: int) -> int:
        """The width a window of ``width`` slots costs (itself without buckets)."""
        if self.buckets is None:
            return width
        return next((b for b in self.buckets if b >= width), width)

    # -- choosing and learning -----------------------------------------------------------------

    def choose(self, limit: int, rows: int = 1, lag: float = 1.0, remaining=None) -> int:
        """The next width (``<= limit``, the widest window any image can still use) for ``rows`` images.

        ``lag`` (0 .. 1): drafts accepted per forward so far by the image furthest behind, over the
        batch's mean (:meth:`laggard_ratio`); a batch ends with its slowest image, so where
        ``rows > 1`` the drafts E(W) counts are discounted by it (:attr:`LAG_WEIGHT`).

        ``remaining`` (a served batch, :class:`csdgen.engine.continuous.ContinuousBatch`): ``[A]``
        integers >= 1, the positions each row still has to commit. The batch is then priced row by
        row: its tokens per forward at W are :func:`batch_tokens` (each row capped by its own image
        end; averaged per row here, which moves no choice), over the seconds of an iteration of
        ``rows`` at W, ``rows`` then being the batch slots the forward runs (the static session's
        batch bucket), which is what its time depends on."""
        self.count += 1
        if remaining is not None:  # a served batch's rows: positions left (observe's calibration)
            self._left = np.maximum(np.asarray(remaining, dtype=np.int64).reshape(-1), 1)
            self._left = self._left if self._left.size else None
            if self._left is not None:
                self._image_len = max(self._image_len, int(self._left.max()))
        pace = self.pace(rows)  # the log's predicted seconds are at the present pace
        hold = self._one_held
        if (hold is not None and limit >= self.max_width and hold[0] == (rows, lag, self.learned.counts.version)
                and self.count - self._last_turn < hold[1]):
            # width 1 again without the evaluation below, which would choose it again. Since width 1 was
            # chosen there, no input of it moved but the image end: a width-1 forward reaches no draft
            # (the counts, their version, E(W) and the calibration stay); the laggard ratio is kept through
            # it; the times stay (observe drops the hold when one changes: the width held moves only the
            # pace, which scales every width's seconds alike); no trial is planned (a turn that plans one
            # chooses a wider width), and a turn takes the evaluation. The image end moves the wider widths'
            # ramps; while it is max_width or more positions away, width 1 still beats them (_hold_one).
            # At batch 16 on the built-in model the evaluation cost 86 µs of a 17 ms width-1 iteration
            # (numpy's calls, cold after a forward: the ramp 37, the cost 10)
            self._pending = (1, 1.0, hold[2] * pace)
            return 1
        image_end, limit = limit, max(1, min(limit, self.max_width))
        self._rows = rows
        # a served batch warms up at every slot count it meets unmeasured: it begins with a request's
        # few images, and a full batch's widths priced by the times of 1 slot scaled (the nearest
        # measured size, _times) look nearly free, where on a CPU they cost several narrow iterations
        first = self.count == 1 or (remaining is not None and rows not in self._warmed_rows)
        if not self.plan and first and len(self.learned.times.get(rows, {})) < 2:
            # times for this batch size at a few widths (the cost is not linear in W: flat while a
            # forward is launch-bound, then steep), narrow to wide (WARM_PLAN)
            self.plan = sorted({min(w, self.max_width) for w in self.WARM_PLAN + (self.max_width,)})
            self._warm_left = len(self.plan)
            self._warmed, self._warmed_rows = [], self._warmed_rows | {rows}
        if self._warm_left and self._warm_stops(rows):
            self.plan, self._warm_left = [], 0
        if self.plan:
            width = min(self.plan.pop(0), limit)
            if self._warm_left:  # warm-up widths are not logged (nothing was predicted for them)
                self._warm_left -= 1
                self._warmed.append(self.bucket(width))
                self._pending = None
            else:  # the rest of a wider neighbour's trial run is logged like any choice
                self._pending = (width, float(self._expected()[width - 1]), float(self.cost(rows)[width - 1]) * pace)
            return width
        # a wider width's ramp is averaged over the forwards it has to the image end, not to max_width
        # positions (until 2026-12-04 it was: a switch from width 1 to 16 far from the end was priced
        # as if nine forwards were left, two of them with fresh drafts)
        tokens, seconds = self._expected(image_end)[:limit], self.cost(rows)[:limit] * pace  # seconds now
        tokens = self._lagged(tokens, rows, lag)
        if self._left is not None and remaining is not None:  # a served batch: each row capped by its own image end
            left = np.minimum(self._left, limit)
            tokens = batch_tokens(tokens, left) / left.size
        if self._held is not None and limit < self._held:
            # the image end cuts the held window: take the whole rest. Its drafts were refined by the
            # wider forwards before (the steady-state ages of E(W) would call them fresh: width 1
            # won there, and SJD at batch 1 ended its images with 2-4 width-1 iterations where
            # window 16 ended in one or two forwards), and a narrower forward costs no more
            self._pending = (limit, float(tokens[limit - 1]), float(seconds[limit - 1]))
            return limit
        rate = tokens / seconds
        best = int(rate.argmax()) + 1
        held = self._held
        wide = remaining is None and self.wide_margin > 0  # the wide margin's rule (_widest_tie)
        if wide:
            best = self._widest_tie(rate, held)
        else:
            home = limit if rate[limit - 1] >= rate[0] else 1
            if rate[home - 1] >= (1 - self.HOME_MARGIN) * rate[best - 1]:
                best = home
            elif held is not None and held <= limit and rate[held - 1] >= (1 - self.SWITCH_MARGIN) * rate[best - 1]:
                best = held
        self._held = choice = best
        thin = self.learned.counts.reached.sum() < self.THIN_COUNTS
        every = self.EXPLORE_EVERY_EARLY if thin else self.learned.every.get(rows, self.EXPLORE_EVERY)
        is_turn = self.count - self._last_turn >= every
        if is_turn:
            self._last_turn, self._turns = self.count, self._turns + 1
            if not thin and self._held_at_turn is not None:  # back off while the turns find nothing better
                steady = self._held_at_turn == best
                self.learned.every[rows] = min(2 * every, self.EXPLORE_EVERY_MAX) if steady else self.EXPLORE_EVERY
            self._held_at_turn = best
        turn = self._turns
        down_turn = turn // 2
        if is_turn and (turn % 2 or down_turn % self.DOWN_EVERY == 0
                        or down_turn % self.ONE_EVERY == self.ONE_EVERY - 1):
            up = turn % 2
            width_one = not up and down_turn % self.DOWN_EVERY != 0
            other = 1 if width_one else self._neighbour(best, limit, up)
            if self._served_batch and up:  # the least measured wider width predicted near the best
                near = [w for w in self._tops(best, limit) if rate[w - 1] >= self.EXPLORE_WITHIN * rate[best - 1]]
                if near:
                    other = min(near, key=lambda w: (self._served.get(w, [0.0, 0.0, 0.0])[2], w))
            # from width 1 the next width up is tried even when predicted slower: a width-1 forward
            # reaches no draft, so the acceptance estimates would never change again (a pessimistic
            # start would stick); always while the refined drafts at depth 0 are thinly counted,
            # then every FORCE_EVERY explorations (each costs EXPLORE_RUN slower iterations)
            forced = best == 1 and (self.learned.counts.reached[0, 1:].sum() < 4 * self.MIN_REACHED
                                    or turn % (2 * self.FORCE_EVERY) == 1)
            if other != best and (forced or width_one or rate[other - 1] >= self.EXPLORE_WITHIN * rate[best - 1]):
                choice = other
                if other > best:
                    # a long trial only where the wider width costs little more (batch 1: 32 is 1.3x
                    # 16); where it costs several narrow iterations (batch 16: 16 is 4x 1), three
                    run = self.EXPLORE_RUN
                    if self._served_batch and seconds[other - 1] <= self.SERVED_TRIAL_COST * seconds[best - 1]:
                        # settled, then measured (SERVED_MEASURE)
                        run = int(min(self._settle(other, tokens[other - 1]) + self.SERVED_MEASURE, self.SERVED_RUN_MAX))
                    elif seconds[other - 1] <= self.LONG_TRIAL_COST * seconds[best - 1]:
                        run = int(np.clip(np.ceil(other / tokens[best - 1]), self.EXPLORE_RUN, self.EXPLORE_RUN_MAX))
                    self.plan = [other] * (run - 1)
        self._pending = (choice, float(tokens[choice - 1]), float(seconds[choice - 1]))
        # the next turn's interval: a turn above may have moved learned.every (the back-off)
        every = self.EXPLORE_EVERY_EARLY if thin else self.learned.every.get(rows, self.EXPLORE_EVERY)
        self._one_held = self._hold_one(choice, rows, lag, every, tokens, seconds, pace, wide)
        return choice

    def _widest_tie(self, rate: np.ndarray, held: int | None) -> int:
        """The width chosen from ``rate`` (``[limit]`` float64 predicted tokens per second at W = 1 .. limit)
        outside a served batch where :attr:`wide_margin` > 0: the widest width predicted within that share
        of the best rate,
        or the width held where it is within that margin too and at least ``1 / HOLD_SPAN`` of that widest
        one (a switch up refills the new slots with fresh drafts; predictions a few percent apart are noise).

        The acceptance model's error per width is about 10 % (:attr:`HOME_MARGIN`) and a CPU's time per
        iteration moves by as much from one run to the next, so widths inside a margin of that order are
        as fast as far as the chooser can tell, and of those the widest commits the most tokens per
        forward: the step compression a user reads. Width 1 is chosen only where every wider width is
        predicted slower by more than the margin. On the built-in model (CSD, 8 images in one batch,
        2-core CPU) the best-rate rule held width 4-8 at 2.1-2.4x step compression where window 16 took
        3.36x in the same wall time within the machine's noise."""
        near = np.flatnonzero(rate >= (1.0 - self.wide_margin) * rate.max()) + 1
        widest = int(near[-1])
        if held is not None and held in near and held * self.HOLD_SPAN >= widest:
            return held
        return widest

    def _lagged(self, tokens: np.ndarray, rows: int, lag: float) -> np.ndarray:
        """``tokens`` (``[W]`` float64 tokens per image and forward) with their drafts (``tokens - 1``)
        discounted by the laggard ratio ``lag`` where ``rows > 1``: ``1 - LAG_WEIGHT * (1 - lag)``
        (:meth:`choose`, :attr:`LAG_WEIGHT`); unchanged for one image or ``lag >= 1``."""
        if rows <= 1 or lag >= 1.0:
            return tokens
        return 1.0 + (tokens - 1.0) * (1.0 - self.LAG_WEIGHT * (1.0 - max(lag, 0.0)))

    def _hold_one(self, choice, rows, lag, every, tokens, seconds, pace, wide: bool = False) -> tuple | None:
        """What lets the next calls of :meth:`choose` return width 1 without its evaluation (the hold at its
        top), or None: ``((rows, lag, counts version), turn interval, width 1's seconds at the kept pace)``.

        Only where width 1 was just chosen, after a width-1 forward, with E(W) of the present counts (one
        refreshed later, :attr:`REFRESH_EVERY`, could choose otherwise), and where choose's home rule keeps
        it at every image end the hold reaches (``max_width`` positions or more): outside a served batch
        with a wide margin (``wide`` True, :meth:`_widest_tie`) every wider width's rate below width 1's by
        more than :attr:`wide_margin`; else the widest window's rate below width 1's and every width's
        within :attr:`HOME_MARGIN` of it; each wider width taken at the
        larger of its tokens now and at ``max_width`` positions from the end. A wider width's ramp
        (:meth:`ramp_tokens`) is its steady tokens plus the first two forwards' gap over the forwards
        left, so between two image ends its tokens lie between theirs."""
        version = self.learned.counts.version
        if choice != 1 or (self._run_width or 1) != 1 or self._tokens_at[0] != version or len(tokens) < self.max_width:
            return None
        near = self._lagged(self._expected(self.max_width)[: len(tokens)], rows, lag)
        rate = np.maximum(tokens, near) / seconds
        one = tokens[0] / seconds[0]
        if wide:  # _widest_tie: width 1 only while every wider width is below the margin
            if (rate[1:] >= (1 - self.wide_margin) * one).any():
                return None
        elif rate[-1] >= one or one < (1 - self.HOME_MARGIN) * rate.max():
            return None
        return (rows, lag, version), every, float(seconds[0]) / pace

    def laggard_ratio(self, committed: torch.Tensor, forwards: int) -> float:
        """Drafts accepted per forward by the image furthest behind over the mean of the batch.

        ``committed``: ``[A]`` int64 CPU, tokens committed per image still decoding; ``forwards``:
        the forwards each of them has had (prefill included, so each committed at least that many).
        Returns a float in 0 .. 1: both counts plus :attr:`LAG_PRIOR` drafts at the prior ratio
        (the one the last batch of this size ended with, :meth:`finish`; 1 for the first), so 1
        for the first batch where no draft has been accepted yet, and 1 where ``A < 2``. The first
        call fixes the batch's size; calls while all its images decode are remembered for :meth:`finish`."""
        rows = committed.numel()
        if self._batch is None:
            self._batch = rows
        if rows < 2:
            return 1.0
        kept, self._lag_kept = self._lag_kept, None
        if kept is not None and kept[0] == rows:
            # the iteration since the last call was 1 wide: every image committed one token in one
            # forward, so no image's accepted drafts moved and neither did the ratio (taken at every
            # width-1 iteration, the lists below cost 60 µs of a 17 ms iteration at batch 16: cold caches)
            self._lag_pending = kept
            return kept[1]
        prior = self.learned.lag.get(self._batch, 1.0) * self.LAG_PRIOR
        # Python's own lists: 16 numbers, where numpy's calls cost tens of µs after a forward's cold caches
        accepted = [max(c - forwards, 0) for c in committed.tolist()]
        # both counts get LAG_PRIOR drafts: a ratio of a few drafts is noise, and a ratio of 0 (one
        # image has accepted nothing yet) made width 1 win, after which no count moves (at batch 2
        # SJD then ran width 1 for 40 % of its iterations, 8 rounds: +2.6 % behind window 32, CSD +7.4 %);
        # at the ratio the last batch of this size ended with: a batch's first iterations are priced by
        # what such batches did, not as if its images kept pace (at batch 16, CSD's first 12 iterations
        # of a batch ran 8 wide at ratio 0.77-0.88 and cost 4 % of the batch; the last batch ended at 0.63)
        ratio = (min(accepted) + prior) / (sum(accepted) / rows + self.LAG_PRIOR)
        if rows == self._batch:
            self._lag_full = ratio
        self._lag_pending = (rows, ratio)
        return ratio

    def finish(self) -> None:
        """The batch is done: the laggard ratio it had while all its images decoded becomes the prior
        of the next batch of its size (:attr:`_Learned.lag`; nothing where no ratio was taken)."""
        if self._lag_full is not None and self._batch is not None:
            self.learned.lag[self._batch] = self._lag_full

    def _warm_stops(self, rows: int) -> bool:
        """Whether the warm-up ends before its next (wider) width: the last width it measured
        commits tokens at under :attr:`EXPLORE_WITHIN` of the best rate among the narrower ones
        it measured (predicted tokens over measured seconds), measured twice (a shape's first
        forward can be several times slower than the next; the second measurement is planned
        here). Where widening stopped paying, wider is dearer still: at batch 16 on the built-in
        model one 16-wide and one 32-wide iteration cost 660 ms, 7 % of an AR batch, for about
        five tokens per image."""
        own = self.learned.times.get(rows, {})
        measured = [w for w in dict.fromkeys(self._warmed) if w in own]
        if len(measured) < 2:
            return False
        tokens = self._expected()
        rates = {w: tokens[w - 1] / own[w] for w in measured}
        last = measured[-1]
        if rates[last] >= self.EXPLORE_WITHIN * max(rates.values()):
            return False
        if self._warmed.count(last) < 2:  # once more before giving up on it (the smaller time is kept)
            self.plan.insert(0, last)
            self._warm_left += 1
            self._remeasure = last
            return False
        return True

    def _neighbour(self, width: int, limit: int, up: bool) -> int:
        """The width explored next to ``width``: x1.5 or /1.5, or with buckets the next bucket up or
        down (a width inside a bucket costs what the bucket costs, so the bucket's top is the one to try)."""
        if self.buckets is None:
            return min(max(width + 1, round(width * 1.5)), limit) if up else max(1, min(width - 1, round(width / 1.5)))
        if up:
            return min(next((b for b in self.buckets if b > width), limit), limit)
        return max((b for b in self.buckets if b < width), default=1)

    def observe(self, width: int, seconds: float, reached: list[float] | None, rejected: list[float] | None,
                tokens: float | None = None) -> None:
        """Learn from the iteration just done: its width, seconds (sync to sync), draft counts
        (flattened ``[buckets, AGE_GROUPS]``; None: no draft was reached, as at width 1) and the
        tokens it committed per image (for :attr:`log`)."""
        learned, counts = self.learned, self.learned.counts
        if reached is not None and any(reached):
            shape = counts.reached.shape
            new_reached = np.asarray(reached, dtype=np.float64).reshape(shape)
            decay = np.where(new_reached > 0, self.DECAY, 1.0)  # a cell this forward did not reach keeps what it knew
            counts.reached = decay * counts.reached + new_reached
            counts.rejected = decay * counts.rejected + np.asarray(rejected, dtype=np.float64).reshape(shape)
            counts.version += 1
        times = learned.times.setdefault(self._rows or 1, {})
        key = self.bucket(width)
        old = times.get(key)
        pace = self.pace(self._rows or 1)
        if self._remeasure == key and old is not None:
            times[key] = min(old, seconds / pace)
            self._remeasure = None
            self._one_held = None
        elif old is not None and self._held is not None and key == self.bucket(self._held):
            # the width held: its time stays, the machine's pace moves (PACE_WEIGHT)
            rows = self._rows or 1
            reading = min(seconds / old, self.SPIKE * pace)
            reader = self._pace_reader
            if reader == (rows, key):
                self._pace_reads += 1
            else:
                if (reader is not None and reader[0] == rows and reader[1] in times
                        and self._pace_reads >= self.SWITCH_SETTLED):  # a switch: SWITCH_WEIGHT
                    jump = min(max(pace / reading, 1 / self.SPIKE), self.SPIKE)
                    times[reader[1]] *= jump ** self.SWITCH_WEIGHT
                    self._one_held = None
                self._pace_reader, self._pace_reads = (rows, key), 1
            learned.pace[rows] = learned.pace[0] = (1 - self.PACE_WEIGHT) * pace + self.PACE_WEIGHT * reading
        else:
            self._one_held = None  # a time moved: choose evaluates again
            kept = seconds / pace  # at the pace the kept times are at
            times[key] = kept if old is None else (1 - self.TIME_WEIGHT) * old + self.TIME_WEIGHT * min(kept, self.SPIKE * old)
        self._lag_kept, self._lag_pending = (self._lag_pending if width == 1 else None), None
        self._run = self._run + 1 if width == self._run_width else 1
        self._run_width = width
        if tokens is not None and width > 1 and self._served_batch and self._raw is not None:
            # a served batch: every settled iteration of any width calibrates that width (served_calibration)
            young = float((self._left > self._image_len - 2 * width).mean())
            if young <= self.SERVED_YOUNG and self._run >= self._settle(width, self._expected()[width - 1]):
                raw = float(batch_tokens(self._raw[:width], np.minimum(self._left, width))[-1]) / self._left.size
                prior = self.SERVED_PRIOR
                sums = self._served.setdefault(width, [prior * self.calibration(), prior, 0.0])
                sums[0] = self.SERVED_DECAY * sums[0] + max(tokens - 1.0, 0.0)
                sums[1] = self.SERVED_DECAY * sums[1] + max(raw - 1.0, 0.0)
                sums[2] += 1.0  # iterations counted (the trials' order: the least measured first)
                self._one_held = None
        elif (tokens is not None and width > 1 and width == self._held and self._raw is not None
                and self._run >= np.ceil(width / self._expected()[width - 1])):
            # a steady iteration of the width held: the calibration's sums (calibration)
            counts.measured_drafts = self.CALIBRATION_DECAY * counts.measured_drafts + max(tokens - 1.0, 0.0)
            # (a served batch: predicted as measured, each row capped by its own image end)
            raw = (float(self._raw[width - 1]) if self._left is None
                   else float(batch_tokens(self._raw[:width], np.minimum(self._left, width))[-1]) / self._left.size)
            counts.predicted_drafts = self.CALIBRATION_DECAY * counts.predicted_drafts + raw - 1.0
        if self._pending is not None and self._pending[0] == width and tokens is not None:
            entry = self.log.setdefault(width, {"iterations": 0, "predicted_tokens": 0.0, "measured_tokens": 0.0,
                                                "predicted_seconds": 0.0, "measured_seconds": 0.0})
            entry["iterations"] += 1
            entry["predicted_tokens"] += self._pending[1]
            entry["measured_tokens"] += tokens
            entry["predicted_seconds"] += self._pending[2]
            entry["measured_seconds"] += seconds
        self._pending = None

    @property
    def _served_batch(self) -> bool:
        """Whether this chooser prices a served batch: :meth:`choose` was given its rows' positions left."""
        return self._left is not None

    def _factors(self):
        """A served batch's drafts are scaled width by width (:meth:`served_calibration`), any other
        batch's by the one :meth:`calibration`."""
        return self.served_calibration() if self._served_batch else self.calibration()

    def _tops(self, width: int, limit: int) -> list[int]:
        """The widths wider than ``width`` (up to ``limit``) a served batch's trial may take: the buckets'
        tops (``buckets``) or, without buckets, the powers of two, and ``limit``."""
        tops = self.buckets if self.buckets is not None else tuple(2 ** k for k in range(1, self.max_width.bit_length() + 1))
        return sorted({min(b, limit) for b in tops if width < b} | ({limit} if limit > width else set()))

    def _settle(self, width: int, tokens: float) -> int:
        """Iterations in a row at ``width`` before one counts for a served batch's calibration: ``ceil(width /
        tokens) + SERVED_SETTLE`` (``tokens``: predicted per row and forward, taken as at least 1)."""
        return int(np.ceil(width / max(float(tokens), 1.0))) + self.SERVED_SETTLE

    def served_calibration(self) -> np.ndarray:
        """``[max_width]`` float64: the factor a served batch's predicted drafts per forward (``E(W) - 1``)
        are multiplied by at each width W = 1 .. max_width, in place of the one :meth:`calibration`.

        A served batch's rows are at every place of their images and its widths change with its size, so
        the acceptance model's error differs by width and is measured where it is: each width's settled
        iterations (:meth:`_settle`; a trial's too) add their measured and predicted drafts per row (each
        row's prediction capped by its own image end, :func:`batch_tokens`) to decayed sums
        (:attr:`SERVED_DECAY`) that start at :attr:`SERVED_PRIOR` drafts at :meth:`calibration`; the factor
        is their ratio within :attr:`SERVED_RANGE`. A width not measured takes the factor of the nearest
        measured ones, interpolated in log2(W) (constant past the ends); with none measured, :meth:`calibration`."""
        if not self._served:
            return np.full(self.max_width, self.calibration())
        low, high = self.SERVED_RANGE
        widths = sorted(self._served)
        factors = [min(max(self._served[w][0] / max(self._served[w][1], 1e-9), low), high) for w in widths]
        return np.interp(np.log2(np.arange(1, self.max_width + 1)), np.log2(widths), factors)

    def summary(self) -> dict[int, dict[str, float]]:
        """Per chosen width: iterations, and the mean predicted / measured tokens per image and seconds
        per iteration (predicted tokens per second = ``rows * predicted_tokens / predicted_seconds``)."""
        out = {}
        for width, entry in sorted(self.log.items()):
            n = entry["iterations"]
            out[width] = {"iterations": n, **{k: v / n for k, v in entry.items() if k != "iterations"}}
        return out
