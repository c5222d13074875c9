"""Lossless in distribution: SJD reproduces a known joint law; a deliberately wrong rule does not.

Every image of a batch is an independent sample (each walks its own window with its own
random stream; with ``window="auto"`` the shared width depends only on the past), so one batch
of 24,000 images is 24,000 samples. Images finish at different steps (checked), so the tests
cover images leaving the batch while others decode. Seeds are fixed, so the outcomes below are deterministic; the
thresholds say how surprising they would be by chance.
"""

import pytest
import torch
from scipy.stats import chisquare

import csdgen
from csdgen.acceptance import SJD

SAMPLES = 24_000
P_PASS = 1e-3  # a correct sampler fails this with probability 0.001
P_FAIL = 1e-6  # the wrong control must be this far off


def chi_square_pvalue(tokens: torch.Tensor, law: dict[tuple, float]) -> float:
    """Pearson chi-square p-value of sampled sequences against an exact law (bins with < 5 expected merged)."""
    V, N = 3, tokens.shape[1]
    weights = torch.tensor([V ** (N - 1 - s) for s in range(N)])
    counts = torch.bincount((tokens * weights).sum(-1), minlength=V**N).tolist()
    observed, expected, rest_o, rest_e = [], [], 0, 0.0
    for index, seq in enumerate(sorted(law)):
        e = law[seq] * len(tokens)
        if e < 5:
            rest_o, rest_e = rest_o + counts[index], rest_e + e
        else:
            observed.append(counts[index])
            expected.append(e)
    if rest_e > 0:
        observed.append(rest_o)
        expected.append(rest_e)
    total = sum(expected)
    expected = [e * sum(observed) / total for e in expected]
    return chisquare(observed, expected).pvalue


def run(known_joint, **kwargs):
    return csdgen.generate(known_joint.model, batch_size=SAMPLES, sampling=known_joint.sampling, **kwargs).tokens


@pytest.mark.parametrize(
    "draft_init, refresh, window",
    [
        ("uniform", "independent", 3),
        ("onehot", "independent", 4),
        ("uniform", "coupled", 3),
        ("onehot", "coupled", 4),
        ("repeat-horizontal", "independent", 2),
        ("repeat-vertical", "coupled", 4),
    ],
)
def test_sjd_reproduces_the_target_joint(known_joint, draft_init, refresh, window):
    out = csdgen.generate(known_joint.model, batch_size=SAMPLES, sampling=known_joint.sampling, method="sjd", window=window,
                          draft_init=draft_init, refresh=refresh, seed=11)
    assert len({s.steps for s in out.images}) > 1  # images finish at different steps
    assert chi_square_pvalue(out.tokens, known_joint.joint()) > P_PASS


@pytest.mark.parametrize("method", ["sjd", "jacobi"])
def test_auto_window_reproduces_the_target_joint(known_joint, method):
    out = csdgen.generate(known_joint.model, batch_size=SAMPLES, sampling=known_joint.sampling, method=method, window="auto",
                          seed=12)
    assert len(out.widths) >= 2
    assert chi_square_pvalue(out.tokens, known_joint.joint()) > P_PASS


def test_ar_reproduces_the_target_joint(known_joint):
    assert chi_square_pvalue(run(known_joint, method="ar", seed=3), known_joint.joint()) > P_PASS


class ResampleFromTarget(SJD):
    """A classic bug: after a rejection, sample from q instead of the residual norm(max(0, q - p))."""

    name = "wrong-residual"
    lossless = False

    def residual(self, draft_probs, target_probs, target_sample):
        return target_probs


def test_the_test_fails_a_wrong_rule(known_joint):
    tokens = run(known_joint, method=ResampleFromTarget(), window=3, draft_init="uniform", seed=11)
    assert chi_square_pvalue(tokens, known_joint.joint()) < P_FAIL


def test_relaxed_csd_is_not_lossless_here(known_joint):
    """CSD with a large relaxation changes the law measurably (it is lossy by design)."""
    tokens = run(known_joint, method=csdgen.CSD(lam=2.0, delta=1.0), window=4, draft_init="uniform", seed=11)
    assert chi_square_pvalue(tokens, known_joint.joint()) < P_FAIL
