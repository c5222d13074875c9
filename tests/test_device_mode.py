"""The device test mode (``CSDGEN_TEST_DEVICE``): a device that is not here skips the device-marked
tests with the reason; a bad name is refused naming the allowed ones."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# one quick device-marked test: the skip (or failure) comes from the test_device fixture, before any model is built
TARGET = "tests/test_bfloat16_agreement.py"


def _run(device: str) -> subprocess.CompletedProcess:  # pytest in its own process, as a user runs it
    env = {**os.environ, "CSDGEN_TEST_DEVICE": device, "CUDA_VISIBLE_DEVICES": ""}
    # -n 0: one process (two xdist workers would each import torch and the conftest, twice the test's time)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-n", "0", "-m", "device", TARGET],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_device_that_is_not_here_skips_the_device_tests_saying_why():
    done = _run("cuda")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CSDGEN_TEST_DEVICE=cuda: no CUDA device is visible here" in done.stdout
    assert " passed" not in done.stdout and "skipped" in done.stdout


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "cuda0"])
def test_a_bad_device_name_is_refused_naming_the_allowed_ones(name):
    from conftest import device_unavailable

    with pytest.raises(ValueError, match=f"CSDGEN_TEST_DEVICE='{name}': allowed cpu, cuda or cuda:N"):
        device_unavailable(name)
    assert device_unavailable("cpu") is None
