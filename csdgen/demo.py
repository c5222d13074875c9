"""``csdgen demo``: a local web page to watch AR, SJD, CSD, ... decode the same image side by side.

The page (Gradio) takes a class of the built-in model, or a prompt with ``--model``, the
methods to compare, the window, CSD's lambda and delta, the guidance scale and the seed. It
runs the methods one after another on the same seed and shows, per method, while it decodes:

* the image filling in (the image decoded from the committed tokens and the pending drafts,
  pending token cells veiled);
* the acceptance map: how each committed token was decided (:class:`csdgen.Decision`, the
  colours of :data:`csdgen.evaluation.maps.COLOURS`: green accepted draft, orange accepted
  only through the relaxation, red resampled after a rejection, blue plain or bonus sample);
* the entropy map: the target entropy each token was decided under, black 0 to white
  ``ln V`` nats (as in the acceptance maps ``csdgen generate`` writes);

and at the end one statistics row per method (forwards, step compression, mean accepted
length, decoding wall time, tokens per decision), downloadable as CSV.

The live view is drawn by ``generate``'s ``callback`` (after every forward), in the decoding
thread; the time spent drawing is subtracted from the reported wall time. The callback sees
committed lengths, tokens, and the decisions and entropies so far (:class:`~csdgen.engine.results.StepInfo`
``decisions``, ``entropy``), so both maps fill in token by token as the image does.

Offline by construction: Gradio's analytics are off, no share link, the page's fonts are
served by the local server, and the server binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import html
import inspect
import math
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from PIL import Image

import csdgen
from csdgen.decisions import Decision
from csdgen.engine import StepInfo
from csdgen.evaluation.compare import method_presets, to_csv
from csdgen.evaluation.maps import COLOURS, save_png, to_uint8
from csdgen.models.defaults import FAMILY_DEFAULTS, FamilyDefaults
from csdgen.sampling import MAX_SEED, SamplingConfig, check_seed

__all__ = ["free_port", "METHOD_LABELS", "DemoSettings", "Frame", "DemoCancelled", "window_auto_supported", "parse_inputs",
           "token_maps", "watch", "build_app", "load_demo_model", "serve"]

#: methods the page offers (keys of :func:`csdgen.evaluation.compare.method_presets`) and their labels
METHOD_LABELS = {
    "ar": "AR", "sjd": "SJD", "sjd-coupled": "coupled SJD", "jacobi": "Jacobi", "addition": "Addition",
    "gsd": "GSD", "lantern": "LANTERN", "csd": "CSD", "csd-coupled": "coupled CSD",
}
DEFAULT_METHODS = ["ar", "csd"]
PENDING = (245, 245, 245)  #: colour of token cells not committed yet
COMMITTED = (150, 150, 150)  #: committed token whose decision the live view does not know yet
_DISPLAY = 256  #: images narrower than this are upscaled (nearest neighbour) to about this width
#: seconds Ctrl-C waits for the page server to close before the command ends anyway
CLOSE_SECONDS = 5.0


class DemoCancelled(Exception):
    """Raised inside ``generate``'s callback to stop a run the page cancelled."""


@dataclass
class DemoSettings:
    """One validated request of the page."""

    condition: Any  #: class id (built-in model) or prompt string
    label: str  #: the prompt as typed, or the class's name (``random``: the class drawn)
    methods: list[str]
    window: int | str
    lam: float
    delta: float
    guidance_scale: float
    seed: int


@dataclass
class Frame:
    """What the page shows for one method at one moment: three ``[H, W, 3]`` uint8 arrays and a line."""

    image: np.ndarray
    acceptance: np.ndarray
    entropy: np.ndarray
    committed: int
    forwards: int


def window_auto_supported() -> bool:
    """Whether this csdgen's :func:`csdgen.generate` takes ``window="auto"`` (the engine's own window choice)."""
    parameter = inspect.signature(csdgen.generate).parameters["window"]
    return parameter.default in (None, "auto") or "auto" in str(parameter.annotation) or "str" in str(parameter.annotation)


def _number(name: str, value: Any, allowed: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}: must be a number; allowed: {allowed}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name}={value!r}: must be a finite number; allowed: {allowed}")
    return number


