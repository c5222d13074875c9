"""The built-in model's training script end to end (``python -m csdgen.builtin.train``), tiny.

Every stage runs for a few steps on a stand-in of the emoji package (three classes of coloured
shapes in the npm package's layout, put where :func:`csdgen.builtin.emoji.fetch_package` finds
an unpacked package, so no ``npm pack`` and no network) with a 1-layer AR model and a narrow
classifier. The VQ tokenizer's widths and the codebook (1024) are fixed by the script
(``train_vq.VQ_CONFIG``), so the VQ runs at its real size, on a batch of 4 for 2 steps.
"""

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from csdgen.builtin import emoji

#: the stand-in's classes: three of train.py's showcase classes, so the sample grid shows them
CLASSES = [("RED APPLE", "apple", "Food & Drink"), ("DOG FACE", "dog", "Animals & Nature"),
           ("ROCKET", "rocket", "Travel & Places")]

TINY = ["--vq-views", "2", "--ar-views", "2", "--heldout-views", "1",
        "--vq-steps", "2", "--vq-batch", "4",
        "--ar-steps", "3", "--ar-batch", "4", "--ar-layers", "1", "--ar-hidden", "32",
        "--ar-intermediate", "64", "--ar-heads", "4", "--ckpt-every", "2",
        "--cls-steps", "2", "--cls-batch", "8", "--cls-width", "8", "--cls-features", "16",
        "--cls-recon-views", "1", "--agreement-samples", "3", "--threads", "1", "--log-every", "1"]

WEIGHTS = ("vq.safetensors", "ar.safetensors", "classifier.safetensors")


def shape_image(i: int) -> np.ndarray:
    """RGBA [64, 64, 4]: class 0 a red disc, 1 a brown square, 2 a blue triangle, on transparency."""
    yy, xx = np.mgrid[0:64, 0:64]
    mask = [(yy - 32) ** 2 + (xx - 32) ** 2 < 20 ** 2,
            (abs(yy - 32) < 18) & (abs(xx - 32) < 18),
            (yy > 12) & (yy < 52) & (abs(xx - 32) < (yy - 12) / 2)][i]
    rgba = np.zeros((64, 64, 4), dtype=np.uint8)
    rgba[mask] = [(220, 30, 30, 255), (140, 90, 40, 255), (40, 80, 220, 255)][i]
    return rgba


@pytest.fixture(scope="module")
def emoji_cache(tmp_path_factory):
    """A cache folder holding an unpacked stand-in of the emoji package ($CSDGEN_CACHE points at it)."""
    root = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("CSDGEN_CACHE", str(root))
    pkg = emoji.cache_dir() / "package"
    img = pkg / "img" / "google" / "64"
    img.mkdir(parents=True)
    entries = []
    for i, (name, short, category) in enumerate(CLASSES):
        entries.append({"name": name, "short_name": short, "short_names": [short], "image": f"{i}.png",
                        "category": category, "sort_order": i, "has_img_google": True})
        Image.fromarray(shape_image(i)).save(img / f"{i}.png")
    (pkg / "emoji.json").write_text(json.dumps(entries))
    assert emoji.fetch_package() == pkg  # found unpacked: npm is never run
    yield root
    mp.undo()


@pytest.fixture(scope="module")
def run(emoji_cache, tmp_path_factory):
    """One tiny training run: (its --out, its --docs, its printed log)."""
    from csdgen.builtin import train

    base = tmp_path_factory.mktemp("train")
    out, docs = base / "out", base / "docs"
    threads = torch.get_num_threads()
    try:
        log = _main(train, ["--out", str(out), "--docs", str(docs), *TINY])
    finally:
        torch.set_num_threads(threads)
    return out, docs, log


