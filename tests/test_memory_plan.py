"""The memory plan (csdgen.models.memory / plan, csdgen plan): its arithmetic, and its peak against the peak measured
by the tensor-storage meter (bytes held at once by live tensors: weights, caches, buffers, each forward's
activations) on the built-in model and a tiny checkpoint, within 15 %."""

from __future__ import annotations

import pytest
import torch

import csdgen
from cli_helpers import cli_error, run

TOLERANCE = 0.15


def test_the_meter_counts_live_storages_and_their_peak():
    from csdgen.models.memory_meter import TensorMemoryMeter

    with TensorMemoryMeter() as meter:
        a = torch.zeros(1000, 1000)  # 4 MB
        b = a + 1  # 8 MB live
        view = a[:10]  # no new memory
        del b
        assert meter.live == 4_000_000
        del a, view
    assert meter.peak == 8_000_000 and meter.live == 0


def test_int8_weight_bytes_follow_the_formula():
    from csdgen.models.memory import linear_bytes

    assert linear_bytes(256, 512, None, 4) == 256 * 512 * 4
    assert linear_bytes(256, 512, "int8", 4) == 256 * 512 + 256 * 5  # data, a float32 scale and an int8 zero per row
    assert linear_bytes(256, 512, "nf4", 2) == 256 * 512 // 2 + 256 * 512 // 64 * 4
    assert linear_bytes(256, 512, "int4", 2) == 256 * 256 + 2 * 256 * 4 * 2
    with pytest.raises(ValueError, match="quantize='int3'.*int8, int4"):
        linear_bytes(1, 1, "int3", 4)


def test_builtin_plan_is_within_15_percent_of_measured_peak():
    from csdgen.models._transformers import kv_cache_bytes
    from csdgen.models.builtin import load_builtin_model
    from csdgen.models.memory_meter import TensorMemoryMeter
    from csdgen.models.plan import builtin_plan

    model = load_builtin_model(quantize="int8")
    B, W = 2, 16
    plan = builtin_plan(model, batch_size=B, window=W, guided=True, quantize="int8", free=2**40)
    parts = model.components
    with TensorMemoryMeter(parts.ar, parts.vq, parts.classifier) as meter:
        csdgen.generate(model, list(range(B)), method="csd", window=W, seed=0)
    assert meter.base == plan.weights  # the weights as planned are the weights held
    assert abs(plan.peak() - meter.peak) <= TOLERANCE * meter.peak, (plan.peak(), meter.peak)
    grown, planned = meter.peak - meter.base, plan.peak() - plan.weights  # the part that grows with the batch
    assert abs(planned - grown) <= TOLERANCE * grown, (planned, grown)
    cfg = model.backbone.config  # the cache: layers x 2 x kv heads x head dim x positions (the engine's 384) x rows x 4 B
    assert plan.kv_per_image == kv_cache_bytes(cfg, 2, 384, 4) == cfg.num_hidden_layers * 2 * 8 * 32 * 384 * 2 * 4


@pytest.fixture(scope="module")
def janus_folder(tmp_path_factory):
    from test_models_janus import build_checkpoint

    return str(build_checkpoint(tmp_path_factory.mktemp("janus")))


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_checkpoint_plan_is_within_15_percent_of_measured_peak(janus_folder, quantize):
    if quantize:
        pytest.importorskip("torchao", reason='torchao is not installed (pip install -c constraints.txt ".[quant]")')
    from csdgen.models.auto import load_model
    from csdgen.models.memory import module_bytes
    from csdgen.models.memory_meter import TensorMemoryMeter
    from csdgen.models.plan import checkpoint_plan

    model = load_model(janus_folder, device="cpu", batch_size=None, quantize=quantize)
    B, W, prompts = 8, 16, ["a red dog"] * 8
    plan = checkpoint_plan(janus_folder, "janus", batch_size=B, window=W, dtype=torch.float32, quantize=quantize,
                           prompt_length=model.prompt_length(prompts), free=2**40)
    assert plan.weights == module_bytes(model.model)  # arithmetic on the meta model == the loaded tensors
    with TensorMemoryMeter(model.model) as meter:
        csdgen.generate(model, prompts, method="sjd", window=W, seed=0)
    assert abs(plan.peak() - meter.peak) <= TOLERANCE * meter.peak, (plan.peak(), meter.peak)


