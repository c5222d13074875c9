"""The benchmark scripts run (reduced) on the built-in model: a benchmark that fails only when
someone runs it for a figure is found here instead (bench_overhead broke at batch 16 when csdgen
began refusing an image index given twice, and nobody saw it until a figure was owed)."""

import subprocess
import sys
from pathlib import Path

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
