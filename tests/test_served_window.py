"""``window="auto"`` in a served batch (:class:`csdgen.engine.continuous.ContinuousBatch`) is priced
for the batch it runs: the tokens its rows commit, each capped by its own image end, per second of
an iteration of the batch slots the forward runs (:func:`csdgen.engine.window.batch_width`)."""

import numpy as np
import pytest

from csdgen.engine.continuous import ContinuousBatch
from csdgen.engine.window import _AutoWindow, _Learned, batch_tokens, batch_width

WIDTHS = np.arange(1, 33)
#: E(W) of drafts that each pass with probability 0.8 (tokens per image and forward)
GEOMETRIC = np.cumsum(0.8 ** (WIDTHS - 1))


def linear_cost(rows: int) -> np.ndarray:
    """Seconds per iteration growing with batch x width (a compute-bound forward, as on a CPU)."""
    return 0.002 + 0.001 * rows * WIDTHS


def test_a_cost_linear_in_batch_times_width_picks_width_1_for_a_full_batch_and_wider_for_one_row():
    far = 200
    assert batch_width(GEOMETRIC, [far] * 16, linear_cost(16)) == 1
    assert batch_width(GEOMETRIC, [far], linear_cost(1)) == 4  # 2.95 tokens in 6 ms against 1 in 3 ms
    assert 1 < batch_width(GEOMETRIC, [far] * 2, linear_cost(2)) < 4  # a thinner batch, a wider window


def test_a_flat_cost_picks_the_widest_window_the_rows_can_use():
    flat = np.full(32, 0.01)
    assert batch_width(GEOMETRIC, [200] * 16, flat) == 32
    # rows within 5 positions of their ends gain nothing past width 5: the narrowest of the equals
    assert batch_width(GEOMETRIC, [5, 3, 1], flat) == 5


def test_batch_tokens_caps_each_row_at_its_image_end():
    every_draft_passes = WIDTHS[:8].astype(float)  # W tokens per forward
    total = batch_tokens(every_draft_passes, [1, 3, 8])
    assert total.tolist() == [3, 5, 7, 8, 9, 10, 11, 12]  # 1 + min(W, 3) + min(W, 8)
    with pytest.raises(ValueError, match=r"remaining=\[2, 0\]"):
        batch_tokens(every_draft_passes, [2, 0])
    with pytest.raises(ValueError, match="one time > 0 per width"):
        batch_width(every_draft_passes, [4], np.ones(7))


def _served_chooser(times_by_slots: dict[int, np.ndarray]) -> _AutoWindow:
    """A chooser past its warm-up whose drafts pass at 0.8 at every depth and age, with the given
    seconds per iteration (``[32]``, widths 1 .. 32) per batch slots."""
    auto = _AutoWindow(32, _Learned())
    auto.learned.counts.reached[:] = 1e6
    auto.learned.counts.rejected[:] = 2e5
    for slots, seconds in times_by_slots.items():
        auto.learned.times[slots] = {int(w): float(t) for w, t in zip(WIDTHS, seconds)}
    auto._run_width = auto.max_width  # mid-run: every width priced by its steady state
    auto.count = 1  # past the warm-up, not an exploring iteration
    return auto


def test_the_chooser_prices_a_served_batch_row_by_row_and_by_its_slots():
    times = {16: linear_cost(16), 1: linear_cost(1)}
    assert _served_chooser(times).choose(255, 16, remaining=np.full(16, 200)) == 1
    assert _served_chooser(times).choose(255, 1, remaining=np.array([200])) > 1
    # 15 rows one position from their ends and one far: the wide window serves one row only. Here
    # the time grows gently with the width (a half-empty bucket), so wide wins for rows far from
    # their ends and loses where only one row can use it
    gentle = {16: 0.02 + 0.001 * WIDTHS}
    assert _served_chooser(gentle).choose(255, 16, remaining=np.full(16, 200)) > 8
    assert _served_chooser(gentle).choose(255, 16, remaining=np.array([1] * 15 + [200])) == 1


