"""Several methods over the same images, cached in the output folder: what ``compare`` and ``sweep`` run.

:func:`run_methods` interleaves the methods batch by batch after an untimed warm-up; each method's
images are cached (``run_<name>.json`` + ``.safetensors``, rewritten after every batch) and a rerun
resumes them; a cache of other settings is refused, naming the values that differ.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .folder_kinds import refuse_other_kind
from .jsonio import read_json, write_json
from .run_settings import defaults_resolved, sampling_record, settings_difference

__all__ = ["MethodRun", "MethodJob", "run_methods", "run_method"]


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
    timed_in: list[str] = field(default_factory=list)  #: per image, the :func:`run_methods` call that timed it


#: ``timed_in`` of images cached before it was recorded
EARLIER = "earlier"


@dataclass
class MethodJob:
    """One method of :func:`run_methods`: its name (the cache's file name), ``generate`` keyword
    arguments (method, draft_init, refresh, ...), seed and window."""

    name: str
    preset: dict
    seed: int
    window: int | str


_CACHE_LISTS = ("steps", "compression", "accepted", "seconds_per_image", "timed_in")
_OPTIONAL_LISTS = ("seconds_per_image", "timed_in")  #: absent from caches of earlier versions


class _Cached:
    """A method's cached images: the first ``done`` images of the run, read from and written to its two files."""

    def __init__(self, job: MethodJob, key: dict, conditions: list, out_dir: Path, legacy: dict | None = None):
        self.job, self.key, self.conditions, self.legacy = job, key, conditions, legacy or {}
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
        differ = settings_difference(_comparable_key(key, self.key, self.legacy), _comparable_key(self.key, self.key))
        if differ:
            raise ValueError(f"{where} holds a run with other settings ({'; '.join(differ)}); use another --out, or the "
                             f"earlier settings to resume")
        if not self.tokens_path.is_file():
            return  # the tokens never made it to disk: regenerate
        try:
            lists = {k: list(meta[k]) for k in _CACHE_LISTS if k not in _OPTIONAL_LISTS}
            count = len(lists["steps"])
            lists["seconds_per_image"] = list(meta.get("seconds_per_image") or
                                              [float(meta["seconds"]) / max(count, 1)] * count)
            lists["timed_in"] = list(map(str, meta.get("timed_in") or [EARLIER] * count))
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

    def add(self, result, timed_in: str) -> None:
        self.tokens.append(result.tokens.cpu())
        images = result.images
        self.lists["steps"] += [s.steps for s in images]
        self.lists["compression"] += [s.step_compression for s in images]
        self.lists["accepted"] += [s.mean_accepted_length for s in images]
        self.lists["seconds_per_image"] += [result.seconds / len(images)] * len(images)
        self.lists["timed_in"] += [timed_in] * len(images)
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
                         sum(lists["seconds_per_image"]), self.settings, lists["seconds_per_image"], lists["timed_in"])


def run_methods(model, jobs: Sequence[MethodJob], conditions: list, *, batch_size: int, sampling, out_dir: Path,
                progress: Callable[[int], None] | None = None, warm_up: bool = True) -> list[MethodRun]:
    """Run several methods over the same images, interleaved batch by batch, cached in ``out_dir``.

    * **Cache** (``run_<name>.json`` + ``run_<name>.safetensors`` per job): the run's key (name,
      seed, window, sampling, preset), the conditions done, per image its steps, step
      compression, mean accepted length, decoding seconds (its batch's time shared among
      its images) and which call timed it (``timed_in``: an id per call, so a table can tell
      times taken together from times a resumed or grown run kept), the engine's settings;
      tokens ``[M, N]`` int64. Both files are rewritten
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
        ValueError: a cache with other settings or conditions, or a malformed cache (naming the file), or a
            folder holding another kind of output (:func:`csdgen.folder_kinds.refuse_other_kind`).
    """
    from csdgen.engine import generate

    out_dir = Path(out_dir)
    refuse_other_kind(out_dir, "cached runs")
    out_dir.mkdir(parents=True, exist_ok=True)
    caches = []
    for job in jobs:
        key, legacy = _job_key(job, sampling)
        caches.append(_Cached(job, key, list(conditions), out_dir, legacy))  # every cache checked before any work
    if progress:
        for cache in caches:
            if cache.done:
                progress(cache.done)
    todo = [c for c in caches if c.done < len(conditions)]
    call_id = uuid.uuid4().hex[:12]  # the images this call times (MethodRun.timed_in)

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
            cache.add(call(cache, indices), call_id)
            cache.save()
            if progress:
                progress(len(indices))
        todo = [c for c in todo if c.done < len(conditions)]
    return [c.run() for c in caches]


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)


def _preset_key(preset: dict) -> dict:
    """A job's ``generate`` arguments as its cache key keeps them: each value plain, a rule as its name and
    options (so a refusal names the option that differs: ``preset.method.lam: 0.5 there, 0.3 here``);
    AR's without ``draft_init`` and ``refresh`` (it has no drafts: other values make the same images)."""
    out = {}
    for name, value in preset.items():
        options = getattr(value, "options", None)
        if callable(options):
            out[name] = {"rule": getattr(value, "name", type(value).__name__),
                         **{k: _plain(v) for k, v in options().items()}}
        else:
            out[name] = _plain(value)
    if _is_ar(preset):
        out.pop("draft_init", None)
        out.pop("refresh", None)
    return out


def _job_key(job: MethodJob, sampling) -> tuple[dict, dict]:
    """``(key, legacy)``: what a job's cache records and compares on resume (name, seed, window, sampling
    and preset; AR's window left out: AR decodes one token a step whatever the window), and the
    ``repr`` form that caches written before kept for sampling and preset (still resumed when equal)."""
    key = {"name": job.name, "seed": job.seed, "window": None if _is_ar(job.preset) else job.window,
           "sampling": sampling_record(sampling), "preset": _preset_key(job.preset)}
    return key, {"sampling": repr(sampling), "preset": repr(job.preset)}


def _comparable_key(key: dict, current: dict, legacy: dict | None = None) -> dict:
    """A cache key as resuming compares it: without its conditions; a value in the older ``repr`` form
    (``legacy``) that equals this run's taken as this run's; AR's window dropped."""
    out = {k: v for k, v in key.items() if k != "classes"}
    for name, old in (legacy or {}).items():
        if isinstance(out.get(name), str) and out[name] == old:
            out[name] = current[name]
    if current.get("window") is None and current.get("preset", {}).get("method") == "ar":
        out.pop("window", None)
    return defaults_resolved(out)


def _is_ar(preset: dict) -> bool:
    method = preset.get("method")
    return method == "ar"


def run_method(model, name: str, preset: dict, classes: list, *, seed: int, batch_size: int, window: int,
               sampling, out_dir: Path, progress: Callable[[int], None] | None = None) -> MethodRun:
    """One method over all images: :func:`run_methods` with one job (its cache, resume, refusal and warm-up)."""
    return run_methods(model, [MethodJob(name, preset, seed, window)], classes, batch_size=batch_size,
                       sampling=sampling, out_dir=out_dir, progress=progress)[0]