def parse_inputs(model, condition: Any, methods: list[str] | None, window: Any, lam: Any, delta: Any,
                 guidance_scale: Any, seed: Any) -> DemoSettings:
    """Check the page's inputs; every error is one line naming the bad value and what is allowed.

    Args:
        model: the page's model; a model with ``class_ids`` takes a class name (any case and spacing, a
            short name), an index or ``random`` (a class drawn from the seed), any other a prompt.
        window: an integer >= 1 (text or number), or ``"auto"`` where :func:`window_auto_supported`.

    Raises:
        ValueError: empty condition, unknown class (with close matches), no or unknown methods, bad
            window, lambda, delta, guidance scale or seed.
    """
    text = str(condition if condition is not None else "").strip()
    if not text:
        raise ValueError("the class or prompt is empty; " + _condition_help(model))
    if methods is not None and not isinstance(methods, (list, tuple)):
        raise ValueError(f"methods={_clip(methods)}: allowed a list of method names ({', '.join(METHOD_LABELS)})")
    methods = list(methods or [])
    if not methods:
        raise ValueError(f"no method chosen; allowed: {', '.join(METHOD_LABELS)}")
    unknown = [m for m in methods if not isinstance(m, str) or m not in METHOD_LABELS]
    if unknown:
        raise ValueError(f"unknown methods {_clip(unknown)}; allowed: {', '.join(METHOD_LABELS)}")
    if ("gsd" in methods or "lantern" in methods) and model.codebook_embeddings() is None:
        raise ValueError("GSD and LANTERN need the model's codebook, which this model does not expose; choose other methods")
    window_text = str(window).strip().lower()
    if window_text == "auto":
        if not window_auto_supported():
            raise ValueError("window='auto': this csdgen's engine has no automatic window; allowed: an integer >= 1")
        parsed_window: int | str = "auto"
    else:
        try:
            parsed_window = int(float(window_text)) if float(window_text).is_integer() else -1
        except ValueError:
            parsed_window = -1
        if parsed_window < 1:
            raise ValueError(f"window={window!r}: allowed: an integer >= 1 (1 = AR)"
                             + (" or auto" if window_auto_supported() else ""))
    lam_value = _number("lambda", lam, "a number >= 0")
    delta_value = _number("delta", delta, "a number in [0, 1]")
    guidance = _number("guidance scale", guidance_scale, "a number >= 0 (0 = no guidance)")
    seed_value = _seed(seed)
    method_presets(lam_value, delta_value)  # CSD checks lambda and delta (one-line ValueError)
    SamplingConfig(guidance_scale=guidance)  # checks the guidance scale
    resolved: Any = text
    if getattr(model, "classes", None) is not None:
        resolved = model.classes.assign([text], 1, seed=seed_value)[0]
        text = model.class_names[resolved]
    elif hasattr(model, "class_ids"):
        resolved = model.class_ids([text])[0]
    return DemoSettings(resolved, text, methods, parsed_window, lam_value, delta_value, guidance, seed_value)


def _seed(value: Any) -> int:
    """The page's seed as an exact integer in ``0 .. MAX_SEED``: the text field's ASCII digits, as
    ``--seed`` reads them (no exponent, sign or fraction); from an API client also a float where it
    is exact (an integral value below 2**53)."""
    allowed = f"allowed: an integer in 0..{MAX_SEED}"
    if isinstance(value, str):
        text = value.strip()
        if not (text.isascii() and text.isdigit()):
            raise ValueError(f"seed={_clip(value)}: {allowed}")
        value = int(text)
    elif isinstance(value, float):
        number = _number("seed", value, allowed)
        if not number.is_integer() or abs(number) >= 2**53:
            raise ValueError(f"seed={_clip(value)}: {allowed}")
        value = int(number)
    try:
        return check_seed(value)
    except ValueError:
        raise ValueError(f"seed={_clip(value)}: {allowed}") from None


