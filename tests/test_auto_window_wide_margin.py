"""The auto window's wide margin (:attr:`csdgen.engine.window._AutoWindow.wide_margin`): outside a served
batch, the widest width predicted within the margin of the best rate is chosen, width 1 only where every
wider width is clearly slower; a served batch keeps the best rate; a model ships its margin with its prior."""

from __future__ import annotations

import numpy as np
import pytest

from csdgen.engine import window as window_module
from csdgen.engine.window import _AutoWindow, _Learned, prior_counts, prior_times, prior_wide_margin


class _Prior:
    """A model stand-in carrying an ``auto_window_prior`` (what :func:`prior_counts` and friends read)."""

    def __init__(self, prior):
        self.auto_window_prior = prior


@pytest.fixture(scope="module")
def shipped():
    """The built-in model's shipped prior: CSD's acceptance counts and the seconds per iteration at batch 8."""
    from csdgen.models.builtin import load_builtin_model

    return load_builtin_model().auto_window_prior


def _chooser(prior, margin, rows=8):
    model = _Prior(prior)
    learned = _Learned(prior_times(model, guided=True), prior_counts(model, "csd/coupled"))
    auto = _AutoWindow(32, learned, margin)
    auto.count = 1  # past the warm-up (the batch size's times are known), not an exploring turn
    auto._run_width = auto.max_width  # mid-run: every width priced by its steady tokens
    return auto


def _rates(auto, rows=8):
    return auto._expected() / auto.cost(rows)


def test_the_widest_width_predicted_within_the_margin_wins(shipped):
    plain = _chooser(shipped, 0.0).choose(255, rows=8)
    auto = _chooser(shipped, 0.15)
    rate = _rates(auto)
    widest = int(np.flatnonzero(rate >= 0.85 * rate.max())[-1]) + 1
    choice = auto.choose(255, rows=8)
    # on the shipped batch-8 times the best rate is a narrow width and a wider one is within 15 %
    assert choice == widest and choice > plain, (choice, widest, plain)
    assert rate[choice - 1] >= 0.85 * rate.max()


def test_the_width_held_stays_while_within_the_margin_and_near_the_widest():
    auto = _AutoWindow(32, _Learned(), 0.15)
    rate = np.linspace(1.0, 0.8, 32)  # widths 1 .. 6 within 15 % of width 1's rate
    widest = int(np.flatnonzero(rate >= 0.85)[-1]) + 1
    assert auto._widest_tie(rate, None) == widest
    assert auto._widest_tie(rate, widest - 1) == widest - 1  # held, within the margin and >= widest / 1.5
    assert auto._widest_tie(rate, 2) == widest  # too far below the widest: widen
    assert auto._widest_tie(rate, 30) == widest  # outside the margin: not kept


def test_width_1_only_where_every_wider_width_is_clearly_slower(shipped):
    times = {1: 0.010, 2: 0.030, 4: 0.060, 8: 0.120, 16: 0.240, 32: 0.480}  # wider costs in proportion
    prior = {**shipped, "times": {"guided": {"8": {str(w): t for w, t in times.items()}}}}
    auto = _chooser(prior, 0.15)
    rate = _rates(auto)
    assert (rate[1:] < 0.85 * rate[0]).all()
    auto._run_width = 1
    assert auto.choose(255, rows=8) == 1
    # the shortcut that repeats width 1 without the evaluation is taken only where the rule gives 1
    assert auto._one_held is not None
    near_tie = {**times, 2: 0.0115}  # width 2 predicted within the margin of width 1
    prior = {**shipped, "times": {"guided": {"8": {str(w): t for w, t in near_tie.items()}}}}
    auto = _chooser(prior, 0.15)
    auto._run_width = 1
    assert auto.choose(255, rows=8) > 1 and auto._one_held is None


def test_a_served_batch_keeps_the_best_rate(shipped):
    left = [200] * 8
    plain = _chooser(shipped, 0.0)
    wide = _chooser(shipped, 0.15)
    assert wide.choose(255, rows=8, remaining=left) == plain.choose(255, rows=8, remaining=left)


@pytest.mark.parametrize("bad", [0.7, -0.1, "0.1", True, None])
def test_a_bad_wide_margin_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"wide_margin.*allowed a number in \[0, 0.5\]"):
        prior_wide_margin(_Prior({"wide_margin": bad}))


def test_a_model_without_a_margin_gets_the_best_rate_and_the_builtin_ships_one(shipped):
    assert prior_wide_margin(_Prior(None)) == 0.0
    assert prior_wide_margin(_Prior({})) == 0.0
    assert 0.0 < prior_wide_margin(_Prior(shipped)) <= 0.5


def test_generate_hands_the_models_margin_to_the_chooser(monkeypatch):
    from csdgen import generate
    from csdgen.models.builtin import load_builtin_model

    seen = []
    original = window_module._AutoWindow.__init__

    def spy(self, max_width, learned=None, wide_margin=0.0):
        seen.append(wide_margin)
        original(self, max_width, learned, wide_margin)

    monkeypatch.setattr(window_module._AutoWindow, "__init__", spy)

    model = load_builtin_model()
    model.auto_window_prior = {**(model.auto_window_prior or {}), "wide_margin": 0.2}
    generate(model, [0], window="auto", method="csd", seed=0)
    assert seen == [0.2]


@pytest.mark.parametrize("margin, held", [(0.15, False), (0.0, True)])
def test_width_1_is_repeated_unevaluated_only_where_the_margin_would_choose_it(margin, held):
    """:meth:`_AutoWindow._hold_one` (width 1 again without the evaluation) agrees with the rule in force:
    width 2 at 0.9 of width 1's rate is inside a 15 % margin (the evaluation would widen) and outside
    the best-rate rule's home margin (width 1 stays)."""
    auto = _AutoWindow(32, _Learned(), margin)
    tokens = np.ones(32)
    tokens[1] = 1.8
    seconds = np.full(32, 1.0)
    seconds[1] = 2.0  # width 2: 0.9 of width 1's rate; wider widths at 1 token per second or less
    seconds[2:] = 2.0
    auto._run_width = 1
    auto._tokens_at = (auto.learned.counts.version, 0)
    auto._expected = lambda limit=None: tokens
    hold = auto._hold_one(1, 1, 1.0, 16, tokens, seconds, 1.0, wide=margin > 0)
    assert (hold is not None) is held
