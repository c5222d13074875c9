"""The settings that decide a run's images, as records keep and compare them.

:func:`run_settings` resolves ``generate``'s arguments as :func:`csdgen.generate` does, in the form
``record.json`` (and a compare or sweep cache) keeps them; :func:`settings_difference` names what
differs between a record's settings and a rerun's, so that a resume with other settings is refused
with the values that differ.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

__all__ = ["model_settings", "run_settings", "settings_difference"]


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: obj}


def sampling_record(sampling) -> dict:
    """A :class:`csdgen.SamplingConfig` as records keep it: its fields, the guidance schedule by its
    :meth:`~csdgen.guidance.GuidanceSchedule.options` (``{"name": ..., **parameters}``: two schedules
    with the same parameters, e.g. ``LinearGuidance(4)`` and ``Lumina2Guidance(4)``, are other targets)."""
    record = asdict(sampling)
    if sampling.guidance_schedule is not None:
        record["guidance_schedule"] = sampling.guidance_schedule.options()
    return record


def _named_schedule(previous: dict, current: dict) -> dict:
    """``previous`` with a guidance schedule recorded without its name (records written before the name
    was kept) given ``current``'s name where the parameters are the same (resumed, as before)."""
    def schedule(settings: dict):
        sampling = settings.get("sampling")
        return sampling.get("guidance_schedule") if isinstance(sampling, dict) else None

    old, new = schedule(previous), schedule(current)
    if isinstance(old, dict) and "name" not in old and isinstance(new, dict) and "name" in new:
        return {**previous, "sampling": {**previous["sampling"], "guidance_schedule": {"name": new["name"], **old}}}
    return previous


def settings_difference(previous: dict, current: dict) -> list[str]:
    """``"key: A there, B here"`` for every (nested, dotted) setting whose value differs."""
    old, new = _flatten(_named_schedule(previous, current)), _flatten(current)
    missing = object()
    lines = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, missing), new.get(key, missing)
        if a != b:
            if isinstance(a, str) and isinstance(b, str) and max(len(a), len(b)) > 60:
                a, b = _differing_part(a, b)
            unset = _UNSET.get(key.rsplit(".", 1)[-1], "unset")
            if current.get("model") == "builtin":
                unset = _BUILTIN_UNSET.get(key, unset)
            there = unset if a is missing else _shown(a)
            here = unset if b is missing else _shown(b)
            if all(isinstance(v, str) and v.startswith(_FILE_DIGEST) for v in (a, b)):  # a prompt file, by content
                lines.append(f"{key}: a file of other contents ({a[len(_FILE_DIGEST):][:12]}... there, "
                             f"{b[len(_FILE_DIGEST):][:12]}... here by sha256)")
                continue
            lines.append(f"{key}: {there} there, {here} here")
    return lines


