"""The ``csdgen`` command: a package of thin commands over :mod:`csdgen.runs`.

One module per command (``generate``, ``compare``, ``sweep``, ``bench``, ``demo``, ``serve``, ``plan``), each with ``add_parser(sub)``
(its own options and defaults) and ``run(args)``; shared options in :mod:`._options`, shared
start-up steps in :mod:`._common`. Heavy modules (torch, transformers, the models) are imported
inside ``run``, so ``csdgen --help`` and usage errors return at once.

Only this package prints. Errors a user can fix end the command with exit status 2 and one
line naming the bad value and what is allowed; Ctrl-C ends it with status 130 and one line
(SIGTERM ends ``generate``, ``compare``, ``sweep`` and ``bench`` the same way, with status 143).
A command that fails leaves no output folder it made and wrote nothing into
(:func:`csdgen.atomic.undo_new_folders`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import sys
import threading
import warnings

from . import _common, bench, compare, demo, generate, plan, serve, sweep

__all__ = ["COMMANDS", "build_parser", "main"]

#: command name -> module with ``add_parser`` and ``run``
COMMANDS = {"generate": generate, "compare": compare, "sweep": sweep, "bench": bench, "demo": demo, "serve": serve,
            "plan": plan}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (the value, what is allowed, where the help is)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (options: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="csdgen", allow_abbrev=False, description="Fast AR image generation with content-aware "
                                     "speculative decoding (CSD). Run `csdgen COMMAND --help` for a command's options.")
    from csdgen import __version__

    parser.add_argument("--version", action="version", version=f"csdgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS.values():
        module.add_parser(sub)
    parser.commands = sub.choices  # command name -> its parser (main names it in usage errors)
    for command in parser.commands.values():
        # "--tree -1,2" / "--csd-lam -1,0.5": a value starting with a minus and a digit is a value (as argparse
        # reads it from Python 3.13 on), so its option's type names it and what is allowed, not "expected one
        # argument"; no csdgen option looks like a negative number
        command._negative_number_matcher = re.compile(r"-\.?\d")
    return parser


#: what an interrupted command keeps for its rerun, by command (its Ctrl-C line says it)
_KEPT = {"generate": "the images already written are kept",
         "compare": "the images already decoded are kept (run_*.json and .safetensors in --out)",
         "sweep": "the images already decoded are kept (run_*.json and .safetensors in --out)",
         "bench": "the records and images already written are kept"}


class _Terminated(KeyboardInterrupt):
    """SIGTERM during a command that resumes (:data:`_KEPT`): it stops as on Ctrl-C, with the same line,
    status 143 (a batch scheduler's stop, or torchrun's when another process of a bench failed)."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def _error(message: str) -> None:
    # progress bars are closed (``with``) before an error reaches here, so the line is free; the
    # prefix is the running command's, as argparse's own errors have it (``csdgen serve: error: ...``)
    sys.stderr.write(f"{_common.prefix()}: {message}\n")
    sys.stderr.flush()


def entry() -> None:
    """The ``csdgen`` command (``python -m csdgen`` and the console script): :func:`main`, then exit.

    After Ctrl-C the process ends with ``os._exit(130)`` (after SIGTERM, 143) once stdout and stderr are flushed:
    ending through the interpreter's shutdown, a SIGINT that had landed inside an import made
    the process kill itself with SIGINT (status -2 instead of 130) after the one-line message.
    Everything the run wrote is already on disk (atomic writes).
    """
    import os

    code = main()
    if code in (130, 143):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)


@contextlib.contextmanager
def _stops_handled(command: str | None):
    """Both stops, SIGTERM and Ctrl-C, end a running command with its one line. While a command that resumes
    runs (:data:`_KEPT`) in the main thread with SIGTERM at its default (which ended the process with no
    line, status -15), SIGTERM raises :class:`_Terminated`.

    A stop raised while Python runs a finaliser (``__del__``, garbage collection) is printed as "Exception
    ignored" and dropped, and the command ran on to its end with status 0; while the command runs, such a
    stop (Ctrl-C's too) is delivered again, outside the finaliser (:func:`_deliver_again`)."""
    import signal

    main = threading.current_thread() is threading.main_thread()
    own = command in _KEPT and main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if own else None
    hook = sys.unraisablehook
    if main:
        sys.unraisablehook = functools.partial(_deliver_again, hook)
    try:
        yield
    finally:
        if main:
            sys.unraisablehook = hook
        if own:
            signal.signal(signal.SIGTERM, previous)


