"""load_model, family detection, the memory check and ``csdgen generate --model`` on the tiny
random checkpoints of the three adapter test modules (their builders are imported, not copied).
"""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from csdgen.models import ChameleonImageModel, Emu3ImageModel, JanusImageModel, load_model
from csdgen.models import auto, detect, dtypes, memory_check
from csdgen.models.defaults import FAMILY_DEFAULTS
from csdgen.models.defaults import family_defaults_table as FAMILY_DEFAULTS_TABLE

from test_models_chameleon import build_checkpoint as build_chameleon
from test_models_emu3 import FACTOR, HEIGHT, NEGATIVE, WIDTH
from test_models_emu3 import build_checkpoint as build_emu3
from test_models_janus import SIZE
from test_models_janus import build_checkpoint as build_janus
from cli_helpers import run

DOCS = Path(__file__).resolve().parents[1] / "docs" / "models.md"


@pytest.fixture(scope="module")
def janus_dir(tmp_path_factory):
    return build_janus(tmp_path_factory.mktemp("janus"))


@pytest.fixture(scope="module")
def emu3_dir(tmp_path_factory):
    return build_emu3(tmp_path_factory.mktemp("emu3"))


@pytest.fixture(scope="module")
def chameleon_dir(tmp_path_factory):
    return Path(build_chameleon(str(tmp_path_factory.mktemp("chameleon"))))


def config_only(source: Path, folder: Path, **changes) -> Path:
    """A folder holding only ``source``'s config.json (with ``changes``): enough for family detection."""
    folder.mkdir(parents=True)
    config = {**json.loads((source / "config.json").read_text()), **changes}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def without_weights(source: Path, folder: Path) -> Path:
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    return folder


# family detection and loading


def test_family_of_each_checkpoint_and_the_chameleon_layout_rule(janus_dir, emu3_dir, chameleon_dir, tmp_path):
    assert auto.family_of(janus_dir) == "janus" and auto.family_of(emu3_dir) == "emu3"
    assert auto.family_of(chameleon_dir) == "lumina-mgpt"  # the default layout
    assert auto.family_of(chameleon_dir, layout="anole") == "anole"
    assert auto.family_of(chameleon_dir, name="leloy/Anole-7b-v0.1-hf") == "anole"
    anole = config_only(chameleon_dir, tmp_path / "Anole-7b")
    assert auto.family_of(anole) == "anole" and auto.family_of(anole, layout="lumina") == "lumina-mgpt"
    assert auto.family_of(config_only(chameleon_dir, tmp_path / "Lumina-mGPT-7B-768")) == "lumina-mgpt"
    xllmx = config_only(chameleon_dir, tmp_path / "anole-named", architectures=["ChameleonXLLMXForConditionalGeneration"])
    assert auto.family_of(xllmx) == "lumina-mgpt"  # Lumina-mGPT's own class wins over the name
    with pytest.raises(ValueError, match="layout='emu3'; allowed: lumina, anole"):
        auto.family_of(chameleon_dir, layout="emu3")
    assert set(auto.MODEL_TYPES) == {"janus", "emu3", "chameleon", "glm_image", "gemma"}  # the last two: their own test files


def test_load_model_picks_the_adapter_of_each_family(janus_dir, emu3_dir, chameleon_dir):
    janus = load_model(janus_dir, device="cpu")
    assert isinstance(janus, JanusImageModel) and janus.grid == (6, 6) and janus.dtype == torch.float32
    emu3 = load_model(str(emu3_dir), height=HEIGHT, width=WIDTH, dtype="bfloat16", device="cpu")
    assert isinstance(emu3, Emu3ImageModel) and emu3.grid == (5, 6) and emu3.dtype == torch.bfloat16
    lumina = load_model(chameleon_dir, height=12, width=16, device="cpu")
    assert isinstance(lumina, ChameleonImageModel) and lumina.layout.kind == "lumina" and lumina.grid == (6, 8)
    anole = load_model(chameleon_dir, layout="anole", image_size=16, device="cpu")
    assert anole.layout.kind == "anole" and anole.grid == (8, 8)
    with pytest.raises(ValueError, match="image_size=48: .* allowed: 24"):
        load_model(janus_dir, image_size=48, device="cpu")
    with pytest.raises(ValueError, match="square images only"):
        load_model(janus_dir, height=24, width=48, device="cpu")
    with pytest.raises(ValueError, match="Chameleon checkpoints only"):
        load_model(janus_dir, layout="anole", device="cpu")


