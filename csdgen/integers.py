"""Integers (and numbers) as the API takes them: Python's, numpy's and 0-d torch integer tensors alike (no
torch import here, so the class-name tables use it too)."""

from __future__ import annotations

import math
import numbers
import operator


def is_number(value) -> bool:
    """True for a real number (int, float, numpy's): not a bool and not a string. Sampling settings
    and rule parameters are checked with it before any comparison, so a wrong type gets the
    one-line error naming its argument, not a bare TypeError naming none."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_finite_at_least_0(value) -> bool:
    """True for a real number (:func:`is_number`) that is finite and >= 0: a guidance scale, a temperature, a
    clamping floor."""
    return is_number(value) and math.isfinite(value) and value >= 0


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


def integers_per_image(name: str, values, count: int, low: int | None = None, high: int | None = None) -> list[int]:
    """``values`` (argument ``name``) as one Python int per image of ``count``, each in ``low .. high``
    where given: numpy's and torch's integers are taken (:func:`as_integer`; ``np.arange(8, 16)``).
    ``generate``'s ``image_indices`` and ``ContinuousBatch.admit``'s ``seeds`` and ``image_indices``.

    Raises:
        ValueError: a bare value (``seeds=3`` for one image is still a list of one: the message gives
            ``[3]``), a wrong count, or a value that is not such an integer; the message names the
            argument, the values (the first 8 of a long list) and what is allowed.
    """
    images = f"{count} image{'s' * (count != 1)}"
    bounds = ("" if low is None and high is None else f" >= {low}" if high is None
              else f" in {low}..{high}" + (" (2**63 - 1)" if high == 2**63 - 1 else ""))
    try:
        given = list(values)
    except TypeError:
        raise ValueError(f"{name}={values!r}: allowed a list of one integer{bounds} per image ({images}), "
                         f"e.g. [{values!r}]") from None
    out = [as_integer(v) for v in given]
    if len(out) != count or any(v is None or (low is not None and v < low) or (high is not None and v > high)
                                for v in out):
        shown = given if len(given) <= 8 else f"[{', '.join(map(str, given[:8]))}, ...]"
        raise ValueError(f"{name}={shown} ({len(given)} value{'s' * (len(given) != 1)} for {images}): "
                         f"allowed one integer{bounds} per image")
    return out
