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
from dataclasses import dataclass
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
    images: uint8 [M, 64, 64, 3] (on white), labels: int64 [M] class of each image
    (M >= number of classes: skin-tone variants are extra images of their base class).
    """

    names: list[str]
    categories: list[str]
    images: np.ndarray
    labels: np.ndarray


def class_name(entry: dict, taken: set[str]) -> str:
    """Lower-case Unicode name of an emoji.json entry; on a clash (the package names two
    emoji "MAN IN TUXEDO") the short name with spaces is used instead."""
    name = " ".join(entry["name"].lower().split())
    if name in taken:
        name = entry["short_name"].replace("_", " ").lower()
    return name


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
    entries = sorted(json.loads((pkg / "emoji.json").read_text()), key=lambda e: e["sort_order"])
    img_dir = pkg / "img" / "google" / "64"
    names, cats, images, labels, taken = [], [], [], [], set()
    for entry in entries:
        if not entry.get("has_img_google", True) or not (img_dir / entry["image"]).is_file():
            continue
        c = len(names)
        name = class_name(entry, taken)
        taken.add(name)
        names.append(name)
        cats.append(entry["category"])
        images.append(on_white(img_dir / entry["image"]))
        labels.append(c)
        if variants:
            for var in (entry.get("skin_variations") or {}).values():
                if var.get("has_img_google", True) and (img_dir / var["image"]).is_file():
                    images.append(on_white(img_dir / var["image"]))
                    labels.append(c)
    return EmojiSet(names, cats, np.stack(images), np.asarray(labels, dtype=np.int64))


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


def make_views(data: EmojiSet, per_class: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` augmented views of every class (a uniformly chosen image of the class,
    so skin-tone variants do not outweigh other classes), shuffled.

    Returns (images float32 [C * per_class, 3, 64, 64] in [-1, 1], labels int64 [C * per_class]).
    Deterministic for a given seed.
    """
    rng = np.random.default_rng(seed)
    n_cls = len(data.names)
    members = [np.flatnonzero(data.labels == c) for c in range(n_cls)]
    labels = np.repeat(np.arange(n_cls), per_class)
    rng.shuffle(labels)
    out = np.empty((len(labels), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for i, c in enumerate(labels):
        out[i] = augment(data.images[rng.choice(members[c])], rng)
    images = torch.from_numpy(out).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
    return images.contiguous(), torch.from_numpy(labels).long()
