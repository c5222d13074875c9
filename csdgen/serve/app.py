"""The HTTP side of ``csdgen serve``: a FastAPI app over the scheduler, and uvicorn to run it.

Routes:

* ``POST /v1/images/generations``: OpenAI's Images API (:mod:`csdgen.serve.schemas` lists the
  fields). Answers ``{"created", "data": [{"b64_json", "revised_prompt", "csdgen": {statistics}}], "size",
  "output_format", "background", "usage", "csdgen": {seed, settings, notes, class, class_index}}``
  (``revised_prompt``, ``class``, ``class_index``: the class decoded, for a class model; ``notes``:
  fields the method does not use, as ``csdgen generate`` notes them); with ``stream: true``,
  server-sent events as OpenAI streams images: ``image_generation.partial_image`` (the image
  so far, pending token cells veiled) then ``image_generation.completed`` per image;
* ``GET /v1/models``, ``GET /v1/models/{id}``: the served model;
* ``GET /health`` (and ``HEAD``: the same status, no body): 200 ``{"status": "ok", ...}`` while the
  scheduler runs, else 503;
* ``GET /metrics``: Prometheus text (:mod:`csdgen.serve.metrics`).

Every error is OpenAI's shape ``{"error": {"message", "type", "param", "code"}}`` with the
status that fits (:class:`csdgen.serve.schemas.APIError`); bad input never gets a 500.
A client that disconnects cancels its images at the next iteration (non-streaming requests are
watched while they wait; a stream notices when it cannot send, or at the next poll). When the
server stops (Ctrl-C), every image request not yet answered (queued or decoding) gets 503 ``server shutting down`` in the same
shape (a stream: an ``error`` event) and its images are cancelled.

Every image request is answered with an access line, and the server logs its start and its stop
(:mod:`csdgen.serve.logs`).
"""

from __future__ import annotations

import asyncio
import base64
import errno
import json
import math
import socket
import threading
import time
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .logs import AccessLine, log, log_config
from .metrics import CONTENT_TYPE_LATEST, ServeMetrics
from .scheduler import Scheduler
from .schemas import MAX_BODY_BYTES, MAX_PROMPT_CHARS, APIError, ServeDefaults, _shown, error_body, parse_request

__all__ = ["ServedModel", "create_app", "run_server", "BackgroundServer", "bind_socket"]

#: seconds between checks that a waiting client is still connected
POLL_SECONDS = 0.2


