"""Models split across devices by accelerate's device map (transformers' from_pretrained device_map): a tiny
checkpoint with its last decoder layer offloaded to disk (the rest on the CPU) decodes the same tokens as the
undivided model, on the eager engine (the static engine cannot follow a split model: refused with its reason),
and each layer's KV cache stays with its layer."""

from __future__ import annotations

import pytest
import torch

import csdgen

pytest.importorskip("accelerate", reason='accelerate is not installed (pip install -c constraints.txt ".[quant]")')


def split_map(model: torch.nn.Module, offloaded: str = "disk") -> dict[str, str]:
    """Every module beside the path to the decoder layers on the CPU, each decoder layer too, the last one on ``offloaded``."""
    from csdgen.models.quantize import decoder_layers_prefix

    path = decoder_layers_prefix(model).split(".")
    placed, module, here = {}, model, []
    for part in path:
        for name, _ in module.named_children():
            if name != part:
                placed[".".join([*here, name])] = "cpu"
        module, here = getattr(module, part), [*here, part]
    count = len(module)
    for i in range(count):
        placed[".".join([*here, str(i)])] = offloaded if i == count - 1 else "cpu"
    return placed


@pytest.fixture(scope="module")
def liquid_folder(tmp_path_factory):
    from test_models_liquid import build_checkpoint

    return str(build_checkpoint(tmp_path_factory.mktemp("Liquid_V1_tiny")))


@pytest.fixture(scope="module")
def janus_folder(tmp_path_factory):
    from test_models_janus import build_checkpoint

    return str(build_checkpoint(tmp_path_factory.mktemp("janus")))


@pytest.mark.parametrize("which", ["liquid_folder", "janus_folder"])
def test_a_model_with_a_layer_offloaded_to_disk_decodes_the_same_tokens(which, request, tmp_path):
    from csdgen.models.auto import family_of, load_model, model_skeleton

    folder = request.getfixturevalue(which)
    whole = load_model(folder, device="cpu", batch_size=None)
    placed = split_map(model_skeleton(folder, family_of(folder), torch.float32))
    split = load_model(folder, device="cpu", batch_size=None, device_map=placed, offload_folder=tmp_path / "offload")
    inner = next(v for v in vars(split).values() if isinstance(v, torch.nn.Module) and hasattr(v, "hf_device_map"))
    assert "disk" in split.device_map.values()
    assert any(p.device.type == "meta" for p in inner.parameters())  # really offloaded: loaded per forward
    for method in ("ar", "sjd", "csd"):
        a = csdgen.generate(whole, ["a red dog", "a cat"], method=method, window=4, seed=5, engine="eager")
        b = csdgen.generate(split, ["a red dog", "a cat"], method=method, window=4, seed=5)  # auto: eager for a split model
        assert torch.equal(a.tokens, b.tokens), method


def test_the_static_engine_refuses_a_split_model_with_its_reason(liquid_folder, tmp_path):
    from csdgen.models._static import static_refusal
    from csdgen.models.auto import load_model, model_skeleton

    placed = split_map(model_skeleton(liquid_folder, "liquid", torch.float32))
    split = load_model(liquid_folder, device="cpu", batch_size=None, device_map=placed, offload_folder=tmp_path / "o")
    assert "split across devices" in static_refusal(split.start(["a"], 1, True))
    with pytest.raises(ValueError, match="split across devices"):
        csdgen.generate(split, ["a"], method="sjd", window=4, engine="static")
    whole = load_model(liquid_folder, device="cpu", batch_size=None, device_map={"": "cpu"})  # one place: not split
    assert static_refusal(whole.start(["a"], 1, True)) is None


