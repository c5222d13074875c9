"""What ``window="auto"`` learns and keeps between calls, and the priors a model ships for it.

The times per width are a property of the model, the machine and the number of images decoding
together, and the acceptance a property of the method and the model, so a later call on the same
model (a benchmark's next image, the next batch of a run) starts from them instead of from a warm-up
(:func:`_shared_state`); a fresh process starts from the model's ``auto_window_prior`` where it ships
one (:func:`prior_counts`, :func:`prior_times`, :func:`prior_wide_margin`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np
import torch

from ..transfer import to_device

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
