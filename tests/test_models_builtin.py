"""csdgen.models.builtin: loading the built-in model (the process-wide cache, devices)."""

from __future__ import annotations

import torch

from builtin_fixture import weights  # noqa: F401 (fixture)


def test_a_model_loaded_onto_another_device_leaves_the_cached_cpu_model_on_the_cpu(weights):
    """load_builtin_model(device=D) moved the process's cached model to D, so every model loaded
    before it and every load_builtin_model() after it was on D too, not on the CPU the docstring
    promises by default. ("meta" stands in for a GPU here: any device other than the CPU.)"""
    from csdgen.models.builtin import load_builtin_model

    cpu = load_builtin_model(weights)
    other = load_builtin_model(weights, device="meta")
    assert other is not cpu and other.device == torch.device("meta")
    assert next(other.backbone.parameters()).device.type == "meta"
    for model in (cpu, load_builtin_model(weights), load_builtin_model(weights, device="cpu")):
        assert model is cpu and model.device == torch.device("cpu")
        assert next(model.backbone.parameters()).device.type == "cpu"
    assert load_builtin_model(weights, device="meta") is other  # cached per device too


def test_an_unknown_device_and_cuda_without_a_gpu_are_one_line(weights, monkeypatch):
    """device='tpu' ended in torch's RuntimeError listing 20 device types, device='cuda' on a machine
    without CUDA in AssertionError: Torch not compiled with CUDA enabled (after the weights were read)."""
    import pytest

    from csdgen.models.builtin import load_builtin_model

    with pytest.raises(ValueError, match=r"^device='tpu': not a device; allowed: 'cpu', 'cuda' or 'cuda:N'"):
        load_builtin_model(weights, device="tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^device='cuda:1': no CUDA device is visible here; allowed: 'cpu'"):
        load_builtin_model(weights, device="cuda:1")
