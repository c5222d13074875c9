"""Public names of a package imported on first use (PEP 562), so that importing the package stays cheap."""

from __future__ import annotations

import sys
from importlib import import_module


def lazy_names(package: str, table: dict[str, str]):
    """``(__getattr__, __dir__)`` for the package ``package`` (its ``__name__``): name ``n`` of ``table``
    is ``getattr(import_module(table[n], package), n)`` (``table[n]`` a relative module such as
    ``".results"``), imported on first use and then kept in the package's namespace.

    Raises (from ``__getattr__``):
        AttributeError: a name neither in the package nor in ``table``.
    """
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str):
        if name in table:
            value = getattr(import_module(table[name], package), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted([*namespace, *table])

    return __getattr__, __dir__
