"""Regression tests of the third newcomer trial's findings 2, 5, 8-14 (issue 16, item 12)

One test (or a parametrised few) per finding, each named after what it checks: a refused command
leaves no trace, and a bad value gets one line naming it and what is allowed.
"""

from __future__ import annotations

import json

import pytest

from builtin_fixture import builtin, weights  # noqa: F401 (fixtures)
from cli_helpers import cli_error, run, usage_error


# ---- #2: a value refused once the model is loaded left an empty --out folder -----------------


@pytest.mark.parametrize("option", [["--top-k", "1000000"], ["--guidance-scale", "1e308"], ["--temperature", "1e-300"],
                                    ["--engine", "eager", "--compile"]])
def test_generate_refused_after_the_model_loads_leaves_no_output_folder(weights, tmp_path, capsys, option):
    out = tmp_path / "new" / "deeper" / "out"
    cli_error(capsys, "generate", "--weights", weights, "-n", 2, "--window", 8, *option, "--out", out)
    assert not (tmp_path / "new").exists()  # neither the folder nor the parents the command made


def test_a_refused_command_keeps_folders_that_existed_before(weights, tmp_path, capsys):
    empty, kept = tmp_path / "empty", tmp_path / "kept"
    empty.mkdir()
    kept.mkdir()
    (kept / "mine.txt").write_text("x")
    for out in (empty, kept, kept / "new"):
        cli_error(capsys, "generate", "--weights", weights, "-n", 1, "--top-k", "1000000", "--out", out)
    assert empty.is_dir() and (kept / "mine.txt").read_text() == "x" and not (kept / "new").exists()


@pytest.mark.parametrize("command", [["compare", "-n", 2], ["bench", "--limit", 2]])
def test_compare_and_bench_refused_for_top_k_above_the_codebook_leave_no_output_folder(weights, tmp_path, capsys,
                                                                                     command):
    err = cli_error(capsys, *command, "--weights", weights, "--top-k", "100000", "--out", tmp_path / "o")
    assert "top_k=100000" in err and "1..1024" in err, err
    assert not (tmp_path / "o").exists()


def test_save_run_refused_in_its_first_batch_leaves_no_folder(builtin, tmp_path):
    import csdgen

    with pytest.raises(ValueError, match="overflow"):
        csdgen.save_run(builtin, [0], tmp_path / "api" / "out", window=4,
                        sampling=csdgen.SamplingConfig(guidance_scale=1e308))
    assert not (tmp_path / "api").exists()


def test_undo_new_folders_removes_only_new_empty_folders(tmp_path):
    from csdgen.atomic import undo_new_folders

    with pytest.raises(RuntimeError):
        with undo_new_folders(tmp_path / "a" / "b" / "c"):
            (tmp_path / "a" / "b" / "c").mkdir(parents=True)
            (tmp_path / "a" / "side").mkdir()  # made by the block, but not empty-able: "a" holds it
            raise RuntimeError
    assert not (tmp_path / "a" / "b").exists() and (tmp_path / "a" / "side").is_dir()
    with undo_new_folders(tmp_path / "ok"):  # no error: nothing undone
        (tmp_path / "ok").mkdir()
    assert (tmp_path / "ok").is_dir()


def test_a_refused_second_run_does_not_remove_the_new_folder_the_first_run_holds(tmp_path):
    """Two commands started together into one new folder: the refused one must not remove the folder
    under the one running there (which has written nothing yet)."""
    from csdgen.atomic import undo_new_folders
    from csdgen.folder_lock import FolderBusy, folder_lock

    from contextlib import ExitStack

    out = tmp_path / "both"
    with ExitStack() as first:
        with pytest.raises(FolderBusy):
            with undo_new_folders(out):  # the second run starts while the folder is not there yet
                first.enter_context(folder_lock(out, "first run"))  # the first run makes it and holds it
                with folder_lock(out, "second run"):
                    pass
        assert out.is_dir()
    with pytest.raises(RuntimeError):  # once free, a new empty folder is removed
        with undo_new_folders(tmp_path / "alone"), folder_lock(tmp_path / "alone"):
            raise RuntimeError
    assert not (tmp_path / "alone").exists()


# ---- #5: rule and sampling arguments of the wrong type named no argument ----------------------


