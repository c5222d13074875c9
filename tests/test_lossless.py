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
from csdgen.sampling import SamplingConfig

from conftest import KnownJoint

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



class LongerJoint(KnownJoint):
    """The known joint over N = 6 positions (729 sequences): long enough for a wide window to leave
    drafts that a 1-wide forward passes over and a later window tests."""

    N = 6


@pytest.fixture(scope="module")
def longer_joint():
    return LongerJoint(SamplingConfig(guidance_scale=2.0, temperature=1.0))


def _force_widths(monkeypatch, widths):
    """Make ``window="auto"`` walk a fixed width cycle (clamped to the widest window left)."""
    from csdgen.engine.window import _AutoWindow

    cycle = iter(widths * 100)
    monkeypatch.setattr(_AutoWindow, "choose", lambda self, limit, rows=1, lag=1.0: min(next(cycle), limit))


#: widths 5, 1, 3: the first forward drafts positions 1-4, the 1-wide one tests none, the 3-wide
#: one tests the drafts at c, c + 1 that the first left (their draft distributions come from the ring)
CYCLE = [5, 1, 3, 1]


@pytest.mark.parametrize("refresh", ["independent", "coupled"])
def test_drafts_carried_past_a_narrower_window_keep_the_target_joint(longer_joint, monkeypatch, refresh):
    """A 1-wide forward leaves the drafts past its end, and their draft distributions (the ring
    ``draft_probs``), to the next wider forward, which tests them; the joint law stays exact."""
    _force_widths(monkeypatch, CYCLE)
    out = csdgen.generate(longer_joint.model, batch_size=SAMPLES, sampling=longer_joint.sampling, method="sjd",
                          window="auto", draft_init="uniform", refresh=refresh, seed=13)
    assert out.widths[:3] == [5, 1, 3]
    assert chi_square_pvalue(out.tokens, longer_joint.joint()) > P_PASS


def test_the_test_fails_drafts_carried_with_the_wrong_distribution(longer_joint, monkeypatch):
    """Control: forget a draft's distribution once a narrower forward passed over it (judge it as
    if drawn uniformly, as a buggy carry would); the same run fails the test."""
    from csdgen.engine.loop import _Loop

    keep = _Loop._keep_drafts

    def forgetful(self, rows, c, q, widths):
        if q.shape[1] == 1:  # a 1-wide forward: the drafts it passed over lose their distributions
            self.draft_probs[rows] = 1.0 / q.shape[-1]
        keep(self, rows, c, q, widths)

    monkeypatch.setattr(_Loop, "_keep_drafts", forgetful)
    _force_widths(monkeypatch, CYCLE)
    out = csdgen.generate(longer_joint.model, batch_size=SAMPLES, sampling=longer_joint.sampling, method="sjd",
                          window="auto", draft_init="uniform", refresh="independent", seed=13)
    assert chi_square_pvalue(out.tokens, longer_joint.joint()) < P_FAIL
