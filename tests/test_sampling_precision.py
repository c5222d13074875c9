"""csdgen.sampling.sample keeps every token's probability, the smallest included, at every vocabulary size.

``sample`` maps a uniform ``u`` to a token by the inverse CDF, so the probability it gives token
``k`` is the length of the ``u`` interval mapped to ``k``: found here by bisection on ``u`` and
compared with ``q[k]``. Large vocabularies take the two-level path (a block by the cumsum of the
blocks' float32 masses, then a token of the block); a plain float32 cumsum fails these tests
(tokens of 1e-8 after a mass of 0.5 come out at 0 or 6e-8), which is why sampling is not one.
"""

import pytest
import torch

from csdgen import sampling
from csdgen.sampling import BLOCKED_SAMPLING_MIN_V, SAMPLE_BLOCK, sample


def hard_distribution(V: int, seed: int = 0) -> torch.Tensor:
    """``[V]`` float32: a mass of 0.5 on token 3, tokens of 1e-8 after it, zero-weight tokens and whole
    zero blocks, a padded last block (V not a multiple of the block), the rest random."""
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(V, generator=g) ** 4
    q[10 : 10 + 2 * SAMPLE_BLOCK] = 0  # whole zero blocks
    q[torch.randperm(V, generator=g)[: V // 5]] = 0  # scattered zeros
    q[5:9] = 1e-8
    q = q / q.sum() * 0.5
    q[3] = 0.5
    return q.float()


def implied_probabilities(q: torch.Tensor, tokens: torch.Tensor, steps: int = 60) -> torch.Tensor:
    """``[len(tokens)]`` float64: the ``u`` measure ``sample`` maps to each token (bisection on the boundaries)."""
    def first_u_reaching(k: torch.Tensor) -> torch.Tensor:  # inf{u : sample(u) >= k}, per token
        lo, hi = torch.zeros(len(k), dtype=torch.float64), torch.ones(len(k), dtype=torch.float64)
        rows = q.expand(len(k), -1)
        for _ in range(steps):
            mid = (lo + hi) / 2
            reached = sample(rows, mid) >= k
            hi, lo = torch.where(reached, mid, hi), torch.where(reached, lo, mid)
        return hi

    return first_u_reaching(tokens + 1) - first_u_reaching(tokens)


@pytest.mark.parametrize("V", [BLOCKED_SAMPLING_MIN_V + 77, 1000])
def test_every_token_keeps_its_probability(V):
    q = hard_distribution(V)
    tokens = torch.tensor([3, 5, 6, 8, 2, V - 1, V - 2, 300, 1000 % V, V // 2])
    expected = q.double()[tokens] / q.double().sum()
    assert torch.allclose(implied_probabilities(q, tokens), expected, rtol=1e-5, atol=1e-15)


def test_zero_weight_tokens_are_never_drawn_even_at_block_boundaries():
    V = BLOCKED_SAMPLING_MIN_V + 77
    q = hard_distribution(V, seed=1)
    blocks = torch.nn.functional.pad(q, (0, -V % SAMPLE_BLOCK)).view(-1, SAMPLE_BLOCK).sum(-1).double().cumsum(0)
    edges = blocks / blocks[-1]
    u = torch.cat([edges, torch.nextafter(edges, torch.zeros_like(edges)), torch.linspace(0, 1, 20001, dtype=torch.float64)])
    u = u[u < 1]
    drawn = sample(q.expand(len(u), -1), u)
    assert (q[drawn] > 0).all()


def test_large_vocabularies_draw_what_the_float64_cumsum_draws():
    g = torch.Generator().manual_seed(2)
    q = torch.softmax(torch.randn(4, 8, 8192, generator=g) * 3, -1)
    u = torch.rand(4, 8, 50, generator=g, dtype=torch.float64)
    rows = q[:, :, None].expand(4, 8, 50, 8192)
    cdf = rows.double().cumsum(-1)
    exact = torch.searchsorted(cdf, (u * cdf[..., -1]).unsqueeze(-1), right=True).squeeze(-1)
    assert (sample(rows, u) == exact).float().mean() > 0.999


def test_a_float32_cumsum_would_lose_the_small_tokens(monkeypatch):
    """The control: the test above catches a float32 cumulative sum."""
    def float32_sample(probs, uniforms):
        cdf = probs.float().cumsum(-1)
        index = torch.searchsorted(cdf, (uniforms * cdf[..., -1].double()).float().unsqueeze(-1), right=True)
        return index.squeeze(-1).clamp_(max=probs.shape[-1] - 1)

    monkeypatch.setattr(sampling, "_sample_blocked", float32_sample)
    with pytest.raises(AssertionError):
        test_every_token_keeps_its_probability(BLOCKED_SAMPLING_MIN_V + 77)
