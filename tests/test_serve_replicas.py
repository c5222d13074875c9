"""``csdgen serve`` replicas on Ray Serve (:mod:`csdgen.serve.deployment`, :mod:`csdgen.serve.replicas`).

The first tests need no Ray: the application's options, the deployment's options, the health
check on the app's own ``/health``, the proxy's answer for a replica that died. The last ones
start ``csdgen serve --replicas 2`` (a local Ray on this machine, loopback only, the built-in
model's layout with tiny random weights) and drive it with the real ``openai`` client: the same
image as one server, both replicas serving, a replica killed by its PID restarted by Ray while
every request ends (200, or a 5xx naming the cause). Skipped where Ray is not installed. Every
wait is bounded.
"""

import argparse
import asyncio
import base64
import importlib.util
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from csdgen.serve.deployment import PID_HEADER, REPLICA_HEADER, CsdgenReplica, ReplicaFailure, deployment_options
from csdgen.serve.replicas import parse_options

TIMEOUT = 60  #: seconds any one request may take
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="replicas on Ray Serve need Ray, not installed here: pip install -c constraints.txt \".[ray]\"")


# ---- no Ray needed ----------------------------------------------------------------------------------

def test_application_options_are_csdgen_serve_options_checked_by_its_parser():
    args, replica = parse_options({"weights": "/w", "max-batch": 8, "method": "csd", "warmup": True,
                                   "replicas": "2", "max_replicas": 4, "num_gpus": 0})
    assert (args.weights, args.max_batch, args.method, args.warmup) == ("/w", 8, "csd", True)
    assert replica == {"replicas": 2, "max_replicas": 4, "num_gpus": 0}
    assert parse_options({"warmup": "false"})[0].warmup is False
    with pytest.raises(ValueError, match=r"max-batch.*0.*>= 1"):
        parse_options({"max_batch": 0})
    with pytest.raises(ValueError, match=r"csdgen serve: error: unrecognized arguments: --windw 8 \(options: csdgen serve"):
        parse_options({"windw": 8})
    with pytest.raises(ValueError, match=r"port=8000: the address is Ray Serve's"):
        parse_options({"port": 8000})
    with pytest.raises(ValueError, match=r"replicas='two': allowed a number"):
        parse_options({"replicas": "two"})
    with pytest.raises(ValueError, match=r"max-batch=4 and max_batch=2 name one option"):
        parse_options({"replicas": 1, "max-batch": 4, "max_batch": 2})