def test_the_static_engine_with_a_splitting_json_map_is_refused_before_the_weights_load(liquid_folder, tmp_path, capsys,
                                                                                        monkeypatch):
    """``--engine static`` (or ``--compile``) with a map offloading a layer to disk was refused only once the weights
    had loaded (minutes for a 7B checkpoint): the map given is known up front, so the refusal comes first now."""
    import csdgen.models.auto as auto
    from csdgen.cli import main

    def loaded(*args, **kwargs):
        raise AssertionError("the weights were read before the refusal")

    monkeypatch.setattr(auto, "load_model", loaded)
    disk = '{"model.layers.1": "disk"}'
    common = ["--model", liquid_folder, "--device", "cpu", "--window", "4"]
    for argv, option in ((["generate", "--prompt", "a dog", "--engine", "static", "--device-map", disk], "--engine static"),
                         (["bench", "--methods", "sjd", "--engine", "static", "--device-map",
                           '{"model.layers.0": "cpu", "model.layers.1": "disk"}'], "--engine static"),
                         (["generate", "--prompt", "a dog", "--compile", "--device-map", disk], "--compile")):
        assert main([*argv, *common, "--out", str(tmp_path / argv[0])]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"error: {option} cannot be used with --device-map placing modules on " in err, err
        assert "'disk'" in err and "the model is split across devices" in err and "allowed: " in err, err
    # serve too: it started, loaded the weights and then failed every request (--engine static) or ran eager
    # (--compile), where generate and bench refuse
    for option in (["--engine", "static"], ["--compile"]):
        assert main(["serve", "--model", liquid_folder, "--device", "cpu", "--top-k", "8", *option, "--device-map",
                     disk, "--port", "0"]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"error: {option[0] if len(option) == 1 else '--engine static'} cannot be used with --device-map" in err, err
    # a named map is placed while the weights load: whether it splits the model is known then, as before
    with pytest.raises(AssertionError, match="weights were read"):
        main(["generate", "--prompt", "a dog", "--engine", "static", "--device-map", "auto", *common,
              "--out", str(tmp_path / "named")])
    with pytest.raises(AssertionError, match="weights were read"):  # one place: not split, the static engine runs
        main(["generate", "--prompt", "a dog", "--engine", "static", "--device-map", '{"": "cpu"}', *common,
              "--out", str(tmp_path / "one")])


def test_each_layers_cache_stays_with_its_layer(liquid_folder, tmp_path):
    """The KV cache of the disk-offloaded layer lives on its execution device (the CPU), not on 'meta' or disk."""
    from csdgen.models.auto import load_model, model_skeleton

    placed = split_map(model_skeleton(liquid_folder, "liquid", torch.float32))
    split = load_model(liquid_folder, device="cpu", batch_size=None, device_map=placed, offload_folder=tmp_path / "o")
    session = split.start(["a red dog"], 1, True)
    session.prefill()
    layers = session.kv.cache.layers
    assert len(layers) == len(split.backbone.model.layers)
    assert {layer.keys.device.type for layer in layers} == {"cpu"}


def test_a_partial_device_map_places_every_other_module_on_the_device(janus_folder, liquid_folder, tmp_path, capsys):
    """Found by a new-user try-out: docs/models.md's own example map names two layers, and accelerate refused such
    a map with a list of every other weight (one line of 30 kB); the modules a map leaves out now go to --device."""
    from csdgen.cli import main
    from csdgen.models.auto import load_model
    from csdgen.models.quantize import complete_device_map

    for folder, layer, given in ((liquid_folder, "model.layers.1", {"model.layers.0": "cpu", "model.layers.1": "disk"}),
                                 (janus_folder, "model.language_model.layers.1", {"model.language_model.layers.1": "disk"})):
        whole = load_model(folder, device="cpu", batch_size=None)
        split = load_model(folder, device="cpu", batch_size=None, device_map=given, offload_folder=tmp_path / "o")
        assert split.device_map[layer] == "disk" and set(split.device_map.values()) == {"cpu", "disk"}
        for method in ("ar", "sjd"):
            a = csdgen.generate(whole, ["a red dog"], method=method, window=4, seed=5, engine="eager")
            assert torch.equal(a.tokens, csdgen.generate(split, ["a red dog"], method=method, window=4, seed=5).tokens)
    skeleton = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)))
    assert complete_device_map(skeleton, {"1.0": "disk"}, "cpu") == {"1.0": "disk", "0": "cpu", "1.1": "cpu"}
    assert complete_device_map(skeleton, {"": "cuda:1", "1.0": "disk"}, "cpu") == {"1.0": "disk", "0": "cuda:1",
                                                                                   "1.1": "cuda:1"}
    assert complete_device_map(skeleton, {"": "cpu"}, "cuda") == {"": "cpu"}
    assert main(["generate", "--model", janus_folder, "--prompt", "a dog", "--device", "cpu", "--out", str(tmp_path / "g"),
                 "--device-map", '{"model.layers.1": "disk"}']) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("csdgen generate: error: --device-map: 'model.layers.1' is not a module of this model; its modules are named "
                   "from 'model', 'lm_head' down (e.g. 'model.language_model.layers.0')")


