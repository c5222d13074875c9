"""benchmarks/gpu_check.py: the one command a GPU loan runs, smoke-tested end to end on the CPU
(reduced sizes), its verdicts (tolerances, the sync counter, exit status, time bounds) checked on
made-up inputs, and csdgen's engine importable on a machine without the demo's or the server's
packages (the GPU machine's image has neither)."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from builtin_fixture import weights_8x8  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_quick_run_on_the_cpu_prints_one_line_per_check_and_writes_the_json(tmp_path, weights_8x8):
    checks = "logits,grow,continuous,syncs,forward,speedup,dtype,compile,quant"  # serve: its own test below
    run = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--quick", "--out", str(tmp_path),
                          "--only", checks, "--weights", str(weights_8x8)], cwd=ROOT, capture_output=True, text=True, timeout=600, env=ENV)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("check ")]
    assert [line.split()[1] for line in lines] == checks.split(","), run.stdout
    status = {line.split()[1]: line.split()[2] for line in lines}
    assert all(status[name] == "PASS" for name in ("logits", "grow", "continuous", "dtype")), run.stdout
    assert all(status[name] == "INFO" for name in ("syncs", "forward", "speedup", "compile", "quant")), run.stdout
    assert "every correctness check passed" in run.stdout.splitlines()[-1]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert list(report["checks"]) == checks.split(",") and report["device"] == "cpu"
    # the figures behind the lines: both dtypes and every width compared, a batch that grew past its 2 slots
    logits = report["checks"]["logits"]["details"]
    assert {f"{d}_W{w}" for d in ("float32", "bfloat16") for w in (1, 16, 32)} <= set(logits)
    assert report["checks"]["continuous"]["details"]["most_in_batch"] > 2
    assert set(report["checks"]["forward"]["details"]["ms_per_forward"]["eager"]) == {"1", "16", "32", "64"}
    assert all(r["peak_memory_bytes"] > 0 for r in report["checks"].values())
    if importlib.util.find_spec("torchao"):  # int8 beside float32: fewer weight bytes (the quick check's tiny Llama)
        quant = report["checks"]["quant"]["details"]
        assert quant["int8_weight_bytes"] < 0.6 * quant["float32_weight_bytes"], quant


def test_an_isolated_check_runs_in_its_own_process_and_reports_back(tmp_path, weights_8x8):
    run = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--quick", "--only", "dtype",
                          "--isolate", "on", "--out", str(tmp_path), "--weights", str(weights_8x8)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env=ENV)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "checks in their own processes" in run.stdout
    record = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]["dtype"]
    # the child loaded --weights: the tiny weights' peaked distributions accept nearly every draft (the shipped model: ~3x)
    assert record["status"] == "PASS" and record["details"]["runs"]["csd float32"]["step_compression"] > 20, record


def test_engine_differences_beyond_the_tolerance_fail():
    g = _gpu_check()
    torch.manual_seed(0)
    logits = 5 * torch.randn(4, 3, 64)
    same = g.compare_logits(logits + 1e-5, logits)
    assert g.within_tolerance(same, torch.float32) and same["argmax_agree"] == 1.0
    assert not g.within_tolerance(g.compare_logits(logits + 1e-2 * torch.randn_like(logits), logits), torch.float32)
    # bfloat16: distributions, not logits: a shift of every logit changes nothing, a stale buffer everything
    assert g.within_tolerance(g.compare_logits(logits + 0.5, logits), torch.bfloat16)
    assert not g.within_tolerance(g.compare_logits(torch.randn_like(logits), logits), torch.bfloat16)
    # a bfloat16 model further from float32 than the fixed tolerance widens it to twice that distance
    slightly = g.compare_logits(logits + 0.3 * torch.randn_like(logits), logits)
    assert not g.within_tolerance(slightly, torch.bfloat16)
    assert g.within_tolerance(slightly, torch.bfloat16, noise={"tv_mean": slightly["tv_mean"], "tv_max": slightly["tv_max"]})
    with pytest.raises(ValueError, match=r"logits of shape \(4, 3, 64\) against \(4, 2, 64\)"):
        g.compare_logits(logits, logits[:, :2])


def test_the_cpu_sync_count_is_one_per_decoding_iteration_and_sees_an_added_read(monkeypatch):
    import csdgen
    from csdgen.engine import loop

    g = _gpu_check()
    model = g.tiny_llama(torch.device("cpu"), torch.float32)

    def run():
        return csdgen.generate(model, [0, 1], method="csd", window=8, seed=0, engine="eager")

    result, syncs, where, iterations = g.count_syncs(run, torch.device("cpu"), model)
    assert iterations >= 2 and syncs == iterations, where
    # control: one more host read of a device tensor per iteration is counted
    advance = loop._Loop._advance

    def reading(self, *args, **kwargs):
        out = advance(self, *args, **kwargs)
        int(next(model.backbone.parameters()).flatten()[0].sign())
        return out

    monkeypatch.setattr(loop._Loop, "_advance", reading)
    result, syncs, where, iterations = g.count_syncs(run, torch.device("cpu"), model)
    assert syncs == 2 * iterations, where


def test_a_failed_or_stopped_correctness_check_fails_the_run(monkeypatch, capsys):
    g = _gpu_check()

    def wrong(ctx):
        ctx.record(figure=1)
        return g.Outcome("FAIL", "logits differ")

    def slow(ctx):
        ctx.record(before_the_bound=True)
        time.sleep(30)

    monkeypatch.setattr(g, "CHECKS", {"good": g.Check(lambda ctx: g.Outcome("INFO", "a figure"), 10, False),
                                      "wrong": g.Check(wrong, 10, True),
                                      "slow": g.Check(slow, 0.4, True)})
    assert g.main(["--device", "cpu", "--quick"]) == 1
    out = capsys.readouterr().out
    lines = {line.split()[1]: line.split()[2] for line in out.splitlines() if line.startswith("check ")}
    assert lines == {"good": "INFO", "wrong": "FAIL", "slow": "TIMEOUT"}, out
    assert out.splitlines()[-1].endswith("2 failed")
    monkeypatch.setattr(g, "CHECKS", {"good": g.CHECKS["good"]})
    assert g.main(["--device", "cpu"]) == 0


@pytest.mark.parametrize("check", ["check_serve", "check_serve_open", "check_serve_closed"])
def test_serve_is_skipped_in_one_line_where_the_server_cannot_be_imported(monkeypatch, check):
    g = _gpu_check()
    monkeypatch.setattr(g, "serve_missing", lambda: ["fastapi", "uvicorn"])
    outcome = getattr(g, check)(g.Context(torch.device("cpu"), quick=True, compile=False))
    assert outcome.status == "SKIP" and outcome.line.startswith("fastapi, uvicorn cannot be imported here")


def test_serve_open_replays_arrivals_into_both_batchings_and_reports_their_p95(tmp_path, weights_8x8):
    """The open-loop check on the CPU (reduced: 2 slots, 3 s of arrivals): benchmarks/serve_replay.py
    runs the server's scheduler for continuous and static batching on the same arrivals."""
    run = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--quick", "--out", str(tmp_path),
                          "--only", "serve_open", "--weights", str(weights_8x8)], cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("check serve_open"))
    assert line.split()[2] == "INFO" and "x static's" in line and "0 errors" in line, line
    cells = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]["serve_open"]["details"]["cells"]
    assert [c["mode"] for c in cells] == ["continuous", "static"]
    assert cells[0]["requests"] == cells[1]["requests"] >= 1 and all(c["errors"] == 0 and c["p95"] > 0 for c in cells)


