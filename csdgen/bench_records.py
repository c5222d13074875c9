"""A bench's record files: one JSON line per image appended to each process's own file, read back
whole lines only, a torn last line cut off, and the settings manifest a rerun must match.

Why appended lines: one file per process, no file-name explosion at 5000 prompts x 8 methods, and
the only damage a kill can do is a last line without its newline, which :func:`read_jsonl` ignores
and :func:`repair_tail` cuts off before the process appends again.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from csdgen.evaluation.report import SCHEMA
from csdgen.jsonio import json_lines, read_json, write_json
from csdgen.run_settings import defaults_resolved, same_checkpoint, weights_compared
from csdgen.runs import settings_difference

__all__ = ["MANIFEST", "RECORDS_DIR", "MERGED", "read_jsonl", "repair_tail", "append_jsonl", "existing_records", "check_settings",
           "file_complete", "record_method"]


MANIFEST = "bench.json"


RECORDS_DIR = "records"


MERGED = "records.jsonl"


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The complete lines of a JSON-line file (a last line without newline, torn by a kill, is ignored).

    Raises:
        ValueError: a complete line that is not a JSON object (naming file and line).
    """
    return [record for _, record in _numbered_jsonl(path)]


def _numbered_jsonl(path: str | os.PathLike) -> list[tuple[int, dict]]:
    """``(line number, object)`` of every complete line (see :func:`read_jsonl`)."""
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        if data.find(b"\n", error.start) >= 0:  # not in the torn last line: a damaged file
            raise ValueError(f"{path}:{line}: not UTF-8 text (byte {error.start}); {_FIX_LINE}") from None
        text = data[: data.rfind(b"\n") + 1].decode("utf-8")
    lines = text.split("\n")[:-1]  # the part after the last newline is incomplete (or empty)
    return list(json_lines(lines, str(path), advice=_FIX_LINE))


#: what a damaged record line's error advises: that line only (moving the file away, as it said
#: before, regenerated every image the file's other lines record)
_FIX_LINE = "fix or delete that line (its image is then generated again; the file's other lines are kept)"


#: the fields of a record that resuming and reporting read, and their types
_RECORD_FIELDS = {"method": str, "seed": int, "prompt_id": str, "image": str, "tensors": str}


def _check_record_line(record: dict, path: Path, number: int) -> None:
    for name, kind in _RECORD_FIELDS.items():
        value = record.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            expected = "an integer" if kind is int else "a string"
            raise ValueError(f"{path}:{number}: {name!r} is {json.dumps(value)}, expected {expected}; {_FIX_LINE}")
    for name in ("image", "tensors"):
        parts = Path(record[name]).parts
        if Path(record[name]).is_absolute() or ".." in parts:
            raise ValueError(f"{path}:{number}: {name!r} is {record[name]!r}, expected a path inside the bench folder; {_FIX_LINE}")


