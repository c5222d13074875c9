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


def assert_rows_match_fresh(model, conditions, guided, info):
    """Per-row sessions: every row's cached entries equal a fresh single-image session fed its committed tokens.

    ``info`` is a :class:`csdgen.engine.StepInfo`; row ``i`` of its session is image ``info.rows[i]``,
    holding ``session.cache_lengths[i]`` image positions (the committed length minus one). The row's
    sequence (holes skipped) and its keys and values must equal the fresh session's.
    """
    session = info.session
    lengths = session.cache_lengths
    B = session.batch_size
    for i, image in enumerate(info.rows.tolist()):
        K = int(lengths[i])
        assert K == int(info.committed[image]) - 1 or K == 0
        fresh = model.start([conditions[image]], None, guided)
        fresh.prefill()
        if K:
            fresh.forward(info.tokens[image : image + 1, :K], start=torch.tensor([0]))
        pairs = [(i, 0)] + ([(B + i, 1)] if guided else [])
        for row, fresh_row in pairs:
            assert torch.equal(session.row_sequence(row), fresh.row_sequence(fresh_row))
        for layer in range(len(fresh.cache.layers)):
            for row, fresh_row in pairs:
                keys, values = session.kv.row_entries(layer, row)
                fresh_keys, fresh_values = fresh.kv.row_entries(layer, fresh_row)
                assert keys.shape == fresh_keys.shape
                torch.testing.assert_close(keys, fresh_keys, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(values, fresh_values, atol=1e-5, rtol=1e-5)


def assert_next_window_matches_alone(model, session, tokens, guided, tol):
    """The admission tests' next forward: rows of classes 0, 1, 4 at image positions 7, 3, 0 (windows
    of 4, 2 and 3 valid slots) give, row by row, the logits of each row's own fresh session fed the
    same tokens (``tokens`` ``[3, N]``; ``tol`` the absolute and relative tolerance)."""
    start = torch.tensor([7, 3, 0])
    window = torch.stack([tokens[0, 7:11], tokens[1, 3:7], tokens[2, 0:4]])
    out = session.forward(window, start=start, widths=torch.tensor([4, 2, 3]))
    for row, (cls, K, width) in enumerate([(0, 7, 4), (1, 3, 2), (4, 0, 3)]):
        alone = fresh_session(model, [cls], guided, tokens[row : row + 1], K)
        ref = alone.forward(window[row : row + 1], start=torch.tensor([K]), widths=torch.tensor([width]))
        torch.testing.assert_close(out.cond[row, :width], ref.cond[0, :width], atol=tol, rtol=tol)
        if guided:
            torch.testing.assert_close(out.uncond[row, :width], ref.uncond[0, :width], atol=tol, rtol=tol)


def generate_checking_every_iteration(model, conditions, **generate_kwargs):
    """``csdgen.generate(model, conditions, **generate_kwargs)`` whose callback checks, after every
    iteration, each row's cache against a fresh prefill (:func:`assert_rows_match_fresh`, guided as
    ``generate_kwargs["sampling"]``). Returns ``(result, cache lengths per iteration)``."""
    import csdgen

    guided = generate_kwargs["sampling"].guided
    checked = []

    def check(info):
        assert_rows_match_fresh(model, conditions, guided, info)
        checked.append(info.session.cache_lengths.tolist())

    return csdgen.generate(model, conditions, callback=check, **generate_kwargs), checked


def generate_recording_row_sequences(model, conditions, **generate_kwargs):
    """``csdgen.generate`` (guided) recording, after every iteration, each image's cached cond and
    uncond row sequences. Returns ``(result, {image: (cond row ids, uncond row ids)})`` of the last iteration."""
    import csdgen

    seen = {}

    def record(info):
        B = info.session.batch_size
        for i, image in enumerate(info.rows.tolist()):
            seen[image] = (info.session.row_sequence(i).tolist(), info.session.row_sequence(B + i).tolist())

    return csdgen.generate(model, conditions, callback=record, **generate_kwargs), seen
