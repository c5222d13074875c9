"""The acceptance arithmetic: float32 whatever the model's dtype, and the target entropy computed once.

A bfloat16 model's logits become float32 targets (csdgen.sampling.target_probs), so acceptance
probabilities, residuals and the entropy CSD relaxes by are float32: a bfloat16 ratio ``q(x) / p(x)``
would carry errors of ~0.4 %, and a bfloat16 softmax over thousands of tokens far more. The decoding
loop computes the entropy of every window's targets once (its statistics) and CSD's relaxation
takes it from there instead of computing it again.
"""

import pytest
import torch

import csdgen
from csdgen import SamplingConfig
from csdgen.acceptance import CSD, SJD, Addition, JacobiMatch, Lantern
from csdgen.engine import loop as loop_module
from csdgen.models import ClassConditionalLlama
from csdgen.sampling import ENTROPY_EPS, entropy, sample, target_probs

B, W, V = 3, 5, 257


def bf16_window(seed=0):
    g = torch.Generator().manual_seed(seed)
    cond = (torch.randn(B, W, V, generator=g) * 3).to(torch.bfloat16)
    uncond = (torch.randn(B, W, V, generator=g) * 3).to(torch.bfloat16)
    p = torch.softmax(torch.randn(B, W, V, generator=g) * 2, -1)  # float32: the loop's draft distributions
    x = sample(p, torch.rand(B, W, generator=g, dtype=torch.float64))
    y = sample(p.flip(-1), torch.rand(B, W, generator=g, dtype=torch.float64))
    return cond, uncond, p, x, y


RULES = [SJD(), CSD(), CSD(entropy_unit="normalized"), Addition(c=0.1), JacobiMatch(),
         Lantern(codebook=torch.randn(V, 4, generator=torch.Generator().manual_seed(1)), k=8, delta=0.1)]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: repr(r)[:30])
def test_bfloat16_logits_give_float32_acceptance_computed_as_in_float64(rule):
    cond, uncond, p, x, y = bf16_window()
    config = SamplingConfig(guidance_scale=3.0, temperature=0.9, top_k=200)
    q = target_probs(cond, uncond, config)
    assert q.dtype == torch.float32
    b = rule.acceptance_probability(x, p, q, y)
    residual = rule.residual(p, q, y)
    assert b.dtype == torch.float32 and residual.dtype == torch.float32
    # the same bfloat16 logits in float64 throughout: float32 keeps ~1e-7, bfloat16 arithmetic would be off by ~1e-3
    q64 = target_probs(cond.double(), uncond.double(), config)
    b64 = rule.acceptance_probability(x, p.double(), q64, y)
    assert torch.allclose(b.double(), b64.double(), atol=2e-6, rtol=0)
    assert torch.allclose(residual.double(), rule.residual(p.double(), q64, y).double(), atol=2e-6, rtol=0)


def test_a_bfloat16_model_decodes_with_float32_acceptance():
    model = ClassConditionalLlama.random(codebook_size=32, num_classes=3, grid=(4, 4), hidden_size=32, seed=0)
    model.backbone.to(torch.bfloat16)
    seen = []

    class Spy(CSD):
        def acceptance_probability(self, draft_tokens, draft_probs, target_probs, target_sample, **kwargs):
            b = super().acceptance_probability(draft_tokens, draft_probs, target_probs, target_sample, **kwargs)
            seen.append((draft_probs.dtype, target_probs.dtype, b.dtype, kwargs["target_entropy"].dtype))
            return b

    result = csdgen.generate(model, [0, 1], method=Spy(), window=4, seed=0, engine="eager",
                             sampling={"guidance_scale": 2.0})
    assert result.steps < 16 and seen
    assert set(seen) == {(torch.float32,) * 4}


@pytest.mark.parametrize("unit", ["nats", "normalized"])
def test_csd_given_the_entropy_decides_as_computing_it(unit):
    cond, uncond, p, x, y = bf16_window(2)
    q = target_probs(cond, uncond, SamplingConfig(guidance_scale=2.0))
    rule = CSD(lam=0.4, delta=0.9, entropy_unit=unit)
    given = rule.acceptance_probability(x, p, q, y, target_entropy=entropy(q, eps=ENTROPY_EPS))
    assert torch.equal(given, rule.acceptance_probability(x, p, q, y))
    other_floor = CSD(lam=0.4, delta=0.9, entropy_unit=unit, eps=1e-3)  # its own floor: computes its own
    wrong = torch.zeros(B, W)
    assert torch.equal(other_floor.acceptance_probability(x, p, q, y, target_entropy=wrong),
                       other_floor.acceptance_probability(x, p, q, y))


def test_the_loop_computes_each_window_entropy_once(cached_model, monkeypatch):
    """CSD's relaxation takes the loop's entropy (mutation: verify() not given it -> two per iteration)."""
    calls = []

    def counting(probs, **kwargs):
        if probs.dim() == 3:  # a window's [A, W, V] targets (the prefill's are [A, V])
            calls.append(tuple(probs.shape))
        return entropy(probs, **kwargs)

    monkeypatch.setattr(loop_module, "entropy", counting)
    monkeypatch.setattr("csdgen.acceptance.entropy", counting)
    result = csdgen.generate(cached_model, [0, 1], method="csd", window=4, seed=0, engine="eager")
    assert len(calls) == result.steps - 1
