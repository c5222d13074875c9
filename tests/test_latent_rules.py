"""GSD and LANTERN: reduction to SJD, relations to SJD (hypothesis), neighbour tables, memory."""

import resource

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import csdgen
from csdgen.acceptance import GSD, SJD, Lantern, make_rule
from csdgen.codebook import neighbour_table

from test_acceptance import windows


def codebook_for(V, seed=0, scale=0.5):
    return torch.randn(V, 6, generator=torch.Generator().manual_seed(seed)) * scale


@settings(max_examples=80, deadline=None)
@given(windows())
def test_zero_relaxation_is_exactly_sjd(w):
    x, p, q = w
    emb = codebook_for(q.shape[-1])
    exact = SJD().acceptance_probability(x, p, q, x)
    assert torch.equal(GSD(emb, radius=0).acceptance_probability(x, p, q, x), exact)
    assert torch.equal(Lantern(emb, k=5, delta=0.0).acceptance_probability(x, p, q, x), exact)
    assert torch.equal(Lantern(emb, k=5, delta=0.3, cap=1.0).acceptance_probability(x, p, q, x), exact)


@settings(max_examples=80, deadline=None)
@given(windows(), st.floats(0, 1), st.floats(1, 5))
def test_lantern_never_accepts_less_than_sjd(w, delta, cap):
    x, p, q = w
    emb = codebook_for(q.shape[-1])
    exact = SJD().acceptance_probability(x, p, q, x)
    for rule in (Lantern(emb, k=8, delta=delta), Lantern(emb, k=8, delta=delta, cap=cap)):
        b = rule.acceptance_probability(x, p, q, x)
        assert (b >= exact).all() and (b <= 1).all()


def expected_acceptance(rule, p, q):
    """E_{x ~ p}[b(x)] for one position: every token as a draft."""
    V = p.shape[-1]
    xs = torch.arange(V)[None]
    return (p * rule.acceptance_probability(xs, p.expand(1, V, V), q.expand(1, V, V), xs)[0]).sum()


def test_gsd_accepts_at_least_as_often_as_sjd_on_average_but_not_always():
    """Averaged over random (p, q), GSD's acceptance is higher; for single (p, q) it can be lower
    (a token's cluster may hold tokens whose draft mass exceeds their target mass)."""
    g = torch.Generator().manual_seed(0)
    gaps = []
    for _ in range(400):
        V = int(torch.randint(3, 30, (1,), generator=g))
        emb = codebook_for(V, seed=int(torch.randint(1000, (1,), generator=g)), scale=0.3)
        p = (torch.randn(1, 1, V, generator=g) * 3).softmax(-1)
        q = (torch.randn(1, 1, V, generator=g) * 3).softmax(-1)
        gaps.append(float(expected_acceptance(GSD(emb), p, q) - expected_acceptance(SJD(), p, q)))
    gaps = torch.tensor(gaps)
    assert gaps.mean() > 0.01
    assert gaps.min() < 0  # the documented exception exists


def test_gsd_hand_computed_cluster():
    # q sorted: t0 0.5, t1 0.38, t2 0.12; gap(t0, t1) = 0.12 < 0.15, gap(t1, t2) = 0.26: C(t1) = {t0, t1}
    emb = torch.zeros(3, 2)  # all codes coincide: distance 0
    p = torch.tensor([[[0.5, 0.5, 0.0]]])
    q = torch.tensor([[[0.5, 0.38, 0.12]]])
    b = GSD(emb).acceptance_probability(torch.tensor([[1]]), p, q, torch.tensor([[1]]))
    assert b.item() == pytest.approx((0.5 + 0.38) / 1.0)  # SJD would give 0.38 / 0.5 = 0.76
    far = torch.tensor([[0.0, 0.0], [5.0, 0.0], [0.0, 0.0]])  # t1 far from t0 in the codebook: C(t1) = {t1}
    assert GSD(far).acceptance_probability(torch.tensor([[1]]), p, q, torch.tensor([[1]])).item() == pytest.approx(0.76)


def test_lantern_hand_computed():
    # codebook on a line: neighbours of 0 are 1, 2, 3 in that order
    emb = torch.tensor([[0.0], [1.0], [2.1], [3.3]])
    q = torch.tensor([[[0.1, 0.05, 0.1, 0.75]]])
    p = torch.tensor([[[0.4, 0.2, 0.2, 0.2]]])
    x = torch.tensor([[0]])
    # delta 0.16: add q(1) = 0.05 (cum 0.05), q(2) = 0.1 (cum 0.15), not q(3) (cum 0.9): q~ = 0.25
    assert Lantern(emb, k=3, delta=0.16).acceptance_probability(x, p, q, x).item() == pytest.approx(0.25 / 0.4)
    assert Lantern(emb, k=3, delta=0.16, cap=2.0).acceptance_probability(x, p, q, x).item() == pytest.approx(0.2 / 0.4)


