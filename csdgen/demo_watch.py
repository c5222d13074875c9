"""One method decoded live for the demo: frames of the image filling in, with its token maps.

:func:`watch` runs the methods one after another on the same seed in a decoding thread and yields a
:class:`Frame` after every forward (``generate``'s ``callback``): the image decoded from the committed
tokens and the pending drafts (pending cells veiled), the acceptance map (:func:`token_maps`, the
colours of :data:`csdgen.evaluation.maps.COLOURS`) and the entropy map. The time spent drawing is
subtracted from the reported wall time.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

import csdgen
from csdgen.demo_inputs import METHOD_LABELS, DemoSettings
from csdgen.engine import StepInfo
from csdgen.evaluation.compare import method_presets
from csdgen.evaluation.maps import COLOURS, to_uint8
from csdgen.sampling import SamplingConfig


PENDING = (245, 245, 245)  #: colour of token cells not committed yet


COMMITTED = (150, 150, 150)  #: committed token whose decision the live view does not know yet


#: colour of token cells not committed yet in the entropy map: off its grey scale (a light grey there read as
#: an entropy near ln V)
ENTROPY_PENDING = (200, 220, 245)


_DISPLAY = 256  #: images narrower than this are upscaled (nearest neighbour) to about this width


class DemoCancelled(Exception):
    """Raised inside ``generate``'s callback to stop a run the page cancelled."""


@dataclass
class Frame:
    """What the page shows for one method at one moment: three ``[H, W, 3]`` uint8 arrays and a line."""

    image: np.ndarray
    acceptance: np.ndarray
    entropy: np.ndarray
    committed: int
    forwards: int


