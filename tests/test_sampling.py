"""Warpers, entropy, total variation and inverse-CDF sampling, against hand-computed values."""

import math

import pytest
import torch

from csdgen.sampling import (
    SamplingConfig,
    apply_guidance,
    apply_top_k,
    apply_top_n_sigma,
    apply_top_p,
    entropy,
    has_nan,
    sample,
    target_probs,
    total_variation,
)
import csdgen


def test_guidance_formula_hand_computed():
    # l_u = [0, 1], l_c = [2, 0], s = 3: l_u + 3 (l_c - l_u) = [6, -2]
    out = apply_guidance(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0]), 3.0)
    assert torch.equal(out, torch.tensor([6.0, -2.0]))


def test_guidance_scale_one_ignores_uncond_and_missing_uncond_raises():
    cond = torch.randn(2, 3, 5)
    assert torch.equal(apply_guidance(cond, None, 1.0), cond)
    with pytest.raises(ValueError, match="unconditional"):
        apply_guidance(cond, None, 2.0)


def test_top_k_keeps_k_largest_and_rejects_k_above_vocab():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    kept = apply_top_k(logits, 2)
    assert torch.isinf(kept[0, [0, 3]]).all() and torch.equal(kept[0, [1, 2]], torch.tensor([4.0, 3.0]))
    with pytest.raises(ValueError, match="top_k=5 exceeds.*V=4"):
        apply_top_k(logits, 5)


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    kept = apply_top_p(probs.log(), 0.7)  # 0.5 < 0.7, 0.5 + 0.3 >= 0.7: keep two
    assert torch.isfinite(kept).tolist() == [True, True, False, False]
    assert torch.isfinite(apply_top_p(probs.log(), 0.4)).tolist() == [True, False, False, False]


def test_top_n_sigma_keeps_logits_within_n_sigma_of_the_max_over_the_finite_ones():
    # finite logits [4, 3, 1, 0]: mean 2, population sigma sqrt(2.5) = 1.58; max - sigma = 2.42 keeps 4 and 3
    logits = torch.tensor([[4.0, float("-inf"), 3.0, 1.0, 0.0]])
    assert torch.isfinite(apply_top_n_sigma(logits, 1.0)).tolist() == [[True, False, True, False, False]]
    assert torch.isfinite(apply_top_n_sigma(logits, 2.0)).tolist() == [[True, False, True, True, False]]  # 4 - 3.16
    assert torch.equal(apply_top_n_sigma(logits, None), logits)
    flat = torch.zeros(2, 3, 6)  # sigma 0: every (equal) logit is the max and stays
    assert torch.isfinite(apply_top_n_sigma(flat, 1.0)).all()
    # uncentred (Lumina-mGPT 2.0's): rms of [4, 3, 1, 0] = sqrt(6.5) = 2.55; 4 - 2.55 = 1.45 keeps 4 and 3; +10 keeps all
    assert torch.isfinite(apply_top_n_sigma(logits, 1.0, centered=False)).tolist() == [[True, False, True, False, False]]
    assert torch.isfinite(apply_top_n_sigma(logits + 10, 1.0, centered=False)).sum() == 4
    assert torch.isfinite(apply_top_n_sigma(logits + 10, 1.0)).sum() == 2  # the paper's is shift-invariant
    q = target_probs(logits, None, SamplingConfig(top_n_sigma=1.0))
    torch.testing.assert_close(q, torch.tensor([[math.e, 0, 1, 0, 0]]) / (1 + math.e))


def test_per_position_guidance_scales_equal_the_constant_formula_at_each_position():
    cond, uncond = torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    scales = torch.tensor([0.0, 2.5, 7.0])[None, :, None].expand(2, 3, 1)
    mixed = apply_guidance(cond, uncond, scales)
    for j, s in enumerate((0.0, 2.5, 7.0)):
        torch.testing.assert_close(mixed[:, j], apply_guidance(cond[:, j], uncond[:, j], s))
    q = target_probs(cond, uncond, SamplingConfig(guidance_scale=3.0), guidance=scales)
    torch.testing.assert_close(q[:, 1], target_probs(cond[:, 1], uncond[:, 1], SamplingConfig(guidance_scale=2.5)))
    unguided = target_probs(cond, None, SamplingConfig(), guidance=scales)  # scale 1: no guidance, table ignored
    torch.testing.assert_close(unguided, cond.softmax(-1))