def test_repo_id_resolves_from_the_local_hugging_face_cache_only(janus_dir, tmp_path, monkeypatch):
    import huggingface_hub.constants

    commit = "0" * 40
    repo = tmp_path / "hub" / "models--someone--tiny-janus"
    shutil.copytree(janus_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    folder = auto.resolve_checkpoint("someone/tiny-janus")
    assert folder == repo / "snapshots" / commit and auto.family_of(folder) == "janus"
    assert isinstance(load_model("someone/tiny-janus", device="cpu"), JanusImageModel)
    with pytest.raises(FileNotFoundError, match="'someone/other': no such folder, and no Hugging Face repo"):
        auto.resolve_checkpoint("someone/other")


# errors


def test_nonexistent_path_says_what_was_looked_for_and_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no such folder.*local cache.*never downloads.*--model DIR"):
        load_model(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError, match="is a file"):
        load_model(tmp_path / "file")
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_model(tmp_path)


def test_unknown_model_type_lists_the_supported_families(janus_dir, tmp_path):
    folder = config_only(janus_dir, tmp_path / "llama", model_type="llama")
    with pytest.raises(ValueError, match=r"model_type='llama'; supported: janus \(Janus-Pro\), emu3 \(Emu3\), chameleon \(Lumina-mGPT 1.0 "
                                         r"and 2.0, Anole\), glm_image \(GLM-Image\), gemma \(Liquid\)"):
        load_model(folder)


def test_missing_weights_raise_the_adapters_error(janus_dir, emu3_dir, chameleon_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no weights"):
        load_model(without_weights(janus_dir, tmp_path / "janus"), device="cpu")
    with pytest.raises(FileNotFoundError, match="holds no weights"):
        load_model(without_weights(emu3_dir, tmp_path / "emu3"), height=HEIGHT, width=WIDTH, device="cpu")
    with pytest.raises(FileNotFoundError, match="holds no weights"):  # one exception type for every family
        load_model(without_weights(chameleon_dir, tmp_path / "chameleon"), height=12, width=16, device="cpu")


def _refused_in_one_line(folder, message: str, capsys, tmp_path) -> None:
    """``load_model(folder)`` raises ValueError with exactly ``message``; ``csdgen generate`` prints it as its one
    error line (status 2) and makes no output folder."""
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        load_model(folder, device="cpu")
    assert run("generate", "--model", folder, "--prompt", "a dog", "--device", "cpu", "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and not (tmp_path / "o").exists()


def test_a_cut_short_or_garbage_safetensors_file_is_refused_in_one_line_naming_it(janus_dir, tmp_path, capsys):
    """Found by a new-user try-out: a truncated or garbage model.safetensors gave safetensors' traceback ("header too
    large") from inside the loader; an index naming a missing shard gave transformers' long error."""
    whole = (janus_dir / "model.safetensors").read_bytes()
    cases = {"cut": (whole[:-100], "it holds {} bytes, its header promises {}: cut short".format(len(whole) - 100, len(whole))),
             "garbage": (b"\xff" * 5000, "its header cannot be read (5000 bytes)"),
             "not-json": (len(b"{nope").to_bytes(8, "little") + b"{nope", "its header is not a safetensors header")}
    for name, (data, problem) in cases.items():
        folder = without_weights(janus_dir, tmp_path / name)
        (folder / "model.safetensors").write_bytes(data)
        message = f"{str(folder / 'model.safetensors')!r} is not a whole safetensors file: {problem}; copy or download it again"
        _refused_in_one_line(folder, message, capsys, tmp_path)
    sharded = without_weights(janus_dir, tmp_path / "sharded")
    (sharded / "model-00001-of-00002.safetensors").write_bytes(whole)
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(FileNotFoundError, match=r"names 1 shard\(s\) not in the folder: model-00002-of-00002.safetensors; "
                                                r"copy every shard$"):
        load_model(sharded, device="cpu")
    (sharded / "model-00002-of-00002.safetensors").write_bytes(whole)
    (sharded / "stray.safetensors").write_bytes(b"\xff" * 50)  # not in the index: the loader does not read it
    from csdgen.models._transformers import check_checkpoint

    assert check_checkpoint(sharded, "Janus") == sharded


def test_a_cut_short_pytorch_bin_file_or_a_missing_bin_shard_is_refused_in_one_line_naming_it(janus_dir, tmp_path, capsys):
    """Found by a new-user try-out: a pytorch_model.bin cut to half gave torch's "failed finding central directory"
    traceback from inside the loader; a pytorch_model.bin.index.json naming a missing shard a bare "No such file"."""
    from safetensors.torch import load_file

    from csdgen.models._transformers import check_checkpoint

    whole = without_weights(janus_dir, tmp_path / "bin")
    torch.save(load_file(janus_dir / "model.safetensors"), whole / "pytorch_model.bin")  # torch's zip format
    assert check_checkpoint(whole, "Janus") == whole
    data = (whole / "pytorch_model.bin").read_bytes()
    cut = without_weights(janus_dir, tmp_path / "bincut")
    (cut / "pytorch_model.bin").write_bytes(data[: len(data) // 2])
    message = (f"{str(cut / 'pytorch_model.bin')!r} is not a whole torch weight file: a zip archive of {len(data) // 2} "
               f"bytes without its end (cut short); copy or download it again")
    _refused_in_one_line(cut, message, capsys, tmp_path)
    sharded = without_weights(janus_dir, tmp_path / "binshards")
    (sharded / "pytorch_model-00001-of-00002.bin").write_bytes(data)
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {
        "a": "pytorch_model-00001-of-00002.bin", "b": "pytorch_model-00002-of-00002.bin"}}))
    with pytest.raises(FileNotFoundError, match=r"pytorch_model.bin.index.json' names 1 shard\(s\) not in the folder: "
                                                r"pytorch_model-00002-of-00002.bin; copy every shard$"):
        load_model(sharded, device="cpu")


def test_a_folder_without_tokenizer_files_is_refused_naming_it_when_prompts_are_text(janus_dir, emu3_dir, chameleon_dir,
                                                                                      tmp_path, capsys):
    """Found by a new-user try-out: csdgen generate on a copy without its tokenizer said "the checkpoint has no
    tokenizer; give token-id lists" (no path; the CLI takes no token ids); Janus without its processor config gave
    transformers' error pointing to huggingface.co."""
    for source, extra in ((janus_dir, []), (emu3_dir, ["--height", str(HEIGHT), "--width", str(WIDTH)]),
                          (chameleon_dir, ["--height", "12", "--width", "16"])):
        folder = tmp_path / f"no-tokenizer-{source.name}"
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("tokenizer*", "special_tokens_map.json"))
        assert run("generate", "--model", folder, "--prompt", "a dog", "--device", "cpu", *extra,
                   "--out", tmp_path / "o") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{str(folder)!r}: no tokenizer (tokenizer.json, " in err[0], err
        assert "copy its tokenizer files there" in err[0] and not (tmp_path / "o").exists()
        with pytest.raises(FileNotFoundError, match="no tokenizer"):
            load_model(folder, device="cpu", prompts=["a dog"], height=None if source == janus_dir else 12 if
                       source == chameleon_dir else HEIGHT, width=None if source == janus_dir else 16 if
                       source == chameleon_dir else WIDTH)
    folder = tmp_path / f"no-tokenizer-{janus_dir.name}"  # serve and the demo take text from requests: refused at start
    assert run("serve", "--model", folder, "--device", "cpu", "--port", "0") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{str(folder)!r}: no tokenizer (tokenizer.json, " in err[0], err
    from csdgen.demo import load_demo_model

    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_demo_model(str(folder))
    folder = tmp_path / "janus-no-processor-config"
    shutil.copytree(janus_dir, folder, ignore=shutil.ignore_patterns("processor_config.json", "preprocessor_config.json"))
    assert run("generate", "--model", folder, "--prompt", "a dog", "--device", "cpu", "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and (f"{str(folder)!r} has a tokenizer but no processor config (processor_config.json or "
                              f"preprocessor_config.json)") in err[0], err
    with pytest.raises(FileNotFoundError, match="no processor config"):
        load_model(folder, device="cpu")  # without prompts too: the processor is read with the folder


def test_a_folder_with_tokenizer_config_but_no_tokenizer_json_is_refused_naming_it(janus_dir, emu3_dir, chameleon_dir,
                                                                                       tmp_path, capsys):
    """Found by a new-user try-out: transformers' five-line error (no folder, and a hint to install sentencepiece)."""
    for source, extra in ((janus_dir, []), (emu3_dir, ["--height", str(HEIGHT), "--width", str(WIDTH)]),
                          (chameleon_dir, ["--height", "12", "--width", "16"])):
        folder = tmp_path / f"no-tokenizer-json-{source.name}"
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("tokenizer.json"))
        assert (folder / "tokenizer_config.json").is_file()
        assert run("generate", "--model", folder, "--prompt", "a dog", "--device", "cpu", *extra,
                   "--out", tmp_path / "o") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{str(folder)!r}: no tokenizer.json beside tokenizer_config.json" in err[0], err
        assert "copy the checkpoint's tokenizer.json there" in err[0] and not (tmp_path / "o").exists()


def test_a_tokenizer_or_processor_file_cut_short_is_refused_naming_it(janus_dir, emu3_dir, tmp_path, capsys):
    """Found by a new-user try-out: a tokenizer.json cut short gave "Unterminated string starting at: line 17 column 18"
    with no file named (transformers' error)."""
    for source, name, extra in ((janus_dir, "tokenizer.json", []), (janus_dir, "processor_config.json", []),
                                (emu3_dir, "tokenizer_config.json", ["--height", str(HEIGHT), "--width", str(WIDTH)])):
        folder = tmp_path / f"{source.name}-{name}"
        shutil.copytree(source, folder)
        (folder / name).write_text((source / name).read_text()[:300])
        message = f"{str(folder / name)!r} is not valid JSON (line "
        with pytest.raises(ValueError, match="^" + re.escape(message)):
            load_model(folder, device="cpu", **({} if source == janus_dir else dict(height=HEIGHT, width=WIDTH)))
        assert run("generate", "--model", folder, "--prompt", "a dog", "--device", "cpu", *extra,
                   "--out", tmp_path / "o") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0] and "expected a tokenizer or processor file" in err[0], err


def test_vqgan_help_and_refusal_name_every_family_that_takes_it(janus_dir, tmp_path, capsys):
    """Found by a new-user try-out: --help said --vqgan was for Chameleon-format checkpoints only and the refusal
    left out Lumina-mGPT 2.0, while Liquid (its chameleon/ too) and Lumina-mGPT 2.0 (movqgan_270M.ckpt) take it."""
    with pytest.raises(SystemExit):
        run("generate", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "Lumina-mGPT, Anole and Liquid: Chameleon's VQGAN" in text and "(Liquid: also chameleon/)" in text
    assert "Lumina-mGPT 2.0: movqgan_270M.ckpt or its folder" in text
    with pytest.raises(ValueError, match=r"vqgan applies to Chameleon-format \(Lumina-mGPT, Anole, Lumina-mGPT 2.0\) "
                                         r"and Liquid checkpoints only; .* is janus \(Janus-Pro\)$"):
        load_model(janus_dir, vqgan=str(tmp_path))


def test_a_cuda_device_where_none_is_visible_is_refused_in_one_line(janus_dir, tmp_path, capsys, monkeypatch):
    """Found by a new-user try-out: generate --model and serve --model with --device cuda on a machine without CUDA
    ended in torch's traceback "Torch not compiled with CUDA enabled" from the memory check; load_model too."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for command, extra in (("generate", ["--prompt", "a dog", "--out", tmp_path / "o"]), ("serve", ["--port", 0])):
        assert run(command, "--model", janus_dir, "--device", "cuda", *extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"csdgen {command}: error: --device cuda: no CUDA device is visible here; use --device cpu"], (command, err)
    for device in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match=f"^device='{device}': no CUDA device is visible here; allowed: 'cpu'$"):
            load_model(janus_dir, device=device)


# memory check


def test_check_memory_equals_the_memory_plan_and_refuses_with_a_batch_that_fits(janus_dir, chameleon_dir, monkeypatch):
    from csdgen.models import plan as plans

    def plan(b, **kw):
        return plans.checkpoint_plan(janus_dir, "janus", batch_size=b, window=16, dtype=torch.float32, device="cpu",
                                     free=1 << 40, **kw)

    need = {b: plan(b).peak() for b in (1, 2, 3, 4)}
    assert need[4] - need[3] == plan(1).per_image > plan(1).kv_per_image  # the activations and buffers count
    check = plans.check_memory  # it looks estimate_memory and available_memory up in memory_check
    room = lambda n: int(n / (1 - auto.HEADROOM)) + 1  # available memory whose usable part is n bytes
    assert check(janus_dir, "janus", 4, 16, "float32", device="cpu", max_memory_bytes=room(need[4])) == need[4]
    with pytest.raises(ValueError, match=r"^janus at batch size 4, window 16, float32, prompts of 128 tokens needs about "
                                         r".* \(memory plan: weights, KV cache, window buffers, activations\) "
                                         r"but cpu has .* available \(.* after keeping 10% free\); try batch_size=2 "
                                         r"\(--batch-size 2 on the command line\)$"):
        check(janus_dir, "janus", 4, 16, "float32", device="cpu", max_memory_bytes=room(need[2] + need[3] >> 1))
    with pytest.raises(ValueError, match=r"try batch_size=[123] \(--batch-size [123] on the command line\)$"):  # the headroom is kept: need[4] alone is not enough
        check(janus_dir, "janus", 4, 16, "float32", device="cpu", max_memory_bytes=need[4])
    calls = []  # the estimate is computed once, whatever the batch size
    real = memory_check.estimate_memory
    monkeypatch.setattr(memory_check, "estimate_memory", lambda *a, **k: calls.append(1) or real(*a, **k))
    with pytest.raises(ValueError, match="try batch_size=1 "):
        check(janus_dir, "janus", 64, 16, "float32", device="cpu", max_memory_bytes=room(need[1]))
    assert len(calls) == 1
    monkeypatch.undo()
    short = check(janus_dir, "janus", 4, 16, "float32", device="cpu", max_memory_bytes=1 << 40, prompt_length=10)
    assert short == plan(4, prompt_length=10).peak() <= need[4]
    for bad in (-5, float("nan"), "1e9"):  # "cpu has -0.00 GiB available"
        with pytest.raises(ValueError, match=f"max_memory_bytes={bad!r}: allowed None .* or a number of bytes >= 0"):
            check(janus_dir, "janus", 1, 16, "float32", device="cpu", max_memory_bytes=bad)
    assert check(janus_dir, "janus", 1, 16, "float32", device="cpu", max_memory_bytes=8e9) == need[1]
    assert check(chameleon_dir, "lumina-mgpt", 2, 8, torch.float32, device="cpu", height=12, width=16,
                 max_memory_bytes=1 << 40) == plans.checkpoint_plan(
        chameleon_dir, "lumina-mgpt", batch_size=2, window=8, dtype=torch.float32, device="cpu", height=12, width=16,
        free=1 << 40).peak()
    assert 0 < memory_check.available_memory("cpu")


def test_load_model_refuses_a_batch_its_memory_plan_does_not_fit(janus_dir, monkeypatch):
    """The refusal and the run's first line are one plan: a batch the plan said did not fit was decoded."""
    from csdgen.models import plan as plans

    plan = plans.checkpoint_plan(janus_dir, "janus", batch_size=1, window=32, dtype=torch.float32, device="cpu",
                                 free=1 << 40)
    # free memory between the weights-and-KV estimate of 3 images and the plan's peak of 3
    estimate = memory_check.estimate_memory(janus_dir, "janus", 32, torch.float32).bytes(3)
    assert estimate < plan.peak(3)
    monkeypatch.setattr(memory_check, "available_memory", lambda device: int(plan.peak(3) / (1 - auto.HEADROOM)) - 1)
    with pytest.raises(ValueError, match="janus at batch size 3, window 32, .* try batch_size=2 "):
        load_model(janus_dir, device="cpu", batch_size=3, window=32)


def test_a_config_of_another_family_over_the_weights_is_named_so(chameleon_dir, janus_dir, tmp_path, capsys):
    """A Chameleon config.json copied over Liquid's weights (or the reverse) was read as its own family's folder and
    ended in an unrelated error (an image size or pad token the folder lacks, the vocabulary's image rows): now it is
    named a config of another family, with the family its weights are laid out for."""
    from test_models_liquid import build_checkpoint as build_liquid

    liquid_dir = build_liquid(tmp_path / "liquid")
    capsys.readouterr()  # the build's progress bar
    for weights, config, of, expected in ((liquid_dir, chameleon_dir, "'chameleon' (Lumina-mGPT 1.0 and 2.0, Anole)",
                                           "gemma (Liquid)"),
                                          (chameleon_dir, liquid_dir, "'gemma' (Liquid)",
                                           "chameleon (Lumina-mGPT 1.0 and 2.0, Anole)"),
                                          (janus_dir, chameleon_dir, "'chameleon' (Lumina-mGPT 1.0 and 2.0, Anole)",
                                           "janus (Janus-Pro)")):
        folder = tmp_path / f"{Path(weights).name}-with-{Path(config).name}-config"
        shutil.copytree(weights, folder)
        shutil.copy(Path(config) / "config.json", folder / "config.json")
        message = (f"{str(folder / 'config.json')!r} is a config of another family: model_type {of}, while the weights "
                   f"beside it are laid out for {expected}; expected the config.json saved with these weights (model_type "
                   f"{expected.split()[0]!r}): copy it back into the folder")
        _refused_in_one_line(folder, message, capsys, tmp_path)
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            auto.family_of(folder)  # what csdgen plan reads too
    for folder, model_type in ((liquid_dir, "gemma"), (chameleon_dir, "chameleon"), (janus_dir, "janus")):
        assert auto.weights_model_type(folder) == model_type and auto.model_type_of(folder) == model_type


def _as_bin_shards(source: Path, folder: Path) -> Path:
    """``source`` copied with its safetensors weights saved again as two ``pytorch_model-*.bin`` shards and the
    ``pytorch_model.bin.index.json`` transformers writes beside them (its layout for ``safe_serialization=False``)."""
    from safetensors.torch import load_file

    shutil.copytree(source, folder)
    state = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(file))
        file.unlink()
    (folder / "model.safetensors.index.json").unlink(missing_ok=True)
    names = sorted(state)
    shards = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
    for shard, held in shards.items():
        torch.save({k: state[k] for k in held}, folder / shard)
    weight_map = {k: shard for shard, held in shards.items() for k in held}
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def test_checkpoint_tensor_names_reads_the_index_the_headers_or_the_bin_files_alike(chameleon_dir, janus_dir, tmp_path):
    """One reader of a checkpoint's tensor names serves the family check and the Chameleon loader: the safetensors
    headers, the index's weight map and the .bin shards give the same names as safetensors' own reader; a header
    that is not one is named."""
    from safetensors import safe_open

    from csdgen.models._transformers import check_weight_files, checkpoint_tensor_names

    expected = set()
    for file in Path(chameleon_dir).glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            expected.update(f.keys())
    assert expected and checkpoint_tensor_names(chameleon_dir) == expected
    assert checkpoint_tensor_names(chameleon_dir, index=False) == expected
    stray = tmp_path / "with-a-stray-file"
    shutil.copytree(chameleon_dir, stray)
    (stray / "model.safetensors.index.json").unlink(missing_ok=True)
    assert (stray / "model.safetensors").is_file()  # a file of another model beside the one transformers reads:
    shutil.copy(next(Path(janus_dir).glob("*.safetensors")), stray / "other.safetensors")
    assert checkpoint_tensor_names(stray) == expected
    assert auto.weights_model_type(stray) == "chameleon"
    bins = _as_bin_shards(Path(chameleon_dir), tmp_path / "bins")
    assert checkpoint_tensor_names(bins) == expected  # from the index
    (bins / "pytorch_model.bin.index.json").unlink()
    assert checkpoint_tensor_names(bins) == expected  # from the shards themselves
    assert checkpoint_tensor_names(bins, read_bin=False) == set()
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "model.safetensors").write_bytes((5).to_bytes(8, "little") + b"[1,2]")
    with pytest.raises(ValueError, match=re.escape(f"{str(garbage / 'model.safetensors')!r} is not a whole safetensors "
                                                   "file: its header is not a safetensors header")):
        checkpoint_tensor_names(garbage)
    (garbage / "model.safetensors").unlink()
    (garbage / "pytorch_model.bin").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match=re.escape(f"{str(garbage / 'pytorch_model.bin')!r} is not a torch weight file (")):
        checkpoint_tensor_names(garbage)
    torch.save([1, 2], garbage / "pytorch_model.bin")
    with pytest.raises(ValueError, match=re.escape(f"{str(garbage / 'pytorch_model.bin')!r} holds a list, not a state dict")):
        checkpoint_tensor_names(garbage)
    (garbage / "pytorch_model.bin").unlink()
    (garbage / "model.safetensors").mkdir()  # a folder of that name: "Is a directory" from open(), a bare OSError
    for read in (checkpoint_tensor_names, check_weight_files):
        with pytest.raises(ValueError, match=re.escape(f"{str(garbage / 'model.safetensors')!r} is a folder, not a "
                                                       "safetensors file")):
            read(garbage)


