"""Test helper shared by the KV-cache tests: a session's cache against a fresh prefill of the same tokens."""

import torch


def fresh_session(model, conditions, guided, tokens, K):
    """A new session of ``model``, prefilled, then fed image positions ``0 .. K - 1`` of ``tokens``."""
    fresh = model.start(conditions, None, guided)
    fresh.prefill()
    if K:
        fresh.forward(tokens[:, :K], start=0)
    return fresh


def assert_same_cache(session, fresh):
    """Layer by layer: same key shapes, keys and values equal up to 1e-5."""
    for a, b in zip(session.cache.layers, fresh.cache.layers):
        assert a.keys.shape == b.keys.shape
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-5)