def _rule_cases():
    import csdgen
    from csdgen.acceptance import GSD, Lantern

    def codebook():
        import torch

        return torch.randn(16, 4)

    return [
        (lambda: csdgen.CSD(delta="x"), r"^delta='x': the CSD TV threshold must be a number in \[0, 1\]$"),
        (lambda: csdgen.CSD(lam="x"), r"^lam='x': the CSD relaxation coefficient lambda must be a finite number >= 0$"),
        (lambda: csdgen.CSD(lam=True), r"^lam=True: .*finite number >= 0$"),
        (lambda: csdgen.CSD(eps="x"), r"^eps='x': .*number >= 0$"),
        (lambda: csdgen.Addition(c="x"), r"^c='x': the Addition constant must be a finite number >= 0$"),
        (lambda: csdgen.Addition(c=True), r"^c=True: "),
        (lambda: GSD(codebook(), prob_gap="x"), r"^prob_gap='x': the GSD prob gap must be a number > 0$"),
        (lambda: GSD(codebook(), max_distance=True), r"^max_distance=True: .*number > 0$"),
        (lambda: Lantern(codebook(), k="x"), r"^k='x': .*an integer >= 1"),
        (lambda: Lantern(codebook(), k=2.5), r"^k=2.5: .*an integer >= 1"),
        (lambda: Lantern(codebook(), delta="x"), r"^delta='x': the LANTERN mass budget must be a number in \[0, 1\]$"),
        (lambda: Lantern(codebook(), cap=True), r"^cap=True: the LANTERN\+\+ cap must be a number >= 1"),
        (lambda: csdgen.SamplingConfig(guidance_scale="x"), r"^guidance_scale='x': must be a finite number >= 0$"),
        (lambda: csdgen.SamplingConfig(temperature=True), r"^temperature=True: must be a finite number >= 0"),
        (lambda: csdgen.SamplingConfig(top_p="x"), r"^top_p='x': must be None or in \(0, 1\]$"),
    ]


@pytest.mark.parametrize("case", range(15))
def test_rule_and_sampling_arguments_of_the_wrong_type_are_named_in_one_line(case):
    make, message = _rule_cases()[case]
    with pytest.raises(ValueError, match=message):
        make()


def test_rule_arguments_still_take_numpy_numbers():
    import numpy as np

    import csdgen

    assert csdgen.CSD(lam=np.float32(0.25), delta=np.float64(0.5)).options()["lam"] == 0.25
    assert csdgen.SamplingConfig(guidance_scale=np.float32(2.0), top_p=np.float64(0.9)).guided


# ---- #8: pil_images's scale and save_run's maps ----------------------------------------------


@pytest.mark.parametrize("scale", [0, 1.5, 10**6, True, "2"])
def test_pil_images_refuses_a_bad_scale_naming_it_before_decoding(builtin, scale):
    import torch

    import csdgen

    tokens = torch.zeros(1, builtin.num_image_tokens, dtype=torch.int64)
    with pytest.raises(ValueError, match=rf"^scale={scale!r}: allowed an integer in 1\.\.16 "):
        csdgen.pil_images(builtin, tokens, scale=scale)
    assert csdgen.pil_images(builtin, tokens, scale=16)[0].size == (1024, 1024)


@pytest.mark.parametrize("kwargs, match", [({"maps": "no"}, r"^maps='no': allowed True .* or False$"),
                                           ({"maps": 0}, r"^maps=0: "),
                                           ({"scale": 17}, r"^scale=17: allowed an integer in 1\.\.16")])
def test_save_run_refuses_maps_not_a_bool_and_scale_above_16_before_making_the_folder(builtin, tmp_path, kwargs, match):
    import csdgen

    with pytest.raises(ValueError, match=match):
        csdgen.save_run(builtin, [0], tmp_path / "never", window=4, **kwargs)
    assert not (tmp_path / "never").exists()


# ---- #9: sweep --windows said 'auto' was allowed, its parser refused it -----------------------


@pytest.mark.parametrize("windows", ["0", "8,auto"])
def test_sweep_windows_error_says_integers_only_and_makes_no_folder(capsys, tmp_path, windows):
    err = usage_error(capsys, "sweep", "-n", 2, "--windows", windows, "--out", tmp_path / "sw", one_line=True)
    assert "allowed: integers" in err and "auto is not swept" in err and "or 'auto'" not in err, err
    assert not (tmp_path / "sw").exists()


def test_sweep_help_says_windows_are_integers():
    from csdgen.cli import build_parser

    help_text = " ".join(build_parser().commands["sweep"].format_help().split())
    assert "--windows LIST windows, integers >= 1" in help_text and "auto is not swept" in help_text


# ---- #10: the server noted nothing about fields the method does not use -----------------------


@pytest.fixture(scope="module")
def server(cached_model):
    from csdgen.serve import BackgroundServer, ServedModel, create_app

    from serve_fixture import tiny_model

    with BackgroundServer(create_app(ServedModel(tiny_model(cached_model), "tiny"), capacity=4)) as background:
        yield background


def _post(server, body):
    import httpx

    return httpx.post(server.url + "/v1/images/generations", json=body, timeout=120)


def test_serve_notes_fields_the_method_does_not_use_as_the_cli_does(server):
    r = _post(server, {"prompt": "alpha", "n": 1, "method": "sjd", "lam": 0.9, "window": 4, "seed": 0})
    assert r.status_code == 200, r.text
    assert r.json()["csdgen"]["notes"] == ["lam 0.9 does not apply to method sjd (only csd uses it); it is not used"]
    r = _post(server, {"prompt": "alpha", "n": 1, "method": "ar", "window": 8, "draft_init": "onehot", "seed": 0})
    notes = r.json()["csdgen"]["notes"]
    assert notes == ["draft_init onehot does not apply to method ar (AR has no drafts); it is not used",
                     "method ar decodes one token per forward: window 8 does not apply (window 1)"], notes
    r = _post(server, {"prompt": "alpha", "n": 1, "method": "csd", "lam": 0.9, "window": 4, "seed": 0})
    assert r.json()["csdgen"]["notes"] == []