def test_torchao_quantisation_with_a_cpu_or_disk_map_is_refused_without_a_gpu(liquid_folder, tmp_path, monkeypatch):
    """Found by a new-user try-out: --quantize int8 with a JSON map (cpu / disk modules) on a machine without CUDA
    failed inside transformers (it quantises those layers on a GPU first) with a multi-page load report."""
    pytest.importorskip("torchao")
    from csdgen.models.auto import load_model

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for given in ({"model.layers.1": "disk"}, {"model.layers.0": "cpu"}):
        with pytest.raises(ValueError, match=r"^--quantize int8 with --device-map placing modules on 'cpu' or 'disk': .* "
                                             r"use --device-map auto, or leave out --quantize or --device-map$"):
            load_model(liquid_folder, device="cpu", batch_size=None, device_map=given, quantize="int8",
                       offload_folder=tmp_path / "o")
    assert load_model(liquid_folder, device="cpu", batch_size=None, device_map={"": "cpu"}, quantize="int8").quantize == "int8"


def test_disk_offload_of_a_lumina_layout_checkpoint_is_refused_in_one_line(tmp_path):
    """Found by a new-user try-out: Lumina-mGPT's per-shard q/k norms ([1, head_dim] in the files) with a layer on
    disk ended in accelerate's "Trying to set a tensor of shape [1, 16] in 'weight' (which has shape [4, 16])";
    a layer on the CPU loads (the norms are expanded as without a map)."""
    from test_models_lumina2 import HEIGHT, WIDTH, build_checkpoint

    from csdgen.models.auto import load_model

    folder = build_checkpoint(tmp_path / "Lumina-mGPT-2.0")
    with pytest.raises(ValueError, match=r"^--device-map: .* stores its q/k norms per model-parallel shard .* "
                                         r"place them on 'cpu' or a GPU instead$"):
        load_model(folder, device="cpu", batch_size=None, height=HEIGHT, width=WIDTH,
                   device_map={"model.layers.1": "disk"}, offload_folder=tmp_path / "o")
    whole = load_model(folder, device="cpu", batch_size=None, height=HEIGHT, width=WIDTH)
    split = load_model(folder, device="cpu", batch_size=None, height=HEIGHT, width=WIDTH, device_map={"model.layers.1": "cpu"})
    a = csdgen.generate(whole, ["red cat"], method="sjd", window=4, seed=5, engine="eager")
    assert torch.equal(a.tokens, csdgen.generate(split, ["red cat"], method="sjd", window=4, seed=5).tokens)


@pytest.mark.parametrize("value, expected", [
    ("auto", "auto"), ("balanced", "balanced"),
    ('{"model.layers.0": "cpu", "model.layers.1": "disk"}', {"model.layers.0": "cpu", "model.layers.1": "disk"}),
    ('{"lm_head": "cpu"}', {"lm_head": "cpu"}), ({"lm_head": "disk"}, {"lm_head": "disk"}),
])
def test_device_map_values(value, expected):
    from csdgen.models.quantize import parse_device_map

    assert parse_device_map(value) == expected


