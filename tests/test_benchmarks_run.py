"""The benchmark scripts run (reduced, most on tiny random weights in the built-in model's layout, their
``--weights``): a benchmark that fails only when someone runs it for a figure is found here instead
(bench_overhead broke at batch 16 when csdgen began refusing an image index given twice, and nobody saw
it until a figure was owed)."""

import os
import json
import subprocess
import sys
from pathlib import Path

import pytest

from builtin_fixture import weights_8x8  # noqa: F401 (a fixture)
from csdgen.engine.acceptance_model import _AcceptanceModel

ROOT = Path(__file__).resolve().parents[1]


def test_bench_overhead_reduced_run_prints_one_line_per_case(tmp_path):
    out = tmp_path / "overhead.json"
    run = subprocess.run(
        [sys.executable, "benchmarks/bench_overhead.py", "--models", "builtin", "--batches", "2", "--cases", "AR,W32",
         "--engines", "eager,static,floor", "--repeats", "1", "--iterations", "4", "--floor-repeats", "2",
         "--no-csd", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("overhead builtin B=2")]
    assert len(lines) == 6, run.stdout
    assert all(" ms/iteration, " in line and line.endswith(" x floor") for line in lines)
    assert out.is_file()


def test_bench_decoding_pairs_rounds_and_says_when_three_percent_is_not_told_apart():
    import importlib.util
    import math


    spec = importlib.util.spec_from_file_location("bench_decoding", ROOT / "benchmarks" / "bench_decoding.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    mean, half = bench.paired_gap([1.02, 1.04, 1.03], [1.0, 1.0, 1.0])
    assert mean == pytest.approx(0.03) and half == pytest.approx(4.30 * 0.01 / math.sqrt(3))
    assert bench.paired_gap([1.0], [1.0])[1] == math.inf  # one round: no interval
    # a machine that slows between rounds moves both runs of a round alike: the paired gap stays small
    mean, half = bench.paired_gap([1.0, 2.0, 1.5], [1.0, 2.0, 1.5])
    assert mean == 0 and half == 0


def test_bench_decoding_reduced_run_prints_the_goal_lines(weights_8x8):
    run = subprocess.run(
        [sys.executable, "benchmarks/bench_decoding.py", "--batches", "1", "--repeats", "2", "--images", "1", "--min-batches", "1",
         "--timing-repeats", "1", "--no-profile", "--methods", "csd", "--weights", str(weights_8x8)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    goals = [line for line in run.stdout.splitlines() if line.startswith("goal ") and " batch 1:" in line]
    # --methods csd: AR and CSD run, SJD does not
    assert [line.split()[1] for line in goals] == ["CSD"], run.stdout
    assert all("paired gaps" in line and "(95 %)" in line for line in goals), run.stdout
    assert "CSD at window 32 and auto" in run.stdout and "\nSJD " not in run.stdout
    # one image per round, one batch (the fewest decodes that still give two paired rounds)
    assert "2 rounds, each of 1 batch(es) of 1 per cell" in run.stdout, run.stdout[:600]
    assert "cells by the means; by the paired intervals:" in run.stdout and "width chooser's check" in run.stdout


def test_bench_decoding_refuses_bad_arguments_in_one_line(capsys):
    """--repeats 0, --batches 0 or x, --window 0, --timing-repeats 0 gave
    tracebacks; --tolerance -1 ran and printed 'at most -100 % behind'."""
    import importlib.util


    spec = importlib.util.spec_from_file_location("bench_decoding", ROOT / "benchmarks" / "bench_decoding.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for args, says in ((["--repeats", "0"], "--repeats: 0: must be an integer >= 1"),
                       (["--batches", "0"], "--batches: '0': 0: must be an integer >= 1 per batch size"),
                       (["--batches", "1,x"], "--batches: '1,x': 'x': expected an integer in 1.."),
                       (["--window", "0"], "--window: 0: must be an integer >= 2"),
                       (["--timing-repeats", "0"], "--timing-repeats: 0: must be an integer >= 1"),
                       (["--images", "1001"], "--images: 1001: allowed at most 1000"),
                       (["--min-batches", "0"], "--min-batches: 0: must be an integer >= 1"),
                       (["--batches", "300", "--min-batches", "4"],
                        "--min-batches 4 and --images 16 with batch size 300: 4 batches, 1200 images per round; allowed at most 1000"),
                       (["--tolerance", "-1"], "--tolerance: '-1': allowed a fraction in [0, 1)"),
                       (["--methods", "ar"], "--methods: 'ar': allowed SJD, CSD, comma-separated, each once"),
                       (["--methods", "csd,CSD"], "--methods: 'csd,CSD': allowed SJD, CSD, comma-separated, each once")):
        with pytest.raises(SystemExit) as stop:  # refused while the arguments are read, before the model loads
            bench.main(args)
        assert stop.value.code == 2 and says in capsys.readouterr().err, args


def test_acceptance_model_check_prints_raw_and_calibrated_errors_per_width(weights_8x8):
    run = subprocess.run([sys.executable, "benchmarks/acceptance_model_check.py", "--images", "1", "--weights", str(weights_8x8)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    for method in ("SJD", "CSD"):
        assert f"\n{method} measured: W4 " in run.stdout, run.stdout
    calibrated = [line for line in run.stdout.splitlines() if "counts, calibrated:" in line]
    assert len(calibrated) == 8 and all(line.count(" %") == 5 for line in calibrated), run.stdout
    # calibrated at its own width, a source width's error there is zero, unless the factor was cut to its range
    low, high = _AcceptanceModel.CALIBRATION_RANGE
    inside = [line for line in calibrated if low < float(line.split("(factor ")[1].rstrip(")")) < high]
    assert inside, run.stdout  # the tiny weights' SJD factors lie inside the range
    for line in inside:
        source = int(line.split("window")[1].split()[0])
        assert f"W{source}   +0 %" in line or f"W{source}   -0 %" in line, line


def test_auto_against_ar_prints_every_pair_and_the_parts_of_an_iteration(weights_8x8):
    run = subprocess.run([sys.executable, "benchmarks/auto_against_ar.py", "--batch", "2", "--pairs", "2",
                          "--weights", str(weights_8x8)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert sum(line.startswith("round ") and " %; auto's widths {" in line for line in lines) == 2, run.stdout
    assert any(line.startswith("auto against AR: mean of the pairs' gaps ") for line in lines), run.stdout
    ar = next(line for line in lines if line.startswith("  AR per iteration: "))
    auto = next(line for line in lines if line.startswith("auto per iteration: "))
    assert "forward " in ar and "outside " in ar and "choose" not in ar, ar
    for part in ("forward", "outside", "choose", "observe", "laggard_ratio"):
        assert f"{part} " in auto, auto


def _bench_serve():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_serve", ROOT / "benchmarks" / "bench_serve.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_bench_serve_poisson_arrivals_are_seeded_and_bounded_in_count_and_time():

    bench = _bench_serve()
    arrivals = bench.poisson_arrivals(5.0, 1000, 60.0, 7, seed=3)
    assert arrivals == bench.poisson_arrivals(5.0, 1000, 60.0, 7, seed=3)  # the same traffic for every batching
    assert arrivals != bench.poisson_arrivals(5.0, 1000, 60.0, 7, seed=4)
    times = [a["at"] for a in arrivals]
    assert times == sorted(times) and times[-1] <= 60.0
    # 5 images/s in requests of 2.5 images on average: about 2 requests/s for 60 s (Poisson: 120 +- 11)
    assert 85 < len(arrivals) < 155 and {a["n"] for a in arrivals} == {1, 2, 3, 4}
    assert 4.0 < sum(a["n"] for a in arrivals) / times[-1] < 6.0
    assert len(bench.poisson_arrivals(5.0, 10, 60.0, 7, seed=3)) == 10  # bounded by the count
    with pytest.raises(ValueError, match="rate=0"):
        bench.poisson_arrivals(0, 10, 60.0, 7, seed=3)
    # exact: the same draw, its times scaled by one factor so that it offers exactly the rate
    exact = bench.poisson_arrivals(5.0, 1000, 60.0, 7, seed=3, exact=True)
    images = sum(a["n"] for a in exact)
    factor = images / 5.0 / 60.0
    assert factor != pytest.approx(1.0, abs=1e-3)  # this draw offered other than 5 images/s
    assert [(a["n"], a["prompt"], a["seed"]) for a in exact] == [(a["n"], a["prompt"], a["seed"]) for a in arrivals]
    assert [a["at"] for a in exact] == pytest.approx([a["at"] * factor for a in arrivals])
    assert exact[-1]["at"] <= images / 5.0


def test_bench_serve_refuses_bad_load_arguments_naming_them_and_takes_repeated_per_client_counts(capsys):

    bench = _bench_serve()
    for argv, message in [(["--clients", "x"], "'x': expected comma-separated int values"),
                          (["--clients", "0"], "value 0 is out of range; allowed: integers >= 1"),
                          (["--methods", "csd,foo"], "unknown method 'foo'; allowed: ar, sjd, csd"),
                          (["--modes", "bar"], "unknown batching 'bar'; allowed: continuous, one-at-a-time, static"),
                          (["--max-batch", "0"], "--max-batch: 0: must be an integer >= 1"),
                          (["--duration", "-1"], "--duration: '-1': allowed a number > 0"),
                          (["--clients", "1,4", "--per-client", "4,2,1"], "--per-client 4,2,1: allowed one number, or one per --clients entry (2)")]:
        with pytest.raises(SystemExit) as stop:
            bench.main(argv)
        assert stop.value.code == 2 and message in capsys.readouterr().err, argv
    from csdgen.cli._options import numbers

    assert numbers(int, distinct=False)("4,2,1,1") == [4, 2, 1, 1]  # --per-client's reading: repeats kept
    with pytest.raises(bench.argparse.ArgumentTypeError, match="given twice"):
        numbers(int)("4,2,1,1")  # --clients': every count once
    parser = bench.argparse.ArgumentParser()
    assert bench.per_client_counts(parser, [4, 2, 1, 1], [1, 4, 16, 32]) == [4, 2, 1, 1]  # a count may repeat
    assert bench.per_client_counts(parser, [3], [1, 4]) == [3, 3]


def test_bench_serve_against_a_running_server_reports_its_own_batching_and_max_batch(tmp_path, capsys, weights_8x8):
    """``--url``: the table's batching and max batch are the server's (its /health), not the
    benchmark's own --modes and --max-batch defaults, and prompts are classes of --weights."""
    from csdgen.models.builtin import load_builtin_model
    from csdgen.serve import BackgroundServer, ServedModel, create_app

    bench = _bench_serve()
    app = create_app(ServedModel(load_builtin_model(weights_8x8), "tiny"), capacity=3, batching="static")
    with BackgroundServer(app) as server:
        bench.main(["--url", server.url, "--clients", "1", "--per-client", "2", "--methods", "ar",
                    "--weights", str(weights_8x8), "--json", str(tmp_path / "url.json")])
    rows = json.loads((tmp_path / "url.json").read_text())["rows"]
    assert [(r["mode"], r["max_batch"], r["requests"], r["errors"]) for r in rows] == [("static", 3, 2, 0)]
    assert "| ar | static | 3 | 1 |" in capsys.readouterr().out


def test_bench_serve_open_loop_reduced_run_reports_latency_and_queue_wait(tmp_path, weights_8x8):
    out = tmp_path / "open.json"
    run = subprocess.run(
        [sys.executable, "benchmarks/bench_serve.py", "--arrivals", "poisson", "--rate", "1", "--capacity", "4",
         "--requests", "4", "--duration", "3", "--drain", "120", "--methods", "csd", "--modes", "continuous",
         "--threads", "1", "--weights", str(weights_8x8), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-2000:] + run.stdout[-2000:]
    assert "| csd | continuous | 16 | 1 | " in run.stdout and "p99 s | queue wait s" in run.stdout, run.stdout
    assert "capacity csd: 4.000 images/s (given)" in run.stdout
    import json

    cell = json.loads(out.read_text())["rows"][0]
    assert cell["requests"] >= 1 and cell["answered"] == cell["requests"] and cell["lost"] == cell["errors"] == 0
    assert cell["images"] >= cell["requests"] and cell["p50"] <= cell["p95"] <= cell["p99"] and cell["queue_wait"] >= 0
    assert cell["occupancy"] >= 1.0


def test_bench_serve_closed_loop_per_client_sends_the_same_requests_every_round(tmp_path, weights_8x8):
    out = tmp_path / "closed.json"
    run = subprocess.run(
        [sys.executable, "benchmarks/bench_serve.py", "--clients", "1,2", "--per-client", "2,1", "--repeat", "2",
         "--methods", "ar", "--modes", "continuous", "--check", "0", "--threads", "1", "--weights", str(weights_8x8),
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-2000:] + run.stdout[-2000:]
    import json

    rows = json.loads(out.read_text())["rows"]
    assert [(r["round"], r["clients"], r["requests"]) for r in rows] == [(0, 1, 2), (0, 2, 2), (1, 1, 2), (1, 2, 2)]
    # the same requests in both rounds: the same images
    assert [r["images"] for r in rows[:2]] == [r["images"] for r in rows[2:]] and all(r["errors"] == 0 for r in rows)
    assert "| 1 | ar | continuous | 16 | 2 | 2 | " in run.stdout and "over ar |" in run.stdout, run.stdout
    bad = subprocess.run([sys.executable, "benchmarks/bench_serve.py", "--clients", "1,2", "--per-client", "2,1,3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--per-client 2,1,3: allowed one number, or one per --clients entry (2)" in bad.stderr


def test_served_closed_loop_names_a_bad_configuration(capsys):
    import importlib.util


    spec = importlib.util.spec_from_file_location("served_closed_loop", ROOT / "benchmarks" / "served_closed_loop.py")
    loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loop)
    for value, says in (("csd:0", "'csd:0': allowed method:window, window an integer >= 1 or auto"),
                        ("ar:1,,csd:auto", "'': allowed method:window"),
                        ("foo:auto", "unknown method 'foo'; allowed: ar, sjd, csd")):
        with pytest.raises(SystemExit) as stop:  # refused while the arguments are read, before the model loads
            loop.main(["--configs", value])
        assert stop.value.code == 2 and says in capsys.readouterr().err, value
    assert loop.configs("AR:1,CSD:auto") == [("ar", 1), ("csd", "auto")]


def test_served_closed_loop_runs_the_configurations_in_turn_round_by_round(tmp_path, weights_8x8):
    out = tmp_path / "closed.json"
    run = subprocess.run([sys.executable, "benchmarks/served_closed_loop.py", "--threads", "1", "--per-client", "1",
                          "--rounds", "2", "--configs", "ar:1,sjd:4", "--json", str(out), "--weights", str(weights_8x8)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    cells = json.loads(out.read_text())["cells"]  # what benchmarks/gpu_check.py's serve_closed reads
    assert [(c["clients"], c["method"], c["window"], len(c["rounds"])) for c in cells] == [(1, "ar", 1, 2), (1, "sjd", 4, 2)]
    assert all(r["over_first"] == 1.0 for r in cells[0]["rounds"]) and cells[1]["rounds"][0]["images"] >= 1
    rows = [line.split(" | ") for line in run.stdout.splitlines() if line.startswith("| ar |") or line.startswith("| sjd |")]
    assert [r[0] for r in rows] == ["| ar", "| sjd"]
    # the same requests for both configurations (the same images), one ratio per round and their median
    assert rows[0][2] == rows[1][2] and rows[0][5] == "1.00, 1.00" and rows[0][6] == "1.00x"
    ratios = [float(x) for x in rows[1][5].split(", ")]
    assert len(ratios) == 2 and abs(float(rows[1][6].rstrip("x")) - sum(ratios) / 2) <= 0.006  # both printed to 0.01
    bad = subprocess.run([sys.executable, "benchmarks/served_closed_loop.py", "--clients", "1,4", "--per-client", "2,1,1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--per-client 2,1,1: allowed one number, or one per --clients entry (2)" in bad.stderr


def test_served_interleaved_takes_turns_and_gives_each_segment_its_ratio_to_the_first(tmp_path, weights_8x8):
    out = tmp_path / "interleaved.json"
    run = subprocess.run([sys.executable, "benchmarks/served_interleaved.py", "--threads", "1", "--images", "2",
                          "--segments", "2", "--segment-iterations", "3", "--configs", "ar:1,sjd:2", "--json", str(out),
                          "--weights", str(weights_8x8)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("# python benchmarks/served_interleaved.py --threads 1")
    ar, sjd = json.loads(out.read_text())["rows"]
    assert (ar["method"], ar["window"], sjd["method"], sjd["window"]) == ("ar", 1, "sjd", 2)
    assert ar["ratios"] == [1.0, 1.0] and ar["ratio_median"] == 1.0 and len(sjd["ratios"]) == 2
    # the batch is refilled before every iteration, so AR commits exactly one token per row and iteration
    assert ar["tokens_per_row_iteration"] == 1.0 and ar["widths"] == "1: 9"  # warm-up segment included
    assert sjd["widths"].startswith("2: ") and sjd["tokens_per_row_iteration"] >= 1.0
    lines = [line for line in run.stdout.splitlines() if line.startswith("| ar:1 |") or line.startswith("| sjd:2 |")]
    assert len(lines) == 2 and lines[0].split(" | ")[1:3] == ["1.00x", "1.00, 1.00"]
    bad = subprocess.run([sys.executable, "benchmarks/served_interleaved.py", "--images", "17"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--images: 17: allowed at most 16" in bad.stderr


def _script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_admission_model_latencies_are_exact_on_cases_worked_by_hand():
    """benchmarks/admission_model.py: every image in a batch of b advances at thr(b) / b; static batching
    waits for the batch in flight to drain, continuous batching does not, a cap makes images queue."""

    model = _script("admission_model")
    one = lambda b: 1.0 * b  # noqa: E731  (memory-bound: every row at one image per second)
    two = [{"at": 0.0, "n": 1}, {"at": 0.5, "n": 1}]
    for policy, want in ((("static",), [1.0, 1.5]), (("continuous", 16), [1.0, 1.0]), (("continuous", 1), [1.0, 1.5])):
        got = model.simulate(two, one, policy, 16, 0.0, seed=0)
        assert got == [pytest.approx(w) for w in want], (policy, got)
    flat = lambda b: 2.0 if b else 0.0  # noqa: E731  (compute-bound: the batch commits 2 images/s whatever it holds)
    # a request of 2 images alone: each at 1 image/s -> 1 s; a third image joining at 0.5 s slows both
    got = model.simulate([{"at": 0.0, "n": 2}, {"at": 0.5, "n": 1}], flat, ("continuous", 16), 16, 0.0, seed=0)
    # 0..0.5: 2 rows at 1/s (0.5 done each); then 3 rows at 2/3 /s: the first two finish at 0.5 + 0.75 = 1.25,
    # the third has 0.5 of work left, alone at 2/s: 0.25 s more -> 1.5 - 0.5 = 1.0
    assert got == [pytest.approx(1.25), pytest.approx(1.0)], got


def test_admission_model_names_a_bad_curve_and_prints_every_policy_against_static(capsys):

    model = _script("admission_model")
    curve = "1:0.8,16:2.9"
    for args, says in ((["--curve", "16"], "'16' is not rows:images_per_second"),
                       (["--curve", "0:1"], "allowed rows >= 1"), (["--curve", "1:1,1:3"], "each once"),
                       (["--curve", "1:1,2:-1"], "a finite number > 0"), (["--curve", "1:1,16:inf"], "a finite number > 0"),
                       (["--curve", "4:1.4,16:2.9"], "one of them at 1 row"), (["--curve", "1:0.8"], "two or more pairs"),
                       (["--curve", curve, "--max-batch", "32"], "--max-batch 32: beyond the curve's last row 16"),
                       (["--curve", curve, "--caps", "0"], "--caps: '0': cap 0 is out of range; allowed: integers >= 1"),
                       (["--curve", curve, "--caps", "32"], "--caps 32: cap 32 is beyond --max-batch 16"),
                       (["--curve", curve, "--hold", "-1"], "--hold: -1: must be an integer >= 0"),
                       (["--curve", curve, "--spread", "nan"], "--spread: 'nan': allowed a finite number >= 0"),
                       (["--memory-bound", "inf"], "--memory-bound: 'inf': allowed images per second")):
        with pytest.raises(SystemExit):
            model.main(args)
        assert says in capsys.readouterr().err, args
    assert model.main(["--memory-bound", "0.5", "--seeds", "1", "--duration", "60", "--rate", "0.6", "--caps", "16,8"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 0.6 |")]
    assert [r.split(" | ")[1] for r in rows] == ["static", "continuous 16", "continuous 8", "continuous 8..16"]
    assert " | 1.00x | " in rows[0] and "capacity thr(16) = 8.00 images/s" in out
    # a cap of 8 at 0.6 of 16 slots' throughput is past its own capacity: its queue grows, and the table says so
    assert rows[2].endswith("(queue grew) |") and not rows[1].endswith("(queue grew) |")


def test_serve_replay_pools_the_rounds_latencies_and_keeps_each_rounds_ratio():
    replay = _script("serve_replay")

    def cell(mode, r, latencies, ratio=None):
        c = {"method": "csd", "rate": 0.6, "mode": mode, "round": r, "requests": len(latencies),
             "latencies": [[float(i), 1, s] for i, s in enumerate(latencies)]}
        if ratio is not None:
            c["p95_over_static"] = ratio
        return c

    cells = [cell("continuous", 0, [1.0, 2.0, None], 0.5), cell("static", 0, [4.0, 4.0, 4.0]),
             cell("static", 1, [2.0, 2.0]), cell("continuous", 1, [3.0, 3.0], 1.5)]
    pooled = {c["mode"]: c for c in replay.pooled(cells)}
    assert pooled["continuous"]["requests"] == 5 and pooled["static"]["requests"] == 5
    assert pooled["continuous"]["p95"] == 3.0 and pooled["static"]["p95"] == 4.0  # the request that failed is left out
    assert pooled["continuous"]["p95_over_static"] == 0.75
    assert pooled["continuous"]["p95_over_static_by_round"] == [0.5, 1.5] and "p95_over_static" not in pooled["static"]


def test_bench_trees_names_the_refresh_of_each_sjd_row_and_refuses_bad_shapes_in_one_line():
    """Its "sjd" row ran generate's default refresh (coupled) once that default changed: two identical rows."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_trees", ROOT / "benchmarks" / "bench_trees.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = dict(module.settings([(2, 2)], (3, 2)))
    assert rows["sjd"]["refresh"] == "independent" and rows["sjd coupled"]["refresh"] == "coupled"
    for argv, said in ((["--grid", "2y2"], "--grid '2y2': allowed KxD"), (["--images-b16", "1"], "--images-b16 >= 2")):
        done = subprocess.run([sys.executable, "benchmarks/bench_trees.py", *argv], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_serving_benchmarks_latency_quantile_is_the_value_at_rank_int_q_n():
    """docs/serve.md: the quantile q of n latencies is the one at 0-based rank int(q x n) in ascending order
    (the last one at most), so p95 of 20 requests is the 20th, and p50 of 4 the 3rd."""
    import math

    serve = _bench_serve()
    latencies = [float(i) for i in range(1, 21)]  # 1 .. 20 s, ascending
    assert serve.quantile(latencies, 0.95) == 20.0 and serve.quantile(latencies, 0.5) == 11.0
    assert serve.quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 3.0 and serve.quantile([1.0, 2.0], 0.99) == 2.0
    assert math.isnan(serve.quantile([], 0.95))
