"""The shipped built-in model in bfloat16 (``load_builtin_model(dtype="bfloat16")``, ``--dtype bfloat16``):
only its transformer is cast, its logits are float32's within bfloat16's rounding, its images are
recognised as float32's are, and a run records the dtype so that it never resumes a float32 folder."""

from __future__ import annotations

import pytest
import torch

import csdgen
from csdgen.evaluation.agreement import teacher_forced_logits
from csdgen.models.builtin import cpu_bfloat16_attention, load_builtin_model


@pytest.fixture(scope="module")
def models():
    return load_builtin_model(), load_builtin_model(dtype="bfloat16")


def test_only_the_transformer_is_cast_and_each_dtype_is_cached_apart(models):
    float32, bfloat16 = models
    assert bfloat16 is not float32
    assert load_builtin_model(dtype=torch.bfloat16) is bfloat16
    assert load_builtin_model(dtype="auto") is float32 and load_builtin_model(dtype=torch.float32) is float32
    assert float32.backbone.dtype == torch.float32 and bfloat16.backbone.dtype == torch.bfloat16
    for module in (bfloat16.components.vq, bfloat16.components.classifier):
        assert {p.dtype for p in module.parameters()} == {torch.float32}
    # on a CPU: bfloat16 attention by the CPU's flags, torch's kernel in float32
    assert bfloat16.backbone.config._attn_implementation == cpu_bfloat16_attention()
    assert float32.backbone.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("flags, expected", [
    ("fpu vme avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", "sdpa"),  # an Intel Xeon with AMX
    ("fpu vme avx512f avx512_bf16", "eager"),  # an AMD EPYC: bfloat16 dot products, no AMX tiles
    ("fpu vme amx_bf16_x", "eager"),  # a flag is a whole word
])
def test_bfloat16_attention_follows_the_cpus_amx_flag(tmp_path, flags, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: amx_bf16\n")
    assert cpu_bfloat16_attention(str(cpuinfo)) == expected
    assert cpu_bfloat16_attention(str(tmp_path / "missing")) == "eager"  # not Linux: the matmuls


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_bfloat16_logits_are_float32_logits_within_bfloat16_rounding(models, attention):
    """Teacher-forced over a float32 CSD run's tokens, static engine, both guided rows: every logit within
    bfloat16's rounding of float32's (8 significant bits over 10 layers: 0.5 or 5 %), and the target distributions
    close in total variation; the control, another class's float32 logits, is far outside both bounds.
    With either transformers attention: the CPU's flags pick one (cpu_bfloat16_attention)."""
    float32, bfloat16 = models
    classes = [0, 1]
    tokens = csdgen.generate(float32, classes, method="csd", window=16, seed=0).tokens
    exact = teacher_forced_logits(float32, classes, tokens, guided=True, engine="static", window=16)
    backbone = bfloat16.components.ar
    chosen = backbone.config._attn_implementation
    backbone.set_attn_implementation(attention)
    try:
        rounded = teacher_forced_logits(bfloat16, classes, tokens, guided=True, engine="static", window=16)
    finally:
        backbone.set_attn_implementation(chosen)
    assert rounded[0].dtype == torch.bfloat16
    for a, b in zip(exact, rounded):
        torch.testing.assert_close(b.float(), a, atol=0.5, rtol=0.05)
    tv = 0.5 * (exact[0].softmax(-1) - rounded[0].float().softmax(-1)).abs().sum(-1)
    assert tv.mean() < 0.03 and tv.max() < 0.25, (tv.mean(), tv.max())
    other = teacher_forced_logits(float32, classes[::-1], tokens, guided=False, engine="static", window=16)[0]
    control = 0.5 * (exact[0].softmax(-1) - other.softmax(-1)).abs().sum(-1)
    assert control.mean() > 5 * tv.mean(), (control.mean(), tv.mean())
    assert (other - exact[0]).abs().max() > 4 * 0.5  # another class's logits break the logit bound too


def test_bfloat16_images_are_recognised_as_float32_ones_are(models):
    """The default classes, one CSD image each (window auto): the classifier names as many bfloat16 images
    as float32 ones, give or take one, and the step compression is within 15 % of float32's."""
    from csdgen.builtin.train_classifier import classify

    float32, bfloat16 = models
    classes = list(float32.default_classes or range(8))[:8]
    named, compression = [], []
    for model in models:
        result = csdgen.generate(model, classes, method="csd", window="auto", seed=0)
        predicted = classify(model.components.classifier, model.decode_images(result.tokens))
        named.append(sum(int(p) == c for p, c in zip(predicted.tolist(), classes)))
        compression.append(result.step_compression)
    assert named[1] >= named[0] - 1 and named[0] >= len(classes) // 2, named
    assert abs(compression[1] / compression[0] - 1) < 0.15, compression


def test_another_dtype_or_bfloat16_with_quantize_is_one_line():
    with pytest.raises(ValueError, match=r"^dtype='float16': the built-in model runs in float32 or bfloat16; "
                                         r"allowed: auto, float32, bfloat16$"):
        load_builtin_model(dtype="float16")
    with pytest.raises(ValueError, match=r"^quantize='int8' with dtype='bfloat16': the built-in model is quantised "
                                         r"from float32; allowed: one of the two$"):
        load_builtin_model(quantize="int8", dtype="bfloat16")


def test_a_bfloat16_run_records_its_dtype_and_a_float32_record_does_not(models):
    """Records written before bfloat16 existed hold no dtype and still resume in float32."""
    from csdgen.run_settings import run_settings

    float32, bfloat16 = models
    assert "dtype" not in run_settings(float32)
    assert run_settings(bfloat16)["dtype"] == "bfloat16"


def test_generate_dtype_bfloat16_runs_and_refuses_to_resume_a_float32_folder(tmp_path, capsys):
    from csdgen.cli import main

    out = tmp_path / "o"
    assert main(["generate", "--class", "red apple", "-n", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["generate", "--class", "red apple", "-n", "1", "--dtype", "bfloat16", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert 'other settings (dtype: "float32" (the default) there, "bfloat16" here)' in err, err
    other = tmp_path / "b"
    assert main(["generate", "--class", "red apple", "-n", "1", "--dtype", "bfloat16", "--out", str(other)]) == 0
    assert "bfloat16 (as given)" in capsys.readouterr().err
    assert list(other.glob("0000_*.png"))
    # the other way round: the float32 left out is named, not "unset" (a default with a value)
    assert main(["generate", "--class", "red apple", "-n", "1", "--out", str(other)]) == 2
    assert 'other settings (dtype: "bfloat16" there, "float32" (the default) here)' in capsys.readouterr().err


def test_plan_sizes_a_bfloat16_model_in_bfloat16(capsys):
    """plan refused --dtype bfloat16 for the built-in model; it now plans the transformer's weights, cache
    and activations at 2 bytes (the VQ decoder and classifier stay float32)."""
    from csdgen.cli import main

    lines = {}
    for dtype in ("float32", "bfloat16"):
        assert main(["plan", "--dtype", dtype]) == 0
        lines[dtype] = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines() if line.strip())
    assert lines["bfloat16"]["dtype"] == "bfloat16" and lines["float32"]["dtype"] == "float32"
    kv = {d: float(lines[d]["KV"].split()[1]) for d in lines}  # "KV cache 60.0 MiB (...)"
    assert kv["bfloat16"] == kv["float32"] / 2
    weights = {d: float(lines[d]["weights"].split()[0]) for d in lines}
    assert weights["bfloat16"] < weights["float32"]


def test_demo_loads_the_builtin_model_in_the_dtype_given():
    from csdgen.demo import load_demo_model

    model, name, _ = load_demo_model(None, None, dtype="bfloat16")
    assert model.backbone.dtype == torch.bfloat16 and name == "built-in model"
    assert load_demo_model(None, None)[0].backbone.dtype == torch.float32
