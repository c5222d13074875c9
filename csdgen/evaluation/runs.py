"""Many images in batches, each image with its own random stream so a run can resume and methods line up.

Image ``i`` belongs to batch ``i // batch_size`` and is generated with the run's seed and
``image_indices`` holding ``i`` (:func:`csdgen.generate`): its random stream is keyed by
``(seed, i)``, so with a fixed window image ``i`` is the same whatever the batch size, two runs
with the same seed and classes give every method the same conditions and random streams, and a
resumed run regenerates exactly the images it lacks. (``window="auto"`` steers its widths by
measured times: the same distribution, not the same tokens.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import csdgen
from csdgen.decoding import GenerationResult

__all__ = ["batch_seed", "batches", "generate_batches", "write_json"]


def batch_seed(seed: int, batch_index: int) -> int:
    """A seed per batch (kept for callers of the old per-batch scheme; runs use per-image streams now)."""
    return seed * 100_003 + batch_index


def batches(num_images: int, batch_size: int) -> list[list[int]]:
    """Image indices per batch: ``[[0..bs-1], [bs..2bs-1], ...]``."""
    return [list(range(start, min(start + batch_size, num_images))) for start in range(0, num_images, batch_size)]


def generate_batches(
    model,
    classes: list,
    *,
    batch_size: int,
    seed: int,
    skip: Callable[[list[int]], bool] = lambda indices: False,
    callback=None,
    **generate_kwargs: Any,
) -> Iterator[tuple[list[int], GenerationResult]]:
    """Generate ``len(classes)`` images batch by batch, yielding ``(indices, result)`` per batch.

    Args:
        model: an image-token model.
        classes: one condition per image.
        batch_size: images per ``generate`` call.
        seed: run seed; image ``i`` draws from the stream ``(seed, i)``.
        skip: returns True for a batch that is already done (resume).
        callback: passed to :func:`csdgen.generate`.
        generate_kwargs: method, window, sampling, draft_init, refresh.
    """
    for indices in batches(len(classes), batch_size):
        if skip(indices):
            continue
        result = csdgen.generate(model, [classes[i] for i in indices], seed=seed, image_indices=indices, callback=callback,
                                 **generate_kwargs)
        yield indices, result


def write_json(obj: Any, path: str | os.PathLike) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)
