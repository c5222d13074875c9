"""Runs of many images and their records: batches, seeds, files written as batches finish, resuming.

The one module that ``csdgen generate`` / ``compare`` / ``sweep`` and the API's
:func:`save_run` share, so that the command line and the library write the same files:

* :func:`batches` / :func:`generate_batches`: images in batches of ``batch_size``; image ``i``
  of a run seeded ``seed`` draws from its own random stream keyed by ``(seed, i)``
  (:func:`csdgen.generate`'s ``image_indices``), so with a fixed window the batch size never
  changes an image: a run resumed with another batch size (say after running out of memory)
  completes the same images, and every method of a comparison sees the same random streams.
* :func:`run_plan` / :func:`save_run`: decode, write ``NNNN_<label>.png`` (and
  ``NNNN_<label>_map.png``) for each image and rewrite ``record.json`` after every batch; a
  rerun into the same folder keeps the images already written and generates the others
  (resume), and refuses other settings, naming the values that differ.
* :func:`run_methods`: several methods over the same images, interleaved batch by batch after
  an untimed warm-up, each cached in the output folder (``run_<name>.json`` + ``.safetensors``,
  rewritten after every batch; other settings refused): what ``compare`` and ``sweep`` run.
* :func:`read_json` / :func:`write_json` (from :mod:`csdgen.jsonio`, re-exported here): JSON files
  read with errors that name the file, written atomically.

``record.json`` holds: ``csdgen_version``; ``created`` and ``updated`` (UTC, ISO 8601);
``settings``; ``totals`` (images, tokens, steps summed over images, mean step compression,
decoding seconds summed over every batch of every run that wrote the kept images, number of
runs); ``batches`` (per batch: image indices, decoding seconds, finish time); ``images``
(per image: file, condition, batch, statistics of :meth:`csdgen.ImageStats.summary`).
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .jsonio import read_json, write_json

__all__ = [
    "batches",
    "generate_batches",
    "read_json",
    "write_json",
    "pil_images",
    "MAX_SCALE",
    "check_scale",
    "builtin_bytes_per_image",
    "builtin_batch_limit",
    "RunPlan",
    "RunSummary",
    "settings_difference",
    "run_settings",
    "MethodRun",
    "MethodJob",
    "run_methods",
    "run_method",
    "run_plan",
    "save_run",
    "slug",
]


def batches(indices: int | Sequence[int], batch_size: int) -> list[list[int]]:
    """Image indices per batch: ``indices`` (or ``range(indices)``) cut into runs of ``batch_size``."""
    indices = list(range(indices)) if isinstance(indices, int) else list(indices)
    return [indices[start:start + batch_size] for start in range(0, len(indices), batch_size)]


def generate_batches(model, conditions: Sequence, *, batch_size: int, seed: int, indices: Sequence[int] | None = None,
                     callback=None, **generate_kwargs: Any) -> Iterator[tuple[list[int], Any]]:
    """Generate images batch by batch, yielding ``(indices, GenerationResult)`` per batch.

    Args:
        model: an image-token model.
        conditions: one condition per image of the run (class ids, prompts).
        batch_size: images per :func:`csdgen.generate` call; does not change the images.
        seed: run seed; image ``i`` draws from the random stream keyed by ``(seed, i)``.
        indices: the images to generate (default all; a resumed run passes the missing ones).
        callback: passed to :func:`csdgen.generate`.
        generate_kwargs: method, window, sampling, draft_init, refresh.
    """
    from csdgen.engine import generate

    for batch in batches(len(conditions) if indices is None else indices, batch_size):
        result = generate(model, [conditions[i] for i in batch], seed=seed, image_indices=batch, callback=callback,
                          **generate_kwargs)
        yield batch, result


#: the largest PNG upscaling (``scale``) of :func:`pil_images` / :func:`save_run`: 16 turns the built-in model's
#: 64 x 64 images into 1024 x 1024 (a 1024-pixel checkpoint's into 16384 x 16384)
MAX_SCALE = 16


def check_scale(scale) -> int:
    """``scale`` if it is an integer in ``1 .. MAX_SCALE``, else one ValueError line naming it.

    Raises:
        ValueError: ``"scale=0: allowed an integer in 1..16 (...)"``.
    """
    if isinstance(scale, bool) or not isinstance(scale, int) or not 1 <= scale <= MAX_SCALE:
        raise ValueError(f"scale={scale!r}: allowed an integer in 1..{MAX_SCALE} (nearest-neighbour upscaling of the "
                         f"images; {MAX_SCALE} turns 64 x 64 pixels into {64 * MAX_SCALE} x {64 * MAX_SCALE})")
    return scale


def pil_images(model, result_or_tokens, scale: int = 1, conditions=None) -> list:
    """Decoded images as ``PIL.Image.Image`` (RGB), one per image of a run.

    Args:
        model: the model that generated the tokens (its ``decode_images``).
        result_or_tokens: a :class:`csdgen.GenerationResult` or image tokens ``[B, N]`` int64.
        scale: integer upscaling by nearest neighbour, 1 .. :data:`MAX_SCALE` (16) (the CLI saves the
            built-in model's 64 x 64 images at ``scale=2``, i.e. 128 x 128 pixels).
        conditions: the images' conditions, for a decoder that reads the prompt (GLM-Image's).

    Raises:
        TypeError: ``result_or_tokens`` is neither (e.g. None), naming what was given.
        ValueError: ``scale`` not an integer in 1 .. :data:`MAX_SCALE` (checked before decoding).
    """
    import torch

    check_scale(scale)
    tokens = getattr(result_or_tokens, "tokens", result_or_tokens)
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
        what = type(tokens).__name__ if not isinstance(tokens, torch.Tensor) else f"a tensor of shape {list(tokens.shape)}"
        raise TypeError(f"pil_images: got {what}; allowed: a GenerationResult (csdgen.generate's) or image tokens "
                        f"[B, N] int64")
    return _to_pil(_decode(model, tokens, conditions), scale)


def _decode(model, tokens, conditions=None):
    """``[B, H, W, 3]`` uint8, decoded image by image: a pixel never depends on the batch it was decoded in
    (batched convolutions round differently), so the files do not depend on the batch size.

    A model whose decoder reads the prompt too (``decode_takes_prompts``: GLM-Image's glyph encoder)
    gets each image's condition when it is a prompt string."""
    import numpy as np

    from csdgen.evaluation.maps import to_uint8

    def one(i):
        if conditions is not None and getattr(model, "decode_takes_prompts", False) and isinstance(conditions[i], str):
            return model.decode_images(tokens[i : i + 1], prompts=[conditions[i]])
        return model.decode_images(tokens[i : i + 1])

    return np.concatenate([to_uint8(one(i)) for i in range(len(tokens))])


def _to_pil(pixels, scale: int) -> list:
    from PIL import Image

    images = [Image.fromarray(p) for p in pixels]
    if scale != 1:
        images = [im.resize((im.width * scale, im.height * scale), Image.NEAREST) for im in images]
    return images


def builtin_bytes_per_image(model, window: int, guided: bool) -> int:
    """Estimated decoding memory of one image of the built-in model (a ``ClassConditionalLlama``), in bytes.

    float32: the KV cache, ``2 * layers * hidden * (1 + N + W)`` values per sequence, plus one
    window's logits and probabilities (``4 * W * V``), attention scores
    (``heads * W * (1 + N + W)``) and MLP activations (``4 * W * intermediate``); two
    sequences per image with guidance.
    """
    cfg = model.backbone.config
    N, V, W = model.num_image_tokens, cfg.vocab_size, window
    per_sequence = 4 * (2 * cfg.num_hidden_layers * cfg.hidden_size * (1 + N + W) + 4 * W * V
                        + cfg.num_attention_heads * W * (1 + N + W) + 4 * W * cfg.intermediate_size)
    return per_sequence * (2 if guided else 1)


def builtin_batch_limit(model, window: int, guided: bool, available_bytes: int, share: float = 0.5) -> int:
    """Largest batch of the built-in model that fits in ``share`` of ``available_bytes`` (at least 1);
    see :func:`builtin_bytes_per_image`."""
    return max(1, int(share * available_bytes // builtin_bytes_per_image(model, window, guided)))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: obj}


def settings_difference(previous: dict, current: dict) -> list[str]:
    """``"key: A there, B here"`` for every (nested, dotted) setting whose value differs."""
    old, new = _flatten(previous), _flatten(current)
    missing = object()
    lines = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, missing), new.get(key, missing)
        if a != b:
            if isinstance(a, str) and isinstance(b, str) and max(len(a), len(b)) > 60:
                a, b = _differing_part(a, b)
            there = "unset" if a is missing else json.dumps(a)
            here = "unset" if b is missing else json.dumps(b)
            lines.append(f"{key}: {there} there, {here} here")
    return lines


def _differing_part(a: str, b: str) -> tuple[str, str]:
    """Two long strings cut to the part that differs, from the separator (``, ( {``) before
    it to the one after it, with ``...`` for what both share (a recorded ``SamplingConfig(...)``
    or method repr differs in one field: ``"...temperature=1.0..."`` instead of 200 characters)."""
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[len(a) - 1 - end] == b[len(b) - 1 - end]:
        end += 1
    separators = ",({"
    cut = max((a.rfind(c, 0, start) for c in separators), default=-1) + 1
    tail_a = min([i for i in (a.find(c, len(a) - end) for c in ",)}") if i >= 0] or [len(a)])
    tail_b = min([i for i in (b.find(c, len(b) - end) for c in ",)}") if i >= 0] or [len(b)])
    def part(text, stop):
        return ("..." if cut > 0 else "") + text[cut:stop].strip() + ("..." if stop < len(text) else "")
    return part(a, tail_a), part(b, tail_b)


@dataclass
class RunPlan:
    """What a run generates and writes, for one model.

    Attributes:
        model: the image-token model.
        conditions: one condition per image (what ``model.start`` takes).
        names: file stem per image (``NNNN_<label>``).
        labels: per image, what the record stores as its condition (``{"class": ...}`` / ``{"prompt": ...}``).
        settings: everything that determines the images (compared on resume, resolved: :func:`run_settings`;
            a ``preset`` name is kept for information, not compared).
        generate_kwargs: method, window, sampling, draft_init, refresh for :func:`csdgen.generate`.
        scale: PNG upscaling factor (nearest neighbour).
    """

    model: Any
    conditions: list
    names: list[str]
    labels: list[dict]
    settings: dict
    generate_kwargs: dict
    scale: int = 1


@dataclass
class RunSummary:
    """What :func:`save_run` leaves in its folder, in figures."""

    out: Path
    images: int  #: images in the folder (kept + new)
    resumed: int  #: images kept from an earlier run
    tokens: int
    steps: int  #: forwards per image, summed over images
    step_compression: float  #: mean over images
    decode_seconds: float  #: decoding time of every batch that produced the images, all runs
    run_seconds: float  #: decoding time of this run's batches
    record: dict = field(repr=False, default_factory=dict)
    #: one line each about the folder as found (an unreadable PNG made again, maps an earlier run did not write)
    notes: list = field(default_factory=list)
    asked: int = 0  #: images this run asked for (0: as many as the folder holds)

    def line(self) -> str:
        """One-line summary (what ``csdgen generate`` prints last); where the folder holds more images than
        this run asked for (an earlier run with a larger ``-n``), it says so, and the figures are the folder's."""
        asked = self.asked or self.images
        notes = [f"{self.resumed} kept from an earlier run"] if self.resumed else []
        if self.images > asked:
            notes.append(f"the folder holds {self.images}; the figures are the folder's")
        kept = f" ({'; '.join(notes)})" if notes else ""
        return (f"{asked} image{'' if asked == 1 else 's'}{kept}, {self.tokens} tokens, {self.steps} steps (per image, summed), "
                f"step compression {self.step_compression:.2f}x, decoding {self.decode_seconds:.1f} s in all "
                f"({self.run_seconds:.1f} s this run) -> {self.out}/")


_IMAGE_FIELDS = {"file": str, "batch": int, "tokens": int, "steps": int, "step_compression": (int, float)}
_BATCH_FIELDS = {"batch": int, "images": list, "decode_seconds": (int, float)}


def _check_record(record: dict, path: Path) -> None:
    """Every field of ``record.json`` that resuming reads has its type, else one line naming the file and the entry.

    Raises:
        ValueError: ``"'out/record.json': images["3"].file is null, expected a file name in the folder; ..."``.
    """
    def bad(where: str, value, expected: str):
        raise ValueError(f"{str(path)!r}: {where} is {json.dumps(value)}, expected {expected}; fix the entry, or move "
                         f"the file away (its images are then generated again), or use another --out")

    def typed(value, kind) -> bool:
        return isinstance(value, kind) and not isinstance(value, bool)

    for key, image in record["images"].items():
        where = f"images[{json.dumps(key)}]"
        if not key.isdigit():
            bad(f"the key of {where}", key, "an image index 0, 1, ...")
        if not isinstance(image, dict):
            bad(where, image, "an object {...}")
        for name, kind in _IMAGE_FIELDS.items():
            if not typed(image.get(name), kind) and not (name == "batch" and "batch" not in image):
                bad(f"{where}.{name}", image.get(name), "a file name in the folder" if name == "file" else
                    "a number" if name == "step_compression" else "an integer")
        if Path(image["file"]).name != image["file"]:
            bad(f"{where}.file", image["file"], "a file name in the folder (no folders)")
    batch_list = record.get("batches", [])
    if not isinstance(batch_list, list):
        bad("batches", batch_list, "a list [...]")
    for n, entry in enumerate(batch_list):
        if not isinstance(entry, dict):
            bad(f"batches[{n}]", entry, "an object {...}")
        for name, kind in _BATCH_FIELDS.items():
            if not typed(entry.get(name), kind):
                bad(f"batches[{n}].{name}", entry.get(name), "a list" if name == "images" else
                    "a number" if name == "decode_seconds" else "an integer")
    totals = record.get("totals", {})
    if not isinstance(totals, dict) or not typed(totals.get("runs", 0), int):
        bad("totals", totals, 'an object with "runs" an integer')


#: settings a record keeps for information only, not compared on resume: the preset's name (what it set is
#: compared, resolved: ``--preset paper`` and its settings spelt out are the same run)
_NOT_COMPARED = ("preset",)


def _comparable(settings: dict) -> dict:
    """A record's settings as resuming compares them: without :data:`_NOT_COMPARED`, AR's without
    ``draft_init`` and ``refresh`` (it has no drafts), a ``draft_init`` of null (records written before
    it was recorded resolved: the rule's own, else uniform) resolved, and a ``top_p`` of 1 as none
    (:func:`csdgen.sampling.apply_top_p` keeps every token at 1: the same images)."""
    from csdgen.acceptance import RULES

    settings = {k: v for k, v in settings.items() if k not in _NOT_COMPARED}
    method = settings.get("method")
    if method == "ar":  # AR has no drafts: records written before run_settings left these out for it hold them
        settings.pop("draft_init", None)
        settings.pop("refresh", None)
    if "draft_init" in settings and settings["draft_init"] is None and method in RULES:
        settings["draft_init"] = RULES[method].draft_init or "uniform"
    sampling = settings.get("sampling")
    if isinstance(sampling, dict) and sampling.get("top_p") == 1:  # top-p 1 keeps every token: no top-p
        settings["sampling"] = {**sampling, "top_p": None}
    return settings


def _load_record(out: Path, plan: RunPlan) -> dict | None:
    """The earlier record in ``out`` if it belongs to the same run; ``None`` if there is none.

    Raises:
        ValueError: malformed record (naming the file), other settings (naming the values), or
            another condition for an image already there.
    """
    path = out / "record.json"
    if not path.exists():
        return None
    record = read_json(path, what="a csdgen run record")
    if not isinstance(record.get("settings"), dict) or not isinstance(record.get("images"), dict):
        raise ValueError(f"{str(path)!r} is not a csdgen run record (no settings/images); use another --out")
    _check_record(record, path)
    differ = settings_difference(_comparable(record["settings"]), _comparable(plan.settings))
    if differ:
        raise ValueError(f"{str(out)!r} holds a run with other settings ({'; '.join(differ)}); "
                         f"use another --out, or the earlier settings to resume")
    for key, image in record["images"].items():
        i = int(key)
        if i < len(plan.labels) and any(image.get(k) != v for k, v in plan.labels[i].items()):
            was = image.get("class") or image.get("prompt")
            now = plan.labels[i].get("class") or plan.labels[i].get("prompt")
            raise ValueError(f"{str(out)!r} holds image {i} for {was!r}, this run asks for {now!r}; use another --out")
    return record


def _map_png(plan: RunPlan, pixels, stats):
    from csdgen.evaluation.maps import acceptance_map

    model = plan.model
    return acceptance_map(pixels, stats.decisions, stats.entropy, model.grid, model.codebook_size, scale=plan.scale,
                          side_branch=stats.side_branch)


def _write_batch(plan: RunPlan, out: Path, indices: list[int], result, batch: int, images: dict, maps: bool) -> None:
    from csdgen.evaluation.maps import save_png

    pixels = _decode(plan.model, result.tokens, [plan.conditions[i] for i in indices])
    pil = _to_pil(pixels, plan.scale)
    for j, i in enumerate(indices):
        stats, name = result.images[j], plan.names[i]
        save_png(pil[j], out / f"{name}.png")
        if maps:
            save_png(_map_png(plan, pixels[j], stats), out / f"{name}_map.png")
        images[i] = {"file": f"{name}.png", **plan.labels[i], "batch": batch, **stats.summary()}


def _totals(images: dict, batch_list: list[dict], runs: int) -> dict:
    done = [images[i] for i in sorted(images)]
    return {
        "images": len(done),
        "tokens": sum(d["tokens"] for d in done),
        "steps": sum(d["steps"] for d in done),
        "step_compression": sum(d["step_compression"] for d in done) / len(done) if done else 0.0,
        "decode_seconds": sum(b["decode_seconds"] for b in batch_list),
        "runs": runs,
    }


def run_plan(plan: RunPlan, out: str | os.PathLike, *, batch_size: int, seed: int = 0, maps: bool = True,
             callback=None, on_start: Callable[[int], None] | None = None,
             on_batch: Callable[[list[int]], None] | None = None) -> RunSummary:
    """Generate the plan's images batch by batch into ``out``, writing each batch as it finishes; resume.

    Images already in ``out`` (listed in its ``record.json`` with their PNG present, readable by
    PIL and of the size the other kept images have) are kept; the others are generated, in batches of ``batch_size`` (any batch size: it does not change
    the images). ``record.json`` is rewritten after every
    batch, so an interrupted run loses at most the batch in progress. A call that fails before it
    wrote anything (e.g. a value found bad in the first batch) leaves no folder it made
    (:func:`csdgen.atomic.undo_new_folders`).

    Args:
        plan: model, conditions, file names and settings (see :class:`RunPlan`).
        out: output folder (created).
        batch_size: images per :func:`csdgen.generate` call (does not change the images).
        seed: run seed.
        maps: also write the acceptance maps.
        callback: passed to :func:`csdgen.generate` (progress bars).
        on_start: called with the number of images to generate, once the folder's record is checked.
        on_batch: called with the image indices of each finished batch.

    Returns:
        :class:`RunSummary` of everything in the folder; its ``notes`` say which kept PNGs were
        unreadable (made again) and which kept images have no map (when ``maps``).

    Raises:
        ValueError: ``out`` holds a run with other settings or conditions, or a malformed record,
            or cannot be made (a file, naming the path), or is empty; ``batch_size`` is not an
            integer >= 1; ``maps`` not a bool; the plan has no conditions.
        csdgen.folder_lock.FolderBusy: another run is writing into ``out`` now (a ValueError).
    """
    from csdgen.folder_lock import folder_lock

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: allowed an integer >= 1 (images per csdgen.generate call)")
    if not isinstance(maps, bool):  # maps="no" is truthy: it wrote maps
        raise ValueError(f"maps={maps!r}: allowed True (write the acceptance maps) or False")
    if not plan.conditions:
        raise ValueError("conditions=[]: allowed one condition or more (one per image)")
    if not str(out).strip():
        raise ValueError(f"out={str(out)!r}: an empty output folder name; allowed: a folder path (new or existing)")
    from csdgen.atomic import undo_new_folders
    from csdgen.class_names import folder_error, shown_path

    out = Path(out)
    with undo_new_folders(out):  # refused before anything was written (a bad value found in the first batch): no folder
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"output folder {shown_path(out)!r} cannot be made ({folder_error(out, exc)}); "
                             f"allowed: a folder path (new or existing), not a file") from None
        with folder_lock(out, "csdgen run (generate or save_run)"):
            return _run_plan(plan, out, batch_size, seed, maps, callback, on_start, on_batch)


def _run_plan(plan: RunPlan, out: Path, batch_size: int, seed: int, maps: bool, callback, on_start, on_batch) -> RunSummary:
    old = _load_record(out, plan)
    images: dict[int, dict] = {}
    batch_list: list[dict] = []
    notes: list[str] = []
    if old is not None:
        images = {int(k): v for k, v in old["images"].items() if (out / v["file"]).is_file()}
        notes += _drop_unreadable(out, images)
        if maps:
            missing = [images[i]["file"] for i in sorted(images) if not (out / _map_file(images[i]["file"])).is_file()]
            if missing:
                notes.append(f"{len(missing)} kept image{'s' if len(missing) > 1 else ''} ({missing[0]}"
                             f"{', ...' if len(missing) > 1 else ''}) {'have' if len(missing) > 1 else 'has'} no "
                             f"acceptance map (the earlier run wrote none, e.g. --no-maps); maps need the decoding "
                             f"statistics: delete those images to make them again with maps, or use another --out")
        kept_batches = {v.get("batch") for v in images.values()}
        batch_list = [b for b in old.get("batches", []) if b.get("batch") in kept_batches]
    resumed = sum(i < len(plan.conditions) for i in images)  # of this run's images (a larger -n before kept more)
    record = {"csdgen_version": _version(), "created": (old or {}).get("created", _now()), "updated": _now(),
              "settings": plan.settings}
    runs = (old or {}).get("totals", {}).get("runs", 0) + 1
    run_seconds, ran = 0.0, False
    todo = [i for i in range(len(plan.conditions)) if i not in images]
    import torch

    threads = torch.get_num_threads()  # recorded per batch: float summation order (and so, rarely, a token) depends on it
    if on_start is not None:
        on_start(len(todo))
    for indices, result in generate_batches(plan.model, plan.conditions, batch_size=batch_size, seed=seed,
                                            indices=todo, callback=callback, **plan.generate_kwargs):
        batch = max((b["batch"] for b in batch_list), default=-1) + 1  # numbered across runs
        _write_batch(plan, out, indices, result, batch, images, maps)
        batch_list.append({"batch": batch, "images": indices, "decode_seconds": result.seconds, "finished": _now(),
                           "torch_threads": threads})
        run_seconds += result.seconds
        ran = True
        record.update(updated=_now(), totals=_totals(images, batch_list, runs),
                      batches=sorted(batch_list, key=lambda b: b["batch"]),
                      images={str(k): images[k] for k in sorted(images)})
        write_json(record, out / "record.json")
        if on_batch is not None:
            on_batch(indices)
    totals = _totals(images, batch_list, runs)
    if not ran and old is not None:  # nothing to do: leave the record as it was
        record = old
        totals = old.get("totals") or totals
    return RunSummary(out, totals["images"], resumed, totals["tokens"], totals["steps"], totals["step_compression"],
                      totals["decode_seconds"], run_seconds, record, notes, asked=len(plan.conditions))


def _map_file(png: str) -> str:
    return png[: -len(".png")] + "_map.png" if png.endswith(".png") else png + "_map.png"


def _drop_unreadable(out: Path, images: dict) -> list[str]:
    """Drop from ``images`` every kept PNG that PIL cannot read, or whose size is not the size most
    kept images have (damaged outside csdgen: its writes are atomic); returns one note per file."""
    from collections import Counter

    from PIL import Image

    sizes, notes = {}, []
    for i in sorted(images):
        path = out / images[i]["file"]
        try:
            with Image.open(path) as im:
                im.load()
                sizes[i] = im.size
        except Exception as exc:  # PIL raises several kinds (UnidentifiedImageError, OSError, SyntaxError)
            del images[i]
            notes.append(f"{str(path)!r} is not a readable PNG ({type(exc).__name__}): generating it again")
    if sizes:
        usual = Counter(sizes.values()).most_common(1)[0][0]
        for i, size in sizes.items():
            if size != usual:
                path = out / images.pop(i)["file"]
                notes.append(f"{str(path)!r} is {size[0]}x{size[1]} pixels, the other images {usual[0]}x{usual[1]}: "
                             f"generating it again")
    return notes


def _version() -> str:
    from csdgen import __version__

    return __version__




def slug(text: str, limit: int = 40, empty: str = "image") -> str:
    """File-safe lower-case words of ``text`` joined by ``-`` (at most ``limit`` characters; ``empty`` if none).

    Accents are dropped and apostrophes join their word: ``"Côte d’Ivoire flag"`` ->
    ``"cote-divoire-flag"``, ``"family: man, boy"`` -> ``"family-man-boy"``. A longer text keeps its
    whole words up to ``limit`` (a first word longer than ``limit`` is cut).
    """
    import unicodedata

    text = "".join(ch for ch in unicodedata.normalize("NFKD", str(text)) if not unicodedata.combining(ch))
    words = re.findall(r"[a-z0-9]+", re.sub(r"['\u2019]", "", text.lower()))
    kept = ""
    for word in words:
        longer = f"{kept}-{word}" if kept else word
        if len(longer) > limit:
            break
        kept = longer
    return kept or (words[0][:limit] if words else empty)


def _draw_random(model, conditions: Sequence, seed: int) -> list:
    """``conditions`` with every ``"random"`` item (any case; unless a class has that name) replaced by a
    class drawn from ``seed``, as ``csdgen generate --class`` draws it
    (:meth:`csdgen.class_names.ClassNames.assign`): ``save_run(model, ["random"] * n, out, seed=s)`` makes
    the classes of ``csdgen generate --class random -n n --seed s``. A model without class names: as given."""
    classes = getattr(model, "classes", None)
    conditions = list(conditions)
    if classes is None or not any(classes.is_random(c) for c in conditions):
        return conditions
    return classes.assign(conditions, len(conditions), seed=seed)


def _label(model, condition) -> dict:
    names = getattr(model, "class_names", None)
    if names is not None and condition is not None:
        return {"class": names[model.class_ids([condition])[0]]}
    if isinstance(condition, str):
        return {"prompt": condition}
    return {"condition": None if condition is None else str(condition)}


def save_run(model, conditions: Sequence, out: str | os.PathLike, *, seed: int = 0, batch_size: int = 8,
             maps: bool = True, scale: int | None = None, callback=None, **generate_kwargs: Any) -> RunSummary:
    """The API's ``csdgen generate``: generate one image per condition and save it as the CLI does.

    Writes ``NNNN_<class or prompt>.png`` (upscaled ``scale`` times by nearest neighbour; the name
    part is the condition's words up to 40 characters, :func:`slug`), ``NNNN_<...>_map.png`` when ``maps``
    and ``record.json`` into ``out``, batch by batch; rerunning the same call resumes (see
    :func:`run_plan`). Every argument is checked before ``out`` is made. The record's settings are
    the resolved ones (:func:`run_settings`), as ``csdgen generate`` records them: an argument given
    at its default is the same run, and ``csdgen generate`` with the same settings resumes the folder
    (and this call resumes the command's).

    Args:
        model: an image-token model; conditions: one per image (class ids or names, prompts); for a
            class-conditional model, ``"random"`` is a class drawn from ``seed`` as ``csdgen generate
            --class random`` draws it (``["random"] * 4``: four different classes, recorded by name).
        out: output folder (a ``str`` or path). seed, batch_size: as in :func:`run_plan`.
        maps: write the acceptance maps (True or False).
        scale: an integer in 1 .. :data:`MAX_SCALE` (16); None (default): as ``csdgen generate`` saves,
            the model's ``save_scale`` (the built-in model: 2, 128 x 128 pixels), else 1.
        generate_kwargs: method, window, sampling, draft_init, refresh, preset, tree, engine,
            compile of :func:`csdgen.generate` (left out: the model's defaults; engine and compile
            do not change the images and are not recorded).

    Returns:
        :class:`RunSummary`; the images as PIL: :func:`pil_images`, or the PNG files.

    Raises:
        TypeError: an unknown keyword (naming it, with the allowed ones), or ``out`` not a str or path.
        ValueError: as :func:`csdgen.generate` and :func:`run_plan` (e.g. ``out`` is a file, or
            ``conditions`` a bare string instead of a list), ``scale`` not an integer in 1 .. 16, or
            ``maps`` not a bool.

    >>> summary = csdgen.save_run(model, ["red apple", "dog face"], "outputs", method="csd")  # doctest: +SKIP
    """
    import difflib
    import inspect

    from csdgen.engine import check_conditions, check_engine, generate
    from csdgen.sampling import UnguidedSamplingWarning

    parameters = inspect.signature(generate).parameters
    allowed = [n for n in parameters
               if n not in ("model", "conditions", "batch_size", "seed", "image_indices", "callback", "profile")]
    for key in generate_kwargs:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed + ["seed", "batch_size", "maps", "scale", "callback"], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"save_run() got an unexpected keyword argument {key!r}{hint} "
                            f"(allowed: seed, batch_size, maps, scale, callback, {', '.join(allowed)})")
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"save_run(out={out!r}): allowed a folder path (str or pathlib.Path), got {type(out).__name__}")
    if scale is None:
        scale = getattr(model, "save_scale", 1)
    check_scale(scale)
    check_conditions(conditions)
    given = {n: generate_kwargs.get(n, parameters[n].default) for n in ("method", "window", "sampling", "draft_init",
                                                                          "refresh", "preset", "tree")}
    settings = run_settings(model, seed=seed, **given)  # resolved; a bad value is refused before the folder is made
    check_engine(generate_kwargs.get("engine", "auto"), generate_kwargs.get("compile"))
    conditions = _draw_random(model, conditions, seed)  # "random" as csdgen generate --class draws it
    labels = [_label(model, c) for c in conditions]
    names = [f"{i:04d}_{slug(next(iter(label.values())) or 'image')}" for i, label in enumerate(labels)]
    plan = RunPlan(model, list(conditions), names, labels, settings, dict(generate_kwargs), scale=scale)
    with warnings.catch_warnings():  # run_settings warned once about an unguided SamplingConfig, not every batch
        warnings.filterwarnings("ignore", category=UnguidedSamplingWarning)
        return run_plan(plan, out, batch_size=batch_size, seed=seed, maps=maps, callback=callback)