@pytest.mark.parametrize("weight_map", [["a", "b"], "model.safetensors", None])
def test_a_weight_index_without_a_weight_map_object_is_refused_in_one_line(chameleon_dir, tmp_path, weight_map):
    """An index whose weight_map was a list or a string ended in AttributeError from the file check, and one
    without weight_map passed it and failed in transformers' loader (KeyError): both are one line naming it."""
    from csdgen.models._transformers import check_checkpoint

    folder = tmp_path / "bad-index"
    shutil.copytree(chameleon_dir, folder)
    body = {"metadata": {}} if weight_map is None else {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(body))
    message = (f"{str(folder / 'model.safetensors.index.json')!r} has no weight_map object (tensor name -> shard file); "
               "expected the index saved with the shards")
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        check_checkpoint(folder, "Chameleon")


def test_a_config_of_another_family_over_bin_shards_is_named_so(chameleon_dir, janus_dir, tmp_path, capsys):
    """The family check reads the names of .bin shards from their index (it opens no .bin file): a Janus config.json
    over a Chameleon checkpoint saved as .bin shards is refused as one over safetensors weights is."""
    folder = _as_bin_shards(Path(chameleon_dir), tmp_path / "bins-with-janus-config")
    assert auto.weights_model_type(folder) == "chameleon"
    shutil.copy(Path(janus_dir) / "config.json", folder / "config.json")
    with pytest.raises(ValueError, match=re.escape(f"{str(folder / 'config.json')!r} is a config of another family: "
                                                   "model_type 'janus'")):
        auto.family_of(folder)


