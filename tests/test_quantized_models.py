"""Quantised targets: every family's tiny checkpoint (the model tests' writers, the released layouts) loads with
torchao int8 weight-only on the CPU, its decoder layers quantised and nothing else, and generates with AR, SJD and
CSD; greedy SJD equals greedy AR on the quantised model (speculative decoding is exact for whatever target it is
given). The built-in model quantises through torchao's quantize_ directly."""

from __future__ import annotations

import importlib

import pytest
import torch

import csdgen
from csdgen.sampling import SamplingConfig

pytest.importorskip("torchao", reason='torchao is not installed (pip install -c constraints.txt ".[quant]")')

GREEDY = SamplingConfig(guidance_scale=3.0, temperature=0.0)

#: family -> (test module whose build_checkpoint writes it, folder name, load_model keywords, condition)
FAMILIES = {
    "janus": ("test_models_janus", "janus", {}, "a red dog"),
    "emu3": ("test_models_emu3", "emu3", {"height": "HEIGHT", "width": "WIDTH", "negative_prompt": "NEGATIVE",
                                          "positive_prompt": ""}, "a red dog"),
    "lumina-mgpt": ("test_models_chameleon", "chameleon", {"layout": "lumina", "height": 12, "width": 16}, "a red dog"),
    "anole": ("test_models_chameleon", "chameleon", {"layout": "anole"}, "a red dog"),
    "lumina-mgpt-2": ("test_models_lumina2", "Lumina-mGPT-2.0", {"height": "HEIGHT", "width": "WIDTH"}, "a red dog"),
    "glm-image": ("test_models_glm_image", "GLM-Image", {"height": "SIZE", "width": "SIZE"}, "a red dog"),
    "liquid": ("test_models_liquid", "Liquid_V1_tiny", {}, "a red dog"),
}

_FOLDERS: dict[str, str] = {}


def _folder(family: str, tmp_path_factory) -> str:
    module_name, name, _, _ = FAMILIES[family]
    key = module_name
    if key not in _FOLDERS:
        module = importlib.import_module(module_name)
        _FOLDERS[key] = str(module.build_checkpoint(str(tmp_path_factory.mktemp(name))))
    return _FOLDERS[key]


def _kwargs(family: str) -> dict:
    module_name, _, kwargs, _ = FAMILIES[family]
    module = importlib.import_module(module_name)
    return {k: getattr(module, v) if isinstance(v, str) and v.isupper() else v for k, v in kwargs.items()}  # constants


def _load(family, tmp_path_factory, **extra):
    from csdgen.models.auto import load_model

    return load_model(_folder(family, tmp_path_factory), device="cpu", batch_size=None, **_kwargs(family), **extra)


def _linears(module: torch.nn.Module) -> dict[str, type]:
    return {name: type(m.weight) for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)}


def _transformers_model(model) -> torch.nn.Module:
    return next(v for v in vars(model).values() if isinstance(v, torch.nn.Module) and hasattr(v, "config"))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_loads_int8_with_only_its_decoder_layers_quantised_and_generates(family, tmp_path_factory):
    from csdgen.models.quantize import decoder_layers_prefix

    model = _load(family, tmp_path_factory, quantize="int8")
    inner = _transformers_model(model)
    prefix = decoder_layers_prefix(inner) + "."
    kinds = _linears(inner)
    inside = {n: k for n, k in kinds.items() if n.startswith(prefix)}
    outside = {n: k for n, k in kinds.items() if not n.startswith(prefix)}
    assert inside and all(k.__name__ == "Int8Tensor" for k in inside.values()), inside
    assert all(k is torch.nn.Parameter for k in outside.values()), outside  # vision tower, VQ, heads: float
    condition = FAMILIES[family][3]
    guided = family != "glm-image"
    sampling = GREEDY if guided else SamplingConfig(guidance_scale=1.0, temperature=0.0)
    ar = csdgen.generate(model, [condition], method="ar", sampling=sampling)
    sjd = csdgen.generate(model, [condition], method="sjd", window=4, sampling=sampling)
    csd = csdgen.generate(model, [condition], method="csd", window=4, sampling=sampling)
    for other in (sjd, csd):  # greedy: exact on the int8 target, up to a tie within the kernels' rounding
        _assert_greedy_equal_up_to_a_tie(model, condition, guided, sampling.guidance_scale, ar.tokens, other.tokens)
    assert int(ar.tokens.max()) < model.codebook_size


#: top-2 gap of the guided logits below which greedy may take either token: torchao's int8 weight-only matmul
#: rounds a window of 4 rows and a single row apart by about 1e-5 on some CPUs (Xeon with AMX, float32)
TIE = 1e-4


def _assert_greedy_equal_up_to_a_tie(model, condition, guided, scale, ar_tokens, other_tokens):
    """``other_tokens`` ``[1, N]`` equals greedy AR's ``ar_tokens``, or first differs from it where the target's
    top two logits (on AR's path, one position per forward) are within :data:`TIE` and are the two tokens taken."""
    from csdgen.evaluation.agreement import teacher_forced_logits
    from csdgen.sampling import apply_guidance

    differ = (ar_tokens != other_tokens).nonzero()
    if differ.numel() == 0:
        return
    at = int(differ[0, 1])
    cond, uncond = teacher_forced_logits(model, [condition], ar_tokens, guided=guided, window=1)
    logits = apply_guidance(cond[0, at].float(), None if uncond is None else uncond[0, at].float(), scale)
    top = logits.topk(2)
    taken = {int(ar_tokens[0, at]), int(other_tokens[0, at])}
    gap = float(top.values[0] - top.values[1])
    assert gap < TIE and taken == set(top.indices.tolist()), (
        f"greedy differs from AR at image position {at} of {ar_tokens.shape[1]}: tokens {sorted(taken)}, "
        f"top two {top.indices.tolist()} {gap=:.3g}")


