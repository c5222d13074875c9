"""Training the built-in model on a subset of the emoji: the class list (emoji.read_class_list,
emoji.select_classes), train.py's --classes / --vq / --classifier options, and the restricted
classifier (train.restricted_classifier)."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from csdgen.builtin import emoji, train
from csdgen.builtin.classifier import CropClassifier


def small_set():
    images = np.stack([np.full((64, 64, 3), v, dtype=np.uint8) for v in (0, 50, 100, 150, 200)])
    return emoji.EmojiSet(["grinning face", "red apple", "dog face", "rocket", "thumbs up sign"],
                          ["Smileys", "Food", "Animals", "Travel", "People"], images,
                          np.array([0, 1, 2, 3, 4]), [["grinning"], ["apple"], ["dog"], ["rocket"], ["+1"]])


def test_select_classes_keeps_the_named_classes_in_data_order_relabelled():
    sub = emoji.select_classes(small_set(), ["rocket", "red apple"])
    assert sub.names == ["red apple", "rocket"]
    assert sub.categories == ["Food", "Travel"]
    assert sub.short_names == [["apple"], ["rocket"]]
    assert sub.labels.tolist() == [0, 1]
    assert sub.images[:, 0, 0, 0].tolist() == [50, 150]


def test_select_classes_refuses_an_unknown_name_naming_the_closest():
    with pytest.raises(ValueError, match=r"unknown class 'red aple'.*closest: 'red apple'"):
        emoji.select_classes(small_set(), ["rocket", "red aple"])


def test_read_class_list_takes_a_list_or_an_object_and_refuses_repeats(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(["rocket", "dog face"]))
    (tmp_path / "b.json").write_text(json.dumps({"how": "by hand", "classes": ["rocket"]}))
    (tmp_path / "c.json").write_text(json.dumps(["rocket", "rocket"]))
    (tmp_path / "d.json").write_text(json.dumps({"names": ["rocket"]}))
    assert emoji.read_class_list(tmp_path / "a.json") == ["rocket", "dog face"]
    assert emoji.read_class_list(tmp_path / "b.json") == ["rocket"]
    with pytest.raises(ValueError, match="given twice"):
        emoji.read_class_list(tmp_path / "c.json")
    with pytest.raises(ValueError, match="non-empty JSON list"):
        emoji.read_class_list(tmp_path / "d.json")


def test_train_parses_the_subset_options_and_refuses_missing_files(tmp_path, capsys):
    classes = tmp_path / "classes.json"
    classes.write_text(json.dumps({"classes": ["rocket", "dog face"]}))
    vq = tmp_path / "vq.safetensors"
    vq.write_bytes(b"")
    out = ["--out", str(tmp_path / "run")]
    args = train.parse_args([*out, "--classes", str(classes), "--vq", str(vq), "--ar-hidden", "320", "--ckpt-minutes", "2"])
    assert args.class_list == ["rocket", "dog face"] and args.vq == vq and args.ar_hidden == 320
    with pytest.raises(SystemExit):
        train.parse_args([*out, "--vq", str(tmp_path / "none.safetensors")])
    assert "--vq" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.parse_args([*out, "--classifier", str(tmp_path)])  # no classifier.safetensors there
    assert "no classifier.safetensors" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the run folder is needed: it defaulted to the shipped weights
        train.parse_args([])
    assert "--out" in capsys.readouterr().err


def test_llama_config_takes_width_and_refuses_heads_that_do_not_divide_it():
    cfg = train.llama_config_dict(96, layers=10, hidden=320, intermediate=864, heads=8)
    assert (cfg["vocab_size"], cfg["num_hidden_layers"], cfg["hidden_size"]) == (1024 + 97, 10, 320)
    with pytest.raises(ValueError, match="multiple of --ar-heads 7"):
        train.llama_config_dict(96, hidden=320, heads=7)


def test_restricted_classifier_is_the_full_argmax_among_the_chosen_classes(tmp_path):
    torch.manual_seed(0)
    names = ["a", "b", "c", "d", "e", "f"]
    full = CropClassifier(num_classes=6, width=8, feature_dim=16).eval()
    save_file({k: v.contiguous() for k, v in full.state_dict().items()}, str(tmp_path / "classifier.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(
        {"class_names": names, "classifier": {"num_classes": 6, "width": 8, "feature_dim": 16}}))
    chosen = ["e", "b", "c"]
    clf, cfg = train.restricted_classifier(tmp_path, chosen, names)
    assert cfg == {"num_classes": 3, "width": 8, "feature_dim": 16}
    x = torch.rand(10, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        want = full(x)[:, [4, 1, 2]]
        assert torch.allclose(clf(x), want, atol=1e-5)
    with pytest.raises(ValueError, match="not in its classifier"):
        train.restricted_classifier(tmp_path, ["b", "z"], names)
