"""Guidance schedules (csdgen/guidance.py): exact in distribution with every method, greedy-equal to AR.

A schedule gives every image position its own guidance scale. The engine reads the scale of a
target from its position (slot ``j`` of a window at committed length ``c`` is position ``c + j``;
a tree node at depth ``d`` is ``c + d``), so a position's target is the same whether it is
sampled alone or drafted. The chi-square tests check the joint law on the known-joint model with
strongly different scales per position; the control reads every slot's scale at the window's
first position (a scale that depends on the iteration), which the test must reject.
"""

from dataclasses import dataclass

import pytest
import torch

import csdgen
from csdgen.engine.loop import _Loop
from csdgen.guidance import GuidanceSchedule, LinearGuidance, guidance_at, guidance_table
from csdgen.models import FunctionModel
from csdgen.sampling import SamplingConfig, target_probs
from builtin_fixture import builtin, weights  # noqa: F401 (fixtures)
from conftest import KnownJoint
from test_lossless import P_FAIL, P_PASS, SAMPLES, chi_square_pvalue


@dataclass(frozen=True)
class TableGuidance(GuidanceSchedule):
    """Explicit scales per position (tests only)."""

    values: tuple[float, ...] = (3.0, 0.0, 4.0, 0.5)
    name = "table"

    def scales(self, scale, num_image_tokens, grid):
        return torch.tensor(self.values[:num_image_tokens], dtype=torch.float64)


SCHEDULED = SamplingConfig(guidance_scale=2.0, temperature=1.0, guidance_schedule=TableGuidance())


def scheduled_joint(known: KnownJoint, sampling: SamplingConfig) -> dict[tuple, float]:
    """Exact law with the scale of position t from the schedule (the product of the per-position targets)."""
    import itertools

    scales = sampling.guidance_schedule.scales(sampling.guidance_scale, known.N, (1, known.N))
    law = {}
    for seq in itertools.product(range(known.V), repeat=known.N):
        prob = 1.0
        for t in range(known.N):
            prefix = torch.tensor([seq[:t]], dtype=torch.long)
            q = target_probs(known.model.fn(prefix)[:, None], known.model.uncond_fn(prefix)[:, None], sampling,
                             guidance=torch.tensor([[[float(scales[t])]]]))
            prob *= q[0, 0, seq[t]].item()
        law[seq] = prob
    return law


@pytest.fixture(scope="module")
def scheduled():
    known = KnownJoint(SCHEDULED, seed=3)
    return known, scheduled_joint(known, SCHEDULED)


def test_the_schedule_changes_the_law(scheduled):
    known, law = scheduled
    constant = KnownJoint(SamplingConfig(guidance_scale=2.0, temperature=1.0), seed=3).joint()
    assert max(abs(law[s] - constant[s]) for s in law) > 0.02


@pytest.mark.parametrize("method, kwargs", [
    ("ar", {}),
    ("sjd", dict(window=4, draft_init="uniform")),
    ("sjd", dict(window=3, draft_init="onehot", refresh="coupled")),
    ("sjd", dict(window="auto")),
    ("sjd", dict(window=3, draft_init="uniform", tree=(2, 2))),
])
def test_methods_reproduce_the_scheduled_joint(scheduled, method, kwargs):
    known, law = scheduled
    out = csdgen.generate(known.model, batch_size=SAMPLES, sampling=SCHEDULED, method=method, seed=21, **kwargs)
    assert out.settings["guidance_schedule"] == {"name": "table", "values": [3.0, 0.0, 4.0, 0.5]}
    assert chi_square_pvalue(out.tokens, law) > P_PASS


