"""The verify step's fast path for a width-1 window against its general path."""

import pytest
import torch

from csdgen.acceptance import RULES, make_rule
from csdgen.engine.results import Decision
from csdgen.engine.streams import _Y
from csdgen.engine.verification import _verify_window, verify
from csdgen.sampling import sample


@pytest.mark.parametrize("refresh", ["independent", "coupled"])
@pytest.mark.parametrize("name", sorted(RULES))
def test_a_width_1_window_gives_the_general_paths_verdict_bit_for_bit(name, refresh):
    """At width 1 every image's one slot is the bonus slot: the fast path skips the rule's acceptance
    probabilities and residual and must give what the general path gives, for every rule."""
    generator = torch.Generator().manual_seed(7)
    B, V = 5, 64
    rule = make_rule(name, codebook=torch.randn(V, 8, generator=generator))
    q = torch.rand(B, 1, V, generator=generator).pow(3)
    q[:, :, : V // 4] = 0.0  # tokens the target rules out (top-k), as a real target has
    q = q / q.sum(-1, keepdim=True)
    p = torch.softmax(torch.randn(B, 1, V, generator=generator), -1)
    x = torch.randint(V, (B, 1), generator=generator)
    widths = torch.ones(B, dtype=torch.long)
    u = torch.rand(6, B, 1, generator=generator, dtype=torch.float64)
    fast = verify(rule, refresh, x, p, q, widths, u)
    general = _verify_window(rule, refresh, x, p, q, widths, u, sample(q, u[_Y]))
    assert torch.equal(fast.accepted, general.accepted) and fast.accepted.dtype == general.accepted.dtype
    assert torch.equal(fast.tokens, general.tokens) and fast.tokens.dtype == general.tokens.dtype
    assert torch.equal(fast.decisions, general.decisions) and fast.decisions.dtype == general.decisions.dtype
    assert (fast.decisions == int(Decision.SAMPLED)).all() and (fast.accepted == 0).all()
    # control: at width 2 the general path runs and tests the draft (not every image commits its y)
    x2, p2, q2 = x.repeat(1, 2), p.repeat(1, 2, 1), q.repeat(1, 2, 1)
    u2 = torch.rand(6, B, 2, generator=generator, dtype=torch.float64)
    two = verify(rule, refresh, x2, p2, q2, torch.full((B,), 2), u2)
    assert two.tokens.shape == (B, 2) and set(two.accepted.tolist()) <= {0, 1}


# -- argument checks (audit tester3, findings 15 and 24) --------------------------------------------------------

def _window(B=2, W=4, V=8):
    generator = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(B, W, V, generator=generator), -1)
    return dict(draft_tokens=torch.zeros(B, W, dtype=torch.long), draft_probs=q.clone(), target_probs=q,
                widths=torch.full((B,), W), uniforms=torch.rand(6, B, W, generator=generator, dtype=torch.float64))


@pytest.mark.parametrize("W", [1, 4])
def test_verify_refuses_an_unknown_refresh_mode_at_every_width(W):
    """At W=1 (AR's step) 'bogus' was accepted: the fast path refreshes nothing."""
    with pytest.raises(ValueError, match=r"^unknown draft refresh 'bogus'; allowed: independent, coupled$"):
        verify(make_rule("sjd"), "bogus", **_window(W=W))


@pytest.mark.parametrize("rule", ["sjd", None])
def test_verify_refuses_a_rule_that_is_not_an_acceptance_rule_instance(rule):
    """'sjd' gave AttributeError: 'str' object has no attribute 'acceptance_probability'."""
    with pytest.raises(ValueError, match=r"^verify: rule=.*; allowed an AcceptanceRule instance"):
        verify(rule, "independent", **_window())
    from csdgen.acceptance import SJD

    with pytest.raises(ValueError, match=r"^verify: rule=SJD; allowed an AcceptanceRule instance"):
        verify(SJD, "independent", **_window())


@pytest.mark.parametrize("widths", [4, torch.full((2,), 4.0), torch.full((3,), 4)])
def test_verify_refuses_widths_that_are_not_an_integer_tensor_of_one_per_image(widths):
    """An int widths gave TypeError: 'int' object is not subscriptable."""
    arguments = _window()
    arguments["widths"] = widths
    with pytest.raises(ValueError, match=r"^verify: widths is .*; allowed an int64 tensor \[B\] = \[2\]"):
        verify(make_rule("sjd"), "independent", **arguments)


@pytest.mark.parametrize("name, value, match", [
    ("uniforms", torch.rand(2, 4, dtype=torch.float64), r"^verify: uniforms is .*; allowed a float64 tensor \[6, B, W\]"),
    ("draft_probs", torch.full((2, 4, 5), 0.2), r"^verify: draft_probs is .*; allowed a float tensor \[B, W, V\]"),
    ("target_probs", torch.full((1, 4, 8), 0.125), r"^verify: target_probs is"),
    ("draft_tokens", torch.zeros(2, 4), r"^verify: draft_tokens is torch.float32 \[2, 4\]; allowed an int64"),
    ("target_entropy", torch.zeros(7), r"^verify: target_entropy is torch.float32 \[7\]; allowed None or"),
])
def test_verify_refuses_tensors_of_the_wrong_shape_naming_them(name, value, match):
    """[B, W] uniforms gave an IndexError deep in the verify step."""
    arguments = _window()
    arguments[name] = value
    with pytest.raises(ValueError, match=match):
        verify(make_rule("sjd"), "independent", **arguments)