def _clip(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (a client can send anything)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _condition_help(model) -> str:
    names = getattr(model, "class_names", None)
    if hasattr(model, "class_ids"):
        if names:
            return f"allowed: one of the {len(names)} class names (e.g. {names[0]!r}), an index 0..{len(names) - 1} or random"
        return f"allowed: a class index 0..{model.num_classes - 1}"
    return "allowed: a text prompt"


def _class_hint(names: list[str]) -> str:
    """The class box's help line: how many classes, examples, what else it takes (not all 1,911 names)."""
    examples = [n for n in ("red apple", "dog face", "rocket", "grinning face") if n in names] or names[:4]
    shown = ", ".join(examples)
    return (f"one of {len(names):,} class names in any case (e.g. {shown}), a short name, an index or random; "
            f"an unknown name gets close matches. All of them: csdgen generate --list-classes")


def _upscale(grid_rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """Token grid ``[rows, cols, C]`` -> ``[height, width, C]`` by nearest neighbour."""
    rows, cols = grid_rgb.shape[:2]
    row_of = np.arange(height) * rows // height
    col_of = np.arange(width) * cols // width
    return grid_rgb[row_of[:, None], col_of[None, :]]


def token_maps(decisions: torch.Tensor | None, entropy: torch.Tensor | None, committed: int, grid: tuple[int, int],
               vocab_size: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The acceptance map and the entropy map of one image, its first ``committed`` tokens decided.

    Args:
        decisions: ``[N]`` int :class:`~csdgen.Decision` codes (raster order), or None when not known
            yet (committed tokens drawn grey).
        entropy: ``[N]`` float, nats, or None (committed tokens drawn pending).
        committed: number of committed tokens (a raster prefix).
        grid: ``(rows, cols)``, ``rows * cols == N``.
        vocab_size: V; the entropy's grey level is ``H / ln V`` (black 0, white ``ln V`` nats).
        height, width: output size in pixels.

    Returns:
        Two ``[height, width, 3]`` uint8 arrays; token cells not committed are :data:`PENDING`.
    """
    rows, cols = grid
    done = (np.arange(rows * cols) < committed).reshape(rows, cols)
    acceptance = np.empty((rows, cols, 3), dtype=np.uint8)
    acceptance[:] = PENDING
    if decisions is None:
        acceptance[done] = COMMITTED
    else:
        codes = decisions.reshape(rows, cols).cpu().numpy()
        for decision, colour in COLOURS.items():
            acceptance[done & (codes == int(decision))] = colour
    entropy_rgb = np.empty((rows, cols, 3), dtype=np.uint8)
    entropy_rgb[:] = PENDING
    if entropy is not None:
        grey = (entropy.float().reshape(rows, cols).cpu() / math.log(vocab_size)).clamp(0, 1).numpy()
        entropy_rgb[done] = (np.round(grey * 255).astype(np.uint8)[..., None])[done]
    return _upscale(acceptance, height, width), _upscale(entropy_rgb, height, width)


#: the last finished image decoded: [model, tokens [N] int64 CPU, image] (a slow decoder runs once per image)
_LAST_FULL: list = [None, None, None]


def _partial_image(model, tokens: torch.Tensor, committed: int) -> np.ndarray:
    """``[H, W, 3]`` uint8: the image decoded from ``tokens [N]`` (committed + drafts), pending cells veiled.

    A model whose decoder is too slow to run at every frame (``live_preview = False``: GLM-Image's
    DiT) shows a blank canvas of its ``image_size`` until the last token is committed; the maps stay live.
    """
    rows, cols = model.grid
    if committed < rows * cols and not getattr(model, "live_preview", True):
        image = np.full((*model.image_size, 3), PENDING, dtype=np.uint8)
    elif (committed >= rows * cols and _LAST_FULL[0] is model and _LAST_FULL[1] is not None
          and torch.equal(_LAST_FULL[1], tokens.cpu())):
        image = _LAST_FULL[2]  # the finished image again (the last step's frame and the end frame): decode once
    else:
        image = to_uint8(model.decode_images(tokens[None].to(model.device)))[0]
        if committed >= rows * cols:
            _LAST_FULL[:] = [model, tokens.cpu().clone(), image]
    scale = max(1, _DISPLAY // image.shape[1])
    image = np.repeat(np.repeat(image, scale, axis=0), scale, axis=1)
    if committed < rows * cols:
        pending = _upscale((np.arange(rows * cols) >= committed).reshape(rows, cols)[..., None], *image.shape[:2])
        veiled = (0.3 * image + 0.7 * np.array(PENDING)).astype(np.uint8)
        image = np.where(pending, veiled, image)
    return image


def _frame(model, tokens: torch.Tensor, committed: int, forwards: int, decisions, entropy) -> Frame:
    image = _partial_image(model, tokens, committed)
    acceptance, entropy_map = token_maps(decisions, entropy, committed, model.grid, model.codebook_size, *image.shape[:2])
    return Frame(image, acceptance, entropy_map, committed, forwards)


def _run_one(model, settings: DemoSettings, key: str, preset: dict, sampling: SamplingConfig, cancel: threading.Event,
             emit: Callable[[tuple], None], min_interval: float) -> dict:
    """Run one method on one image, emitting ``("frame", key, Frame)`` while it decodes; returns its statistics row."""
    spent = {"preview": 0.0, "last": -math.inf}

    def callback(info: StepInfo) -> None:
        began = time.perf_counter()
        if cancel.is_set():
            raise DemoCancelled(key)
        committed = int(info.committed[0])
        if began - spent["last"] >= min_interval:
            emit(("frame", key, _frame(model, info.tokens[0], committed, info.step, info.decisions[0], info.entropy[0])))
            spent["last"] = time.perf_counter()
        spent["preview"] += time.perf_counter() - began

    options = dict(preset)
    if key == "ar":
        options["window"] = 1
    else:
        options.setdefault("window", settings.window)
    result = csdgen.generate(model, [settings.condition], seed=settings.seed, sampling=sampling, callback=callback, **options)
    stats = result.images[0]
    emit(("frame", key, _frame(model, result.tokens[0].cpu(), stats.num_tokens, stats.steps, stats.decisions, stats.entropy)))
    summary = stats.summary()
    return {
        "method": key,
        "forwards": stats.steps,
        "step_compression": stats.step_compression,
        "mean_accepted_length": stats.mean_accepted_length,
        "wall_s": max(0.0, result.seconds - spent["preview"]),
        "tokens": stats.num_tokens,
        **{k: v for k, v in summary.items() if k.startswith("tokens_")},
        "mean_entropy_nats": summary["mean_entropy_nats"],
        "window": result.settings.get("window"),
        "mean_width": sum(widths) / len(widths) if (widths := getattr(result, "widths", None)) else "",
        "lam": settings.lam if key.startswith("csd") else "",
        "delta": settings.delta if key.startswith("csd") else "",
        "guidance_scale": settings.guidance_scale,
        "seed": settings.seed,
        "condition": settings.label,
    }


def watch(model, settings: DemoSettings, sampling: SamplingConfig, cancel: threading.Event,
          min_interval: float = 0.15) -> Iterator[tuple]:
    """Run the chosen methods one after another in a worker thread; yield what the page shows.

    Yields ``("frame", method, Frame)`` while a method decodes (at most one per ``min_interval``
    seconds, plus its final frame), ``("done", method, row)`` when it ends, ``("error", message)``
    for an error a user can fix, and finally ``("end", rows)``. Setting ``cancel`` stops the
    running method at its next forward (``("cancelled", method)`` is yielded). Closing the iterator
    sets ``cancel``.
    """
    events: queue.Queue = queue.Queue()
    presets = method_presets(settings.lam, settings.delta, codebook=_codebook(model, settings.methods))

    def work() -> None:
        rows = []
        for key in settings.methods:
            try:
                rows.append(_run_one(model, settings, key, presets[key], sampling, cancel, events.put, min_interval))
            except DemoCancelled:
                events.put(("cancelled", key))
                return
            except (ValueError, NotImplementedError) as exc:
                events.put(("error", f"{METHOD_LABELS[key]}: {exc}"))
                return
            except Exception as exc:  # noqa: BLE001 -- shown on the page as one line, not a traceback
                events.put(("error", f"{METHOD_LABELS[key]} failed: {type(exc).__name__}: {exc}"))
                return
            events.put(("done", key, rows[-1]))
        events.put(("end", rows))

    thread = threading.Thread(target=work, name="csdgen-demo", daemon=True)
    thread.start()
    try:
        while True:
            event = events.get()
            yield event
            if event[0] in ("end", "error", "cancelled"):
                break
    finally:
        cancel.set()
        thread.join(timeout=60)


def _codebook(model, methods: list[str]):
    return model.codebook_embeddings() if {"gsd", "lantern"} & set(methods) else None


def _sampling(defaults: FamilyDefaults, guidance_scale: float, vocab_size: int, schedule=None) -> SamplingConfig:
    """The page's guidance scale with the family's temperature, top-p, top-k (dropped when >= V, as generate does)
    and guidance schedule (``model.reference_guidance``)."""
    top_k = defaults.top_k if defaults.top_k is not None and defaults.top_k < vocab_size else None
    return SamplingConfig(guidance_scale=guidance_scale, temperature=defaults.temperature, top_k=top_k, top_p=defaults.top_p,
                          guidance_schedule=schedule)


def _legend() -> str:
    def chip(colour, text):
        return (f'<span style="display:inline-block;width:0.9em;height:0.9em;margin:0 0.3em 0 0.9em;'
                f'vertical-align:middle;background:rgb{tuple(colour)}"></span>{text}')

    names = {Decision.ACCEPTED: "accepted draft", Decision.RELAXED: "accepted through the relaxation",
             Decision.RESAMPLED: "resampled after a rejection", Decision.SAMPLED: "plain or bonus sample"}
    chips = "".join(chip(COLOURS[d], names[d]) for d in (Decision.ACCEPTED, Decision.RELAXED, Decision.RESAMPLED,
                                                          Decision.SAMPLED))
    return (f"<div>Acceptance map: {chips}{chip(PENDING, 'not committed yet')}. Entropy map: black 0, white ln V nats.</div>")


def _progress_html(text: str, done: int = 0, total: int = 1) -> str:
    return f'<div id="progress-line"><progress value="{done}" max="{max(total, 1)}"></progress> {html.escape(text)}</div>'


class _RunFiles:
    """One run's PNG and CSV files, written atomically under unique names, handed to Gradio as paths.

    Gradio caches a numpy image under the hash of its bytes and rewrites that file in place
    each time the same picture is sent again (e.g. two identical empty maps), so the browser
    can read a half-written file (seen as ``ERR_CONTENT_LENGTH_MISMATCH``); a file path is
    instead copied into the cache once, atomically.
    """

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="csdgen-demo-"))
        self.count = 0

    def save(self, array: np.ndarray) -> str:
        self.count += 1
        path = self.folder / f"{self.count:05d}.png"
        save_png(Image.fromarray(array), path)
        return str(path)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _raw_payload(component) -> None:
    """Hand the component's value to :func:`parse_inputs` as the client sent it.

    Gradio's own checks (a method not among the choices, a seed that is not a number) raise
    inside the server and log a full traceback per request; :func:`parse_inputs` checks the
    same values and answers with one line on the page and one line in the log instead.
    """
    component.preprocess = lambda payload: payload


def _log(message: str) -> None:
    """One line on the server's stderr (``csdgen demo: ...``)."""
    import sys

    print(f"csdgen demo: {message}", file=sys.stderr, flush=True)


def _message_html(text: str) -> str:
    """A bad value or a failed run, one line in the progress area."""
    return f'<div id="message" style="color:#b00020;font-weight:600">{html.escape(text)}</div>'


def build_app(model, *, model_name: str = "built-in model", defaults: FamilyDefaults | None = None):
    """The Gradio page for ``model`` (not launched).

    Args:
        model: an :class:`~csdgen.models.ImageTokenModel` with ``decode_images``; with ``class_ids``
            the page takes a class, else a prompt.
        model_name: shown in the page's title line.
        defaults: initial guidance, window, lambda, delta and the temperature/top-k/top-p used
            (default: the model's ``defaults``, else the CSD reference values).

    Returns:
        A ``gradio.Blocks``.
    """
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    import gradio as gr

    defaults = defaults or getattr(model, "defaults", None) or FAMILY_DEFAULTS["builtin"]
    takes_class = hasattr(model, "class_ids")
    names = getattr(model, "class_names", None) or []
    from csdgen.models.base import optional_codebook

    has_codebook = optional_codebook(model) is not None
    offered = [k for k in METHOD_LABELS if k not in ("gsd", "lantern") or has_codebook]
    auto = window_auto_supported()
    rows, cols = model.grid
    sampling_line = (f"temperature {defaults.temperature}, top-k {defaults.top_k or 'none'}, "
                     f"top-p {defaults.top_p or 'none'}")

    with gr.Blocks(title="csdgen demo", analytics_enabled=False) as app:
        gr.Markdown(f"## csdgen: watch speculative Jacobi decoding\n{model_name}: {rows} x {cols} = {rows * cols} image "
                    f"tokens, codebook of {model.codebook_size}, {sampling_line}. The methods run one after another "
                    "on the same seed; forwards count every target forward, the prefill included.")
        with gr.Row():
            first = next((n for n in ("red apple",) if n in names), names[0] if names else "0")
            condition = gr.Textbox(label="class" if takes_class else "prompt", elem_id="condition", scale=2,
                                   value=first if takes_class else "", info=_class_hint(names) if names else None)
            methods = gr.CheckboxGroup(choices=[(METHOD_LABELS[k], k) for k in offered], value=DEFAULT_METHODS,
                                       label="methods", elem_id="methods", scale=3)
        with gr.Row():
            window = gr.Textbox(label="window", value="auto" if auto else str(defaults.window), elem_id="window",
                                info="an integer >= 1" + (" or auto (widths from measured forward times: the same seed "
                                                          "then gives the same images in distribution, not bit for bit)"
                                                          if auto else ""))
            lam = gr.Number(label="lambda (CSD)", value=defaults.lam, elem_id="lam")
            delta = gr.Number(label="delta (CSD)", value=defaults.delta, elem_id="delta")
            guidance = gr.Number(label="guidance scale", value=defaults.guidance_scale, elem_id="guidance")
            # a text field: a browser's number field holds a float64, so a seed above 2**53 was
            # rounded before it was sent (9007199254740993 ran as ...992) and 1e3 passed as 1000
            seed = gr.Textbox(label="seed", value="0", elem_id="seed", info=f"an integer in 0..{MAX_SEED} (2**63 - 1)")
        with gr.Row():
            run = gr.Button("Run", variant="primary", elem_id="run")
            stop = gr.Button("Cancel", elem_id="cancel")
        progress = gr.HTML(_progress_html("idle"), elem_id="progress")
        gr.HTML(_legend())
        panels: dict[str, tuple] = {}
        with gr.Row(equal_height=False):  # one column per method; two fit side by side, more wrap
            for key in offered:
                label = METHOD_LABELS[key]
                with gr.Column(visible=key in DEFAULT_METHODS, min_width=480, elem_id=f"panel-{key}") as column:
                    title = gr.Markdown(f"### {label}", elem_id=f"title-{key}")
                    with gr.Row():
                        image, acceptance, entropy_map = (
                            gr.Image(label=f"{label}: {what}", format="png", interactive=False, min_width=140,
                                     elem_id=f"{name}-{key}", buttons=["download"])
                            for what, name in (("image", "image"), ("acceptance map", "acceptance"),
                                               ("entropy map", "entropy")))
                panels[key] = (column, title, image, acceptance, entropy_map)
        stats = gr.Markdown(elem_id="stats")
        csv_file = gr.File(label="statistics (CSV)", elem_id="csv", interactive=False)

        outputs = [progress, stats, csv_file] + [c for key in offered for c in panels[key]]
        for component in (methods, lam, delta, guidance, seed):
            _raw_payload(component)

        async def on_run(condition_v, methods_v, window_v, lam_v, delta_v, guidance_v, seed_v):
            try:
                settings = parse_inputs(model, condition_v, methods_v, window_v, lam_v, delta_v, guidance_v, seed_v)
            except ValueError as exc:  # shown on the page, in the progress line; earlier results stay
                _log(f"refused a request: {exc}")
                yield {progress: _message_html(str(exc))}
                return
            sampling = _sampling(defaults, settings.guidance_scale, model.codebook_size,
                                 getattr(model, "reference_guidance", None))
            total = len(settings.methods) * model.num_image_tokens
            finished = 0
            first = {progress: _progress_html("starting", 0, total), stats: "", csv_file: None}
            for key in offered:
                column, title, image, acceptance, entropy_map = panels[key]
                first.update({column: gr.update(visible=key in settings.methods), title: f"### {METHOD_LABELS[key]}",
                              image: None, acceptance: None, entropy_map: None})
            yield first
            cancel = threading.Event()
            pngs = _RunFiles()
            iterator = watch(model, settings, sampling, cancel, min_interval=0.3)  # ~3 previews a second
            try:
                while True:
                    event = await asyncio.to_thread(next, iterator, ("end", None))
                    kind = event[0]
                    if kind == "frame":
                        _, key, frame = event
                        _, title, image, acceptance, entropy_map = panels[key]
                        done = finished + frame.committed
                        yield {image: pngs.save(frame.image), acceptance: pngs.save(frame.acceptance),
                               entropy_map: pngs.save(frame.entropy),
                               title: f"### {METHOD_LABELS[key]}\n{frame.committed}/{model.num_image_tokens} tokens, "
                                      f"{frame.forwards} forwards",
                               progress: _progress_html(f"{METHOD_LABELS[key]}: {frame.committed}/"
                                                        f"{model.num_image_tokens} tokens, {frame.forwards} forwards",
                                                        done, total)}
                    elif kind == "done":
                        _, key, row = event
                        finished += model.num_image_tokens
                        yield {panels[key][1]: f"### {METHOD_LABELS[key]}\n{row['forwards']} forwards, step compression "
                                               f"{row['step_compression']:.2f}x, {row['wall_s']:.2f} s decoding"}
                    elif kind == "error":
                        yield {progress: _message_html(event[1])}
                        return
                    elif kind == "cancelled":
                        yield {progress: _progress_html(f"cancelled during {METHOD_LABELS[event[1]]}", finished, total)}
                        return
                    else:
                        rows_ = event[1] or []
                        if not rows_:
                            return
                        path = pngs.folder / "csdgen_demo_statistics.csv"
                        path.write_text(to_csv(rows_))
                        what = f"{settings.label}, " if takes_class else ""
                        count = f"{len(rows_)} method{'' if len(rows_) == 1 else 's'}"
                        yield {progress: _progress_html(f"done: {what}{count}, seed {settings.seed}", total, total),
                               stats: _stats_markdown(rows_), csv_file: str(path)}
                        return
            finally:
                cancel.set()  # the worker stops at its next forward
                try:
                    iterator.close()
                except ValueError:  # still running in the other thread: it ends by itself once cancelled
                    pass
                pngs.remove()  # Gradio has copied every file it was given into its cache by now

        inputs = [condition, methods, window, lam, delta, guidance, seed]
        event = run.click(on_run, inputs=inputs, outputs=outputs, show_progress="minimal", concurrency_limit=1)
        stop.click(lambda: _progress_html("cancelled"), outputs=[progress], cancels=[event])
    return app


#: the page's statistics table: CSV column -> (header, format); the CSV has every column at full precision
_SHOWN = {"method": ("method", "{}"), "forwards": ("forwards", "{}"), "step_compression": ("step compression", "{:.2f}x"),
          "mean_accepted_length": ("mean accepted length", "{:.2f}"), "wall_s": ("wall time (s)", "{:.2f}"),
          "tokens_accepted": ("accepted", "{}"), "tokens_relaxed": ("relaxed", "{}"), "tokens_resampled": ("resampled", "{}"),
          "tokens_sampled": ("sampled", "{}"), "mean_entropy_nats": ("entropy (nats)", "{:.3f}")}


def _stats_markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(h for h, _ in _SHOWN.values()) + " |", "|" + "---|" * len(_SHOWN)]
    lines += ["| " + " | ".join(f.format(r[k]) for k, (_, f) in _SHOWN.items()) + " |" for r in rows]
    return "\n".join(lines) + "\n"


_CSS = "#stats th { word-break: keep-all; overflow-wrap: normal; } #stats td { white-space: nowrap; }"


def load_demo_model(model_path: str | None = None, weights: str | None = None, *, image_size: int | None = None,
                    vqgan: str | None = None, dtype: str | None = None):
    """The page's model: the built-in model (offline, default) or a checkpoint (``--model``, never downloaded).

    ``image_size``, ``vqgan`` and ``dtype`` go to :func:`csdgen.models.auto.load_model` (``--image-size``,
    ``--vqgan``, ``--dtype``; None: the family's default on the device); the built-in model is float32.

    Returns:
        ``(model, name, defaults)``.

    Raises:
        ValueError / FileNotFoundError: as :func:`csdgen.models.auto.load_model` (one line).
    """
    if model_path is None:
        from csdgen.models.builtin import load_builtin_model

        return load_builtin_model(weights), "built-in model", FAMILY_DEFAULTS["builtin"]
    from csdgen.models.auto import default_device, family_of, load_model, require_decoder, resolve_checkpoint

    folder = resolve_checkpoint(model_path)
    family = family_of(folder, None, model_path)
    model = load_model(model_path, device=default_device(), dtype=dtype, batch_size=1, image_size=image_size, vqgan=vqgan)
    require_decoder(model, model_path, folder)
    return model, f"{family} ({model_path})", getattr(model, "defaults", None) or FAMILY_DEFAULTS[family]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, chosen by the system (what ``--port 0`` asks for: Gradio itself
    would listen on port 0 and report 0 as its address).

    Raises:
        ValueError: ``host`` is not an address of this machine (one line, as ``csdgen serve`` says it).
    """
    from csdgen.serve.app import bind_socket

    sock = bind_socket(host, 0)
    try:
        return sock.getsockname()[1]
    finally:
        sock.close()


def serve(model_path: str | None = None, host: str = "127.0.0.1", port: int | None = None, *, weights: str | None = None,
          block: bool = True, image_size: int | None = None, vqgan: str | None = None, dtype: str | None = None):
    """Load the model, build the page and serve it on ``host:port`` (no share link, analytics off).

    Args:
        port: TCP port; None = Gradio's first free port from 7860; 0 = any free port (:func:`free_port`).
        block: wait until interrupted (the command) or return at once (tests).
        image_size, vqgan, dtype: for a checkpoint, as :func:`load_demo_model` takes them.

    Returns:
        The launched ``gradio.Blocks`` (when ``block`` is False).
    """
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    if port == 0:
        port = free_port(host)
    model, name, defaults = load_demo_model(model_path, weights, image_size=image_size, vqgan=vqgan, dtype=dtype)
    app = build_app(model, model_name=name, defaults=defaults)
    app.queue(default_concurrency_limit=1)
    # quiet: Gradio's own banner suggests share=True, which this page never uses
    app.launch(server_name=host, server_port=port, share=False, inbrowser=False, prevent_thread_lock=True,
               show_error=False, ssr_mode=False, footer_links=[], quiet=True, css=_CSS)
    print(f"csdgen demo: serving {name} on http://{host}:{app.server_port}/ (Ctrl-C stops it)", flush=True)
    if block:
        # not app.block_thread(): it catches Ctrl-C itself, prints its own line and returns, so the
        # command ended with status 0 instead of "csdgen demo: stopped" and 130 (csdgen.cli.main)
        try:
            while True:
                time.sleep(0.5)
        except KeyboardInterrupt:
            # Gradio's close waits for its server thread to finish; bounded, so Ctrl-C always ends
            # the command (on a busy machine it waited past 30 s), and the process exit ends the rest
            closer = threading.Thread(target=app.close, daemon=True)
            closer.start()
            closer.join(CLOSE_SECONDS)
            if closer.is_alive():  # the server's threads would keep the interpreter from exiting
                print("csdgen demo: stopped", file=sys.stderr, flush=True)
                sys.stdout.flush()
                os._exit(130)
            raise
    return app