def _model_settings(model) -> dict:
    """The model's part of a record's settings: the built-in model as ``csdgen generate`` records it
    (``"builtin"`` and its weights, ``"shipped"`` or the folder), another model by its class name."""
    from csdgen.models.builtin import BuiltinModel

    if not isinstance(model, BuiltinModel):
        return {"model": type(model).__name__}
    from csdgen.builtin import DEFAULT_WEIGHTS_DIR

    folder = getattr(model.components, "weights_dir", None)
    shipped = folder is None or Path(folder).resolve() == DEFAULT_WEIGHTS_DIR
    return {"model": "builtin", "weights": "shipped" if shipped else str(folder)}


def run_settings(model, *, seed: int = 0, method="csd", window=None, sampling=None, draft_init=None, refresh=None,
                 preset: str | None = None, tree=None) -> dict:
    """What decides a run's images, resolved as :func:`csdgen.generate` resolves its arguments, in the
    form ``record.json`` keeps them: what ``csdgen generate`` and :func:`save_run` record and compare
    on resume, so an argument given at its default is no other setting, and either resumes the other.

    Holds ``model`` (the built-in model: ``"builtin"`` and ``weights``; another model: its class
    name, which ``csdgen generate --model`` replaces by the checkpoint's settings), ``method``,
    ``rule`` (the rule's repr for csd and addition, else the method name quoted unless the rule
    has other options than the name's), ``window``, ``seed``, ``draft_init`` and ``refresh`` (not
    for ``ar``: it has no drafts),
    ``sampling`` (every :class:`csdgen.SamplingConfig` field), ``tree`` when given and ``preset``
    (the name, for information: the run is compared by its resolved settings, not by the name).

    Args:
        model: the image-token model; seed, method, window, sampling, draft_init, refresh, preset,
            tree: as :func:`csdgen.generate` (None: the preset's, else the model's defaults).

    Raises:
        ValueError: as :func:`csdgen.generate` for a bad argument.
    """
    from csdgen.engine import resolve_arguments
    from csdgen.engine import resolve_method
    from csdgen.trees import check_tree

    rule, window, draft_init, sampling, resolved = resolve_arguments(model, method, window, sampling, draft_init,
                                                                     refresh, seed, preset)
    name = resolved["method"]
    text = repr(rule)  # csd and addition: their options, as the CLI builds them
    if name not in ("csd", "addition") and (isinstance(method, str) or repr(resolve_method(name, model)[0]) == text):
        text = repr(name)  # the rule the name makes
    settings = {**_model_settings(model), "method": name, "rule": text, "window": window, "seed": resolved["seed"],
                "draft_init": draft_init, "refresh": resolved["refresh"], "sampling": asdict(sampling)}
    if name == "ar":  # no drafts to initialise or refresh
        del settings["draft_init"], settings["refresh"]
    if preset is not None:
        settings["preset"] = preset
    tree = check_tree(tree)
    if tree is not None:  # absent without a tree: records written before trees existed still resume
        settings["tree"] = list(tree)
    return settings


