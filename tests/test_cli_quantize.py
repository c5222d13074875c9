"""--quantize and --device-map on the commands: one clear line for a bad value (argparse's exit 2), for what the
device or the installed packages cannot run, and for the built-in model's limits; a quantised run says so in its
first line and records it; bitsandbytes' nf4 / LLM.int8() where bitsandbytes runs on this machine."""

from __future__ import annotations

import json

import pytest
import torch

import csdgen
from cli_helpers import cli_error, run, usage_error

COMMANDS = ["generate", "bench", "serve", "plan"]


def test_the_option_lists_the_library_quantisations():
    from csdgen.cli._options import QUANTIZE
    from csdgen.models.quantize import QUANTIZE_CHOICES

    assert QUANTIZE == QUANTIZE_CHOICES


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_quantize_is_an_argparse_error_in_one_line(command, capsys):
    err = usage_error(capsys, command, "--quantize", "int3", one_line=True)
    assert "--quantize" in err and "'int3'" in err and "int8, int4, fp8, nf4, bnb8" in err


@pytest.mark.parametrize("command", ["generate", "bench", "serve"])
@pytest.mark.parametrize("value", ["everywhere", "{not json", '{"lm_head": -1}'])
def test_a_bad_device_map_is_an_argparse_error_in_one_line(command, value, capsys):
    err = usage_error(capsys, command, "--device-map", value, one_line=True)
    assert "--device-map" in err and "allowed auto, balanced" in err


def test_int4_on_the_cpu_is_refused_naming_what_the_cpu_allows(capsys, tmp_path):
    pytest.importorskip("torchao", reason='torchao is not installed (pip install -c constraints.txt ".[quant]")')
    err = cli_error(capsys, "generate", "--quantize", "int4", "-n", 1, "--out", tmp_path / "o")
    assert err == "csdgen generate: error: --quantize int4: torchao's int4 weight-only needs CUDA; on cpu use int8\n"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name, package", [("nf4", "bitsandbytes"), ("int8", "torchao")])
def test_a_missing_package_is_named_with_its_install_line(name, package, capsys, monkeypatch, tmp_path):
    import csdgen.models.quantize as quantize

    monkeypatch.setattr(quantize, "_installed", lambda p: p != package)
    with pytest.raises(ValueError) as refused:
        quantize.check_quantize(name, "cpu")
    assert str(refused.value) == (f"--quantize {name}: {package} is not installed: "
                                  f'pip install -c constraints.txt ".[quant]" in the csdgen checkout')
    if name == "int8":  # the built-in model's commands name it too (it takes no bitsandbytes quantisation)
        err = cli_error(capsys, "plan", "--quantize", name, "--device", "cpu")
        assert err == f"csdgen plan: error: {refused.value}\n"


@pytest.mark.parametrize("installed", [True, False])
def test_the_builtin_model_refuses_a_device_map_and_bitsandbytes_in_one_line(installed, capsys, tmp_path, monkeypatch):
    """Without bitsandbytes the built-in model's nf4 was 'bitsandbytes is not installed': installing it led to the
    refusal below."""
    import csdgen.models.quantize as quantize

    monkeypatch.setattr(quantize, "_installed", lambda p: installed or p != "bitsandbytes")
    err = cli_error(capsys, "generate", "--device-map", "auto", "-n", 1, "--out", tmp_path / "o")
    assert "--device-map needs --model" in err and "use --device" in err
    for command in (("generate", "-n", 1, "--out", tmp_path / "o"), ("plan",)):
        err = cli_error(capsys, *command, "--quantize", "nf4")
        assert "--quantize nf4: bitsandbytes quantises while reading a checkpoint folder; the built-in model takes int8" in err


def test_a_quantised_run_says_so_first_and_records_it(tmp_path, capsys):
    pytest.importorskip("torchao", reason='torchao is not installed (pip install -c constraints.txt ".[quant]")')
    from builtin_fixture import make_tiny_weights

    weights = make_tiny_weights(tmp_path / "w")
    assert run("generate", "--weights", weights, "--quantize", "INT8", "-n", 1, "--window", 4, "--no-maps",
               "--out", tmp_path / "o") == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert "float32 (the built-in model's dtype), decoder layers int8; memory plan:" in first, first
    assert json.loads((tmp_path / "o" / "record.json").read_text())["settings"]["quantize"] == "int8"
    assert run("generate", "--weights", weights, "-n", 1, "--window", 4, "--no-maps", "--out", tmp_path / "f") == 0
    assert "quantize" not in json.loads((tmp_path / "f" / "record.json").read_text())["settings"]  # unchanged records


@pytest.mark.parametrize("name", ["nf4", "bnb8"])
def test_bitsandbytes_quantisations_load_and_stay_exact_where_bitsandbytes_runs(name, tmp_path):
    pytest.importorskip("bitsandbytes", reason='bitsandbytes is not installed (pip install -c constraints.txt ".[quant]")')
    from csdgen.models.auto import load_model
    from csdgen.sampling import SamplingConfig
    from test_models_janus import build_checkpoint

    folder = build_checkpoint(tmp_path / "janus")
    try:
        model = load_model(folder, device="cpu", batch_size=None, quantize=name)
        greedy = SamplingConfig(guidance_scale=3.0, temperature=0.0)
        ar = csdgen.generate(model, ["a red dog"], method="ar", sampling=greedy)
    except (RuntimeError, NotImplementedError) as exc:  # a bitsandbytes build without its CPU backend
        pytest.skip(f"bitsandbytes cannot run {name} on this CPU: {str(exc).splitlines()[0][:200]}")
    kinds = {type(m.weight).__name__ for n, m in model.model.named_modules()
             if isinstance(m, torch.nn.Linear) and n.startswith("model.language_model.layers.")}
    assert kinds == {"Params4bit" if name == "nf4" else "Int8Params"}
    sjd = csdgen.generate(model, ["a red dog"], method="sjd", window=4, sampling=greedy)
    assert torch.equal(sjd.tokens, ar.tokens)
