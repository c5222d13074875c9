"""A tiny random stand-in for the built-in weights, in the same file layout and config fields as the
emoji model (codebook 1024, 16 x 16 grid, class names with commas and colons, categories and short
names), for CLI tests."""

from pathlib import Path

import pytest

import torch
from safetensors.torch import save_file

from csdgen.builtin import CropClassifier, VQConfig, VQTokenizer, build_ar_model
from csdgen.evaluation.quality import REFERENCE_FILE, reference_feature_states
from csdgen.runs import write_json

#: class names as the emoji model spells them (one holds commas and a colon); their file-name slugs
CLASS_NAMES = ["dog face", "family: man, boy, boy", "red apple"]
SLUGS = ["dog-face", "family-man-boy-boy", "red-apple"]
CATEGORIES = ["Animals & Nature", "People & Body", "Food & Drink"]
SHORT_NAMES = [["dog"], ["man-boy-boy"], ["apple"]]
CODEBOOK = 1024


def shipped_classes() -> tuple[list, list, list]:
    """Class names, categories and short names of the shipped built-in model's config.json."""
    from csdgen.builtin import DEFAULT_WEIGHTS_DIR
    from csdgen.jsonio import read_json

    config = read_json(DEFAULT_WEIGHTS_DIR / "config.json")
    return config["class_names"], config["class_categories"], config["class_short_names"]


def shipped_extra() -> dict:
    """The shipped config's other class keys: emoji characters, default classes, the emoji not drawn."""
    from csdgen.builtin import DEFAULT_WEIGHTS_DIR
    from csdgen.jsonio import read_json

    config = read_json(DEFAULT_WEIGHTS_DIR / "config.json")
    return {k: config[k] for k in ("class_emoji", "default_classes", "other_classes") if k in config}


def make_tiny_weights(folder: Path, classes: tuple[list, list, list] | None = None, extra: dict | None = None,
                      grid: int = 16) -> Path:
    """Tiny random weights in ``folder``; ``classes``: (names, categories, short names), default the
    three above (``shipped_classes()`` gives the shipped model's); ``extra``: more config.json keys
    (``class_emoji``, ``default_classes``, ``other_classes``); ``grid``: tokens per side (16 as shipped;
    8 for tests that need images of a quarter of the tokens, 32 x 32 pixels)."""
    names, categories, short_names = classes or (CLASS_NAMES, CATEGORIES, SHORT_NAMES)
    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    size = 4 * grid  # the VQ's downsampling
    vq_cfg = VQConfig(channels=8, mid=8, hidden=8, codebook_size=CODEBOOK, code_dim=8, image_size=size)
    llama = {"vocab_size": CODEBOOK + len(names) + 1, "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": grid * grid + 1}
    clf_cfg = {"num_classes": len(names), "width": 8, "feature_dim": 16}
    vq, ar, clf = VQTokenizer(vq_cfg), build_ar_model(llama), CropClassifier(**clf_cfg)
    with torch.no_grad():
        ar.lm_head.weight.mul_(10.0)
    for module, name in ((vq, "vq"), (ar, "ar"), (clf, "classifier")):
        save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(folder / f"{name}.safetensors"))
    write_json({"class_names": names, "class_categories": categories, "class_short_names": short_names,
                "num_classes": len(names), "codebook_size": CODEBOOK, "grid": [grid, grid], "image_size": size,
                "class_token_offset": CODEBOOK, "null_class_id": CODEBOOK + len(names), "vq": vq_cfg.to_dict(),
                "llama": llama, "classifier": clf_cfg} | (extra or {}), folder / "config.json")
    real = torch.rand(40, 3, size, size) * 2 - 1
    save_file(reference_feature_states(clf.eval(), real), str(folder / REFERENCE_FILE))
    return folder


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A test module's tiny weights folder (:func:`make_tiny_weights`); ``from builtin_fixture import weights``."""
    return make_tiny_weights(tmp_path_factory.mktemp("weights"))


@pytest.fixture(scope="module")
def weights_8x8(tmp_path_factory):
    """Tiny weights of an 8 x 8 grid (64 tokens an image, 32 x 32 pixels): for runs whose test checks what a
    command or script does, not images of the shipped size; ``from builtin_fixture import weights_8x8``."""
    return make_tiny_weights(tmp_path_factory.mktemp("weights_8x8"), grid=8)


@pytest.fixture(scope="module")
def builtin(weights):
    """The built-in model class loaded from the module's tiny weights; ``from builtin_fixture import builtin``."""
    from csdgen.models.builtin import load_builtin_model

    return load_builtin_model(weights)