def test_the_test_fails_a_scale_read_at_the_window_start(scheduled, monkeypatch):
    """Control: every slot gets the scale of the window's first position (an iteration-dependent scale)."""
    known, law = scheduled
    original = _Loop._scales

    def at_window_start(self, positions):
        return original(self, positions[..., :1].expand_as(positions))

    monkeypatch.setattr(_Loop, "_scales", at_window_start)
    tokens = csdgen.generate(known.model, batch_size=SAMPLES, sampling=SCHEDULED, method="sjd", window=4,
                             draft_init="uniform", seed=21).tokens
    assert chi_square_pvalue(tokens, law) < P_FAIL


def test_greedy_sjd_equals_ar_with_a_schedule(cached_model):
    sampling = SamplingConfig(guidance_scale=5.0, temperature=0, guidance_schedule=LinearGuidance(floor=0.5))
    ar = csdgen.generate(cached_model, [0, 3], method="ar", sampling=sampling).tokens
    constant = csdgen.generate(cached_model, [0, 3], method="ar", sampling=SamplingConfig(guidance_scale=5.0, temperature=0))
    assert not torch.equal(ar, constant.tokens)  # the schedule matters here
    for window in (3, 8, 17):
        assert torch.equal(csdgen.generate(cached_model, [0, 3], method="sjd", window=window, sampling=sampling).tokens, ar)
    assert torch.equal(csdgen.generate(cached_model, [0, 3], method="sjd", window=6, tree=(2, 2), sampling=sampling).tokens, ar)


def test_linear_schedule_values_and_table_checks():
    assert LinearGuidance(floor=1.0).scales(4.0, 4, (2, 2)).tolist() == [4.0, 3.0, 2.0, 1.0]
    assert LinearGuidance(floor=2.5).scales(4.0, 4, (2, 2)).tolist() == [4.0, 3.0, 2.5, 2.5]
    assert guidance_table(LinearGuidance(), 1.0, 4, (2, 2)) is None  # unguided: no table
    assert guidance_table(None, 3.0, 4, (2, 2)) is None
    table = guidance_table(LinearGuidance(), 4.0, 4, (2, 2))
    assert guidance_at(table, torch.tensor([[0, 3, 9]])).tolist() == [[[4.0], [1.0], [1.0]]]
    with pytest.raises(ValueError, match="floor=-1: allowed a finite number >= 0"):
        LinearGuidance(floor=-1)
    with pytest.raises(ValueError, match="gave torch.Size\\(\\[3\\]\\); allowed: a tensor of 4 scales"):
        guidance_table(TableGuidance(values=(1.0, 2.0, 3.0)), 2.0, 4, (2, 2))
    with pytest.raises(ValueError, match="negative or non-finite scale"):
        guidance_table(TableGuidance(values=(1.0, -2.0, 3.0, 1.0)), 2.0, 4, (2, 2))
    with pytest.raises(ValueError, match="guidance_schedule="):
        SamplingConfig(guidance_scale=2.0, guidance_schedule=lambda i: 2.0)


def test_unguided_runs_ignore_the_schedule():
    model = FunctionModel(lambda prefix: torch.zeros(prefix.shape[0], 3), 4, 3)
    out = csdgen.generate(model, batch_size=2, method="sjd", window=3,
                          sampling=SamplingConfig(guidance_schedule=TableGuidance()))
    assert "guidance_schedule" not in out.settings and out.tokens.shape == (2, 4)


def test_linear_guidance_takes_a_numpy_floor_as_a_float_and_refuses_a_bool():
    """LinearGuidance(floor=np.float32(1.5)) was refused as 'allowed a finite number >= 0' and
    floor=True was taken as 1."""
    import json

    import numpy as np

    schedule = LinearGuidance(floor=np.float32(1.5))
    assert schedule.floor == 1.5 and type(schedule.floor) is float
    assert json.loads(json.dumps(schedule.options())) == {"name": "linear", "floor": 1.5}
    for bad in (True, -1, float("inf"), "1"):
        with pytest.raises(ValueError, match=rf"^floor={bad!r}: allowed a finite number >= 0$"):
            LinearGuidance(floor=bad)


