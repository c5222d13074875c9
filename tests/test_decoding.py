"""The decoding loop: greedy equivalence, sample-for-sample identities, KV state, statistics, errors."""

import pytest
import torch

import csdgen
from csdgen import CSD, Decision, SamplingConfig
from csdgen.drafting import DRAFT_INITS
from csdgen.models import FunctionModel
from kv_check import assert_rows_match_fresh

GREEDY = SamplingConfig(temperature=0)
SAMPLED = SamplingConfig(guidance_scale=3.0, temperature=1.0)


@pytest.fixture(scope="module")
def ar_greedy(cached_model):
    return {batch: csdgen.generate(cached_model, [4, 0, 2][:batch], method="ar", sampling=GREEDY).tokens for batch in (1, 3)}


@pytest.mark.parametrize("draft_init", DRAFT_INITS)
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_sjd_and_csd_lambda0_equal_ar_token_for_token(cached_model, ar_greedy, draft_init, batch):
    classes = [4, 0, 2][:batch]
    # every window for the first draft initialisation; for the others, the edges (1, 2, a row of 8 and its
    # neighbours, twice a row, the widest) and a few between: what a window changes does not depend on the drafts
    windows = range(1, 33) if draft_init == DRAFT_INITS[0] else (1, 2, 3, 5, 7, 8, 9, 16, 17, 31, 32)
    for window in windows:
        for method, refresh in (("sjd", "independent"), (CSD(lam=0.0), "coupled")):
            out = csdgen.generate(cached_model, classes, method=method, window=window, sampling=GREEDY,
                                  draft_init=draft_init, refresh=refresh)
            assert torch.equal(out.tokens, ar_greedy[batch]), (window, method, refresh)


def test_greedy_default_csd_equals_ar_since_one_hot_targets_have_zero_entropy(cached_model, ar_greedy):
    for window in (2, 7, 16, 32):
        out = csdgen.generate(cached_model, [4, 0, 2], method="csd", window=window, sampling=GREEDY)
        assert torch.equal(out.tokens, ar_greedy[3])


@pytest.mark.parametrize("engine", ["static", "eager"])
def test_greedy_speculation_saves_steps_somewhere(cached_model, ar_greedy, engine):
    out = csdgen.generate(cached_model, [4, 0, 2], method="sjd", window=8, sampling=GREEDY, engine=engine)
    assert torch.equal(out.tokens, ar_greedy[3])
    assert torch.equal(csdgen.generate(cached_model, [4, 0, 2], method="ar", sampling=GREEDY, engine=engine).tokens,
                       ar_greedy[3])
    assert out.steps < cached_model.num_image_tokens  # the accept path was exercised
    assert sum(s.counts()["accepted"] for s in out.images) > 0


@pytest.mark.parametrize("draft_init", ["uniform", "onehot"])
@pytest.mark.parametrize("refresh", ["independent", "coupled"])
@pytest.mark.device
def test_csd_with_zero_relaxation_equals_sjd_sample_for_sample(device_model, draft_init, refresh):
    cached_model = device_model  # the same forwards (shapes, rows) for every rule: identical on any device
    kwargs = dict(window=12, sampling=SAMPLED, draft_init=draft_init, refresh=refresh, seed=5)
    sjd = csdgen.generate(cached_model, [1, 3], method="sjd", **kwargs)
    for rule in (CSD(lam=0.0), CSD(lam=0.5, delta=0.0), csdgen.Addition(c=0.0)):
        other = csdgen.generate(cached_model, [1, 3], method=rule, **kwargs)
        assert torch.equal(other.tokens, sjd.tokens)
        assert [s.committed_per_step for s in other.images] == [s.committed_per_step for s in sjd.images]
        assert all(torch.equal(a.decisions, b.decisions) for a, b in zip(other.images, sjd.images))


def test_csd_accepts_more_than_sjd_on_average(cached_model):
    kwargs = dict(window=16, sampling=SAMPLED)
    sjd = sum(csdgen.generate(cached_model, [0, 1, 2, 3], method="sjd", seed=s, **kwargs).steps for s in range(3))
    csd = sum(csdgen.generate(cached_model, [0, 1, 2, 3], method="csd", seed=s, **kwargs).steps for s in range(3))
    assert csd < sjd


