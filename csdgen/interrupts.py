"""Ctrl-C for a process started with SIGINT ignored.

A shell starts a script's background job (``csdgen serve &``) with SIGINT ignored, and Python then
installs no handler of its own: ``kill -INT`` did nothing to such a server, and only SIGTERM stopped
it. The long-running commands (``csdgen serve``, ``csdgen demo``) call :func:`restore_ctrl_c` first.
"""

from __future__ import annotations

import signal
import threading


def restore_ctrl_c() -> bool:
    """Put Python's own SIGINT handler (``KeyboardInterrupt``) back where SIGINT is ignored.

    Only from the main thread (Python allows signal handlers there only); a handler someone set is left
    as it is.

    Returns:
        True where the handler was put back, False where SIGINT was not ignored or this is not the main thread.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return True
