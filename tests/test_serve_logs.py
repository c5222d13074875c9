"""The server's log (:mod:`csdgen.serve.logs`): an access line per image request with its method,
images, forwards, step compression, seconds and status; start-up and shutdown lines; the log
level (``csdgen serve --log-level``) set on csdgen's loggers and uvicorn's. A loopback server of
the tiny float64 model (tests/serve_fixture.py), in this process; every wait is bounded."""

import logging

import httpx
import pytest

from csdgen.serve import BackgroundServer, ServedModel, create_app
from csdgen.serve.logs import LOG_LEVELS, access_log, log, log_config

from serve_fixture import tiny_model, wait_for

TIMEOUT = 60


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def records():
    """A handler of the test's own for csdgen.serve and csdgen.serve.access: ``attach()`` it once the
    server is made (uvicorn's log configuration, applied then, replaces those loggers' handlers);
    its ``records`` list what they logged."""
    handler = Records()

    def attach():
        for logger in (log, access_log):
            logger.addHandler(handler)

    handler.attach = attach
    try:
        yield handler
    finally:
        for logger in (log, access_log):
            logger.removeHandler(handler)


def _post(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/v1/images/generations", json=body, timeout=TIMEOUT)


def test_every_image_request_gets_one_access_line_and_the_server_logs_its_start_and_stop(cached_model, records):
    model = tiny_model(cached_model)
    N = model.num_image_tokens
    server = BackgroundServer(create_app(ServedModel(model, "tiny"), capacity=4, max_queue=8), log_level="info")
    records.attach()
    records = records.records
    with server:
        ok = _post(server, {"prompt": "1", "n": 2, "seed": 3, "method": "sjd", "window": 4})
        bad = _post(server, {"prompt": "1", "n": 0})
        with httpx.stream("POST", server.url + "/v1/images/generations", timeout=TIMEOUT,
                          json={"prompt": "2", "seed": 1, "stream": True, "method": "ar"}) as streamed:
            assert streamed.status_code == 200
            list(streamed.iter_lines())
        wait_for(lambda: len([r for r in records if r.name == access_log.name]) == 3, timeout=TIMEOUT)
    assert ok.status_code == 200 and bad.status_code == 400
    lines = [r for r in records if r.name == access_log.name]
    assert [r.status_code for r in lines] == [200, 400, 200]
    first = lines[0]
    forwards = sum(item["csdgen"]["forwards"] for item in ok.json()["data"])
    assert (first.method, first.images, first.images_asked, first.forwards) == ("sjd", 2, 2, forwards)
    assert first.step_compression == pytest.approx(2 * N / forwards) and 0 < first.seconds < TIMEOUT
    assert first.levelno == logging.INFO
    text = first.getMessage()
    assert text.startswith("127.0.0.1:") and '- "POST /v1/images/generations" 200 method=sjd images=2/2 ' in text
    assert f"forwards={forwards} step_compression={2 * N / forwards:.2f} seconds=" in text
    assert lines[1].getMessage().split('" ')[1].startswith("400 method=- images=0/- forwards=- step_compression=- ")
    assert (lines[2].method, lines[2].forwards, lines[2].step_compression) == ("ar", N, 1.0)  # AR: one token per forward
    said = [r.getMessage() for r in records if r.name == log.name]
    assert said[0].startswith("serving tiny on cpu: max batch 4, continuous batching, at most 8 images waiting")
    assert said[-2] == "shutting down: 0 image requests not yet answered (queued or decoding) get 503"
    assert said[-1].startswith("stopped after ") and said[-1].endswith(": 3 image requests answered, 3 images sent")


def test_the_log_level_is_csdgens_and_uvicorns(cached_model, records):
    """Level warning (BackgroundServer's default): no access line, uvicorn's loggers at warning too;
    the configuration refuses a level it does not know, naming the allowed ones."""
    server = BackgroundServer(create_app(ServedModel(tiny_model(cached_model), "tiny"), capacity=2))
    records.attach()
    records = records.records
    with server:
        assert _post(server, {"prompt": "0", "seed": 1, "window": 4}).status_code == 200
    assert not [r for r in records if r.name == access_log.name]
    for name in ("uvicorn.error", log.name, access_log.name):
        assert logging.getLogger(name).level == logging.WARNING, name
    config = log_config("debug")
    assert {config["loggers"][name]["level"] for name in ("uvicorn", log.name, access_log.name)} == {logging.DEBUG}
    assert config["handlers"]["csdgen_access"]["stream"] == "ext://sys.stdout"  # access lines: stdout, as uvicorn's
    assert log_config("trace")["loggers"][log.name]["level"] == 5
    with pytest.raises(ValueError, match="'loud': allowed critical, error, warning, info, debug, trace"):
        log_config("loud")


def test_serve_log_level_option_offers_the_levels_of_the_log_configuration():
    import argparse

    from csdgen.cli import serve as serve_cli

    assert serve_cli.LOG_LEVELS == LOG_LEVELS
    parser = argparse.ArgumentParser()
    serve_cli.add_parser(parser.add_subparsers())
    assert parser.parse_args(["serve"]).log_level == "info"
    assert parser.parse_args(["serve", "--log-level", "debug"]).log_level == "debug"


def test_an_internal_error_is_answered_500_counted_and_access_logged(cached_model, records):
    """A bug of the server (here: a prompt lookup that raises TypeError) is answered 500 in the error
    shape, counted by /metrics and given its access line, as every other answer (it escaped both)."""
    from serve_fixture import metric

    class Broken(ServedModel):
        def condition(self, prompt, guided):
            raise TypeError("a bug")

    server = BackgroundServer(create_app(Broken(tiny_model(cached_model), "tiny"), capacity=2), log_level="info")
    records.attach()
    with server:
        r = _post(server, {"prompt": "1", "seed": 0})
        assert r.status_code == 500
        assert r.json()["error"]["code"] == "internal_error" and "TypeError: a bug" in r.json()["error"]["message"]
        assert metric(server.url, "csdgen_requests_total", {"status": "500"}) == 1
        lines = wait_for(lambda: [x for x in records.records if x.name == access_log.name], timeout=TIMEOUT)
    assert [x.status_code for x in lines] == [500]
    assert any(x.levelno == logging.ERROR and x.exc_info for x in records.records if x.name == log.name)


def test_an_internal_error_mid_stream_is_an_error_event_counted_and_logged_as_500(cached_model, records, monkeypatch):
    """(A stream that broke on a bug was counted and access-logged as 499, the client leaving.)"""
    import json

    import csdgen.serve.app
    from serve_fixture import metric

    def broken_usage(*args):
        raise TypeError("a bug")

    server = BackgroundServer(create_app(ServedModel(tiny_model(cached_model), "tiny"), capacity=2), log_level="info")
    records.attach()
    monkeypatch.setattr(csdgen.serve.app, "_usage", broken_usage)
    with server:
        with httpx.stream("POST", server.url + "/v1/images/generations", timeout=TIMEOUT,
                          json={"prompt": "1", "seed": 0, "stream": True, "method": "ar"}) as streamed:
            data = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: ")]
        assert data[-1]["type"] == "error" and data[-1]["error"]["code"] == "internal_error"
        lines = wait_for(lambda: [x for x in records.records if x.name == access_log.name], timeout=TIMEOUT)
        assert metric(server.url, "csdgen_requests_total", {"status": "500"}) == 1
    assert [x.status_code for x in lines] == [500]


def test_a_second_ctrl_c_stops_the_server_at_once_without_a_traceback(cached_model, records):
    """Ctrl-C twice (uvicorn's force quit) skipped the app's shutdown: asyncio then cancelled the
    lifespan task and uvicorn logged its CancelledError traceback as an ERROR. The app's shutdown
    (the scheduler's stop and the stop line) runs all the same, and nothing is logged as an error."""
    import signal
    import threading

    from csdgen.serve.app import _server, bind_socket

    app = create_app(ServedModel(tiny_model(cached_model), "tiny"), capacity=2)
    ready = threading.Event()
    server = _server(app, ready.set, "info")
    records.attach()
    logging.getLogger("uvicorn.error").addHandler(records)
    sock = bind_socket("127.0.0.1", 0)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    try:
        thread.start()
        assert ready.wait(TIMEOUT)
        server.handle_exit(signal.SIGINT, None)  # the signal handler's work (signals reach the main thread only)
        server.handle_exit(signal.SIGINT, None)  # the second Ctrl-C: force quit
        thread.join(TIMEOUT)
        assert not thread.is_alive()
    finally:
        logging.getLogger("uvicorn.error").removeHandler(records)
        sock.close()
    errors = [r.getMessage() for r in records.records if r.levelno >= logging.ERROR]
    assert not errors, errors
    said = [r.getMessage() for r in records.records if r.name == log.name]
    assert said[-1].startswith("stopped after ") and not app.state.scheduler.alive


def test_an_app_stopped_by_its_host_logs_its_shutdown_lines_once(cached_model, records):
    """A Ray Serve replica runs the app without run_server: its lifespan's end said 'stopped after'
    but not the 'shutting down' line one server gives."""
    from fastapi.testclient import TestClient

    app = create_app(ServedModel(tiny_model(cached_model), "tiny"), capacity=2, max_queue=4)
    records.attach()
    with TestClient(app) as client:  # the lifespan only, as an ASGI host runs it
        assert client.get("/health").status_code == 200
    said = [r.getMessage() for r in records.records if r.name == log.name]
    assert said[-2] == "shutting down: 0 image requests not yet answered (queued or decoding) get 503"
    assert said[-1].startswith("stopped after ") and said[-1].endswith(" s: 0 image requests answered, 0 images sent")
    assert sum(line.startswith("shutting down") for line in said) == 1


def test_the_openai_clients_request_is_logged_with_every_image_it_received(cached_model, records):
    """A non-streamed request counts its images as sent with its 200 answer (not as each finishes): the access
    line of the real client's request says all of them, with their forwards."""
    import openai

    app = create_app(ServedModel(tiny_model(cached_model), "tiny"), capacity=2)
    with BackgroundServer(app, log_level="info") as server:
        records.attach()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)
        answer = client.images.generate(model="tiny", prompt="1", n=2, response_format="b64_json",
                                        extra_body={"method": "sjd", "window": 4, "seed": 5})
    assert len(answer.data) == 2
    lines = [r.getMessage() for r in records.records if r.name == access_log.name]
    assert len(lines) == 1 and '" 200 method=sjd images=2/2 forwards=' in lines[0], lines
    assert "forwards=- " not in lines[0]


