"""Acceptance maps and image files: where in the image the speed came from.

An acceptance map shows, per image token, how it was decided (:class:`csdgen.Decision`) over
the target entropy at that token: the entropy as a grey level (black 0, white ``ln V``
nats), the decision as a colour laid over it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from csdgen.decoding import Decision

__all__ = ["COLOURS", "SIDE_BRANCH_COLOUR", "to_uint8", "acceptance_map", "save_png", "image_grid"]

COLOURS = {
    Decision.SAMPLED: (60, 110, 230),  # blue: plain or bonus sample
    Decision.ACCEPTED: (40, 180, 70),  # green: accepted draft (exact test)
    Decision.RELAXED: (250, 170, 20),  # orange: accepted only through the relaxation
    Decision.RESAMPLED: (220, 40, 40),  # red: rejected, resampled from the residual
}
#: purple: a draft accepted from a side branch of a draft tree (``ImageStats.side_branch``)
SIDE_BRANCH_COLOUR = (150, 60, 200)


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """Images ``[B, 3, H, W]`` float in [-1, 1] -> ``[B, H, W, 3]`` uint8."""
    return ((images.detach().float().clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()


def acceptance_map(image: np.ndarray, decisions: torch.Tensor, entropy: torch.Tensor, grid: tuple[int, int],
                   vocab_size: int, scale: int = 2, side_branch: torch.Tensor | None = None) -> Image.Image:
    """Three panels side by side: the image, the target entropy, the decisions over the entropy.

    Args:
        image: ``[H, W, 3]`` uint8.
        decisions: ``[N]`` int8 :class:`~csdgen.Decision` codes, raster order.
        entropy: ``[N]`` float, nats.
        grid: ``(rows, cols)`` with ``rows * cols == N``.
        vocab_size: V, to scale the entropy by ``ln V``.
        scale: upscaling factor of the image.
        side_branch: ``[N]`` bool (``ImageStats.side_branch`` of a run with a draft tree): those
            tokens are drawn in purple, "side branch" in the legend; None: no such colour.

    Returns:
        An RGB ``PIL.Image`` of three panels and a legend line.
    """
    H, W = image.shape[0] * scale, image.shape[1] * scale
    grey = (entropy.float().reshape(grid) / math.log(vocab_size)).clamp(0, 1).numpy()
    grey_rgb = np.repeat((grey * 255).astype(np.uint8)[..., None], 3, axis=-1)
    colours = np.zeros((*grid, 3), dtype=np.uint8)
    codes = decisions.reshape(grid).numpy()
    for decision, colour in COLOURS.items():
        colours[codes == int(decision)] = colour
    legend = [(d.name.lower(), c) for d, c in COLOURS.items()]
    if side_branch is not None:
        colours[side_branch.reshape(grid).numpy().astype(bool)] = SIDE_BRANCH_COLOUR
        legend.append(("side branch", SIDE_BRANCH_COLOUR))
    blend = (0.4 * grey_rgb + 0.6 * colours).astype(np.uint8)
    panels = [Image.fromarray(image).resize((W, H), Image.NEAREST)] + [
        Image.fromarray(a).resize((W, H), Image.NEAREST) for a in (grey_rgb, blend)
    ]
    legend_h = 14
    canvas = Image.new("RGB", (3 * W + 8, H + legend_h), "white")
    for i, panel in enumerate(panels):
        canvas.paste(panel, (i * (W + 4), 0))
    draw = ImageDraw.Draw(canvas)
    x = 2
    for name, colour in legend:
        draw.rectangle([x, H + 3, x + 8, H + 11], fill=colour)
        draw.text((x + 11, H + 1), name, fill="black")
        x += 11 + 7 * len(name) + 8
    return canvas


def save_png(image: Image.Image, path: str | os.PathLike) -> None:
    """Write a PNG atomically (temporary file, then rename): a killed run never leaves half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    image.save(tmp, format="PNG")
    os.replace(tmp, path)


def image_grid(rows: list[list[np.ndarray]], labels: list[str] | None = None, scale: int = 1) -> Image.Image:
    """A grid of ``[H, W, 3]`` uint8 images, one list per row, with an optional label per row."""
    h, w = rows[0][0].shape[0] * scale, rows[0][0].shape[1] * scale
    label_w = 90 if labels else 0
    cols = max(len(r) for r in rows)
    canvas = Image.new("RGB", (label_w + cols * (w + 2), len(rows) * (h + 2)), "white")
    draw = ImageDraw.Draw(canvas)
    for i, row in enumerate(rows):
        if labels:
            draw.text((2, i * (h + 2) + h // 2 - 5), labels[i], fill="black")
        for j, img in enumerate(row):
            canvas.paste(Image.fromarray(img).resize((w, h), Image.NEAREST), (label_w + j * (w + 2), i * (h + 2)))
    return canvas
