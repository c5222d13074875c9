"""``window="auto"``: each iteration's width chosen from measured times and from the acceptance
seen so far (:class:`_AutoWindow`; the algorithm in :mod:`csdgen.engine`).

What it learns outlives one ``generate`` call: the times per width are a property of the model,
the machine and the number of images decoding together, and the acceptance a property of the
method and the model, so a later call on the same model (a benchmark's next image, the next
batch of a run) starts from them instead of from a warm-up (:func:`_shared_state`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np
import torch

from ..transfer import to_device

__all__ = ["AUTO_MAX_WINDOW", "batch_tokens", "batch_width"]

#: the widest window ``window="auto"`` considers
AUTO_MAX_WINDOW = 32

#: draft depths (slot in the window = drafts accepted before it in the same forward) pooled into buckets
DEPTH_EDGES = (0, 1, 2, 4, 8, 16, 32)
#: draft age groups: 0 = fresh (initialised for this forward), 1 = refined once, 2 = refined twice or more
AGE_GROUPS = 3


#: device -> :data:`DEPTH_EDGES` (bucket starts after the first) on it, copied there once
_EDGES: dict[torch.device, torch.Tensor] = {}


def depth_bucket(depth: torch.Tensor) -> torch.Tensor:
    """``[...]`` int64 bucket (0 .. len(DEPTH_EDGES) - 1) of int64 draft depths ``[...]`` (the last bucket is open).

    No host sync: the bucket edges are copied to ``depth``'s device once (queued) and kept."""
    edges = _EDGES.get(depth.device)
    if edges is None:
        edges = _EDGES[depth.device] = to_device(torch.tensor(DEPTH_EDGES[1:]), depth.device)
    return torch.bucketize(depth, edges, right=True)


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


@dataclass
class _Counts:
    """Decayed draft counts ``[buckets, AGE_GROUPS]`` float64 by depth bucket and age group."""

    reached: np.ndarray = field(default_factory=lambda: np.zeros((len(DEPTH_EDGES), AGE_GROUPS)))
    rejected: np.ndarray = field(default_factory=lambda: np.zeros((len(DEPTH_EDGES), AGE_GROUPS)))
    #: bumped whenever the counts change (a chooser recomputes E(W) only then: a width-1 forward reaches no draft)
    version: int = 0
    #: decayed sums, over steady iterations of the width held, of the drafts accepted per image and
    #: forward as measured and as the acceptance model predicted them (:meth:`_AutoWindow.calibration`)
    #: (both start at 16 drafts, which decay like any others)
    measured_drafts: float = 16.0
    predicted_drafts: float = 16.0


@dataclass
class _Learned:
    """What ``window="auto"`` keeps between calls (:func:`_shared_state`).

    Attributes:
        times: active images -> width -> seconds per iteration (exponential average); shared by
            every method on the same model, guidance and tree shape.
        counts: the acceptance counts; shared by calls of the same rule, drafting and sampling.
        every: active images -> iterations between exploration turns (:attr:`_AutoWindow.EXPLORE_EVERY`
            doubled after every turn that left the held width where it was, up to
            :attr:`_AutoWindow.EXPLORE_EVERY_MAX`); shared like the counts and the times together.
        lag: batch size -> the laggard ratio the last batch of that size ended with (while all its
            images were decoding), the prior of the next one's (:meth:`_AutoWindow.laggard_ratio`);
            shared like ``every``.
        pace: active images -> the machine's present speed relative to the one that batch size's
            ``times`` are kept at (seconds measured = f * seconds kept; :attr:`_AutoWindow.PACE_WEIGHT`),
            and 0 -> the last reading of any batch size (the start of a batch size not read yet);
            shared like ``times``.
    """

    times: dict[int, dict[int, float]] = field(default_factory=dict)
    counts: _Counts = field(default_factory=_Counts)
    every: dict[int, int] = field(default_factory=dict)
    lag: dict[int, float] = field(default_factory=dict)
    pace: dict[int, float] = field(default_factory=dict)


#: model -> {"times": {key: dict}, "counts": {key: _Counts}, "every": {key: dict}, "lag": {key: dict},
#: "pace": {key: dict}}; an entry goes with its model
_STATES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _shared_state(model, time_key: tuple, count_key: tuple) -> _Learned:
    """The learned state of ``model``: times for ``time_key`` (guidance, tree), acceptance counts for
    ``count_key`` (rule, drafting, sampling, tree); created on first use. A model that cannot be
    weakly referenced gets a fresh state every call."""
    try:
        per_model = _STATES.setdefault(model, {"times": {}, "counts": {}, "every": {}, "lag": {}, "pace": {}})
    except TypeError:
        return _Learned()
    if count_key not in per_model["counts"]:
        per_model["counts"][count_key] = prior_counts(model, f"{count_key[0]}/{count_key[3]}")
    if time_key not in per_model["times"] and time_key[1] is None:  # a tree's forwards cost otherwise
        per_model["times"][time_key] = prior_times(model, guided=bool(time_key[0]))
    return _Learned(per_model["times"].setdefault(time_key, {}), per_model["counts"][count_key],
                    per_model["every"].setdefault((time_key, count_key), {}),
                    per_model["lag"].setdefault((time_key, count_key), {}),
                    per_model["pace"].setdefault(time_key, {}))


