"""Torch's CPU threads in a process where more than one Python thread runs torch.

PyTorch's CPU operators run their parallel regions on OpenMP (libgomp in the Linux builds). libgomp
keeps a pool of worker threads for every thread that has run a parallel region, for as long as that
thread lives, and once the pooled threads of all pools outnumber the CPUs it stops spinning between
regions, so every parallel region of every thread then pays for putting its workers to sleep and
waking them (libgomp's "throttled" spin count: ``GOMP_SPINCOUNT`` in the GCC manual, section
"GOMP_SPINCOUNT"). A server that loads its model on the main thread (a pool), decodes on a scheduler
thread (a second pool) and encodes images on a worker thread (a third) is in that state whenever
torch uses more than one thread per pool: on a 2-core CPU a width-1 iteration of 12 images of the
built-in model took about 1.5 times as long as with one pool
(``benchmarks/results/torch_threads.md``).

Two rules keep one pool in such a process:

* :func:`call_in_thread`: work done once (loading a model, its warm-up) runs in a thread that ends
  with it, so its pool goes too and the long-lived thread that decodes is the only one holding one;
* :func:`single_threaded`: a long-lived helper thread that runs small torch work (the image
  worker's VQ decode) runs it on one thread, which makes no pool.

The thread that decodes sets its own thread count (:func:`set_threads`) when it starts: a thread's
OpenMP thread count is its own, and a new thread otherwise takes torch's last process-wide setting.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["call_in_thread", "set_threads", "single_threaded"]


def call_in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` run in a new thread that ends when it returns; the caller waits.

    Returns:
        what ``fn`` returns.

    Raises:
        whatever ``fn`` raises (``SystemExit`` and ``KeyboardInterrupt`` included), re-raised here.
        A ``KeyboardInterrupt`` in the caller while it waits propagates at once (the thread is a
        daemon and ends with the process).
    """
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=target, name=f"csdgen-{getattr(fn, '__name__', 'call')}", daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def set_threads(count: int) -> None:
    """This thread's torch CPU threads (``torch.set_num_threads``: OpenMP's count for the calling
    thread, and the count threads that start torch afterwards take).

    Raises:
        ValueError: ``count`` not an integer >= 1 (numpy's and torch's integers are taken).
    """
    import torch

    from .integers import as_integer

    value = as_integer(count)
    if value is None or value < 1:
        raise ValueError(f"count={count!r}: allowed an integer >= 1")
    # torch sets a thread's count from its process-wide one the first time the thread asks for it,
    # even after a set_num_threads of its own: ask first, so that this setting is the one that stays
    torch.get_num_threads()
    torch.set_num_threads(value)


def single_threaded() -> None:
    """Run this thread's torch work on one CPU thread (so it holds no OpenMP pool; module docstring).

    Call it first thing in a long-lived helper thread. It also sets torch's process-wide count to
    1 (what threads started afterwards take): the thread that started the helper puts its own back
    (``torch.set_num_threads(torch.get_num_threads())`` there, once this returned).
    """
    set_threads(1)