def _main(train, argv) -> str:
    """train.main(argv), its printed lines returned."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        train.main(argv)
    return buf.getvalue()


def test_a_tiny_run_writes_every_file_of_a_weights_folder(run):
    out, docs, log = run
    from safetensors.torch import load_file

    for name in (*WEIGHTS, "reference_features.safetensors"):
        assert load_file(str(out / name)), name
    for name in WEIGHTS:  # shipped as float16
        assert all(v.dtype == torch.float16 for v in load_file(str(out / name)).values() if v.is_floating_point())
    config = json.loads((out / "config.json").read_text())
    assert config["class_names"] == ["red apple", "dog face", "rocket"] and config["num_classes"] == 3
    assert config["class_short_names"] == [["apple"], ["dog"], ["rocket"]]
    assert config["null_class_id"] == 1024 + 3 and config["llama"]["vocab_size"] == 1024 + 3 + 1
    assert config["llama"]["num_hidden_layers"] == 1 and config["llama"]["hidden_size"] == 32
    assert config["classifier"] == {"num_classes": 3, "width": 8, "feature_dim": 16}
    assert config["training"]["ar_steps"] == 3 and "out" not in config["training"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps_done"] == {"vq": 2, "ar": 3, "cls": 2}
    assert {"vq", "ar", "classifier", "samples", "wall_times_s", "sizes_bytes"} <= set(metrics)
    assert metrics["samples"]["n"] == 3 and 0.0 <= metrics["samples"]["classifier_agreement"] <= 1.0
    assert metrics["classifier"]["n_heldout"] == 3
    assert set(metrics["sizes_bytes"]) == {*WEIGHTS, "reference_features.safetensors"}
    assert json.loads((out / "stages.json").read_text())["done"] == ["vq", "ar", "cls"]
    assert (out / "ar.ckpt.pt").is_file()  # the AR stage checkpointed at step 2
    for png in ("builtin_samples.png", "builtin_reconstructions.png"):
        assert Image.open(docs / png).size[0] > 0
    for line in ("vq step 1 ", "ar step 2 ", "cls step 1 ", "ar: checkpoint at step 2", "done: "):
        assert line in log, line


def test_the_written_folder_loads_as_the_builtin_model_and_generates(run):
    import csdgen
    from csdgen.models.builtin import load_builtin_model

    out, _, _ = run
    model = load_builtin_model(out)
    assert model.class_names == ["red apple", "dog face", "rocket"]
    result = csdgen.generate(model, ["rocket"], method="sjd", window=4, seed=0)
    assert result.tokens.shape == (1, 256)
    images = model.decode_images(result.tokens)
    assert images.shape == (1, 3, 64, 64) and torch.isfinite(images).all()


def test_resume_reuses_the_finished_stages(run, tmp_path):
    from csdgen.builtin import train

    out, _, _ = run
    again = tmp_path / "out"
    shutil.copytree(out, again)  # copy2: the same bytes and modification times
    before = {name: ((again / name).read_bytes(), (again / name).stat().st_mtime_ns) for name in WEIGHTS}
    threads = torch.get_num_threads()
    try:
        log = _main(train, ["--out", str(again), "--resume", *TINY])
    finally:
        torch.set_num_threads(threads)
    assert "vq: reused" in log and "ar: reused" in log
    for stage in ("vq step", "ar step", "cls step"):
        assert stage not in log, stage  # no stage trains again
    for name in WEIGHTS:
        assert ((again / name).read_bytes(), (again / name).stat().st_mtime_ns) == before[name], name
    metrics = json.loads((again / "metrics.json").read_text())
    assert metrics["steps_done"] == {"vq": 2, "ar": 3, "cls": 2}  # kept from the first run's stages.json
    assert json.loads((again / "stages.json").read_text())["done"] == ["vq", "ar", "cls"]


def test_a_run_stopped_in_the_ar_stage_resumes_from_its_checkpoint_to_the_same_weights(run, tmp_path, monkeypatch):
    """A crash at AR step 2 (after the checkpoint of step 2) loses neither the VQ stage nor the AR
    steps before it; the resumed run ends with the AR weights of the uninterrupted run (same batches,
    optimiser state and condition-dropout draws)."""
    from csdgen.builtin import train

    out, _, _ = run
    resumed = tmp_path / "out"
    clip = torch.nn.utils.clip_grad_norm_
    calls = []

    def crash_at_step_2(*a, **k):  # clip_grad_norm_ runs once per AR step, in that stage only
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("stopped at AR step 2")
        return clip(*a, **k)

    threads = torch.get_num_threads()
    try:
        monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", crash_at_step_2)
        with pytest.raises(SystemExit) as stopped:  # one line saying how to resume, status 130
            _main(train, ["--out", str(resumed), *TINY])
        assert stopped.value.code == 130
        assert json.loads((resumed / "stages.json").read_text())["done"] == ["vq"]
        assert not (resumed / "ar.safetensors").exists() and (resumed / "ar.ckpt.pt").is_file()
        vq_written = (resumed / "vq.safetensors").stat().st_mtime_ns
        monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
        log = _main(train, ["--out", str(resumed), "--resume", *TINY])
    finally:
        torch.set_num_threads(threads)
    assert "vq: reused" in log and "ar: resumed at step 2" in log
    assert "vq step" not in log and "ar step 1 " not in log and "ar step 2 " in log
    assert (resumed / "vq.safetensors").stat().st_mtime_ns == vq_written
    assert (resumed / "ar.safetensors").read_bytes() == (out / "ar.safetensors").read_bytes()


def _agreement(tmp_path, hits=(3, 2, 1)) -> str:
    """An agreement file as benchmarks/builtin_class_agreement.py --json writes it, at guidance 3."""
    classes = {name.lower(): {"hits": h, "n": 3, "p_class": h / 3} for (name, _, _), h in zip(CLASSES, hits)}
    path = tmp_path / "agreement.json"
    path.write_text(json.dumps({"by_guidance": {"3": {"classes": classes, "agreement": sum(hits) / 9}}}))
    return str(path)


def test_ship_writes_its_folder_all_at_once_and_a_refusal_leaves_it_as_it_was(run, tmp_path, capsys, monkeypatch):
    """A bad value found late (a misspelt default class) left ar, vq, classifier and reference files of the
    new run beside the old config.json: a folder that no longer loaded."""
    from csdgen.builtin import ship
    from csdgen.models.builtin import load_builtin_model

    out, _, _ = run
    target = tmp_path / "weights"
    shutil.copytree(out, target)
    (target / "NOTICE").write_text("kept")
    before = {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()}
    common = ["--run", str(out), "--agreement", _agreement(tmp_path), "--min-agreement", "0.5",
              "--source-classifier", str(out), "--out", str(target), "--threads", "1", "--heldout-views", "1"]
    threads = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit, match=r"^ship: error: --default-classes: not offered: 'rockett' "
                                             r"\(offered: 'red apple'|^ship: error: --default-classes: not offered: 'rockett'"):
            ship.main([*common, "--default-classes", "red apple,rockett"])
        with pytest.raises(SystemExit, match=r"^ship: error: --guidance 5: the agreement file has 3$"):
            ship.main([*common, "--guidance", "5"])
        (tmp_path / "afile").write_text("")
        with pytest.raises(SystemExit, match=r"^ship: error: --out '.*afile' is a file"):
            ship.main([*common[:-6], "--out", str(tmp_path / "afile"), *common[-4:]])
        with pytest.raises(SystemExit, match=r"^ship: error: --run '.*' holds no config.json: not a finished run"):
            ship.main([*common[:0], "--run", str(tmp_path), *common[2:]])

        def fails(*args, **kwargs):  # a failure after some files are made
            raise RuntimeError("out of memory")

        monkeypatch.setattr(ship, "nearest_offered", fails)
        with pytest.raises(RuntimeError, match="out of memory"):
            ship.main(common)
        monkeypatch.undo()
        assert {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()} == before
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
        ship.main([*common, "--guidance", "3.0"])  # the file's "3"
    finally:
        torch.set_num_threads(threads)
    assert "2 of 3 classes offered" in capsys.readouterr().out
    assert load_builtin_model(target).class_names == ["red apple", "dog face"]
    assert (target / "NOTICE").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no folder of its own left


def test_resume_refuses_a_run_of_other_settings_and_bad_files_are_one_line(run, tmp_path):
    """--resume with other --classes or --ar-steps reused the earlier stages (codes of other classes, another
    schedule) without a word; an --ar-init of another shape ended in load_state_dict's list of every key."""
    from csdgen.builtin import train

    out, _, _ = run
    again = tmp_path / "out"
    shutil.copytree(out, again)
    before = (again / "stages.json").read_text()
    threads = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit, match=r"^train: error: --resume: .* holds a run made with other settings "
                                             r"\(--ar-steps 3 there, 4 now\); give the run's own settings"):
            _main(train, ["--out", str(again), "--resume", *TINY, "--ar-steps", "4"])
        assert (again / "stages.json").read_text() == before
        with pytest.raises(SystemExit, match=r"^train: error: --out .* holds a run \(its stages.json or AR checkpoint\): "
                                             r"--resume continues it"):
            _main(train, ["--out", str(again), *TINY])  # no --resume: it started over without a word
        assert (again / "stages.json").read_text() == before
        wide = ["--ar-hidden", "64", "--ar-intermediate", "128"]
        with pytest.raises(SystemExit, match=r"^train: error: '.*ar.safetensors' does not fit this model \(0 tensors "
                                             r"missing, 0 not expected, \d+ of another shape; "):
            _main(train, ["--out", str(tmp_path / "wide"), *TINY, *wide, "--vq", str(out / "vq.safetensors"),
                          "--ar-init", str(out / "ar.safetensors")])
        for bad in (["--ar-steps", "0"], ["--ar-heads", "3"]):  # refused before anything is made
            with pytest.raises(SystemExit) as refused:
                _main(train, ["--out", str(tmp_path / "never"), *TINY, *bad])
            assert refused.value.code == 2 and not (tmp_path / "never").exists()
        with pytest.raises(SystemExit, match=r"^train: error: --out '.*afile' is a file"):
            (tmp_path / "afile").write_text("")
            _main(train, ["--out", str(tmp_path / "afile"), *TINY])
    finally:
        torch.set_num_threads(threads)


def test_sigterm_stops_training_as_ctrl_c_does(run, tmp_path, monkeypatch):
    import os
    import signal

    from csdgen.builtin import train

    clip, calls = torch.nn.utils.clip_grad_norm_, []

    def terminated_at_step_2(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return clip(*a, **k)

    threads = torch.get_num_threads()
    before = signal.getsignal(signal.SIGTERM)
    try:
        monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", terminated_at_step_2)
        with pytest.raises(SystemExit) as stopped:
            _main(train, ["--out", str(tmp_path / "out"), *TINY])
    finally:
        torch.set_num_threads(threads)
    assert stopped.value.code == 143 and signal.getsignal(signal.SIGTERM) is before
    assert (tmp_path / "out" / "ar.ckpt.pt").is_file()  # the checkpoint of step 2 kept for --resume
