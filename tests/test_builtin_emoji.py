"""The built-in model's emoji data (csdgen/builtin/emoji.py) on a tiny stand-in of the npm package.

The stand-in has emoji-datasource's layout (``emoji.json``, ``img/google/64/*.png``) and its
one known name clash: two entries called "MAN IN TUXEDO".
"""

import json

import numpy as np
import pytest
from PIL import Image

from csdgen.builtin import emoji
from csdgen.class_names import ClassNames


def entry(name, short, image, category, order, **extra):
    return {"name": name, "short_name": short, "short_names": [short, *extra.pop("more", [])], "image": image,
            "category": category, "sort_order": order, "has_img_google": True, **extra}


@pytest.fixture
def package(tmp_path):
    pkg = tmp_path / "package"
    img = pkg / "img" / "google" / "64"
    img.mkdir(parents=True)
    entries = [
        entry("RED APPLE", "apple", "1f34e.png", "Food & Drink", 3),
        entry("MAN IN TUXEDO", "person_in_tuxedo", "1f935.png", "People & Body", 0),
        entry("MAN IN TUXEDO", "man_in_tuxedo", "1f935-200d-2642.png", "People & Body", 1),
        entry("THUMBS UP SIGN", "+1", "1f44d.png", "People & Body", 2, more=["thumbsup"],
              skin_variations={"1F3FB": {"image": "1f44d-1f3fb.png", "has_img_google": True},
                               "1F3FF": {"image": "1f44d-1f3ff.png", "has_img_google": False}}),
        entry("FAMILY: MAN, BOY, BOY", "man-boy-boy", "1f468-200d-1f466.png", "People & Body", 4),
        entry("NO IMAGE", "none", "0000.png", "Symbols", 5, has_img_google=False),
    ]
    (pkg / "emoji.json").write_text(json.dumps(entries))
    for i, e in enumerate(entries[:5]):
        rgba = np.zeros((64, 64, 4), dtype=np.uint8)
        rgba[16:48, 16:48] = (10 * i, 100, 200, 255)  # an opaque square on a transparent background
        Image.fromarray(rgba).save(img / e["image"])
    Image.fromarray(np.full((64, 64, 4), 255, dtype=np.uint8)).save(img / "1f44d-1f3fb.png")
    return pkg


def test_one_unique_lower_case_name_per_base_emoji_in_sort_order(package):
    data = emoji.load_emoji(package)
    assert data.names == ["person in tuxedo", "man in tuxedo", "thumbs up sign", "red apple", "family: man, boy, boy"]
    assert data.categories == ["People & Body"] * 3 + ["Food & Drink", "People & Body"]
    assert data.short_names == [["person_in_tuxedo"], ["man_in_tuxedo"], ["+1", "thumbsup"], ["apple"], ["man-boy-boy"]]
    assert data.labels.tolist() == [0, 1, 2, 2, 3, 4]  # the one skin-tone variant with an image: class 2 again
    assert data.images.shape == (6, 64, 64, 3) and data.images.dtype == np.uint8
    assert (data.images[:, 0, 0] == 255).all()  # transparent corners composited on white
    assert len(ClassNames(data.names, data.categories, data.short_names)) == 5  # names the model can take


def test_names_that_stay_equal_are_refused():
    same = [{"name": "A", "short_name": "x"}, {"name": "A", "short_name": "x"}]
    with pytest.raises(ValueError, match="not unique"):
        emoji.class_names(same)


def test_update_config_rewrites_names_and_short_names_of_trained_weights(package, tmp_path):
    """Weights trained by the first emoji train.py carry "man in tuxedo" twice and no short names."""
    folder = tmp_path / "weights"
    folder.mkdir()
    old = {"num_classes": 5, "class_names": ["man in tuxedo", "man in tuxedo", "thumbs up sign", "red apple",
                                             "family: man, boy, boy"],
           "class_categories": ["People & Body"] * 3 + ["Food & Drink", "People & Body"], "codebook_size": 1024}
    (folder / "config.json").write_text(json.dumps(old))
    new = emoji.update_config(folder, package)
    assert json.loads((folder / "config.json").read_text()) == new
    assert new["class_names"][:2] == ["person in tuxedo", "man in tuxedo"] and new["codebook_size"] == 1024
    assert new["class_short_names"][3] == ["apple"]
    (folder / "config.json").write_text(json.dumps({**old, "num_classes": 4, "class_names": old["class_names"][:4]}))
    with pytest.raises(ValueError, match="are not the 5 emoji"):
        emoji.update_config(folder, package)