class ServedModel:
    """The model a server serves, with what the request checks need.

    Args:
        model: an :class:`~csdgen.models.base.ImageTokenModel` with an image decoder.
        name: the name requests give as ``model`` (and ``GET /v1/models`` lists).
        aliases: other names accepted as ``model``.
        defaults: the server's :class:`~csdgen.serve.schemas.ServeDefaults`.
        engine, compile: the decoding engine of every batch (``ContinuousBatch``'s ``engine`` and
            ``compile``; ``csdgen serve --engine`` / ``--compile``); default: ``"auto"``, compiled on CUDA only.

    Raises:
        ValueError: the model has no image decoder.
    """

    def __init__(self, model, name: str, *, aliases: tuple[str, ...] = (), defaults: ServeDefaults | None = None,
                 engine: str = "auto", compile: bool | None = None):
        from csdgen.engine import default_sampling

        from .images import image_size

        self.model, self.name = model, name
        self.engine_kwargs = {"engine": engine, "compile": compile}
        self.names = [name, *[a for a in aliases if a and a != name]]
        from csdgen.torch_threads import call_in_thread

        # one decode, in a thread that ends with it: the caller's thread (often the main one) then
        # holds no OpenMP pool beside the scheduler's (csdgen.torch_threads)
        self.size = call_in_thread(image_size, model)
        self.size_text = f"{self.size[0]}x{self.size[1]}"
        self.defaults = defaults or ServeDefaults()
        sampling = default_sampling(model)  # a family's top-k >= this codebook: no top-k (as generate)
        self.model_defaults = {"guidance_scale": sampling.guidance_scale, "temperature": sampling.temperature,
                               "top_k": sampling.top_k, "top_p": sampling.top_p}
        d = getattr(model, "defaults", None)
        if d is not None:
            self.model_defaults.update({"lam": d.lam, "delta": d.delta})
        self.classes = hasattr(model, "class_ids")
        if self.classes:
            names = getattr(model, "class_names", None) or []
            example = f"e.g. {_shown(names[0])} or \"0\"" if names else "e.g. \"0\""
            self.prompt_help = (f"a class of the model, by name or by its index 0..{model.num_classes - 1} written "
                                f"as a string ({example})")
        else:
            self.prompt_help = "a text prompt"

    def condition(self, prompt: str, guided: bool) -> tuple[Any, int]:
        """``(condition for model.start, prompt tokens)`` of a prompt.

        Raises:
            APIError: 400 naming the prompt and what is allowed (the model's own message).
        """
        try:
            if self.classes:
                return self.model.class_ids([prompt])[0], 1
            session = self.model.start([prompt], 1, guided)  # tokenizes and checks the length; no forward
        except ValueError as exc:
            from csdgen.class_names import LIST_HINT

            # without the command that lists the classes (csdgen.class_names): not this API
            text = str(exc).replace(f" ({LIST_HINT})", "").replace(f"; {LIST_HINT}", "")
            message = f"prompt: {text}" if "allowed" in text else f"prompt: {text}; allowed: {self.prompt_help}"
            if self.classes and getattr(getattr(self.model, "classes", None), "is_random", lambda _: False)(prompt):
                message = f"prompt={_shown(prompt)}: this server draws no random class; allowed: {self.prompt_help}"
            raise APIError(400, message, param="prompt", code="invalid_value") from None
        lengths = getattr(session, "prompt_lengths", None)
        return prompt, int(lengths[0]) if lengths is not None and len(lengths) else 0


class _RepeatedKey(ValueError):
    """A JSON object of the request body gives ``key`` twice (:func:`_unique_keys`)."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook``: the object as a dict, refusing a key given twice.

    Raises:
        _RepeatedKey: a key appears more than once (Python's decoder would keep the last value without a word)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


DRAIN_BYTES = 64 * MAX_BODY_BYTES  #: the most of a body past the limit read (and dropped) before the 413


async def _read_body(request) -> bytes:
    """The request's body, at most :data:`~csdgen.serve.schemas.MAX_BODY_BYTES` bytes.

    Raises:
        APIError: 413 ``request_too_large`` naming the size (the declared ``Content-Length``, else the bytes
            read past the limit) and the limit. A larger body is read on and dropped, up to
            :data:`DRAIN_BYTES`, so that the client, still sending, reads the answer instead of a broken
            connection; a declared ``Content-Length`` beyond that is answered before any byte is read
            (a body that would not be read whole anyway; its client may never send it).
        starlette.requests.ClientDisconnect: the client went away before its body arrived.
    """
    text = request.headers.get("content-length", "")
    declared = int(text) if text.isascii() and text.isdigit() else None
    size, chunks = 0, []
    if declared is not None and declared > DRAIN_BYTES:
        size = declared
    else:
        async for chunk in request.stream():
            size += len(chunk)
            if size <= MAX_BODY_BYTES:
                chunks.append(chunk)
            elif size > DRAIN_BYTES:
                break
    if size > MAX_BODY_BYTES:
        told = f"{declared} bytes" if declared is not None else f"more than {MAX_BODY_BYTES} bytes"
        raise APIError(413, f"the request body has {told}; allowed at most {MAX_BODY_BYTES} (a prompt of at most "
                            f"{MAX_PROMPT_CHARS} characters and the other fields)", code="request_too_large")
    return b"".join(chunks)


async def _client_gone(request) -> bool:
    """Whether the client of ``request`` went away: Starlette's ``is_disconnected``, or True where asking
    fails (behind Ray Serve the proxy actor that held the connection died, as at Ctrl-C of ``csdgen serve
    --replicas``: ``ActorDiedError``; a request with no one to answer is a client gone, not a server error)."""
    try:
        return await request.is_disconnected()
    except Exception:
        return True


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _image_stats(request, index: int, stats, tokens) -> dict:
    out = {"image_index": index, "seed": request.seed, "forwards": stats.steps,
           "step_compression": stats.step_compression, "mean_accepted_length": stats.mean_accepted_length,
           "decisions": stats.counts()}
    if request.return_tokens:
        out["tokens"] = tokens.tolist()
    return out


def _request_info(request) -> dict:
    """What the answer says about the request as decoded: its class (a class model: ``class``,
    ``class_index``) and ``notes`` (fields its method does not use, as ``csdgen generate`` notes them)."""
    return {**request.label, "notes": list(request.notes)}


def _usage(request, served, images: int) -> dict:
    N = served.model.num_image_tokens
    inputs = request.input_tokens * images
    return {"input_tokens": inputs, "input_tokens_details": {"image_tokens": 0, "text_tokens": inputs},
            "output_tokens": N * images, "total_tokens": inputs + N * images,
            "output_tokens_details": {"image_tokens": N * images, "text_tokens": 0}}


def _valid_text(value: Any) -> Any:
    """``value`` with every string made encodable as UTF-8: a lone surrogate (JSON's ``"\\ud800"``
    decodes to one) is written as its escape, ``\\ud800``, in the text."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_valid_text(k): _valid_text(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_valid_text(v) for v in value]
    return value


