"""JSON files: read with one-line errors that name the file, written atomically.

Low-level (it imports nothing of csdgen but :mod:`csdgen.atomic`), so model loaders, runs and
the commands share it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["read_json", "write_json"]


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