@pytest.mark.parametrize("value, says", [
    ("everywhere", "allowed auto, balanced"), ("{not json", "not valid JSON"), ("{}", "empty"),
    ('{"lm_head": -1}', "'lm_head': -1"), ('{"lm_head": true}', "'lm_head': True"),
])
def test_bad_device_maps_are_refused_in_one_line(value, says):
    from csdgen.models.quantize import parse_device_map

    with pytest.raises(ValueError) as info:
        parse_device_map(value)
    message = str(info.value)
    assert says in message and "\n" not in message and message.startswith(f"--device-map {value}")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without CUDA")
@pytest.mark.parametrize("value, says", [
    ('{"model.layers.1": "cuda:0"}', "'model.layers.1': 'cuda:0' names a CUDA device and none is visible here; use 'cpu' or 'disk'"),
    ('{"": "cuda"}', "'': 'cuda' names a CUDA device and none is visible here"),
    ('{"lm_head": 0}', "'lm_head': 0 names a CUDA device and none is visible here"),
    ('{"lm_head": "foo"}', "'lm_head': 'foo' is not a device; allowed 'cpu', 'disk', 'cuda', 'cuda:N' or N"),
    ('{"lm_head": "meta"}', "'lm_head': 'meta' is not a device csdgen places weights on"),
    ({"lm_head": "cuda:1"}, "--device-map {\"lm_head\": \"cuda:1\"}: 'lm_head': 'cuda:1' names a CUDA device"),
])
def test_device_map_devices_this_machine_lacks_are_refused_before_loading(value, says, capsys):
    from csdgen.cli import main
    from csdgen.models.quantize import parse_device_map

    with pytest.raises(ValueError) as info:
        parse_device_map(value)
    assert says in str(info.value) and "\n" not in str(info.value)
    if isinstance(value, str):  # the CLI refuses it while reading its arguments: one line, status 2
        with pytest.raises(SystemExit) as stop:
            main(["generate", "--model", "no/such/folder", "--prompt", "x", "--device-map", value])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says.split(" names")[0].split(" is not")[0] in err


def test_offloading_the_whole_decoder_to_disk_is_refused_in_one_line(janus_folder, tmp_path):
    """The adapters call the decoder's embed_tokens and layers one by one, past an offloaded parent's hook."""
    from csdgen.models.auto import load_model

    placed = {"model.vision_model": "cpu", "model.aligner": "cpu", "model.vqmodel": "cpu",
              "model.generation_embeddings": "cpu", "model.generation_aligner": "cpu", "model.generation_head": "cpu",
              "model.language_model": "disk", "lm_head": "cpu"}
    with pytest.raises(ValueError, match=r"'model.language_model' -> disk .* offload decoder layers "
                                         r"\('model.language_model.layers.N'\) instead"):
        load_model(janus_folder, device="cpu", batch_size=None, device_map=placed, offload_folder=tmp_path / "o")


def test_a_temporary_offload_folder_is_removed_with_its_model(liquid_folder, tmp_path, monkeypatch):
    """Without ``offload_folder`` a disk map offloads into a temporary folder, which stayed in /tmp after
    every run (with a .bin checkpoint, a copy of the offloaded weights): it now goes with the model."""
    import gc
    import tempfile

    from csdgen.models.auto import load_model, model_skeleton

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    placed = split_map(model_skeleton(liquid_folder, "liquid", torch.float32))
    split = load_model(liquid_folder, device="cpu", batch_size=None, device_map=placed)
    assert len(list(tmp_path.glob("csdgen-offload-*"))) == 1
    assert csdgen.generate(split, ["a red dog"], method="sjd", window=4, seed=5).tokens.shape[0] == 1
    del split
    gc.collect()
    assert list(tmp_path.glob("csdgen-offload-*")) == []
