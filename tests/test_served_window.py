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
        seed, into_empty, into_running = 8, 1, 0
        while batch.iterations < 16:
            batch.step()
            if batch.size < 3:  # images join a running batch
                into_empty += batch.size == 0
                into_running += batch.size > 0
                batch.admit([seed % 5], [seed], [0])
                seed += 1
    assert counter.iterations == 16 and max(batch.widths) > 1 and into_running >= 1
    # only admissions into an empty batch ran a prefill forward; the others took theirs in an iteration's window
    assert batch.forwards == batch.iterations + into_empty
    # inside the iteration (_Loop._advance: the chooser, the forward, the verify, the prefills it
    # carries) the verify results' read and nothing else; images finishing (their tokens) and joining
    # (their session) read apart
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


#: E(W) of drafts that each pass with probability 0.3: what the chooser's counts predict in the
#: tests below, where the drafts of a settled window pass at 0.8 (GEOMETRIC)
PESSIMISTIC = np.cumsum(0.3 ** (WIDTHS - 1))


def _pessimistic_chooser(times_by_slots: dict[int, np.ndarray]) -> _AutoWindow:
    """A served chooser whose counts predict drafts passing at 0.3 (:data:`PESSIMISTIC`), past its warm-up."""
    auto = _served_chooser(times_by_slots)
    auto.learned.counts.rejected[:] = 7e5
    return auto


def _serve(auto: _AutoWindow, seconds: np.ndarray, iterations: int, tokens: np.ndarray = GEOMETRIC,
           rows: int = 4, image: int = 256) -> list[int]:
    """``iterations`` of a kept-busy served batch of ``rows`` images at staggered places of their images
    (a finished row is replaced by a new image): each iteration commits ``tokens[W - 1]`` per row (the
    settled window's mean, capped by the row's end) in ``seconds[W - 1]``. Returns the widths chosen."""
    left = np.linspace(image - 1, 1, rows + 2)[1:-1].round()
    widths = []
    for _ in range(iterations):
        width = auto.choose(int(left.max()), rows, remaining=left.astype(np.int64))
        committed = np.minimum(tokens[width - 1], left)
        auto.observe(width, float(seconds[width - 1]), None, None, tokens=float(committed.mean()))
        left = left - np.round(committed)
        left[left < 1] = image - 1  # the next image joins
        widths.append(width)
    return widths


def test_a_served_batch_calibrates_each_width_by_its_own_settled_iterations():
    """Counts that predict every width too low (drafts passing at 0.3 where a settled window's pass
    at 0.8) held a served batch at width 1 while width 4 commits the most per second: each width
    is calibrated by what its settled iterations commit, the trials find it and the batch moves.
    Control: the one calibration factor of the width held (and its range) leaves it at width 1."""
    seconds = 0.004 + 0.002 * WIDTHS  # 4 rows, a forward's cost in batch x width: widths 1, 2, 4, 8 cost 6, 8, 12, 20 ms
    rates = GEOMETRIC / seconds
    # widths 3-5 commit the most per second, 1.46x width 1; as the counts predict, every wider width is slower
    assert int(rates.argmax()) + 1 == 4 and rates[3] > 1.4 * rates[0] and (PESSIMISTIC / seconds)[1:].max() < rates[0]
    auto = _pessimistic_chooser({4: seconds})
    widths = _serve(auto, seconds, 600)
    late = widths[-200:]
    assert max(set(late), key=late.count) >= 2 and late.count(1) < 20, sorted(set(late))
    factors = auto.served_calibration()
    assert factors[1] > 2.0  # width 2: (1.8 - 1) measured drafts over (1.3 - 1) predicted, 2.67
    # the control: the global calibration alone (what a served batch used before)
    control = _pessimistic_chooser({4: seconds})
    control.served_calibration = lambda: np.full(control.max_width, control.calibration())
    late = _serve(control, seconds, 600)[-200:]
    assert late.count(1) > 150


def test_a_served_batch_counts_no_iteration_of_rows_that_just_began_or_of_an_unsettled_window():
    auto = _served_chooser({4: np.full(32, 0.01)})
    auto.choose(255, 4, remaining=np.full(4, 255))  # four new images: the image is 255 positions long
    auto._run_width, auto._run = 8, 20
    auto.observe(8, 0.01, None, None, tokens=1.0)
    assert auto._served == {}  # every row within two windows of its start
    auto.choose(255, 4, remaining=np.array([255, 200, 150, 100]))  # one young row of four: counted
    auto.observe(8, 0.01, None, None, tokens=2.0)
    assert auto._served[8][2] == 1.0
    auto.choose(255, 4, remaining=np.array([240, 200, 150, 100]))
    auto._run_width, auto._run = 16, 0  # a switch to 16: its first iterations hold fresh drafts
    for _ in range(auto._settle(16, auto._expected()[15]) - 1):
        auto.observe(16, 0.01, None, None, tokens=1.0)
    assert 16 not in auto._served
    auto.observe(16, 0.01, None, None, tokens=1.0)
    assert auto._served[16][2] == 1.0
    # a width not measured takes the factor of the measured ones nearest it (log2 W); none: the one factor
    factors = auto.served_calibration()
    assert factors[11] == pytest.approx(np.interp(np.log2(12), [3, 4], [factors[7], factors[15]]))
    assert factors[31] == factors[15] and factors[1] == factors[7]
    assert np.all(_served_chooser({}).served_calibration() == 1.0)


def test_a_served_batch_trial_runs_until_its_window_settles_and_then_measures():
    seconds = 0.004 + 0.002 * WIDTHS
    auto = _pessimistic_chooser({4: seconds})
    auto._held = 1
    auto._run_width, auto._run = 1, 50
    left = np.array([200, 150, 100, 50])
    auto._last_turn, auto._turns = -100, 0  # the next choose is an up turn
    first = auto.choose(255, 4, remaining=left)
    assert first == 2
    trial = [first] + list(auto.plan)
    assert len(trial) == auto._settle(2, auto._expected()[1]) + auto.SERVED_MEASURE
    # a width that costs more than SERVED_TRIAL_COST iterations of the width held: a short trial (its time)
    dear = 0.006 * np.where(WIDTHS == 1, 1.0, 3.0 * WIDTHS)
    auto = _served_chooser({4: dear})
    auto.learned.counts.rejected[:] = 0.0  # every draft passes: width 2 is predicted near the best
    auto._held, auto._run_width, auto._run = 1, 1, 50
    auto._last_turn, auto._turns = -100, 0
    assert auto.choose(255, 4, remaining=left) == 2 and len(auto.plan) + 1 == auto.EXPLORE_RUN
