"""``csdgen serve`` against a server on a free loopback port, driven by the real ``openai`` client
and by plain HTTP (httpx, raw sockets).

The model is the tiny float64 test transformer with a palette 'decoder' (tests/serve_fixture.py),
in this process; the built-in model's checks (the CLI, two replicas, served == offline within
float32 batching) are at the end. Every wait is bounded.
"""

import base64
import io
import json
import socket
import threading

import httpx
import openai
import pytest
import torch
from PIL import Image

import csdgen
from csdgen.serve import BackgroundServer, ServeDefaults, ServedModel, create_app
from csdgen.serve.images import png_bytes

from serve_fixture import metric, slow_model, tiny_model, wait_for
from cli_helpers import usage_error

TIMEOUT = 120


@pytest.fixture(scope="module")
def model(cached_model):
    return tiny_model(cached_model)


@pytest.fixture(scope="module")
def server(model):
    app = create_app(ServedModel(model, "tiny", aliases=("tiny-alias",)), capacity=6, max_queue=64)
    with BackgroundServer(app) as running:
        yield running


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


def post(server, body, **kwargs) -> httpx.Response:
    return httpx.post(server.url + "/v1/images/generations", json=body, timeout=TIMEOUT, **kwargs)


def png(b64: str) -> Image.Image:
    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert image.format == "PNG"
    return image


def test_openai_client_gets_n_pngs_of_the_model_size_with_statistics(server, model):
    c = client(server)
    assert [m.id for m in c.models.list().data] == ["tiny"]
    name = model.class_names[2]  # a name with a comma, looked up by the model
    result = c.images.generate(model="tiny", prompt=name, n=3, size="16x12", response_format="b64_json",
                               extra_body={"seed": 4, "window": 5, "method": "sjd"})
    assert len(result.data) == 3 and result.size == "16x12" and result.output_format == "png"
    for i, item in enumerate(result.data):
        assert png(item.b64_json).size == (16, 12)
        stats = item.model_extra["csdgen"]
        assert stats["image_index"] == i and stats["seed"] == 4
        assert 1 <= stats["forwards"] <= model.num_image_tokens
        assert stats["step_compression"] == pytest.approx(model.num_image_tokens / stats["forwards"])
        assert sum(stats["decisions"].values()) == model.num_image_tokens
    assert len({item.b64_json for item in result.data}) == 3  # image i has its own random stream
    assert result.model_extra["csdgen"]["settings"]["method"] == "sjd"
    alias = c.images.generate(model="tiny-alias", prompt="0", size="auto", extra_body={"seed": 1})
    assert png(alias.data[0].b64_json).size == (16, 12)


