"""``csdgen demo``: input checks, the maps, cancelling, and the page itself in headless Chromium.

The browser test starts ``csdgen demo`` on a free loopback port, submits a class with AR and
CSD, waits for the results and checks what the page shows (pixels, statistics, CSV), then that a
bad value gives a message on the page. It needs Debian's ``chromium`` (``.ci/run`` installs it)
and skips only when that browser is absent.
"""

from __future__ import annotations

import csv
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from csdgen import Decision
from csdgen.demo import (COMMITTED, ENTROPY_PENDING, PENDING, DemoCancelled, Frame, parse_inputs, token_maps, watch,
                         window_auto_supported)
from csdgen.evaluation.maps import COLOURS
from csdgen.models.builtin import load_builtin_model
from csdgen.sampling import SamplingConfig

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def builtin():
    return load_builtin_model()


def _parse(model, **changes):
    values = dict(condition="red apple", methods=["ar", "csd"], window="8", lam=0.5, delta=0.65, guidance_scale=3.0, seed=0)
    values.update(changes)
    return parse_inputs(model, **values)


def test_inputs_are_checked_with_one_line_messages(builtin):
    settings = _parse(builtin)
    assert (settings.condition, settings.window, settings.methods, settings.seed) == (builtin.class_names.index("red apple"),
                                                                                      8, ["ar", "csd"], 0)
    assert settings.label == "red apple"
    assert _parse(builtin, condition="3", window=4.0).condition == 3
    # ticked CSD, then SJD: they run (and fill the table) in the order the page shows their panels
    assert _parse(builtin, methods=["csd-coupled", "ar", "sjd", "ar"]).methods == ["ar", "sjd", "csd-coupled"]
    # any case and spacing, a short name, a name holding commas, random (drawn from the seed, named)
    assert _parse(builtin, condition="  DOG   Face").label == "dog face"
    assert _parse(builtin, condition="apple").label == "red apple"
    assert _parse(builtin, condition="\U0001F34E").label == "red apple"  # the emoji itself
    drawn = _parse(builtin, condition="random", seed=4)
    assert drawn.label == builtin.class_names[drawn.condition] == _parse(builtin, condition="RANDOM", seed=4).label
    assert drawn.condition == builtin.classes.assign(["random"], 1, seed=4)[0]
    bad = [
        ("condition", ("red appel", "unknown class 'red appel'; did you mean 'red apple'")),
        ("methods", ([], "no method chosen; tick one or more of AR, SJD, coupled SJD")),
        ("window", ("0", "window='0': allowed: an integer >= 1")),
        ("lam", (-1, "lambda (CSD)=-1: allowed a number >= 0")),
        ("delta", (2, "delta (CSD)=2: allowed a number in [0, 1]")),
        ("guidance_scale", (-1, "guidance scale=-1: allowed a number >= 0 (0 = no guidance)")),
        ("guidance_scale", ("x", "guidance scale='x': must be a number")),
        ("seed", (1.5, "seed=1.5: allowed: an integer in 0..9223372036854775807")),
    ]
    for name, (value, message) in bad:
        with pytest.raises(ValueError) as info:
            _parse(builtin, **{name: value})
        assert message in str(info.value) and "\n" not in str(info.value), (name, str(info.value))
    for name, field in (("lam", "lambda (CSD)"), ("delta", "delta (CSD)"), ("guidance_scale", "guidance scale")):
        # an empty number field (or one past float range) reaches the server as None: said so, not "lambda=None"
        with pytest.raises(ValueError) as info:
            _parse(builtin, **{name: None})
        assert str(info.value).startswith(f"{field}: the field holds no number; allowed: a number"), str(info.value)
    for text in ("abc", "2.5", "-3", "1e3", "999999999", "257", 257.0, float("inf"), "", "٣"):  # as --window reads it
        with pytest.raises(ValueError, match="allowed: an integer >= 1 .* at most the image's 256 tokens"):
            _parse(builtin, window=text)
    assert _parse(builtin, window=" 256 ").window == 256 and _parse(builtin, window=16).window == 16
    if window_auto_supported():
        assert _parse(builtin, window="auto").window == "auto"
    else:
        with pytest.raises(ValueError, match="no automatic window"):
            _parse(builtin, window="auto")


