"""Regression tests of the newcomer trial's findings (trial 17, issue 16), one test per finding,
each named after it: a bad input gets one line naming the value and what is allowed (CLI: exit
status 2, no traceback; server: OpenAI's error shape with the right status and ``param``)."""

from __future__ import annotations

import json
import logging
import threading

import httpx
import pytest
import torch
from PIL import Image

import csdgen
from csdgen.serve import BackgroundServer, ServeDefaults, ServedModel, create_app

from builtin_fixture import builtin, weights  # noqa: F401 (fixtures)
from cli_helpers import cli_error, run
from cli_helpers import usage_error as _usage_error
from serve_fixture import metric, slow_model, wait_for

TIMEOUT = 120


def usage_error(capsys, *argv) -> str:
    return _usage_error(capsys, *argv, one_line=True)


def post(server, body, **kwargs) -> httpx.Response:
    return httpx.post(server.url + "/v1/images/generations", json=body, timeout=TIMEOUT, **kwargs)


def error_of(response: httpx.Response) -> dict:
    assert response.headers["content-type"].startswith("application/json"), response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"]
    return error


# ---- 1. Ctrl-C while a request runs: 503 in OpenAI's shape, no traceback ------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_shutdown_while_a_request_runs_answers_503_unavailable_with_retry_after(cached_model, caplog, stream):
    """(The second trial, F6: the code was ``server_shutting_down`` without ``Retry-After``, where
    README and docs/serve.md promise ``unavailable`` with ``Retry-After`` for every 503.)"""
    model = slow_model(cached_model, delay=0.05)
    app = create_app(ServedModel(model, "slow", defaults=ServeDefaults(method="ar")), capacity=4)
    server = BackgroundServer(app).__enter__()
    answer: dict = {}

    def send():
        if stream:
            with httpx.stream("POST", server.url + "/v1/images/generations", timeout=TIMEOUT,
                              json={"prompt": "0", "n": 2, "seed": 1, "stream": True}) as r:
                answer["events"] = [line for line in r.iter_lines() if line.startswith("data: ")]
        else:
            answer["r"] = post(server, {"prompt": "0", "n": 2, "seed": 1})

    thread = threading.Thread(target=send)
    try:
        with caplog.at_level(logging.WARNING):
            thread.start()
            wait_for(lambda: metric(server.url, "csdgen_batch_occupancy") == 2)
            server.__exit__(None, None, None)  # what Ctrl-C does: uvicorn's shutdown
            thread.join(TIMEOUT)
    finally:
        server._server.should_exit = True
    assert not thread.is_alive()
    if stream:
        error = json.loads(answer["events"][-1][len("data: "):])["error"]
    else:
        assert answer["r"].status_code == 503 and int(answer["r"].headers["retry-after"]) >= 1
        error = error_of(answer["r"])
    assert "server shutting down" in error["message"] and error["type"] == "server_error"
    assert error["code"] == "unavailable"
    logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert "CancelledError" not in logged and "Traceback" not in logged and "Cancel " not in logged, logged


def test_shutdown_while_a_request_runs_a_cancelled_handler_answers_503_not_a_traceback(cached_model):
    """Past uvicorn's graceful period the request's task is cancelled: the handler answers 503 JSON."""
    import asyncio

    model = slow_model(cached_model, delay=0.05)
    app = create_app(ServedModel(model, "slow", defaults=ServeDefaults(method="ar")), capacity=4)
    (route,) = [r for r in app.routes if getattr(r, "path", "") == "/v1/images/generations"]

    class FakeRequest:
        async def body(self):
            return json.dumps({"prompt": "0", "n": 1, "seed": 1}).encode()

        async def is_disconnected(self):
            return False

    async def main():
        app.state.scheduler.start()
        try:
            task = asyncio.ensure_future(route.endpoint(FakeRequest()))
            await asyncio.sleep(0.5)
            task.cancel()
            return await task
        finally:
            app.state.scheduler.stop()

    response = asyncio.run(main())
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
    assert json.loads(response.body)["error"]["code"] == "unavailable"


# ---- 2. a str for conditions ------------------------------------------------------------------


def test_generate_refuses_a_string_for_conditions_showing_the_list_form(builtin, tmp_path):
    for bad in ("red apple", b"red apple"):
        with pytest.raises(ValueError, match=r"^conditions='red apple': give a list .*e\.g\. \['red apple'\]$"):
            csdgen.generate(builtin, bad, seed=0, window=16)
        with pytest.raises(ValueError, match=r"conditions='red apple': give a list"):
            csdgen.save_run(builtin, bad, tmp_path / "o", window=16)
    assert not (tmp_path / "o").exists()