def _upscale(grid_rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """Token grid ``[rows, cols, C]`` -> ``[height, width, C]`` by nearest neighbour."""
    rows, cols = grid_rgb.shape[:2]
    row_of = np.arange(height) * rows // height
    col_of = np.arange(width) * cols // width
    return grid_rgb[row_of[:, None], col_of[None, :]]


def token_maps(decisions: torch.Tensor | None, entropy: torch.Tensor | None, committed: int, grid: tuple[int, int],
               vocab_size: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The acceptance map and the entropy map of one image, its first ``committed`` tokens decided.

    Args:
        decisions: ``[N]`` int :class:`~csdgen.Decision` codes (raster order), or None when not known
            yet (committed tokens drawn grey).
        entropy: ``[N]`` float, nats, or None (committed tokens drawn pending).
        committed: number of committed tokens (a raster prefix).
        grid: ``(rows, cols)``, ``rows * cols == N``.
        vocab_size: V; the entropy's grey level is ``H / ln V`` (black 0, white ``ln V`` nats).
        height, width: output size in pixels.

    Returns:
        Two ``[height, width, 3]`` uint8 arrays; token cells not committed are :data:`PENDING` (the acceptance
        map) and :data:`ENTROPY_PENDING` (the entropy map).
    """
    rows, cols = grid
    done = (np.arange(rows * cols) < committed).reshape(rows, cols)
    acceptance = np.empty((rows, cols, 3), dtype=np.uint8)
    acceptance[:] = PENDING
    if decisions is None:
        acceptance[done] = COMMITTED
    else:
        codes = decisions.reshape(rows, cols).cpu().numpy()
        for decision, colour in COLOURS.items():
            acceptance[done & (codes == int(decision))] = colour
    entropy_rgb = np.empty((rows, cols, 3), dtype=np.uint8)
    entropy_rgb[:] = ENTROPY_PENDING
    if entropy is not None:
        grey = (entropy.float().reshape(rows, cols).cpu() / math.log(vocab_size)).clamp(0, 1).numpy()
        entropy_rgb[done] = (np.round(grey * 255).astype(np.uint8)[..., None])[done]
    return _upscale(acceptance, height, width), _upscale(entropy_rgb, height, width)


#: the last finished image decoded: [model, tokens [N] int64 CPU, image] (a slow decoder runs once per image)
_LAST_FULL: list = [None, None, None]


def _partial_image(model, tokens: torch.Tensor, committed: int) -> np.ndarray:
    """``[H, W, 3]`` uint8: the image decoded from ``tokens [N]`` (committed + drafts), pending cells veiled.

    A model whose decoder is too slow to run at every frame (``live_preview = False``: GLM-Image's
    DiT) shows a blank canvas of its ``image_size`` until the last token is committed; the maps stay live.
    """
    rows, cols = model.grid
    if committed < rows * cols and not getattr(model, "live_preview", True):
        image = np.full((*model.image_size, 3), PENDING, dtype=np.uint8)
    elif (committed >= rows * cols and _LAST_FULL[0] is model and _LAST_FULL[1] is not None
          and torch.equal(_LAST_FULL[1], tokens.cpu())):
        image = _LAST_FULL[2]  # the finished image again (the last step's frame and the end frame): decode once
    else:
        image = to_uint8(model.decode_images(tokens[None].to(model.device)))[0]
        if committed >= rows * cols:
            _LAST_FULL[:] = [model, tokens.cpu().clone(), image]
    scale = max(1, _DISPLAY // image.shape[1])
    image = np.repeat(np.repeat(image, scale, axis=0), scale, axis=1)
    if committed < rows * cols:
        pending = _upscale((np.arange(rows * cols) >= committed).reshape(rows, cols)[..., None], *image.shape[:2])
        veiled = (0.3 * image + 0.7 * np.array(PENDING)).astype(np.uint8)
        image = np.where(pending, veiled, image)
    return image


def _frame(model, tokens: torch.Tensor, committed: int, forwards: int, decisions, entropy) -> Frame:
    image = _partial_image(model, tokens, committed)
    acceptance, entropy_map = token_maps(decisions, entropy, committed, model.grid, model.codebook_size, *image.shape[:2])
    return Frame(image, acceptance, entropy_map, committed, forwards)


def _run_one(model, settings: DemoSettings, key: str, preset: dict, sampling: SamplingConfig, cancel: threading.Event,
             emit: Callable[[tuple], None], min_interval: float) -> dict:
    """Run one method on one image, emitting ``("frame", key, Frame)`` while it decodes; returns its statistics row."""
    spent = {"preview": 0.0, "last": -math.inf}

    def callback(info: StepInfo) -> None:
        began = time.perf_counter()
        if cancel.is_set():
            raise DemoCancelled(key)
        committed = int(info.committed[0])
        if began - spent["last"] >= min_interval:
            emit(("frame", key, _frame(model, info.tokens[0], committed, info.step, info.decisions[0], info.entropy[0])))
            spent["last"] = time.perf_counter()
        spent["preview"] += time.perf_counter() - began

    options = dict(preset)
    if key == "ar":
        options["window"] = 1
    else:
        options.setdefault("window", settings.window)
    result = csdgen.generate(model, [settings.condition], seed=settings.seed, sampling=sampling, callback=callback, **options)
    stats = result.images[0]
    emit(("frame", key, _frame(model, result.tokens[0].cpu(), stats.num_tokens, stats.steps, stats.decisions, stats.entropy)))
    summary = stats.summary()
    return {
        "method": key,
        "forwards": stats.steps,
        "step_compression": stats.step_compression,
        "mean_accepted_length": stats.mean_accepted_length,
        "wall_s": max(0.0, result.seconds - spent["preview"]),
        "tokens": stats.num_tokens,
        **{k: v for k, v in summary.items() if k.startswith("tokens_")},
        "mean_entropy_nats": summary["mean_entropy_nats"],
        "window": result.settings.get("window"),
        "mean_width": sum(widths) / len(widths) if (widths := getattr(result, "widths", None)) else "",
        "lam": settings.lam if key.startswith("csd") else "",
        "delta": settings.delta if key.startswith("csd") else "",
        "guidance_scale": settings.guidance_scale,
        "seed": settings.seed,
        "condition": settings.label,
    }


def watch(model, settings: DemoSettings, sampling: SamplingConfig, cancel: threading.Event,
          min_interval: float = 0.15) -> Iterator[tuple]:
    """Run the chosen methods one after another in a worker thread; yield what the page shows.

    Yields ``("frame", method, Frame)`` while a method decodes (at most one per ``min_interval``
    seconds, plus its final frame), ``("done", method, row)`` when it ends, ``("error", message)``
    for an error a user can fix, and finally ``("end", rows)``. Setting ``cancel`` stops the
    running method at its next forward (``("cancelled", method)`` is yielded). Closing the iterator
    sets ``cancel``.
    """
    events: queue.Queue = queue.Queue()
    presets = method_presets(settings.lam, settings.delta, codebook=_codebook(model, settings.methods))

    def work() -> None:
        rows = []
        for key in settings.methods:
            try:
                rows.append(_run_one(model, settings, key, presets[key], sampling, cancel, events.put, min_interval))
            except DemoCancelled:
                events.put(("cancelled", key))
                return
            except (ValueError, NotImplementedError) as exc:
                events.put(("error", f"{METHOD_LABELS[key]}: {exc}"))
                return
            except Exception as exc:  # noqa: BLE001 -- shown on the page as one line, not a traceback
                events.put(("error", f"{METHOD_LABELS[key]} failed: {type(exc).__name__}: {exc}"))
                return
            events.put(("done", key, rows[-1]))
        events.put(("end", rows))

    thread = threading.Thread(target=work, name="csdgen-demo", daemon=True)
    thread.start()
    try:
        while True:
            event = events.get()
            yield event
            if event[0] in ("end", "error", "cancelled"):
                break
    finally:
        cancel.set()
        thread.join(timeout=60)


def _codebook(model, methods: list[str]):
    return model.codebook_embeddings() if {"gsd", "lantern"} & set(methods) else None