@pytest.mark.parametrize("method, sampling, window", [("sjd", SAMPLED, 10), ("csd", SAMPLED, 10), ("ar", SAMPLED, 1),
                                                      ("sjd", GREEDY, 10), ("csd", SAMPLED, "auto")])
@pytest.mark.parametrize("engine", ["static", "eager"])
@pytest.mark.device
def test_kv_state_of_every_row_after_every_iteration_equals_fresh_prefill(device_model, method, sampling, window, engine):
    cached_model = device_model
    classes = [2, 4, 1]
    checked = []

    def check(info):
        assert_rows_match_fresh(cached_model, classes, sampling.guided, info)
        checked.append(info.session.cache_lengths.tolist())
        assert info.decisions.shape == info.entropy.shape == info.tokens.shape

    out = csdgen.generate(cached_model, classes, method=method, window=window, sampling=sampling, seed=2, callback=check,
                          engine=engine)
    assert out.settings["engine"] == engine
    assert len(checked) == out.steps
    assert len({tuple(lengths) for lengths in checked if len(lengths) == 3 and len(set(lengths)) > 1}) > 0 or method == "ar"


@pytest.mark.device
def test_statistics_are_consistent_per_image(device_model):
    cached_model = device_model
    out = csdgen.generate(cached_model, [0, 1, 2, 3], method="csd", window=16, sampling=SAMPLED, seed=7)
    N = cached_model.num_image_tokens
    assert out.tokens.shape == (4, N) and out.tokens.dtype == torch.long
    assert out.batch_acceptance == "per-image"
    for stats in out.images:
        assert sum(stats.committed_per_step) == N
        assert len(stats.committed_per_step) == stats.steps <= out.steps
        assert all(1 <= c <= 16 for c in stats.committed_per_step)
        assert stats.step_compression == pytest.approx(N / stats.steps)
        counts = stats.counts()
        assert sum(counts.values()) == N
        # every forward but the one finishing an image ends with a resample or a bonus sample
        assert counts["sampled"] + counts["resampled"] >= stats.steps - 1
        assert stats.decisions[0] == Decision.SAMPLED
        assert (stats.entropy >= 0).all() and stats.entropy.shape == (N,)
    assert max(s.steps for s in out.images) == out.steps
    summary = out.summary()
    assert summary["settings"]["method"] == "csd" and summary["settings"]["rule"]["lam"] == 0.5


@pytest.mark.device
def test_ar_takes_one_step_per_token(device_model):
    cached_model = device_model
    out = csdgen.generate(cached_model, [1], method="ar", window=16, sampling=SAMPLED)
    stats = out.images[0]
    assert out.steps == stats.steps == cached_model.num_image_tokens and stats.step_compression == 1.0
    assert stats.counts()["sampled"] == cached_model.num_image_tokens
    assert out.settings["window"] == 1


def test_same_seed_same_images_other_seed_other_images(cached_model):
    """With a fixed window (window="auto" follows measured times, so it reproduces the law only)."""
    kwargs = dict(method="csd", sampling=SAMPLED, window=12)
    a = csdgen.generate(cached_model, [0, 1], seed=1, **kwargs).tokens
    b = csdgen.generate(cached_model, [0, 1], seed=1, **kwargs).tokens
    c = csdgen.generate(cached_model, [0, 1], seed=2, **kwargs).tokens
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_relaxed_decisions_only_under_relaxed_rules(cached_model):
    sjd = csdgen.generate(cached_model, [0, 1, 2], method="sjd", sampling=SAMPLED, seed=3)
    csd = csdgen.generate(cached_model, [0, 1, 2], method=CSD(lam=1.0, delta=1.0), sampling=SAMPLED, seed=3)
    assert all(s.counts()["relaxed"] == 0 for s in sjd.images)
    assert sum(s.counts()["relaxed"] for s in csd.images) > 0


