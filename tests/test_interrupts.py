"""restore_ctrl_c: Python's SIGINT handler comes back where SIGINT was ignored, and only there."""

import signal
import threading

from csdgen.interrupts import restore_ctrl_c


def test_an_ignored_sigint_gets_pythons_handler_back_and_a_set_handler_is_left():
    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        assert restore_ctrl_c() is True and signal.getsignal(signal.SIGINT) is signal.default_int_handler

        def own(signum, frame):
            pass

        signal.signal(signal.SIGINT, own)
        assert restore_ctrl_c() is False and signal.getsignal(signal.SIGINT) is own
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        result = []
        thread = threading.Thread(target=lambda: result.append(restore_ctrl_c()))
        thread.start()
        thread.join()
        assert result == [False] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # not from another thread
    finally:
        signal.signal(signal.SIGINT, before)