def test_replica_usage_errors_are_one_line_before_ray_starts(capsys):
    import socket

    from csdgen import cli

    for argv, words in ((["--max-replicas", "3"], ["--max-replicas 3 needs --replicas N"]),
                        (["--replicas", "2", "--max-replicas", "1"], ["--max-replicas 1", "at least --replicas (2)"])):
        assert cli.main(["serve", "--port", "0", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and all(w in err for w in words), err
    with pytest.raises(SystemExit):
        cli.main(["serve", "--replicas", "0"])
    assert "--replicas" in capsys.readouterr().err
    assert cli.main(["serve", "--port", "0", "--replica-cpus", "2"]) == 2  # not silently one server
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--replica-cpus 2 needs --replicas N" in err, err
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        assert cli.main(["serve", "--replicas", "2", "--port", str(taken.getsockname()[1])]) == 2
    finally:
        taken.close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot listen on 127.0.0.1:" in err


@needs_ray
def test_what_every_replica_would_refuse_is_one_line_before_ray_starts(capsys, monkeypatch, tmp_path):
    import torch

    from csdgen import cli

    from csdgen.serve import deployment

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(deployment, "run_local", lambda *a, **kw: 0)  # Ray never starts: a refusal missed returns 0
    cases = [(["--weights", str(tmp_path / "none")], "no built-in weights in"), (["--top-p", "5"], "the --top-p option"),
             (["--model", str(tmp_path / "none")], "no such folder")]
    if not torch.cuda.is_available():  # else each replica gets a GPU
        cases.append((["--device", "cuda"], "--device cuda: no CUDA device is visible here"))
    for argv, words in cases:
        assert cli.main(["serve", "--port", "0", "--replicas", "2", *argv]) == 2, argv
        captured = capsys.readouterr()
        assert captured.err.count("\n") == 1 and words in captured.err and not captured.out, (argv, captured)
    # one GPU and two replicas of one GPU each: refused, where Ray would wait for a second GPU without end
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert cli.main(["serve", "--port", "0", "--replicas", "2", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--replicas 2: each replica takes one GPU of its own and this machine has 1" in err


@needs_ray
def test_the_address_line_counts_the_replicas(capsys, monkeypatch):
    from csdgen import cli
    from csdgen.serve import deployment

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_DEDUP_LOGS", raising=False)
    monkeypatch.setattr(deployment, "run_local", lambda *a, on_ready, **kw: on_ready(("127.0.0.1", 8123)) or 0)  # no Ray
    for argv, count in ((["--replicas", "1"], "; 1 replica on Ray Serve,"), (["--replicas", "2"], "; 2 replicas on"),
                        (["--replicas", "1", "--max-replicas", "3"], "; 1..3 replicas on Ray Serve,")):
        assert cli.main(["serve", "--port", "0", "--device", "cpu", *argv]) == 0
        out = capsys.readouterr().out
        assert count in out and "on http://127.0.0.1:8123/v1 " in out  # the address run_local says the proxy has
    assert os.environ["RAY_DEDUP_LOGS"] == "0"  # for the Ray it starts: every replica's lines as they come


def test_run_local_starts_a_ray_of_its_own_even_where_ray_start_runs_one_here(monkeypatch):
    import types

    from csdgen.serve import deployment

    inits = []
    serve = types.SimpleNamespace(start=lambda **kw: None, shutdown=lambda: None, delete=lambda name: None,
                                  run=lambda *a, **kw: os.kill(os.getpid(), signal.SIGINT),
                                  status=lambda: types.SimpleNamespace(applications={}))
    ray = types.SimpleNamespace(is_initialized=lambda: bool(inits), init=lambda **kw: inits.append(kw),
                                shutdown=lambda: None, serve=serve)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.serve", serve)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert deployment.run_local(object(), "127.0.0.1", 0, cpus=3) == 130
    # ray.init() alone joins a `ray start` cluster of this machine, and refuses num_cpus there
    assert inits[0]["address"] == "local" and inits[0]["num_cpus"] >= 3
    inits.clear()
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # a cluster named: joined as it is
    assert deployment.run_local(object(), "127.0.0.1", 0, cpus=3) == 130
    assert inits[0]["address"] is None and inits[0]["num_cpus"] is None


def test_a_cluster_that_cannot_be_joined_is_named_with_the_token_ray_asks_for(monkeypatch):
    """Joining a `ray start --head` cluster (Ray 2.60: token authentication on) without RAY_AUTH_MODE=token ended in
    Ray's 'Failed to connect to Ray cluster', which blames a crashed earlier instance: the line now names the
    cluster and the variable; with the variable set, Ray's message alone."""
    import types

    from csdgen.serve import deployment

    def init(**kw):
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379.")

    serve = types.SimpleNamespace(shutdown=lambda: None, delete=lambda name: None)
    ray = types.SimpleNamespace(is_initialized=lambda: False, init=init, shutdown=lambda: None, serve=serve)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.serve", serve)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with pytest.raises(ValueError) as refused:
        deployment.run_local(object(), "127.0.0.1", 0, cpus=1)
    assert str(refused.value) == (
        "could not join the Ray cluster at RAY_ADDRESS='10.0.0.1:6379': Failed to connect to Ray cluster at "
        "10.0.0.1:6379.; where Ray's lines above say InvalidAuthToken, the cluster asks for its token (Ray 2.60's "
        "`ray start --head` turns that on): set RAY_AUTH_MODE=token; or unset RAY_ADDRESS for a local Ray of this "
        "command's own")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(ValueError, match=r"^could not join the Ray cluster at RAY_ADDRESS='10.0.0.1:6379': Failed to "
                                         r"connect to Ray cluster at 10.0.0.1:6379.$"):
        deployment.run_local(object(), "127.0.0.1", 0, cpus=1)
    monkeypatch.delenv("RAY_ADDRESS")  # a Ray of its own that fails to start: Ray's own error
    with pytest.raises(ConnectionError):
        deployment.run_local(object(), "127.0.0.1", 0, cpus=1)


def test_run_local_on_a_cluster_it_joined_deletes_only_its_application(monkeypatch):
    """With RAY_ADDRESS (a cluster of others), stopping deletes the csdgen application and
    disconnects: serve.shutdown() would remove every Serve application of that cluster."""
    import types

    from csdgen.serve import deployment

    calls = []
    serve = types.SimpleNamespace(start=lambda **kw: calls.append("start"), run=lambda *a, **kw: calls.append("run"),
                                  shutdown=lambda: calls.append("serve down"),
                                  delete=lambda name: calls.append(f"delete {name}"),
                                  status=lambda: types.SimpleNamespace(applications={"other": None}))
    ray = types.SimpleNamespace(is_initialized=lambda: "init" in calls and "disconnect" not in calls,
                                init=lambda **kw: calls.append("init"), shutdown=lambda: calls.append("disconnect"),
                                serve=serve)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.serve", serve)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert deployment.run_local(object(), "127.0.0.1", 0, cpus=1, on_ready=lambda address: os.kill(os.getpid(), signal.SIGINT)) == 130
    assert calls == ["init", "start", "run", f"delete {deployment.APP_NAME}", "disconnect"]
    calls.clear()
    monkeypatch.delenv("RAY_ADDRESS")  # a Ray of its own: Serve and Ray stopped
    assert deployment.run_local(object(), "127.0.0.1", 0, cpus=1, on_ready=lambda address: os.kill(os.getpid(), signal.SIGINT)) == 130
    assert calls == ["init", "start", "run", "serve down", "disconnect"]


def test_a_cluster_already_running_a_csdgen_application_is_refused_and_left_as_it_is(monkeypatch, capsys):
    """serve.run would replace the cluster's own csdgen application (a serve deploy) and the stop delete it."""
    import types

    from csdgen.serve import deployment

    calls, applications = [], {deployment.APP_NAME: object()}
    client = types.SimpleNamespace(http_config=types.SimpleNamespace(host="0.0.0.0", port=8706))
    context = types.SimpleNamespace(_get_global_client=lambda: client)
    serve = types.SimpleNamespace(start=lambda **kw: calls.append("start"), run=lambda *a, **kw: calls.append("run"),
                                  shutdown=lambda: calls.append("serve down"),
                                  delete=lambda name: calls.append(f"delete {name}"),
                                  status=lambda: types.SimpleNamespace(applications=applications), context=context)
    ray = types.SimpleNamespace(is_initialized=lambda: "init" in calls and "disconnect" not in calls,
                                init=lambda **kw: calls.append("init"), shutdown=lambda: calls.append("disconnect"),
                                serve=serve)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.serve", serve)
    monkeypatch.setitem(sys.modules, "ray.serve.context", context)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    with pytest.raises(ValueError, match=r"already runs a Serve application named 'csdgen' .* it is left as it is"):
        deployment.run_local(object(), "127.0.0.1", 8708, cpus=1,  # on_ready: a run over the app ends, not hangs
                             on_ready=lambda *address: os.kill(os.getpid(), signal.SIGINT))
    assert calls == ["init", "start", "disconnect"]  # never run over, never deleted
    # a cluster whose Serve already listens elsewhere: the address said is the proxy's, with a note
    calls.clear()
    applications.clear()
    said = []
    assert deployment.run_local(object(), "127.0.0.1", 8708, cpus=1,
                                on_ready=lambda address: (said.append(address), os.kill(os.getpid(), signal.SIGINT))) == 130
    assert said == [("0.0.0.0", 8706)]
    assert "the cluster's Serve proxy already listens on 0.0.0.0:8706; --host and --port do not move it" \
        in capsys.readouterr().err
    assert calls == ["init", "start", "run", f"delete {deployment.APP_NAME}", "disconnect"]


def test_more_cpus_per_replica_than_the_machine_has_are_refused_and_sigint_stops_a_background_start(
        monkeypatch, capsys):
    from csdgen import cli
    from csdgen.serve import deployment

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(deployment, "run_local", lambda *a, **kw: 0)
    assert cli.main(["serve", "--port", "0", "--replicas", "1", "--replica-cpus", str(os.cpu_count() + 1)]) == 2
    assert f"--replica-cpus {os.cpu_count() + 1}: this machine has {os.cpu_count()} CPUs" in capsys.readouterr().err
    # started with SIGINT ignored (`csdgen serve --replicas 2 &` in a script): SIGINT stops it from the start on
    seen = []
    monkeypatch.setattr(deployment, "run_local", lambda *a, **kw: seen.append(signal.getsignal(signal.SIGINT)) or 0)
    monkeypatch.setattr(deployment, "application", lambda *a, **kw: object())
    import csdgen.cli.serve as serve_cli

    monkeypatch.setattr(serve_cli, "_check_before_ray", lambda args: None)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert cli.main(["serve", "--port", "0", "--replicas", "1", "--device", "cpu"]) == 0
    finally:
        signal.signal(signal.SIGINT, before)
    assert seen == [signal.default_int_handler]


def test_ctrl_c_while_ray_starts_stops_the_ray_it_started(monkeypatch):
    import types

    from csdgen.serve import deployment

    calls = []

    def init(**kwargs):  # Ctrl-C lands while Ray starts its processes
        os.kill(os.getpid(), signal.SIGINT)
        calls.append("ray up")

    serve = types.SimpleNamespace(start=lambda **kw: calls.append("serve start"), run=lambda *a, **kw: None,
                                  shutdown=lambda: calls.append("serve down"))
    ray = types.SimpleNamespace(is_initialized=lambda: "ray up" in calls and "ray down" not in calls, init=init,
                                shutdown=lambda: calls.append("ray down"), serve=serve)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.serve", serve)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert deployment.run_local(object(), "127.0.0.1", 0, cpus=1) == 130
    assert calls == ["ray up", "serve down", "ray down"]  # its processes stopped; Serve never started


def test_run_local_stops_on_sigterm_with_status_143_and_on_ctrl_c_with_130(monkeypatch):
    import types

    from csdgen.serve import deployment

    calls = []
    serve = types.SimpleNamespace(start=lambda **kw: calls.append("start"), shutdown=lambda: calls.append("serve down"),
                                  run=lambda *a, **kw: calls.append("run"))
    ray = types.SimpleNamespace(is_initialized=lambda: True, shutdown=lambda: calls.append("ray down"), serve=serve)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.serve", serve)
    for sig, status in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        calls.clear()
        assert deployment.run_local(object(), "127.0.0.1", 0, cpus=1,
                                    on_ready=lambda address: os.kill(os.getpid(), sig)) == status, sig
        assert calls == ["start", "run", "serve down", "ray down"]


def test_sigterm_stops_the_replicas_where_ray_took_sigterm_at_its_start(monkeypatch):
    """Ray's core installs its own SIGTERM handler when it starts (one that aborts the process and leaves
    Ray's processes running): run_local takes SIGTERM back after ray.init."""
    import types

    from csdgen.serve import deployment

    calls = []

    def rays_handler(signum, frame):  # Ray's aborts the process
        raise RuntimeError("SIGTERM went to Ray's handler")

    def init(**kwargs):  # as Ray's core does
        signal.signal(signal.SIGTERM, rays_handler)
        calls.append("ray up")

    serve = types.SimpleNamespace(start=lambda **kw: calls.append("start"), shutdown=lambda: calls.append("serve down"),
                                  run=lambda *a, **kw: calls.append("run"))
    ray = types.SimpleNamespace(is_initialized=lambda: "ray up" in calls and "ray down" not in calls, init=init,
                                shutdown=lambda: calls.append("ray down"), serve=serve)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.serve", serve)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    before = signal.getsignal(signal.SIGTERM)
    assert deployment.run_local(object(), "127.0.0.1", 0, cpus=1,
                                on_ready=lambda address: os.kill(os.getpid(), signal.SIGTERM)) == 143
    assert calls == ["ray up", "start", "run", "serve down", "ray down"]
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler back


def test_run_local_names_the_error_that_stopped_the_replicas_in_one_line(monkeypatch):
    import types

    from csdgen.serve import deployment

    def run(*args, **kwargs):
        raise RuntimeError("Deploying application csdgen failed: Failed to update the deployments ['CsdgenReplica'].")

    calls = []
    failed = types.SimpleNamespace(message="Traceback (most recent call last):\n  File ...\nValueError: request "
                                           "defaults: top_p=5.0: must be null or in (0, 1] (the --top-p option)\n")
    status = types.SimpleNamespace(applications={"csdgen": types.SimpleNamespace(
        message="Failed to update the deployments ['CsdgenReplica'].", deployments={"CsdgenReplica": failed})})
    serve = types.SimpleNamespace(start=lambda **kw: None, run=run, status=lambda: status,
                                  shutdown=lambda: calls.append("serve down"))
    ray = types.SimpleNamespace(is_initialized=lambda: True, shutdown=lambda: calls.append("ray down"), serve=serve)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.serve", serve)
    with pytest.raises(ValueError, match=r"^the replicas did not start: ValueError: request defaults: top_p=5\.0: "
                                         r"must be null or in \(0, 1\] \(the --top-p option\)$"):
        deployment.run_local(object(), "127.0.0.1", 0, cpus=1)
    assert calls == ["serve down", "ray down"]


def test_deployment_options_fix_the_replicas_or_autoscale_by_ongoing_requests():
    args = argparse.Namespace(max_batch=16, device=None)
    fixed = deployment_options(args, replicas=3, num_gpus=0)
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["max_ongoing_requests"] == 16 and fixed["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 0}
    scaled = deployment_options(args, replicas=2, max_replicas=5, num_gpus=1, num_cpus=4)
    assert "num_replicas" not in scaled and scaled["ray_actor_options"]["num_gpus"] == 1
    assert scaled["autoscaling_config"] == {"min_replicas": 2, "initial_replicas": 2, "max_replicas": 5,
                                            "target_ongoing_requests": 16.0}
    assert "logging_config" not in fixed  # no --log-level: Ray Serve's default
    for level, ray_level in (("warning", "WARNING"), ("info", "INFO"), ("trace", "DEBUG")):  # --log-level reaches Ray
        options = deployment_options(argparse.Namespace(max_batch=4, device=None, log_level=level), num_gpus=0)
        assert options["logging_config"] == {"log_level": ray_level}
    cuda = deployment_options(argparse.Namespace(max_batch=4, device="cuda"))
    assert cuda["ray_actor_options"]["num_gpus"] == 1
    for bad, match in (({"replicas": 0}, "replicas=0"), ({"replicas": 3, "max_replicas": 2}, "max_replicas=2"),
                       ({"num_gpus": 2}, "num_gpus=2: allowed 0 or 1")):
        with pytest.raises(ValueError, match=match):
            deployment_options(args, **{"num_gpus": 0, **bad})


def test_the_replica_health_check_asks_the_apps_own_health_route(cached_model):
    from serve_fixture import tiny_model

    from csdgen.serve import ServedModel

    args = argparse.Namespace(max_queue=8, batching="continuous")
    replica = CsdgenReplica(lambda _: (ServedModel(tiny_model(cached_model), "tiny"), 2, None), args)
    scheduler = replica._app.state.scheduler
    with pytest.raises(RuntimeError, match=r"GET /health answered 503 .*unavailable"):  # not started yet
        asyncio.run(replica.check_health())
    scheduler.start()
    try:
        asyncio.run(replica.check_health())  # 200: no error
    finally:
        scheduler.stop()
    with pytest.raises(RuntimeError, match=rf"pid {os.getpid()}\): GET /health answered 503"):
        asyncio.run(replica.check_health())


def _asgi_call(app) -> list[dict]:
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app({"type": "http", "method": "POST", "path": "/v1/images/generations", "headers": []}, receive, send))
    return sent


def test_the_proxy_answers_a_request_whose_replica_died_with_a_502_naming_it():
    async def silent(scope, receive, send):  # Ray's proxy after a replica died: nothing sent
        return None

    async def raising(scope, receive, send):
        raise RuntimeError("boom")

    async def answering(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    for inner, cause in ((silent, "see the proxy's log"), (raising, "RuntimeError: boom")):
        start, body = _asgi_call(ReplicaFailure(inner))
        assert start["status"] == 502 and (b"retry-after", b"1") in start["headers"]
        error = json.loads(body["body"])["error"]
        assert error["code"] == "replica_failed" and error["type"] == "server_error"
        assert "the replica serving this request stopped before answering" in error["message"] and cause in error["message"]
    assert [m.get("status", m.get("body")) for m in _asgi_call(ReplicaFailure(answering))] == [200, b"ok"]


# ---- a local Ray Serve deployment of 2 replicas ----------------------------------------------------------

def _spawn(*argv: str):
    """``csdgen serve ... --port 0`` in a subprocess (one torch thread), its output lines in a queue.
    It starts with SIGINT ignored, as a command started with ``&`` does: Ctrl-C must stop it all the same."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RAY_DEDUP_LOGS", None)  # csdgen serve --replicas turns Ray's deduplication off itself
    proc = subprocess.Popen([sys.executable, "-m", "csdgen", "serve", "--port", "0", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    lines: queue.Queue = queue.Queue()
    seen: list[str] = []

    def read():
        for line in proc.stdout:
            seen.append(line)
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return proc, lines, seen


def _address(proc, lines, seen, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        found = re.fullmatch(r"csdgen serve: serving csdgen-builtin on (http://127\.0\.0\.1:\d+)/v1 .*\n", line)
        if found:
            return found.group(1)
    proc.kill()
    raise AssertionError(f"csdgen serve did not start within {timeout} s: {''.join(seen)[-4000:]}")


def _stop(proc, seen, sig=signal.SIGINT) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(90)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"csdgen serve did not stop within 90 s of {sig.name}: {''.join(seen)[-2000:]}")


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory):
    from builtin_fixture import make_tiny_weights

    return make_tiny_weights(tmp_path_factory.mktemp("weights"))


@pytest.fixture(scope="module")
def ray_replicas(tiny_weights):
    """``csdgen serve --replicas 2`` (max batch 4 each): its base URL; SIGTERM stops it (status 143), and
    every process of the Ray it started with it (Ctrl-C's 130: tests/test_serve.py's one server, and
    run_local's tests above)."""
    import psutil

    proc, lines, seen = _spawn("--replicas", "2", "--weights", str(tiny_weights), "--max-batch", "4")
    try:
        url = _address(proc, lines, seen)
    except AssertionError:
        _stop(proc, seen)
        raise
    yield url
    rays = psutil.Process(proc.pid).children(recursive=True)  # Ray's processes: its store, node manager, workers
    assert _stop(proc, seen, signal.SIGTERM) == 143, "".join(seen)[-2000:]
    _, left = psutil.wait_procs(rays, timeout=60)
    for leftover in left:
        leftover.kill()
    assert not left, [str(p) for p in left]
    # each replica logs as one server does (--log-level info): csdgen's access line per image request
    assert any('"POST /v1/images/generations" 200 method=' in line for line in seen), "".join(seen)[-2000:]
    # ... every line of every replica, none folded into another's by Ray's deduplication
    assert not any("across cluster]" in line for line in seen), "".join(seen)[-2000:]
    # ... and its shutdown lines; the command's last line says it stopped, as one server's does
    assert any("shutting down: 0 image requests not yet answered (queued or decoding) get 503" in line for line in seen), "".join(seen)[-2000:]
    assert seen[-1].strip() == "csdgen serve: stopped", "".join(seen)[-2000:]


def _client(url: str):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


def _generate(url: str, **body):
    """``(images as base64, replica id, replica pid)`` of one request through the openai client."""
    raw = _client(url).images.with_raw_response.generate(model="csdgen-builtin", prompt=body.pop("prompt", "0"),
                                                         n=body.pop("n", 1), extra_body=body)
    pid = raw.headers.get(PID_HEADER)  # a single server has none
    return [item.b64_json for item in raw.parse().data], raw.headers.get(REPLICA_HEADER), pid and int(pid)


@needs_ray
@pytest.mark.slow
def test_ray_replicas_give_the_image_one_server_gives(ray_replicas, tiny_weights):
    """One server of the same ``csdgen serve`` options, run in this process (what each replica runs:
    csdgen.cli.serve.served_model)."""
    from csdgen import cli
    from csdgen.cli.serve import served_model
    from csdgen.serve import BackgroundServer, create_app

    body = {"prompt": "1", "n": 2, "seed": 12, "window": 8, "method": "csd"}
    served, capacity, _ = served_model(cli.build_parser().parse_args(["serve", "--weights", str(tiny_weights),
                                                                      "--max-batch", "4"]))
    with BackgroundServer(create_app(served, capacity=capacity)) as server:
        single = _generate(server.url, **body)[0]
    replicated = _generate(ray_replicas, **body)[0]
    assert replicated == single and single[0] != single[1]
    assert base64.b64decode(single[0])[:8] == b"\x89PNG\r\n\x1a\n"


def _concurrently(url: str, count: int, **body) -> list:
    """``count`` requests at once: each ``(images, replica, pid)`` or the exception it raised."""
    out: list = [None] * count

    def one(i):
        try:
            out[i] = _generate(url, seed=i, **body)
        except Exception as exc:  # noqa: BLE001 - the test looks at each
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT + 30)
    assert not any(t.is_alive() for t in threads), "a request hung past its timeout"
    return out


@needs_ray
@pytest.mark.slow
def test_both_ray_replicas_serve_and_a_killed_one_is_restarted_while_every_request_ends(ray_replicas):
    import openai

    answers = _concurrently(ray_replicas, 8, n=2, window=8)
    assert all(isinstance(a, tuple) for a in answers), answers
    pids = {replica: pid for _, replica, pid in answers}
    assert len(pids) == 2, f"8 concurrent requests went to {sorted(pids)} only"  # each answered at least one

    victim = sorted(pids.values())[0]
    results: list = []
    load = threading.Thread(target=lambda: results.extend(_concurrently(ray_replicas, 8, n=8, method="ar")))
    load.start()
    time.sleep(1.5)  # 8 requests of 8 images: each replica holds 4, batches of 4 (seconds of work)
    os.kill(victim, signal.SIGKILL)
    load.join(2 * TIMEOUT)
    assert not load.is_alive() and len(results) == 8
    failed = [r for r in results if not isinstance(r, tuple)]
    for error in failed:  # a 5xx in OpenAI's shape naming the cause, never a timeout or a bare 500
        assert isinstance(error, openai.APIStatusError) and error.status_code == 502, repr(error)
        assert "the replica serving this request stopped before answering" in str(error), str(error)
    assert failed, "the killed replica had no request in flight: the test did not kill it mid-load"

    # Ray starts a new replica in its place: within a bounded time a request is answered by a new process
    deadline = time.monotonic() + 120
    seen: set[int] = set()
    while time.monotonic() < deadline and not seen - set(pids.values()):
        answers = _concurrently(ray_replicas, 8, window=8)
        seen |= {a[2] for a in answers if isinstance(a, tuple)}
    assert seen - set(pids.values()), f"no restarted replica answered within 120 s (pids seen {sorted(seen)})"
    assert victim not in seen  # the killed process never answers again (requests it finished before the kill may)
    assert victim not in seen
