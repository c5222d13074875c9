"""Helpers the CLI tests share: run ``csdgen`` in-process and read its one-line errors."""

from __future__ import annotations

import re

import pytest

from csdgen import cli


def run(*argv) -> int:
    """``csdgen ARGV`` in this process (arguments converted with ``str``); returns the exit code."""
    return cli.main([str(a) for a in argv])


def usage_error(capsys, *argv, one_line: bool = False) -> str:
    """Run ``csdgen ARGV``, expect argparse's usage error (exit 2) and return stderr
    (``one_line``: also require the error to be a single line)."""
    with pytest.raises(SystemExit) as exc:
        cli.main([str(a) for a in argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    if one_line:
        assert err.count("\n") == 1, err
    return err


def one_line_usage_error(capsys, *argv) -> str:
    """:func:`usage_error` requiring the error to be a single line."""
    return usage_error(capsys, *argv, one_line=True)


#: a run's first line (csdgen.cli._common.choose_dtype), printed when decoding starts: not part of an error
RUN_LINE = re.compile(r"csdgen \w+: .+ on \w+(:\d+)?, (float32|bfloat16|float16) \(.+\)\n")


def cli_error(capsys, *argv) -> str:
    """Run ``csdgen ARGV``, expect csdgen's own error (exit 2, one line, no traceback); return it
    (a run line before it, when the error came after decoding began, is left out)."""
    assert run(*argv) == 2
    err = capsys.readouterr().err
    err = err[RUN_LINE.match(err).end():] if RUN_LINE.match(err) else err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err