def repair_tail(path: str | os.PathLike) -> bool:
    """Cut a torn last line (no final newline) off a JSON-line file; True when something was cut."""
    path = Path(path)
    if not path.is_file():
        return False
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return False
    with open(path, "r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)
        f.flush()
        os.fsync(f.fileno())
    return True


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """Append one record as one line: a single ``write``, then ``fsync`` (the line is on disk when this returns)."""
    line = json.dumps(record) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def _key(record: dict) -> tuple[str, int, str]:
    return record["method"], int(record["seed"]), record["prompt_id"]


#: a PNG's last chunk, IEND with no data and its CRC: present at the end of every complete PNG
_PNG_END = bytes.fromhex("0000000049454e44ae426082")
_PNG_SIGNATURE = bytes.fromhex("89504e470d0a1a0a")


def file_complete(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a whole PNG or safetensors file, by its ends only (no decoding: a bench of 5000
    prompts reads every kept file's ends on resume): a PNG starts with its signature and ends with its IEND
    chunk; a safetensors file's 8-byte header length, JSON header and tensor data add up to its size. A file
    cut short (a copy or a disk that filled, not csdgen's own writes, which are atomic) fails; a missing or
    unreadable one too."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if path.suffix == ".png":
                if size < len(_PNG_SIGNATURE) + len(_PNG_END) or f.read(len(_PNG_SIGNATURE)) != _PNG_SIGNATURE:
                    return False
                f.seek(size - len(_PNG_END))
                return f.read(len(_PNG_END)) == _PNG_END
            if path.suffix == ".safetensors":
                length = int.from_bytes(f.read(8), "little")
                if size < 8 or length > size - 8:
                    return False
                header = json.loads(f.read(length))
                ends = [int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"]
                return size == 8 + length + max(ends, default=0)
            return True
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return False


def existing_records(out: str | os.PathLike) -> dict[tuple[str, int, str], dict]:
    """(method, seed, prompt id) -> record, over every rank file in ``out/records`` whose image and tensors
    files are there and whole (:func:`file_complete`: a file cut short outside csdgen is made again; the last
    line wins when a key appears twice).

    Raises:
        ValueError: a line that is not a JSON object, not UTF-8, or whose method, seed, prompt id,
            image or tensors field has the wrong type (naming the file and line).
    """
    out = Path(out)
    found: dict[tuple[str, int, str], dict] = {}
    for path in sorted((out / RECORDS_DIR).glob("rank*.jsonl")):
        for number, record in _numbered_jsonl(path):
            _check_record_line(record, path, number)
            if file_complete(out / record["image"]) and file_complete(out / record["tensors"]):
                found[_key(record)] = record
    return found


#: the files a bench writes into its folder besides speed_quality_<score>.png (the manifest first; its
#: records/ and images/ folders are left out: the folder lock of a bench's process is made in records/ before)
BENCH_FILES = ("report.md", "report.csv", "records.jsonl", "acceptance_lengths.csv", "texture.csv")


def check_settings(out: str | os.PathLike, settings: dict, *, write: bool, partial: bool = False, world: int = 1) -> None:
    """Compare ``settings`` with the folder's ``bench.json`` (and write it when absent and ``write``).
    ``partial``: ``settings`` holds only some keys (those known before a model is read): only they are
    compared, a key the manifest lacks is "unset there". ``world``: the processes of this bench (with
    ``write``: rank files of ranks 1 .. world - 1 may be written now by this bench's other processes).

    Raises:
        ValueError: the folder holds a bench of other settings (naming every value that differs; a sweep's
            grids, :data:`SWEEP_GRIDS`, are not compared: its settings' names carry them),
            or a malformed ``bench.json``; with ``write``, a folder without ``bench.json`` holding
            files a bench writes (:data:`BENCH_FILES`: not a bench's, they would be overwritten) or
            records (``records/rank0.jsonl``, or a rank beyond ``world``, holding lines: made under
            settings nobody recorded, they would be resumed as this run's images).
    """
    path = Path(out) / MANIFEST
    if path.exists():
        manifest = read_json(path, what="a csdgen bench manifest")
        if manifest.get("schema") != SCHEMA or not isinstance(manifest.get("settings"), dict):
            raise ValueError(f"{str(path)!r} is not a csdgen bench manifest; use another --out")
        old, new = weights_compared(defaults_resolved(same_checkpoint(_sweep_grids(manifest["settings"], settings))),
                                    defaults_resolved(same_checkpoint(settings)))
        if partial:
            old = {k: old[k] for k in new if k in old}
        unmade = _options_of_unmade_methods(Path(out), old, new)
        old = {k: v for k, v in old.items() if k not in unmade}
        differ = settings_difference(old, {k: v for k, v in new.items() if k not in unmade})
        if differ:
            raise ValueError(f"{str(Path(out))!r} holds a bench with other settings ({'; '.join(differ)}); "
                             f"use another --out, or the earlier settings to resume")
        grown = _grown_grids(manifest["settings"], settings)
        if not partial:  # an option of methods not made yet: the folder's value is this run's from now on
            grown = {k: v for k, v in grown.items() if k not in unmade}
            grown.update({k: settings[k] for k in unmade if k in settings})
        if write and not partial and grown != manifest["settings"]:  # a rerun's added grid values or new options
            write_json({**manifest, "settings": grown}, path)
    elif write:
        folder = Path(out)
        ours = [f"{RECORDS_DIR}/{p.name}" for p in sorted((folder / RECORDS_DIR).glob("rank*.jsonl"))
                 if _foreign_rank(p.name, world) and p.is_file() and p.stat().st_size > 0]
        ours += [f for f in BENCH_FILES if (folder / f).exists()] + sorted(p.name for p in folder.glob("speed_quality_*.png"))
        if ours:  # a bench writes its manifest first: these are not a bench's, and would be overwritten
            fate = ("resumed as this run's images (made under settings nobody recorded)" if ours[0].startswith(RECORDS_DIR)
                    else "overwritten")
            raise ValueError(f"{str(folder)!r} holds {ours[0]!r}"
                             f"{f' and {len(ours) - 1} more of the files a bench writes' if len(ours) > 1 else ''} but no "
                             f"{MANIFEST}, so they are not a bench's and would be {fate}; use another --out, or "
                             f"move them")
        write_json({"schema": SCHEMA, "created": _now(), "settings": settings}, path)


#: a sweep's grids in its bench.json: the windows, CSD's lambdas and deltas and Addition's constants its settings
#: run at (bench's one value each is what a bench records there)
SWEEP_GRIDS = ("window", "lam", "delta", "addition_c")


def _is_sweep(previous: dict, current: dict) -> bool:
    """Whether ``previous`` (a manifest's settings) is a sweep's and ``current`` a sweep's too, or the settings
    known before its model is read (no ``command`` yet: a bench's full settings, compared later, name theirs)."""
    return previous.get("command") == "sweep" and current.get("command", "sweep") == "sweep"


def _sweep_grids(previous: dict, current: dict) -> dict:
    """``previous`` with its :data:`SWEEP_GRIDS` taken as ``current``'s where both are a sweep's (:func:`_is_sweep`):
    they are not compared, because each setting's name carries its own values (``csd_lam1.0_W16_uniform``), so no
    record is taken for another value's and a rerun with more values adds their settings to the folder (folders
    written before a sweep recorded its grids hold bench's one value of each)."""
    if _is_sweep(previous, current):
        return {**previous, **{k: current[k] for k in SWEEP_GRIDS if k in current}}
    return previous


def _grown_grids(previous: dict, current: dict) -> dict:
    """``previous`` (a sweep's manifest settings) with each of its :data:`SWEEP_GRIDS` grown by ``current``'s values
    (in order, each once): what the folder's settings have run at after this run. Unchanged where either is not a
    sweep's; a grid recorded as one number (before a sweep recorded its grids) is replaced."""
    if not (_is_sweep(previous, current) and current.get("command") == "sweep"):
        return previous
    grown = dict(previous)
    for key in SWEEP_GRIDS:
        if isinstance(current.get(key), list):
            kept = previous.get(key) if isinstance(previous.get(key), list) else []
            grown[key] = kept + [v for v in current[key] if v not in kept]
    return grown


def _options_of_unmade_methods(out: Path, previous: dict, current: dict) -> set[str]:
    """The method options (:data:`csdgen.method_options.METHOD_OPTIONS`: CSD's lambda, Addition's constant, ...)
    whose value differs between ``previous`` (the manifest's settings) and ``current`` although no record in
    ``out`` is of a method that uses them: no image was made at the recorded value (a bench of ``--methods
    ar,sjd`` recorded ``--lam`` too), so this run's value is no other setting. The records' own settings are
    checked against this run's by each method later (``bench._refuse_records_of_other_settings``)."""
    from csdgen.method_options import METHOD_OPTIONS, option_used

    missing = object()
    changed = [k for k in METHOD_OPTIONS if previous.get(k, missing) != current.get(k, missing)]
    if not changed:
        return set()
    made = _made_methods(out)
    return {k for k in changed if not option_used(k, made)}


def _made_methods(out: Path) -> set[str]:
    """The methods (``generate``'s names: a ``csd-coupled`` row's is ``csd``) of every complete record line in
    ``out``'s rank files, whether or not its files are whole (one cut short is made again, at this run's settings,
    but is counted here: the answer errs towards refusing)."""
    return {record_method(record) for path in sorted((out / RECORDS_DIR).glob("rank*.jsonl"))
            for _, record in _numbered_jsonl(path)}


def record_method(record: dict) -> str:
    """The ``generate`` method that made a bench record's image: its settings' ``method``, or, in a record from
    before per-image settings, its row's name (a ``csd-coupled`` row's is ``csd``)."""
    settings = record.get("settings")
    method = settings.get("method") if isinstance(settings, dict) else None
    return method if isinstance(method, str) else str(record.get("method")).removesuffix("-coupled")


def _foreign_rank(name: str, world: int) -> bool:
    """Whether ``rank<R>.jsonl`` cannot be written now by a process of this bench of ``world`` processes:
    rank 0 is the caller (it writes the manifest before any record), ranks from ``world`` on do not run."""
    rank = name[len("rank"):-len(".jsonl")]
    return not (rank.isascii() and rank.isdigit()) or int(rank) == 0 or int(rank) >= world


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
