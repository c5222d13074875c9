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
