"""Test helper: the exact joint law of a tiny family checkpoint with V = 3 codes and N = 4 image tokens.

The law is computed from the family's plain forward (whole sequence, no cache, the family's own
positions), never from a csdgen session, so the chi-square tests compare a session's samples
with an independent computation (tests/test_lossless.py's ``chi_square_pvalue``).
"""

import itertools

from csdgen.sampling import target_probs


def exact_law(next_logits, sampling, V: int = 3, N: int = 4) -> dict[tuple, float]:
    """``{sequence: probability}`` over all ``V ** N`` code sequences.

    Args:
        next_logits: ``prefix (tuple of codes) -> (cond [V], uncond [V] or None)`` float logits of the
            next code after the prefix; sampling: the :class:`~csdgen.SamplingConfig` of the run.
    """
    probs = {}
    for t in range(N):
        for prefix in itertools.product(range(V), repeat=t):
            cond, uncond = next_logits(prefix)
            u = None if uncond is None else uncond[None, None]
            probs[prefix] = target_probs(cond[None, None].double(), None if u is None else u.double(), sampling)[0, 0]
    law = {}
    for seq in itertools.product(range(V), repeat=N):
        p = 1.0
        for t in range(N):
            p *= float(probs[seq[:t]][seq[t]])
        law[seq] = p
    return law