class SafeJSONResponse(JSONResponse):
    """A JSONResponse whose body is always valid UTF-8: a string the client sent back in an answer
    (an unknown field's name, a prompt) may hold a lone surrogate, which UTF-8 cannot encode."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return super().render(_valid_text(content))


def _error_response(error: APIError):
    return SafeJSONResponse(error.body(), status_code=error.status, headers=error.headers)


def create_app(served: ServedModel, *, capacity: int = 16, max_queue: int = 256, batching: str = "continuous",
               metrics: ServeMetrics | None = None):
    """The FastAPI app serving ``served`` (its scheduler starts and stops with the app's lifespan).

    Args:
        capacity: most images in the running batch (``--max-batch``, capped by the memory estimate).
        max_queue: most images waiting before requests get 429.
        batching: ``"continuous"`` (default) or ``"static"`` (admission into an empty batch only).
    """
    metrics = metrics or ServeMetrics()
    scheduler = Scheduler(served, capacity=capacity, max_queue=max_queue, batching=batching, metrics=metrics)
    started = int(time.time())
    totals = {"requests": 0, "images": 0}  # answered image requests and the images they got (the stop line)

    @asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        began = time.perf_counter()
        log.info("serving %s on %s: max batch %d, %s batching, at most %d images waiting, engine %s", served.name,
                 served.model.device, scheduler.capacity, batching, max_queue, served.engine_kwargs["engine"])
        try:
            yield
        finally:
            if not closing["now"]:  # stopped by its host (a Ray Serve replica), not by run_server's signal
                app.state.shutting_down()
            await run_in_threadpool(scheduler.stop)
            requests, images = totals["requests"], totals["images"]
            log.info("stopped after %.0f s: %d image request%s answered, %d image%s sent", time.perf_counter() - began,
                     requests, "s" * (requests != 1), images, "s" * (images != 1))

    app = FastAPI(title="csdgen serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
                  default_response_class=SafeJSONResponse)
    app.state.served, app.state.scheduler, app.state.metrics = served, scheduler, metrics

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        if exc.status_code == 404:
            message = (f"no route {request.method} {request.url.path}; this server offers POST /v1/images/generations, "
                       f"GET /v1/models, GET /health, GET /metrics")
            code = "unknown_url"
        elif exc.status_code == 405:
            allow = sorted(m.strip() for m in (getattr(exc, "headers", None) or {}).get("Allow", "").split(",") if m.strip())
            message = f"{request.method} is not allowed on {request.url.path}"
            message += f"; allowed: {', '.join(allow)}" if allow else ""
            code = "method_not_allowed"
        else:
            message, code = str(exc.detail), None
        return SafeJSONResponse(error_body(message, APIError.TYPES.get(exc.status_code, "invalid_request_error"), None, code),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc):
        return _error_response(APIError(400, f"bad request: {exc.errors()[0].get('msg', exc)}", code="invalid_value"))

    def internal(exc: BaseException) -> APIError:  # a bug of the server, never a bad value (those are APIErrors)
        return APIError(500, f"internal server error: {type(exc).__name__}: {exc}", code="internal_error")

    @app.exception_handler(Exception)
    async def internal_error(request, exc):
        return _error_response(internal(exc))

    def count(status: int) -> None:
        metrics.requests.labels(str(status)).inc()

    def answered(line: AccessLine, status: int) -> None:
        """An image request's answer: the request counter and its access line."""
        count(status)
        if not line.written:
            totals["requests"] += 1
            totals["images"] += line.images
        line.write(status)

    listeners: set[asyncio.Queue] = set()  # event queues of the requests waiting for images
    closing = {"now": False}

    def shutting_down() -> None:
        """Called in the event loop when the server begins to stop: every unanswered image request gets 503."""
        closing["now"] = True
        log.info("shutting down: %d image request%s not yet answered (queued or decoding) get%s 503", len(listeners),
                 "" if len(listeners) == 1 else "s", "s" if len(listeners) == 1 else "")
        for queue in list(listeners):
            queue.put_nowait(("shutdown",))

    app.state.shutting_down = shutting_down

    def shutdown_error() -> APIError:
        # the code and header of every 503 while stopping (docs/serve.md, "Errors"): a client's retry
        # logic reads one code, and Retry-After tells it when
        return APIError(503, "server shutting down; its images were cancelled, send the request again once the "
                             "server is back", code="unavailable", headers={"Retry-After": "5"})

    @app.post("/v1/images/generations")
    async def generations(request: Request):
        line = AccessLine(getattr(request, "client", None), served.model.num_image_tokens)
        try:
            return await _generations(request, line)
        except APIError as exc:
            answered(line, exc.status)
            return _error_response(exc)
        except Exception as exc:  # a bug of the server: answered, counted and logged as every other answer
            log.exception("internal error answering POST /v1/images/generations")
            error = internal(exc)
            answered(line, error.status)
            return _error_response(error)

    async def _generations(request: Request, line: AccessLine):
        try:
            raw = await _read_body(request)
        except ClientDisconnect:  # the client went away before its body arrived: nothing to answer
            answered(line, 499)
            return Response(status_code=499)
        try:
            body = json.loads(raw, object_pairs_hook=_unique_keys)
        except _RepeatedKey as exc:
            raise APIError(400, f"the request body gives the key {_shown(exc.key)} more than once in one object; allowed: "
                                f"each key once (JSON leaves a repeated key's value undefined, RFC 8259 section 4)",
                           param=exc.key, code="invalid_json") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise APIError(400, f"the request body is not valid JSON ({exc}); allowed: a JSON object with a prompt",
                           code="invalid_json") from None
        except RecursionError:  # Python's decoder recurses per array or object level
            raise APIError(400, "the request body is JSON nested too deeply to decode (arrays or objects inside one "
                                "another about a thousand levels deep); allowed: a JSON object with a prompt",
                           code="invalid_json") from None
        req = await run_in_threadpool(parse_request, body, served)
        line.request(req)
        if closing["now"]:
            raise shutdown_error()
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        job = scheduler.submit(req, loop, events)
        listeners.add(events)
        if req.stream:  # counted when it ends (_stream)
            return StreamingResponse(_stream(request, job, events, line), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        images: dict[int, tuple] = {}
        try:
            while True:
                try:
                    event = await asyncio.wait_for(events.get(), POLL_SECONDS)
                except asyncio.TimeoutError:
                    if await _client_gone(request):
                        scheduler.cancel(job)
                        answered(line, 499)
                        return Response(status_code=499)
                    continue
                if event[0] == "image":
                    _, index, png, stats, tokens = event
                    images[index] = (png, stats, tokens)
                elif event[0] == "error":
                    raise event[1]
                elif event[0] == "shutdown":
                    scheduler.cancel(job)
                    raise shutdown_error()
                elif event[0] == "done":
                    break
        except asyncio.CancelledError:  # answered, no traceback
            scheduler.cancel(job)
            if not closing["now"]:  # its host cancelled it while serving (Ray Serve, when the client left): a 499
                answered(line, 499)
                return Response(status_code=499)
            error = shutdown_error()  # cancelled by uvicorn past its graceful shutdown
            answered(line, error.status)
            return _error_response(error)
        finally:
            listeners.discard(events)
        data = [{"b64_json": base64.b64encode(images[i][0]).decode("ascii"), "revised_prompt": req.label.get("class"),
                 "csdgen": _image_stats(req, i, images[i][1], images[i][2])} for i in range(req.n)]
        for i in range(req.n):  # sent with this answer only: an answer of 503 or 499 sends none
            line.image(images[i][1])
        answered(line, 200)
        return SafeJSONResponse({"created": int(time.time()), "data": data, "background": "opaque", "output_format": "png",
                             "size": served.size_text, "usage": _usage(req, served, req.n),
                             "csdgen": {"model": served.name, "seed": req.seed, "settings": _json_safe(req.settings),
                                        **_request_info(req)}})

    def sse(event: str, payload: dict) -> bytes:
        return f"event: {event}\ndata: {json.dumps(payload)}\n\n".encode()

    async def _stream(request: Request, job, events: asyncio.Queue, line: AccessLine):
        req = job.request
        # the status the request counter gets when the stream ends: 200 once every image was sent,
        # 499 when the client went away first (as for a non-streaming request), else the error's
        status: dict = {"code": None}

        async def watch() -> None:  # the body is read: the next message is the client going away
            while (await request.receive())["type"] != "http.disconnect":
                pass
            status["code"] = status["code"] or 499
            scheduler.cancel(job)
            events.put_nowait(("done",))

        watcher = asyncio.ensure_future(watch())
        try:
            while True:
                event = await events.get()
                kind = event[0]
                common = {"background": "opaque", "created_at": int(time.time()), "output_format": "png",
                          "quality": "auto", "size": served.size_text}
                if kind == "partial":
                    _, index, png, committed, forwards, partial_index = event
                    yield sse("image_generation.partial_image", {
                        "type": "image_generation.partial_image", "b64_json": base64.b64encode(png).decode("ascii"),
                        "partial_image_index": partial_index, **common,
                        "csdgen": {"image_index": index, "seed": req.seed, "committed_tokens": committed,
                                   "tokens": served.model.num_image_tokens, "forwards": forwards}})
                elif kind == "image":
                    _, index, png, stats, tokens = event
                    line.image(stats)
                    yield sse("image_generation.completed", {
                        "type": "image_generation.completed", "b64_json": base64.b64encode(png).decode("ascii"),
                        **common, "usage": _usage(req, served, 1),
                        "csdgen": {**_image_stats(req, index, stats, tokens), **_request_info(req)}})
                elif kind in ("error", "shutdown"):
                    error = event[1] if kind == "error" else shutdown_error()
                    status["code"] = status["code"] or error.status
                    yield sse("error", {"type": "error", **error.body()})
                    return
                elif kind == "done":
                    status["code"] = status["code"] or 200
                    return
        except Exception as exc:  # a bug of the server mid-stream: an error event, counted and logged as a 500
            log.exception("internal error streaming POST /v1/images/generations")
            error = internal(exc)
            status["code"] = status["code"] or error.status
            yield sse("error", {"type": "error", **error.body()})
        finally:
            answered(line, status["code"] or 499)  # closed before its end: the client left while an event was sent
            listeners.discard(events)
            watcher.cancel()
            scheduler.cancel(job)  # no-op once the job finished

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": started, "owned_by": "csdgen"}]}

    @app.get("/v1/models/{model_id:path}")
    async def model_info(model_id: str):
        if model_id not in served.names:
            raise APIError(404, f"the model {_shown(model_id)} does not exist on this server; allowed: {', '.join(served.names)}",
                           param="model", code="model_not_found")
        return {"id": served.name, "object": "model", "created": started, "owned_by": "csdgen"}

    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: load balancers' probe, the status without the body
    async def health():
        body = {"status": "ok" if scheduler.alive else "unavailable", "model": served.name, "queue": scheduler.waiting,
                "batch": scheduler.occupancy, "capacity": scheduler.capacity, "batching": scheduler.batching}
        return SafeJSONResponse(body, status_code=200 if scheduler.alive else 503)

    @app.get("/metrics")
    async def prometheus():
        metrics.queue_depth.set(scheduler.waiting)
        metrics.occupancy.set(scheduler.occupancy)
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one).

    Raises:
        ValueError: one line naming the address and why it cannot be used.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"--host {host!r}: not an address of this machine ({exc.strerror})") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRNOTAVAIL:  # the address is not one of this machine's, whatever the port
            raise ValueError(f"cannot listen on {host}:{port} ({exc.strerror}): --host {host!r} is not an address of "
                             f"this machine; allowed: one of its addresses, e.g. 127.0.0.1 or 0.0.0.0 (all)") from None
        raise ValueError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port (0: any free port)") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _server(app, on_ready: Callable[[], None] | None, log_level: str = "warning"):
    import uvicorn

    class Server(uvicorn.Server):
        stopped_by: int | None = None  # the first signal that stopped it (SIGINT, SIGTERM), None: none

        def handle_exit(self, sig, frame):
            if self.stopped_by is None:
                self.stopped_by = sig
            super().handle_exit(sig, frame)

        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started and on_ready is not None:
                on_ready()

        async def shutdown(self, sockets=None):
            notify = getattr(getattr(app, "state", None), "shutting_down", None)
            if notify is not None:  # waiting requests get 503 within the graceful period, not a cancelled task
                notify()
            await super().shutdown(sockets=sockets)
            done = getattr(self.lifespan, "shutdown_event", None)
            if self.force_exit and done is not None and not done.is_set():
                # a second Ctrl-C (uvicorn's force quit) skips the waits for connections and the app's
                # shutdown; asyncio then cancelled the lifespan task and uvicorn logged its CancelledError
                # traceback. The app's shutdown stops the scheduler within an iteration: it runs all the same
                await self.lifespan.shutdown()

    # uvicorn's access lines are off: the image requests get csdgen's own (csdgen.serve.logs), and a
    # line per /health or /metrics poll would bury them
    config = uvicorn.Config(app, log_level=log_level, log_config=log_config(log_level), access_log=False, lifespan="on",
                            timeout_graceful_shutdown=3)
    return Server(config)


