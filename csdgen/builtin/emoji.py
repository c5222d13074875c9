"""Training data of the built-in model: the Noto emoji of the npm package emoji-datasource-google.

Training-time only (never imported at run time). ``fetch_package`` runs ``npm pack
emoji-datasource-google@16.0.0`` into a cache folder (no other download); the package holds
1,911 emoji as 64 x 64 RGBA PNGs (``img/google/64/``, plus 1,875 skin-tone variants) and
their names in ``emoji.json``. Licences: the Noto emoji images are Apache-2.0
(googlefonts/noto-emoji); the package's data files are MIT (Cal Henderson).

One class per base emoji, named by its Unicode name in lower case ("red apple", "dog face");
skin-tone variants are extra samples of their base class. Images are composited on white.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

PACKAGE = "emoji-datasource-google"
VERSION = "16.0.0"
IMAGE_SIZE = 64
TRAIN_SEED = 1234
HELDOUT_SEED = 98765


def cache_dir() -> Path:
    """Folder the npm package is unpacked into: $CSDGEN_CACHE or ~/.cache/csdgen."""
    root = os.environ.get("CSDGEN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "csdgen")
    return Path(root) / f"{PACKAGE}-{VERSION}"


def fetch_package(folder: Path | None = None) -> Path:
    """Unpacked package folder (``.../package``), fetched with ``npm pack`` on first use.

    Raises:
        RuntimeError: npm is missing or ``npm pack`` failed (its message is included).
    """
    folder = folder or cache_dir()
    pkg = folder / "package"
    if (pkg / "emoji.json").is_file():
        return pkg
    folder.mkdir(parents=True, exist_ok=True)
    if shutil.which("npm") is None:
        raise RuntimeError("npm not found: the built-in model's training data comes from "
                           f"`npm pack {PACKAGE}@{VERSION}`; install Node.js and npm")
    proc = subprocess.run(["npm", "pack", f"{PACKAGE}@{VERSION}", "--silent"], cwd=folder,
                          capture_output=True, text=True)
    tgz = folder / f"{PACKAGE}-{VERSION}.tgz"
    if proc.returncode != 0 or not tgz.is_file():
        raise RuntimeError(f"npm pack {PACKAGE}@{VERSION} failed in {folder}: {proc.stderr.strip()}")
    tmp = folder / "unpack.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(tgz) as tar:
        tar.extractall(tmp, filter="data")
    os.replace(tmp / "package", pkg)
    shutil.rmtree(tmp, ignore_errors=True)
    tgz.unlink()
    return pkg


@dataclass
class EmojiSet:
    """Class names and images of the emoji, before augmentation.

    names: one per class, lower case, unique; categories: the package's category per class;
    short_names: the package's short names per class (``["apple"]`` for "red apple"), the
    aliases ``--class`` accepts; images: uint8 [M, 64, 64, 3] (on white), labels: int64 [M]
    class of each image (M >= number of classes: skin-tone variants are extra images of their
    base class).
    """

    names: list[str]
    categories: list[str]
    images: np.ndarray
    labels: np.ndarray
    short_names: list[list[str]] = field(default_factory=list)


def class_names(entries: list[dict]) -> list[str]:
    """Lower-case Unicode names of emoji.json entries, made unique.

    The package gives two emoji the name "MAN IN TUXEDO" (``person_in_tuxedo`` and
    ``man_in_tuxedo``); every entry whose name is shared takes its first short name with
    spaces instead ("person in tuxedo", "man in tuxedo").

    Raises:
        ValueError: names still not unique after that (naming them).
    """
    names = [" ".join(e["name"].lower().split()) for e in entries]
    counts = Counter(names)
    names = [e["short_name"].replace("_", " ").lower() if counts[n] > 1 else n for n, e in zip(names, entries)]
    clash = sorted(n for n, k in Counter(names).items() if k > 1)
    if clash:
        raise ValueError(f"emoji names still not unique after using short names: {clash}")
    return names


def base_entries(pkg: Path) -> list[dict]:
    """emoji.json's entries that have a Google image, in the package's sort order (one per class)."""
    entries = sorted(json.loads((pkg / "emoji.json").read_text()), key=lambda e: e["sort_order"])
    img_dir = pkg / "img" / "google" / "64"
    return [e for e in entries if e.get("has_img_google", True) and (img_dir / e["image"]).is_file()]


def on_white(path: Path) -> np.ndarray:
    """RGBA PNG -> uint8 [64, 64, 3] composited on a white background."""
    img = Image.open(path).convert("RGBA")
    if img.size != (IMAGE_SIZE, IMAGE_SIZE):
        img = img.resize((IMAGE_SIZE, IMAGE_SIZE), Image.LANCZOS)
    white = Image.new("RGBA", img.size, (255, 255, 255, 255))
    return np.asarray(Image.alpha_composite(white, img).convert("RGB"))


def load_emoji(pkg: Path | None = None, variants: bool = True) -> EmojiSet:
    """All base emoji (sorted by the package's sort order) and, with ``variants``, their
    skin-tone variants as extra images of the same class."""
    pkg = pkg or fetch_package()
    entries = base_entries(pkg)
    img_dir = pkg / "img" / "google" / "64"
    images, labels = [], []
    for c, entry in enumerate(entries):
        images.append(on_white(img_dir / entry["image"]))
        labels.append(c)
        if variants:
            for var in (entry.get("skin_variations") or {}).values():
                if var.get("has_img_google", True) and (img_dir / var["image"]).is_file():
                    images.append(on_white(img_dir / var["image"]))
                    labels.append(c)
    return EmojiSet(class_names(entries), [e["category"] for e in entries], np.stack(images),
                    np.asarray(labels, dtype=np.int64), [list(e.get("short_names") or []) for e in entries])


def update_config(weights_dir: Path, pkg: Path | None = None) -> dict:
    """Rewrite the class names and short names of a trained model's ``config.json`` from the package.

    For weights trained before names were made unique (:func:`class_names`) or before
    ``class_short_names`` was written: the classes must be the package's, in the same order
    (checked by count and category); only ``class_names`` and ``class_short_names`` change.
    Atomic write. Returns the new config.

    Raises:
        ValueError: the config's classes are not the package's (count or categories differ).
    """
    path = Path(weights_dir) / "config.json"
    config = json.loads(path.read_text())
    entries = base_entries(pkg or fetch_package())
    cats = [e["category"] for e in entries]
    if len(entries) != config["num_classes"] or cats != config.get("class_categories", cats):
        raise ValueError(f"{path}: its {config['num_classes']} classes are not the {len(entries)} emoji of "
                         f"{PACKAGE}@{VERSION} in the package's order")
    config["class_names"] = class_names(entries)
    config["class_short_names"] = [list(e.get("short_names") or []) for e in entries]
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return config


def augment(image: np.ndarray, rng: np.random.Generator, p_identity: float = 0.3,
            scale: tuple[float, float] = (0.8, 1.0)) -> np.ndarray:
    """One augmented view: with probability ``p_identity`` the emoji as released, else
    shrunk by a factor in ``scale`` (bicubic) and pasted on white at a random offset that keeps
    it inside the 64 x 64 frame. No flips (arrows and text would change meaning).
    uint8 [64, 64, 3] -> uint8 [64, 64, 3]."""
    if rng.random() < p_identity:
        return image
    side = int(round(rng.uniform(*scale) * IMAGE_SIZE))
    if side >= IMAGE_SIZE:
        return image
    small = np.asarray(Image.fromarray(image).resize((side, side), Image.BICUBIC))
    out = np.full_like(image, 255)
    y, x = (int(v) for v in rng.integers(0, IMAGE_SIZE - side + 1, size=2))
    out[y:y + side, x:x + side] = small
    return out


def make_views(data: EmojiSet, per_class: int, seed: int, uint8: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` augmented views of every class (a uniformly chosen image of the class,
    so skin-tone variants do not outweigh other classes), shuffled.

    Returns (images float32 [C * per_class, 3, 64, 64] in [-1, 1], or with ``uint8`` the same
    views as uint8 [C * per_class, 3, 64, 64] (a quarter of the memory), labels int64
    [C * per_class]). Deterministic for a given seed.
    """
    rng = np.random.default_rng(seed)
    n_cls = len(data.names)
    members = [np.flatnonzero(data.labels == c) for c in range(n_cls)]
    labels = np.repeat(np.arange(n_cls), per_class)
    rng.shuffle(labels)
    out = np.empty((len(labels), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for i, c in enumerate(labels):
        out[i] = augment(data.images[rng.choice(members[c])], rng)
    images = torch.from_numpy(out).permute(0, 3, 1, 2)
    if not uint8:
        images = images.float().div(127.5).sub(1.0)
    return images.contiguous(), torch.from_numpy(labels).long()


def read_class_list(path: Path) -> list[str]:
    """Class names from a JSON file: a list of names, or an object whose ``"classes"`` is one
    (``csdgen/builtin/classes.json``).

    Raises:
        ValueError: the file is not such JSON, or a name is not a non-empty string, or repeats.
    """
    path = Path(path)
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"class list {path}: cannot read it as JSON ({exc})") from None
    names = obj.get("classes") if isinstance(obj, dict) else obj
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise ValueError(f"class list {path}: expected a non-empty JSON list of names, or an object "
                         f"with one under \"classes\"")
    repeated = sorted(n for n, k in Counter(names).items() if k > 1)
    if repeated:
        raise ValueError(f"class list {path}: names given twice: {repeated}")
    return names


def select_classes(data: EmojiSet, names: list[str]) -> EmojiSet:
    """The classes ``names`` of ``data`` (in ``data``'s order), with their images relabelled
    0 .. len(names) - 1.

    Raises:
        ValueError: a name is not a class of ``data`` (naming it and the closest class names).
    """
    import difflib

    index = {n: c for c, n in enumerate(data.names)}
    for n in names:
        if n not in index:
            close = difflib.get_close_matches(n, data.names, n=3, cutoff=0.5)
            raise ValueError(f"unknown class {n!r} in the class list (no emoji has that name"
                             + (f"; closest: {', '.join(repr(c) for c in close)})" if close else ")"))
    keep = sorted(index[n] for n in names)
    remap = np.full(len(data.names), -1, dtype=np.int64)
    remap[keep] = np.arange(len(keep))
    rows = remap[data.labels] >= 0
    return EmojiSet([data.names[c] for c in keep], [data.categories[c] for c in keep],
                    data.images[rows], remap[data.labels[rows]],
                    [list(data.short_names[c]) for c in keep] if data.short_names else [])


def main(argv=None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="the built-in model's emoji data")
    parser.add_argument("--update-config", type=Path, metavar="WEIGHTS_DIR", required=True,
                        help="rewrite class_names and class_short_names of WEIGHTS_DIR/config.json from the package")
    args = parser.parse_args(argv)
    config = update_config(args.update_config)
    print(f"{args.update_config / 'config.json'}: {len(config['class_names'])} unique class names, "
          f"{sum(map(len, config['class_short_names']))} short names")


if __name__ == "__main__":
    main()