def test_serve_notes_and_class_reach_the_openai_client(server):
    """The notes and the decoded class as a user of the ``openai`` package sees them (``model_extra``)."""
    import openai

    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    result = c.images.generate(prompt="alpha", n=1, extra_body={"method": "sjd", "lam": 0.9, "window": 4, "seed": 0})
    info = result.model_extra["csdgen"]
    assert info["notes"] == ["lam 0.9 does not apply to method sjd (only csd uses it); it is not used"]
    assert info["class"] == result.data[0].revised_prompt and isinstance(info["class_index"], int)


def test_serve_answers_which_class_a_prompt_decoded(server):
    from serve_fixture import CLASS_NAMES

    r = _post(server, {"prompt": "3", "n": 2, "window": 4, "seed": 0})
    body = r.json()
    assert body["csdgen"]["class"] == CLASS_NAMES[3] and body["csdgen"]["class_index"] == 3
    assert [d["revised_prompt"] for d in body["data"]] == [CLASS_NAMES[3]] * 2
    r = _post(server, {"prompt": "random", "n": 1})
    assert r.status_code == 400 and "this server draws no random class" in r.json()["error"]["message"]


def test_serve_stream_completed_events_carry_class_and_notes(server):
    import httpx

    body = {"prompt": "zeta", "n": 1, "window": 4, "seed": 0, "stream": True, "method": "sjd", "delta": 0.5}
    with httpx.stream("POST", server.url + "/v1/images/generations", json=body, timeout=120) as r:
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: ")]
    done = [e for e in events if e["type"] == "image_generation.completed"]
    assert done and done[0]["csdgen"]["class"] == "zeta" and "delta 0.5 does not apply" in done[0]["csdgen"]["notes"][0]


# ---- #11: "random" in the API -----------------------------------------------------------------


def test_save_run_draws_random_classes_as_generate_class_random_does(builtin, weights, tmp_path):
    import csdgen

    csdgen.save_run(builtin, ["random", "RANDOM"], tmp_path / "api", window=4, seed=3, maps=False)
    assert run("generate", "--weights", weights, "--class", "random", "-n", 2, "--seed", 3, "--window", 4,
               "--no-maps", "--out", tmp_path / "cli") == 0
    api, cli = (json.loads((tmp_path / d / "record.json").read_text())["images"] for d in ("api", "cli"))
    assert [api[k]["class"] for k in "01"] == [cli[k]["class"] for k in "01"]
    assert sorted(p.name for p in (tmp_path / "api").glob("*.png")) == sorted(p.name for p in (tmp_path / "cli").glob("*.png"))


def test_generate_with_random_points_to_classes_assign_not_to_close_names(builtin):
    import csdgen

    with pytest.raises(ValueError) as info:
        csdgen.generate(builtin, ["random"], window=4)
    message = str(info.value)
    assert "model.classes.assign(['random'], n, seed=...)" in message and "did you mean" not in message, message
    assert "\n" not in message


# ---- #12: load_model("") read the current folder ---------------------------------------------


def test_empty_model_paths_are_refused_not_read_as_the_current_folder(tmp_path, monkeypatch):
    from csdgen.models import load_model
    from csdgen.models.builtin import load_builtin_model

    monkeypatch.chdir(tmp_path)
    for path in ("", "  "):
        with pytest.raises(ValueError, match=r"an empty path; allowed: a checkpoint folder"):
            load_model(path)
    with pytest.raises(ValueError, match=r"^weights_dir='': an empty path"):
        load_builtin_model("")


# ---- #13: csdgen demo --port 0 ----------------------------------------------------------------


def test_demo_port_0_means_any_free_port_as_serve_does(monkeypatch, capsys):
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
    monkeypatch.setattr(csdgen.demo, "load_demo_model", lambda *a, **kw: (None, "stub", None))
    monkeypatch.setattr(csdgen.demo, "build_app", lambda *a, **kw: Page())
    page = csdgen.demo.serve(port=0, block=False)
    assert 0 < page.server_port <= 65535
    with socket.socket() as s:  # the port was free (the server would bind it now)
        s.bind(("127.0.0.1", page.server_port))
    assert f":{page.server_port}/" in capsys.readouterr().out


# ---- #14: an over-long --out -------------------------------------------------------------------


@pytest.mark.parametrize("tail", ["/".join(["y" * 200] * 25), "y" * 300])
def test_an_over_long_out_is_shortened_with_the_out_hint(weights, tmp_path, capsys, tail):
    out = tmp_path / "a" / tail
    err = cli_error(capsys, "generate", "--weights", weights, "-n", 1, "--window", 8, "--out", out)
    assert "File name too long" in err and "choose another with --out" in err and "..." in err, err
    assert len(err) < 300, err
    assert not (tmp_path / "a").exists()  # the parent mkdir made on the way is removed again