def run_server(app, sock: socket.socket, on_ready: Callable[[], None] | None = None,
               log_level: str = "info") -> int | None:
    """Serve ``app`` on the listening socket ``sock`` until interrupted (uvicorn; Ctrl-C stops it).

    Args:
        on_ready: called once the server accepts requests.
        log_level: of uvicorn's loggers and csdgen's (:data:`csdgen.serve.logs.LOG_LEVELS`); ``info``
            writes an access line per image request.

    Returns:
        the signal number that stopped the server (``signal.SIGINT``, ``signal.SIGTERM``), None
        when none did. Once stopped, uvicorn raises that signal again under the handler the process
        had: with Python's default SIGINT handler this function raises KeyboardInterrupt instead of
        returning, with the default SIGTERM handler the process ends (status 143); where the process
        came with the signal ignored (a background job of a non-interactive shell), it returns.

    Raises:
        ValueError: a ``log_level`` not in :data:`~csdgen.serve.logs.LOG_LEVELS`.
        KeyboardInterrupt: stopped by SIGINT under Python's default handler.
    """
    server = _server(app, on_ready, log_level)
    server.run(sockets=[sock])
    return server.stopped_by


class BackgroundServer:
    """``app`` served by uvicorn in a thread of this process (tests, benchmarks): ``with
    BackgroundServer(app) as server: server.url``.

    Args:
        app: the ASGI app; host: address to bind (default 127.0.0.1); port: 0 = a free one.
        log_level: as :func:`run_server`'s; default ``warning`` (no access lines).
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        self.app, self.sock = app, bind_socket(host, port)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._ready = threading.Event()
        self._server = _server(app, self._ready.set, log_level)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "BackgroundServer":
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError(f"the server on {self.url} did not start within 60 s")
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self.sock.close()
