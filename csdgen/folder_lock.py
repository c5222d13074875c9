"""One run per output folder: an exclusive lock held while a run writes there.

Two ``csdgen generate`` (or ``compare``, ``sweep``, :func:`csdgen.save_run`) into one folder at
once would both generate the same images and rewrite each other's ``record.json``; two
``bench`` would also time their images under each other's load. Each run therefore takes
``fcntl.flock(LOCK_EX | LOCK_NB)`` on the folder itself (``bench``: on its own
``records/rank<R>.jsonl``, so the processes of one ``torchrun`` share the folder while a second
bench's process of the same rank is refused, plus a shared lock on the folder, so that a
``generate`` or ``compare`` into a folder a bench writes is refused, and the other way round), and
a second run is refused at once. The kernel
releases the lock when its process ends, however it ends (Ctrl-C, ``kill -9``, a crash), and no
lock file is left behind. Where ``fcntl`` is missing (Windows) no lock is taken.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["FolderBusy", "folder_lock", "refuse_busy"]


class FolderBusy(ValueError):
    """Another process holds the lock (a ValueError: the CLI prints it as one line)."""


_WRITING = "another csdgen run writing into it now (generate, compare, sweep, save_run or bench)"
_WHOLE = "another csdgen run writing the whole folder now (generate, compare, sweep or save_run)"


def refuse_busy(folder: str | os.PathLike, file: str | os.PathLike | None = None, what: str = "bench") -> None:
    """Raise :class:`FolderBusy` now where :func:`folder_lock` with the same arguments would be
    refused, so that a command is refused before it loads its model (the run takes the lock itself
    later). The locks are taken and dropped at once; nothing is created: a folder or file not there
    yet passes (no run can hold it).
    """
    with folder_lock(folder, what, file, create=False):
        pass


@contextmanager
def folder_lock(folder: str | os.PathLike, what: str = "csdgen run", file: str | os.PathLike | None = None, *,
                create: bool = True) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (or on ``file`` inside it) for the ``with`` block.

    Args:
        folder: the output folder (created if missing).
        what: what runs there, for the message (e.g. ``"csdgen generate"``).
        file: lock this file (created, opened for appending, never truncated) and hold a shared lock
            on the folder: processes locking other files share the folder, a whole-folder lock excludes them.
        create: False: create nothing; a folder or file that is not there is not locked
            (:func:`refuse_busy`'s probe).

    Raises:
        FolderBusy: another process holds the lock (naming the folder).
    """
    try:
        import fcntl
    except ImportError:  # no advisory locks here: run unlocked
        yield
        return
    folder = Path(folder)
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    busy = "; wait for it to finish, or choose another --out"
    try:
        folder_fd = os.open(folder, os.O_RDONLY | (0 if create else getattr(os, "O_DIRECTORY", 0)))
    except OSError:
        if create:
            raise
        yield  # not there, not a folder or not readable: no run holds it; the command's own checks answer
        return
    try:
        try:
            fcntl.flock(folder_fd, (fcntl.LOCK_EX if file is None else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _WRITING if file is None else _WHOLE
            raise FolderBusy(f"{str(folder)!r} is in use by {holder}{busy}") from None
        try:
            if file is None:
                yield
                return
            if create:
                (folder / file).parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(folder / file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            else:
                try:
                    fd = os.open(folder / file, os.O_RDONLY)
                except OSError:  # not there yet: no run holds it
                    yield
                    return
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise FolderBusy(f"{str(folder)!r} is in use by another {what} running now{busy}") from None
                try:
                    yield
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)  # also where a child process inherited the descriptor
            finally:
                os.close(fd)
        finally:
            fcntl.flock(folder_fd, fcntl.LOCK_UN)
    finally:
        os.close(folder_fd)