def _deliver_again(previous, unraisable) -> None:
    """``sys.unraisablehook`` while a command runs: a Ctrl-C or SIGTERM that a finaliser swallowed is
    raised again as its signal (handled at the next line the main thread runs); anything else goes on to
    ``previous``."""
    import signal

    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        stop = signal.SIGTERM if isinstance(unraisable.exc_value, _Terminated) else signal.SIGINT
        # not raised here: Python would run its handler at once, inside this hook, and drop it again (as it did
        # from a thread started here, whose start waits); a timer fires once the hook has returned
        alarm = signal.getsignal(signal.SIGALRM)
        alarm = getattr(alarm, "csdgen_previous", alarm)  # a stop swallowed twice before its timer fired

        def fire(signum, frame):
            signal.signal(signal.SIGALRM, alarm)
            signal.raise_signal(stop)  # the stop's own handler runs now, where the main thread is

        fire.csdgen_previous = alarm
        signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        return
    previous(unraisable)


def main(argv: list[str] | None = None) -> int:
    """Run ``csdgen`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    try:
        return _main(argv)
    finally:
        _common.running["command"] = None  # notes printed after it (a test's own call) name no command
        _common.running["defaulted"] = set()


def _main(argv: list[str] | None) -> int:
    command = kept = None
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        command = kept = _common.running["command"] = args.command
        if command in ("compare", "sweep") and bench.uses_bench(args):  # they write a bench's records and images
            kept = "bench"
        if extra:  # named by the command's own parser, so the hint is `csdgen COMMAND --help`
            parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
        if getattr(args, "compile", None) and getattr(args, "engine", "auto") == "eager":  # before any model loads
            parser.commands[args.command].error("--compile with --engine eager: compiled forwards need the static "
                                                "engine; allowed: --engine static or auto with --compile, or --no-compile")
        if getattr(args, "tree", None) is not None and getattr(args, "method", None) == "ar":
            parser.commands[args.command].error(f"--tree {','.join(map(str, args.tree))} with --method ar: a draft "
                                                "tree needs a speculative method (e.g. --method sjd)")
        if getattr(args, "tree", None) is not None and getattr(args, "window", None) == 1:
            parser.commands[args.command].error(f"--tree {','.join(map(str, args.tree))} with --window 1: a draft "
                                                "tree grows from the window's drafts; allowed: --window 2 or more, or auto")
        from csdgen.atomic import undo_new_folders

        # a command refused once its --out was made (a value the loaded model checks) leaves no empty folder
        with warnings.catch_warnings(), undo_new_folders(getattr(args, "out", None)), _stops_handled(command):
            # the options are explicit: --guidance-scale 1 means unguided
            # csdgen.sampling.UnguidedSamplingWarning, matched by its text: importing it would import torch
            warnings.filterwarnings("ignore", message=r"sampling=SamplingConfig\(.*\) runs unguided")
            return args.run(args)
    except ValueError as exc:
        from ._common import option_named

        _error(f"error: {option_named(str(exc))}")  # a sampling value the loaded model refuses, by its option
        return 2
    except BrokenPipeError:  # the reader closed the pipe (`--list-classes | head`): stop quietly, as ls does
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        except (OSError, ValueError):
            pass
        return 0
    except OSError as exc:  # "No space left on device while writing 'out/0003_x.png' (folder 'out')", no "[Errno 28]"
        message = exc.strerror or str(exc)
        if exc.filename is not None:
            from ..class_names import shown_path

            message += f": {shown_path(exc.filename)!r}"
        _error(f"error: {message}")
        return 2
    except KeyboardInterrupt as stop:
        if command in ("demo", "serve"):  # a server writes nothing to resume
            print(f"{_common.prefix()}: stopped", file=sys.stderr, flush=True)
        else:
            # "already written": a Ctrl-C while the model loads has written nothing
            by = " (SIGTERM)" if isinstance(stop, _Terminated) else ""
            if by and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:  # one of torchrun's processes
                by = " (SIGTERM: torchrun stops every process of a run when one of them ends; its line says why)"
            _error(f"interrupted{by}; {_KEPT.get(kept, 'anything already written is kept')}: rerun the same command "
                   f"to resume")
        return 143 if isinstance(stop, _Terminated) else 130
