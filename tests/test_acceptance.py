"""Acceptance rules: hand-computed cases, relations between rules (hypothesis), residual safety."""

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from csdgen.acceptance import (
    CSD,
    SJD,
    Addition,
    JacobiMatch,
    first_rejection,
    lossless_acceptance,
    make_rule,
    residual_distribution,
)


def window(p_rows, q_rows, x):
    """Build [1, W] / [1, W, V] tensors from lists."""
    return torch.tensor([x]), torch.tensor([p_rows]), torch.tensor([q_rows])


def test_sjd_ratio_hand_computed():
    # q(x)/p(x): 0.2/0.4 = 0.5; 0.6/0.3 -> capped at 1; p(x) = 0 -> reject (0)
    x, p, q = window([[0.4, 0.6], [0.7, 0.3], [0.0, 1.0]], [[0.2, 0.8], [0.4, 0.6], [0.5, 0.5]], [0, 1, 0])
    b = SJD().acceptance_probability(x, p, q, x)
    torch.testing.assert_close(b, torch.tensor([[0.5, 1.0, 0.0]]))


def test_csd_saturates_at_two_nats_with_default_lambda():
    V = 16
    q = torch.full((V,), 1 / V)  # H = ln 16 = 2.77 nats >= 2: lam * H >= 1
    p = q.clone()
    p[0], p[1] = p[0] + 0.05, p[1] - 0.05  # TV 0.05 < 0.65
    x, pp, qq = torch.tensor([[0]]), p[None, None], q[None, None]
    assert SJD().acceptance_probability(x, pp, qq, x).item() < 1
    assert CSD().acceptance_probability(x, pp, qq, x).item() == 1.0


def test_csd_relaxation_hand_computed_below_saturation():
    # q = [0.9, 0.1]: H = -(0.9 ln 0.9 + 0.1 ln 0.1) = 0.32508 nats; p = [0.5, 0.5], x = 1:
    # exact = 0.1 / 0.5 = 0.2; TV = 0.4 < 0.65 -> b = 0.2 + 0.5 * 0.32508 = 0.36254
    x, p, q = window([[0.5, 0.5]], [[0.9, 0.1]], [1])
    h = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))
    assert CSD().acceptance_probability(x, p, q, x).item() == pytest.approx(0.2 + 0.5 * h, rel=1e-5)
    # normalised entropy: H / ln 2
    normed = CSD(entropy_unit="normalized").acceptance_probability(x, p, q, x).item()
    assert normed == pytest.approx(0.2 + 0.5 * h / math.log(2), rel=1e-5)


def test_csd_tv_gate_switches_relaxation_off():
    # TV([1, 0], [0.3, 0.7]) = 0.7 >= 0.65: exact ratio 0.3
    x, p, q = window([[1.0, 0.0]], [[0.3, 0.7]], [0])
    assert CSD().acceptance_probability(x, p, q, x).item() == pytest.approx(0.3)
    assert CSD(delta=0.71).acceptance_probability(x, p, q, x).item() == pytest.approx(min(1.0, 0.3 + 0.5 * 0.6109), rel=1e-4)


def test_csd_clamping_keeps_entropy_and_tv_finite_on_zeros():
    # q one-hot on token 1, p one-hot on token 0, draft 0: q(x) = 0 -> exact 0; H(clamped) ~ 0, TV ~ 1
    x, p, q = window([[1.0, 0.0, 0.0]], [[0.0, 1.0, 0.0]], [0])
    b = CSD(delta=1.0).acceptance_probability(x, p, q, x)
    assert torch.isfinite(b).all() and b.item() < 1e-7


def test_jacobi_match_accepts_iff_equal_to_target_sample():
    x = torch.tensor([[0, 1, 2]])
    y = torch.tensor([[0, 2, 2]])
    probs = torch.full((1, 3, 3), 1 / 3)
    assert JacobiMatch().acceptance_probability(x, probs, probs, y).tolist() == [[1.0, 0.0, 1.0]]
    assert torch.equal(JacobiMatch().residual(probs, probs, y).argmax(-1), y)


