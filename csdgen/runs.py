"""Runs of many images written with their record: files written as batches finish, resuming.

The one module that ``csdgen generate`` and the API's :func:`save_run` share, so that the command
line and the library write the same files:

* :func:`run_plan` / :func:`save_run`: decode, write ``NNNN_<label>.png`` (and
  ``NNNN_<label>_map.png``) for each image and rewrite ``record.json`` after every batch; a
  rerun into the same folder keeps the images already written and generates the others
  (resume), and refuses other settings, naming the values that differ.

Re-exported here, where the public API has always named them: the batches and images of a run
(:mod:`csdgen.run_images`: :func:`batches`, :func:`generate_batches`, :func:`pil_images`, ...), its
settings (:mod:`csdgen.run_settings`: :func:`run_settings`, :func:`settings_difference`), several
methods over the same images (:mod:`csdgen.method_runs`: :func:`run_methods`, what ``compare`` and
``sweep`` run) and JSON files (:mod:`csdgen.jsonio`: :func:`read_json`, :func:`write_json`).

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
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from .folder_kinds import refuse_other_kind
from .jsonio import read_json, write_json
from .run_settings import run_settings, settings_difference, weights_compared, _comparable
from .run_images import (
    batches, builtin_batch_limit, builtin_bytes_per_image, check_scale, generate_batches, MAX_SCALE, pil_images,
    _to_pil, decoded_pixels,
)
from .method_runs import MethodJob, MethodRun, run_method, run_methods

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
    "refuse_other_record",
    "save_run",
    "slug",
]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


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
        if not (key.isascii() and key.isdigit()):
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
    differ = settings_difference(*weights_compared(_comparable(record["settings"]), _comparable(plan.settings)))
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


#: settings a record holds only when they are set (``quantize``: a quantised model); ``None`` in
#: :func:`refuse_other_record`'s ``known`` says "not set", which a record without the key agrees with
OPTIONAL_SETTINGS = ("quantize",)

#: settings a record holds only when an option gave them, their absence meaning the default (``vqgan``: a
#: checkpoint's image decoder, ``--vqgan``; records written before it was recorded ran with the default one);
#: ``None`` in :func:`refuse_other_record`'s ``known`` says "not given", and the refusal names the default
GIVEN_ONLY_SETTINGS = ("vqgan",)


def refuse_other_record(out: str | os.PathLike, known: dict) -> None:
    """Refuse, before a model is read, a folder whose ``record.json`` holds a run with other values of
    the settings ``known`` so far (checkpoint, dtype, device, method, prompts ...): with a 7B model the
    weights take minutes to read. Compares only ``known``'s keys, as :func:`run_plan` compares them (a
    key the record lacks is "unset there"); the full check runs again once the model is loaded. A
    missing or malformed record is left to that check.

    Raises:
        ValueError: naming the folder and each value that differs, as :func:`run_plan` does.
    """
    path = Path(out) / "record.json"
    if not path.is_file():
        return
    try:
        settings = read_json(path, what="a csdgen run record").get("settings")
    except (ValueError, AttributeError):
        return
    if not isinstance(settings, dict):
        return
    old, new = _comparable(settings), _comparable(known)
    for key in OPTIONAL_SETTINGS:  # recorded only when set: a record without one ran without it
        if key in new:
            old.setdefault(key, None)
    compared = {k: old[k] for k in new if k in old}
    for key in GIVEN_ONLY_SETTINGS:  # recorded only when given: absent on either side is the default
        if key in new:
            if new[key] is None:
                del new[key]
            if key in old:
                compared[key] = old[key]
    differ = settings_difference(compared, new)
    if differ:
        raise ValueError(f"{str(out)!r} holds a run with other settings ({'; '.join(differ)}); "
                         f"use another --out, or the earlier settings to resume")


def _map_png(plan: RunPlan, pixels, stats):
    from csdgen.evaluation.maps import acceptance_map

    model = plan.model
    return acceptance_map(pixels, stats.decisions, stats.entropy, model.grid, model.codebook_size, scale=plan.scale,
                          side_branch=stats.side_branch)


def _write_batch(plan: RunPlan, out: Path, indices: list[int], result, batch: int, images: dict, maps: bool,
                 mark: Callable[[], None] | None = None) -> None:
    from csdgen.evaluation.maps import save_png

    pixels = decoded_pixels(plan.model, result.tokens, [plan.conditions[i] for i in indices])
    pil = _to_pil(pixels, plan.scale)
    if mark is not None:  # decoded: the first file of the run is about to land
        mark()
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
            or output of another kind (:func:`csdgen.folder_kinds.refuse_other_kind`), or cannot be
            made (a file, naming the path), or is empty; ``batch_size`` is not an integer >= 1;
            ``maps`` not a bool; the plan has no conditions.
        csdgen.folder_lock.FolderBusy: another run is writing into ``out`` now (a ValueError).
    """
    from csdgen.folder_lock import folder_lock

    from csdgen.sampling import as_integer

    if as_integer(batch_size) is None or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: allowed an integer >= 1 (images per csdgen.generate call)")
    batch_size = as_integer(batch_size)  # numpy's integers too
    if not isinstance(maps, bool):  # maps="no" is truthy: it wrote maps
        raise ValueError(f"maps={maps!r}: allowed True (write the acceptance maps) or False")
    if not plan.conditions:
        raise ValueError("conditions=[]: allowed one condition or more (one per image)")
    if not str(out).strip():
        raise ValueError(f"out={str(out)!r}: an empty output folder name; allowed: a folder path (new or existing)")
    from csdgen.atomic import undo_new_folders
    from csdgen.class_names import folder_error, shown_path

    out = Path(out)
    refuse_other_kind(out, "run")
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
                             f"acceptance map (deleted, or the earlier run wrote none: --no-maps); maps need the decoding "
                             f"statistics: delete those images to make them again with maps, or use another --out")
        kept_batches = {v.get("batch") for v in images.values()}
        batch_list = [b for b in old.get("batches", []) if b.get("batch") in kept_batches]
    else:
        _refuse_foreign_files(out, plan, maps)
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
        mark = None if (out / "record.json").exists() else \
            (lambda: write_json({**record, "images": {}}, out / "record.json"))  # the folder is a run's before its first file
        _write_batch(plan, out, indices, result, batch, images, maps, mark)
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