def prior_counts(model, method: str) -> _Counts:
    """The acceptance counts a fresh process starts from for ``method`` (``"RULE/REFRESH"``, a rule's
    name and the refresh of its drafts: ``"csd/coupled"``): the model's ``auto_window_prior[method]``
    where it ships one, else none (:class:`_Counts`' empty arrays).

    A prior is ``{"reached": [[...]], "rejected": [[...]]}``, float draft counts ``[len(DEPTH_EDGES),
    AGE_GROUPS]`` (depth bucket x age group) as :class:`_AutoWindow` keeps them, recorded from this
    model's own runs (``benchmarks/builtin_auto_prior.py`` for the built-in model). The counts decay
    like the process's own (:attr:`_AutoWindow.DECAY` per iteration), so within a few dozen
    iterations the process's own measurements outweigh them; without a prior the first forwards
    decide alone, and a fresh process could settle at width 1 before testing a draft.

    Raises:
        ValueError: a prior of another shape (naming the model's attribute and the shape allowed).
    """
    prior = (getattr(model, "auto_window_prior", None) or {}).get(method)
    counts = _Counts()
    if prior is None:
        return counts
    shape = counts.reached.shape
    reached, rejected = (np.asarray(prior[k], dtype=np.float64) for k in ("reached", "rejected"))
    if reached.shape != shape or rejected.shape != shape or (rejected > reached + 1e-9).any() or (rejected < 0).any():
        raise ValueError(f"auto_window_prior[{method!r}]: reached and rejected must be counts of shape {list(shape)} "
                         f"with 0 <= rejected <= reached; got {list(reached.shape)} and {list(rejected.shape)}")
    counts.reached, counts.rejected = reached.copy(), rejected.copy()
    counts.version = 1
    return counts


def prior_times(model, guided: bool) -> dict[int, dict[int, float]]:
    """The seconds per iteration a fresh process starts from: the model's ``auto_window_prior["times"]``
    (``{"guided" | "unguided": {images: {width: seconds}}}``, seconds per iteration of each width at
    each batch size, recorded on the machine that shipped them) where it ships them, else none.

    They set the ratios of the widths' times; their scale is corrected by the process's first
    iterations (:attr:`_Learned.pace`), each width's own iterations move its time as usual, and a
    batch size with two or more widths known skips the warm-up. One warm-up iteration taken while the
    machine is busy elsewhere priced the wide windows several times too dear, and fresh processes ran
    width 1 at a third of window 16's speed.

    Raises:
        ValueError: a time that is not a positive number (naming it).
    """
    shipped = ((getattr(model, "auto_window_prior", None) or {}).get("times") or {}).get(
        "guided" if guided else "unguided") or {}
    out: dict[int, dict[int, float]] = {}
    for rows, by_width in shipped.items():
        for width, seconds in by_width.items():
            if not (isinstance(seconds, (int, float)) and seconds > 0):
                raise ValueError(f"auto_window_prior times[{rows}][{width}] = {seconds!r}: allowed a number of "
                                 f"seconds > 0")
            out.setdefault(int(rows), {})[int(width)] = float(seconds)
    return out


def prior_wide_margin(model) -> float:
    """The model's wide margin (:attr:`_AutoWindow.wide_margin`): ``auto_window_prior["wide_margin"]``, a
    float in ``[0, 0.5]``, where it ships one, else 0 (the best predicted rate wins).

    Raises:
        ValueError: a margin outside ``[0, 0.5]`` or not a number (naming it).
    """
    margin = (getattr(model, "auto_window_prior", None) or {}).get("wide_margin", 0.0)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0.0 <= margin <= 0.5:
        raise ValueError(f"auto_window_prior['wide_margin'] = {margin!r}: allowed a number in [0, 0.5]")
    return float(margin)


