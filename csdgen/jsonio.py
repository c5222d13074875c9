"""JSON files: read with one-line errors that name the file, written atomically.

Low-level (it imports nothing of csdgen but :mod:`csdgen.atomic`), so model loaders, runs and
the commands share it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["read_json", "write_json", "json_lines"]


def read_json(path: str | os.PathLike, *, expect: type = dict, what: str = "") -> Any:
    """Read a JSON file; every failure is one ``ValueError`` line naming the file.

    Args:
        path: the file.
        expect: the type the top level must have (``dict`` for an object, ``list``; ``object``: any).
        what: what the file should be, for the message (e.g. ``"a transformers config"``).

    Raises:
        FileNotFoundError: no such file. ValueError: not JSON (with line and column), or the
        top level is not ``expect``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} does not exist")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{str(path)!r} is not a text file{' (expected ' + what + ')' if what else ''}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{str(path)!r} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
                         f"{'; expected ' + what if what else ''}") from None
    if expect is not object and not isinstance(obj, expect):
        kind = {dict: "a JSON object {...}", list: "a JSON list [...]"}.get(expect, expect.__name__)
        raise ValueError(f"{str(path)!r} holds a {type(obj).__name__}, expected {kind}{' (' + what + ')' if what else ''}")
    return obj


def write_json(obj: Any, path: str | os.PathLike) -> None:
    """Write JSON atomically (temporary file, then rename): a killed run never leaves half a file."""
    from csdgen.atomic import write_text_atomic

    write_text_atomic(path, json.dumps(obj, indent=2))


def json_lines(lines, source: str, *, objects: bool = True, advice: str = "", not_json: str = "not JSON"):
    """``(line number, value)`` of every non-blank line of a JSON-lines text (numbers from 1).

    Args:
        lines: the lines (``text.splitlines()``); source: the file's name for messages.
        objects: refuse a line whose value is not a JSON object.
        advice: appended to a message after ``"; "`` (what to do about the line).
        not_json: how a message calls a line that does not parse.

    Raises:
        ValueError: one line ``"SOURCE:N: not JSON (reason)"`` or ``"SOURCE:N: expected a JSON object, got list"``.
    """
    tail = f"; {advice}" if advice else ""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{source}:{number}: {not_json} ({error.msg}){tail}") from None
        if objects and not isinstance(value, dict):
            raise ValueError(f"{source}:{number}: expected a JSON object, got {type(value).__name__}{tail}")
        yield number, value