def test_the_largest_batch_is_the_last_that_fits():
    from csdgen.models.memory import MemoryPlan

    plan = MemoryPlan("m", "cpu", "float32", None, 8, 16, 2, weights=1000, kv_per_image=100, buffers_per_image=20,
                      activations_per_image=30, free=10_000)
    largest = plan.largest_batch()
    assert plan.peak(largest) <= 9_000 < plan.peak(largest + 1) and largest == 53 and plan.fits()
    assert "largest batch 53" in plan.summary() and "weights 1000" not in plan.summary()


def test_csdgen_plan_prints_the_plan_of_the_builtin_model_and_of_a_checkpoint(janus_folder, capsys):
    assert run("plan", "--batch-size", 4, "--window", 16) == 0
    out = capsys.readouterr().out
    for row in ("weights", "KV cache", "window buffers", "activations", "peak", "free", "largest batch"):
        assert f"\n{row} " in out, out
    assert run("plan", "--batch-size", 1, "--guidance-scale", 1) == 0  # not "1 images x 1 rows"
    assert "\nbatch           1 image x 1 row, window 32\n" in capsys.readouterr().out
    # a batch that does not fit: the table all the same, and status 1 for a script (it was 0)
    assert run("plan", "--batch-size", 1_000_000) == 1
    assert "\nfits            no: the largest batch that fits is " in capsys.readouterr().out
    assert run("plan", "--model", janus_folder, "--quantize", "int8", "--device", "cpu") == 0
    out = capsys.readouterr().out
    assert "janus (" in out and "decoder layers int8" in out and "largest batch" in out
    assert "\nprompt          128 tokens, the longest row (assumed: --prompt-length sets it)\n" in out, out
    assert run("plan", "--model", janus_folder, "--prompt-length", 12, "--device", "cpu") == 0
    assert "\nprompt          12 tokens, the longest row\n" in capsys.readouterr().out  # as generate's prompts measure


def test_plan_notes_a_window_longer_than_the_image_as_generate_does(capsys):
    """``plan --window 1000`` planned the widest window a run opens (255 on the built-in model's 256-token
    images) without the note ``generate --window 1000`` prints; now the same note, from the same function,
    and the table shows the window the note names (it showed 255 under "using 256")."""
    from csdgen.cli._common import longer_than_image

    assert run("plan", "--batch-size", 1, "--window", 1000, "--device", "cpu") == 0
    captured = capsys.readouterr()
    assert captured.err == f"csdgen plan: note: {longer_than_image([1000], 256)}\n"
    assert "--window 1000 is longer than the image (256 tokens): using 256" in captured.err
    assert "window 256\n" in captured.out
    assert run("plan", "--batch-size", 1, "--window", 256, "--device", "cpu") == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "window 256\n" in captured.out


def test_a_checkpoint_plan_caps_the_window_at_its_image_length(janus_folder, capsys):
    """``plan --model <checkpoint> --window W`` planned W for an image of fewer tokens (the tiny Janus's 36), though
    a run caps its window there: now the plan is the capped window's, with generate's note."""
    from csdgen.cli._common import longer_than_image
    from csdgen.models.plan import checkpoint_plan

    assert run("plan", "--model", janus_folder, "--batch-size", 1, "--window", 64, "--device", "cpu") == 0
    captured = capsys.readouterr()
    assert captured.err == f"csdgen plan: note: {longer_than_image([64], 36)}\n"
    assert "window 36\n" in captured.out, captured.out
    capped = checkpoint_plan(janus_folder, "janus", batch_size=1, window=64, dtype=torch.float32, free=2**40)
    exact = checkpoint_plan(janus_folder, "janus", batch_size=1, window=36, dtype=torch.float32, free=2**40)
    assert capped.window == 36 and capped.peak() == exact.peak()


def test_plan_takes_the_builtin_weights_folder_its_error_points_to(tmp_path, capsys):
    """``plan --model FOLDER`` on a built-in model's weights says to give it as --weights FOLDER:
    plan now has that option (it had none, so the advice led to "unrecognized arguments")."""
    from builtin_fixture import make_tiny_weights

    weights = make_tiny_weights(tmp_path / "w")
    assert "give it as --weights FOLDER" in cli_error(capsys, "plan", "--model", weights)
    assert run("plan", "--weights", weights, "--batch-size", 2) == 0
    tiny = capsys.readouterr().out
    assert run("plan", "--batch-size", 2) == 0
    shipped = capsys.readouterr().out
    weights_of = {name: next(line for line in out.splitlines() if line.startswith("weights")) for name, out
                  in (("tiny", tiny), ("shipped", shipped))}
    assert weights_of["tiny"] != weights_of["shipped"] and "KiB" in weights_of["tiny"]  # the folder's model was planned
    err = cli_error(capsys, "plan", "--model", tmp_path / "checkpoint", "--weights", weights)
    assert err.startswith("csdgen plan: error: --weights is for the built-in model;"), err


