"""What kind of csdgen output a folder holds, so that one kind is never written into another's folder.

Each command that resumes writes a folder of one kind, known by the file it writes first:

* ``"run"``: ``csdgen generate`` and :func:`csdgen.save_run` (``record.json``, :mod:`csdgen.runs`);
* ``"bench"``: ``csdgen bench``, and ``compare`` / ``sweep`` with ``--model`` or ``--prompts``
  (``bench.json``, :mod:`csdgen.bench_records`);
* ``"cached runs"``: ``csdgen compare`` and ``sweep`` on the built-in model's classes
  (``run_<method>.json``, :mod:`csdgen.method_runs`).

Two kinds in one folder resumed, reported and overwrote beside each other (a plain ``compare``
replaced a bench-mode ``compare``'s ``compare.md``; ``generate`` wrote its images into a bench's folder).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["KINDS", "kind_of", "refuse_other_kind"]

#: kind -> (what writes it, how its marker file is found in the folder)
KINDS = {
    "run": ("a run of generate or save_run", "record.json"),
    "bench": ("a csdgen bench", "bench.json"),
    "cached runs": ("the cached runs of compare or sweep", "run_*.json"),
}


def kind_of(folder: str | os.PathLike) -> list[str]:
    """The kinds whose marker files ``folder`` holds (none: a new folder, or one of the user's own).
    A folder that cannot be read holds none (making or writing into it says why)."""
    folder = Path(folder)
    found = []
    try:
        for kind, (_, marker) in KINDS.items():
            if any(p.is_file() for p in folder.glob(marker)):  # a name without "*" matches itself
                found.append(kind)
    except OSError:  # a name too long, a folder not readable
        return []
    return found


def refuse_other_kind(folder: str | os.PathLike, kind: str) -> None:
    """Refuse to write output of ``kind`` into ``folder`` when it holds output of another kind.

    Raises:
        ValueError: naming the folder, what it holds (and by which file) and what would be written,
            with "use another --out".
        KeyError: an unknown ``kind`` (a programming error).
    """
    what = KINDS[kind][0]
    other = [k for k in kind_of(folder) if k != kind]
    if other:
        holds, marker = KINDS[other[0]]
        raise ValueError(f"{str(folder)!r} holds {holds} ({marker}); {what} keeps a folder of its own: use another --out")
