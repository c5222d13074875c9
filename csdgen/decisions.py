"""How each image token was decided, and the uniform streams that decide it.

:class:`Decision` (the acceptance map's categories) and the kinds of uniform streams one
iteration draws, per image and forward, one number per window slot of each kind (drawn by
:func:`csdgen.sampling.stream_uniforms`; the engine's verification and loops and
:func:`csdgen.trees.verify_tree` read them by these indices). Below the engine, so that the
draft trees, the evaluation (maps, texture) and the demo read them without importing the engine;
:mod:`csdgen.engine` re-exports :class:`Decision` (``csdgen.Decision``).
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Decision", "STREAM_KINDS", "Y_STREAM", "ACCEPT_STREAM", "RESIDUAL_STREAM", "INIT_STREAM", "KEEP_STREAM",
           "COUPLED_STREAM"]


class Decision(IntEnum):
    """How an image token was decided (the acceptance map's categories)."""

    SAMPLED = 0  #: plain sample from q: an AR step, the prefill token, or a window's bonus token
    ACCEPTED = 1  #: draft accepted by the rule's exact test (the lossless ``u < min(1, q/p)``; Jacobi: a match)
    RELAXED = 2  #: draft accepted only thanks to the rule's relaxation
    RESAMPLED = 3  #: sampled from the residual after the draft was rejected


#: how many uniform streams one iteration draws per image and window slot
STREAM_KINDS = 6
#: the streams, by use: ``Y`` samples a token from ``q``; ``ACCEPT`` tests a draft; ``RESIDUAL`` samples
#: after a rejection; ``INIT`` draws new drafts; ``KEEP`` and ``COUPLED`` serve the drafts' refresh
Y_STREAM, ACCEPT_STREAM, RESIDUAL_STREAM, INIT_STREAM, KEEP_STREAM, COUPLED_STREAM = range(STREAM_KINDS)