class _AutoWindow:
    """Chooses each iteration's width from measured times and the acceptance seen so far (:mod:`csdgen.engine`).

    **Time** ``t_A(W)``: seconds per iteration (forward, verify and bookkeeping, sync to sync)
    with ``A`` images decoding, an exponential average per ``(A, W)``; a width not measured is
    interpolated linearly between measured ones, and beyond the widest with the last slope
    (>= 0); a batch size never measured takes the nearest measured one's times (a larger one first).
    The machine's speed drifts: the width held keeps its time and its iterations read the pace
    instead, and every other width's seconds enter its time divided by the pace (:attr:`PACE_WEIGHT`);
    where the width held changes, a jump of the pace moves the last held width's time (:attr:`SWITCH_WEIGHT`).

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

    The width maximising ``E(W) / t_A(W)`` wins, except that the better of width 1 and the widest
    window is kept while within :attr:`HOME_MARGIN` of it, and then the width held while within
    :attr:`SWITCH_MARGIN` of it; every :attr:`EXPLORE_EVERY` iterations (every
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
    different places of their images), and its seconds those of the batch slots the forward runs
    (the static session's batch bucket, :attr:`csdgen.models._static.StaticSession.batch_slots`), one
    time table per bucket: images joining and leaving within one bucket leave the forward's cost
    where it was, and every iteration of the bucket measures it. A bucket met with fewer than two
    widths measured gets its own warm-up (:attr:`WARM_PLAN`), not only the first one. Where the
    forward's time grows with batch x width (a full batch on a CPU) the choice is then width 1, and
    wider as the batch thins. Admissions are not priced: a joining image costs one prefill whatever
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
    #: window-32 counts, tests/test_issue16_engine.py)
    PRIOR_WEIGHT = 8.0
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
    #: a time measured above this many times the estimate counts as this many (one iteration the
    #: machine took away from the process must not make a width look dear for the rest of the run)
    SPIKE = 1.5
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
    OPTIMISM = 0.9  # pass rate assumed at depths deeper than any seen (an untried wide window gets tried)
    #: per steady iteration of the width held, the decay of the calibration's sums (:meth:`calibration`):
    #: slow, a memory of about 500 iterations (five images at batch 1), because the counts already
    #: follow the image (:attr:`DECAY`); at 0.97 the factor followed it too, swung from 0.5 to 1.2
    #: within one image, and SJD at batch 1 ran width 4 for 54 of an image's 139 forwards
    CALIBRATION_DECAY = 0.998
    CALIBRATION_RANGE = (0.7, 1.3)  # the calibration factor is kept within these
    #: at a switch of the width held (same batch size), the weight of the pace's jump in the last held
    #: width's kept time, where that width read the pace for at least :attr:`SWITCH_SETTLED` iterations
    #: in a row (the pace then is its reading, not the one before). The machine's speed does not jump at
    #: a switch, so a jump is that width's kept time being off, which its own iterations never correct
    #: (they move the pace). At batch 16 on the built-in model window 8's time, taken in a warm-up, stayed
    #: 20 % low (23.1 ms at the kept pace, against 28 that width 1's 12.2 and their measured 38.4 / 16.4
    #: give): batches of 16 began with 8-11 iterations of width 8 at SJD's 1.16 tokens per forward
    SWITCH_WEIGHT = 0.5
    SWITCH_SETTLED = 5
    ITERATIONS = 12  # fixed-point iterations for E(W)
    REFRESH_EVERY = 4  # iterations between recomputations of E(W) while the counts change (it costs ~0.8 ms)

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

    # -- the acceptance model ------------------------------------------------------------------

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
        return 1.0 + (raw - 1.0) * self.calibration()

    # -- the cost model ------------------------------------------------------------------------

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
        if remaining is None and self.wide_margin > 0:
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
                    if seconds[other - 1] <= self.LONG_TRIAL_COST * seconds[best - 1]:
                        run = int(np.clip(np.ceil(other / tokens[best - 1]), self.EXPLORE_RUN, self.EXPLORE_RUN_MAX))
                    self.plan = [other] * (run - 1)
        self._pending = (choice, float(tokens[choice - 1]), float(seconds[choice - 1]))
        # the next turn's interval: a turn above may have moved learned.every (the back-off)
        every = self.EXPLORE_EVERY_EARLY if thin else self.learned.every.get(rows, self.EXPLORE_EVERY)
        self._one_held = self._hold_one(choice, rows, lag, every, tokens, seconds, pace,
                                        remaining is None and self.wide_margin > 0)
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
        if (tokens is not None and width > 1 and width == self._held and self._raw is not None
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

    def summary(self) -> dict[int, dict[str, float]]:
        """Per chosen width: iterations, and the mean predicted / measured tokens per image and seconds
        per iteration (predicted tokens per second = ``rows * predicted_tokens / predicted_seconds``)."""
        out = {}
        for width, entry in sorted(self.log.items()):
            n = entry["iterations"]
            out[width] = {"iterations": n, **{k: v / n for k, v in entry.items() if k != "iterations"}}
        return out
