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

The page's fields are read by :mod:`csdgen.demo_inputs`, the methods decoded live by
:mod:`csdgen.demo_watch` (both re-exported here). The live view is drawn by ``generate``'s
``callback`` (after every forward), in the decoding thread; the time spent drawing is subtracted from the reported wall time. The callback sees
committed lengths, tokens, and the decisions and entropies so far (:class:`csdgen.engine.StepInfo`
``decisions``, ``entropy``), so both maps fill in token by token as the image does.

Offline by construction: Gradio's analytics are off, no share link, the page's fonts are
served by the local server, and the server binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import atexit
import html
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from csdgen.decisions import Decision
from csdgen.evaluation.compare import to_csv
from csdgen.evaluation.maps import COLOURS, save_png
from csdgen.interrupts import restore_ctrl_c
from csdgen.models.defaults import FAMILY_DEFAULTS, FamilyDefaults
from csdgen.sampling import MAX_SEED, SamplingConfig
from csdgen.demo_inputs import (
    DEFAULT_METHODS, METHOD_LABELS, DemoSettings, _class_hint, parse_inputs, window_auto_supported,
)
from csdgen.demo_watch import COMMITTED, ENTROPY_PENDING, PENDING, DemoCancelled, Frame, token_maps, watch

__all__ = ["free_port", "METHOD_LABELS", "DemoSettings", "Frame", "DemoCancelled", "window_auto_supported", "parse_inputs",
           "token_maps", "watch", "build_app", "load_demo_model", "serve", "PENDING", "ENTROPY_PENDING", "COMMITTED"]

#: seconds Ctrl-C waits for the page server to close before the command ends anyway
CLOSE_SECONDS = 5.0
#: seconds a copy of the page's images stays in Gradio's cache: a run deletes older ones as it starts
CACHE_AGE_SECONDS = 600


def _sampling(defaults: FamilyDefaults, guidance_scale: float, vocab_size: int, schedule=None) -> SamplingConfig:
    """The page's guidance scale with the family's temperature, top-p, top-k (none when it is V: every token is kept;
    :func:`load_demo_model` refuses one above V, as generate does) and guidance schedule (``model.reference_guidance``)."""
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
    return (f"<div>Acceptance map: {chips}{chip(PENDING, 'not committed yet')}. Entropy map: black 0, white ln V nats{chip(ENTROPY_PENDING, 'not committed yet')}.</div>")


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


def own_cache() -> Path:
    """Point Gradio's cache (``GRADIO_TEMP_DIR``, read as the page is built) at a new folder of this
    process's, inside the one it named before (default: the system's temporary folder), and return it.

    Gradio copies every image the page shows into its cache, about 3 previews a second per panel,
    and deletes only some of them when it closes; its own folder is shared by every Gradio app on the
    machine. A folder of the demo's own can be removed whole (:func:`remove_cache`)."""
    base = os.environ.get("GRADIO_TEMP_DIR") or tempfile.gettempdir()
    Path(base).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="csdgen-demo-cache-", dir=base))
    os.environ["GRADIO_TEMP_DIR"] = str(folder)
    return folder


def sweep_cache(age_s: float) -> int:
    """Delete the files of the demo's cache folder (:func:`own_cache`) last written more than ``age_s``
    seconds ago, and the folders that leaves empty; returns the files deleted. Does nothing where the
    cache is not the demo's own."""
    folder = Path(os.environ.get("GRADIO_TEMP_DIR", ""))
    if not folder.name.startswith("csdgen-demo-cache-") or not folder.is_dir():
        return 0
    cutoff, parents = time.time() - age_s, []  # the folder of each file deleted
    for path in list(folder.rglob("*")):
        try:
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink()
                parents.append(path.parent)
        except FileNotFoundError:  # deleted meanwhile
            pass
    for sub in set(parents) - {folder}:  # a run sweeps as it starts, while no other run writes
        try:
            sub.rmdir()
        except OSError:  # still holds a newer file
            pass
    return len(parents)


def remove_cache(folder: Path) -> None:
    """Remove the demo's cache folder (:func:`own_cache`) and every file in it."""
    shutil.rmtree(folder, ignore_errors=True)


