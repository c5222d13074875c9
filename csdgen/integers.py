"""Integers as the API takes them: Python's, numpy's and 0-d torch integer tensors alike (no torch
import here, so the class-name tables use it too)."""

from __future__ import annotations

import operator


def as_integer(value) -> int | None:
    """``value`` as Python's int if it is an integer (int, numpy's, a 0-d torch integer tensor:
    ``operator.index``), not a bool; else None. Counts, indices and seeds are checked with it, so an
    integer read from an array is taken as the int it is (as ``seed`` takes it)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None
