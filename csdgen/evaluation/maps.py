"""Acceptance maps and image files: where in the image the speed came from.

An acceptance map shows, per image token, how it was decided (:class:`csdgen.Decision`) over
the target entropy at that token: the entropy as a grey level (black 0, white ``ln V``
nats), the decision as a colour laid over it.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch
from PIL import Image, ImageDraw

from csdgen.decisions import Decision

__all__ = ["COLOURS", "SIDE_BRANCH_COLOUR", "PANEL_TITLES", "to_uint8", "from_uint8", "acceptance_map", "save_png", "image_grid"]

COLOURS = {
    Decision.SAMPLED: (60, 110, 230),  # blue: plain or bonus sample
    Decision.ACCEPTED: (40, 180, 70),  # green: accepted draft (exact test)
    Decision.RELAXED: (250, 170, 20),  # orange: accepted only through the relaxation
    Decision.RESAMPLED: (220, 40, 40),  # red: rejected, resampled from the residual
}


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """Images ``[B, 3, H, W]`` float in [-1, 1] -> ``[B, H, W, 3]`` uint8."""
    return ((images.detach().float().clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).cpu().numpy()


def from_uint8(pixels) -> torch.Tensor:
    """8-bit pixels ``[B, H, W, 3]`` uint8 (numpy or torch; :func:`to_uint8`'s layout, a PNG's values) ->
    ``[B, 3, H, W]`` float32 in [-1, 1], as ``x / 127.5 - 1``, contiguous (a convolution over a permuted view
    rounds differently, so scores would depend on the layout)."""
    return torch.as_tensor(np.asarray(pixels)).permute(0, 3, 1, 2).contiguous().float() / 127.5 - 1


#: purple: a draft accepted from a side branch of a draft tree (``ImageStats.side_branch``)
SIDE_BRANCH_COLOUR = (150, 60, 200)

#: titles of the three panels of an acceptance map
PANEL_TITLES = ("image", "target entropy (nats)", "decisions")
TITLE_H = 14  #: pixels of the title strip above the panels
LEGEND_H = 28  #: pixels of the two legend rows below them (decision colours; entropy scale)


def acceptance_map(image: np.ndarray, decisions: torch.Tensor, entropy: torch.Tensor, grid: tuple[int, int],
                   vocab_size: int, scale: int = 2, side_branch: torch.Tensor | None = None) -> Image.Image:
    """Three titled panels side by side: the image, the target entropy, the decisions over the entropy.

    The entropy panel is a grey level from black (0 nats) to white (``ln V`` nats, the entropy
    of the uniform distribution over the codebook); a grey bar under it, labelled with both
    ends, is the scale. The decisions panel blends each decision's colour (:data:`COLOURS`)
    over that grey; the first legend row names the colours.

    Args:
        image: ``[H, W, 3]`` uint8.
        decisions: ``[N]`` int8 :class:`~csdgen.Decision` codes, raster order.
        entropy: ``[N]`` float, nats.
        grid: ``(rows, cols)`` with ``rows * cols == N``.
        vocab_size: V, to scale the entropy by ``ln V``.
        scale: upscaling factor of the image.
        side_branch: ``[N]`` bool (``ImageStats.side_branch`` of a run with a draft tree): those
            tokens are drawn in purple (:data:`SIDE_BRANCH_COLOUR`), "side branch" in the legend.

    Returns:
        An RGB ``PIL.Image`` of size ``(3 * W * scale + 8, TITLE_H + H * scale + LEGEND_H)``.
    """
    H, W = image.shape[0] * scale, image.shape[1] * scale
    top = TITLE_H
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
    canvas = Image.new("RGB", (3 * W + 8, top + H + LEGEND_H), "white")
    draw = ImageDraw.Draw(canvas)
    for i, (panel, title) in enumerate(zip(panels, PANEL_TITLES)):
        canvas.paste(panel, (i * (W + 4), top))
        draw.text((i * (W + 4) + 2, 1), title, fill="black")
    x, y = 2, top + H + 3
    for name, colour in legend:
        draw.rectangle([x, y, x + 8, y + 8], fill=colour)
        draw.text((x + 11, y - 2), name, fill="black")
        x += 11 + 7 * len(name) + 8
    # entropy scale under the entropy panel: 0 .. ln V nats
    y, x0 = top + H + 17, W + 4
    ramp = np.repeat(np.linspace(0, 255, W).astype(np.uint8)[None, :], 6, axis=0)
    canvas.paste(Image.fromarray(np.repeat(ramp[..., None], 3, axis=-1)), (x0, y))
    draw.text((x0 - 8, y - 3), "0", fill="black")
    draw.text((x0 + W + 6, y - 3), f"{math.log(vocab_size):.2f} nats = ln V", fill="black")
    return canvas


def save_png(image: Image.Image, path: str | os.PathLike) -> None:
    """Write a PNG atomically (temporary file, then rename): a killed run never leaves half a file."""
    from csdgen.atomic import write_atomic

    write_atomic(path, lambda tmp: image.save(tmp, format="PNG"))


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
