"""What the server accepts and answers: the OpenAI Images API body (plus csdgen's own fields), its
checks, and the OpenAI error shape.

A request body is checked field by field before anything is queued (:func:`parse_request`):
every bad value is one :class:`APIError` naming the field (``param``), the value and what is
allowed, with the status that fits (400 a bad value, 404 an unknown model, 413 too many
images). Nothing here imports FastAPI: the checks are plain functions over the decoded JSON.

Fields (OpenAI's ``images.generate``):

* ``prompt`` (required): a class of the built-in model (its name, any case, or its index, as
  the model's own lookup takes it), a text prompt for the families;
* ``n`` (1 .. ``max_images``, default 1), ``size`` (the model's ``WIDTHxHEIGHT`` or ``auto``),
  ``model`` (the served model's name), ``response_format`` (``b64_json``), ``output_format``
  (``png``), ``background`` (``auto`` / ``opaque``), ``quality`` (``auto``), ``stream``,
  ``partial_images`` (0 .. 3), ``moderation``, ``user``, ``safety_identifier`` (accepted,
  unused); the other fields the SDK knows (``style``, ``output_compression``, ``complexity``,
  ``frame_count``, ``frame_duration_ms``, ``svg``) only as null;

csdgen's own (the SDK sends them with ``extra_body``): ``method``, ``window`` (1 .. N or
``"auto"``), ``seed`` (an integer 0 .. 2**63 - 1; default a random one, reported back), ``guidance_scale``,
``temperature``, ``top_k`` (null / 0 = none), ``top_p``, ``lam``, ``delta``, ``entropy_unit``,
``addition_c``, ``gsd_radius`` (0 .. V - 1), ``lantern_delta`` (0 .. 1), ``draft_init``, ``refresh``, ``return_tokens`` (add each image's tokens to the
answer) and ``partial_every`` (with ``stream``: a partial image every this many of the image's
forwards, instead of ``partial_images`` spread over the image; a request gives one of the two).
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

__all__ = ["APIError", "ServeDefaults", "ImageRequest", "parse_request", "unused_fields", "error_body", "OPENAI_FIELDS",
           "CSDGEN_FIELDS"]

#: OpenAI fields this server honours or accepts
OPENAI_FIELDS = ("prompt", "model", "n", "size", "response_format", "output_format", "background", "quality", "stream",
                 "partial_images", "moderation", "user", "safety_identifier")
#: OpenAI fields the SDK may send that this server cannot honour: accepted only as null
NULL_ONLY_FIELDS = ("style", "output_compression", "complexity", "frame_count", "frame_duration_ms", "svg")
#: csdgen's own fields (``extra_body``)
CSDGEN_FIELDS = ("method", "window", "seed", "guidance_scale", "temperature", "top_k", "top_p", "lam", "delta",
                 "entropy_unit", "addition_c", "gsd_radius", "lantern_delta", "draft_init", "refresh", "return_tokens",
                 "partial_every")
MAX_PROMPT_CHARS = 32_000
#: bytes a request body may hold: a prompt of MAX_PROMPT_CHARS characters of up to 4 bytes each (or
#: their 12-byte JSON escapes), with room for the other fields; a larger body gets a 413, its bytes past this not kept
MAX_BODY_BYTES = 512 * 1024
#: ``ServeDefaults.guidance_schedule`` (``csdgen serve --guidance-schedule``)
GUIDANCE_SCHEDULES = ("family", "constant")
#: a request's seed is an integer in 0 .. 2**63 - 1 (csdgen.sampling.MAX_SEED); the default is drawn from that range
SEED_BITS = 63


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """The OpenAI error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class APIError(Exception):
    """An answer other than 200, in the OpenAI error shape.

    Args:
        status: HTTP status (400 bad value, 404 unknown model or route, 413 too many images,
            429 queue full, 500 model failure, 503 not serving).
        message: one line naming the bad value and what is allowed.
        param: the request field at fault (None when no field is).
        code: a short machine-readable code (``invalid_value``, ``model_not_found``, ...).
        type: OpenAI's error type (default from the status).
        headers: extra response headers (``Retry-After``).
    """

    TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
             413: "invalid_request_error", 415: "invalid_request_error", 422: "invalid_request_error",
             429: "rate_limit_error", 500: "server_error", 503: "server_error"}

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or self.TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def _shown(value: Any) -> str:
    """A request's value as JSON writes it (``true``, ``null``, ``"text"``, ``[1, 2]``): what the client sent, not
    Python's spelling (``True``, ``None``, ``'text'``); ``repr`` for what JSON cannot write."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def _bad(param: str, message: str, code: str = "invalid_value", status: int = 400) -> APIError:
    return APIError(status, message, param=param, code=code)


@dataclass
class ServeDefaults:
    """The server's settings for fields a request leaves out (``csdgen serve``'s options).

    None: the model's defaults (``model.defaults``), as :func:`csdgen.generate` takes them.
    """

    method: str = "csd"
    window: int | str = "auto"
    guidance_scale: float | None = None
    temperature: float | None = None
    top_k: int | None = None  #: 0: no top-k
    top_p: float | None = None
    lam: float | None = None
    delta: float | None = None
    entropy_unit: str = "nats"
    addition_c: float = 0.2
    gsd_radius: int | None = None  #: None: the GSD rule's default
    lantern_delta: float | None = None  #: None: the LANTERN rule's default
    draft_init: str | None = None
    refresh: str | None = None
    partial_every: int = 8
    max_images: int = 10
    #: ``"family"``: the model's own guidance schedule (``model.reference_guidance``, Lumina-mGPT 2.0's),
    #: as ``csdgen generate`` runs it; ``"constant"``: the guidance scale at every position
    guidance_schedule: str = "family"

    def __post_init__(self) -> None:
        if self.guidance_schedule not in GUIDANCE_SCHEDULES:
            raise ValueError(f"guidance_schedule={self.guidance_schedule!r}: allowed {', '.join(GUIDANCE_SCHEDULES)}")


@dataclass
class ImageRequest:
    """One checked request: what the scheduler needs to decode its images and answer.

    Attributes:
        prompt: as given; condition: what ``model.start`` takes for each of its images.
        n: images; image ``i`` draws from the stream keyed by ``(seed, i)``.
        seed: the request's seed (given, or drawn and reported back).
        key: hashable settings; images with the same key can share a batch.
        batch_kwargs: ``ContinuousBatch``'s method, window, sampling, draft_init, refresh.
        settings: the resolved settings (reported back beside the images).
        stream, partial_images, partial_every: streaming of partial images.
        return_tokens: add each image's tokens to the answer.
        input_tokens: prompt tokens of one image (for ``usage``).
        notes: one line per field the request gave that its method does not use (as ``csdgen
            generate`` notes them on stderr), reported back in the answer's ``csdgen`` block.
        label: a class model's decoded class, ``{"class": name, "class_index": index}`` (else empty).
    """

    prompt: str
    condition: Any
    n: int
    seed: int
    key: tuple
    batch_kwargs: dict
    settings: dict
    stream: bool = False
    partial_images: int | None = None
    partial_every: int | None = None
    return_tokens: bool = False
    input_tokens: int = 0
    extra: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    label: dict = field(default_factory=dict)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(body: dict, name: str, default: Any, low: int | None = None, high: int | None = None,
             allow_null: bool = False) -> Any:
    value = body.get(name, default)
    if value is None and (allow_null or default is None):
        return None
    if not _is_int(value) or (low is not None and value < low) or (high is not None and value > high):
        span = (f"an integer {low}..{high}" if high is not None else f"an integer >= {low}" if low is not None
                else "an integer")
        raise _bad(name, f"{name}={_shown(value)}: allowed {span}{' or null' if allow_null else ''}")
    return value


def _number(body: dict, name: str, default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(name, f"{name}={_shown(value)}: allowed a finite number")
    return float(value)


def _choice(body: dict, name: str, default: Any, allowed: tuple, why: str = "") -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, str) or value not in allowed:
        raise _bad(name, f"{name}={_shown(value)}: allowed {', '.join(allowed)}{why}")
    return value


def _text(value: str) -> str:
    """``value`` as valid Unicode text: a lone surrogate (UTF-8 cannot encode it) written as its escape."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate of ``text`` (U+D800..U+DFFF), or None where it is valid text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _param_of(message: str, names: tuple[str, ...], default: str) -> str:
    """The request field a library ValueError is about (its message starts with ``name=``)."""
    for name in names:
        if message.startswith(f"{name}=") or f" {name}=" in message:
            return name
    return default


