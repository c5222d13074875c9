"""--dtype on every command that loads a model: the family's default per device, the run's first line, refusals."""

import pytest
import torch

from cli_helpers import cli_error, run, usage_error
from csdgen.models.auto import FAMILIES, FAMILY_GPU_DTYPES, default_dtype, resolve_dtype


def test_every_family_defaults_to_its_reference_dtype_on_cuda_and_float32_on_cpu():
    assert set(FAMILY_GPU_DTYPES) == {*FAMILIES, "builtin"}
    for family in FAMILIES:  # every released family's reference code runs bfloat16 on a GPU
        assert resolve_dtype(None, "cuda", family) == (torch.bfloat16, "the family's default on cuda")
        assert resolve_dtype("auto", "cuda:1", family)[0] == torch.bfloat16
        assert resolve_dtype(None, "cpu", family) == (torch.float32, "the default on cpu")
    assert resolve_dtype(None, "cuda", "builtin") == (torch.float32, "the built-in model's dtype")
    assert resolve_dtype("float16", "cpu", "janus") == (torch.float16, "as given")
    assert resolve_dtype(torch.bfloat16, "cpu") == (torch.bfloat16, "as given")
    assert default_dtype("cuda") == torch.bfloat16 and default_dtype("cpu") == torch.float32


@pytest.mark.parametrize("value, match", [("fp8", r"dtype='fp8': allowed auto, float32, bfloat16, float16"),
                                          (torch.int8, r"dtype=torch.int8: allowed auto, float32")])
def test_a_bad_dtype_names_the_value_and_the_allowed_ones(value, match):
    with pytest.raises(ValueError, match=match):
        resolve_dtype(value, "cpu", "janus")
    with pytest.raises(ValueError, match=r"family='dalle': allowed janus"):
        resolve_dtype(None, "cpu", "dalle")


@pytest.mark.parametrize("command", ["generate", "compare", "sweep", "bench", "serve", "demo"])
def test_every_model_command_takes_dtype_and_refuses_a_bad_one_in_one_line(command, capsys):
    err = usage_error(capsys, command, "--dtype", "fp8", one_line=True)
    assert "--dtype" in err and "'fp8'" in err and "auto, float32, bfloat16, float16" in err


@pytest.mark.parametrize("command", ["compare", "sweep", "bench"])
def test_the_builtin_model_refuses_another_dtype_than_float32_or_bfloat16(command, capsys, tmp_path):
    err = cli_error(capsys, command, "--dtype", "float16", "--out", tmp_path / "o")
    assert "--dtype float16: the built-in model runs in float32 or bfloat16" in err and "auto, float32, bfloat16" in err


def test_the_first_line_of_a_run_says_the_model_device_and_dtype_and_why(tmp_path, capsys):
    from builtin_fixture import make_tiny_weights

    weights = make_tiny_weights(tmp_path / "w")
    assert run("generate", "--weights", weights, "-n", 1, "--window", 4, "--no-maps", "--out", tmp_path / "o") == 0
    err = capsys.readouterr().err
    assert err.splitlines()[0].startswith(  # then the memory plan (tests/test_memory_plan.py)
        "csdgen generate: the built-in model on cpu, float32 (the built-in model's dtype); memory plan: "), err
    assert run("generate", "--weights", weights, "-n", 1, "--window", 4, "--no-maps", "--dtype", "float32",
               "--out", tmp_path / "o") == 0
    assert "float32" not in capsys.readouterr().err  # the same run (float32 given) resumed: nothing decodes, no line


def test_a_checkpoint_run_line_says_the_family_default_or_the_given_dtype(tmp_path, capsys):
    from test_models_janus import build_checkpoint

    folder = build_checkpoint(tmp_path / "janus")
    common = ["generate", "--model", folder, "--prompt", "a red dog", "--no-maps", "--window", 4, "--device", "cpu"]
    assert run(*common, "--out", tmp_path / "a") == 0
    assert f"csdgen generate: janus ({folder}) on cpu, float32 (the default on cpu)" in capsys.readouterr().err
    assert run(*common, "--dtype", "bfloat16", "--out", tmp_path / "b") == 0
    assert f"csdgen generate: janus ({folder}) on cpu, bfloat16 (as given)" in capsys.readouterr().err
    import json

    assert json.loads((tmp_path / "b" / "record.json").read_text())["settings"]["dtype"] == "bfloat16"
