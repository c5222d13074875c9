"""The first line a benchmark prints: the command that ran it and the commit of the checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def commit() -> str:
    """The checkout's short commit hash; "" where git or the repository is missing."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except OSError:
        return ""


def command_line(script: str, argv: list[str] | None) -> str:
    """``# python benchmarks/<script> <arguments> (commit <hash or unknown>)``; ``argv`` None: ``sys.argv``'s."""
    arguments = " ".join(argv if argv is not None else sys.argv[1:])
    return f"# python benchmarks/{script} {arguments} (commit {commit() or 'unknown'})"
