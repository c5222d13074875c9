"""The decoding loop: greedy equivalence, sample-for-sample identities, KV state, statistics, errors."""

import pytest
import torch

import csdgen
from csdgen import CSD, Decision, SamplingConfig
from csdgen.drafting import DRAFT_INITS
from csdgen.models import FunctionModel
from kv_check import assert_same_cache, fresh_session

GREEDY = SamplingConfig(temperature=0)
SAMPLED = SamplingConfig(guidance_scale=3.0, temperature=1.0)


@pytest.fixture(scope="module")
def ar_greedy(cached_model):
    return {batch: csdgen.generate(cached_model, [4, 0, 2][:batch], method="ar", sampling=GREEDY).tokens for batch in (1, 3)}


@pytest.mark.parametrize("draft_init", DRAFT_INITS)
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_sjd_and_csd_lambda0_equal_ar_token_for_token(cached_model, ar_greedy, draft_init, batch):
    classes = [4, 0, 2][:batch]
    for window in range(1, 33):
        for method, refresh in (("sjd", "independent"), (CSD(lam=0.0), "coupled")):
            out = csdgen.generate(cached_model, classes, method=method, window=window, sampling=GREEDY,
                                  draft_init=draft_init, refresh=refresh)
            assert torch.equal(out.tokens, ar_greedy[batch]), (window, method, refresh)


def test_greedy_default_csd_equals_ar_since_one_hot_targets_have_zero_entropy(cached_model, ar_greedy):
    for window in (2, 7, 16, 32):
        out = csdgen.generate(cached_model, [4, 0, 2], method="csd", window=window, sampling=GREEDY)
        assert torch.equal(out.tokens, ar_greedy[3])


def test_greedy_speculation_saves_steps_somewhere(cached_model, ar_greedy):
    out = csdgen.generate(cached_model, [4, 0, 2], method="sjd", window=8, sampling=GREEDY)
    assert torch.equal(out.tokens, ar_greedy[3])
    assert out.steps < cached_model.num_image_tokens  # the accept path was exercised
    assert sum(s.counts()["accepted"] for s in out.images) > 0


@pytest.mark.parametrize("draft_init", ["uniform", "onehot"])
@pytest.mark.parametrize("refresh", ["independent", "coupled"])
def test_csd_with_zero_relaxation_equals_sjd_sample_for_sample(cached_model, draft_init, refresh):
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


@pytest.mark.parametrize("method, sampling", [("sjd", SAMPLED), ("csd", SAMPLED), ("ar", SAMPLED), ("sjd", GREEDY)])
def test_kv_state_after_every_iteration_equals_fresh_prefill(cached_model, method, sampling):
    classes = [2, 4, 1]
    checked = []

    def check(info):
        K = info.session.cache_length
        assert K == int(info.committed.min()) - 1 or K == 0
        fresh = fresh_session(cached_model, classes, sampling.guided, info.tokens, K)
        assert_same_cache(info.session, fresh)
        checked.append(K)

    out = csdgen.generate(cached_model, classes, method=method, window=10, sampling=sampling, seed=2, callback=check)
    assert len(checked) == out.steps and checked[-1] == cached_model.num_image_tokens - 1


def test_statistics_are_consistent_per_image(cached_model):
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


def test_ar_takes_one_step_per_token(cached_model):
    out = csdgen.generate(cached_model, [1], method="ar", window=16, sampling=SAMPLED)
    stats = out.images[0]
    assert out.steps == stats.steps == cached_model.num_image_tokens and stats.step_compression == 1.0
    assert stats.counts()["sampled"] == cached_model.num_image_tokens
    assert out.settings["window"] == 1


def test_same_seed_same_images_other_seed_other_images(cached_model):
    a = csdgen.generate(cached_model, [0, 1], method="csd", sampling=SAMPLED, seed=1).tokens
    b = csdgen.generate(cached_model, [0, 1], method="csd", sampling=SAMPLED, seed=1).tokens
    c = csdgen.generate(cached_model, [0, 1], method="csd", sampling=SAMPLED, seed=2).tokens
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
    ],
)
def test_bad_arguments_raise_value_error(cached_model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        csdgen.generate(cached_model, [0], **kwargs)


def test_bad_conditions_raise_value_error(cached_model):
    with pytest.raises(ValueError, match="class index 9"):
        csdgen.generate(cached_model, [9])
    with pytest.raises(ValueError, match="unknown class 'dog'"):
        csdgen.generate(cached_model, ["dog"])


def test_nan_logits_raise_value_error():
    def fn(prefix):
        out = torch.zeros(prefix.shape[0], 4)
        return out if prefix.shape[1] < 2 else out + float("nan")

    model = FunctionModel(fn, 5, 4)
    with pytest.raises(ValueError, match="NaN logits"):
        csdgen.generate(model, batch_size=1, method="sjd", window=4)
    with pytest.raises(ValueError, match="NaN logits"):
        csdgen.generate(model, batch_size=1, method="ar")
