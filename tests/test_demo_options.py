"""The demo's options and messages: seed field, port 0, Ctrl-C, methods not offered, unguided runs."""

from __future__ import annotations

import warnings
import json

import pytest

from builtin_fixture import builtin, weights  # noqa: F401 (fixtures)
from cli_helpers import run


def test_demo_logs_one_line_for_a_method_that_is_not_offered(weights, capfd):
    import socket
    import urllib.request

    from csdgen.demo import build_app
    from csdgen.models.builtin import load_builtin_model

    app = build_app(load_builtin_model(weights))
    app.queue(default_concurrency_limit=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, ssr_mode=False)
    base = f"http://127.0.0.1:{port}/gradio_api/call/on_run"

    def call(*data):
        request = urllib.request.Request(base, data=json.dumps({"data": list(data)}).encode(),
                                         headers={"Content-Type": "application/json"})
        event = json.loads(urllib.request.urlopen(request, timeout=60).read())["event_id"]
        return urllib.request.urlopen(f"{base}/{event}", timeout=120).read().decode()

    try:
        capfd.readouterr()
        pages = [call("brick", ["nonexistent"], "8", 0.5, 0.65, 3, 0),  # a method the page does not offer
                 call("brick", ["ar"], "8", 0.5, 0.65, 3, "abc"),  # a seed that is not a number
                 call("brick", "csd", "8", [1], 0.65, 3, 0)]  # a string for the methods, a list for lambda
    finally:
        app.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "is not in the list of choices" not in err, err
    refused = [line for line in err.splitlines() if line.startswith("csdgen demo: refused a request: ")]
    assert len(refused) == 3, err
    assert "unknown methods ['nonexistent']; allowed: ar, sjd" in refused[0]
    assert "seed='abc'" in refused[1] and "methods='csd'" in refused[2]
    assert all('id=\\"message\\"' in page for page in pages)  # and one line on the page


def test_demo_seed_field_reads_exact_integers_as_seed_does(builtin):
    from csdgen.demo_inputs import _seed

    assert _seed("9007199254740993") == 9007199254740993  # 2**53 + 1: exact, a number field sent ...992
    assert _seed(" 9223372036854775807 ") == 2**63 - 1 and _seed("0") == 0 and _seed(4.0) == 4
    for bad, shown in (("1e3", "'1e3'"), ("-1", "'-1'"), ("2.0", "'2.0'"), ("", "''"),
                       ("9223372036854775808", "9223372036854775808"), ("١", "'١'")):
        with pytest.raises(ValueError) as info:
            _seed(bad)
        assert str(info.value) == f"seed={shown}: allowed: an integer in 0..9223372036854775807", bad


def test_ctrl_c_on_the_demo_says_stopped_not_generates_resume_hint(monkeypatch, capsys):
    import csdgen.demo

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(csdgen.demo, "serve", interrupted)
    assert run("demo") == 130
    err = capsys.readouterr().err
    assert err.strip() == "csdgen demo: stopped", err


def test_demo_port_0_means_any_free_port_as_serve_does(monkeypatch, capsys, tmp_path):
    import socket

    import csdgen.demo
    from csdgen.cli import build_parser

    help_text = " ".join(build_parser().commands["demo"].format_help().split())
    assert "0: any free port" in help_text
    given = {}
    monkeypatch.setattr(csdgen.demo, "serve", lambda *a, **kw: given.update(kw))
    assert run("demo", "--port", 0) == 0 and given["port"] == 0

    class Page:  # what build_app returns, as far as serve uses it: the port Gradio is asked for
        def queue(self, **kwargs):
            pass

        def launch(self, server_name, server_port, **kwargs):
            self.server_port = server_port

    monkeypatch.undo()
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))  # serve points it at a cache folder of its own
    monkeypatch.setattr(csdgen.demo, "load_demo_model", lambda *a, **kw: (None, "stub", None))
    monkeypatch.setattr(csdgen.demo, "build_app", lambda *a, **kw: Page())
    page = csdgen.demo.serve(port=0, block=False)
    assert 0 < page.server_port <= 65535
    with socket.socket() as s:  # the port was free (the server would bind it now)
        s.bind(("127.0.0.1", page.server_port))
    assert f":{page.server_port}/" in capsys.readouterr().out


def test_a_taken_demo_port_is_one_line_before_the_model_loads(monkeypatch, capsys):
    """A busy --port gave Gradio's own message ("Cannot find empty port ... GRADIO_SERVER_PORT") after
    the model had loaded."""
    import socket

    import csdgen.demo

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before the port was checked")

    monkeypatch.setattr(csdgen.demo, "load_demo_model", no_model)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert run("demo", "--port", port) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err and "choose another --port" in err, err


def test_the_demo_run_unguided_by_its_user_gives_no_unguided_sampling_warning(builtin):
    """The demo's guidance field is its user's explicit choice: guidance 1 there is no library mistake, and
    the warning (from the demo's worker thread) only cluttered the demo's log."""
    import threading
    import warnings

    import csdgen
    from csdgen.demo import parse_inputs, watch

    settings_ = parse_inputs(builtin, condition="red apple", methods=["csd"], window="8", lam=0.5, delta=0.65,
                             guidance_scale=1.0, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        events = list(watch(builtin, settings_, csdgen.SamplingConfig(), threading.Event(), min_interval=0.0))
    assert events[-1][0] == "end"
    assert not [w for w in caught if issubclass(w.category, csdgen.UnguidedSamplingWarning)]


def test_a_run_sweeps_only_old_files_of_the_demos_own_cache(tmp_path, monkeypatch):
    """``sweep_cache`` deletes the cached copies older than its age and the folders they leave empty,
    keeps the newer ones, and leaves a cache folder that is not the demo's own alone."""
    import os
    import time

    from csdgen.demo import sweep_cache

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "shared"))
    base = tmp_path / "shared"
    (base / "h1").mkdir(parents=True)
    (base / "h1" / "old.png").write_bytes(b"x")
    old = time.time() - 3600
    os.utime(base / "h1" / "old.png", (old, old))
    assert sweep_cache(600) == 0 and (base / "h1" / "old.png").exists()  # not the demo's own: untouched

    from csdgen.demo import own_cache

    own = own_cache()
    assert own.parent == base and os.environ["GRADIO_TEMP_DIR"] == str(own)
    for name, age in (("a", 3600), ("b", 3600), ("c", 5)):
        (own / name).mkdir()
        (own / name / "x.png").write_bytes(b"x")
        t = time.time() - age
        os.utime(own / name / "x.png", (t, t))
        os.utime(own / name, (t, t))
    assert sweep_cache(600) == 2
    assert sorted(p.name for p in own.iterdir()) == ["c"] and (own / "c" / "x.png").exists()