def test_load_model_refuses_before_reading_weights(janus_dir, emu3_dir, chameleon_dir, tmp_path):
    for folder, kw in ((janus_dir, {}), (emu3_dir, dict(height=HEIGHT, width=WIDTH))):
        with pytest.raises(ValueError, match="even batch size 1 does not fit"):
            load_model(folder, device="cpu", max_memory_bytes=1000, **kw)
    # weights that cannot be read do not matter: every refusal comes first
    for source, name, kw, match in [
        (janus_dir, "janus", dict(max_memory_bytes=1000), "needs about"),
        (janus_dir, "janus", dict(image_size=48), "image_size=48: .* allowed: 24"),
        (janus_dir, "janus", dict(prompts=["a " * 2048]), r"prompt of 2054 tokens \+ image of 36 positions"),
        (emu3_dir, "emu3", dict(height=40, width=40), "max_position_embeddings=128; allowed: .* up to 20 x 20 px"),
        (emu3_dir, "emu3", dict(height=HEIGHT, width=WIDTH, negative_prompt=NEGATIVE, prompts=["x" * 100]),
         r"prompt of 147 tokens \+ image of 38"),
        (chameleon_dir, "chameleon", dict(height=10, width=16), "height=10: allowed positive multiples of 4"),
        (chameleon_dir, "Anole-tiny", dict(prompts=["red " * 70]), r"prompt of 72 tokens \+ image of 66 positions"),
        (chameleon_dir, "chameleon", dict(height=12, width=16, prompt_template="{prompt} {seed}"), r"allowed fields"),
        # the memory check's inputs (batch size 0, -1 and 2.5 and a bare prompt string were taken as they came)
        (janus_dir, "janus", dict(batch_size=0), r"batch_size=0: allowed an integer >= 1"),
        (janus_dir, "janus", dict(batch_size=2.5), r"batch_size=2.5: allowed an integer >= 1"),
        (janus_dir, "janus", dict(window=-1), r"window=-1: allowed an integer >= 1"),
        (janus_dir, "janus", dict(prompts="a red dog"), r"prompts='a red dog': allowed a list of prompt strings"),
    ]:
        broken = without_weights(source, tmp_path / f"broken-{len(list(tmp_path.iterdir()))}-{name}")
        header = json.dumps({"x": {"dtype": "NOT-A-DTYPE", "shape": [1], "data_offsets": [0, 1]}}).encode()
        (broken / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0")  # whole, unloadable
        with pytest.raises(ValueError, match=match):
            load_model(broken, device="cpu", **kw)


def test_load_model_checks_memory_with_the_real_prompt_length(janus_dir, monkeypatch):
    seen = []
    real = auto.check_memory
    monkeypatch.setattr(auto, "check_memory", lambda *a, **k: seen.append(k["prompt_length"]) or real(*a, **k))
    load_model(janus_dir, device="cpu", prompts=["a red dog", "the cat running in the rain"])
    load_model(janus_dir, device="cpu")
    # <bos> <|User|> : the cat running in the rain <|Assistant|> : <begin_of_image> = 12 tokens; unknown prompts: 128
    assert seen == [12, None]


def test_auto_re_exports_the_names_of_detect_dtypes_and_memory_check():
    """``from csdgen.models.auto import X`` gives the very object of X's home module, for every public name there."""
    for home in (detect, dtypes, memory_check):
        for name in home.__all__:
            assert name in auto.__all__ and getattr(auto, name) is getattr(home, name), (home.__name__, name)
    assert all(hasattr(auto, name) for name in auto.__all__)
    assert auto.family_defaults_table is FAMILY_DEFAULTS_TABLE


# documentation


def test_docs_table_matches_family_defaults():
    assert auto.family_defaults_table() in DOCS.read_text()
    assert set(FAMILY_DEFAULTS) >= {"janus", "emu3", "lumina-mgpt", "anole"}


# csdgen generate --model


def test_cli_janus_uses_family_defaults_writes_everything_and_resumes(janus_dir, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["generate", "--model", janus_dir, "--prompt", "a red dog", "--prompt", "the cat", "-n", 3, "--batch-size", 2,
            "--device", "cpu", "--out", out]
    assert run(*argv) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "0000_a-red-dog.png", "0000_a-red-dog_map.png", "0001_the-cat.png", "0001_the-cat_map.png",
        "0002_a-red-dog.png", "0002_a-red-dog_map.png", "record.json"]
    record = json.loads((out / "record.json").read_text())
    s, d = record["settings"], FAMILY_DEFAULTS["janus"]
    assert (s["family"], s["model"], s["checkpoint"], s["dtype"], s["method"]) == ("janus", str(janus_dir), str(janus_dir), "float32", "csd")
    assert (s["sampling"]["guidance_scale"], s["sampling"]["temperature"], s["sampling"]["top_k"]) == (
        d.guidance_scale, d.temperature, d.top_k) == (5.0, 1.0, None)
    assert s["window"] == "auto"  # as csdgen.generate: window left out -> "auto"
    assert f"lam={d.lam}" in s["rule"] and f"delta={d.delta}" in s["rule"]
    image = record["images"]["2"]
    assert image["prompt"] == "a red dog" and image["tokens"] == 36 and image["steps"] >= 1
    from PIL import Image

    assert Image.open(out / "0000_a-red-dog.png").size == (SIZE, SIZE)
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("3 images, 108 tokens,")
    first = (out / "0000_a-red-dog.png").stat().st_mtime_ns
    (out / "0002_a-red-dog.png").unlink()
    assert run(*argv) == 0  # resumes: only the missing image's batch is redone
    assert (out / "0000_a-red-dog.png").stat().st_mtime_ns == first and (out / "0002_a-red-dog.png").is_file()
    assert run(*argv[:-1], out, "--guidance-scale", 2) == 2  # other settings, same folder
    assert "other settings" in capsys.readouterr().err


def test_cli_emu3_prompts_file_overrides_and_family_defaults(emu3_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\n\ntwo dogs\n")
    out = tmp_path / "out"
    assert run("generate", "--model", emu3_dir, "--prompts-file", prompts, "--height", HEIGHT, "--width", WIDTH,
               "--top-k", 8, "--window", 5, "--lam", 0.25, "--negative-prompt", NEGATIVE, "--device", "cpu", "--no-maps",
               "--out", out) == 0
    assert sorted(p.name for p in out.iterdir()) == ["0000_a-red-cat.png", "0001_two-dogs.png", "record.json"]
    s, d = json.loads((out / "record.json").read_text())["settings"], FAMILY_DEFAULTS["emu3"]
    assert s["family"] == "emu3" and s["grid"] == [5, 6] and s["prompts"] == ["a red cat", "two dogs"]
    assert s["negative_prompt"] == NEGATIVE
    assert s["sampling"]["guidance_scale"] == d.guidance_scale and s["sampling"]["temperature"] == d.temperature  # defaults
    assert s["sampling"]["top_k"] == 8 and s["window"] == 5 and "lam=0.25" in s["rule"]  # overrides
    assert f"delta={d.delta}" in s["rule"]
    from PIL import Image

    assert Image.open(out / "0000_a-red-cat.png").size == (WIDTH, HEIGHT)
    out2 = tmp_path / "out2"
    assert run("generate", "--model", emu3_dir, "--prompt", "a red cat", "--height", HEIGHT, "--width", WIDTH,
               "--top-k", "none", "--negative-prompt", "", "--method", "ar", "--device", "cpu", "--no-maps", "--out", out2) == 0
    assert json.loads((out2 / "record.json").read_text())["settings"]["sampling"]["top_k"] is None


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--prompt", "a dog", "--class", "moon"], "--class is for the built-in model"),
        ([], "--model needs prompts"),
        (["--prompt", "a dog", "--weights", "w"], "--weights is for the built-in model"),
        (["--prompts-file", "/nonexistent/prompts.txt"], "does not exist"),
        (["--prompts-file", "/"], "--prompts-file '/' is a folder; allowed: a text file, one prompt per line"),
        (["--prompt", "a dog", "--layout", "anole"], "Chameleon checkpoints only"),
        (["--prompt", "a dog", "--negative-prompt", "ugly"], "Emu3 checkpoints only"),
        (["--prompt", "a dog", "--positive-prompt", ""], "Emu3 checkpoints only"),
        (["--prompt", "a dog", "--prompt-template", "{text}"], "has no {prompt}; allowed fields: {prompt}, {width}, {height}"),
        (["--prompt", "a " * 2048], "prompt of 2054 tokens + image of 36 positions = 2090 > max_position_embeddings=2048; "
                                    "allowed: prompts up to 2012 tokens"),
        (["--prompt", "a dog", "--image-size", 48], "image_size=48: this Janus checkpoint makes 24 x 24 images only"),
    ],
)
def test_cli_model_errors_are_clear(janus_dir, tmp_path, capsys, extra, message):
    assert run("generate", "--model", janus_dir, "--device", "cpu", "--out", tmp_path / "o", *extra) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1  # one line