def test_function_model_runs_and_matches_its_function():
    V, N = 5, 6
    table = torch.randn(N, V)
    model = FunctionModel(lambda prefix: table[prefix.shape[1]].expand(prefix.shape[0], V), N, V)
    out = csdgen.generate(model, batch_size=2, method="sjd", window=3, sampling=GREEDY)
    assert torch.equal(out.tokens, table.argmax(-1).expand(2, N))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"window": 0}, "window=0"),
        ({"window": 2.5}, "window=2.5"),
        ({"method": "medusa"}, "unknown method 'medusa'"),
        ({"draft_init": "zeros"}, "unknown draft initialisation 'zeros'"),
        ({"refresh": "sometimes"}, "unknown draft refresh 'sometimes'"),
        ({"sampling": SamplingConfig(top_k=49)}, "top_k=49 exceeds the codebook size V=48"),
        ({"method": CSD(lam=0.5), "window": -3}, "window=-3"),
        ({"window": "fast"}, "window='fast'"),
        ({"batch_size": 2.5}, r"batch_size=2.5: allowed None or an integer >= 1"),
        ({"batch_size": True}, r"batch_size=True: allowed None or an integer >= 1"),
        ({"batch_size": 3}, r"batch_size=3 differs from the 1 conditions given; allowed: None or 1"),
        ({"method": "sjd", "window": 1, "tree": (2, 2)}, r"tree=\(2, 2\) with window=1: .* allowed: window >= 2 or 'auto'"),
    ],
)
def test_bad_arguments_raise_value_error(cached_model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        csdgen.generate(cached_model, [0], **kwargs)


def test_a_batch_size_that_is_no_count_is_refused_before_the_model_starts():
    V, N = 5, 6
    model = FunctionModel(lambda prefix: torch.zeros(prefix.shape[0], V), N, V)
    for bad in (2.5, "2", 0, -1):  # zeros() takes 1 positional argument / '<' not supported, from inside the model
        with pytest.raises(ValueError, match=f"batch_size={bad!r}: allowed None or an integer >= 1"):
            csdgen.generate(model, None, batch_size=bad)
    import numpy as np

    assert csdgen.generate(model, None, batch_size=np.int64(2), method="ar").tokens.shape == (2, N)


def test_bad_conditions_raise_value_error(cached_model):
    with pytest.raises(ValueError, match="class index 9"):
        csdgen.generate(cached_model, [9])
    with pytest.raises(ValueError, match="unknown class 'dog'"):
        csdgen.generate(cached_model, ["dog"])


def _fixed_logits_model(V, N, special):
    """FunctionModel whose logits at prefix length ``t`` are ``special(t)`` (a ``[V]`` tensor)."""
    return FunctionModel(lambda prefix: special(prefix.shape[1]).expand(prefix.shape[0], V), N, V,
                         uncond_fn=lambda prefix: special(prefix.shape[1]).expand(prefix.shape[0], V))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("method", ["sjd", "ar", "csd"])
def test_nan_and_plus_inf_logits_raise_value_error(bad, method):
    def fn(prefix):
        out = torch.zeros(prefix.shape[0], 4)
        if prefix.shape[1] >= 2:
            out[:, 1] = bad
        return out

    model = FunctionModel(fn, 5, 4)
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        csdgen.generate(model, batch_size=1, method=method, window=4)


def test_a_position_with_no_allowed_token_raises_value_error():
    inf = float("inf")
    model = _fixed_logits_model(4, 5, lambda t: torch.full((4,), -inf) if t == 3 else torch.zeros(4))
    with pytest.raises(ValueError, match="no allowed token"):
        csdgen.generate(model, batch_size=2, method="sjd", window=3)


@pytest.mark.parametrize("guidance", [1.0, 3.0])
@pytest.mark.parametrize("method", ["ar", "sjd", CSD(lam=2.0, delta=1.0), csdgen.Addition(c=1.0)])
def test_minus_inf_in_both_rows_excludes_a_token_and_is_no_error(guidance, method):
    inf = float("inf")
    excluded = torch.tensor([-inf, 0.3, -inf, 1.0, 0.0, -inf])
    model = _fixed_logits_model(6, 12, lambda t: excluded)
    out = csdgen.generate(model, batch_size=8, method=method, window=5, sampling=SamplingConfig(guidance_scale=guidance), seed=1)
    assert set(out.tokens.unique().tolist()) <= {1, 3, 4}


def test_minus_inf_in_the_unconditional_row_only_is_named_as_such():
    inf = float("inf")
    cond = torch.tensor([0.5, 0.3, 1.0, 0.0])
    uncond = torch.tensor([-inf, 0.3, 1.0, 0.0])  # the conditional row allows token 0, the unconditional excludes it
    model = FunctionModel(lambda prefix: cond.expand(prefix.shape[0], 4), 5, 4,
                          uncond_fn=lambda prefix: uncond.expand(prefix.shape[0], 4))
    with pytest.raises(ValueError, match="logits disagree on which tokens are -inf .* guidance scale 2 .* allowed: -inf "
                                         "at the same tokens in both rows"):
        csdgen.generate(model, batch_size=2, method="sjd", window=3, sampling=SamplingConfig(guidance_scale=2.0))


def _hashed_logits_model(V=12, N=10, seed=0):
    """A FunctionModel with exactly reproducible prefix-dependent logits (no batching arithmetic)."""
    table = torch.randn(101, V, generator=torch.Generator().manual_seed(seed)) * 2

    def fn(prefix):
        key = (prefix * torch.arange(1, prefix.shape[1] + 1)).sum(-1) * 7 + prefix.shape[1]
        return table[key % 101]

    return FunctionModel(fn, N, V, uncond_fn=lambda prefix: table[(prefix.sum(-1) + 3) % 101] * 0.5), fn


@pytest.mark.parametrize("sampling", [SamplingConfig(top_k=3), SamplingConfig(top_p=0.9), SamplingConfig(guidance_scale=2.0, top_k=2)])
def test_relaxed_rules_commit_only_tokens_the_target_allows(sampling):
    """Every committed token has target probability > 0 given its prefix, recomputed position by position;
    Addition(c=1) accepts every draft, so without the guard nearly every uniform draft would break this."""
    from csdgen.acceptance import GSD, Lantern

    model, fn = _hashed_logits_model()
    emb = torch.randn(model.codebook_size, 4, generator=torch.Generator().manual_seed(1)) * 0.2
    rules = [csdgen.Addition(c=1.0), CSD(lam=5.0, delta=1.0), GSD(emb, radius=5, prob_gap=1.0, max_distance=10.0),
             Lantern(emb, k=8, delta=1.0)]
    for rule in rules:
        out = csdgen.generate(model, batch_size=16, method=rule, window=6, sampling=sampling, seed=3)
        for t in range(model.num_image_tokens):
            prefix = out.tokens[:, :t]
            q = csdgen.sampling.target_probs(fn(prefix)[:, None], model.uncond_fn(prefix)[:, None], sampling)[:, 0]
            assert (q.gather(1, out.tokens[:, t : t + 1]) > 0).all(), (rule, t)
        assert sum(s.counts()["relaxed"] for s in out.images) > 0, rule


def test_jacobi_acceptances_are_labelled_exact(cached_model):
    out = csdgen.generate(cached_model, [0, 1, 2], method="jacobi", window=8, sampling=GREEDY)
    counts = [s.counts() for s in out.images]
    assert sum(c["accepted"] for c in counts) > 0 and all(c["relaxed"] == 0 for c in counts)
    sampled = csdgen.generate(cached_model, [0, 1, 2], method="jacobi", window=8, sampling=SAMPLED, seed=4)
    assert all(s.counts()["relaxed"] == 0 for s in sampled.images)


@pytest.fixture(scope="module")
def float64_model(cached_model, test_device):
    from conftest import on_device

    return on_device(cached_model, test_device, torch.float64)


@pytest.mark.device
def test_an_image_does_not_depend_on_its_batch_float64(float64_model):
    """Image 5 (class 3) alone, in a batch of 4 and in a batch of 16 with other images around it:
    the same tokens and the same number of forwards."""
    kwargs = dict(method="csd", window=10, sampling=SAMPLED, seed=11)
    alone = csdgen.generate(float64_model, [3], image_indices=[5], **kwargs)
    four = csdgen.generate(float64_model, [0, 3, 1, 4], image_indices=[9, 5, 2, 7], **kwargs)
    classes16 = [i % 5 for i in range(16)]
    classes16[12] = 3
    indices16 = [100 + i for i in range(16)]
    indices16[12] = 5
    sixteen = csdgen.generate(float64_model, classes16, image_indices=indices16, **kwargs)
    for batch, at in ((four, 1), (sixteen, 12)):
        assert torch.equal(batch.tokens[at], alone.tokens[0])
        assert batch.images[at].steps == alone.images[0].steps
        assert batch.images[at].committed_per_step == alone.images[0].committed_per_step
        assert torch.equal(batch.images[at].decisions, alone.images[0].decisions)
    assert len({s.steps for s in sixteen.images}) > 1  # the other images finish at other steps
    assert not torch.equal(four.tokens[0], four.tokens[2])


def test_an_image_does_not_depend_on_its_batch_builtin_model():
    """The built-in model (float32): a batched kernel sums in another order than a single row's, so a
    draw within rounding of its threshold can tip and the image goes its own way; tokens are the
    wrong check. Fed the same tokens, the image's row in batches of 4 and 16 gives the logits of the
    image alone within 1e-4; each batch draws from the same distribution as the images alone (step
    compression within 10 % of the same images decoded one at a time)."""
    from csdgen.evaluation.agreement import teacher_forced_logits
    from csdgen.models.builtin import load_builtin_model

    model = load_builtin_model()
    kwargs = dict(method="csd", window=16, seed=2)
    alone = csdgen.generate(model, [1], image_indices=[3], **kwargs)
    four_classes, four_indices = [4, 1, 7, 9], [0, 3, 8, 9]
    four = csdgen.generate(model, four_classes, image_indices=four_indices, **kwargs)
    sixteen_classes = [(i * 3) % 20 if i != 6 else 1 for i in range(16)]
    fed = alone.tokens
    ref = teacher_forced_logits(model, [1], fed, guided=True)
    for classes, at in ((four_classes, 1), (sixteen_classes, 6)):
        tokens = fed.expand(len(classes), -1)  # every row fed the image's tokens
        for a, b in zip(teacher_forced_logits(model, classes, tokens, guided=True), ref):
            torch.testing.assert_close(a[at], b[0], atol=1e-4, rtol=1e-4)
    one_by_one = [csdgen.generate(model, [c], image_indices=[i], **kwargs).step_compression
                  for c, i in zip(four_classes, four_indices)]
    expected = sum(one_by_one) / len(one_by_one)
    assert abs(four.step_compression - expected) <= 0.1 * expected, (four.step_compression, one_by_one)


def test_model_defaults_fill_the_arguments_left_none(cached_model):
    import copy

    from csdgen.models.defaults import FAMILY_DEFAULTS

    model = copy.copy(cached_model)
    model.defaults = FAMILY_DEFAULTS["builtin"]
    out = csdgen.generate(model, [0])
    assert out.settings["guidance_scale"] == model.defaults.guidance_scale
    assert out.settings["rule"]["lam"] == model.defaults.lam and out.settings["rule"]["delta"] == model.defaults.delta
    assert out.settings["window"] == "auto" and out.settings["method"] == "csd"
    assert csdgen.generate(cached_model, [0], window=4).settings["guidance_scale"] == 1.0  # no defaults: reference


def test_builtin_model_carries_its_defaults():
    from csdgen.models.builtin import load_builtin_model
    from csdgen.models.defaults import FAMILY_DEFAULTS

    assert load_builtin_model().defaults == FAMILY_DEFAULTS["builtin"]


def test_auto_window_records_its_widths_and_matches_greedy_ar(cached_model, ar_greedy):
    out = csdgen.generate(cached_model, [4, 0, 2], method="sjd", window="auto", sampling=GREEDY)
    assert torch.equal(out.tokens, ar_greedy[3])
    assert len(out.widths) == out.steps - 1 and all(1 <= w <= csdgen.decoding.AUTO_MAX_WINDOW for w in out.widths)
    assert out.summary()["widths"] == out.widths


def test_first_iteration_crops_every_row_of_the_cache(cached_model, monkeypatch):
    """The eager engine's probe slot (the static engine's rollback is a length update: no probe)."""
    from csdgen.models._ragged import RaggedCache

    seen = []
    original = RaggedCache.truncate

    def spy(self, keep):
        seen.append((self.lengths.clone(), keep.clone(), self.cache.get_seq_length()))
        original(self, keep)
        seen[-1] += (self.cache.get_seq_length(),)

    monkeypatch.setattr(RaggedCache, "truncate", spy)
    for method in ("ar", "sjd"):
        seen.clear()
        csdgen.generate(cached_model, [0, 1], method=method, window=4, sampling=GREEDY, engine="eager")
        before, keep, width_before, width_after = seen[0]
        assert (keep < before).all() and width_after < width_before


def test_image_indices_are_checked(cached_model):
    with pytest.raises(ValueError, match="image_indices"):
        csdgen.generate(cached_model, [0, 1], image_indices=[0])
    with pytest.raises(ValueError, match="image_indices"):
        csdgen.generate(cached_model, [0], image_indices=[-1])


def test_profile_times_forward_and_verify(cached_model):
    out = csdgen.generate(cached_model, [0, 1], method="csd", window=8, sampling=SAMPLED, profile=True)
    assert out.timings["forward"] > 0 and out.timings["verify"] > 0


@pytest.mark.device
def test_runs_in_batches_give_the_same_images_at_any_batch_size(float64_model):
    """Exact in float64 (in float32 a batched kernel's rounding can tip a draw: tests compare logits there)."""
    from csdgen.runs import generate_batches

    cached_model = float64_model
    classes = [i % 5 for i in range(6)]
    kwargs = dict(method="csd", window=8, sampling=SAMPLED, seed=3)
    by_size = {}
    for size in (1, 4, 6):
        tokens = torch.zeros(6, cached_model.num_image_tokens, dtype=torch.long)
        for indices, result in generate_batches(cached_model, classes, batch_size=size, **kwargs):
            tokens[indices] = result.tokens
        by_size[size] = tokens
    assert torch.equal(by_size[1], by_size[4]) and torch.equal(by_size[1], by_size[6])


def test_code_logits_equal_the_full_output_layer_restricted_to_the_codebook(cached_model):
    """The fast output layer (codebook rows only) against the plain one: lm_head over the whole
    vocabulary, then the first V columns; through a session's prefill and window forward too."""
    V = cached_model.codebook_size
    hidden = torch.randn(2, 5, cached_model.backbone.config.hidden_size, generator=torch.Generator().manual_seed(0))
    full = cached_model.backbone.lm_head(hidden)
    assert full.shape[-1] > V
    torch.testing.assert_close(cached_model.code_logits(hidden), full[..., :V], rtol=1e-5, atol=1e-5)
    session = cached_model.start([1, 3], None, guided=True)
    first = session.prefill()
    tokens = torch.randint(V, (2, 6), generator=torch.Generator().manual_seed(1))
    window = session.forward(tokens, torch.zeros(2, dtype=torch.long))
    ids = torch.tensor([[V + 1], [V + 3], [V + cached_model.num_classes], [V + cached_model.num_classes]])
    plain = cached_model.backbone(input_ids=torch.cat([ids, torch.cat([tokens, tokens])], 1)).logits[..., :V]
    torch.testing.assert_close(first.cond[:, 0], plain[:2, 0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(first.uncond[:, 0], plain[2:, 0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(window.cond, plain[:2, 1:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(window.uncond, plain[2:, 1:], rtol=1e-4, atol=1e-4)


def test_image_indices_take_numpy_and_torch_integers_and_name_a_bare_int(cached_model):
    """image_indices=np.arange(2, 4) was refused as 'allowed one integer ... per image', and
    image_indices=5 ended in TypeError: 'int' object is not iterable."""
    import numpy as np

    plain = csdgen.generate(cached_model, [0, 1], window=4, seed=3, image_indices=[2, 3])
    for indices in (np.arange(2, 4), torch.tensor([2, 3]), [np.int64(2), np.int32(3)]):
        assert torch.equal(csdgen.generate(cached_model, [0, 1], window=4, seed=3, image_indices=indices).tokens,
                           plain.tokens)
    with pytest.raises(ValueError, match=r"^image_indices=5: allowed a list of one integer .* \(1 image\), e\.g\. \[5\]$"):
        csdgen.generate(cached_model, [0], window=4, image_indices=5)
    with pytest.raises(ValueError, match=r"^image_indices=\[1\.0\] \(1 value for 1 image\): allowed one integer in 0\.\..* per image$"):
        csdgen.generate(cached_model, [0], window=4, image_indices=[1.0])


@pytest.mark.parametrize("kwargs", [{"method": "ar"}, {"window": 4}, {"window": "auto"},
                                    {"method": "sjd", "window": 2, "tree": (2, 1)}])
def test_a_one_token_image_is_its_prefill(kwargs):
    """FunctionModel(..., num_image_tokens=1) is a valid model; every method ended in an IndexError
    in the verify step, which ran a window after the prefill had completed the image."""
    logits = torch.arange(8.0)
    model = FunctionModel(lambda prefix: logits.expand(prefix.shape[0], 8), num_image_tokens=1, codebook_size=8)
    result = csdgen.generate(model, None, batch_size=3, seed=0, sampling={"temperature": 0}, **kwargs)
    assert result.tokens.tolist() == [[7]] * 3 and result.steps == 1 and result.widths == []
    assert [(s.steps, s.committed_per_step) for s in result.images] == [(1, [1])] * 3


def test_kept_step_infos_show_their_own_forward(cached_model):
    """A callback that keeps each StepInfo (callback=history.append) read the engine's live buffers:
    every kept StepInfo showed the last forward's committed lengths and tokens."""
    history = []
    result = csdgen.generate(cached_model, [0, 1], window=4, seed=1, callback=history.append)
    N = cached_model.num_image_tokens
    committed = [info.committed.tolist() for info in history]
    assert committed[0] == [1, 1] and committed[-1] == [N, N] and len(history) == result.steps
    assert all(a <= b for earlier, later in zip(committed, committed[1:]) for a, b in zip(earlier, later))
    first = history[0]
    assert torch.equal(first.tokens[:, 0], result.tokens[:, 0]) and not torch.equal(first.tokens, result.tokens)


def test_a_first_window_that_reaches_the_image_end_can_commit_every_remaining_token():
    # the first iteration feeds one probe slot past the window to check the rollback; where the window
    # reaches the image's end there is no slot past it, and the window keeps all of its width
    logits = torch.tensor([4.0, -4.0])  # q(0) = 0.9997: a draft of token 0 is kept
    for N in (3, 5):
        model = FunctionModel(lambda prefix: logits.expand(prefix.shape[0], 2), N, 2)
        seen = []
        result = csdgen.generate(model, batch_size=64, method="sjd", window=16, seed=0, refresh="independent",
                                 draft_init="onehot",
                                 callback=lambda step: seen.append(step.committed.clone()))
        assert result.widths[0] == N - 1  # the window: every position after the prefill's
        # after the prefill (1) and one window, the images whose drafts were all token 0 are whole
        assert int(seen[1].max()) == N, (N, sorted(set(seen[1].tolist())))


def test_image_indices_are_refused_before_the_model_starts():
    # a static session allocates its KV cache (and compiles, if asked) at start: a bad index is refused first
    V, N = 5, 6
    model = FunctionModel(lambda prefix: torch.zeros(prefix.shape[0], V), N, V)
    started = []
    start = model.start
    model.start = lambda *args: started.append(args) or start(*args)
    for bad, match in (([0, 0], "index 0 is given twice"), ([-1, 2], "image_indices"), ([1], "image_indices")):
        with pytest.raises(ValueError, match=match):
            csdgen.generate(model, None, batch_size=2, image_indices=bad)
    assert started == []
    csdgen.generate(model, None, batch_size=2, image_indices=[4, 9], method="ar")
    assert len(started) == 1


def test_a_batch_size_with_no_conditions_names_what_is_allowed():
    model = FunctionModel(lambda prefix: torch.zeros(prefix.shape[0], 5), 6, 5)
    with pytest.raises(ValueError, match=r"batch_size=2 differs from the 0 conditions given; allowed: a list of "
                                         r"conditions with one per image"):
        csdgen.generate(model, [], batch_size=2)