@dataclass
class MethodRun:
    """Tokens and statistics of one method over all images."""

    name: str
    tokens: Any  #: torch.Tensor [M, N] int64
    steps: list[int]  #: per image
    compression: list[float]  #: per image
    accepted: list[float]  #: mean accepted length per image
    seconds: float  #: total decoding wall time
    settings: dict
    seconds_per_image: list[float] = field(default_factory=list)  #: each batch's time shared among its images


@dataclass
class MethodJob:
    """One method of :func:`run_methods`: its name (the cache's file name), ``generate`` keyword
    arguments (method, draft_init, refresh, ...), seed and window."""

    name: str
    preset: dict
    seed: int
    window: int | str


_CACHE_LISTS = ("steps", "compression", "accepted", "seconds_per_image")


class _Cached:
    """A method's cached images: the first ``done`` images of the run, read from and written to its two files."""

    def __init__(self, job: MethodJob, key: dict, conditions: list, out_dir: Path):
        self.job, self.key, self.conditions = job, key, conditions
        self.meta_path = out_dir / f"run_{job.name}.json"
        self.tokens_path = out_dir / f"run_{job.name}.safetensors"
        self.tokens: list = []
        self.lists: dict[str, list] = {k: [] for k in _CACHE_LISTS}
        self.settings: dict = {}
        self._load()

    @property
    def done(self) -> int:
        return len(self.lists["steps"])

    def _load(self) -> None:
        """Read the cache if there is one: refuse other settings, keep the images this run shares with it."""
        if not self.meta_path.is_file():
            return
        meta = read_json(self.meta_path, what="a cached csdgen run")
        where = repr(str(self.meta_path))
        key = meta.get("key")
        if not isinstance(key, dict):
            raise ValueError(f"{where} is not a cached csdgen run (no key); move it away or use another --out")
        old_conditions = key.get("classes")
        differ = settings_difference({k: v for k, v in key.items() if k != "classes"},
                                     {k: v for k, v in self.key.items() if k != "classes"})
        if differ:
            raise ValueError(f"{where} holds a run with other settings ({'; '.join(differ)}); use another --out, or the "
                             f"earlier settings to resume")
        if not self.tokens_path.is_file():
            return  # the tokens never made it to disk: regenerate
        try:
            lists = {k: list(meta[k]) for k in _CACHE_LISTS if k != "seconds_per_image"}
            count = len(lists["steps"])
            lists["seconds_per_image"] = list(meta.get("seconds_per_image") or
                                              [float(meta["seconds"]) / max(count, 1)] * count)
            if not isinstance(old_conditions, list) or any(len(v) != count for v in lists.values()) \
                    or len(old_conditions) < count:
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where} is not a cached csdgen run (its per-image lists are missing or of unequal "
                             f"length); move it away to regenerate that method") from None
        shared = min(count, len(self.conditions))
        mine = list(map(str, self.conditions[:shared]))
        if old_conditions[:shared] != mine:
            first = next(i for i in range(shared) if old_conditions[i] != mine[i])
            raise ValueError(f"{where} holds image {first} for class {old_conditions[first]}, this run asks for "
                             f"{mine[first]}; use another --out")
        from safetensors.torch import load_file

        try:
            tokens = load_file(str(self.tokens_path))["tokens"]
        except Exception as exc:  # noqa: BLE001 -- a torn or foreign file: one line naming it
            raise ValueError(f"{str(self.tokens_path)!r} cannot be read as cached tokens ({type(exc).__name__}); move it "
                             f"away to regenerate that method") from None
        if tokens.ndim != 2 or len(tokens) < count:
            raise ValueError(f"{str(self.tokens_path)!r} holds {tuple(tokens.shape)} tokens, {where} lists {count} "
                             f"images; move both away to regenerate that method")
        self.tokens = [tokens[:shared]] if shared else []
        self.lists = {k: v[:shared] for k, v in lists.items()}
        self.settings = meta.get("settings") if isinstance(meta.get("settings"), dict) else {}

    def add(self, result) -> None:
        self.tokens.append(result.tokens.cpu())
        images = result.images
        self.lists["steps"] += [s.steps for s in images]
        self.lists["compression"] += [s.step_compression for s in images]
        self.lists["accepted"] += [s.mean_accepted_length for s in images]
        self.lists["seconds_per_image"] += [result.seconds / len(images)] * len(images)
        self.settings = result.settings

    def save(self) -> None:
        """Write both files atomically (tokens first): a kill leaves the last saved batch complete.

        Only called after generating, i.e. when this run has more images than the cache held, so a
        longer cache is never cut short by a shorter run."""
        import torch

        from csdgen.atomic import save_safetensors

        tokens = torch.cat(self.tokens)
        lists = self.lists
        conditions = list(map(str, self.conditions[: self.done]))
        save_safetensors({"tokens": tokens.contiguous()}, self.tokens_path)
        write_json({"key": {**self.key, "classes": conditions}, **lists, "seconds": sum(lists["seconds_per_image"]),
                    "settings": self.settings}, self.meta_path)

    def run(self) -> MethodRun:
        import torch

        lists = self.lists
        return MethodRun(self.job.name, torch.cat(self.tokens), lists["steps"], lists["compression"], lists["accepted"],
                         sum(lists["seconds_per_image"]), self.settings, lists["seconds_per_image"])


