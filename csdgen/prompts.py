"""Prompt sets for benchmarks: MS-COCO 2017 val captions, PartiPrompts, or a user's file.

Shipped sets (``csdgen/data``, see its README for sources and licences):

* ``"coco"``: the 5000 MS-COCO 2017 validation images, one caption each: the **first**
  caption listed for the image in the COCO 2017 val caption file, whitespace collapsed. In
  increasing image id. ``Prompt.id`` is the 12-digit image id (the val2017 file stem),
  ``Prompt.reference`` the val2017 file name.
* ``"parti"``: the 1632 PartiPrompts (Yu et al., 2022) in file order; ``Prompt.id`` is the
  1-based row (``"0001"``), ``Prompt.category`` the ``Category`` column.

A path names a user file:

* ``*.jsonl``: one JSON object a line with ``caption`` (str), ``captions`` (list: the first
  is taken, as for ``"coco"``), ``prompt`` or ``text``; optional ``id`` / ``image_id``,
  ``category``, ``file_name``;
* ``*.tsv``: a header line with a ``Prompt`` column (optional ``Category``), as PartiPrompts;
* anything else: plain text, one prompt a line; blank lines are skipped. ``Prompt.id`` is
  the 1-based line number, so ids do not change with ``offset``.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

__all__ = ["Prompt", "PROMPT_SETS", "check_text", "load_prompts", "read_prompt_text"]

#: Names of the shipped prompt sets -> file in ``csdgen/data``.
PROMPT_SETS = {"coco": "coco2017_val_captions_first.jsonl", "parti": "PartiPrompts.tsv"}


@dataclass(frozen=True)
class Prompt:
    """One prompt of a set.

    Attributes:
        id: stable identifier within its set (file-name safe: digits, letters, ``-_.``).
        text: the prompt given to the model.
        category: the set's category for the prompt (PartiPrompts), else None.
        reference: the real image the prompt describes (COCO val2017 file name), else None.
    """

    id: str
    text: str
    category: str | None = None
    reference: str | None = None


def read_prompt_text(path: str | os.PathLike, what: str = "prompt file") -> str:
    """A prompt file's text: UTF-8, a leading byte-order mark (Windows editors write one) dropped.

    Raises:
        ValueError: not UTF-8 (naming the file and the byte), or unreadable (naming the file and why).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read {what} {str(path)!r}: {error.strerror or error}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ValueError(f"{what} {str(path)!r} is not UTF-8 text (byte {error.start}, line {line}: "
                         f"{data[error.start:error.start + 1]!r}); save it as UTF-8") from None


def check_text(text: str, what: str = "prompt") -> str:
    """``text`` if it holds no lone surrogate (so a tokenizer can take it), else a ValueError.

    Python decodes command-line bytes that are not UTF-8 with ``surrogateescape``: byte ``0xE9``
    arrives as ``'\\udce9'``, which no tokenizer accepts. Such a character is reported as the byte
    it stands for (its offset in the UTF-8 text); any other lone surrogate as itself.

    Raises:
        ValueError: naming ``what``, the text, the bad byte or character and its offset.
    """
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            break
    else:
        return text
    if "\udc80" <= ch <= "\udcff":  # surrogateescape: an undecodable byte
        offset = len(text[:i].encode("utf-8"))
        raise ValueError(f"{what} {text!r} is not UTF-8 text (byte {offset}: {bytes([ord(ch) - 0xDC00])!r}); "
                         "give it as UTF-8")
    raise ValueError(f"{what} {text!r} holds a lone surrogate {ch!r} at character {i}, which is not text; "
                     f"allowed: a string that encodes as UTF-8")


def _clean(text: str) -> str:
    return " ".join(str(text).split())


def _safe_id(value, fallback: str) -> str:
    text = str(value).strip()
    return text if text and all(c.isalnum() or c in "-_." for c in text) else fallback


