"""Atomic file writes: a temporary file next to the target, then a rename.

A killed run never leaves half a file under the real name. When the write itself fails (a full
disk, a folder made read-only mid-run) the temporary file is removed and the error names the
file being written, so the message says where the space ran out and no hidden ``.NAME.tmp``
files are left behind.

:func:`undo_new_folders`: a run refused before it wrote anything (a value found bad once the model
is loaded) leaves no empty output folder behind.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

__all__ = ["write_atomic", "write_text_atomic", "save_safetensors", "undo_new_folders"]


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


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist now, deepest first (a path too long
    to look at counts as missing: it cannot exist; one that cannot be looked at for another
    reason, e.g. permissions, counts as existing: it is never removed)."""
    import errno

    missing = []
    for path in (folder, *folder.parents):
        try:
            os.lstat(path)
            break
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as error:
            if error.errno != errno.ENAMETOOLONG:
                break
        missing.append(path)
    return missing


@contextmanager
def undo_new_folders(folder: str | os.PathLike | None) -> Iterator[None]:
    """Run the ``with`` block; if it raises (any exception, Ctrl-C too), remove the folders of
    ``folder``'s path that did not exist when it began and are empty now, deepest first.

    A command or :func:`csdgen.save_run` refused after it made its output folder (a value only
    the loaded model can check, a failure in the first batch) thus leaves no empty folder behind.
    Only empty folders are removed (``rmdir``), never one that existed before nor one another run
    holds locked (:mod:`csdgen.folder_lock`): whatever a run wrote stays. ``folder`` None: nothing to undo.
    """
    missing = [] if folder is None else _missing_folders(Path(folder))
    try:
        yield
    except BaseException:
        for path in missing:
            _remove_if_empty_and_free(path)
        raise


def _remove_if_empty_and_free(path: Path) -> None:
    """``rmdir`` ``path`` unless another run holds its lock (:mod:`csdgen.folder_lock`: a second
    command into the same new folder, refused, must not remove it under the first one, which may
    not have written anything yet); an error (not empty, missing) leaves it."""
    try:
        import fcntl
    except ImportError:  # no advisory locks here
        fcntl = None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: in use by another run
        path.rmdir()  # only an empty folder; a parent of a kept one is not empty either
    except OSError:
        pass
    finally:
        os.close(fd)
