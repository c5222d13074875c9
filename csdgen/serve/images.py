"""Image tokens -> PNG bytes for the server's answers: final images and partial ones.

Each image is decoded alone (``model.decode_images`` on ``[1, N]``), as ``csdgen generate``
writes its files (:func:`csdgen.runs.pil_images`): a pixel never depends on which other images
were decoded with it, so two replicas, or the server and an offline run, give the same bytes
for the same tokens. PNG is lossless and written without a timestamp, so equal tokens give
equal files.
"""

from __future__ import annotations

import io

import numpy as np
import torch

__all__ = ["png_bytes", "partial_png", "image_size"]

#: colour the cells not committed yet are veiled towards in a partial image
PENDING = np.array([245, 245, 245], dtype=np.float64)


def _pixels(model, tokens: torch.Tensor) -> np.ndarray:
    """``[H, W, 3]`` uint8 of one image's tokens ``[N]``."""
    from csdgen.evaluation.maps import to_uint8

    with torch.no_grad():
        return to_uint8(model.decode_images(tokens.reshape(1, -1).to(model.device)))[0]


def _png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def png_bytes(model, tokens: torch.Tensor) -> bytes:
    """PNG of one image's tokens ``[N]`` int64 (the model's own size)."""
    return _png(_pixels(model, tokens))


def partial_png(model, tokens: torch.Tensor, committed: int) -> bytes:
    """PNG of an image being decoded: ``tokens [N]`` (committed tokens, then pending drafts)
    decoded whole, the token cells at raster positions ``>= committed`` veiled (70 % light grey)."""
    image = _pixels(model, tokens)
    rows, cols = model.grid
    if committed < rows * cols:
        pending = (np.arange(rows * cols) >= committed).reshape(rows, cols)
        height, width = image.shape[:2]
        cell = pending[np.arange(height) * rows // height][:, np.arange(width) * cols // width]
        veiled = (0.3 * image + 0.7 * PENDING).round().astype(np.uint8)
        image = np.where(cell[..., None], veiled, image)
    return _png(image)


def image_size(model) -> tuple[int, int]:
    """``(width, height)`` in pixels of the model's images (one decode of an all-zero image).

    Raises:
        ValueError: the model has no image decoder.
    """
    try:
        pixels = _pixels(model, torch.zeros(model.num_image_tokens, dtype=torch.long))
    except NotImplementedError as exc:
        raise ValueError(f"csdgen serve answers with PNG images, but {exc}") from None
    return int(pixels.shape[1]), int(pixels.shape[0])
