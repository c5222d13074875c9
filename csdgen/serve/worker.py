"""The image worker: VQ decoding and PNG encoding off the scheduler thread.

The scheduler hands each finished image (and each partial image of a stream) to one
:class:`ImageWorker` and goes on with the next iteration of its batch; the worker's thread turns
the tokens into a PNG (:mod:`csdgen.serve.images`) and runs what follows with it (the scheduler's
callback posts the image to its request). One thread and one first-in first-out queue: a
request's partial images and its final image reach it in the order they were made.

On CUDA the scheduler copies the tokens to the host (``[N]`` int64, a small copy after the
iteration that finished them), and the worker runs the VQ decoder on a CUDA stream of its own, so
the decode overlaps the batch's next forwards instead of waiting in line behind them. On the CPU
there is no stream: the worker is a thread beside the scheduler's, and its torch work runs on one
CPU thread, so that the scheduler's thread holds the process's only OpenMP pool
(:mod:`csdgen.torch_threads`: a second pool slows every iteration on a CPU).

A failed decode fails its item only (the callback's ``error``); :meth:`ImageWorker.close` drains
the queue for at most ``timeout`` seconds and returns the items it could not finish, so that their
requests can be answered and shutdown never hangs on a stuck decode.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["ImageWorker", "Work", "decode_stream"]


@dataclass
class Work:
    """One image to encode.

    Attributes:
        tokens: ``[N]`` int64 CPU tokens (for a partial image: committed, then pending drafts).
        committed: ``None`` for a final image; for a partial image, how many tokens are committed
            (the cells after them are veiled, :func:`csdgen.serve.images.partial_png`).
        done: called in the worker's thread with the PNG bytes.
        error: called in the worker's thread with the exception when the decode failed.
        owner: what the item belongs to (the scheduler's job), for :meth:`ImageWorker.close`'s answer.
    """

    tokens: torch.Tensor
    committed: int | None
    done: Callable[[bytes], None]
    error: Callable[[Exception], None]
    owner: Any = None


def decode_stream(device: torch.device):
    """The CUDA stream the worker decodes on: a new one for a CUDA device, ``None`` elsewhere
    (the CPU: the decode runs in the worker's thread without a stream)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.Stream(device=device)


class ImageWorker:
    """One thread that encodes the images of one model (module docstring).

    Args:
        model: the served model (``decode_images``, ``grid``, ``device``).
    """

    def __init__(self, model):
        self.model = model
        self._cond = threading.Condition()
        self._items: collections.deque[Work] = collections.deque()
        self._current: Work | None = None
        self._closing = False
        self._stream = decode_stream(model.device)
        self._ready = threading.Event()
        threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._run, name="csdgen-images", daemon=True)
        self._thread.start()
        self._ready.wait()
        # its one thread also became torch's process-wide count: the caller's own count is put back
        # there, for the threads started after this one (the scheduler's)
        torch.set_num_threads(threads)

    @property
    def pending(self) -> int:
        """Items queued or being encoded."""
        with self._cond:
            return len(self._items) + (self._current is not None)

    def submit(self, work: Work) -> None:
        """Queue one image (returns at once). Tokens still on a device are copied to the host here,
        in the caller's thread (``[N]`` int64: a small copy), so the worker never reads a tensor
        the batch may still write.

        Raises:
            RuntimeError: the worker was closed.
        """
        work.tokens = work.tokens.cpu()  # the same tensor when it is on the host already
        with self._cond:
            if self._closing:
                raise RuntimeError("the image worker is closed")
            self._items.append(work)
            self._cond.notify()

    def close(self, timeout: float = 10.0) -> list[Work]:
        """Encode what is queued, for at most ``timeout`` seconds, then stop the thread.

        Returns:
            the items not encoded when the time ran out (the one being encoded first), for the
            caller to answer; empty once the queue drained.
        """
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        with self._cond:
            left = ([self._current] if self._current is not None else []) + list(self._items)
            self._items.clear()
        return left

    def encode(self, work: Work) -> bytes:
        """The PNG of one item (called in the worker's thread; on CUDA, on the worker's stream)."""
        from . import images

        if self._stream is None:
            return self._encode(images, work)
        with torch.cuda.stream(self._stream):
            return self._encode(images, work)

    def _encode(self, images, work: Work) -> bytes:
        if work.committed is None:
            return images.png_bytes(self.model, work.tokens)
        return images.partial_png(self.model, work.tokens, work.committed)

    def _run(self) -> None:
        from csdgen.torch_threads import single_threaded

        try:
            single_threaded()
        finally:
            self._ready.set()
        while True:
            with self._cond:
                while not self._items and not self._closing:
                    self._cond.wait()
                if not self._items:
                    return
                work = self._current = self._items.popleft()
            try:
                png = self.encode(work)
            except Exception as exc:  # one image's failure: its request is told, the worker goes on
                self._finish(work.error, exc)
            else:
                self._finish(work.done, png)
            with self._cond:
                self._current = None

    @staticmethod
    def _finish(callback, value) -> None:
        try:
            callback(value)
        except Exception:  # a callback's bug must not stop the images of every other request
            from .logs import log

            log.exception("the image worker's callback failed")