def test_target_probs_window_shape_and_greedy_one_hot():
    logits = torch.randn(2, 7, 11)
    q = target_probs(logits, None, SamplingConfig())
    assert q.shape == (2, 7, 11) and q.dtype == torch.float32
    torch.testing.assert_close(q.sum(-1), torch.ones(2, 7))
    greedy = target_probs(logits, None, SamplingConfig(temperature=0))
    assert torch.equal(greedy.argmax(-1), logits.argmax(-1)) and torch.equal(greedy.sum(-1), torch.ones(2, 7))


def test_temperature_sharpens():
    logits = torch.tensor([1.0, 2.0, 3.0])
    hot = target_probs(logits, None, SamplingConfig(temperature=2.0))
    cold = target_probs(logits, None, SamplingConfig(temperature=0.5))
    assert cold.max() > hot.max()
    torch.testing.assert_close(hot, (logits / 2).softmax(-1))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"temperature": -1.0}, "temperature=-1.0"),
        ({"guidance_scale": float("nan")}, "guidance_scale"),
        ({"top_k": -1}, "top_k=-1"),
        ({"top_p": 0.0}, "top_p=0.0"),
        ({"top_p": 1.5}, "top_p=1.5"),
        ({"top_n_sigma": 0.0}, "top_n_sigma=0.0"),
        ({"top_n_sigma": float("inf")}, "top_n_sigma=inf"),
        ({"guidance_schedule": "linear"}, "guidance_schedule='linear': must be None or a csdgen.guidance"),
        # "False" is truthy: it ran the centred sigma
        ({"top_n_sigma": 1.0, "top_n_sigma_centered": "False"}, r"^top_n_sigma_centered='False': must be True .* or False"),
        ({"top_n_sigma_centered": None}, r"^top_n_sigma_centered=None: must be True"),
    ],
)
def test_sampling_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)


def test_entropy_hand_computed():
    uniform = torch.full((8,), 1 / 8)
    assert entropy(uniform).item() == pytest.approx(math.log(8))
    assert entropy(uniform, normalized=True).item() == pytest.approx(1.0)
    assert entropy(torch.tensor([1.0, 0.0, 0.0])).item() == 0.0  # 0 ln 0 = 0
    # clamping at 1e-10: two zero entries contribute -2 * 1e-10 * ln(1e-10) = 4.6e-9
    assert entropy(torch.tensor([1.0, 0.0, 0.0]), eps=1e-10).item() == pytest.approx(4.605e-9, rel=1e-3)
    # H([0.5, 0.25, 0.25]) = 1.5 ln 2
    assert entropy(torch.tensor([0.5, 0.25, 0.25])).item() == pytest.approx(1.5 * math.log(2))


def test_total_variation_hand_computed():
    p, q = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.2, 0.3, 0.5])
    assert total_variation(p, q).item() == pytest.approx(0.5)
    assert total_variation(p, p).item() == 0.0
    assert total_variation(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])).item() == 1.0


