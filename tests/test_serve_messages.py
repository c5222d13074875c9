"""``csdgen serve``: bad requests get OpenAI's error shape naming ``param``; shutdown answers 503;
notes and the class decoded reach the client."""

from __future__ import annotations

import json
import logging
import threading

import pytest
import httpx

from csdgen.serve import create_app, ServeDefaults, ServedModel, BackgroundServer

from builtin_fixture import builtin, weights  # noqa: F401 (fixtures)
from cli_helpers import one_line_usage_error
from serve_fixture import slow_model, wait_for, metric


TIMEOUT = 120


def post(server, body, **kwargs) -> httpx.Response:
    return httpx.post(server.url + "/v1/images/generations", json=body, timeout=TIMEOUT, **kwargs)


def error_of(response: httpx.Response) -> dict:
    assert response.headers["content-type"].startswith("application/json"), response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"]
    return error


@pytest.fixture(scope="module")
def builtin_server(builtin):
    from csdgen.serve import BackgroundServer, ServedModel, create_app

    with BackgroundServer(create_app(ServedModel(builtin, "csdgen-builtin"), capacity=2)) as background:
        yield background


@pytest.fixture(scope="module")
def tiny_server(cached_model):
    from csdgen.serve import BackgroundServer, ServedModel, create_app

    from serve_fixture import tiny_model

    with BackgroundServer(create_app(ServedModel(tiny_model(cached_model), "tiny"), capacity=4)) as background:
        yield background


def _post_tiny(tiny_server, body):
    import httpx

    return httpx.post(tiny_server.url + "/v1/images/generations", json=body, timeout=120)


def test_a_connection_that_cannot_be_asked_counts_as_a_client_gone_not_a_server_error():
    """Behind Ray Serve, Ctrl-C kills the proxy actor holding the connection first: asking whether the
    client left raised ActorDiedError, logged as an internal error and answered 500."""
    import asyncio

    from csdgen.serve.app import _client_gone

    class Connection:
        def __init__(self, answer):
            self.answer = answer

        async def is_disconnected(self):
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    assert asyncio.run(_client_gone(Connection(RuntimeError("The actor died unexpectedly")))) is True
    assert asyncio.run(_client_gone(Connection(False))) is False
    assert asyncio.run(_client_gone(Connection(True))) is True


