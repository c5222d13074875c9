"""The auto window's prior (csdgen.engine.window.prior_counts): acceptance counts a model ships, which
a fresh process's ``window="auto"`` starts from (the built-in model's config ``auto_window_prior``)."""

import numpy as np
import pytest

import csdgen
from csdgen.engine import window
from csdgen.engine.window import AGE_GROUPS, DEPTH_EDGES, prior_counts
from csdgen.models.builtin import load_builtin_model

from builtin_fixture import make_tiny_weights

SHAPE = (len(DEPTH_EDGES), AGE_GROUPS)


def prior(pass_rate: float, reached: float = 1e6) -> dict:
    """Counts of ``reached`` drafts per cell of which ``pass_rate`` passed (huge: they outlast the run's decay)."""
    return {"reached": np.full(SHAPE, reached).tolist(), "rejected": np.full(SHAPE, reached * (1 - pass_rate)).tolist()}


def model_with(tmp_path, name, priors):
    return load_builtin_model(make_tiny_weights(tmp_path / name, extra={"auto_window_prior": {"how": "a test", **priors}}))


def test_a_model_without_a_prior_starts_from_empty_counts():
    counts = prior_counts(object(), "csd/coupled")
    assert counts.reached.sum() == 0 and counts.version == 0


def test_the_shipped_counts_of_the_method_and_refresh_are_where_auto_starts(tmp_path):
    model = model_with(tmp_path, "w", {"csd/coupled": prior(0.9, 10.0), "sjd/coupled": prior(0.1, 10.0)})
    assert set(model.auto_window_prior) == {"csd/coupled", "sjd/coupled"}  # "how" is not a method
    csd = prior_counts(model, "csd/coupled")
    assert np.allclose(csd.reached, 10.0) and np.allclose(csd.rejected, 1.0) and csd.version == 1
    assert np.allclose(prior_counts(model, "sjd/coupled").rejected, 9.0)
    assert prior_counts(model, "csd/independent").reached.sum() == 0  # another refresh: no prior
    csd.reached[0, 0] = -1  # the state's counts are a copy: the model's prior is not changed by a run
    assert model.auto_window_prior["csd/coupled"]["reached"][0][0] == 10.0


def test_a_prior_of_another_shape_is_refused_naming_it(tmp_path):
    model = model_with(tmp_path, "bad", {"csd/coupled": {"reached": [[1.0]], "rejected": [[0.0]]}})
    with pytest.raises(ValueError, match=r"auto_window_prior\['csd/coupled'\]: reached and rejected must be counts "
                                         r"of shape \[7, 3\]"):
        prior_counts(model, "csd/coupled")


def test_a_fresh_process_follows_its_prior_from_the_first_choice(tmp_path, monkeypatch):
    """A prior where no draft passes keeps auto at width 1 after its warm-up; one where every draft
    passes keeps it wide. Without the prior, the first forwards would decide alone. Seconds per
    iteration are fixed (2 % more per slot), so the counts alone decide."""
    monkeypatch.setattr(window._AutoWindow, "cost", lambda self, rows: 1.0 + 0.02 * np.arange(1, self.max_width + 1))

    def widths(model):
        window._STATES.pop(model, None)  # a fresh process
        out = csdgen.generate(model, [0, 2], method="csd", window="auto", seed=0)
        return out.widths

    rejecting = widths(model_with(tmp_path, "rejects", {"csd/coupled": prior(0.0)}))
    passing = widths(model_with(tmp_path, "passes", {"csd/coupled": prior(1.0)}))
    after = 8  # the warm-up measures each width's time once or twice, whatever the counts say
    assert np.mean(rejecting[after:]) <= 1.5, rejecting
    assert np.mean(passing[after:]) >= 8, passing


def test_shipped_times_set_the_widths_ratios_and_skip_the_warm_up(tmp_path):
    """With seconds per width shipped for the batch size, a fresh process starts from them: no warm-up
    iteration at each width (a busy moment in one of them priced wide windows several times too dear)."""
    times = {"guided": {"2": {"1": 0.010, "4": 0.011, "16": 0.012, "32": 0.013}}}
    model = model_with(tmp_path, "t", {"csd/coupled": prior(0.9, 256.0), "times": times})
    assert window.prior_times(model, guided=True) == {2: {1: 0.010, 4: 0.011, 16: 0.012, 32: 0.013}}
    assert window.prior_times(model, guided=False) == {}
    window._STATES.pop(model, None)
    widths = csdgen.generate(model, [0, 2], method="csd", window="auto", seed=0).widths
    assert widths[:4] != [1, 4, 16, 32] and widths[0] >= 16, widths[:8]  # wide from the first iteration
    bare = model_with(tmp_path, "n", {"csd/coupled": prior(0.9, 256.0)})
    window._STATES.pop(bare, None)
    assert csdgen.generate(bare, [0, 2], method="csd", window="auto", seed=0).widths[:4] == [1, 4, 16, 32]


def test_a_shipped_time_that_is_not_a_positive_number_is_refused(tmp_path):
    model = model_with(tmp_path, "b", {"times": {"guided": {"2": {"1": -1.0}}}})
    with pytest.raises(ValueError, match=r"times\[2\]\[1\] = -1.0: allowed a number of seconds > 0"):
        window.prior_times(model, guided=True)
