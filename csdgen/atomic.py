"""Atomic file writes: a temporary file next to the target, then a rename.

A killed run never leaves half a file under the real name. When the write itself fails (a full
disk, a folder made read-only mid-run) the temporary file is removed and the error names the
file being written, so the message says where the space ran out and no hidden ``.NAME.tmp``
files are left behind.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

__all__ = ["write_atomic", "write_text_atomic", "save_safetensors"]


def write_atomic(path: str | os.PathLike, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` to write the temporary file, then rename it to ``path``.

    Args:
        path: the file to (re)place.
        write: writes the complete content to the path it is given.

    Raises:
        OSError: the write or the rename failed (e.g. no space left), with ``path`` as its file
            name (``str(error)`` then ends with the path); the temporary file is removed.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as error:
        try:
            tmp.unlink()
        except OSError:
            pass
        reason = error.strerror or str(error)
        raise OSError(error.errno, f"{reason} while writing {str(path)!r} (folder {str(path.parent)!r})") from None
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """:func:`write_atomic` of UTF-8 ``text``."""
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def save_safetensors(tensors: dict, path: str | os.PathLike) -> None:
    """:func:`write_atomic` of a safetensors file (safetensors' own I/O errors become OSError naming ``path``).

    The bytes are serialised in memory and written with Python's ``open``, so the file gets the
    mode every other file of a run gets (0666 less the umask: ``-rw-r--r--`` under umask 022);
    safetensors' own ``save_file`` creates its files ``-rw-------``, which another user (a
    scoring job, a shared results folder) cannot read."""
    from safetensors.torch import save

    def write(tmp: Path) -> None:
        try:
            tmp.write_bytes(save(tensors))
        except OSError:
            raise
        except Exception as error:  # noqa: BLE001 -- safetensors reports I/O failures as its own error type
            text = str(error)
            if "No space left" in text or "os error 28" in text:
                raise OSError(28, "No space left on device") from None
            if "os error" in text or "Permission denied" in text or "Read-only" in text:
                raise OSError(5, text.splitlines()[0][:200]) from None
            raise

    write_atomic(path, write)