def test_serve_closed_reports_the_median_over_ar_of_the_rounds_after_each_client_counts_first(monkeypatch):
    """The closed-loop check reads benchmarks/served_closed_loop.py's --json (its format is checked by
    tests/test_benchmarks_run.py): per client count, each method's median ratio over AR of the rounds
    after the first (that one compiles the shapes it meets), or of the one round there is."""
    g = _gpu_check()

    def cell(clients, method, ratios):
        return {"clients": clients, "method": method, "window": "auto", "rounds": [{"over_first": r} for r in ratios]}

    report = {"cells": [cell(1, "ar", [1.0] * 3), cell(1, "csd", [0.5, 1.4, 1.6]), cell(1, "sjd", [0.4, 1.2, 1.2]),
                        cell(4, "ar", [1.0]), cell(4, "csd", [0.96])]}
    seen = []
    monkeypatch.setattr(g, "run_benchmark", lambda ctx, script, options: seen.append((script, options)) or report)
    outcome = g.check_serve_closed(g.Context(torch.device("cpu"), quick=False, compile=False))
    assert seen[0][0] == "served_closed_loop.py" and "1,4,16,32" in seen[0][1] and "ar:1,sjd:auto,csd:auto" in seen[0][1]
    assert outcome.status == "INFO" and outcome.goal.startswith("SJD and CSD >= 0.97x AR at every client count")
    assert outcome.line.endswith("1 client: CSD 1.50x, SJD 1.20x; 4 clients: CSD 0.96x"), outcome.line