def test_token_maps_colour_committed_tokens_only():
    decisions = torch.tensor([Decision.SAMPLED, Decision.ACCEPTED, Decision.RELAXED, Decision.RESAMPLED, 0, 0], dtype=torch.int8)
    entropy = torch.tensor([0.0, 1.0, 2.0, 3.0, 0.0, 0.0]) * np.log(8) / 3
    acceptance, entropy_map = token_maps(decisions, entropy, committed=4, grid=(2, 3), vocab_size=8, height=4, width=6)
    assert acceptance.shape == entropy_map.shape == (4, 6, 3)
    cells = acceptance[::2, ::2].reshape(6, 3)
    assert [tuple(c) for c in cells] == [COLOURS[Decision(d)] for d in decisions[:4].tolist()] + [PENDING, PENDING]
    assert entropy_map[::2, ::2].reshape(6, 3)[:4, 0].tolist() == [0, 85, 170, 255]  # black 0 .. white ln V
    # tokens not committed: off the grey scale (a light grey read as an entropy near ln V)
    assert [tuple(c) for c in entropy_map[::2, ::2].reshape(6, 3)[4:]] == [ENTROPY_PENDING] * 2
    assert len(set(ENTROPY_PENDING)) > 1
    live, _ = token_maps(None, None, committed=2, grid=(2, 3), vocab_size=8, height=2, width=3)
    assert [tuple(c) for c in live.reshape(6, 3)] == [COMMITTED] * 2 + [PENDING] * 4


