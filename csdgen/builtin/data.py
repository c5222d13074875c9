"""Training data for the built-in model: random crops of bundled photographs.

Training-time only: imports scikit-image and scikit-learn (``pip install -e .[train]``),
which are not runtime dependencies of csdgen. Each of the 20 photographs that ship inside
the scikit-image and scikit-learn wheels (no download needed) is one class.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

SKIMAGE_NAMES = (
    "astronaut", "brick", "camera", "cell", "chelsea", "clock", "coffee", "coins",
    "colorwheel", "grass", "gravel", "hubble_deep_field", "immunohistochemistry",
    "moon", "page", "retina", "rocket", "text",
)
SKLEARN_NAMES = ("china", "flower")
CLASS_NAMES: tuple[str, ...] = tuple(sorted(SKIMAGE_NAMES + SKLEARN_NAMES))
IMAGE_SIZE = 64
CROP_RANGE = (0.15, 0.6)
TRAIN_SEED = 1234
HELDOUT_SEED = 98765


def _to_rgb(arr: np.ndarray) -> np.ndarray:
    """uint8 [H, W] or [H, W, 3|4] -> uint8 [H, W, 3]."""
    if arr.ndim == 2:
        arr = np.stack([arr] * 3, axis=-1)
    return np.ascontiguousarray(arr[..., :3]).astype(np.uint8)


def load_photos() -> dict[str, np.ndarray]:
    """Load all source photos offline, keyed by class name (uint8 [H, W, 3])."""
    import skimage.data
    from sklearn.datasets import load_sample_images

    photos = {name: _to_rgb(getattr(skimage.data, name)()) for name in SKIMAGE_NAMES}
    sample = load_sample_images()
    for fname, img in zip(sample.filenames, sample.images):
        name = fname.replace("\\", "/").rsplit("/", 1)[-1].split(".")[0]
        photos[name] = _to_rgb(img)
    return {name: photos[name] for name in CLASS_NAMES}


def _random_crop(photo: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    """One random square crop (side 0.15-0.6 of the short side), flipped with p=0.5,
    resized with PIL bicubic to ``size`` px. Returns uint8 [size, size, 3]."""
    h, w = photo.shape[:2]
    side = int(round(rng.uniform(*CROP_RANGE) * min(h, w)))
    y = int(rng.integers(0, h - side + 1))
    x = int(rng.integers(0, w - side + 1))
    crop = photo[y:y + side, x:x + side]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    img = Image.fromarray(np.ascontiguousarray(crop)).resize((size, size), Image.BICUBIC)
    return np.asarray(img)


def make_crops(n: int, seed: int, size: int = IMAGE_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """Build ``n`` crops balanced over classes (class = i mod num_classes).

    Returns (images float32 [n, 3, size, size] in [-1, 1], labels int64 [n]).
    Deterministic for a given seed.
    """
    photos = load_photos()
    rng = np.random.default_rng(seed)
    arrays = [photos[name] for name in CLASS_NAMES]
    labels = np.arange(n) % len(CLASS_NAMES)
    rng.shuffle(labels)
    out = np.empty((n, size, size, 3), dtype=np.uint8)
    for i, c in enumerate(labels):
        out[i] = _random_crop(arrays[c], rng, size)
    images = torch.from_numpy(out).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
    return images.contiguous(), torch.from_numpy(labels).long()


def build_datasets(n_train: int = 14000, n_heldout: int = 800):
    """Train and held-out crops (different seeds, same photos).

    Returns ((train_images, train_labels), (heldout_images, heldout_labels)); see make_crops.
    """
    return make_crops(n_train, TRAIN_SEED), make_crops(n_heldout, HELDOUT_SEED)