def test_cli_model_options_need_model_and_memory_is_checked(janus_dir, tmp_path, capsys, monkeypatch):
    assert run("generate", "--prompt", "a dog", "--out", tmp_path / "o") == 2
    assert "--prompt needs --model" in capsys.readouterr().err
    assert run("generate", "--model", tmp_path / "nowhere", "--prompt", "a dog", "--out", tmp_path / "o") == 2
    assert "no such folder" in capsys.readouterr().err
    monkeypatch.setattr(memory_check, "available_memory", lambda device: 1000)  # where check_memory looks it up
    assert run("generate", "--model", janus_dir, "--prompt", "a dog", "--device", "cpu", "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err
    assert "needs about" in err and "B available" in err and not (tmp_path / "o").exists()


def test_cli_chameleon_without_vqgan_files_is_refused_before_generating(chameleon_dir, tmp_path, capsys):
    folder = tmp_path / "Lumina-mGPT-tiny"
    shutil.copytree(chameleon_dir, folder, ignore=shutil.ignore_patterns("vqgan.*"))
    assert run("generate", "--model", folder, "--prompt", "a dog", "--height", 12, "--width", 16, "--top-k", 8,
               "--device", "cpu", "--out", tmp_path / "o") == 2
    assert "has no image decoder: give --vqgan PATH (Chameleon's tokenizer/ folder holding vqgan.yaml and vqgan.ckpt)" in capsys.readouterr().err


def test_missing_decoder_files_are_refused_before_the_weights_are_read(chameleon_dir, tmp_path, capsys):
    """Found by a new-user try-out: generate, bench, serve and the demo read the whole checkpoint (minutes for 7B)
    before saying that its VQGAN files were missing; now the weights are not read (here they could not be)."""
    folder = tmp_path / "Lumina-mGPT-tiny"
    shutil.copytree(chameleon_dir, folder, ignore=shutil.ignore_patterns("vqgan.*", "*.safetensors"))
    header = json.dumps({"x": {"dtype": "NOT-A-DTYPE", "shape": [1], "data_offsets": [0, 1]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0")  # whole, unloadable
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a dog\n")
    size = ["--height", 12, "--width", 16, "--device", "cpu"]
    for argv in (["generate", "--prompt", "a dog", "--top-k", 8, *size, "--out", tmp_path / "o"],
                 ["bench", "--prompts", prompts, "--limit", 1, "--top-k", 8, *size, "--out", tmp_path / "b"],
                 ["serve", *size, "--port", 0]):
        assert run(argv[0], "--model", folder, *argv[1:]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{str(folder)!r} has no image decoder: give --vqgan PATH" in err[0], (argv[0], err)
    from csdgen.demo import load_demo_model

    with pytest.raises(ValueError, match="has no image decoder"):
        load_demo_model(str(folder), image_size=16)
    auto.require_decoder_files(folder, "lumina-mgpt", "x", vqgan=chameleon_dir)  # a --vqgan given: the loader checks it
    auto.require_decoder_files(chameleon_dir, "lumina-mgpt", "x")  # the files there: nothing to say


def test_cli_prompt_template_every_family_and_the_greedy_warning(janus_dir, emu3_dir, chameleon_dir, tmp_path, capsys):
    """--prompt-template reaches each family's prompt rows; --temperature 0 prints exactly one warning line."""
    common = ["--device", "cpu", "--no-maps", "--method", "ar", "--top-k", 4]
    assert run("generate", "--model", janus_dir, "--prompt", "dog", "--prompt-template", "a red {prompt}", "--temperature", 0,
               "--out", tmp_path / "j", *common) == 0
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "--temperature 0 is greedy decoding" in err
    settings = json.loads((tmp_path / "j" / "record.json").read_text())["settings"]
    assert settings["prompt_template"] == "a red {prompt}" and settings["sampling"]["temperature"] == 0
    assert run("generate", "--model", emu3_dir, "--prompt", "cat", "--prompt-template", "{prompt} {width}x{height}",
               "--positive-prompt", "", "--negative-prompt", NEGATIVE, "--height", HEIGHT, "--width", WIDTH,
               "--out", tmp_path / "e", *common) == 0
    assert "warning" not in capsys.readouterr().err
    assert run("generate", "--model", chameleon_dir, "--layout", "anole", "--prompt", "cat", "--prompt-template",
               "red {prompt}<reserved08706>", "--out", tmp_path / "a", *common) == 0
    # the same rows through the library
    janus = load_model(janus_dir, device="cpu", prompt_template="a red {prompt}")
    assert janus.prompt_rows(["dog"]) == load_model(janus_dir, device="cpu").prompt_rows(["a red dog"])
    emu3 = load_model(emu3_dir, device="cpu", height=HEIGHT, width=WIDTH, prompt_template="{prompt} {width}x{height}",
                      positive_prompt="", negative_prompt=NEGATIVE)
    plain = load_model(emu3_dir, device="cpu", height=HEIGHT, width=WIDTH, positive_prompt="", negative_prompt=NEGATIVE)
    assert emu3.prompt_rows(["cat"])[0] == plain.prompt_rows(["cat 12x10"])[0] != plain.prompt_rows(["cat"])[0]
    anole = load_model(chameleon_dir, layout="anole", device="cpu", prompt_template="red {prompt}<reserved08706>")
    assert anole.prompt_rows(["cat"]) == load_model(chameleon_dir, layout="anole", device="cpu").prompt_rows(["red cat"])


def test_family_objects_carry_their_defaults(janus_dir, emu3_dir, chameleon_dir):
    assert load_model(janus_dir, device="cpu").defaults is FAMILY_DEFAULTS["janus"]
    assert load_model(emu3_dir, device="cpu", height=HEIGHT, width=WIDTH).defaults is FAMILY_DEFAULTS["emu3"]
    assert load_model(chameleon_dir, device="cpu", height=12, width=16).defaults is FAMILY_DEFAULTS["lumina-mgpt"]
    anole = load_model(chameleon_dir, layout="anole", device="cpu").defaults
    assert anole is FAMILY_DEFAULTS["anole"] and (anole.temperature, anole.top_p, anole.guidance_scale) == (0.7, 0.9, 3.0)


def test_cli_anole_uses_its_reference_sampling(chameleon_dir, tmp_path):
    assert run("generate", "--model", chameleon_dir, "--layout", "anole", "--prompt", "cat", "--device", "cpu", "--no-maps",
               "--window", 8, "--out", tmp_path / "a") == 0
    sampling = json.loads((tmp_path / "a" / "record.json").read_text())["settings"]["sampling"]
    assert (sampling["temperature"], sampling["top_p"], sampling["guidance_scale"], sampling["top_k"]) == (0.7, 0.9, 3.0, None)


@pytest.mark.parametrize("text, message", [
    ('{"model_type": "multi_modality"}', "DeepSeek's original Janus format (model_type 'multi_modality')"),
    ("[1]", "holds a list, expected a JSON object"),
    ("{,}", "is not valid JSON"),
])
def test_load_model_names_the_config_file_it_cannot_use(tmp_path, text, message):
    """From Python too (not only the CLI): a bad config.json is one ValueError line naming the file."""
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError) as exc:
        load_model(tmp_path, device="cpu")
    assert str(tmp_path / "config.json") in str(exc.value) and message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_missing_repo_names_the_real_cache_folder(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError) as exc:
        auto.resolve_checkpoint("someone/absent")
    assert str(tmp_path / "hub") in str(exc.value) and "$HF_HUB_CACHE" not in str(exc.value)


# a model already loaded in a notebook


def test_load_model_from_memory(janus_dir, emu3_dir, chameleon_dir, tmp_path):
    """load_model / from_model take an in-memory transformers Janus, Emu3 or Chameleon model: special ids from
    its config, generation config and processor (or the folder it came from), the same prompt rows and the
    same greedy tokens as loading the folder; Lumina-mGPT's size, VQ codebook and q/k norms checked as there."""
    import csdgen
    from transformers import (AutoTokenizer, ChameleonForConditionalGeneration, Emu3ForConditionalGeneration,
                              JanusForConditionalGeneration, JanusProcessor)

    from csdgen import SamplingConfig

    from test_models_chameleon import lumina_layout, without_vq_weights
    from test_models_janus import PROMPTS as JANUS_PROMPTS

    greedy = SamplingConfig(temperature=0, guidance_scale=3.0)

    def same(a, b, prompts, **kwargs):
        assert type(a) is type(b) and a.prompt_rows(prompts) == b.prompt_rows(prompts)
        assert torch.equal(csdgen.generate(a, prompts, method="ar", sampling=greedy, **kwargs).tokens,
                           csdgen.generate(b, prompts, method="ar", sampling=greedy, **kwargs).tokens)

    janus = JanusForConditionalGeneration.from_pretrained(janus_dir)
    from_folder = load_model(janus_dir, device="cpu")
    same(load_model(janus, processor=JanusProcessor.from_pretrained(janus_dir)), from_folder, JANUS_PROMPTS)
    same(load_model(janus), from_folder, JANUS_PROMPTS)  # processor from the folder it was loaded from
    from csdgen.models import from_model

    assert (from_model(janus).bos_token_id, from_model(janus).boi_token_id, from_model(janus).pad_token_id) == \
        (from_folder.bos_token_id, from_folder.boi_token_id, from_folder.pad_token_id)

    emu3 = Emu3ForConditionalGeneration.from_pretrained(emu3_dir)
    options = dict(height=HEIGHT, width=WIDTH, negative_prompt=NEGATIVE)
    same(load_model(emu3, processor=AutoTokenizer.from_pretrained(emu3_dir), **options),
         load_model(emu3_dir, device="cpu", **options), ["a red cat", "two dogs"])

    chameleon = ChameleonForConditionalGeneration.from_pretrained(chameleon_dir)
    anole = load_model(chameleon, processor=AutoTokenizer.from_pretrained(chameleon_dir), layout="anole")
    same(anole, load_model(chameleon_dir, layout="anole", device="cpu"), ["red cat"])
    assert anole.codebook_stored is True and anole.vqgan is not None  # files checked, VQGAN found beside them

    # Lumina-mGPT: the size from the name, the missing codebook detected, per-shard q/k norms checked
    tuned = Path(without_vq_weights(str(chameleon_dir), tmp_path / "Lumina-mGPT-tuned"))
    loaded = ChameleonImageModel.from_pretrained(str(tuned), height=12, width=16)
    lumina = from_model(loaded.backbone, height=12, width=16, name=tuned)
    assert lumina.layout.kind == "lumina" and lumina.codebook_stored is False and lumina.vqgan is None
    with pytest.raises(ValueError, match=r"--vqgan PATH"):
        lumina.codebook_embeddings()
    with pytest.raises(ValueError, match=r"Lumina-mGPT image size unknown: .*Lumina-mGPT-tuned"):
        from_model(loaded.backbone, name=tuned)  # no size in the name (the names' rule: test_lumina_resolution_from_checkpoint)
    random_norms = ChameleonForConditionalGeneration.from_pretrained(
        lumina_layout(str(chameleon_dir), tmp_path / "Lumina-shards"), ignore_mismatched_sizes=True)
    with pytest.raises(ValueError, match=r"_norm.(weight|bias) differs from .*Lumina-shards.*csdgen.models.load_model"):
        from_model(random_norms, height=12, width=16)
    random_norms.name_or_path = ""  # no folder to check against: said, not silent
    with pytest.warns(UserWarning, match="whether its VQ codebook was loaded cannot be checked"):
        from_model(random_norms, height=12, width=16)

    # refusals, one line each
    with pytest.raises(TypeError, match=r"got int, not a loaded model nor a checkpoint folder; allowed: a loaded "
                                        r"transformers JanusForConditionalGeneration"):
        load_model(42)
    with pytest.raises(TypeError, match=r"a JanusModel \(model_type 'janus_model'\)|a JanusModel"):
        load_model(janus.model)
    with pytest.raises(ValueError, match=r"dtype: apply when loading from a folder"):
        load_model(janus, dtype="bfloat16")
    with pytest.raises(ValueError, match=r"layout applies to Chameleon models only"):
        load_model(janus, layout="anole")
    with pytest.raises(ValueError, match=r"processor: Janus needs its JanusProcessor"):
        load_model(janus, processor=AutoTokenizer.from_pretrained(janus_dir))
    with pytest.raises(ValueError, match=r"prompt of .* tokens \+ image of 36 positions"):
        load_model(janus, prompts=["a " * 2048])


def test_a_family_default_the_checkpoint_cannot_take_is_named_as_the_default(emu3_dir, tmp_path, capsys):
    """Found by a new-user try-out: a tiny codebook under Emu3's top-k 2048 was '--top-k 2048: exceeds ...' though
    no --top-k was given."""
    out = tmp_path / "o"
    assert run("generate", "--model", emu3_dir, "--prompt", "a dog", "--height", HEIGHT, "--width", WIDTH,
               "--negative-prompt", "blurry", "--device", "cpu", "--out", out) == 2
    err = capsys.readouterr().err
    assert "--top-k 2048 (the model's default; --top-k was not given): exceeds the codebook size" in err, err
    assert run("generate", "--model", emu3_dir, "--prompt", "a dog", "--height", HEIGHT, "--width", WIDTH,
               "--negative-prompt", "blurry", "--device", "cpu", "--top-k", 5000, "--out", out) == 2
    assert "--top-k 5000: exceeds the codebook size" in capsys.readouterr().err


def test_serve_refuses_a_family_default_top_k_the_checkpoint_cannot_take_as_generate_does(emu3_dir, capsys):
    """serve dropped Emu3's top-k 2048 on a tiny codebook without a word, where generate and bench refuse it
    naming it as the model's default; it refuses the same way at start-up, and a --top-k given is taken."""
    argv = ["serve", "--model", emu3_dir, "--height", HEIGHT, "--width", WIDTH, "--device", "cpu", "--port", 0]
    assert run(*argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--top-k 2048 (the model's default; --top-k was not given): exceeds the codebook size" in err, err
    assert run(*argv, "--top-k", 0) == 2  # the tiny Emu3's default negative prompt is too long for it: the next refusal
    err = capsys.readouterr().err
    assert "top-k" not in err and "negative prompt" in err, err


def test_the_demo_refuses_a_family_default_top_k_the_checkpoint_cannot_take(emu3_dir):
    """The demo dropped Emu3's top-k 2048 on a tiny codebook without a word (its page still said top-k 2048), where
    generate refuses it; it refuses at start-up, naming the value as the model's default."""
    from csdgen.demo import load_demo_model

    with pytest.raises(ValueError, match=r"^top-k 2048 \(the model's default; the demo runs the model's sampling "
                                         r"defaults and has no --top-k\): exceeds the codebook size V=64; allowed: 1..64"):
        load_demo_model(str(emu3_dir), image_size=HEIGHT)


def test_the_demo_refuses_a_model_its_default_request_cannot_run_on(emu3_dir, monkeypatch):
    """The demo started on a model whose default request can never run (the tiny Emu3's default negative prompt
    is longer than its positions allow) and failed on every run; it refuses at start-up as serve does."""
    import csdgen.engine as engine
    from csdgen.demo import load_demo_model

    monkeypatch.setattr(engine, "check_top_k", lambda model, top_k: None)  # past its top-k 2048 (refused first)
    with pytest.raises(ValueError, match=r"^the demo's default request cannot run on this model: the negative "
                                         r"prompt's row of \d+ tokens \+ image of \d+ positions"):
        load_demo_model(str(emu3_dir), image_size=HEIGHT)


def test_serve_takes_emu3s_negative_and_positive_prompts_as_generate_does(emu3_dir, capsys):
    """serve had no --negative-prompt, though its refusal of the tiny Emu3's default one (too long for its
    positions) told the user to give one: the server's model takes both prompts, and the built-in model refuses them."""
    import argparse

    from csdgen.cli import serve as serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--model", str(emu3_dir), "--height", str(HEIGHT), "--width", str(WIDTH),
                              "--device", "cpu", "--top-k", "0", "--negative-prompt", "blurry",
                              "--positive-prompt", ""])
    served, _, _ = serve_cli.served_model(args)
    assert served.model.negative_prompt == "blurry" and served.model.positive_prompt == ""
    assert run("serve", "--negative-prompt", "blurry", "--port", 0) == 2
    assert "--negative-prompt needs --model (a checkpoint); the built-in model takes class names" in capsys.readouterr().err
    # a default request the model refuses names no option serve lacks (it said "the --prompt option")
    argv = ["serve", "--model", emu3_dir, "--height", HEIGHT, "--width", WIDTH, "--device", "cpu", "--top-k", 0, "--port", 0]
    assert run(*argv) == 2
    err = capsys.readouterr().err
    assert "negative prompt's row" in err and "--prompt option" not in err, err


@pytest.mark.parametrize("command", ["compare", "sweep"])
def test_compare_and_sweep_take_a_checkpoints_size_and_prompts_and_the_builtin_model_refuses_them(command, capsys):
    """compare and sweep run a checkpoint through bench, which takes --height/--width and Emu3's prompts; they
    lacked them (a non-square Emu3 or GLM-Image could not be compared). The built-in model refuses each by name."""
    for option, value in (("--height", "64"), ("--width", "64"), ("--negative-prompt", "blurry"),
                          ("--positive-prompt", ""), ("--prompt-template", "{prompt}")):
        assert run(command, option, value, "-n", 2, "--out", "unused") == 2
        err = capsys.readouterr().err
        why = "draws at one size" if option in ("--height", "--width") else "takes class names, not text prompts"
        assert f"{option} needs --model" in err and why in err and "Traceback" not in err, err


def test_compare_runs_an_emu3_checkpoint_at_its_size_with_the_prompts_given(emu3_dir, tmp_path, capsys):
    """compare --model runs as bench with the checkpoint options bench takes: the size and Emu3's prompts reach the
    model and bench.json (where a rerun with other prompts is refused)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red dog\n")
    out = tmp_path / "compare"
    argv = ["compare", "--model", str(emu3_dir), "--prompts", str(prompts), "--limit", 1, "--methods", "sjd",
            "--window", 4, "--height", HEIGHT, "--width", WIDTH, "--negative-prompt", "blurry", "--positive-prompt", "",
            "--top-k", 0, "--device", "cpu", "--out", out]
    assert run(*argv) == 0
    settings = json.loads((out / "bench.json").read_text())["settings"]
    assert settings["negative_prompt"] == "blurry" and settings["positive_prompt"] == ""
    assert settings["grid"] == [HEIGHT // FACTOR, WIDTH // FACTOR]  # a non-square grid: the size given
    argv[argv.index("blurry")] = "dark"
    assert run(*argv) == 2
    assert "negative_prompt" in capsys.readouterr().err