def test_watch_streams_frames_that_fill_in(builtin):
    settings = _parse(builtin, methods=["csd"], window="16")
    events = list(watch(builtin, settings, SamplingConfig(guidance_scale=3.0), threading.Event(), min_interval=0.0))
    frames = [e for e in events if e[0] == "frame"]
    assert [e[0] for e in events if e[0] != "frame"] == ["done", "end"]
    rows = events[-1][1]
    assert [r["method"] for r in rows] == ["csd"]
    assert rows[0]["forwards"] < builtin.num_image_tokens and rows[0]["wall_s"] > 0 and rows[0]["tokens_relaxed"] > 0
    assert rows[0]["window"] == 16 and 1 < rows[0]["mean_width"] <= 16
    csd_frames = [f for _, key, f in frames if key == "csd"]
    assert [f.committed for f in csd_frames] == sorted(f.committed for f in csd_frames)  # fills in
    assert csd_frames[0].committed == 1 and csd_frames[-1].committed == builtin.num_image_tokens
    assert len(csd_frames) == rows[0]["forwards"] + 1  # every forward, then the final frame
    first_image = csd_frames[0].image  # one token committed: everything below the first token row is veiled
    assert (first_image[first_image.shape[0] // 16:] >= int(0.7 * min(PENDING))).all()
    final = csd_frames[-1]
    assert isinstance(final, Frame) and final.image.shape == final.acceptance.shape == final.entropy.shape
    assert not (final.acceptance == PENDING).all(axis=-1).any()  # every token decided
    middle = csd_frames[len(csd_frames) // 2]  # while decoding, committed tokens already show their decision
    assert _has_colour(middle.acceptance, COLOURS[Decision.ACCEPTED]) or _has_colour(middle.acceptance, COLOURS[Decision.RELAXED])

    assert issubclass(DemoCancelled, Exception)


def test_wall_time_excludes_drawing_the_previews(builtin, monkeypatch):
    """Drawing a preview (made slow here: 20 ms each) is subtracted from the reported decoding time."""
    import csdgen.demo_watch as demo  # where the live view draws its frames

    slow_frame = demo._frame

    def frame(*args):
        time.sleep(0.02)
        return slow_frame(*args)

    monkeypatch.setattr(demo, "_frame", frame)
    began = time.perf_counter()
    events = list(watch(builtin, _parse(builtin, methods=["csd"], window="16"), SamplingConfig(), threading.Event(),
                        min_interval=0.0))
    elapsed = time.perf_counter() - began
    row = events[-1][1][0]
    previews = sum(e[0] == "frame" for e in events)
    assert previews == row["forwards"] + 1
    assert 0 < row["wall_s"] < elapsed - 0.9 * 0.02 * (previews - 1)


def test_cancel_stops_at_the_next_forward(builtin):
    cancel = threading.Event()
    stream = watch(builtin, _parse(builtin, methods=["ar", "csd"]), SamplingConfig(), cancel, min_interval=0.0)
    first = next(stream)
    assert first[0] == "frame" and first[2].committed == 1
    cancel.set()
    rest = list(stream)
    assert rest[-1] == ("cancelled", "ar") and all(e[0] == "frame" for e in rest[:-1])


def _page_handlers(app) -> dict:
    return {f.fn.__name__: f.fn for f in app.fns.values() if f.fn is not None}


def _drive(run, on_update=lambda update: None) -> list[str]:
    """Every update of the page's run generator, as the text of its values."""
    import asyncio

    async def collect():
        texts = []
        async for update in run:
            texts.append(" ".join(str(v) for v in update.values()))
            on_update(texts[-1])
        return texts

    return asyncio.run(collect())


def test_cancel_ends_the_run_itself_at_the_next_forward(builtin):
    """Cancel sets the session's flag: the run stops at its next forward and its own last update says
    so; a run cancelled while queued ends before its first forward. Gradio's ``cancels=`` killed the
    run's task instead: a preview already on its way overwrote "cancelled" (the page stayed at
    "AR: 14/256 tokens"), or Gradio's page drew "Error" over every output (a new-user try-out)."""
    import types

    from csdgen.demo import build_app

    app = build_app(builtin)
    assert not any(f.cancels for f in app.fns.values())  # no Gradio task cancel
    handlers = _page_handlers(app)
    tab, other = types.SimpleNamespace(session_hash="tab"), types.SimpleNamespace(session_hash="other")
    values = ("red apple", ["ar", "csd"], "8", 0.5, 0.65, 3.0, "0")

    def cancel_on_first_token(text):
        if "AR: 1/256 tokens" in text:
            handlers["on_cancel"](other)  # another tab's Cancel leaves this run alone
            handlers["on_cancel"](tab)

    handlers["on_click_run"](tab)
    texts = _drive(handlers["on_run"](*values, request=tab), cancel_on_first_token)
    assert "cancelled during AR" in texts[-1] and not any("done:" in t or "CSD:" in t for t in texts)
    assert len([t for t in texts if "tokens," in t]) <= 3  # stopped at the next forward

    handlers["on_click_run"](tab)  # Run, then Cancel while the run waits in the queue
    handlers["on_cancel"](tab)
    texts = _drive(handlers["on_run"](*values, request=tab))
    assert texts == [texts[-1]] and "cancelled before it started" in texts[-1]

    handlers["on_cancel"](tab)  # Cancel on an idle page: the next run is not cancelled by it
    handlers["on_click_run"](tab)
    texts = _drive(handlers["on_run"]("red apple", ["ar"], "8", 0.5, 0.65, 3.0, "0", request=tab))
    assert "done: red apple, 1 method" in texts[-1]


def test_every_font_face_of_the_page_holds_the_latin_letters():
    """Gradio's SourceSansPro-SemiBold.woff2 holds only "A" and "B" of the Latin letters, so the
    page's semibold headings mixed two fonts ("AR" with a lighter "A"; a new-user try-out's
    screenshots): every face the page's theme declares is a complete one."""
    import string

    import gradio

    pytest.importorskip("brotli")  # reads woff2
    TTFont = pytest.importorskip("fontTools.ttLib").TTFont

    from csdgen.demo import _theme

    faces = [f for f in _theme()._font if hasattr(f, "weights")]
    assert faces
    static = Path(gradio.__file__).parent / "templates" / "frontend"
    for face in faces:
        for rule in face.stylesheet()["css"].split("@font-face")[1:]:
            path = static / rule.split("url('", 1)[1].split("'", 1)[0]
            letters = {chr(c) for c in TTFont(str(path)).getBestCmap()}
            missing = set(string.ascii_letters + string.digits) - letters
            assert not missing, f"{path.name} lacks {''.join(sorted(missing))[:20]}"


def test_prompt_model_from_a_checkpoint_folder(tmp_path):
    """``--model PATH``: a (tiny random) Janus checkpoint takes a prompt, its family's defaults, and runs AR and CSD."""
    from test_models_janus import build_checkpoint

    from csdgen.demo import load_demo_model
    from csdgen.models.defaults import FAMILY_DEFAULTS

    model, name, defaults = load_demo_model(str(build_checkpoint(tmp_path / "janus")))
    assert defaults == FAMILY_DEFAULTS["janus"] and name.startswith("janus")
    settings = _parse(model, condition="a red dog", window="4")
    assert settings.condition == "a red dog"
    with pytest.raises(ValueError, match="the class or prompt is empty; allowed: a text prompt"):
        _parse(model, condition="  ")
    events = list(watch(model, settings, SamplingConfig(guidance_scale=defaults.guidance_scale), threading.Event()))
    rows = events[-1][1]
    assert [r["method"] for r in rows] == ["ar", "csd"] and rows[0]["forwards"] == model.num_image_tokens
    final = [e[2] for e in events if e[0] == "frame"][-1]
    assert final.image.shape == final.acceptance.shape == final.entropy.shape and final.image.shape[0] >= 200


def test_demo_command_options_and_light_imports():
    """``csdgen demo`` binds 127.0.0.1 by default; gradio (and csdgen.demo) are imported by the command only."""
    import ast

    import csdgen.cli as cli

    args = cli.build_parser().parse_args(["demo"])
    assert (args.command, args.model, args.host, args.port) == ("demo", None, "127.0.0.1", None)
    assert cli.build_parser().parse_args(["demo", "--port", "8123", "--host", "0.0.0.0"]).port == 8123
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["demo", "--port", "70000"])
    # a built-in model's weights folder goes to --weights, as the error for --model FOLDER says
    assert cli.build_parser().parse_args(["demo", "--weights", "w"]).weights == "w"
    import csdgen.cli.demo as demo_command

    top = ast.parse(Path(demo_command.__file__).read_text()).body
    names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in top if isinstance(n, ast.ImportFrom) and n.module}
    assert not {"gradio", "csdgen.demo", "playwright"} & names


def test_demo_serves_the_builtin_weights_folder_given_with_weights(tmp_path, monkeypatch, capsys):
    """``demo --model FOLDER`` on a built-in model's weights says to give it as --weights FOLDER:
    demo now has that option, and the folder reaches the page's model."""
    from builtin_fixture import make_tiny_weights
    from cli_helpers import cli_error, run

    import csdgen.demo

    weights = make_tiny_weights(tmp_path / "w")
    assert "give it as --weights FOLDER" in cli_error(capsys, "demo", "--model", weights)
    served = {}
    monkeypatch.setattr(csdgen.demo, "serve", lambda model, **options: served.update(options, model=model))
    assert run("demo", "--weights", weights, "--port", 0) == 0
    assert served["model"] is None and served["weights"] == str(weights)
    err = cli_error(capsys, "demo", "--model", tmp_path / "checkpoint", "--weights", weights)
    assert err.startswith("csdgen demo: error: --weights is for the built-in model;"), err


def test_demo_prints_its_run_line_only_once_the_model_is_loaded(tmp_path, capsys):
    """Found by a new-user try-out: the run line ("csdgen demo: ... on cpu, float32") came first, then the
    refusal of a checkpoint that could not be served."""
    from cli_helpers import run
    from test_models_chameleon import build_checkpoint

    folder = build_checkpoint(str(tmp_path / "Lumina-mGPT-7B"))  # no size in its name: refused at loading
    assert run("demo", "--model", folder, "--port", 0) == 2
    captured = capsys.readouterr()
    assert "csdgen demo:" not in captured.out and "--image-size" in captured.err, captured


# --- the page in a real browser --------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def demo_server(tmp_path, request):
    """``csdgen demo --port N`` in a subprocess; yields its URL once the page answers (the process:
    ``request.node.demo_process``). SIGINT as from a terminal, or, parametrized indirectly with ``"ignored"``,
    ignored, as a background job of a script starts it."""
    port = _free_port()
    log = (tmp_path / "server.log").open("w")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "GRADIO_TEMP_DIR": str(tmp_path / "gradio")}
    # SIGINT as from a terminal: a harness that runs the suite in the background ignores it, and an
    # ignored SIGINT is inherited (Python then installs no Ctrl-C handler)
    sigint = signal.SIG_IGN if getattr(request, "param", None) == "ignored" else signal.SIG_DFL
    proc = subprocess.Popen([sys.executable, "-m", "csdgen", "demo", "--port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    request.node.demo_process = proc
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 180
    try:
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("csdgen demo did not start:\n" + (tmp_path / "server.log").read_text()[-3000:])
                time.sleep(0.5)
        yield url
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:  # stopped by the test
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _pixels(page, selector: str) -> np.ndarray:
    """The image a Gradio ``Image`` component shows, fetched from its ``src``, as ``[H, W, 3]`` uint8."""
    src = page.locator(f"{selector} img").first.get_attribute("src")
    assert src, f"{selector} shows no image"
    body = page.request.get(src).body() if not src.startswith("data:") else None
    if body is None:
        import base64
        body = base64.b64decode(src.split(",", 1)[1])
    return np.asarray(Image.open(io.BytesIO(body)).convert("RGB"))


def _has_colour(pixels: np.ndarray, colour) -> bool:
    return bool((pixels == np.array(colour, dtype=np.uint8)).all(axis=-1).any())


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"Debian's chromium is not installed ({CHROMIUM} missing; "
                                                          "apt-get install -y chromium, as .ci/run does)")
def test_page_in_headless_chromium(demo_server, tmp_path, request):
    """The page in a browser: a run of AR and CSD, a refused input, a cancelled run; then SIGTERM stops the
    demo with status 143 and nothing of its image cache left (Gradio copies every preview the page shows
    into it and deleted only some when it closed)."""
    from playwright.sync_api import expect, sync_playwright

    requests: list[str] = []
    failed: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                        args=CHROMIUM_FLAGS, headless=True,
                                                        viewport={"width": 1280, "height": 900})
        try:
            page = browser.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.on("requestfailed", lambda r: failed.append(f"{r.url} {r.failure}"))
            page.on("response", lambda r: failed.append(f"{r.url} HTTP {r.status}") if r.status >= 400 else None)
            page.goto(demo_server, wait_until="domcontentloaded")
            page.locator("#condition").locator("input, textarea").first.fill("Red Apple")
            page.locator("#window").locator("input, textarea").first.fill("16")
            # above 2**53: a number field rounded it to ...992 before sending
            page.locator("#seed").locator("input, textarea").first.fill("9007199254740993")
            methods = page.locator("#methods")
            expect(methods.get_by_label("AR", exact=True)).to_be_checked()
            expect(methods.get_by_label("CSD", exact=True)).to_be_checked()
            page.locator("#run").click()
            expect(page.locator("#run")).to_be_disabled(timeout=30_000)  # a click during a run would be ignored
            expect(page.locator("#run")).to_have_text("Running")
            expect(page.locator("#stats table")).to_be_visible(timeout=240_000)
            expect(page.locator("#run")).to_be_enabled(timeout=30_000)
            expect(page.locator("#run")).to_have_text("Run")
            expect(page.locator("#progress")).to_contain_text("done: red apple, 2 methods")  # the class as the model names it
            expect(page.locator("#progress")).to_contain_text("seed 9007199254740993")  # exact, not rounded
            shown = "#image-ar img, #acceptance-ar img, #entropy-ar img, #image-csd img, #acceptance-csd img, #entropy-csd img"
            page.wait_for_function(f"""() => {{ const imgs = [...document.querySelectorAll({shown!r})];
                return imgs.length === 6 && imgs.every(i => i.complete && i.naturalWidth > 0); }}""", timeout=30_000)
            page.screenshot(path=str(tmp_path / "demo.png"), full_page=True)
            for view in ("image-csd", "acceptance-csd", "entropy-csd"):  # nothing covers the picture's first row
                picture = page.locator(f"#{view} img").first.bounding_box()
                for cover in ("label", ".download-link"):
                    box = page.locator(f"#{view} {cover}").first.bounding_box()
                    assert box["y"] + box["height"] <= picture["y"] + 1, (view, cover, box, picture)

            for key in ("ar", "csd"):
                image = _pixels(page, f"#image-{key}")
                assert image.std() > 10 and image.shape[0] >= 64, f"{key}: blank image"
                acceptance = _pixels(page, f"#acceptance-{key}")
                assert not _has_colour(acceptance, PENDING), f"{key}: acceptance map has undecided tokens"
                assert _has_colour(acceptance, COLOURS[Decision.SAMPLED])
                entropy = _pixels(page, f"#entropy-{key}")
                assert entropy.std() > 5 and not _has_colour(entropy, ENTROPY_PENDING), f"{key}: blank entropy map"
            csd_acceptance = _pixels(page, "#acceptance-csd")
            assert _has_colour(csd_acceptance, COLOURS[Decision.ACCEPTED]) or _has_colour(csd_acceptance, COLOURS[Decision.RELAXED])

            cells = page.locator("#stats table tbody tr")
            rows = {r[0]: r for r in ([c.strip() for c in cells.nth(i).locator("td").all_inner_texts()]
                                      for i in range(cells.count()))}
            header = [h.strip() for h in page.locator("#stats table thead th").all_inner_texts()]
            forwards = {k: float(r[header.index("forwards")]) for k, r in rows.items()}
            assert set(forwards) == {"ar", "csd"} and forwards["ar"] == 256 and forwards["csd"] < forwards["ar"]

            link = page.locator("#csv a[href]").first
            table = list(csv.DictReader(io.StringIO(page.request.get(link.get_attribute("href")).text())))
            assert {r["method"]: float(r["forwards"]) for r in table} == forwards
            assert all(float(r["wall_s"]) > 0 for r in table)

            page.locator("#lam").locator("input").first.fill("-1")
            page.locator("#run").click()
            expect(page.locator("#message")).to_have_text("lambda (CSD)=-1: allowed a number >= 0", timeout=30_000)
            expect(page.locator("#run")).to_be_enabled(timeout=30_000)  # a refused run gives the button back
            page.screenshot(path=str(tmp_path / "demo_error.png"), full_page=True)

            page.locator("#lam").locator("input").first.fill("0.5")
            page.locator("#run").click()
            expect(page.locator("#progress")).to_contain_text("AR: ", timeout=60_000)  # progress while decoding
            page.locator("#cancel").click()
            expect(page.locator("#progress")).to_contain_text("cancelled", timeout=30_000)
            expect(page.locator("#stats table")).to_have_count(0)  # the cancelled run left no statistics
            expect(page.locator("#run")).to_be_enabled(timeout=30_000)
        finally:
            browser.close()
    broken = [f for f in failed if "net::ERR_ABORTED" not in f]  # aborted: a preview replaced before it loaded
    assert not broken, f"requests that failed: {broken[:5]}"
    foreign = [u for u in requests if not u.startswith(demo_server) and not u.startswith("data:")]
    assert not foreign, f"the page fetched from outside the local server: {foreign[:5]}"
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    _assert_sigterm_leaves_no_cached_image(request.node.demo_process, tmp_path)