def unused_fields(body: dict, method: str) -> list[str]:
    """One note per field ``body`` gives (not null) that ``method`` does not use
    (:mod:`csdgen.method_options`, the table ``csdgen generate``'s notes use), worded as its notes:
    ``"lam 0.9 does not apply to method sjd (only csd uses it); it is not used"``; a ``window``
    other than 1 with ``ar``: it decodes at window 1; ``partial_images`` or ``partial_every``
    without ``stream``: only a stream has partial images."""
    from csdgen.method_options import METHOD_OPTIONS, unused_options

    notes = [f"{name} {value} does not apply to method {method} ({why}); it is not used"
             for name, value, why in unused_options({name: body.get(name) for name in METHOD_OPTIONS}, method)]
    window = body.get("window")
    if method == "ar" and window not in (None, 1, "auto"):
        notes.append(f"method ar decodes one token per forward: window {window} does not apply (window 1)")
    if body.get("stream") is not True:  # partial images are events of a stream
        notes += [f"{name} {body[name]} applies to streamed requests only (stream true); it is not used"
                  for name in ("partial_images", "partial_every") if body.get(name) is not None]
    return notes


def parse_request(body: Any, served) -> ImageRequest:
    """Check a decoded JSON body against the served model; return what the scheduler runs.

    Args:
        body: the decoded JSON (must be an object).
        served: the :class:`csdgen.serve.app.ServedModel` (model, names, size, defaults).

    Raises:
        APIError: 400 for a bad or unknown field (naming it and what is allowed), 404 for an
            unknown model, 413 for more images than ``max_images``.
    """
    from csdgen.engine import resolve_arguments
    from csdgen.engine import METHODS
    from csdgen.drafting import DRAFT_INITS, REFRESH_MODES
    from csdgen.sampling import SamplingConfig

    if not isinstance(body, dict):
        kinds = {type(None): "null", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
        raise APIError(400, f"the request body is a JSON {kinds.get(type(body), type(body).__name__)}; allowed: a JSON object with a prompt",
                       code="invalid_type")
    unknown = [k for k in body if k not in OPENAI_FIELDS + NULL_ONLY_FIELDS + CSDGEN_FIELDS]
    if unknown:  # param: the name as valid text (a lone surrogate as its escape), as the message's JSON writes it
        raise _bad(_text(unknown[0]), f"unknown field {_shown(unknown[0])}; allowed: {', '.join(OPENAI_FIELDS + CSDGEN_FIELDS)}",
                   code="unknown_parameter")
    for name in NULL_ONLY_FIELDS:
        if body.get(name) is not None:
            raise _bad(name, f"{name}={_shown(body[name])}: not supported by this server (its images are the model's own "
                             f"{served.size_text} PNGs); allowed: null or leave it out", code="unsupported_value")
    d: ServeDefaults = served.defaults

    model = body.get("model")
    if model is not None and (not isinstance(model, str) or model not in served.names):
        raise APIError(404, f"the model {_shown(model)} does not exist on this server; allowed: {', '.join(served.names)}",
                       param="model", code="model_not_found")
    if "prompt" not in body or body["prompt"] is None:
        raise _bad("prompt", f"prompt is required; allowed: {served.prompt_help}", code="missing_required_parameter")
    prompt = body["prompt"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise _bad("prompt", f"prompt={_shown(prompt)}: allowed a non-empty string ({served.prompt_help})")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise _bad("prompt", f"prompt has {len(prompt)} characters; allowed at most {MAX_PROMPT_CHARS}")
    bad = _lone_surrogate(prompt)
    if bad is not None:  # JSON's "\ud800" decodes to one; a tokenizer or a class lookup cannot take it
        raise _bad("prompt", f"prompt is not valid Unicode text: a lone surrogate {prompt[bad]!r} at index {bad}; "
                             f"allowed: {served.prompt_help}, as valid Unicode text")
    n = body.get("n", 1)
    n = 1 if n is None else n
    if not _is_int(n) or n < 1:
        raise _bad("n", f"n={_shown(n)}: allowed an integer 1..{d.max_images}")
    if n > d.max_images:
        raise APIError(413, f"n={n}: this server makes at most {d.max_images} images per request; allowed 1..{d.max_images}",
                       param="n", code="too_many_images")
    size = body.get("size")
    if size is not None and size not in ("auto", served.size_text):
        raise _bad("size", f"size={_shown(size)}: allowed {served.size_text} (this model's size) or auto")
    _choice(body, "response_format", "b64_json", ("b64_json",), " (this server keeps no files to link to)")
    _choice(body, "output_format", "png", ("png",))
    _choice(body, "background", "auto", ("auto", "opaque"), " (the model's images have no transparency)")
    _choice(body, "quality", "auto", ("auto",), " (the model has one quality)")
    _choice(body, "moderation", "auto", ("auto", "low"))
    for name in ("user", "safety_identifier"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise _bad(name, f"{name}={_shown(body[name])}: allowed a string")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("stream", f"stream={_shown(stream)}: allowed true or false")
    partial_images = _integer(body, "partial_images", None, 0, 3)
    partial_every = _integer(body, "partial_every", None, 1)
    if partial_images is not None and partial_every is not None:  # two spacings of the same events: one wins silently
        raise _bad("partial_every", f"partial_images={partial_images} and partial_every={partial_every} both say how "
                                    f"many partial images to stream; allowed: one of the two (partial_images: that "
                                    f"many spread over the image; partial_every: one every that many forwards)")
    return_tokens = body.get("return_tokens", False)
    if not isinstance(return_tokens, bool):
        raise _bad("return_tokens", f"return_tokens={_shown(return_tokens)}: allowed true or false")

    if isinstance(body.get("method"), str) and body["method"].lower() in METHODS:  # any case, as the library and
        body = {**body, "method": body["method"].lower()}  # the CLI take it; a bad name is answered as given
    method = _choice(body, "method", d.method, METHODS)
    window = body.get("window", d.window)
    N = served.model.num_image_tokens
    if window is None:
        window = d.window
    if isinstance(window, str):
        window = window.lower()
    if not (window == "auto" or (_is_int(window) and 1 <= window <= N)):
        raise _bad("window", f"window={_shown(window)}: allowed an integer 1..{N} (tokens per image) or \"auto\"")
    seed = body.get("seed")
    if seed is None:
        seed = secrets.randbits(SEED_BITS)
    elif not _is_int(seed) or not 0 <= seed < 2**SEED_BITS:
        raise _bad("seed", f"seed={_shown(seed)}: allowed an integer in 0..{2**SEED_BITS - 1}")
    draft_init = _choice(body, "draft_init", d.draft_init, tuple(DRAFT_INITS))
    refresh = _choice(body, "refresh", d.refresh, tuple(REFRESH_MODES))
    entropy_unit = _choice(body, "entropy_unit", d.entropy_unit, ("nats", "normalized"))
    defaults = served.model_defaults
    values = {}
    for name in ("guidance_scale", "temperature", "top_p", "lam", "delta", "addition_c"):
        given = _number(body, name, None)
        fallback = getattr(d, name)
        values[name] = given if given is not None else fallback if fallback is not None else defaults.get(name)
    top_k = _integer(body, "top_k", None, 0, allow_null=True) if body.get("top_k") is not None else None
    if top_k is None:
        top_k = d.top_k if d.top_k is not None else defaults.get("top_k")  # 0: SamplingConfig's no top-k
    V = served.model.codebook_size
    if top_k is not None and top_k > V:
        raise _bad("top_k", f"top_k={top_k}: allowed 1..{V} (the codebook size), or 0 / null for no top-k")
    try:
        given = {k: values[k] for k in ("guidance_scale", "temperature", "top_p") if values[k] is not None}
        # the model's own guidance schedule (a server-wide setting, as generate's --guidance-schedule)
        schedule = getattr(served.model, "reference_guidance", None) if d.guidance_schedule == "family" else None
        sampling = SamplingConfig(**given, top_k=top_k, guidance_schedule=schedule)
    except ValueError as exc:
        message = str(exc).replace("must be None or", "must be null or")  # JSON's word
        raise _bad(_param_of(str(exc), ("guidance_scale", "temperature", "top_k", "top_p"), "guidance_scale"),
                   message) from None
    from csdgen.acceptance import make_rule

    try:
        # every rule parameter given is checked, whatever the method (a bad addition_c with method csd was
        # answered 200), and used by its method
        addition = make_rule("addition", c=values["addition_c"]) if values["addition_c"] is not None else None
    except ValueError as exc:
        raise _bad("addition_c", f"addition_c: {exc}") from None
    try:
        options = {k: values[k] for k in ("lam", "delta") if values[k] is not None}
        csd = make_rule("csd", **options, entropy_unit=entropy_unit)
    except ValueError as exc:
        raise _bad(_param_of(str(exc), ("lam", "delta", "entropy_unit"), "lam"), str(exc)) from None
    rule: Any = csd if method == "csd" else addition if method == "addition" else method
    given_radius = _integer(body, "gsd_radius", None, 0, allow_null=True)
    gsd_radius = given_radius if given_radius is not None else d.gsd_radius
    if gsd_radius is not None and gsd_radius > V - 1:  # GSD's candidates grow with it; V - 1 spans every rank
        raise _bad("gsd_radius", f"gsd_radius={gsd_radius}: allowed an integer 0..{V - 1} (the codebook has V={V} tokens)")
    given_delta = _number(body, "lantern_delta", None)
    lantern_delta = given_delta if given_delta is not None else d.lantern_delta
    if lantern_delta is not None and not 0.0 <= lantern_delta <= 1.0:
        raise _bad("lantern_delta", f"lantern_delta={_shown(lantern_delta)}: allowed a number in [0, 1] (LANTERN's added-mass budget)")
    options = {"gsd": {"radius": gsd_radius}, "lantern": {"delta": lantern_delta}}.get(method, {})
    if any(v is not None for v in options.values()):
        from csdgen.models.base import optional_codebook

        codebook = optional_codebook(served.model)  # None: resolve_arguments answers that the method needs one
        if codebook is not None:
            rule = make_rule(method, codebook=codebook, **options)
    try:
        rule_obj, window, draft_init, sampling, settings = resolve_arguments(served.model, rule, window, sampling,
                                                                             draft_init, refresh, seed)
    except ValueError as exc:
        param = _param_of(str(exc), ("window", "draft_init", "refresh", "top_k"), "method")
        message = str(exc)
        if param == "method" and "allowed" not in message:
            from csdgen.models.base import optional_codebook

            usable = [m for m in METHODS if m not in ("gsd", "lantern")] if optional_codebook(served.model) is None \
                else list(METHODS)
            message = f"method={_shown(method)}: {message}; allowed: {', '.join(usable)}"
        raise _bad(param, message) from None
    refresh = settings["refresh"]
    condition, input_tokens = served.condition(prompt, sampling.guided)
    label = {}
    names = getattr(served.model, "class_names", None) if served.classes else None
    if names:  # which class "100" or "Red Apple" decoded to (answered back: revised_prompt, csdgen.class)
        label = {"class": names[condition], "class_index": int(condition)}
    key = (settings["method"], repr(rule_obj), window, draft_init, refresh, sampling.guidance_scale, sampling.temperature,
           sampling.top_k, sampling.top_p, sampling.guidance_schedule)
    batch_kwargs = {"method": rule_obj, "window": window, "sampling": sampling, "draft_init": draft_init,
                    "refresh": refresh}
    return ImageRequest(prompt=prompt, condition=condition, n=n, seed=seed, key=key, batch_kwargs=batch_kwargs,
                        settings=settings, stream=stream, partial_images=partial_images,
                        partial_every=partial_every if partial_every is not None else
                        (None if partial_images is not None else d.partial_every),
                        return_tokens=return_tokens, input_tokens=input_tokens,
                        notes=unused_fields(body, settings["method"]), label=label)