def run_methods(model, jobs: Sequence[MethodJob], conditions: list, *, batch_size: int, sampling, out_dir: Path,
                progress: Callable[[int], None] | None = None, warm_up: bool = True) -> list[MethodRun]:
    """Run several methods over the same images, interleaved batch by batch, cached in ``out_dir``.

    * **Cache** (``run_<name>.json`` + ``run_<name>.safetensors`` per job): the run's key (name,
      seed, window, sampling, preset), the conditions done, per image its steps, step
      compression, mean accepted length and decoding seconds (its batch's time shared among
      its images), the engine's settings; tokens ``[M, N]`` int64. Both files are rewritten
      after every batch, so an interrupted run keeps every finished batch and the same call
      resumes. A run of fewer images reads the first ones of a longer cache (which it keeps);
      a run of more images continues it.
    * **Refusal**: a cache with another key (other seed, window, sampling or method options) or
      other conditions is refused before anything is generated, naming the values that differ:
      nothing on disk is overwritten.
    * **Timing**: one untimed warm-up call (a batch, discarded) for the first job of every
      window width with work left (AR counts as width 1), then the jobs take turns batch by
      batch, so each sees the same machine state; the first job no longer pays the process's
      start-up costs (issue 16: ``ar`` took 13.95 s against ``ar-seed2``'s 7.39 s for the same work).

    Args:
        model: the image-token model; conditions: one per image (class ids, prompts).
        jobs: the methods, each with its own seed and window.
        batch_size: images per :func:`csdgen.generate` call (does not change the images at a fixed window).
        sampling: :class:`csdgen.SamplingConfig`; out_dir: the folder of the caches (created).
        progress: called with the number of images of every finished (or loaded) batch.
        warm_up: run the untimed warm-up calls (one batch per window width).

    Returns:
        One :class:`MethodRun` per job, in order.

    Raises:
        ValueError: a cache with other settings or conditions, or a malformed cache (naming the file).
    """
    from csdgen.engine import generate

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    caches = []
    for job in jobs:
        key = {"name": job.name, "seed": job.seed, "window": job.window, "sampling": repr(sampling),
               "preset": repr(job.preset)}
        caches.append(_Cached(job, key, list(conditions), out_dir))  # every cache checked before any work
    if progress:
        for cache in caches:
            if cache.done:
                progress(cache.done)
    todo = [c for c in caches if c.done < len(conditions)]

    def call(cache: _Cached, indices: list[int]):
        return generate(model, [conditions[i] for i in indices], seed=cache.job.seed, image_indices=indices,
                        window=cache.job.window, sampling=sampling, **cache.job.preset)

    if warm_up:
        warmed = set()
        for cache in todo:
            width = 1 if _is_ar(cache.job.preset) else cache.job.window
            if width not in warmed:
                warmed.add(width)
                call(cache, list(range(cache.done, min(cache.done + batch_size, len(conditions)))))
    while todo:
        for cache in todo:
            indices = list(range(cache.done, min(cache.done + batch_size, len(conditions))))
            cache.add(call(cache, indices))
            cache.save()
            if progress:
                progress(len(indices))
        todo = [c for c in todo if c.done < len(conditions)]
    return [c.run() for c in caches]


def _is_ar(preset: dict) -> bool:
    method = preset.get("method")
    return method == "ar"


def run_method(model, name: str, preset: dict, classes: list, *, seed: int, batch_size: int, window: int,
               sampling, out_dir: Path, progress: Callable[[int], None] | None = None) -> MethodRun:
    """One method over all images: :func:`run_methods` with one job (its cache, resume, refusal and warm-up)."""
    return run_methods(model, [MethodJob(name, preset, seed, window)], classes, batch_size=batch_size,
                       sampling=sampling, out_dir=out_dir, progress=progress)[0]