def test_a_continuous_batch_with_auto_prices_the_batch_it_runs(cached_model, monkeypatch):
    batch = ContinuousBatch(cached_model, method="csd", window="auto", engine="static", capacity=4)
    batch.admit([0, 1, 2], [5, 6, 7], [0, 0, 0])
    auto, loop = batch._loop.auto, batch._loop
    seen = []
    choose = auto.choose

    def spy(limit, rows=1, lag=1.0, remaining=None):
        seen.append((rows, lag, None if remaining is None else list(remaining), loop.committed_host.tolist()))
        return choose(limit, rows, lag, remaining=remaining)

    monkeypatch.setattr(auto, "choose", spy)
    for _ in range(3):
        batch.step()
    assert len(seen) == 3
    N = cached_model.num_image_tokens
    for rows, lag, remaining, committed in seen:
        # timed under the power-of-two bucket of its images (uncompiled, this CPU's default, the forward runs the three)
        assert rows == loop.session.batch_slots == 4 and loop.session._bucket == 3
        assert lag == 1.0  # no laggard discount: images join and leave
        assert remaining == [N - c for c in committed]


def test_a_served_batch_priced_row_by_row_keeps_one_host_sync_per_iteration(cached_model):
    from csdgen.engine.syncs import HostSyncCounter

    with HostSyncCounter(cached_model) as counter:
        batch = ContinuousBatch(cached_model, method="csd", window="auto", engine="static", compile=False, capacity=4)
        batch.admit([0, 1, 2], [5, 6, 7], [0, 0, 0])
        seed = 8
        while batch.iterations < 16:
            batch.step()
            if batch.size < 3:  # images join a running batch
                batch.admit([seed % 5], [seed], [0])
                seed += 1
    assert counter.iterations == 16 and max(batch.widths) > 1 and seed > 9
    # inside the iteration (_Loop._advance: the chooser, the forward, the verify) the verify results'
    # read and nothing else; images finishing (their tokens) and joining (their prefill) read apart
    inside = [sum("_advance" in event.where for event in counter.syncs(k)) for k in range(1, 17)]
    assert inside == [1] * 16, counter.summary()


def test_a_served_batch_warms_up_at_each_slot_count_it_meets_unmeasured():
    """A server's batch begins with one request's images: the times of a full batch, borrowed from
    one slot's (scaled by width 1's ratio), would price its wide windows nearly free."""
    auto = _served_chooser({1: linear_cost(1)})
    far = np.full(16, 200)
    assert auto.choose(255, 1, remaining=far[:1]) > 1  # measured: no warm-up
    widths = []
    while not widths or auto.plan:
        widths.append(auto.choose(255, 16, remaining=far))
        auto.observe(widths[-1], float(linear_cost(16)[widths[-1] - 1]), None, None)
    # WARM_PLAN, narrow to wide, at 16 slots, until widening stops paying (4 measured twice); then
    # the choice of the measured times
    assert widths == [1, 4, 4, 1]
    assert auto.choose(255, 16, remaining=far) == 1  # measured: width 1 for the full batch
    assert auto.choose(255, 1, remaining=far[:1]) > 1 and not auto.plan  # no second warm-up at 1 slot


def test_a_served_batch_calibrates_against_the_tokens_its_rows_could_commit():
    """Rows near their image ends commit fewer tokens than the width: the calibration compares the
    measured tokens with a prediction capped the same way, or it would learn the ends as misses."""
    auto = _served_chooser({4: np.full(32, 0.01)})
    auto.learned.counts.rejected[:] = 0.0  # every draft passes: E(W) = W
    auto.choose(255, 4, remaining=np.array([3, 3, 3, 100]))
    auto._held = auto._run_width = 8
    auto._run = 10  # a steady iteration of the held width
    for _ in range(50):
        auto.observe(8, 0.01, None, None, tokens=(3 + 3 + 3 + 8) / 4)  # all it could: 3 each, 8 for the far row
    assert auto.calibration() == pytest.approx(1.0, abs=0.01)  # uncapped: 3.25 drafts a row against 7 (0.7, the floor)