def test_the_quantised_target_differs_from_the_float_one(tmp_path_factory):
    """The int8 model is another target: its logits move (so the tests above do test a quantised model)."""
    full = _load("janus", tmp_path_factory)
    int8 = _load("janus", tmp_path_factory, quantize="int8")
    a = full.start(["a red dog"], 1, True).prefill().cond
    b = int8.start(["a red dog"], 1, True).prefill().cond
    assert not torch.equal(a, b) and torch.allclose(a, b, atol=0.5)


def test_the_builtin_model_quantises_its_decoder_layers_with_torchao():
    from csdgen.models.builtin import load_builtin_model
    from csdgen.models.memory import module_bytes, planned_weight_bytes

    plain = load_builtin_model()
    int8 = load_builtin_model(quantize="int8")
    assert int8 is not plain and load_builtin_model() is plain  # a fresh copy; the cached model stays float32
    kinds = _linears(int8.backbone)
    assert {k.__name__ for n, k in kinds.items() if n.startswith("model.layers.")} == {"Int8Tensor"}
    assert kinds["lm_head"] is torch.nn.Parameter
    # the plan's arithmetic for int8 weights against the bytes torchao's tensors hold
    planned = planned_weight_bytes(plain.backbone, torch.float32, "int8")
    assert abs(planned - module_bytes(int8.backbone)) <= 0.01 * planned
    assert module_bytes(int8.backbone) < 0.5 * module_bytes(plain.backbone)


def test_the_builtin_model_runs_fp8_on_the_cpu_with_greedy_sjd_equal_to_greedy_ar():
    import csdgen
    from csdgen.models.builtin import load_builtin_model

    fp8 = load_builtin_model(quantize="fp8", device="cpu")
    kinds = _linears(fp8.backbone)
    assert {k.__name__ for n, k in kinds.items() if n.startswith("model.layers.")} == {"Float8Tensor"}
    greedy = {"top_k": 1}
    ar = csdgen.generate(fp8, ["red apple"], method="ar", sampling=greedy, seed=0)
    sjd = csdgen.generate(fp8, ["red apple"], method="sjd", window=16, sampling=greedy, seed=0)
    assert torch.equal(ar.tokens, sjd.tokens) and sjd.images[0].step_compression > 1


# -- lossless in distribution on a quantised transformer (the chi-square test of tests/test_lossless.py) ---------


class QuantizedJoint:
    """A tiny class-conditional Llama over V = 3 codes, N = 4 positions, its decoder layers torchao int8: the exact
    joint law of its guided target, computed by teacher-forcing all 81 sequences through the quantised model."""

    V, N = 3, 4

    def __init__(self, sampling: SamplingConfig):
        from csdgen.models import ClassConditionalLlama
        from csdgen.models.quantize import quantize_module

        self.sampling = sampling
        self.model = ClassConditionalLlama.random(codebook_size=self.V, num_classes=1, grid=(1, self.N), hidden_size=32,
                                                  seed=3)
        with torch.no_grad():
            self.model.backbone.lm_head.weight.mul_(12.0)  # peaked targets: the wrong control is far off
        quantize_module(self.model.backbone, "int8", "cpu")

    def joint(self) -> dict[tuple, float]:
        import itertools

        from csdgen.sampling import target_probs

        seqs = torch.tensor(list(itertools.product(range(self.V), repeat=self.N)))
        session = self.model.start([0] * len(seqs), len(seqs), True)
        first = session.prefill()
        rest = session.forward(seqs[:, : self.N - 1], torch.zeros(len(seqs), dtype=torch.long))
        cond = torch.cat([first.cond, rest.cond], 1)
        uncond = torch.cat([first.uncond, rest.uncond], 1)
        q = target_probs(cond, uncond, self.sampling)  # [81, N, V]
        probs = q.gather(2, seqs[:, :, None])[..., 0].prod(1)
        return {tuple(s.tolist()): float(p) for s, p in zip(seqs, probs)}


@pytest.fixture(scope="module")
def quantized_joint():
    return QuantizedJoint(SamplingConfig(guidance_scale=2.0, temperature=1.0))


#: at this size (seed 11) SJD's p-value is 0.72, the wrong control's 6e-52 (seeds 1, 2: 3e-50, 7e-57; at 6000 samples
#: the control was 1e-115 and 1500 still gives 6e-21, so 3000 rejects it with a wide margin over P_FAIL = 1e-6)
SAMPLES = 3_000


def _sample(joint, method, **kwargs):
    return csdgen.generate(joint.model, [0] * SAMPLES, batch_size=SAMPLES, sampling=joint.sampling, method=method,
                           seed=11, **kwargs).tokens


def test_sjd_reproduces_the_quantised_targets_joint_and_a_wrong_rule_does_not(quantized_joint):
    from test_lossless import P_FAIL, P_PASS, ResampleFromTarget, chi_square_pvalue

    law = quantized_joint.joint()
    assert abs(sum(law.values()) - 1) < 1e-5 and max(law.values()) > 0.05
    assert chi_square_pvalue(_sample(quantized_joint, "sjd", window=3, draft_init="uniform"), law) > P_PASS
    wrong = _sample(quantized_joint, ResampleFromTarget(), window=3, draft_init="uniform")
    assert chi_square_pvalue(wrong, law) < P_FAIL  # the failing control: the test can fail