def test_served_images_equal_offline_images_with_other_requests_in_flight(server, model):
    """Image i of a request seeded s == generate(seed=s, image_indices=[i]) alone, token for token and
    byte for byte, while requests with other seeds, classes and methods share its batch."""
    results: dict = {}

    def send(key, body):
        results[key] = post(server, body)

    bodies = {"mine": {"prompt": model.class_names[1], "n": 3, "seed": 21, "window": 6, "method": "csd",
                       "return_tokens": True},
              "same settings": {"prompt": "4", "n": 2, "seed": 5, "window": 6, "method": "csd"},
              "other settings": {"prompt": "0", "n": 2, "seed": 5, "window": 3, "method": "sjd"}}
    threads = [threading.Thread(target=send, args=item) for item in bodies.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert all(r.status_code == 200 for r in results.values()), {k: r.text for k, r in results.items()}
    data = results["mine"].json()["data"]
    for i, item in enumerate(data):
        offline = csdgen.generate(model, [1], method="csd", window=6, seed=21, image_indices=[i])
        assert item["csdgen"]["tokens"] == offline.tokens[0].tolist()
        assert item["csdgen"]["forwards"] == offline.images[0].steps
        assert base64.b64decode(item["b64_json"]) == png_bytes(model, offline.tokens[0])


BAD = [
    ({"n": 1}, 400, "prompt"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": 7}, 400, "prompt"),
    ({"prompt": "no such class"}, 400, "prompt"),
    ({"prompt": "9"}, 400, "prompt"),
    ({"prompt": "0", "n": 0}, 400, "n"),
    ({"prompt": "0", "n": "2"}, 400, "n"),
    ({"prompt": "0", "n": True}, 400, "n"),  # named as JSON writes it: n=true
    ({"prompt": "0", "n": 11}, 413, "n"),
    ({"prompt": "0", "size": "1024x1024"}, 400, "size"),
    ({"prompt": "0", "model": "dall-e-3"}, 404, "model"),
    ({"prompt": "0", "response_format": "url"}, 400, "response_format"),
    ({"prompt": "0", "output_format": "jpeg"}, 400, "output_format"),
    ({"prompt": "0", "background": "transparent"}, 400, "background"),
    ({"prompt": "0", "quality": "hd"}, 400, "quality"),
    ({"prompt": "0", "style": "vivid"}, 400, "style"),
    ({"prompt": "0", "stream": "yes"}, 400, "stream"),
    ({"prompt": "0", "partial_images": 4}, 400, "partial_images"),
    ({"prompt": "0", "method": "fastest"}, 400, "method"),
    ({"prompt": "0", "method": "lantern"}, 400, "method"),  # needs a codebook this model has not
    ({"prompt": "0", "window": 0}, 400, "window"),
    ({"prompt": "0", "window": 49}, 400, "window"),
    ({"prompt": "0", "window": "wide"}, 400, "window"),
    ({"prompt": "0", "seed": 1.5}, 400, "seed"),
    ({"prompt": "0", "guidance_scale": -1}, 400, "guidance_scale"),
    ({"prompt": "0", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "0", "top_k": 49}, 400, "top_k"),
    ({"prompt": "0", "top_p": 1.5}, 400, "top_p"),
    ({"prompt": "0", "lam": -1}, 400, "lam"),
    ({"prompt": "0", "delta": 2}, 400, "delta"),
    ({"prompt": "0", "draft_init": "random"}, 400, "draft_init"),
    ({"prompt": "0", "refresh": "sometimes"}, 400, "refresh"),
    ({"prompt": "0", "return_tokens": 1}, 400, "return_tokens"),
    ({"prompt": "0", "windw": 4}, 400, "windw"),
]


@pytest.mark.parametrize("body, status, param", BAD, ids=[f"{p}-{s}" for _, s, p in BAD])
def test_every_bad_value_gets_its_4xx_in_the_openai_error_shape(server, body, status, param):
    r = post(server, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert error["type"] == "invalid_request_error" and error["code"]
    message = error["message"]
    if param in body and param != "windw":  # the value as the client wrote it, in JSON (true, "2"), not Python's spelling
        value = body[param]  # a class name or index is named by the class lookup: the text itself
        assert (json.dumps(value) in message or isinstance(value, str) and value in message) and "True" not in message, message
    else:
        assert param in message, message
    assert "\n" not in message and ("allowed" in message or "must" in message), message


def test_bad_bodies_and_routes_get_4xx_and_the_server_still_answers(server):
    raw = httpx.post(server.url + "/v1/images/generations", content=b'{"prompt": "0",', timeout=TIMEOUT)
    assert raw.status_code == 400 and raw.json()["error"]["code"] == "invalid_json"
    assert post(server, [1, 2]).status_code == 400
    assert httpx.post(server.url + "/v1/images/generations", content=b"\xff\xfe", timeout=TIMEOUT).status_code == 400
    missing = httpx.get(server.url + "/v1/nothing", timeout=TIMEOUT)
    assert missing.status_code == 404 and "no route" in missing.json()["error"]["message"]
    assert httpx.get(server.url + "/v1/images/generations", timeout=TIMEOUT).status_code == 405
    model = httpx.get(server.url + "/v1/models/dall-e-3", timeout=TIMEOUT)
    assert model.status_code == 404 and model.json()["error"]["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as caught:
        client(server).images.generate(prompt="0", extra_body={"window": -3})
    assert caught.value.status_code == 400 and caught.value.body["param"] == "window"
    # a body past 512 KiB: 413 naming its size, declared or streamed (chunked, no Content-Length), and a body
    # just under the limit read whole (its unknown field named)
    from csdgen.serve.schemas import MAX_BODY_BYTES

    big = json.dumps({"prompt": "0", "user": "a" * (30 * 1024 * 1024)}).encode()
    for sent in (big, iter([big[:1000], big[1000:]])):
        huge = httpx.post(server.url + "/v1/images/generations", content=sent, timeout=TIMEOUT)
        assert huge.status_code == 413 and huge.json()["error"]["code"] == "request_too_large", huge.text
        told = f"{len(big)} bytes" if isinstance(sent, bytes) else f"more than {MAX_BODY_BYTES} bytes"
        assert f"the request body has {told}; allowed at most {MAX_BODY_BYTES}" in huge.json()["error"]["message"]
    under = json.dumps({"prompt": "0", "what": "a" * (MAX_BODY_BYTES - 100)}).encode()
    assert len(under) <= MAX_BODY_BYTES
    answer = httpx.post(server.url + "/v1/images/generations", content=under, timeout=TIMEOUT)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "what", answer.text[:300]
    assert post(server, {"prompt": "0", "seed": 2, "window": 4}).status_code == 200  # still serving
    health = httpx.get(server.url + "/health", timeout=TIMEOUT).json()
    assert health["status"] == "ok" and health["model"] == "tiny"


def test_a_declared_body_larger_than_is_ever_read_gets_413_before_it_is_sent(server):
    """A Content-Length beyond what the server would read: the 413 comes at once, while the client has
    sent one byte of it (before, the server waited for a body that never came)."""
    from csdgen.serve.app import DRAIN_BYTES

    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {DRAIN_BYTES + 1}\r\n\r\n{{".encode())
        answer = b""
        while b"\r\n\r\n" not in answer or b"request_too_large" not in answer:
            got = sock.recv(65536)  # socket.timeout (10 s) where no answer comes
            assert got, answer
            answer += got
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert f"the request body has {DRAIN_BYTES + 1} bytes".encode() in answer, answer
    assert post(server, {"prompt": "0", "seed": 2, "window": 4}).status_code == 200  # still serving


def test_streaming_sends_partial_images_then_the_final_one(server, model):
    """The openai client's stream: partial_image events (image so far), then completed, whose image is
    the one the same request gets without streaming."""
    c = client(server)
    events = list(c.images.generate(model="tiny", prompt="3", stream=True, partial_images=2,
                                    extra_body={"seed": 8, "window": 2, "method": "sjd"}))
    kinds = [e.type for e in events]
    assert kinds == ["image_generation.partial_image"] * 2 + ["image_generation.completed"], kinds
    assert [e.partial_image_index for e in events[:2]] == [0, 1]
    committed = [e.model_extra["csdgen"]["committed_tokens"] for e in events[:2]]
    assert committed[0] < committed[1] < model.num_image_tokens
    for e in events:
        assert png(e.b64_json).size == (16, 12) and e.size == "16x12" and e.output_format == "png"
    plain = c.images.generate(model="tiny", prompt="3", extra_body={"seed": 8, "window": 2, "method": "sjd"})
    assert events[-1].b64_json == plain.data[0].b64_json != events[0].b64_json
    # plain HTTP: server-sent events, a partial image every 3 forwards of each image, n = 2
    with httpx.stream("POST", server.url + "/v1/images/generations", timeout=TIMEOUT,
                      json={"prompt": "1", "n": 2, "stream": True, "partial_every": 3, "seed": 1, "window": 4}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    payloads = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert names == [p["type"] for p in payloads] and names.count("image_generation.completed") == 2
    for index in (0, 1):
        mine = [p for p in payloads if p["csdgen"]["image_index"] == index]
        assert mine[-1]["type"] == "image_generation.completed" and len(mine) >= 2
        assert all(p["csdgen"]["forwards"] % 3 == 0 for p in mine[:-1])


def test_a_text_prompt_family_is_served_and_a_too_long_prompt_is_a_400(tmp_path):
    """A checkpoint family (tiny Janus): text prompts of different lengths share a batch and each image
    has the tokens of generate alone (greedy SJD, so float32 batching cannot change a draw); a prompt
    past the model's positions is refused with 400 before anything is queued."""
    from csdgen.models.janus import JanusImageModel
    from csdgen.sampling import SamplingConfig

    from test_models_janus import SIZE, build_checkpoint

    janus = JanusImageModel.from_pretrained(build_checkpoint(tmp_path / "janus"))
    greedy = {"method": "sjd", "window": 4, "temperature": 0, "guidance_scale": 3.0, "return_tokens": True}
    bodies = {"long": {"prompt": "the cat running in the rain", "n": 2, "seed": 1, **greedy},
              "short": {"prompt": "a red dog", "n": 1, "seed": 2, **greedy}}
    with BackgroundServer(create_app(ServedModel(janus, "tiny-janus"), capacity=4)) as server:
        answers: dict = {}
        other = threading.Thread(target=lambda: answers.update(long=post(server, bodies["long"])))
        other.start()
        answers["short"] = post(server, bodies["short"])
        other.join(TIMEOUT)
        for key, r in answers.items():
            assert r.status_code == 200, r.text
            for i, item in enumerate(r.json()["data"]):
                assert png(item["b64_json"]).size == (SIZE, SIZE)
                alone = csdgen.generate(janus, [bodies[key]["prompt"]], method="sjd", window=4, seed=bodies[key]["seed"],
                                        sampling=SamplingConfig(temperature=0, guidance_scale=3.0), image_indices=[i])
                assert item["csdgen"]["tokens"] == alone.tokens[0].tolist(), (key, i)
        too_long = post(server, {"prompt": "a " * janus.config.text_config.max_position_embeddings})
        assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "prompt"
        assert "max_position_embeddings" in too_long.json()["error"]["message"]


def _slow_server(cached_model, delay: float = 0.03, **kwargs):
    model = slow_model(cached_model, delay)
    served = ServedModel(model, "slow", defaults=ServeDefaults(method="ar"))
    return model, BackgroundServer(create_app(served, **kwargs))


def _raw_request(server, body: dict) -> socket.socket:
    """Send a request on a raw socket and return it unread (closing it is a client going away)."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
    sock.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


@pytest.mark.parametrize("stream", [False, True])
def test_a_disconnect_frees_its_rows_and_the_other_requests_complete(cached_model, stream):
    """A client of 4 images goes away mid-run: batch occupancy drops by 4, the images count as cancelled,
    the request sharing the batch completes, and the request counter has one 200 and one 499."""
    model, running = _slow_server(cached_model, capacity=8)
    with running as server:
        leaving = _raw_request(server, {"prompt": "0", "n": 4, "seed": 1, "stream": stream, "partial_every": 1})
        other: dict = {}
        thread = threading.Thread(target=lambda: other.update(r=post(server, {"prompt": "1", "n": 1, "seed": 2})))
        wait_for(lambda: metric(server.url, "csdgen_batch_occupancy") == 4)
        thread.start()
        wait_for(lambda: metric(server.url, "csdgen_batch_occupancy") == 5)
        leaving.close()
        wait_for(lambda: metric(server.url, "csdgen_images_cancelled_total") == 4)
        assert metric(server.url, "csdgen_batch_occupancy") <= 1
        thread.join(TIMEOUT)
        assert other["r"].status_code == 200 and len(other["r"].json()["data"]) == 1
        assert metric(server.url, "csdgen_images_total") == 1
        # the request counter: the one that left is a 499, streamed or not (a stream counted 200 when it began)
        wait_for(lambda: metric(server.url, "csdgen_requests_total", {"status": "499"}) == 1)
        assert metric(server.url, "csdgen_requests_total", {"status": "200"}) == 1


def _snapshot(url: str, *names: str) -> list[float]:
    """Several gauges/counters of the server's /metrics from one scrape (a consistent view)."""
    from prometheus_client.parser import text_string_to_metric_families

    values = {s.name: s.value for f in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text)
              for s in f.samples}
    return [values.get(name, 0.0) for name in names]


@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_static_batching_admits_only_into_an_empty_batch(cached_model, batching):
    """--batching static (the benchmark's baseline): a request arriving while a batch runs waits in
    the queue until that batch has ended, then runs; under continuous batching (the control) it joins
    the running batch at once. Both requests complete."""
    model, running = _slow_server(cached_model, delay=0.1, capacity=8, batching=batching)
    with running as server:
        answers: dict = {}
        first = threading.Thread(target=lambda: answers.update(first=post(server, {"prompt": "0", "n": 2, "seed": 1})))
        first.start()
        wait_for(lambda: metric(server.url, "csdgen_batch_occupancy") == 2)
        second = threading.Thread(target=lambda: answers.update(second=post(server, {"prompt": "1", "n": 1, "seed": 2})))
        second.start()
        wait_for(lambda: metric(server.url, "csdgen_queue_depth") == 1 or metric(server.url, "csdgen_batch_occupancy") == 3)
        iterations = metric(server.url, "csdgen_batch_iterations_total")
        wait_for(lambda: metric(server.url, "csdgen_batch_iterations_total") >= iterations + 3)
        done, waiting, occupancy = _snapshot(server.url, "csdgen_images_total", "csdgen_queue_depth",
                                             "csdgen_batch_occupancy")
        assert done == 0  # the first batch (48 forwards of 0.1 s) is still running
        assert (waiting, occupancy) == ((1, 2) if batching == "static" else (0, 3))
        for t in (first, second):
            t.join(TIMEOUT)
        assert [answers[k].status_code for k in ("first", "second")] == [200, 200]
        assert _snapshot(server.url, "csdgen_images_total", "csdgen_queue_depth") == [3, 0]


def test_the_queue_limit_gives_429_with_retry_after(cached_model):
    model, running = _slow_server(cached_model, capacity=1, max_queue=2)
    with running as server:
        first = _raw_request(server, {"prompt": "0", "n": 1, "seed": 1})
        wait_for(lambda: metric(server.url, "csdgen_batch_occupancy") == 1)
        second = _raw_request(server, {"prompt": "1", "n": 2, "seed": 1})
        wait_for(lambda: metric(server.url, "csdgen_queue_depth") == 2)
        with pytest.raises(openai.RateLimitError) as caught:
            client(server).images.generate(prompt="2", extra_body={"seed": 3})
        assert caught.value.status_code == 429 and int(caught.value.response.headers["retry-after"]) >= 1
        assert caught.value.body["code"] == "queue_full"
        assert metric(server.url, "csdgen_requests_total", {"status": "429"}) == 1
        first.close()
        second.close()
        wait_for(lambda: metric(server.url, "csdgen_batch_occupancy") == 0 and metric(server.url, "csdgen_queue_depth") == 0)
        assert post(server, {"prompt": "2", "seed": 3}).status_code == 200


def test_a_request_that_would_pass_the_queue_limit_gets_429_naming_its_images_and_the_room_left(cached_model):
    """The queue holds 1 image of at most 2: a request of 2 would pass the limit and gets 429 (the
    queue is not full); the message says how many images it asked and how many wait (it said "the
    queue is full: 1 images waiting")."""
    model, running = _slow_server(cached_model, capacity=1, max_queue=2)
    with running as server:
        decoding = _raw_request(server, {"prompt": "0", "n": 1, "seed": 1})
        wait_for(lambda: metric(server.url, "csdgen_batch_occupancy") == 1)
        waiting = _raw_request(server, {"prompt": "1", "n": 1, "seed": 1})
        wait_for(lambda: metric(server.url, "csdgen_queue_depth") == 1)
        refused = post(server, {"prompt": "2", "n": 2, "seed": 3})
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
        message = refused.json()["error"]["message"]
        assert "n=2" in message and "1 image waiting" in message and "at most 2" in message, message
        assert "is full" not in message, message
        assert post(server, {"prompt": "2", "n": 1, "seed": 3}).status_code == 200  # 1 + 1 fits
        decoding.close()
        waiting.close()


def test_retry_after_of_a_full_queue_is_the_queues_expected_wait(cached_model):
    """Images take about 48 forwards x 0.05 s in the batch (measured on a first request): with 2
    images decoding (capacity 2) and 2 waiting, a 429's Retry-After is about that time x 2 waiting /
    capacity 2, rounded up (not the constant 1): at least 48 x 0.05 s, at most the first request's latency."""
    import math
    import time

    delay = 0.05
    model, running = _slow_server(cached_model, delay=delay, capacity=2, max_queue=2)
    with running as server:
        began = time.perf_counter()
        assert post(server, {"prompt": "0", "n": 2, "seed": 1}).status_code == 200
        latency = time.perf_counter() - began
        decoding = _raw_request(server, {"prompt": "0", "n": 2, "seed": 2})
        wait_for(lambda: metric(server.url, "csdgen_batch_occupancy") == 2)
        waiting = _raw_request(server, {"prompt": "1", "n": 2, "seed": 3})
        wait_for(lambda: metric(server.url, "csdgen_queue_depth") == 2)
        full = post(server, {"prompt": "2", "seed": 4})
        assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
        retry_after = int(full.headers["retry-after"])
        assert math.ceil((model.num_image_tokens - 1) * delay * 2 / 2) <= retry_after <= math.ceil(latency * 2 / 2), \
            (retry_after, latency)
        decoding.close()
        waiting.close()


def test_an_exception_inside_the_model_ends_its_batch_with_500_and_the_server_goes_on(cached_model):
    model, running = _slow_server(cached_model, capacity=4)
    model.poison = 4
    with running as server:
        answers: dict = {}
        innocent = threading.Thread(target=lambda: answers.update(innocent=post(server, {"prompt": "1", "n": 2})))
        innocent.start()
        wait_for(lambda: metric(server.url, "csdgen_batch_occupancy") == 2)
        poisoned = post(server, {"prompt": "4"})
        innocent.join(TIMEOUT)
        for r in (poisoned, answers["innocent"]):
            assert r.status_code == 500, r.text
            error = r.json()["error"]
            assert error["type"] == "server_error" and "RuntimeError: boom: class 4" in error["message"]
        after = post(server, {"prompt": "1", "seed": 3})
        assert after.status_code == 200
        assert httpx.get(server.url + "/health", timeout=TIMEOUT).json()["status"] == "ok"


def test_a_stopped_scheduler_gives_503_with_retry_after(model):
    with BackgroundServer(create_app(ServedModel(model, "tiny"), capacity=2)) as server:
        assert httpx.get(server.url + "/health", timeout=TIMEOUT).status_code == 200
        server.app.state.scheduler.stop()
        health = httpx.get(server.url + "/health", timeout=TIMEOUT)
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        r = post(server, {"prompt": "0"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable" and int(r.headers["retry-after"]) >= 1


def test_metrics_count_requests_images_forwards_and_occupancy(server):
    before = metric(server.url, "csdgen_images_total")
    assert post(server, {"prompt": "2", "n": 2, "seed": 9, "window": 8}).status_code == 200
    assert metric(server.url, "csdgen_images_total") == before + 2
    assert metric(server.url, "csdgen_requests_total", {"status": "200"}) >= 1
    iterations = metric(server.url, "csdgen_batch_iterations_total")
    assert metric(server.url, "csdgen_forwards_total") > iterations > 0
    assert metric(server.url, "csdgen_batch_rows_total") >= iterations
    assert metric(server.url, "csdgen_batch_capacity") == 6
    assert metric(server.url, "csdgen_step_compression_count") >= 2
    assert metric(server.url, "csdgen_request_latency_seconds_count") >= 1


# ---- the built-in model: the command, two replicas, served == offline within float32 batching ----

def _spawn(*argv: str, sigint=None):
    """``csdgen serve ... --port 0`` in a subprocess, its output lines in a queue (``sigint``: the
    SIGINT handler it starts with, default ``signal.SIG_DFL``)."""
    import os
    import queue
    import subprocess
    import sys

    import signal

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # Ctrl-C as from a terminal: a test run started in the background (``cmd &``) ignores SIGINT,
    # and a child inherits that, so its Ctrl-C test would see the server stop with status 0
    proc = subprocess.Popen([sys.executable, "-m", "csdgen", "serve", "--port", "0", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL if sigint is None else sigint))
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)],  # None: the end
                     daemon=True).start()
    return proc, lines


def _address(proc, lines, timeout: float = 300) -> str:
    """The base URL of the address line the server prints once it serves."""
    import queue
    import re
    import time

    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            seen.append(lines.get(timeout=0.5))
        except queue.Empty:
            continue
        if seen[-1] is None:  # its output ended
            seen.pop()
            break
        found = re.fullmatch(r"csdgen serve: serving csdgen-builtin on (http://127\.0\.0\.1:\d+)/v1 .*\n", seen[-1])
        if found:
            return found.group(1)
    proc.kill()
    raise AssertionError(f"csdgen serve did not start: {''.join(seen)}")


def _rest(lines, timeout: float = 10) -> list[str]:
    """The output lines of a stopped server not read yet (until its output ends, at most ``timeout`` s)."""
    import queue

    rest: list[str] = []
    try:
        while (line := lines.get(timeout=timeout)) is not None:
            rest.append(line.rstrip("\n"))
    except queue.Empty:
        pass
    return rest


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory):
    from builtin_fixture import make_tiny_weights

    return make_tiny_weights(tmp_path_factory.mktemp("weights"))


def test_serve_started_with_sigint_ignored_exits_130_after_sigint(tiny_weights):
    """A background job of a non-interactive shell (``csdgen serve &``) starts with SIGINT ignored:
    uvicorn still stops on it, but its re-raise under the ignored handler did nothing and the
    command ended with status 0 instead of 130."""
    import signal

    proc, lines = _spawn("--weights", str(tiny_weights), "--max-batch", "2", sigint=signal.SIG_IGN)
    try:
        _address(proc, lines, timeout=120)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, _rest(lines)
    assert "csdgen serve: stopped" in _rest(lines)


def test_two_replicas_on_two_ports_give_the_same_image(tiny_weights):
    """Two `csdgen serve` processes (the built-in model's layout, tiny random weights): the same request
    gets the same PNG bytes from both, one of them busy with another request; Ctrl-C stops them."""
    import signal

    from csdgen.models.builtin import load_builtin_model

    name = load_builtin_model(tiny_weights).class_names[1]
    (a, out_a), (b, out_b) = [_spawn("--weights", str(tiny_weights), "--max-batch", "4") for _ in range(2)]
    try:
        url_a, url_b = _address(a, out_a), _address(b, out_b)
        body = {"prompt": name, "n": 2, "seed": 12, "window": 8, "method": "csd"}
        busy = threading.Thread(target=lambda: httpx.post(url_b + "/v1/images/generations", timeout=TIMEOUT,
                                                          json={"prompt": "0", "n": 3, "seed": 1, "window": 8}))
        busy.start()
        answers = [httpx.post(url + "/v1/images/generations", json=body, timeout=TIMEOUT) for url in (url_a, url_b)]
        busy.join(TIMEOUT)
        assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
        images = [[item["b64_json"] for item in r.json()["data"]] for r in answers]
        assert images[0] == images[1] and images[0][0] != images[0][1]
        assert png(images[0][0]).size == (64, 64)
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        codes = [proc.wait(120) for proc in (a, b)]
    assert codes == [130, 130]  # Ctrl-C: stopped, one line
    # the log (--log-level info, the default): an access line per image request, then the shutdown lines
    import re

    said = _rest(out_a)
    assert any(re.search(r'INFO: +127\.0\.0\.1:\d+ - "POST /v1/images/generations" 200 method=csd images=2/2 '
                         r'forwards=\d+ step_compression=[\d.]+ seconds=[\d.]+$', line) for line in said), said
    assert any("shutting down: 0 image requests not yet answered (queued or decoding) get 503" in line for line in said), said
    assert any(re.search(r"stopped after \d+ s: 1 image request answered, 2 images sent$", line) for line in said), said


def test_serve_usage_errors_are_one_line(capsys, tiny_weights):
    from csdgen import cli

    err = usage_error(capsys, "serve", "--port", "70000")
    assert err.count("\n") == 1 and "70000" in err and "0..65535" in err
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        assert cli.main(["serve", "--weights", str(tiny_weights), "--port", str(taken.getsockname()[1])]) == 2
    finally:
        taken.close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot listen on 127.0.0.1:" in err and "--port" in err
    assert cli.main(["serve", "--weights", str(tiny_weights), "--port", "0", "--top-p", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "top_p=3.0" in err and "--top-p" in err
    assert cli.main(["serve", "--weights", str(tiny_weights), "--port", "0", "--gsd-radius", "100000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gsd_radius=100000: allowed an integer 0.." in err and "--gsd-radius" in err
    assert cli.main(["serve", "--weights", str(tiny_weights), "--port", "0", "--max-memory", "0.000001"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not even one image fits" in err and "--max-memory" in err


def test_serve_lowers_max_batch_to_what_max_memory_allows(capsys, tiny_weights, monkeypatch):
    """--max-memory for about 3 images with --max-batch 16: the scheduler admits at most 3, the address
    line says so and a note names the limit, the one the memory plan on the run line gives (the
    admission used its own estimate, which said 3 where the plan said 0)."""
    import csdgen.serve
    from csdgen import cli
    from csdgen.engine import AUTO_MAX_WINDOW
    from csdgen.models.builtin import load_builtin_model
    from csdgen.models.plan import builtin_plan

    seen = {}

    def fake_run_server(app, sock, on_ready=None, log_level=None):  # what the command would serve, without serving it
        seen["capacity"], seen["log_level"] = app.state.scheduler.capacity, log_level
        on_ready()
        sock.close()

    monkeypatch.setattr(csdgen.serve, "run_server", fake_run_server)
    plan = builtin_plan(load_builtin_model(tiny_weights), batch_size=16, window=AUTO_MAX_WINDOW, free=2**30)
    gib = (plan.weights + 3.5 * plan.per_image) / (1 - plan.headroom) / 2**30
    assert cli.main(["serve", "--weights", str(tiny_weights), "--port", "0", "--max-batch", "16",
                     "--max-memory", repr(gib)]) == 0
    out, err = capsys.readouterr()
    assert seen["capacity"] == 3 and "max batch 3," in out and "(largest batch 3)" in out
    assert seen["log_level"] == "info"  # --log-level's default reaches uvicorn
    assert err.count("\n") == 1 and "--max-batch 16" in err and "about 3 images fit" in err
    assert cli.main(["serve", "--weights", str(tiny_weights), "--port", "0", "--max-batch", "2",
                     "--max-memory", repr(gib)]) == 0
    out, err = capsys.readouterr()
    assert seen["capacity"] == 2 and "max batch 2," in out and err == ""


def test_serve_clamps_a_window_default_longer_than_the_image_with_a_note(capsys, tiny_weights, monkeypatch):
    """--window above the image length: the request default is the image length and a note says so, as
    generate's (the server refused to start); a request's own window above N stays a 400."""
    import csdgen.serve
    from csdgen import cli
    from csdgen.serve.schemas import APIError, parse_request

    seen = {}

    def fake_run_server(app, sock, on_ready=None, log_level=None):
        seen["served"] = app.state.served
        sock.close()

    monkeypatch.setattr(csdgen.serve, "run_server", fake_run_server)
    assert cli.main(["serve", "--weights", str(tiny_weights), "--port", "0", "--window", "5000"]) == 0
    served = seen["served"]
    N = served.model.num_image_tokens
    err = capsys.readouterr().err
    assert err == f"csdgen serve: note: --window 5000 is longer than the image ({N} tokens): using {N}\n"
    assert served.defaults.window == N
    assert parse_request({"prompt": "0", "seed": 0}, served).batch_kwargs["window"] == N
    with pytest.raises(APIError) as caught:
        parse_request({"prompt": "0", "window": N + 1}, served)
    assert caught.value.status == 400 and caught.value.param == "window"


def test_builtin_model_served_images_draw_the_offline_distribution(capsys):
    """The shipped model (float32): images served beside other requests draw from the distribution of the
    offline images (same seed, image indices, window 16). Batched kernels round differently, so an
    image may tip and go its own way: not token equality (exact on a float64 model,
    tests/test_continuous.py), but step compression within 15 % of the offline images' and token
    histograms closer to theirs than a run at another seed is (the control)."""
    from csdgen.evaluation.agreement import histogram_distance
    from csdgen.models.builtin import load_builtin_model

    model = load_builtin_model()
    app = create_app(ServedModel(model, "csdgen-builtin"), capacity=8)
    mine = {"prompt": model.class_names[3], "n": 2, "seed": 5, "window": 16, "return_tokens": True}
    with BackgroundServer(app) as server:
        other = threading.Thread(target=lambda: post(server, {"prompt": "0", "n": 3, "seed": 9, "window": 16}))
        other.start()
        answer = post(server, mine)
        other.join(TIMEOUT)
    assert answer.status_code == 200, answer.text
    data = answer.json()["data"]
    served = torch.tensor([item["csdgen"]["tokens"] for item in data])
    offline = csdgen.generate(model, [3, 3], window=16, seed=5, image_indices=[0, 1])
    control = csdgen.generate(model, [3, 3], window=16, seed=6, image_indices=[0, 1])
    compression = sum(item["csdgen"]["step_compression"] for item in data) / len(data)
    assert abs(compression - offline.step_compression) <= 0.15 * offline.step_compression
    V = model.codebook_size
    assert histogram_distance(served, offline.tokens, V) < histogram_distance(control.tokens, offline.tokens, V)


def test_readme_client_example_runs_against_a_server(tiny_weights, tmp_path, monkeypatch):
    """The README's openai example, as written, with the address of a server on a free port (and a
    class of the weights at hand as its prompt): it writes a 64 x 64 PNG."""
    import re
    from pathlib import Path

    from csdgen.models.builtin import load_builtin_model

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "images.generate(" in b]
    assert len(code.strip().splitlines()) == 5
    model = load_builtin_model(tiny_weights)
    with BackgroundServer(create_app(ServedModel(model, "csdgen-builtin"), capacity=4)) as server:
        code = code.replace("http://127.0.0.1:8000", server.url)
        code = re.sub(r'prompt="[^"]*"', f"prompt={model.class_names[0]!r}", code)
        monkeypatch.chdir(tmp_path)
        exec(compile(code, "README.md", "exec"), {})
    (written,) = tmp_path.glob("*.png")
    assert Image.open(written).size == (64, 64)


def test_serve_commands_in_the_readme_and_docs_parse():
    import re
    import shlex
    from pathlib import Path

    from csdgen import cli

    root = Path(__file__).resolve().parents[1]
    found = 0
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for command in re.findall(r"^\s*(?:[A-Z_]+=\S+ )*(csdgen serve\b[^\n&|]*)", path.read_text(), re.M):
            args = cli.build_parser().parse_args(shlex.split(command, comments=True)[1:])
            assert args.command == "serve"
            found += 1
    assert found >= 3


def test_every_field_the_server_accepts_is_in_the_docs_request_table():
    """docs/serve.md lists a request's fields and says any other is refused: the fields the server
    accepts are its table's and the null-only sentence's (``user`` and ``safety_identifier`` were
    accepted but not listed)."""
    import re
    from pathlib import Path

    from csdgen.serve.schemas import CSDGEN_FIELDS, NULL_ONLY_FIELDS, OPENAI_FIELDS

    text = (Path(__file__).resolve().parents[1] / "docs" / "serve.md").read_text()
    section = text.split("## Requests", 1)[1].split("The answer:", 1)[0]
    table = "\n".join(line.split("|")[1] for line in section.splitlines() if line.startswith("| `"))
    listed = set(re.findall(r"`([a-z_]+)`", table))
    null_only = section.split("are accepted only as null", 1)[0].rsplit("\n\n", 1)[1]
    assert set(OPENAI_FIELDS + CSDGEN_FIELDS) - listed == set()
    assert listed - set(OPENAI_FIELDS + CSDGEN_FIELDS) == set()
    assert set(NULL_ONLY_FIELDS) == set(re.findall(r"`([a-z_]+)`", null_only))


def test_a_served_model_keeps_its_familys_guidance_schedule_unless_the_server_says_constant(cached_model):
    """A model with a guidance schedule of its own (Lumina-mGPT 2.0's ``reference_guidance``) is
    served with it, as ``csdgen generate`` runs it: a request's image has the tokens of
    ``csdgen.generate`` with the model's schedule (the server built every request's sampling
    without it, and ``--guidance-schedule constant`` was accepted and ignored); with
    ``guidance_schedule="constant"`` the scale is constant, as ``generate --guidance-schedule constant``."""
    from csdgen.guidance import LinearGuidance
    from csdgen.sampling import SamplingConfig
    from csdgen.serve.schemas import parse_request

    model = tiny_model(cached_model)
    model.reference_guidance = LinearGuidance(floor=1.0)
    body = {"prompt": "1", "seed": 5, "window": 4, "guidance_scale": 3.0, "return_tokens": True}
    scheduled = parse_request(body, ServedModel(model, "tiny"))
    assert scheduled.batch_kwargs["sampling"].guidance_schedule == LinearGuidance(floor=1.0)
    assert scheduled.settings["guidance_schedule"] == {"name": "linear", "floor": 1.0}
    constant = parse_request(body, ServedModel(model, "tiny", defaults=ServeDefaults(guidance_schedule="constant")))
    assert constant.batch_kwargs["sampling"].guidance_schedule is None and "guidance_schedule" not in constant.settings
    assert scheduled.key != constant.key
    with pytest.raises(ValueError, match="guidance_schedule='wavy': allowed family, constant"):
        ServeDefaults(guidance_schedule="wavy")
    with BackgroundServer(create_app(ServedModel(model, "tiny"), capacity=2)) as server:
        served = post(server, body).json()["data"][0]["csdgen"]["tokens"]
    offline = csdgen.generate(model, ["1"], seed=5, image_indices=[0], window=4,
                              sampling=SamplingConfig(guidance_scale=3.0, guidance_schedule=LinearGuidance(floor=1.0)))
    flat = csdgen.generate(model, ["1"], seed=5, image_indices=[0], window=4,
                           sampling=SamplingConfig(guidance_scale=3.0))
    assert offline.tokens[0].tolist() != flat.tokens[0].tolist()  # the schedule changes this image
    assert served == offline.tokens[0].tolist()


def test_serve_refresh_defaults_to_the_methods_refresh_as_generate_does():
    """`csdgen serve` without --refresh leaves a request's refresh to the method's default (coupled for
    SJD and CSD), as csdgen.generate does; it used to force independent, so served images differed
    from offline ones (bench_serve's check: 0 of 4 equal)."""
    import argparse

    from csdgen.cli import serve as serve_cli
    from csdgen.models.defaults import method_refresh

    parser = argparse.ArgumentParser()
    serve_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve"])
    assert args.refresh is None
    assert method_refresh("csd") == "coupled" and method_refresh("sjd") == "coupled"


def test_a_client_that_leaves_before_its_body_arrives_is_a_quiet_499(cached_model, caplog):
    """A client sends its headers and half its body, then goes away: no traceback in the server's log
    (it was starlette's ClientDisconnect), a 499 in the request counter, and the server answers the next request."""
    import logging
    import time

    _, running = _slow_server(cached_model)
    with running as server, caplog.at_level(logging.ERROR):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
        sock.sendall(b"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"prompt\":")
        time.sleep(0.3)
        sock.close()
        wait_for(lambda: metric(server.url, "csdgen_requests_total", {"status": "499"}) == 1)
        answer = post(server, {"prompt": "1", "n": 1, "seed": 2})
        assert answer.status_code == 200
    assert not [r for r in caplog.records if "Exception in ASGI application" in r.getMessage() or r.exc_info]


def test_an_integer_prompt_is_refused_with_a_message_that_says_how_to_write_an_index(cached_model):
    _, running = _slow_server(cached_model)
    with running as server:
        answer = post(server, {"prompt": 5, "n": 1})
        assert answer.status_code == 400
        message = answer.json()["error"]["message"]
        assert "prompt=5" in message and "written as a string" in message and '"0"' in message


def test_the_openai_client_may_write_the_method_and_auto_in_any_case(server, model):
    """``"method": "CSD"`` was a 400 while the library and the CLI took it."""
    result = client(server).images.generate(model="tiny", prompt=model.class_names[0], n=1, response_format="b64_json",
                                            extra_body={"seed": 1, "method": "SJD", "window": "AUTO"})
    settings = result.model_extra["csdgen"]["settings"]
    assert settings["method"] == "sjd" and settings["window"] == "auto"
    with pytest.raises(openai.BadRequestError, match='method="SJDX"'):
        client(server).images.generate(model="tiny", prompt=model.class_names[0], extra_body={"method": "SJDX"})


def test_serve_warmup_compiles_the_served_shapes_once_and_reports_them(cached_model, monkeypatch, capsys):
    """``csdgen serve --warmup``: uncompiled (the CPU default) it says there is nothing to compile;
    compiled (traced here with dynamo's eager backend) it makes the steps of the default request's
    shapes, and a second warm-up finds them all held."""
    from csdgen.cli.serve import _warmup
    from csdgen.models import _static_steps
    from csdgen.serve.schemas import parse_request

    model = tiny_model(cached_model)  # a copy of its own: its compiled steps stay with it
    request = parse_request({"prompt": "0", "window": 4}, ServedModel(model, "tiny"))
    _warmup(model, request, 2)
    assert "nothing to compile (the static engine runs uncompiled on cpu)" in capsys.readouterr().out
    monkeypatch.setattr(_static_steps, "COMPILE_BACKEND", "eager")
    _warmup(model, request, 2, {"engine": "auto", "compile": True})  # csdgen serve --compile --warmup
    first = capsys.readouterr().out
    made = int(first.split("warm-up: ")[1].split()[0])
    assert made > 0 and "(0 already held)" in first, first
    _warmup(model, request, 2, {"engine": "auto", "compile": True})
    assert f"0 step shapes compiled ({made} already held)" in capsys.readouterr().out
    _warmup(model, request, 2, {"engine": "eager", "compile": None})
    assert "nothing to compile (this model runs on the eager engine)" in capsys.readouterr().out


def test_served_batches_run_the_engine_and_compile_the_server_was_started_with(cached_model, monkeypatch):
    import csdgen.engine as engine

    made = []
    real = engine.ContinuousBatch

    def recording(*args, **kwargs):
        made.append((kwargs.get("engine"), kwargs.get("compile")))
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "ContinuousBatch", recording)  # the scheduler imports it when it opens a batch
    app = create_app(ServedModel(tiny_model(cached_model), "tiny", engine="eager", compile=False), capacity=2, max_queue=4)
    with BackgroundServer(app) as running:
        answer = post(running, {"prompt": "0", "window": 4, "seed": 1})
    assert answer.status_code == 200, answer.text
    assert made == [("eager", False)]


def test_a_top_k_of_0_in_a_request_or_the_servers_defaults_means_no_top_k(cached_model):
    """0 is the server's "no top-k" (SamplingConfig stores it as None), in a request and in csdgen serve --top-k 0;
    above the codebook size it is refused."""
    from csdgen.serve.schemas import APIError, parse_request

    model = tiny_model(cached_model)
    served = ServedModel(model, "tiny")
    zero = parse_request({"prompt": "0", "window": 4, "top_k": 0}, served)
    assert zero.batch_kwargs["sampling"].top_k is None and zero.key == parse_request(
        {"prompt": "0", "window": 4, "top_k": None, "temperature": zero.batch_kwargs["sampling"].temperature}, served).key
    by_default = parse_request({"prompt": "0", "window": 4}, ServedModel(model, "tiny", defaults=ServeDefaults(top_k=0)))
    assert by_default.batch_kwargs["sampling"].top_k is None
    assert parse_request({"prompt": "0", "window": 4, "top_k": 2}, served).batch_kwargs["sampling"].top_k == 2
    with pytest.raises(APIError, match="allowed 1..") as refused:
        parse_request({"prompt": "0", "top_k": model.codebook_size + 1}, served)
    assert refused.value.status == 400


def test_a_request_the_model_rejects_at_admission_leaves_no_image_in_the_queue(cached_model, monkeypatch):
    """A request of 3 images at a batch of 2 that the model rejects when its images join (a 400):
    its third image stayed in the queue and joined the next admission, failing the request queued
    behind it (same settings) with it. Now the rejected request's images leave the queue with its
    400, and the next request is admitted alone."""
    import asyncio

    from csdgen.serve.scheduler import Scheduler
    from csdgen.serve.schemas import parse_request

    model = tiny_model(cached_model)
    start = model.start

    def picky_start(conditions, batch_size, guided):  # the model refuses class 4 when its rows open
        if any(int(c) == 4 for c in conditions):
            raise ValueError("class 4 refused here")
        return start(conditions, batch_size, guided)

    model.start = picky_start
    served = ServedModel(model, "tiny", defaults=ServeDefaults(method="ar"))
    scheduler = Scheduler(served, capacity=2, max_queue=8)
    monkeypatch.setattr(Scheduler, "alive", property(lambda self: True))  # its thread is not needed here
    loop = asyncio.new_event_loop()
    try:
        rejected = scheduler.submit(parse_request({"prompt": "4", "n": 3, "seed": 1}, served), loop, asyncio.Queue())
        fine = scheduler.submit(parse_request({"prompt": "1", "n": 1, "seed": 2}, served), loop, asyncio.Queue())
        scheduler._admit(scheduler._take())  # the first 2 of the rejected request's 3 images
        assert rejected.finished and scheduler.waiting == 1
        take = scheduler._take()
        assert [im.job for im in take] == [fine]
        scheduler._admit(take)
        assert not fine.finished and scheduler.occupancy == 1
    finally:
        loop.close()