# ---- 3. empty --methods ------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["compare", "bench"])
@pytest.mark.parametrize("methods", ["", ",,"])
def test_empty_methods_are_refused_with_the_allowed_list(capsys, tmp_path, command, methods):
    err = usage_error(capsys, command, "--methods", methods, "--out", tmp_path)
    assert "no method given; allowed: ar, sjd," in err and "csd-coupled" in err


# ---- 4. --floor-seed equal to a run seed --------------------------------------------------------


def test_floor_seed_equal_to_a_run_seed_is_refused(weights, capsys, tmp_path):
    err = cli_error(capsys, "bench", "--weights", weights, "--limit", 1, "--methods", "ar", "--floor-seed", 0,
                    "--out", tmp_path / "b")
    assert "--floor-seed 0 is also a run seed (--seeds 0); the noise floor needs another seed" in err
    assert not (tmp_path / "b").exists()


def test_the_default_floor_seed_skips_run_seeds():
    """``--seeds 0,1`` was refused (the default floor, the first seed + 1, is a run seed) although a
    free seed was there to take: the default is now the next seed up that is not a run seed."""
    import argparse

    from csdgen.cli.bench import _floor
    from csdgen.cli._options import MAX_SEED

    def floor(seeds, given="auto"):
        return _floor(argparse.Namespace(seeds=seeds, floor_seed=given))

    assert floor([0]) == 1 and floor([0, 1]) == 2 and floor([5, 6, 7, 9]) == 8 and floor([3, 0]) == 4
    assert floor([0, 1], "none") is None and floor([0, 1], 7) == 7
    with pytest.raises(ValueError, match="--floor-seed 1 is also a run seed"):
        floor([0, 1], 1)
    with pytest.raises(ValueError, match="none is left"):
        floor([MAX_SEED])


# ---- 5. duplicates in --methods and sweep grids ----------------------------------------------------


@pytest.mark.parametrize("argv, twice", [
    (["compare", "--methods", "csd,csd"], "method 'csd' is given twice"),
    (["bench", "--methods", "sjd,ar,sjd"], "method 'sjd' is given twice"),
    (["sweep", "--csd-lam", "0.5,0.5"], "value 0.5 is given twice"),
    (["sweep", "--windows", "4,8,4"], "value 4 is given twice"),
    (["sweep", "--baselines", "ar,ar"], "baseline 'ar' is given twice"),
])
def test_duplicate_methods_and_grid_values_are_refused_naming_the_duplicate(capsys, tmp_path, argv, twice):
    err = usage_error(capsys, *argv, "--out", tmp_path)
    assert twice in err and "allowed: distinct values" in err


def test_sweep_with_no_window_is_refused_while_other_grids_may_be_empty(capsys, tmp_path):
    """``--windows ''`` ran a sweep of AR alone without a word (every method runs at each window)."""
    err = usage_error(capsys, "sweep", "--windows", "", "--out", tmp_path / "s")
    assert "argument --windows: '': no window given; allowed: at least one" in err
    assert not (tmp_path / "s").exists()
    from csdgen.cli._options import numbers

    assert numbers(float)("") == []  # e.g. --csd-lam '' = no CSD curve


# ---- 6, 7, 14. server messages: seed param, guidance overflow, null body -----------------------------


@pytest.fixture(scope="module")
def builtin_server(builtin):
    with BackgroundServer(create_app(ServedModel(builtin, "csdgen-builtin"), capacity=4)) as server:
        yield server


@pytest.mark.parametrize("seed", [-1, 2**63, 2**64])
def test_serve_seed_errors_name_param_seed(builtin_server, seed):
    r = post(builtin_server, {"prompt": "red apple", "seed": seed})
    assert r.status_code == 400
    error = error_of(r)
    assert error["param"] == "seed" and f"seed={seed}" in error["message"] and "0..9223372036854775807" in error["message"]


def test_serve_guidance_scale_overflow_names_guidance_scale_with_the_cli_message(builtin_server):
    r = post(builtin_server, {"prompt": "red apple", "guidance_scale": 1e300, "window": 16, "seed": 0})
    assert r.status_code == 400
    error = error_of(r)
    assert error["param"] == "guidance_scale"
    assert "overflow float32" in error["message"] and "guidance_scale=1e+300" in error["message"]
    assert "allowed: a smaller guidance scale" in error["message"]
    assert post(builtin_server, {"prompt": "red apple", "n": 1, "window": 16, "seed": 0}).status_code == 200