def _refuse_no_decoder(model) -> None:
    """Refuse, before anything runs, a model whose tokens cannot be made into PNGs.

    Raises:
        ValueError: naming the model and what to use instead.
    """
    from csdgen.models.base import ImageTokenModel

    no_decoder = (type(model).decode_images is ImageTokenModel.decode_images if isinstance(model, ImageTokenModel)
                  else not callable(getattr(model, "decode_images", None)))
    problem = getattr(model, "decoder_problem", None) or ("its VQ decoder was not loaded"
                                                          if getattr(model, "vqgan", True) is None else None)
    if no_decoder or problem:
        raise ValueError(f"{type(model).__name__} has no image decoder ({problem or 'it makes tokens only'}); "
                         f"save_run writes PNG images: use csdgen.generate for the tokens")


def _refuse_foreign_files(out: Path, plan: RunPlan, maps: bool) -> None:
    """Refuse a folder without ``record.json`` that holds a file this run would write: csdgen did not
    write it (a run writes its record before its first image), so overwriting it would lose it.

    Raises:
        ValueError: naming the folder, the first such file and how many there are.
    """
    if not out.is_dir():
        return
    there = {p.name for p in out.iterdir()}
    clash = [f for name in plan.names for f in (f"{name}.png", f"{name}_map.png" if maps else None)
             if f is not None and f in there]
    if clash:
        more = f" and {len(clash) - 1} more file{'s' if len(clash) > 2 else ''} this run would write" if len(clash) > 1 else ""
        raise ValueError(f"{str(out)!r} holds {clash[0]!r}{more} but no record.json, so they are not a csdgen run's "
                         f"and would be overwritten; use another --out, or move those files")


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
        callback: None, or a function called with a :class:`csdgen.StepInfo` after every forward of every batch
            (as :func:`csdgen.generate`'s; progress bars). Not recorded: it does not change the images.
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
            ``conditions`` a bare string or one condition instead of a list), ``scale`` not an integer in 1 .. 16,
            ``maps`` not a bool, or a model without an image decoder (a ``FunctionModel``; a checkpoint loaded
            without its VQ decoder).

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
    scale = check_scale(scale)
    check_conditions(conditions)
    given = {n: generate_kwargs.get(n, parameters[n].default) for n in ("method", "window", "sampling", "draft_init",
                                                                          "refresh", "preset", "tree")}
    settings = run_settings(model, seed=seed, **given)  # resolved; a bad value is refused before the folder is made
    check_engine(generate_kwargs.get("engine", "auto"), generate_kwargs.get("compile"))
    _refuse_no_decoder(model)  # after the arguments: a bad value is named first, whatever the model
    conditions = _draw_random(model, conditions, seed)  # "random" as csdgen generate --class draws it
    labels = [_label(model, c) for c in conditions]
    names = [f"{i:04d}_{slug(next(iter(label.values())) or 'image')}" for i, label in enumerate(labels)]
    plan = RunPlan(model, list(conditions), names, labels, settings, dict(generate_kwargs), scale=scale)
    with warnings.catch_warnings():  # run_settings warned once about an unguided SamplingConfig, not every batch
        warnings.filterwarnings("ignore", category=UnguidedSamplingWarning)
        return run_plan(plan, out, batch_size=batch_size, seed=seed, maps=maps, callback=callback)