def _shown(value) -> str:
    """A recorded value as a refusal names it: JSON, except a string that is already a Python repr
    (a ``rule`` of ``'sjd'``), shown as it is, not quoted twice (``"'sjd'"``)."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == "'":
        return value
    return json.dumps(value)


#: what a setting left out of the built-in model's record means (its float32 is not recorded, so that records
#: made before it had a dtype resume)
_BUILTIN_UNSET = {"dtype": '"float32" (the default)'}

#: how a record names a file by its contents (a bench's prompt file: ``"file sha256:<hex>"``)
_FILE_DIGEST = "file sha256:"

#: what a setting left out means, for any model (the engine options and a checkpoint's ``--vqgan`` are kept only
#: where given: records written before ``vqgan`` was recorded ran with the default decoder)
_UNSET = {"engine": '"auto" (the default)', "compile": "the default (compiled on CUDA only)",
          "vqgan": "the default decoder (--vqgan not given: the one found with the checkpoint)"}


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


#: settings a record keeps for information only, not compared on resume: the preset's name (what it set is
#: compared, resolved: ``--preset paper`` and its settings spelt out are the same run)
_NOT_COMPARED = ("preset",)


def same_checkpoint(settings: dict) -> dict:
    """``settings`` with a checkpoint compared by its folder: ``checkpoint`` (a path) as its absolute,
    resolved form, and ``model`` (the name the user gave: a folder or a repo id) left out when
    ``checkpoint`` is there: ``ck/Janus``, ``ck/Janus/`` and its absolute path name the same weights.
    A relative ``checkpoint`` (records written before it was recorded resolved) is read from the
    current folder."""
    checkpoint = settings.get("checkpoint")
    if not isinstance(checkpoint, str):
        return settings
    out = {k: v for k, v in settings.items() if k != "model"}
    out["checkpoint"] = os.path.realpath(checkpoint)
    return out


def _top_p_one_as_none(settings: dict) -> dict:
    """``settings`` with a ``sampling.top_p`` of 1 as none, and a top-level ``top_p`` of 1 (a bench record's
    per-image settings keep the sampling fields flat): :func:`csdgen.sampling.apply_top_p` keeps every
    token at 1, so both make the same images."""
    sampling = settings.get("sampling")
    if isinstance(sampling, dict) and sampling.get("top_p") == 1:
        settings = {**settings, "sampling": {**sampling, "top_p": None}}
    if settings.get("top_p") == 1:
        settings = {**settings, "top_p": None}
    return settings


def defaults_resolved(settings: dict) -> dict:
    """``settings`` (a bench manifest's, a compare or sweep cache key's) with values that mean the
    default written as the default, so that an option given at its default is the same run: a
    ``sampling.top_p`` (or a bench record's flat ``top_p``) of 1 as none (top-p 1 keeps every token), a ``draft_init`` of null (top level
    or in ``preset``) as ``"uniform"`` (what a rule that needs no drafts of its own starts from; a
    rule that needs its own has it set there, :func:`csdgen.evaluation.compare.method_presets`), and
    ``compile: false`` on a CPU as unset (compilation is on for CUDA only by default). An ``engine`` of
    ``"static"`` (top level or in ``preset``) is unset too: ``engine="auto"`` runs the static engine
    wherever it applies and an explicit ``"static"`` is refused where it does not, so the two are one
    run. A bench's ``preset`` name (``"paper"``, kept for information) is dropped: its settings are
    recorded resolved beside it, and the same settings given one by one are the same run."""
    def level(values: dict) -> dict:  # the rules that hold at the top level and in ``preset`` alike (a copy)
        out = {k: v for k, v in values.items() if not (k == "engine" and v == "static")}
        if "draft_init" in out and out["draft_init"] is None:
            out["draft_init"] = "uniform"
        return out

    out = level(_top_p_one_as_none(settings))  # a copy: the caller's settings stay as they are
    if isinstance(out.get("preset"), str):
        del out["preset"]
    elif isinstance(out.get("preset"), dict):
        out["preset"] = level(out["preset"])
    if out.get("compile") is False and out.get("device") == "cpu":
        del out["compile"]
    return out


def _comparable(settings: dict) -> dict:
    """A record's settings as resuming compares them: without :data:`_NOT_COMPARED`, AR's without
    ``draft_init`` and ``refresh`` (it has no drafts), a ``draft_init`` of null (records written before
    it was recorded resolved: the rule's own, else uniform) resolved, and a ``top_p`` of 1 as none
    (:func:`csdgen.sampling.apply_top_p` keeps every token at 1: the same images)."""
    from csdgen.acceptance import RULES

    settings = {k: v for k, v in same_checkpoint(settings).items() if k not in _NOT_COMPARED}
    method = settings.get("method")
    if method == "ar":  # AR has no drafts: records written before run_settings left these out for it hold them
        settings.pop("draft_init", None)
        settings.pop("refresh", None)
    if "draft_init" in settings and settings["draft_init"] is None and method in RULES:
        settings["draft_init"] = RULES[method].draft_init or "uniform"
    return _top_p_one_as_none(settings)


def weights_digest(folder: str | os.PathLike) -> str:
    """The first 16 hex digits of the SHA-256 of a built-in weights folder's ``ar.safetensors`` and
    ``vq.safetensors``: a record compares the weights by content, not by path (new weights shipped
    into the same folder are another model; a copy elsewhere is the same)."""
    import hashlib

    digest = hashlib.sha256()
    for name in ("ar.safetensors", "vq.safetensors"):
        with open(Path(folder) / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def weights_compared(previous: dict, current: dict) -> tuple[dict, dict]:
    """Two records' settings with the built-in weights compared as they can be: by ``weights_digest``
    where both hold it (the folder's path then left out: a copy elsewhere is the same weights), by
    path where one was written before the digest was recorded."""
    old, new = dict(previous), dict(current)
    if "weights_digest" in old and "weights_digest" in new:
        if old["weights_digest"] == new["weights_digest"]:
            old.pop("weights", None)
            new.pop("weights", None)
    else:
        old.pop("weights_digest", None)
        new.pop("weights_digest", None)
    return old, new


def model_settings(model) -> dict:
    """The model's part of a record's settings (``record.json``, each bench record, and ``bench.json`` for the
    built-in model): the built-in model as ``csdgen generate`` records it
    (``"builtin"`` and its weights, ``"shipped"`` or the folder, and its ``dtype`` where not float32),
    another model by its class name,
    and a checkpoint from :func:`csdgen.models.load_model` also by its folder (``checkpoint``), its
    ``dtype`` and ``grid`` (another checkpoint, dtype or size is another target); and ``quantize``
    where the model was quantised (``model.quantize``, as ``--quantize`` records it: another
    target, other images)."""
    from csdgen.models.builtin import BuiltinModel

    quantized = {"quantize": model.quantize} if getattr(model, "quantize", None) else {}
    if not isinstance(model, BuiltinModel):
        loaded = {}
        if getattr(model, "checkpoint", None) is not None:
            loaded = {"checkpoint": str(model.checkpoint), "grid": [int(n) for n in model.grid]}
            import torch

            if isinstance(getattr(model, "dtype", None), torch.dtype):
                loaded["dtype"] = str(model.dtype).removeprefix("torch.")
        return {"model": type(model).__name__, **loaded, **quantized}
    from csdgen.builtin import DEFAULT_WEIGHTS_DIR

    folder = getattr(model.components, "weights_dir", None)
    shipped = folder is None or Path(folder).resolve() == DEFAULT_WEIGHTS_DIR
    dtype = str(model.backbone.dtype).removeprefix("torch.")  # float32 unrecorded: records before bfloat16 resume
    cast = {"dtype": dtype} if dtype != "float32" else {}
    digest = {} if shipped else {"weights_digest": weights_digest(folder)}
    return {"model": "builtin", "weights": "shipped" if shipped else str(folder), **digest, **cast, **quantized}


def run_settings(model, *, seed: int = 0, method="csd", window=None, sampling=None, draft_init=None, refresh=None,
                 preset: str | None = None, tree=None) -> dict:
    """What decides a run's images, resolved as :func:`csdgen.generate` resolves its arguments, in the
    form ``record.json`` keeps them: what ``csdgen generate`` and :func:`save_run` record and compare
    on resume, so an argument given at its default is no other setting, and either resumes the other.

    Holds ``model`` (the built-in model: ``"builtin"`` and ``weights``; another model: its class
    name, which ``csdgen generate --model`` replaces by the checkpoint's settings), ``quantize`` for a
    quantised model, ``method``,
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
    from csdgen.engine import METHODS, resolve_arguments
    from csdgen.engine import resolve_method
    from csdgen.trees import check_tree

    rule, window, draft_init, sampling, resolved = resolve_arguments(model, method, window, sampling, draft_init,
                                                                     refresh, seed, preset)
    name = resolved["method"]
    text = repr(rule)  # csd and addition: their options, as the CLI builds them
    if name not in ("csd", "addition") and (isinstance(method, str) or (
            name in METHODS and repr(resolve_method(name, model)[0]) == text)):
        text = repr(name)  # the rule the name makes (a rule of the caller's own, not a method name: its repr)
    settings = {**model_settings(model), "method": name, "rule": text, "window": window, "seed": resolved["seed"],
                "draft_init": draft_init, "refresh": resolved["refresh"], "sampling": sampling_record(sampling)}
    if name == "ar":  # no drafts to initialise or refresh
        del settings["draft_init"], settings["refresh"]
    if preset is not None:
        settings["preset"] = preset
    tree = check_tree(tree)
    if tree is not None:  # absent without a tree: records written before trees existed still resume
        settings["tree"] = list(tree)
    return settings