def test_bad_arguments_are_refused_in_one_line(capsys):
    g = _gpu_check()
    for args, says in ((["--only", "logits,nope"], "--only 'logits,nope': allowed a comma-separated list of logits,"),
                       (["--budget", "0"], "--budget 0.0: allowed seconds > 0"),
                       (["--device", "gpu"], "--device 'gpu': allowed cuda, cuda:N or cpu")):
        with pytest.raises(SystemExit) as exit:
            g.main(args)
        err = capsys.readouterr().err
        assert exit.value.code == 2 and says in err, (args, err)
    if not torch.cuda.is_available():
        assert g.main([]) == 2
        assert "CUDA is not available here" in capsys.readouterr().err


def test_the_engine_imports_and_decodes_without_the_demo_and_server_packages():
    """The GPU machine's image has no gradio, fastapi, uvicorn or openai: csdgen's engine must not need them."""
    code = """
import sys
for name in ("gradio", "fastapi", "uvicorn", "openai", "starlette", "pydantic"):
    sys.modules[name] = None  # import fails
import csdgen, csdgen.decoding, csdgen.models, csdgen.engine, csdgen.models._static, csdgen.runs, csdgen.bench
from csdgen.models import ClassConditionalLlama
from csdgen.engine import ContinuousBatch
model = ClassConditionalLlama.random(codebook_size=16, num_classes=2, grid=(2, 2))
print(csdgen.generate(model, [0, 1], method="csd", window=2, seed=0).tokens.shape)
"""
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env=ENV)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "torch.Size([2, 4])"


def test_bench_gpu_reduced_run_prints_the_forward_times_the_floor_and_a_method_row(tmp_path):
    out = tmp_path / "gpu.json"
    run = subprocess.run([sys.executable, "benchmarks/bench_gpu.py", "--device", "cpu", "--model", "random", "--batches", "1",
                          "--repeats", "1", "--engines", "static-eager", "--methods", "csd", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env=ENV)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "bandwidth floor of one forward: " in run.stdout
    assert "t(1) = " in run.stdout and "t(64) = " in run.stdout and "t(8)" not in run.stdout
    assert any(line.split()[:2] == ["CSD", "32"] for line in run.stdout.splitlines()), run.stdout
    record = json.loads(out.read_text())
    assert record["floor_seconds"] > 0 and list(record["batches"]["1"]) == ["static-eager"]


def test_the_floor_counts_the_weights_a_decode_forward_reads():
    """Not the input embedding (a gather), of the output layer only the codebook rows, a tied weight once."""
    from csdgen.models import ClassConditionalLlama

    g = _gpu_check()
    model = ClassConditionalLlama.random(codebook_size=32, num_classes=4, grid=(4, 4), hidden_size=16, num_layers=1)
    backbone = model.backbone
    layers = sum(p.numel() for p in backbone.model.layers.parameters()) + backbone.model.norm.weight.numel()
    assert g.streamed_weight_bytes(model) == 4 * (layers + 32 * 16)
    backbone.lm_head.weight = backbone.model.embed_tokens.weight  # tied
    assert g.streamed_weight_bytes(model) == 4 * (layers + 32 * 16)