@pytest.mark.parametrize("stream", [False, True])
def test_shutdown_while_a_request_runs_answers_503_unavailable_with_retry_after(cached_model, caplog, stream):
    """(The code was ``server_shutting_down`` without ``Retry-After``, where
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
    """Past uvicorn's graceful period the request's task is cancelled (the server stopping: its shutdown told the app
    first, as csdgen serve's uvicorn does): the handler answers 503 JSON. (Cancelled while the server goes on serving,
    by a host whose client left, it is a 499: tests/test_serve_logs.py.)"""
    import asyncio

    model = slow_model(cached_model, delay=0.05)
    app = create_app(ServedModel(model, "slow", defaults=ServeDefaults(method="ar")), capacity=4)
    (route,) = [r for r in app.routes if getattr(r, "path", "") == "/v1/images/generations"]

    class FakeRequest:
        headers: dict = {}

        async def stream(self):
            yield json.dumps({"prompt": "0", "n": 1, "seed": 1}).encode()

        async def is_disconnected(self):
            return False

    async def main():
        app.state.scheduler.start()
        try:
            task = asyncio.ensure_future(route.endpoint(FakeRequest()))
            await asyncio.sleep(0.5)
            app.state.shutting_down()
            task.cancel()  # before the handler reads the shutdown event: its cancellation is what it answers
            return await task
        finally:
            app.state.scheduler.stop()

    response = asyncio.run(main())
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1
    assert json.loads(response.body)["error"]["code"] == "unavailable"


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
    err = one_line_usage_error(capsys, "serve", "--served-name", name)
    assert f"argument --served-name: {name!r}: allowed a non-empty model name" in err


def test_serve_refuses_a_bad_addition_c_whatever_the_method(builtin_server):
    import openai

    client = openai.OpenAI(base_url=builtin_server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    for method in ("csd", "sjd", "addition"):
        with pytest.raises(openai.BadRequestError) as info:
            client.images.generate(model="csdgen-builtin", prompt="red apple",
                                   extra_body={"method": method, "addition_c": -1, "window": 4})
        error = info.value.body
        assert error["param"] == "addition_c" and "c=-1" in error["message"], error


def test_serve_top_p_error_says_null_not_none(builtin_server):
    import httpx

    r = httpx.post(builtin_server.url + "/v1/images/generations", json={"prompt": "red apple", "top_p": 2}, timeout=60)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "top_p" and "must be null or in (0, 1]" in error["message"] and "None" not in error["message"]


def test_serve_notes_fields_the_method_does_not_use_as_the_cli_does(tiny_server):
    r = _post_tiny(tiny_server, {"prompt": "alpha", "n": 1, "method": "sjd", "lam": 0.9, "window": 4, "seed": 0})
    assert r.status_code == 200, r.text
    assert r.json()["csdgen"]["notes"] == ["lam 0.9 does not apply to method sjd (only csd uses it); it is not used"]
    r = _post_tiny(tiny_server, {"prompt": "alpha", "n": 1, "method": "ar", "window": 8, "draft_init": "onehot", "seed": 0})
    notes = r.json()["csdgen"]["notes"]
    assert notes == ["draft_init onehot does not apply to method ar (AR has no drafts); it is not used",
                     "method ar decodes one token per forward: window 8 does not apply (window 1)"], notes
    r = _post_tiny(tiny_server, {"prompt": "alpha", "n": 1, "method": "csd", "lam": 0.9, "window": 4, "seed": 0})
    assert r.json()["csdgen"]["notes"] == []


def test_serve_notes_and_class_reach_the_openai_client(tiny_server):
    """The notes and the decoded class as a user of the ``openai`` package sees them (``model_extra``)."""
    import openai

    c = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    result = c.images.generate(prompt="alpha", n=1, extra_body={"method": "sjd", "lam": 0.9, "window": 4, "seed": 0})
    info = result.model_extra["csdgen"]
    assert info["notes"] == ["lam 0.9 does not apply to method sjd (only csd uses it); it is not used"]
    assert info["class"] == result.data[0].revised_prompt and isinstance(info["class_index"], int)


def test_serve_answers_which_class_a_prompt_decoded(tiny_server):
    from serve_fixture import CLASS_NAMES

    r = _post_tiny(tiny_server, {"prompt": "3", "n": 2, "window": 4, "seed": 0})
    body = r.json()
    assert body["csdgen"]["class"] == CLASS_NAMES[3] and body["csdgen"]["class_index"] == 3
    assert [d["revised_prompt"] for d in body["data"]] == [CLASS_NAMES[3]] * 2
    r = _post_tiny(tiny_server, {"prompt": "random", "n": 1})
    assert r.status_code == 400 and "this server draws no random class" in r.json()["error"]["message"]
    assert r.json()["error"]["message"].startswith('prompt="random": '), r.json()  # not 'prompt: prompt="random"'
    r = _post_tiny(tiny_server, {"prompt": "no such class", "n": 1})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and message.startswith("prompt: unknown class 'no such class' ("), message
    assert "csdgen generate" not in message and message.count("allowed") == 1, message  # no command for an API user


def test_serve_stream_completed_events_carry_class_and_notes(tiny_server):
    import httpx

    body = {"prompt": "zeta", "n": 1, "window": 4, "seed": 0, "stream": True, "method": "sjd", "delta": 0.5}
    with httpx.stream("POST", tiny_server.url + "/v1/images/generations", json=body, timeout=120) as r:
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: ")]
    done = [e for e in events if e["type"] == "image_generation.completed"]
    assert done and done[0]["csdgen"]["class"] == "zeta" and "delta 0.5 does not apply" in done[0]["csdgen"]["notes"][0]


def test_the_server_notes_partial_images_asked_for_without_a_stream():
    from csdgen.serve.schemas import unused_fields

    assert unused_fields({"prompt": "a", "partial_every": 4}, "csd") == [
        "partial_every 4 applies to streamed requests only (stream true); it is not used"]
    assert unused_fields({"prompt": "a", "partial_images": 2, "stream": False}, "csd") == [
        "partial_images 2 applies to streamed requests only (stream true); it is not used"]
    assert unused_fields({"prompt": "a", "partial_images": 2, "partial_every": 4, "stream": True}, "csd") == []


def test_serve_takes_gsd_radius_and_lantern_delta_as_generate_does(builtin_server, builtin):
    """A request's ``gsd_radius`` / ``lantern_delta`` build the rule csdgen.generate gets from them:
    the same tokens, the option recorded in the answer's settings; out of range: 400 naming the field;
    with another method: a note that it is unused."""
    import csdgen
    from csdgen.acceptance import make_rule

    V = builtin.codebook_size
    body = {"prompt": "1", "n": 1, "seed": 3, "window": 4, "method": "gsd", "gsd_radius": 2, "return_tokens": True}
    r = post(builtin_server, body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["csdgen"]["settings"]["rule"]["radius"] == 2
    rule = make_rule("gsd", codebook=builtin.codebook_embeddings(), radius=2)
    offline = csdgen.generate(builtin, [1], method=rule, window=4, seed=3)
    assert answer["data"][0]["csdgen"]["tokens"] == offline.tokens[0].tolist()
    r = post(builtin_server, {"prompt": "1", "n": 1, "seed": 3, "window": 4, "method": "lantern", "lantern_delta": 0.3})
    assert r.status_code == 200 and r.json()["csdgen"]["settings"]["rule"]["delta"] == 0.3, r.text
    for field, value, allowed in (("gsd_radius", V, f"0..{V - 1}"), ("gsd_radius", "3", "an integer"),
                                  ("lantern_delta", 1.5, "[0, 1]"), ("lantern_delta", "x", "a finite number")):
        r = post(builtin_server, {"prompt": "1", "method": "gsd", field: value})
        assert r.status_code == 400, r.text
        error = error_of(r)
        assert error["param"] == field and allowed in error["message"], error
    r = post(builtin_server, {"prompt": "1", "n": 1, "seed": 3, "window": 4, "method": "csd", "gsd_radius": 2})
    assert r.json()["csdgen"]["notes"] == ["gsd_radius 2 does not apply to method csd (only gsd uses it); it is not used"]


def _post_raw(server, content: bytes) -> httpx.Response:
    return httpx.post(server.url + "/v1/images/generations", content=content, timeout=TIMEOUT,
                      headers={"content-type": "application/json"})


def test_serve_deeply_nested_json_is_a_400_invalid_json_not_a_500(tiny_server):
    """(Python's JSON decoder raised RecursionError: the answer was 500.)"""
    r = _post_raw(tiny_server, b'{"prompt":' + b"[" * 5000 + b"]" * 5000 + b"}")
    assert r.status_code == 400
    error = error_of(r)
    assert error["code"] == "invalid_json" and "nested too deeply" in error["message"]
    assert _post_tiny(tiny_server, {"prompt": "1", "seed": 0, "method": "ar"}).status_code == 200


def test_serve_a_key_given_twice_is_a_400_naming_it(tiny_server):
    """(Python's decoder kept the last value without a word: n 1 then n 4 drew four images.)"""
    r = _post_raw(tiny_server, b'{"prompt":"1","seed":0,"method":"ar","n":1,"n":4}')
    assert r.status_code == 400
    error = error_of(r)
    assert error["code"] == "invalid_json" and error["param"] == "n" and '"n" more than once' in error["message"]
    r = _post_raw(tiny_server, b'{"prompt":"1","windw\\ud800":1,"windw\\ud800":2}')  # echoed as its escape
    assert r.status_code == 400 and error_of(r)["param"] == "windw\\ud800"
    r.content.decode("utf-8")
    # the control: the same keys once each
    assert _post_raw(tiny_server, b'{"prompt":"1","seed":0,"method":"ar","n":1}').status_code == 200


def test_serve_lone_surrogate_in_a_field_name_is_a_400_in_valid_utf8(tiny_server):
    """(The param echoed the name: its answer could not be encoded and the client got a 500.)"""
    r = _post_raw(tiny_server, b'{"prompt":"1","windw\\ud800":1}')
    assert r.status_code == 400
    r.content.decode("utf-8")  # strict: the body is valid UTF-8
    error = error_of(r)
    assert error["code"] == "unknown_parameter" and error["param"] == "windw\\ud800"
    assert 'unknown field "windw\\ud800"' in error["message"]


def test_serve_lone_surrogate_in_echoed_values_answers_valid_utf8(tiny_server):
    for content, param in [(b'{"prompt":"1","model":"x\\udfff"}', "model"), (b'{"prompt":"1","method":"\\ud800"}', "method"),
                           (b'{"prompt":"1","window":"\\ud800"}', "window"), (b'{"prompt":"1","svg":"\\ud800"}', "svg")]:
        r = _post_raw(tiny_server, content)
        assert r.status_code in (400, 404), (content, r.text)
        r.content.decode("utf-8")
        assert error_of(r)["param"] == param


def test_serve_lone_surrogate_in_a_prompt_is_a_400_naming_its_index(tiny_server, tmp_path):
    """A class model, and a text model whose tokenizer raised TypeError on it (a 500)."""
    from csdgen.models.janus import JanusImageModel
    from csdgen.serve.schemas import APIError, parse_request

    from test_models_janus import build_checkpoint

    r = _post_raw(tiny_server, b'{"prompt":"\\ud800 cat","seed":0}')
    assert r.status_code == 400 and r.content.decode("utf-8")
    error = error_of(r)
    assert error["param"] == "prompt" and "lone surrogate '\\ud800' at index 0" in error["message"]
    served = ServedModel(JanusImageModel.from_pretrained(build_checkpoint(tmp_path / "janus")), "tiny-janus")
    with pytest.raises(APIError) as caught:
        parse_request({"prompt": "a red \udc80 cat", "seed": 0}, served)
    assert caught.value.status == 400 and caught.value.param == "prompt"
    assert "not valid Unicode text: a lone surrogate '\\udc80' at index 6; allowed: a text prompt" in caught.value.message
    assert parse_request({"prompt": "a red cat", "seed": 0}, served).input_tokens > 0


@pytest.mark.parametrize("stream", [True, False])
def test_serve_refuses_partial_images_with_partial_every(tiny_server, stream):
    """(partial_every won silently: 2 partial images asked, 18 streamed.)"""
    r = _post_tiny(tiny_server, {"prompt": "1", "seed": 0, "stream": stream, "partial_images": 2, "partial_every": 4})
    assert r.status_code == 400
    error = error_of(r)
    assert error["param"] == "partial_every" and error["code"] == "invalid_value"
    assert "partial_images=2 and partial_every=4" in error["message"] and "allowed: one of the two" in error["message"]


def test_serve_health_answers_head_as_get_without_a_body(tiny_server):
    """(HEAD /health was a 405: a load balancer's probe read the server as down.)"""
    head = httpx.head(tiny_server.url + "/health", timeout=TIMEOUT)
    assert head.status_code == 200 and head.content == b""
    assert httpx.get(tiny_server.url + "/health", timeout=TIMEOUT).json()["status"] == "ok"


def test_a_route_with_another_method_is_a_405_that_says_which_methods_it_allows(tiny_server):
    """Every error names what is allowed (docs/serve.md); a 405 said only "GET is not allowed on
    /v1/images/generations"."""
    for method, path, allowed in [("GET", "/v1/images/generations", "POST"), ("POST", "/health", "GET, HEAD"),
                                  ("DELETE", "/v1/models", "GET")]:
        r = httpx.request(method, tiny_server.url + path, timeout=TIMEOUT)
        assert r.status_code == 405
        error = error_of(r)
        assert error["code"] == "method_not_allowed"
        assert error["message"] == f"{method} is not allowed on {path}; allowed: {allowed}", error["message"]


def test_an_answer_of_503_counts_no_image_as_sent(cached_model, caplog):
    """A new-user try-out: a request answered 503 at shutdown after some of its images had finished logged
    'images=8/10', and the stop line counted those 8 as sent; the client got none."""
    from csdgen.serve.logs import access_log

    model = slow_model(cached_model, delay=0.05)
    app = create_app(ServedModel(model, "slow", defaults=ServeDefaults(method="ar")), capacity=1)  # one image at a time
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    server = BackgroundServer(app, log_level="info").__enter__()
    access_log.addHandler(handler)
    answer: dict = {}
    thread = threading.Thread(target=lambda: answer.update(r=post(server, {"prompt": "0", "n": 2, "seed": 1})))
    try:
        thread.start()
        wait_for(lambda: metric(server.url, "csdgen_images_total") >= 1)  # the first image is done, the second decodes
        server.__exit__(None, None, None)
        thread.join(TIMEOUT)
    finally:
        server._server.should_exit = True
        access_log.removeHandler(handler)
    assert answer["r"].status_code == 503
    lines = [r.getMessage() for r in seen]
    assert any('" 503 method=ar images=0/2 forwards=- ' in line for line in lines), lines