@pytest.mark.parametrize("scale", ["-1", "nan", "inf"])
def test_plan_refuses_the_guidance_scales_generate_refuses(scale, capsys):
    """A negative, NaN or infinite --guidance-scale was planned as a guided run; generate refuses it."""
    err = cli_error(capsys, "plan", "--guidance-scale", scale)
    assert err == f"csdgen plan: error: --guidance-scale {float(scale):g}: must be a finite number >= 0\n", err
    assert "must be a finite number >= 0" in cli_error(capsys, "generate", "--guidance-scale", scale, "-n", 1)


def test_plan_refuses_the_layout_and_prompt_length_a_run_of_the_checkpoint_refuses(janus_folder, capsys):
    """--layout on a Janus checkpoint and a --prompt-length past its positions were planned (the latter
    as 4,774 GiB, "largest batch 0"); generate refuses both, and now plan does, in the same words."""
    err = cli_error(capsys, "plan", "--model", janus_folder, "--layout", "anole")
    assert err == f"csdgen plan: error: --layout anole applies to Chameleon checkpoints only; {janus_folder!r} is janus (Janus-Pro)\n"
    import json
    from pathlib import Path

    config = json.loads((Path(janus_folder) / "config.json").read_text())
    limit, image = config["text_config"]["max_position_embeddings"], config["vision_config"]["num_image_tokens"]
    assert run("plan", "--model", janus_folder, "--prompt-length", limit - image) == 0  # the longest prompt that fits
    capsys.readouterr()
    err = cli_error(capsys, "plan", "--model", janus_folder, "--prompt-length", limit - image + 1)
    assert f"> max_position_embeddings={limit}; allowed: prompts up to {limit - image} tokens" in err, err


@pytest.mark.parametrize("argv, reason", [
    (["--prompt-length", 50], "--prompt-length needs --model PATH (a checkpoint); the built-in model takes a class, not a prompt"),
    (["--layout", "anole"], "--layout needs --model PATH (a checkpoint); the built-in model is not a Chameleon checkpoint"),
    (["--image-size", 64, "--height", 64], "--height, --image-size need --model PATH (a checkpoint); the built-in model "
                                           "has one size"),
])
def test_plan_of_the_builtin_model_says_why_a_checkpoint_option_does_not_apply(argv, reason, capsys):
    """--prompt-length and --layout were refused because "the built-in model has one size"."""
    assert cli_error(capsys, "plan", *argv) == f"csdgen plan: error: {reason}\n"


def test_generate_says_the_plan_in_its_first_line(tmp_path, capsys):
    from builtin_fixture import make_tiny_weights

    weights = make_tiny_weights(tmp_path / "w")
    assert run("generate", "--weights", weights, "-n", 1, "--window", 4, "--no-maps", "--out", tmp_path / "o") == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("csdgen generate: the built-in model on cpu, float32 (the built-in model's dtype); "
                            "memory plan: weights "), first
    assert "KV cache" in first and "peak" in first and "largest batch" in first


def test_generate_plans_a_checkpoints_ar_run_at_window_1(janus_folder, tmp_path, capsys):
    """AR feeds one token per forward whatever --window says: its memory plan (and the batch memory allows) is
    window 1's, not the widest auto window's."""
    firsts = []
    for argv in (["--method", "ar"], ["--method", "ar", "--window", "8"], ["--method", "sjd", "--window", "1"]):
        assert run("generate", "--model", janus_folder, "--prompt", "a red fox", "-n", 1, "--no-maps",
                   "--out", tmp_path / argv[1] / argv[-1], *argv) == 0
        firsts.append(next(line for line in capsys.readouterr().err.splitlines() if "memory plan" in line))
    plans = [line.split("memory plan: ")[1].split(" of ")[0] for line in firsts]  # the free memory moves
    assert plans[0] == plans[1] == plans[2], plans


