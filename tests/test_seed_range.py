"""Seeds: every entry point (stream, library, CLI) takes seeds in 0..2**63-1 and refuses others naming the range."""

from __future__ import annotations

import pytest
import torch

import csdgen
from csdgen.sampling import SamplingConfig, MAX_SEED, stream_uniforms

from cli_helpers import one_line_usage_error


def test_the_stream_refuses_seeds_outside_0_to_2_63_minus_1():
    image, step = torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    for bad in (-1, 2**63, 2**64, 2**64 + 1, 1.5, True, "3"):
        with pytest.raises(ValueError, match=r"allowed: an integer in 0\.\.9223372036854775807"):
            stream_uniforms(bad, image, step, 1, 2)
    assert not torch.equal(stream_uniforms(0, image, step, 1, 4), stream_uniforms(MAX_SEED, image, step, 1, 4))


def test_generate_save_run_and_bench_refuse_seeds_out_of_range(cached_model, tmp_path):
    for bad in (2**64, -1, 1.5):
        with pytest.raises(ValueError, match=r"seed=.*0\.\.9223372036854775807"):
            csdgen.generate(cached_model, [0], seed=bad, window=4)
        with pytest.raises(ValueError, match=r"seed=.*0\.\.9223372036854775807"):
            csdgen.save_run(cached_model, [0], tmp_path / "api", seed=bad, window=4)
    assert not (tmp_path / "api" / "record.json").exists()
    out = csdgen.generate(cached_model, [0], seed=MAX_SEED, window=4)
    assert out.settings["seed"] == MAX_SEED
    from csdgen.bench import BenchPlan
    from csdgen.prompts import Prompt

    with pytest.raises(ValueError, match=r"seeds.*0\.\.9223372036854775807"):
        BenchPlan(cached_model, [Prompt("a", "0")], [0], [0], {"ar": {"method": "ar"}}, [2**64], None, 4,
                  SamplingConfig(), {})
    with pytest.raises(ValueError, match=r"floor_seed.*0\.\.9223372036854775807"):
        BenchPlan(cached_model, [Prompt("a", "0")], [0], [0], {"ar": {"method": "ar"}}, [0], -1, 4, SamplingConfig(), {})


@pytest.mark.parametrize("argv", [
    ["generate", "--seed", str(2**64)],
    ["generate", "--seed", "-1"],
    ["compare", "--seed", str(2**63)],
    ["sweep", "--seed", "1e3"],
    ["bench", "--seeds", f"0,{2**64}"],
    ["bench", "--floor-seed", str(2**64)],
])
def test_the_cli_refuses_seeds_out_of_range_naming_the_range(capsys, argv):
    err = one_line_usage_error(capsys, *argv)
    # compare's noise floor runs AR at seed + 1: its range ends one lower, as its --help says
    assert ("0..9223372036854775806 (2**63 - 2)" if argv[0] == "compare" else "0..9223372036854775807") in err