def test_sample_never_returns_zero_probability_tokens_and_matches_distribution():
    probs = torch.tensor([0.0, 0.7, 0.0, 0.3, 0.0])
    u = torch.rand(200_000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    tokens = sample(probs.expand(len(u), -1), u)
    counts = torch.bincount(tokens, minlength=5).double() / len(u)
    assert counts[[0, 2, 4]].sum() == 0
    assert abs(counts[1] - 0.7) < 0.005
    # edge uniforms
    assert sample(probs, torch.tensor(0.0, dtype=torch.float64)).item() == 1
    assert sample(probs, torch.tensor(1 - 1e-16, dtype=torch.float64)).item() == 3


def test_has_nan():
    assert not has_nan(torch.zeros(3), None)
    assert has_nan(torch.zeros(3), torch.tensor([0.0, float("nan")]))


def test_guidance_keeps_tokens_excluded_by_both_rows_excluded():
    inf = float("inf")
    cond = torch.tensor([-inf, -inf, 1.0, 0.5])
    uncond = torch.tensor([-inf, 0.0, -inf, 0.0])
    for scale in (0.5, 3.0):
        out = apply_guidance(cond, uncond, scale)
        assert out[0] == -inf and out[1] == -inf  # both -inf; cond -inf
        assert not torch.isnan(out).any()
    assert apply_guidance(cond, uncond, 3.0)[2] == inf  # uncond -inf only, s > 1: +inf (reported as invalid)
    assert apply_guidance(cond, uncond, 0.5)[2] == -inf
    assert torch.equal(apply_guidance(cond, uncond, 0.0), uncond)
    q = target_probs(cond[None], torch.tensor([[-inf, 0.0, 0.0, 0.0]]), SamplingConfig(guidance_scale=3.0))
    assert q[0, 0] == 0 and q[0, 1] == 0 and torch.isclose(q.sum(), torch.tensor(1.0))


def test_invalid_logits_flags_nan_plus_inf_and_all_minus_inf_only_where_valid():
    from csdgen.sampling import invalid_logits

    inf, nan = float("inf"), float("nan")
    fine = torch.tensor([[0.0, -inf], [1.0, 2.0]])
    assert not invalid_logits(fine)
    for bad in ([nan, 0.0], [inf, 0.0], [-inf, -inf]):
        logits = torch.tensor([[0.0, 1.0], bad])
        assert invalid_logits(logits)
        assert not invalid_logits(logits, valid=torch.tensor([True, False]))
    q, flag = target_probs(torch.tensor([[[nan, 0.0]]]), None, SamplingConfig(), check=True)
    assert flag


def test_stream_uniforms_are_keyed_not_sequential():
    from csdgen.sampling import stream_uniforms

    images, steps = torch.arange(20000), torch.full((20000,), 3)
    u = stream_uniforms(7, images, steps, 6, 16)
    assert u.shape == (6, 20000, 16) and u.dtype == torch.float64
    assert 0 <= float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.002 and abs(float(u.std()) - 12**-0.5) < 0.002
    # one image alone, at another batch position, with a narrower window: the same numbers
    alone = stream_uniforms(7, torch.tensor([1234]), torch.tensor([3]), 6, 4)
    assert torch.equal(alone[:, 0], u[:, 1234, :4])
    assert not torch.equal(stream_uniforms(8, images, steps, 6, 16), u)
    assert not torch.equal(stream_uniforms(7, images, steps + 1, 6, 16), u)
    # neighbouring keys are uncorrelated (5 standard errors at 20,000 pairs: 0.035)
    for a, b in ((u[0, :, 0], u[0, :, 1]), (u[0, :, 0], u[1, :, 0]), (u[0, :-1, 0], u[0, 1:, 0])):
        assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 0.035


def test_a_tiny_temperature_never_samples_from_nan_probabilities(cached_model):
    with pytest.raises(ValueError, match="overflow float32"):
        csdgen.generate(cached_model, [0], window=4, sampling=SamplingConfig(temperature=1e-300))


def test_sampling_config_stores_numpy_numbers_as_python_numbers():
    """A numpy number (a value read from an array) is kept as Python's int or float: record.json and
    the server's replies write the settings as JSON, which has no np.float32; numpy integers are
    integers for top_k (it said 'must be ... an integer' to np.int64(5))."""
    import json

    import numpy as np

    config = SamplingConfig(guidance_scale=np.float32(3.0), temperature=np.float32(0.5), top_k=np.int64(5),
                            top_p=np.float32(0.5), top_n_sigma=np.float32(1.0))
    values = {"guidance_scale": 3.0, "temperature": 0.5, "top_k": 5, "top_p": 0.5, "top_n_sigma": 1.0}
    for name, value in values.items():
        assert getattr(config, name) == value and type(getattr(config, name)) is type(value), name
    assert json.loads(json.dumps(values)) == {name: getattr(config, name) for name in values}
    assert SamplingConfig(top_k=np.int64(0)).top_k is None
    assert type(SamplingConfig(guidance_scale=3).guidance_scale) is int  # a Python number is kept as given


# -- argument checks of the tensor-level warpers (audit tester3, findings 4-7, 16, 17, 20, 26, 27) --------------

LOGITS = torch.tensor([[1.0, 2.0, 3.0, 0.5, -1.0]])


@pytest.mark.parametrize("top_p", [0.0, -0.5, 1.5, float("nan"), "0.5", True])
def test_apply_top_p_refuses_values_outside_0_1_as_sampling_config_does(top_p):
    """top_p=0 removed every token (the softmax gave NaN) although the docstring kept the most probable."""
    with pytest.raises(ValueError, match=r"^top_p=.*: must be None or in \(0, 1\]$"):
        apply_top_p(LOGITS, top_p)


def test_apply_top_p_still_keeps_every_token_at_1_and_none():
    assert apply_top_p(LOGITS, 1.0) is LOGITS and apply_top_p(LOGITS, None) is LOGITS


@pytest.mark.parametrize("n", [-1.0, 0.0, float("inf"), float("nan"), "1"])
def test_apply_top_n_sigma_refuses_n_that_is_not_a_finite_positive_number(n):
    """n=-1 removed every token (the docstring kept the largest logit)."""
    with pytest.raises(ValueError, match=r"^top_n_sigma=.*: must be None or a finite number > 0$"):
        apply_top_n_sigma(LOGITS, n)


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("inf"), float("nan"), "2", None])
def test_apply_temperature_refuses_zero_negative_and_non_numbers(temperature):
    """0 gave +-inf logits; -1 silently reversed the distribution."""
    from csdgen.sampling import apply_temperature

    with pytest.raises(ValueError, match=r"^temperature=.*: must be a finite number > 0"):
        apply_temperature(LOGITS, temperature)