def _read_jsonl(text: str, source: str) -> list[Prompt]:
    from .jsonio import json_lines

    prompts = []
    for number, obj in json_lines(text.splitlines(), source, not_json="not a JSON object"):
        if isinstance(obj.get("captions"), list) and obj["captions"]:
            caption = obj["captions"][0]
        else:
            caption = next((obj[k] for k in ("caption", "prompt", "text") if isinstance(obj.get(k), str)), None)
        if caption is None or not _clean(caption):
            raise ValueError(f"{source}:{number}: no prompt (expected a 'caption', 'captions', 'prompt' or 'text' field)")
        if "image_id" in obj:
            default_id = f"{int(obj['image_id']):012d}" if str(obj["image_id"]).isdigit() else str(obj["image_id"])
        else:
            default_id = obj.get("id", f"{number:05d}")
        prompts.append(Prompt(id=_safe_id(default_id, f"{number:05d}"), text=_clean(caption),
                              category=obj.get("category"), reference=obj.get("file_name")))
    return prompts


def _read_tsv(text: str, source: str) -> list[Prompt]:
    reader = csv.DictReader(text.splitlines(), delimiter="\t")
    if not reader.fieldnames or "Prompt" not in reader.fieldnames:
        raise ValueError(f"{source}: a .tsv prompt file needs a header line with a 'Prompt' column, got {reader.fieldnames}")
    prompts = []
    for number, row in enumerate(reader, 1):
        if _clean(row.get("Prompt") or ""):
            prompts.append(Prompt(id=f"{number:04d}", text=_clean(row["Prompt"]), category=row.get("Category") or None))
    return prompts


def _read_lines(text: str) -> list[Prompt]:
    return [Prompt(id=f"{number:05d}", text=_clean(line)) for number, line in enumerate(text.splitlines(), 1) if line.strip()]


def load_prompts(source: str | os.PathLike, limit: int | None = None, offset: int = 0) -> list[Prompt]:
    """The prompts of a shipped set or a file, ``prompts[offset : offset + limit]``.

    Args:
        source: ``"coco"``, ``"parti"`` (see :data:`PROMPT_SETS`) or a path to a prompt file
            (``.jsonl``, ``.tsv`` or plain text; see the module docstring).
        limit: how many prompts to return at most (None: all from ``offset`` on); >= 1.
        offset: index of the first prompt returned; 0 <= offset < number of prompts.

    Returns:
        A list of :class:`Prompt`, in set order.

    Raises:
        ValueError: unknown set name (a name that is neither a set nor an existing file),
            a pipe or device instead of a file, unreadable or empty file, bad ``limit`` or ``offset``.
            One line each.
    """
    name = str(source)
    if not isinstance(source, os.PathLike) and name in PROMPT_SETS:
        filename = PROMPT_SETS[name]
        text = resources.files("csdgen").joinpath("data", filename).read_text(encoding="utf-8")
        prompts = _read_jsonl(text, filename) if filename.endswith(".jsonl") else _read_tsv(text, filename)
    else:
        path = Path(source)
        if not path.is_file():
            looks_like_path = os.sep in name or "." in path.name or path.parent.exists() and path.parent != Path(".")
            if path.is_dir():
                raise ValueError(f"prompt file {name!r} is a folder; allowed: {', '.join(PROMPT_SETS)} or the path of a "
                                 f"prompt file")
            if path.exists():  # a pipe (`<(grep ...)`) or a device: read once, where a run reads its prompts again to resume
                raise ValueError(f"prompt file {name!r} is not a regular file (a pipe or a device); allowed: "
                                 f"{', '.join(PROMPT_SETS)} or the path of a prompt file (save the prompts to one first)")
            if looks_like_path:
                raise ValueError(f"prompt file {name!r} does not exist; allowed: {', '.join(PROMPT_SETS)} or the path of "
                                 f"a prompt file")
            raise ValueError(f"unknown prompt set {name!r}: use one of {', '.join(PROMPT_SETS)} or the path of a prompt file")
        text = read_prompt_text(path)
        suffix = path.suffix.lower()
        prompts = _read_jsonl(text, str(path)) if suffix == ".jsonl" else _read_tsv(text, str(path)) if suffix == ".tsv" else _read_lines(text)
        if not prompts:
            raise ValueError(f"prompt file {path} holds no prompts")
        seen: set[str] = set()
        for prompt in prompts:
            if prompt.id in seen:
                raise ValueError(f"prompt file {path}: id {prompt.id!r} appears twice; ids name the output files and must be unique")
            seen.add(prompt.id)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit {limit!r}: allowed a positive integer or None")
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < len(prompts):
        raise ValueError(f"offset {offset!r}: allowed an integer in 0..{len(prompts) - 1} for {name} ({len(prompts)} prompts)")
    return prompts[offset : None if limit is None else offset + limit]
