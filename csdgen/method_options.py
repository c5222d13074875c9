"""Which methods use which option: the one table behind ``csdgen generate``'s notes (``--lam 0.9 does
not apply to --method sjd``) and the server's (``notes`` in an answer's ``csdgen`` block), so both
say the same of the same option. Plain Python: the command-line parser imports it without torch."""

from __future__ import annotations

from typing import Any

__all__ = ["METHOD_OPTIONS", "unused_options", "option_used"]

#: option -> the methods that use it ("speculative": every method but ar, which has no drafts)
METHOD_OPTIONS: dict[str, tuple[str, ...] | str] = {
    "lam": ("csd",), "delta": ("csd",), "entropy_unit": ("csd",), "addition_c": ("addition",),
    "gsd_radius": ("gsd",), "lantern_delta": ("lantern",),
    "draft_init": "speculative", "refresh": "speculative",
}


def unused_options(given: dict[str, Any], method: str) -> list[tuple[str, Any, str]]:
    """The options of ``given`` (name -> value; None: not given) that ``method`` does not use, in
    ``given``'s order, each as ``(name, value, why)``: ``why`` is ``"only csd uses it"`` or ``"AR has
    no drafts"``. Names not in :data:`METHOD_OPTIONS` are used by every method.

    Raises:
        Nothing: an unknown method uses no option of the table (the caller has checked the method).
    """
    out = []
    for name, value in given.items():
        users = METHOD_OPTIONS.get(name)
        if value is None or users is None:
            continue
        if not _uses(users, method):
            out.append((name, value, "AR has no drafts" if users == "speculative" else f"only {', '.join(users)} uses it"))
    return out


#: the methods :data:`METHOD_OPTIONS` knows (generate's names; a bench's ``csd-coupled`` row is ``csd``)
KNOWN_METHODS = ("ar", "sjd", "csd", "addition", "jacobi", "gsd", "lantern")


def option_used(name: str, methods) -> bool:
    """Whether any of ``methods`` (generate's method names) uses option ``name``. A name not in
    :data:`METHOD_OPTIONS` is used by every method, and a method not in :data:`KNOWN_METHODS` (another
    rule of the caller's own) is taken to use every option."""
    users = METHOD_OPTIONS.get(name)
    for method in methods:
        if users is None or method not in KNOWN_METHODS:
            return True
        if _uses(users, method):
            return True
    return False


def _uses(users: tuple[str, ...] | str, method: str) -> bool:
    """Whether ``method`` is among an option's ``users`` (a :data:`METHOD_OPTIONS` value)."""
    return method != "ar" if users == "speculative" else method in users