def test_a_request_its_host_cancels_while_the_server_runs_is_a_499_not_a_503(cached_model, records):
    """Ray Serve cancels a replica's request task when the proxy sees its client leave: a non-streamed request so
    cancelled was logged and counted as 503 'server shutting down' while the server went on serving; it is a 499,
    as one server answers a client that left. Here the ASGI app runs in this event loop (httpx's ASGI transport
    awaits it in the client's task), so cancelling the client's task cancels the app's, as the host does."""
    import asyncio

    from serve_fixture import slow_model

    app = create_app(ServedModel(slow_model(cached_model, delay=0.05), "tiny"), capacity=2)
    records.attach()

    async def run() -> str:
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://replica") as client:
                task = asyncio.create_task(client.post("/v1/images/generations",
                                                       json={"prompt": "1", "n": 2, "method": "ar", "seed": 1}))
                for _ in range(400):  # until its images decode (bounded: 20 s)
                    await asyncio.sleep(0.05)
                    if app.state.scheduler.occupancy:
                        break
                assert app.state.scheduler.occupancy, "the request never started decoding"
                task.cancel()  # the app answers its cancellation (no traceback): the task ends with that answer
                assert (await task).status_code == 499
                return (await client.get("/metrics")).text

    level = access_log.level
    access_log.setLevel(logging.INFO)  # as csdgen serve --log-level info sets it (no uvicorn here)
    try:
        metrics = asyncio.run(run())
    finally:
        access_log.setLevel(level)
    # one record, reaching the handler twice here: through its logger and, propagated, through csdgen.serve's
    lines = [r.getMessage() for r in {id(r): r for r in records.records if r.name == access_log.name}.values()]
    assert len(lines) == 1 and '" 499 method=ar images=0/2 forwards=- ' in lines[0], lines
    assert 'csdgen_requests_total{status="499"} 1.0' in metrics and 'status="503"' not in metrics, metrics