def _assert_sigterm_leaves_no_cached_image(demo, tmp_path):
    assert len(list((tmp_path / "gradio").rglob("*.png"))) >= 3  # a run's image and maps at least
    demo.send_signal(signal.SIGTERM)
    assert demo.wait(timeout=30) == 143
    assert list((tmp_path / "gradio").iterdir()) == []
    log = (tmp_path / "server.log").read_text()
    assert "Closing server" not in log  # Gradio's own line, without the csdgen demo prefix


@pytest.mark.parametrize("demo_server", ["ignored"], indirect=True)
def test_ctrl_c_on_a_running_demo_says_stopped_with_status_130(demo_server, tmp_path, request):
    """Gradio's ``block_thread()`` caught Ctrl-C itself, printed "Keyboard interruption in main
    thread... closing server." and returned, so ``csdgen demo`` ended with status 0 (a newcomer's
    a user's run); now it ends as every command does after Ctrl-C: one line, status 130. Also where it
    started with SIGINT ignored, as a background job of a script (``csdgen demo &``) does: there SIGINT
    did nothing, and only SIGTERM stopped it."""
    demo = request.node.demo_process
    assert len(list((tmp_path / "gradio").glob("csdgen-demo-cache-*"))) == 1
    demo.send_signal(signal.SIGINT)
    assert demo.wait(timeout=30) == 130
    assert list((tmp_path / "gradio").rglob("*")) == []  # its image cache went with it
    log = (tmp_path / "server.log").read_text()
    assert log.rstrip().endswith("csdgen demo: stopped") and "Keyboard interruption" not in log