def test_apply_top_k_zero_means_off_as_in_sampling_config():
    """0 crashed with a torch size mismatch; SamplingConfig stores top_k=0 as None (no top-k)."""
    import numpy as np

    assert apply_top_k(LOGITS, 0) is LOGITS
    assert apply_top_k(LOGITS, np.int64(0)) is LOGITS
    assert torch.isfinite(apply_top_k(LOGITS, np.int64(2))).sum() == 2


@pytest.mark.parametrize("top_k", [-2, 2.5, "2", True])
def test_apply_top_k_refuses_negative_and_non_integer_k(top_k):
    with pytest.raises(ValueError, match=r"^top_k=.*: must be None or 0 \(no top-k\) or an integer >= 1$"):
        apply_top_k(LOGITS, top_k)


def test_apply_top_k_keeps_every_token_tied_with_the_kth_logit_as_documented():
    q = target_probs(torch.tensor([[1.0, 1.0, 1.0, 0.0]]), None, SamplingConfig(top_k=1))
    torch.testing.assert_close(q, torch.tensor([[1 / 3, 1 / 3, 1 / 3, 0.0]]))
    assert "tied" in apply_top_k.__doc__


@pytest.mark.parametrize("scale", ["2", None, float("nan"), float("inf"), -1.0])
def test_apply_guidance_refuses_a_scale_that_is_not_a_finite_number_at_least_0(scale):
    with pytest.raises(ValueError, match=r"^scale=.*: must be a finite number >= 0$"):
        apply_guidance(LOGITS, LOGITS, scale)


def test_apply_guidance_refuses_per_position_scales_that_do_not_broadcast():
    cond = torch.randn(2, 3, 5)
    for bad in (torch.ones(7), torch.ones(2, 3, 5), torch.ones(4, 3, 1)):
        with pytest.raises(ValueError, match=r"^guidance scales of shape .*: allowed a tensor \[\.\.\., 1\]"):
            apply_guidance(cond, cond, bad)
        with pytest.raises(ValueError, match=r"^guidance scales of shape"):
            target_probs(cond, cond, SamplingConfig(guidance_scale=2.0), guidance=bad)
    apply_guidance(cond, cond, torch.ones(3, 1))  # broadcast over the batch: allowed


def test_apply_guidance_dtype_follows_the_conditional_logits_as_documented():
    f32, f64 = torch.randn(1, 5), torch.randn(1, 5, dtype=torch.float64)
    assert apply_guidance(f32, f64, 2.0).dtype == torch.float32
    assert apply_guidance(f64, f32, 2.0).dtype == torch.float64
    assert apply_guidance(f32.bfloat16(), f32.bfloat16(), 2.0).dtype == torch.float32


def test_target_probs_refuses_a_dict_config_naming_the_sampling_config_to_build():
    """A dict (what generate takes) gave a bare AttributeError ('dict' object has no attribute 'guidance_scale')."""
    with pytest.raises(ValueError, match=r"^config=\{'temperature': 1.0\}: allowed a csdgen.SamplingConfig.*"
                                         r"SamplingConfig\(\*\*\{'temperature': 1.0\}\)"):
        target_probs(LOGITS, None, {"temperature": 1.0})
    with pytest.raises(ValueError, match=r"^config=None: allowed a csdgen.SamplingConfig"):
        target_probs(LOGITS, None, None)


def test_invalid_logits_refuses_a_valid_mask_of_another_shape_or_dtype():
    from csdgen.sampling import invalid_logits

    logits = torch.zeros(2, 3, 5)
    for bad in (torch.ones(3, dtype=torch.bool), torch.ones(2, 3), torch.ones(2, 3, 5, dtype=torch.bool)):
        with pytest.raises(ValueError, match=r"^valid: got .*; allowed None or a bool tensor \[2, 3\]"):
            invalid_logits(logits, bad)
    assert not invalid_logits(logits, torch.ones(2, 3, dtype=torch.bool))