def test_neighbour_table_matches_brute_force_and_is_cached():
    emb = codebook_for(300, seed=3)
    table = neighbour_table(emb, 10, chunk=64)
    d = torch.cdist(emb, emb).pow(2)
    d.fill_diagonal_(float("inf"))
    brute = d.topk(10, largest=False)
    torch.testing.assert_close(table.distances(torch.arange(300)), brute.values, atol=1e-4, rtol=1e-4)
    assert table.ids.dtype == torch.int32 and (table.ids != torch.arange(300)[:, None]).all()
    assert neighbour_table(emb.clone(), 10) is table  # same content: cached
    with pytest.raises(ValueError, match="k=300"):
        neighbour_table(emb, 300)


def test_rules_need_a_codebook_and_generate_takes_it_from_the_model(cached_model):
    # no model here: the message says what to give, not that "this model" has none
    with pytest.raises(ValueError, match=r"needs codebook embeddings .*make_rule\('gsd', codebook=model.codebook_embeddings\(\)\)\); got none"):
        make_rule("gsd")
    with pytest.raises(ValueError, match=r"got shape \(4,\)"):
        make_rule("lantern", codebook=torch.zeros(4))
    with pytest.raises(ValueError, match="needs the model's codebook"):
        csdgen.generate(cached_model, [0], method="lantern")  # the random Llama has no tokenizer


def test_peak_memory_at_v16384_stays_small():
    """GSD and LANTERN at V = 16384, k = 1000, window 16, batch 2: a few hundred MB at most."""
    V = 16384
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    emb = torch.randn(V, 8, generator=torch.Generator().manual_seed(0))
    lantern, gsd = Lantern(emb, k=1000, delta=0.1), GSD(emb)
    x = torch.randint(V, (2, 16))
    p = torch.rand(2, 16, V).softmax(-1)
    q = torch.rand(2, 16, V).softmax(-1)
    for rule in (lantern, gsd):
        assert rule.acceptance_probability(x, p, q, x).shape == (2, 16)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 400, f"peak resident memory grew by {grown_mb:.0f} MB"


def test_zero_relaxation_equals_sjd_sample_for_sample_in_the_loop(cached_model):
    emb = codebook_for(cached_model.codebook_size, seed=4)
    # one refresh for all (SJD's default is coupled, the latent rules' independent)
    kwargs = dict(window=12, sampling=csdgen.SamplingConfig(guidance_scale=3.0), seed=9, draft_init="onehot",
                  refresh="independent")
    sjd = csdgen.generate(cached_model, [1, 3], method="sjd", **kwargs)
    for rule in (GSD(emb, radius=0), Lantern(emb, k=20, delta=0.0), Lantern(emb, k=20, delta=0.5, cap=1.0)):
        other = csdgen.generate(cached_model, [1, 3], method=rule, **kwargs)
        assert torch.equal(other.tokens, sjd.tokens)
        assert all(torch.equal(a.decisions, b.decisions) for a, b in zip(other.images, sjd.images))


def test_relaxed_latent_rules_save_steps_in_the_loop(cached_model):
    emb = codebook_for(cached_model.codebook_size, seed=4, scale=0.1)
    kwargs = dict(window=16, sampling=csdgen.SamplingConfig(guidance_scale=3.0), draft_init="onehot")
    steps = {name: sum(csdgen.generate(cached_model, [0, 1, 2, 3], method=rule, seed=s, **kwargs).steps for s in range(3))
             for name, rule in (("sjd", SJD()), ("lantern", Lantern(emb, k=20, delta=0.3)), ("gsd", GSD(emb)))}
    assert steps["lantern"] < steps["sjd"] and steps["gsd"] < steps["sjd"]


def test_latent_rules_get_one_hot_drafts_by_default_and_refuse_uniform(cached_model):
    emb = codebook_for(cached_model.codebook_size, seed=4)
    for rule in (GSD(emb), Lantern(emb, k=20)):
        assert rule.draft_init == "onehot"
        out = csdgen.generate(cached_model, [0], method=rule, window=8, seed=1)
        assert out.settings["draft_init"] == "onehot"
        assert csdgen.generate(cached_model, [0], method=rule, window=8, draft_init="repeat-vertical").settings["draft_init"] == "repeat-vertical"
        with pytest.raises(ValueError, match="draft_init='uniform' conflicts with the .* rule, which needs 'onehot'"):
            csdgen.generate(cached_model, [0], method=rule, window=8, draft_init="uniform")
    assert csdgen.generate(cached_model, [0], method="csd", window=8).settings["draft_init"] == "uniform"
