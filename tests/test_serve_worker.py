"""The server's image worker (:mod:`csdgen.serve.worker`): images are decoded and encoded to PNG
off the scheduler thread, a failed decode reaches its request, and stopping while an image is
encoded neither hangs nor loses the request. A loopback server of the slow tiny model
(tests/serve_fixture.py); every wait is bounded."""

import threading
import time

import httpx
import pytest

from csdgen.serve import BackgroundServer, ServeDefaults, ServedModel, create_app, images
from csdgen.serve.scheduler import Scheduler
from csdgen.serve.worker import decode_stream

from serve_fixture import metric, slow_model, wait_for

TIMEOUT = 60


def _server(cached_model, delay: float, **kwargs) -> BackgroundServer:
    served = ServedModel(slow_model(cached_model, delay), "slow", defaults=ServeDefaults(method="ar"))
    return BackgroundServer(create_app(served, **kwargs))


def _post(server, body: dict, answers: dict, key: str, timeout: float = TIMEOUT) -> threading.Thread:
    def send():
        try:
            answers[key] = httpx.post(server.url + "/v1/images/generations", json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            answers[key] = exc

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def blocked_encoder(monkeypatch):
    """``images.png_bytes`` held until the test sets ``release``: ``entered`` is set once an
    image is being encoded."""
    entered, release = threading.Event(), threading.Event()
    real = images.png_bytes

    def held(model, tokens):
        entered.set()
        release.wait(TIMEOUT)
        return real(model, tokens)

    monkeypatch.setattr(images, "png_bytes", held)
    try:
        yield entered, release
    finally:
        release.set()


def test_the_scheduler_steps_while_an_image_is_encoded(cached_model, blocked_encoder):
    """Request A finishes while request B still decodes in the same batch; A's PNG encode is held:
    the batch's iteration counter goes on (the scheduler does not wait for the encode), A is
    answered only once the encode is released, and both complete."""
    entered, release = blocked_encoder
    with _server(cached_model, delay=0.05, capacity=4) as server:
        answers: dict = {}
        first = _post(server, {"prompt": "0", "n": 1, "seed": 1}, answers, "a")  # 48 forwards (AR)
        wait_for(lambda: metric(server.url, "csdgen_batch_iterations_total") >= 20, timeout=TIMEOUT)
        second = _post(server, {"prompt": "1", "n": 1, "seed": 2}, answers, "b")  # joins: ~20 forwards after A's end
        wait_for(lambda: metric(server.url, "csdgen_batch_occupancy") == 2, timeout=TIMEOUT)
        assert entered.wait(TIMEOUT)  # A finished; its PNG is being encoded (held)
        iterations = metric(server.url, "csdgen_batch_iterations_total")
        wait_for(lambda: metric(server.url, "csdgen_batch_iterations_total") >= iterations + 3, timeout=10)
        assert "a" not in answers  # A waits for its image
        release.set()
        for thread in (first, second):
            thread.join(TIMEOUT)
        assert [answers[k].status_code for k in ("a", "b")] == [200, 200]


def test_a_failed_decode_is_a_500_for_its_request_and_the_server_goes_on(cached_model, monkeypatch):
    real = images.png_bytes
    broken = {"now": True}

    def flaky(model, tokens):
        if broken["now"]:
            raise RuntimeError("decoder out of order")
        return real(model, tokens)

    monkeypatch.setattr(images, "png_bytes", flaky)
    with _server(cached_model, delay=0.0, capacity=2) as server:
        url = server.url + "/v1/images/generations"
        failed = httpx.post(url, json={"prompt": "0", "n": 2, "seed": 1}, timeout=TIMEOUT)
        assert failed.status_code == 500, failed.text
        error = failed.json()["error"]
        assert error["code"] == "model_error" and "RuntimeError: decoder out of order" in error["message"]
        broken["now"] = False
        assert httpx.post(url, json={"prompt": "0", "n": 2, "seed": 1}, timeout=TIMEOUT).status_code == 200


def test_stopping_while_an_image_is_encoded_answers_503_without_hanging(cached_model, blocked_encoder, monkeypatch):
    """The scheduler stops while the worker holds a request's last image (its encode never returns in
    time): stop returns after the drain time, and the request gets the 503 of a stopping server."""
    entered, release = blocked_encoder
    monkeypatch.setattr(Scheduler, "DRAIN_SECONDS", 0.5)
    with _server(cached_model, delay=0.0, capacity=2) as server:
        answers: dict = {}
        thread = _post(server, {"prompt": "0", "n": 1, "seed": 1}, answers, "a", timeout=20)
        assert entered.wait(TIMEOUT)
        began = time.monotonic()
        server.app.state.scheduler.stop(timeout=15)
        assert time.monotonic() - began < 5
        thread.join(25)
        answer = answers["a"]
        assert isinstance(answer, httpx.Response), answer
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "unavailable"
        release.set()


def test_the_worker_decodes_on_a_stream_of_its_own_on_cuda_only():
    import torch

    assert decode_stream(torch.device("cpu")) is None
    if torch.cuda.is_available():
        stream = decode_stream(torch.device("cuda"))
        assert isinstance(stream, torch.cuda.Stream) and stream != torch.cuda.current_stream()
