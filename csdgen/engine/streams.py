"""The uniform streams of one iteration: per image and forward, one number per window slot of each
kind (drawn by :func:`csdgen.sampling.stream_uniforms`; :func:`csdgen.engine.verification.verify`,
the loops and :func:`csdgen.trees.verify_tree` read them by these indices)."""

_KINDS = 6
_Y, _ACCEPT, _RESIDUAL, _INIT, _KEEP, _COUPLED = range(_KINDS)