def test_residual_hand_computed_and_degenerate_falls_back_to_target():
    p, q = torch.tensor([[[0.5, 0.5, 0.0]]]), torch.tensor([[[0.2, 0.3, 0.5]]])
    torch.testing.assert_close(residual_distribution(p, q), torch.tensor([[[0.0, 0.0, 1.0]]]))
    same = residual_distribution(q, q)
    torch.testing.assert_close(same, q)


def test_first_rejection_counts_leading_accepts():
    accepted = torch.tensor([[True, True, False, True], [False, True, True, True], [True, True, True, True]])
    assert first_rejection(accepted).tolist() == [2, 0, 4]


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: CSD(lam=-0.1), "lam=-0.1"),
        (lambda: CSD(delta=1.5), "delta=1.5"),
        (lambda: CSD(delta=-0.01), "delta=-0.01"),
        (lambda: CSD(entropy_unit="bits"), "entropy_unit='bits'"),
        (lambda: Addition(c=-1), "c=-1"),
        (lambda: make_rule("gsd2"), "unknown acceptance rule 'gsd2'"),
        (lambda: make_rule("csd", lamda=1), "bad options"),
    ],
)
def test_bad_rule_options_raise_value_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ----- properties over random p, q (hypothesis) -----

@st.composite
def windows(draw):
    B, W, V = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(2, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    sharp_p, sharp_q = draw(st.floats(0.1, 20)), draw(st.floats(0.1, 20))
    p = (torch.randn(B, W, V, generator=g) * sharp_p).softmax(-1)
    q = (torch.randn(B, W, V, generator=g) * sharp_q).softmax(-1)
    if draw(st.booleans()):  # zero entries, as top-k produces
        q = q * (torch.rand(B, W, V, generator=g) > 0.5)
        q[..., 0] += 1e-3
        q = q / q.sum(-1, keepdim=True)
    x = torch.multinomial(p.reshape(-1, V), 1, generator=g).reshape(B, W)
    return x, p, q


@settings(max_examples=150, deadline=None)
@given(windows(), st.floats(0, 3), st.floats(0, 1))
def test_relaxed_rules_never_accept_less_than_sjd(w, lam, delta):
    x, p, q = w
    exact = SJD().acceptance_probability(x, p, q, x)
    for rule in (CSD(lam=lam, delta=delta), CSD(lam=lam, delta=delta, entropy_unit="normalized"), Addition(c=lam)):
        b = rule.acceptance_probability(x, p, q, x)
        assert (b >= exact).all() and (b <= 1).all()


@settings(max_examples=100, deadline=None)
@given(windows(), st.floats(0, 3), st.floats(0, 1))
def test_zero_relaxation_is_exactly_sjd(w, lam, delta):
    x, p, q = w
    exact = SJD().acceptance_probability(x, p, q, x)
    assert torch.equal(CSD(lam=0.0, delta=delta).acceptance_probability(x, p, q, x), exact)
    assert torch.equal(CSD(lam=lam, delta=0.0).acceptance_probability(x, p, q, x), exact)
    assert torch.equal(Addition(c=0.0).acceptance_probability(x, p, q, x), exact)


@settings(max_examples=100, deadline=None)
@given(windows())
def test_residual_is_a_distribution_never_nan(w):
    _, p, q = w
    for pp in (p, q, q.clone()):
        r = residual_distribution(pp, q)
        assert torch.isfinite(r).all() and (r >= 0).all()
        torch.testing.assert_close(r.sum(-1), torch.ones(r.shape[:-1]))


def test_lossless_acceptance_single_position_law():
    """One position, exact rule: accept-or-resample yields q (the lemma every test builds on)."""
    V = 5
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([0.4, 0.3, 0.1, 0.1, 0.1])
    q = torch.tensor([0.1, 0.2, 0.3, 0.0, 0.4])
    # exact law: P(out = v) = p(v) b(v) + (1 - sum p b) r(v)
    b = torch.minimum(torch.ones(V), q / p)
    r = residual_distribution(p[None, None], q[None, None])[0, 0]
    law = p * b + (1 - (p * b).sum()) * r
    torch.testing.assert_close(law, q)
    x = torch.multinomial(p, 100_000, replacement=True, generator=g)
    accept = torch.rand(100_000, generator=g) < lossless_acceptance(x[None], p.expand(1, 100_000, V), q.expand(1, 100_000, V))[0]
    assert abs(accept.float().mean().item() - (p * b).sum().item()) < 0.01


def test_gsd_takes_a_numpy_integer_radius_as_an_int():
    """GSD(radius=np.int64(3)) was refused as 'must be an integer >= 0'."""
    import numpy as np

    from csdgen.acceptance import GSD

    rule = GSD(torch.randn(16, 4), radius=np.int64(3))
    assert rule.radius == 3 and type(rule.radius) is int
    with pytest.raises(ValueError, match=r"^radius=3\.0: the GSD rank radius must be an integer >= 0$"):
        GSD(torch.randn(16, 4), radius=3.0)


def test_make_rule_takes_a_name_in_any_case_and_names_what_is_not_a_name():
    """make_rule("CSD") was refused as unknown while generate(method="CSD") runs it; make_rule(["csd"])
    ended in TypeError: unhashable type: 'list'."""
    assert make_rule("CSD", lam=0.3).options()["lam"] == 0.3 and isinstance(make_rule("Sjd"), SJD)
    for bad in (["csd"], None, "ar"):
        with pytest.raises(ValueError, match=rf"^unknown acceptance rule {re.escape(repr(bad))}; allowed: addition, csd"):
            make_rule(bad)


def test_a_rule_of_the_callers_own_returning_no_probabilities_is_refused_naming_it():
    """Its [B] result was a broadcasting RuntimeError, None a TypeError, and NaN or 2.0 ran as
    "never" or "always accept" without a word."""
    import csdgen
    from csdgen.models import FunctionModel

    model = FunctionModel(lambda prefix: torch.zeros(prefix.shape[0], 4), 12, 4)

    def rule(returns):
        class Mine(csdgen.AcceptanceRule):
            name, lossless = "mine", False

            def acceptance_probability(self, x, p, q, y):
                return returns(x)
        return Mine()

    for returns, said in ((lambda x: torch.ones(x.shape[0]), r"returned a torch.float32 tensor of shape \[2\]"),
                          (lambda x: None, r"returned NoneType"),
                          (lambda x: torch.full(x.shape, float("nan")), r"returned nan"),
                          (lambda x: torch.full(x.shape, 2.0), r"returned 2.0"),
                          (lambda x: torch.ones(x.shape, dtype=torch.long), r"returned a torch.int64 tensor")):
        with pytest.raises(ValueError, match=r"^Mine.acceptance_probability " + said + r".*allowed: a float tensor "
                                             r"of shape \[B, W\] = \[2, 5\] with values in \[0, 1\]"):
            csdgen.generate(model, [None, None], method=rule(returns), window=5, seed=0)
    fine = csdgen.generate(model, [None, None], method=rule(lambda x: torch.full(x.shape, 0.5)), window=5, seed=0)
    assert fine.tokens.shape == (2, 12)


# ----- what the rules refuse at a call (shapes and dtypes only: no host sync) -----

def _batch_window(B=2, W=3, V=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.randn(B, W, V, generator=g).softmax(-1)
    q = torch.randn(B, W, V, generator=g).softmax(-1)
    x = torch.multinomial(p.reshape(-1, V), 1, generator=g).reshape(B, W)
    return x, p, q


@pytest.mark.parametrize("rule", [SJD(), CSD(), Addition(), JacobiMatch()], ids=lambda r: type(r).__name__)
def test_a_window_of_mismatched_batch_or_codebook_size_is_refused_naming_the_shapes(rule):
    x, p, q = _batch_window()
    y = torch.multinomial(q.reshape(-1, 5), 1).reshape(2, 3)
    with pytest.raises(ValueError, match=r"draft_tokens \[1, 3\] int64, draft_probs \[2, 3, 5\]"):
        rule.acceptance_probability(x[:1], p, q, y[:1])  # row 0 of p and q was used for the one draft row
    with pytest.raises(ValueError, match=r"target_probs \[2, 3, 4\] float32"):
        rule.acceptance_probability(x, p, q[..., :4], y)
    with pytest.raises(ValueError, match=r"draft_tokens \[2, 3\] float32"):
        rule.acceptance_probability(x.float(), p, q, y)


def test_first_rejection_refuses_a_mask_that_is_not_bool():
    assert first_rejection(torch.tensor([[True, True, False]])).tolist() == [2]
    with pytest.raises(ValueError, match=r"accepted \[1, 3\] int64: allowed a bool tensor"):
        first_rejection(torch.tensor([[2, 1, 0]]))  # counted 4 in a window of 3
    with pytest.raises(ValueError, match=r"accepted \[1, 3\] float32"):
        first_rejection(torch.tensor([[0.9, 0.2, 0.7]]))  # probabilities, truncated to a first rejection at 0


def test_residual_refuses_p_and_q_of_other_shapes():
    x, p, q = _batch_window()
    with pytest.raises(ValueError, match=r"draft_probs \[3, 5\] float32, target_probs \[2, 3, 5\]"):
        residual_distribution(p[0], q)


def test_csd_records_a_clamping_floor_other_than_the_default():
    from csdgen.sampling import ENTROPY_EPS

    assert repr(CSD()) == repr(CSD(eps=ENTROPY_EPS)) == "CSD(lam=0.5, delta=0.65, entropy_unit='nats')"
    assert repr(CSD(eps=0.01)) == "CSD(lam=0.5, delta=0.65, entropy_unit='nats', eps=0.01)"
    assert make_rule("csd", eps=0.01).options()["eps"] == 0.01


def test_csd_refuses_a_clamping_floor_outside_0_to_1():
    x, p, q = _batch_window()
    for eps in (1.0, float("inf"), float("nan"), -1e-3):
        with pytest.raises(ValueError, match=re.escape(f"eps={eps!r}: the clamping floor must be a number in [0, 1)")):
            CSD(eps=eps)
    b = CSD(eps=0.5).acceptance_probability(x, p, q, None)  # a floor above 1/V is allowed: it raises small entries only
    assert b.shape == (2, 3) and bool(((b >= 0) & (b <= 1)).all())


def test_csd_refuses_a_target_entropy_of_another_shape():
    x, p, q = _batch_window()
    with pytest.raises(ValueError, match=r"target_entropy \[7\] float32: allowed a \[B, W\] = \[2, 3\]"):
        CSD().acceptance_probability(x, p, q, None, target_entropy=torch.zeros(7))


def test_codebook_rules_refuse_targets_over_another_codebook_size():
    from csdgen.acceptance import GSD, Lantern

    x, p, q = _batch_window()
    for rule in (GSD(torch.randn(3, 4)), GSD(torch.randn(50, 4)), Lantern(torch.randn(50, 4), k=2)):
        with pytest.raises(ValueError, match=rf"{type(rule).__name__} was made with a codebook of "
                                             rf"{rule.codebook_size} entries; the target distribution has V=5"):
            rule.acceptance_probability(x, p, q, None)


def test_lantern_names_a_one_entry_codebook_and_records_numpy_caps_as_python_numbers():
    import numpy as np

    from csdgen.acceptance import Lantern

    with pytest.raises(ValueError, match="a codebook of 1 entries: LANTERN .* at least 2 entries"):
        Lantern(torch.randn(1, 4))
    codebook = torch.randn(8, 4)
    assert repr(Lantern(codebook, k=3, cap=np.float32(2))) == repr(Lantern(codebook, k=3, cap=2.0))
    assert repr(Lantern(codebook, k=3, cap=np.int64(2))) == repr(Lantern(codebook, k=3, cap=2)) == (
        "Lantern(k=3, delta=0.1, cap=2)")  # as recorded before numpy's numbers were converted: such folders resume
