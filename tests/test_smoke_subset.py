"""The quick subset (``-m smoke``): every name in ``SMOKE_TESTS`` names a test of the suite, and
the marker is declared, so a renamed or deleted test cannot silently shrink the subset."""

import ast
import tomllib
from pathlib import Path

from conftest import SMOKE_TESTS

TESTS = Path(__file__).resolve().parent


def test_every_smoke_name_is_a_test_of_the_suite():
    defined = set()
    for path in TESTS.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                defined.add(node.name)
    missing = sorted(SMOKE_TESTS - defined)
    assert not missing, f"SMOKE_TESTS names tests that do not exist: {missing}"
    assert len(SMOKE_TESTS) >= 15


def test_the_smoke_marker_is_declared_in_pyproject():
    markers = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("smoke:") for m in markers)