@dataclass(frozen=True)
class FlatGuidance(LinearGuidance):
    """The same parameters as LinearGuidance, another schedule (tests only): the scale itself everywhere."""

    name = "flat"

    def scales(self, scale, num_image_tokens, grid):
        return torch.full((num_image_tokens,), float(scale), dtype=torch.float64)


def test_a_record_names_its_schedule_and_resume_tells_two_schedules_of_the_same_parameters_apart(builtin, tmp_path):
    """Found by a new-user try-out: records kept a schedule's parameters only ({"floor": 4.0}), so a run with
    Lumina-mGPT 2.0's schedule resumed into a folder of LinearGuidance(4) images (another target)."""
    import json

    from csdgen.runs import save_run

    out = tmp_path / "run"

    def run(schedule):
        return save_run(builtin, [0, 1], out, seed=1, maps=False, method="sjd", window=4,
                        sampling=SamplingConfig(guidance_scale=3.0, guidance_schedule=schedule))

    run(LinearGuidance(1.0))
    record = json.loads((out / "record.json").read_text())
    assert record["settings"]["sampling"]["guidance_schedule"] == {"name": "linear", "floor": 1.0}
    run(LinearGuidance(1.0))  # the same run resumes
    with pytest.raises(ValueError, match=r'other settings \(sampling.guidance_schedule.name: "linear" there, "flat" here\)'):
        run(FlatGuidance(1.0))
    record["settings"]["sampling"]["guidance_schedule"] = {"floor": 1.0}  # as records kept it before the name
    (out / "record.json").write_text(json.dumps(record))
    run(LinearGuidance(1.0))  # still resumes: the parameters agree
    with pytest.raises(ValueError, match=r"sampling.guidance_schedule.floor: 1.0 there, 2.0 here"):
        run(LinearGuidance(2.0))


# -- argument checks (audit tester3, findings 27 and 28) --------------------------------------------------------

@pytest.mark.parametrize("scale", [-3.0, "3", float("nan"), None])
def test_guidance_table_refuses_a_scale_that_is_not_a_finite_number_at_least_0(scale):
    """-3.0 was silently floored to [1, 1, 1, 1] and "3" was taken as 3.0."""
    with pytest.raises(ValueError, match=r"^scale=.*: must be a finite number >= 0$"):
        guidance_table(LinearGuidance(), scale, 4, (2, 2))


def test_guidance_table_refuses_a_schedule_given_as_a_string():
    """"linear" gave AttributeError: 'str' object has no attribute 'scales'."""
    with pytest.raises(ValueError, match=r"^schedule='linear': must be None or a csdgen.guidance.GuidanceSchedule"):
        guidance_table("linear", 3.0, 4, (2, 2))


@pytest.mark.parametrize("count", [0, 4.0, "4"])
def test_guidance_table_refuses_an_image_token_count_that_is_not_an_integer_at_least_1(count):
    with pytest.raises(ValueError, match=r"^num_image_tokens=.*: allowed an integer >= 1$"):
        guidance_table(LinearGuidance(), 3.0, count, (2, 2))


def test_guidance_at_refuses_positions_that_are_not_an_integer_tensor():
    """Float positions gave torch's 'tensors used as indices must be long ...' IndexError, a list an AttributeError."""
    table = guidance_table(LinearGuidance(), 4.0, 4, (2, 2))
    for bad in (torch.tensor([[1.0]]), torch.tensor([True]), [1]):
        with pytest.raises(ValueError, match=r"^positions: got .*; allowed an integer tensor \(int64\)"):
            guidance_at(table, bad)
    with pytest.raises(ValueError, match=r"^table: got shape \[2, 2\]; allowed a \[N\] tensor"):
        guidance_at(table.reshape(2, 2), torch.tensor([0]))
    assert guidance_at(table, torch.tensor([-1, 0], dtype=torch.int32)).tolist() == [[4.0], [4.0]]  # clamped, as documented