class _Cancels:
    """Each page session's Cancel flag, read by that session's run at every forward.

    Run first registers a fresh flag for its session (:meth:`request`, unless a run of that
    session is going), the run takes it when it leaves the queue (:meth:`start`) and Cancel sets
    it (:meth:`cancel`): a running run stops at its next forward and ends by itself, saying so; a
    queued one ends as soon as it starts. Gradio's own ``cancels=`` killed the run's task instead,
    which raced the previews still on their way (the page went on showing "AR: 14/256 tokens")
    and Gradio's page then and again drew "Error" over every output.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._flags: dict[str, tuple[threading.Event, bool]] = {}  # session -> (flag, running)

    def request(self, session: str) -> None:
        with self._lock:
            if not self._flags.get(session, (None, False))[1]:
                self._flags[session] = (threading.Event(), False)

    def start(self, session: str) -> threading.Event:
        with self._lock:
            flag, running = self._flags.get(session, (None, False))
            if flag is None or running:  # a client that called the run without Run's first step
                flag = threading.Event()
            self._flags[session] = (flag, True)
            return flag

    def end(self, session: str, flag: threading.Event) -> None:
        with self._lock:
            if self._flags.get(session, (None, False))[0] is flag:
                del self._flags[session]

    def cancel(self, session: str) -> None:
        with self._lock:
            entry = self._flags.get(session)
        if entry is not None:
            entry[0].set()


def _session(request) -> str:
    return getattr(request, "session_hash", None) or ""


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
                                     elem_id=f"{name}-{key}", elem_classes=["csdgen-view"], buttons=["download"])
                            for what, name in (("image", "image"), ("acceptance map", "acceptance"),
                                               ("entropy map", "entropy")))
                panels[key] = (column, title, image, acceptance, entropy_map)
        stats = gr.Markdown(elem_id="stats")
        csv_file = gr.File(label="statistics (CSV)", elem_id="csv", interactive=False)

        outputs = [progress, stats, csv_file] + [c for key in offered for c in panels[key]]
        for component in (methods, lam, delta, guidance, seed):
            _raw_payload(component)

        cancels = _Cancels()

        def on_click_run(request=None):
            cancels.request(_session(request))
            # a click while a run goes is ignored (Gradio's trigger mode "once"): the button says so until it ends
            return gr.update(interactive=False, value="Running")

        def on_run_ended():
            return gr.update(interactive=True, value="Run")

        def on_cancel(request=None):
            cancels.cancel(_session(request))

        async def on_run(condition_v, methods_v, window_v, lam_v, delta_v, guidance_v, seed_v, request=None):
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
            cancel = cancels.start(_session(request))
            if cancel.is_set():  # cancelled while it waited in the queue
                cancels.end(_session(request), cancel)
                yield {progress: _progress_html("cancelled before it started", 0, total)}
                return
            yield first
            sweep_cache(CACHE_AGE_SECONDS)
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
                        so_far = (f"{frame.committed}/{model.num_image_tokens} tokens, "
                                  f"{frame.forwards} forward{'' if frame.forwards == 1 else 's'}")
                        yield {image: pngs.save(frame.image), acceptance: pngs.save(frame.acceptance),
                               entropy_map: pngs.save(frame.entropy),
                               title: f"### {METHOD_LABELS[key]}\n{so_far}",
                               progress: _progress_html(f"{METHOD_LABELS[key]}: {so_far}", done, total)}
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
                cancels.end(_session(request), cancel)
                cancel.set()  # the worker stops at its next forward
                try:
                    iterator.close()
                except ValueError:  # still running in the other thread: it ends by itself once cancelled
                    pass
                pngs.remove()  # Gradio has copied every file it was given into its cache by now

        for handler in (on_click_run, on_cancel, on_run):  # Gradio passes the request by this annotation
            handler.__annotations__["request"] = gr.Request
        inputs = [condition, methods, window, lam, delta, guidance, seed]
        run.click(on_click_run, outputs=[run], show_progress="hidden", concurrency_limit=None).then(
            on_run, inputs=inputs, outputs=outputs, show_progress="minimal", concurrency_limit=1).then(
            on_run_ended, outputs=[run], show_progress="hidden", concurrency_limit=None)  # .then: after an error too
        stop.click(on_cancel, show_progress="hidden", concurrency_limit=None)
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


# the views start below their label and download button, which Gradio floats over the picture's top
# corners: there they hid the first tokens of the acceptance map, the first ones decided
_CSS = ("#stats th { word-break: keep-all; overflow-wrap: normal; } #stats td { white-space: nowrap; } "
        ".csdgen-view .image-container { padding-top: 28px; }")

#: the page's font and the weights it declares: Gradio's default theme declares 400 and 600, but the
#: SourceSansPro-SemiBold.woff2 Gradio ships holds only "A" and "B" of the Latin letters, so every
#: semibold heading mixed two fonts ("AR", "LANTERN"); 600 now falls to the bold face
_FONT_WEIGHTS = (400, 700)


def _theme():
    """Gradio's default theme with the page font's faces in :data:`_FONT_WEIGHTS` (served locally)."""
    import gradio as gr

    return gr.themes.Default(font=[gr.themes.LocalFont("Source Sans Pro", weights=_FONT_WEIGHTS), "ui-sans-serif",
                                   "system-ui", "sans-serif"])


def load_demo_model(model_path: str | None = None, weights: str | None = None, *, image_size: int | None = None,
                    vqgan: str | None = None, dtype: str | None = None, layout: str | None = None):
    """The page's model: the built-in model (offline, default) or a checkpoint (``--model``, never downloaded).

    ``image_size``, ``vqgan``, ``layout`` and ``dtype`` go to :func:`csdgen.models.auto.load_model` (``--image-size``,
    ``--vqgan``, ``--layout``, ``--dtype``; None: the family's default on the device, the guessed layout); ``dtype`` to
    :func:`~csdgen.models.builtin.load_builtin_model` for the built-in model (None: float32).

    Returns:
        ``(model, name, defaults)``.

    Raises:
        ValueError / FileNotFoundError: as :func:`csdgen.models.auto.load_model` (one line); the defaults' top-k
            above the model's codebook size (a tiny checkpoint under its family's top-k: the page runs the
            defaults and has no top-k of its own), as ``csdgen generate`` refuses it; a text model on which the
            page's default request cannot start (a default negative prompt too long for it), as ``csdgen serve``
            refuses it.
    """
    if model_path is None:
        from csdgen.models.builtin import load_builtin_model

        model = load_builtin_model(weights, dtype=dtype)
        return model, "built-in model", _fitting_defaults(model, FAMILY_DEFAULTS["builtin"])
    from csdgen.models.auto import check_tokenizer_files, load_model, require_decoder
    from csdgen.models.detect import family_of
    from csdgen.models.dtypes import default_device
    from csdgen.models.sources import resolve_checkpoint

    folder = resolve_checkpoint(model_path)
    family = family_of(folder, layout, model_path)
    check_tokenizer_files(folder, family)  # the page sends text prompts: refused before the weights, naming the folder
    model = load_model(model_path, device=default_device(), dtype=dtype, batch_size=1, image_size=image_size, vqgan=vqgan,
                       layout=layout, need_decoder=True)
    require_decoder(model, model_path, folder)
    defaults = _fitting_defaults(model, getattr(model, "defaults", None) or FAMILY_DEFAULTS[family])
    _check_default_request(model, defaults)
    return model, f"{family} ({model_path})", defaults


def _check_default_request(model, defaults: FamilyDefaults) -> None:
    """Refuse, at start-up, a text model on which no request of the page can run, as ``csdgen serve`` checks its
    request defaults: a short prompt at the defaults' guidance started as a run starts it (tokenised, its length
    checked with the negative prompt's row and the image; no forward).

    Raises:
        ValueError: ``the demo's default request cannot run on this model: <the model's reason>``.
    """
    if hasattr(model, "class_ids"):  # the page takes a class: none is too long
        return
    guided = _sampling(defaults, defaults.guidance_scale, model.codebook_size).guided
    try:
        model.start(["a test"], 1, guided)
    except ValueError as error:
        raise ValueError(f"the demo's default request cannot run on this model: {error}") from None


def _fitting_defaults(model, defaults: FamilyDefaults) -> FamilyDefaults:
    """``defaults``, refused where their top-k exceeds the model's codebook size.

    Raises:
        ValueError: ``top-k 2048 (the model's default; the demo runs the model's sampling defaults and has no
            --top-k): exceeds the codebook size ...``, naming generate's and serve's ``--top-k``.
    """
    from csdgen.engine import check_top_k

    try:
        check_top_k(model, defaults.top_k)
    except ValueError as error:
        reason = str(error).removeprefix(f"top_k={defaults.top_k} ")
        raise ValueError(f"top-k {defaults.top_k} (the model's default; the demo runs the model's sampling defaults "
                         f"and has no --top-k): {reason}; csdgen generate and csdgen serve take --top-k K (0: none) "
                         f"for this checkpoint") from None
    return defaults


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
          block: bool = True, image_size: int | None = None, vqgan: str | None = None, dtype: str | None = None,
          layout: str | None = None, on_loaded: Callable[[], None] | None = None):
    """Load the model, build the page and serve it on ``host:port`` (no share link, analytics off).

    Args:
        port: TCP port; None = Gradio's first free port from 7860; 0 = any free port (:func:`free_port`).
        block: wait until interrupted (the command) or return at once (tests).
        image_size, vqgan, dtype, layout: for a checkpoint, as :func:`load_demo_model` takes them.
        on_loaded: called once the model is loaded and checked (the command prints its run line there).

    The page's images are cached in a folder of this process's (:func:`own_cache`: ``GRADIO_TEMP_DIR`` is
    set to it), removed when the command stops (Ctrl-C: status 130; SIGTERM: status 143) or, with
    ``block=False``, when the process exits; a run deletes the copies older than
    :data:`CACHE_AGE_SECONDS` as it starts.

    Returns:
        The launched ``gradio.Blocks`` (when ``block`` is False).

    Raises:
        ValueError: ``port`` is taken or ``host`` is not an address of this machine (one line, before
            the model loads, as ``csdgen serve`` says it).
    """
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    if port == 0:
        port = free_port(host)
    elif port is not None:  # a port taken now: one line before the model loads (Gradio says it after)
        from csdgen.serve.app import bind_socket

        bind_socket(host, port).close()
    if block:  # a background job of a script (`csdgen demo &`) ignores SIGINT: Ctrl-C stops it all the same
        restore_ctrl_c()
    from .torch_threads import call_in_thread

    # loaded in a thread that ends with the load: the thread of a run then holds the process's only
    # OpenMP pool (csdgen.torch_threads)
    model, name, defaults = call_in_thread(load_demo_model, model_path, weights, image_size=image_size, vqgan=vqgan,
                                           dtype=dtype, layout=layout)
    if on_loaded is not None:
        on_loaded()
    cache = own_cache()
    try:
        app = build_app(model, model_name=name, defaults=defaults)
        app.queue(default_concurrency_limit=1)
        # quiet: Gradio's own banner suggests share=True, which this page never uses
        app.launch(server_name=host, server_port=port, share=False, inbrowser=False, prevent_thread_lock=True,
                   show_error=False, ssr_mode=False, footer_links=[], quiet=True, css=_CSS, theme=_theme())
    except BaseException:  # Ctrl-C while it starts included
        remove_cache(cache)
        raise
    line = f"csdgen demo: serving {name} on http://{host}:{app.server_port}/ (Ctrl-C stops it)"
    if not block:
        print(line, flush=True)
        atexit.register(remove_cache, cache)
        return app
    # not app.block_thread(): it catches Ctrl-C itself, prints its own line and returns, so the
    # command ended with status 0 instead of "csdgen demo: stopped" and 130 (csdgen.cli.main)
    previous = signal.signal(signal.SIGTERM, _terminate) if threading.current_thread() is threading.main_thread() else None
    try:
        print(line, flush=True)  # inside: a Ctrl-C just after the page answers still closes it
        while True:
            time.sleep(0.5)
    except (KeyboardInterrupt, _Terminated) as stop:
        status = 143 if isinstance(stop, _Terminated) else 130  # as csdgen serve ends on each
        # Gradio's close waits for its server thread to finish; bounded, so Ctrl-C always ends
        # the command (on a busy machine it waited past 30 s), and the process exit ends the rest
        closer = threading.Thread(target=app.close, kwargs={"verbose": False}, daemon=True)  # no unprefixed line
        closer.start()
        closer.join(CLOSE_SECONDS)
        remove_cache(cache)
        if closer.is_alive():  # the server's threads would keep the interpreter from exiting
            if status == 130:
                print("csdgen demo: stopped", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(status)
        if status == 143:
            raise SystemExit(143) from None
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class _Terminated(Exception):
    """SIGTERM while the demo serves: it stops as on Ctrl-C, with status 143 and no line."""


def _terminate(signum, frame):
    raise _Terminated()