def test_sample_refuses_uniforms_of_another_shape_and_documents_its_preconditions():
    with pytest.raises(ValueError, match=r"^sample: uniforms \[2\] do not match probs \[1, 5\]"):
        sample(torch.ones(1, 5), torch.full((2,), 0.5, dtype=torch.float64))
    # outside the documented preconditions the result has no meaning: V - 1 here, of zero weight
    assert sample(torch.zeros(1, 5), torch.tensor([0.5], dtype=torch.float64)).item() == 4
    assert "Preconditions, not checked" in sample.__doc__ and "``u >= 1`` gives ``V - 1``" in sample.__doc__


@pytest.mark.parametrize("kinds, width, name", [(2, 2**16, "width"), (1, -1, "width"), (1, 2.0, "width"),
                                                 (-1, 4, "kinds"), (2**16, 4, "kinds"), ("6", 4, "kinds")])
def test_stream_uniforms_refuses_kinds_and_widths_outside_0_to_65535(kinds, width, name):
    """width 2**16 silently repeated the next draw kind's numbers; kinds=-1 was a torch arange error."""
    from csdgen.sampling import stream_uniforms

    image, step = torch.tensor([0]), torch.tensor([0])
    with pytest.raises(ValueError, match=rf"^{name}=.*: allowed an integer in 0\.\.65535"):
        stream_uniforms(0, image, step, kinds, width)
    assert stream_uniforms(0, image, step, 1, 2**16 - 1).shape == (1, 1, 2**16 - 1)


@pytest.mark.parametrize("image, step, seed, name", [
    (torch.tensor([0.0]), torch.tensor([0]), 0, "image"),
    ([0], torch.tensor([0]), 0, "image"),
    (torch.tensor([0]), torch.tensor([0.0]), 0, "step"),
    (torch.tensor([0, 1]), torch.tensor([0, 0, 0]), 0, "step"),
    (torch.tensor([0]), torch.tensor([0]), torch.tensor([1.0]), "seed"),
])
def test_stream_uniforms_refuses_index_tensors_that_are_not_integer_tensors(image, step, seed, name):
    from csdgen.sampling import stream_uniforms

    with pytest.raises(ValueError, match=rf"^{name}: got .*; allowed an integer tensor \[A\]"):
        stream_uniforms(seed, image, step, 1, 4)


def test_total_variation_refuses_shapes_that_differ_instead_of_broadcasting():
    q = torch.full((2, 3, 4), 0.25)
    with pytest.raises(ValueError, match=r"^total_variation: p \[1, 3, 4\] and q \[2, 3, 4\] differ in shape"):
        total_variation(q[:1], q)
    with pytest.raises(ValueError, match=r"^eps=-1: must be a finite number >= 0"):
        total_variation(q, q, eps=-1)


@pytest.mark.parametrize("eps", [-1, float("nan"), "1e-10"])
def test_entropy_refuses_an_eps_that_is_not_a_finite_number_at_least_0(eps):
    """eps=-1 was silently ignored."""
    with pytest.raises(ValueError, match=r"^eps=.*: must be a finite number >= 0"):
        entropy(torch.full((2, 4), 0.25), eps=eps)


def test_entropy_normalized_refuses_a_one_token_vocabulary():
    """ln 1 = 0: normalized=True gave NaN."""
    with pytest.raises(ValueError, match=r"normalized=True.*V = 1; allowed V >= 2"):
        entropy(torch.ones(2, 1), normalized=True)
    assert entropy(torch.ones(2, 1)).tolist() == [0.0, 0.0]


def test_helpers_take_0d_tensors_where_they_took_them_before():
    """A new-user try-out: a 0-d seed, step, guidance scale or temperature tensor ran before the argument checks and
    was refused after them."""
    import torch

    from csdgen.sampling import apply_guidance, apply_temperature, stream_uniforms

    image, step = torch.tensor([0, 1]), torch.tensor([3, 3])
    u = stream_uniforms(torch.tensor(5), image, torch.tensor(3), 2, 4)
    assert torch.equal(u, stream_uniforms(5, image, step, 2, 4))
    cond, uncond = torch.randn(2, 3, 7), torch.randn(2, 3, 7)
    assert torch.allclose(apply_guidance(cond, uncond, torch.tensor(2.0)), apply_guidance(cond, uncond, 2.0))
    assert torch.allclose(apply_temperature(cond, torch.tensor(0.5)), apply_temperature(cond, 0.5))