@pytest.mark.parametrize("body, kind", [("null", "null"), ("[1]", "array"), ('"x"', "string"), ("3", "number")])
def test_serve_null_body_says_null_not_nonetype(builtin_server, body, kind):
    r = httpx.post(builtin_server.url + "/v1/images/generations", content=body, timeout=TIMEOUT,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    message = error_of(r)["message"]
    assert f"the request body is a JSON {kind};" in message and "NoneType" not in message


# ---- 8. AR records the window it ran at ---------------------------------------------------------------


def test_generate_ar_records_window_1_not_the_given_window(weights, tmp_path, capsys):
    out = tmp_path / "ar"
    assert run("generate", "--weights", weights, "-n", 1, "--method", "ar", "--window", 16, "--no-maps",
               "--out", out) == 0
    assert "--window 16 does not apply (window 1)" in capsys.readouterr().err
    record = json.loads((out / "record.json").read_text())
    assert record["settings"]["window"] == 1
    assert record["images"]["0"]["steps"] == 256


# ---- 9. --compile says it compiles -------------------------------------------------------------------


def test_compile_prints_one_line_before_the_first_compiled_call(weights, tmp_path, capsys, monkeypatch):
    import csdgen.models._static as static

    calls = []
    monkeypatch.setattr(static, "_compiled", lambda name, fn: calls.append(name) or fn)  # no real compile
    assert run("generate", "--weights", weights, "-n", 1, "--window", 16, "--compile", "--no-maps",
               "--out", tmp_path / "c") == 0
    err = capsys.readouterr().err
    assert err.count("compiling the static engine's forwards (first call per shape; on CPU tens of seconds each)") == 1
    assert calls  # the compiled path ran, through the fake
    assert run("generate", "--weights", weights, "-n", 1, "--window", 16, "--no-maps", "--out", tmp_path / "e") == 0
    assert "compiling" not in capsys.readouterr().err


# ---- 10. resume checks what is on disk --------------------------------------------------------------


def test_resume_regenerates_a_corrupt_png_and_says_so(weights, tmp_path, capsys):
    out = tmp_path / "r"
    argv = ["generate", "--weights", weights, "-n", 3, "--window", 8, "--no-maps", "--out", out]
    assert run(*argv) == 0
    capsys.readouterr()
    files = sorted(out.glob("000*.png"))
    good = files[1].read_bytes()
    files[1].write_bytes(b"garbage!")  # damaged outside csdgen
    Image.new("RGB", (5, 5)).save(files[2])  # readable, the wrong size
    assert run(*argv) == 0
    err = capsys.readouterr().err
    assert f"{str(files[1])!r} is not a readable PNG" in err and "generating it again" in err
    assert f"{str(files[2])!r} is 5x5 pixels, the other images 128x128" in err
    assert files[1].read_bytes() == good  # made again, the same image
    assert Image.open(files[2]).size == (128, 128)


def test_resume_without_no_maps_in_a_no_maps_folder_says_maps_are_missing(weights, tmp_path, capsys):
    out = tmp_path / "m"
    assert run("generate", "--weights", weights, "-n", 2, "--window", 8, "--no-maps", "--out", out) == 0
    capsys.readouterr()
    assert run("generate", "--weights", weights, "-n", 2, "--window", 8, "--out", out) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "2 kept images" in err and "no acceptance map" in err and "--no-maps" in err


# ---- 11. --out "" ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["generate", "compare", "bench", "sweep"])
def test_empty_out_is_refused(capsys, command):
    err = usage_error(capsys, command, "--out", "")
    assert "argument --out: '': an empty output folder; allowed: a folder path" in err


# ---- 12. compare --limit / --offset without --prompts -----------------------------------------------


@pytest.mark.parametrize("command", ["compare", "sweep"])
@pytest.mark.parametrize("option, value", [("--limit", 3), ("--offset", 2)])
def test_compare_limit_without_prompts_is_refused_naming_the_option(weights, capsys, tmp_path, command, option, value):
    err = cli_error(capsys, command, "--weights", weights, option, value, "--out", tmp_path / "o")
    assert f"{option} {value} needs --prompts FILE" in err
    assert not (tmp_path / "o").exists()


# ---- 13. small API checks ------------------------------------------------------------------------------


def test_api_save_run_into_a_file_names_the_path(builtin, tmp_path):
    path = tmp_path / "afile"
    path.write_text("x")
    with pytest.raises(ValueError, match=r"^output folder '.*afile' cannot be made \(File exists\); allowed: a folder"):
        csdgen.save_run(builtin, ["red apple"], path, window=16)


def test_api_decode_images_refuses_bad_tokens_naming_shape_and_range(builtin):
    with pytest.raises(ValueError, match=r"tokens in 1000000\.\.1000000; allowed: tokens \[B, 256\] int64 in 0\.\.1023"):
        builtin.decode_images(torch.full((1, 256), 10**6))
    with pytest.raises(ValueError, match=r"tokens of shape \[1, 7\] torch.int64; allowed: tokens \[B, 256\]"):
        builtin.decode_images(torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(ValueError, match=r"tokens in -1\.\.0"):
        builtin.decode_images(torch.tensor([[-1] + [0] * 255]))
    assert builtin.decode_images(torch.zeros(1, 256, dtype=torch.long)).shape == (1, 3, 64, 64)


def test_api_pil_images_of_none_is_a_clear_type_error(builtin):
    with pytest.raises(TypeError, match=r"pil_images: got NoneType; allowed: a GenerationResult"):
        csdgen.pil_images(builtin, None)


def test_api_classes_assign_refuses_a_negative_count(builtin):
    with pytest.raises(ValueError, match=r"^count=-1: allowed an integer >= 0"):
        builtin.classes.assign(["random"], -1, seed=0)
    assert builtin.classes.assign(["random"], 0, seed=0) == []


# ---- 14. small CLI and server messages -----------------------------------------------------------------


def test_serve_host_not_of_this_machine_blames_the_host(capsys):
    import errno
    import socket

    from csdgen.serve.app import bind_socket

    probe = socket.socket()
    try:
        probe.bind(("8.8.8.8", 0))
        pytest.skip("this machine owns 8.8.8.8")
    except OSError as exc:
        if exc.errno != errno.EADDRNOTAVAIL:
            pytest.skip(f"binding 8.8.8.8 fails otherwise here ({exc})")
    finally:
        probe.close()
    with pytest.raises(ValueError, match=r"--host '8\.8\.8\.8' is not an address of this machine") as info:
        bind_socket("8.8.8.8", 8000)
    assert "--port" not in str(info.value)


@pytest.mark.parametrize("name", ["", "  "])
def test_serve_empty_served_name_is_refused(capsys, name):
    err = usage_error(capsys, "serve", "--served-name", name)
    assert f"argument --served-name: {name!r}: allowed a non-empty model name" in err


def test_long_class_names_are_truncated_in_error_lines(weights, capsys, tmp_path, builtin):
    long = "a" * 100_000
    err = cli_error(capsys, "generate", "--weights", weights, "--class", long, "--out", tmp_path / "o")
    assert f"unknown class '{'a' * 80}...'" in err and len(err) < 1000
    with pytest.raises(ValueError) as info:
        builtin.classes.index("9" * 100_000)
    assert len(str(info.value)) < 1000


def test_generate_model_with_an_empty_prompts_file_says_it_holds_no_prompts(capsys, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    err = cli_error(capsys, "generate", "--model", tmp_path / "nothing", "--prompts-file", empty, "--out", tmp_path / "o")
    assert f"--prompts-file {str(empty)!r} holds no prompts" in err


def test_image_indices_given_twice_are_refused(builtin):
    """``image_indices=[3, 3]`` gave two images one random stream (identical images for one condition)."""
    with pytest.raises(ValueError, match="image_indices: index 3 is given twice; allowed: distinct indices"):
        csdgen.generate(builtin, ["red apple", "red apple"], method="sjd", window=4, image_indices=[3, 3])


def test_the_reports_sampling_line_is_words():
    """bench's report header printed ``sampling {'guidance_scale': 3.0, 'temperature': 1.0, ...}``."""
    from csdgen.cli.bench import sampling_text
    from csdgen.sampling import SamplingConfig

    assert sampling_text(SamplingConfig(guidance_scale=3.0, top_k=None)) == \
        "guidance scale 3, temperature 1, top-k none, top-p none"
    assert sampling_text(SamplingConfig(top_k=100, top_p=0.9, top_n_sigma=2.0)) == \
        "guidance scale 1, temperature 1, top-k 100, top-p 0.9, top n sigma 2"