@pytest.mark.skipif(Path(CHROMIUM).exists(), reason="test_page_in_headless_chromium stops its demo and checks this")
def test_the_demo_removes_its_cached_images_when_stopped(demo_server, tmp_path, request):
    """Gradio copies every preview the page shows into its cache (about 3 a second per panel) and
    deleted only some when it closed: after a run and SIGTERM nothing of the demo's is left, and the
    status is 143, as ``csdgen serve``'s (where Chromium is, the browser test checks this after its runs)."""
    from gradio_client import Client

    client = Client(demo_server, verbose=False, download_files=False)
    client.predict("red apple", ["ar"], "16", 0.5, 0.65, 3.0, "0", api_name="/on_run")
    _assert_sigterm_leaves_no_cached_image(request.node.demo_process, tmp_path)


def test_ctrl_c_ends_the_demo_even_where_the_page_server_does_not_close(monkeypatch, capsys, tmp_path):
    """Gradio's close waits for its server thread; where it does not return, Ctrl-C still ends the
    command within CLOSE_SECONDS, saying it stopped, with status 130."""
    import threading
    import types

    import csdgen.demo as demo

    class Hanging:
        server_port = 1

        def queue(self, **kwargs):
            pass

        def launch(self, **kwargs):
            pass

        def close(self, verbose=True):
            threading.Event().wait(60)

    def interrupted(seconds):
        raise KeyboardInterrupt

    def exit_now(code):
        raise SystemExit(code)

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))  # serve points it at a cache folder of its own
    monkeypatch.setattr(demo, "load_demo_model", lambda *a, **k: (None, "a model", {}))
    monkeypatch.setattr(demo, "build_app", lambda *a, **k: Hanging())
    monkeypatch.setattr(demo, "CLOSE_SECONDS", 0.2)
    monkeypatch.setattr(demo, "time", types.SimpleNamespace(sleep=interrupted))  # Ctrl-C in the wait loop
    monkeypatch.setattr(demo.os, "_exit", exit_now)
    with pytest.raises(SystemExit) as exc:
        demo.serve(port=7)
    assert exc.value.code == 130 and "csdgen demo: stopped" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # the cache folder removed before the exit