def test_a_tree_plan_counts_the_nodes_each_forward_feeds():
    from csdgen.models._transformers import kv_cache_bytes
    from csdgen.models.builtin import load_builtin_model
    from csdgen.models.memory import activation_bytes
    from csdgen.models.plan import builtin_plan
    from csdgen.runs import builtin_batch_limit
    from csdgen.trees import tree_layout, tree_nodes

    for K, D, W in [(2, 8, 16), (3, 2, 8), (2, 20, 4), (1, 3, 16)]:
        assert tree_nodes(K, D, W) == tree_layout(K, D, W).S
    model = load_builtin_model()
    cfg = model.backbone.config
    chain = builtin_plan(model, batch_size=4, window=16, free=2**34)
    tree = builtin_plan(model, batch_size=4, window=16, free=2**34, tree=(2, 8))
    # S = 1 + 2 + ... + 2^8 + (16 - 1 - 8) = 518 nodes, fed as the static engine's width bucket of 1024 columns;
    # the cache widens to hold them past the image: 1 + 256 + 1024 positions rounded up to 64 = 1344
    assert tree.tree == (2, 8, 518)
    assert tree.kv_per_image == kv_cache_bytes(cfg, 2, 1344, 4)
    assert tree.buffers_per_image == (2 + 3) * 1024 * model.codebook_size * 4
    assert tree.activations_per_image == activation_bytes(cfg, 2, 1024, 1344, 1024, cfg.vocab_size, 4)
    assert tree.peak() > chain.peak() and tree.largest_batch() < chain.largest_batch()
    assert "tree 2,8 (518 nodes a forward)" in tree.table()
    assert builtin_batch_limit(model, 16, True, 2**34, tree=(2, 8)) < builtin_batch_limit(model, 16, True, 2**34)


def test_a_tree_plan_is_within_15_percent_of_the_tree_runs_measured_peak():
    from csdgen.models.builtin import load_builtin_model
    from csdgen.models.memory_meter import TensorMemoryMeter
    from csdgen.models.plan import builtin_plan

    model = load_builtin_model()
    tree = (2, 5)  # 73 nodes a forward, fed as 128 columns
    plan = builtin_plan(model, batch_size=1, window=16, free=2**40, tree=tree)
    chain = builtin_plan(model, batch_size=1, window=16, free=2**40)
    parts = model.components
    with TensorMemoryMeter(parts.ar, parts.vq, parts.classifier) as meter:
        csdgen.generate(model, [0], method="sjd", window=16, seed=0, tree=tree)
    assert chain.peak() < meter.peak  # a plan of the chain window falls short of the tree run
    assert abs(plan.peak() - meter.peak) <= TOLERANCE * meter.peak, (plan.peak(), meter.peak)


def test_generate_refuses_a_tree_too_large_for_one_image_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("csdgen.models.memory_check.available_memory", lambda device: 4 * 2**30)
    err = cli_error(capsys, "generate", "-n", 1, "--class", 3, "--no-maps", "--method", "sjd", "--tree", "2,12",
                    "--window", 16, "--out", tmp_path / "o")
    assert err.startswith("csdgen generate: error: --tree 2,12 at window 16 feeds 8194 nodes a forward: one image needs about "), err
    assert "4.00 GiB free" in err and "allowed: a smaller tree" in err
    assert not (tmp_path / "o").exists()


def test_a_checkpoint_plan_counts_the_tree_nodes_too(janus_folder):
    from csdgen.models.plan import checkpoint_plan

    def plan(tree):
        return checkpoint_plan(janus_folder, "janus", batch_size=2, window=16, dtype=torch.float32, free=2**40,
                               tree=tree)

    chain, tree = plan(None), plan((2, 8))  # 518 nodes a forward, fed as 1024 columns
    assert tree.buffers_per_image == chain.buffers_per_image * 1024 // 17  # (rows + 3) x fed x V x 4 B, not W + 1
    assert tree.kv_per_image > chain.kv_per_image and tree.activations_per_image > chain.activations_per_image
    assert tree.tree == (2, 8, 518) and tree.peak() > chain.peak()


def test_generate_refuses_a_checkpoint_tree_too_large_before_reading_the_weights(janus_folder, tmp_path, capsys,
                                                                                   monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("the weights were read before the tree was refused")

    monkeypatch.setattr("csdgen.models.auto.load_model", no_load)
    monkeypatch.setattr("csdgen.models.plan.free_memory", lambda device: 2**30)
    err = cli_error(capsys, "generate", "--model", janus_folder, "--prompt", "a cat", "--device", "cpu", "--no-maps",
                    "--method", "sjd", "--tree", "2,12", "--window", 14, "--out", tmp_path / "o")
    assert err.startswith("csdgen generate: error: --tree 2,12 at window 14 feeds "), err
    assert "allowed: a smaller tree" in err
    assert not (tmp_path / "o").exists()
