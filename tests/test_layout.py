"""Package layout: the engine's public names where they have always been, trees independent of the loop, no import circle."""

import ast
import subprocess
import sys
from pathlib import Path

import csdgen

PACKAGE = Path(csdgen.__file__).parent


def test_decoding_re_exports_the_engine():
    import csdgen.decoding
    import csdgen.engine

    assert set(csdgen.decoding.__all__) == set(csdgen.engine.__all__)
    for name in csdgen.decoding.__all__:
        assert getattr(csdgen.decoding, name) is getattr(csdgen.engine, name), name
    assert csdgen.generate is csdgen.engine.generate and csdgen.Decision is csdgen.engine.Decision


def test_core_loads_no_loop():
    """The core modules imported first (fresh interpreter) load no engine module: the decisions and
    stream kinds they read are in :mod:`csdgen.decisions`, below the engine."""
    code = ("import sys, csdgen.sampling, csdgen.acceptance, csdgen.drafting, csdgen.trees; "
            "print(sorted(m for m in sys.modules if m.startswith('csdgen.engine')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert eval(out) == []


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """Modules of the package that ``path`` imports (parents of ``module`` and the top package excluded)."""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = ".".join(base[: len(base) - node.level + 1] + [node.module or ""]).strip(".") if node.level else node.module or ""
            names = [f"{mod}.{a.name}" for a in node.names] + [mod]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module and name != "csdgen" and not module.startswith(name + "."):
                found.add(name)
    return found


def test_no_import_circle():
    files = {}
    for f in PACKAGE.rglob("*.py"):
        name = ".".join(f.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        files[name] = f
    edges = {m: _imports(f, m, set(files)) for m, f in files.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m, path):
        state[m] = 1
        for n in sorted(edges[m]):
            assert state.get(n) != 1, "import circle: " + " -> ".join(path[path.index(n):] + [n])
            if n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(files):
        if m not in state:
            visit(m, [m])


def _engine_imports(path: Path, module: str) -> list[tuple[str, str]]:
    """``(module imported, name)`` for every import of ``csdgen.engine`` or below in ``path``
    (``name`` is ``""`` for ``import csdgen.engine...``)."""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("csdgen.engine")]
        elif isinstance(node, ast.ImportFrom):
            mod = ".".join(base[: len(base) - node.level + 1] + [node.module or ""]).strip(".") if node.level else node.module or ""
            if mod == "csdgen":
                found += [("csdgen.engine", "") for a in node.names if a.name == "engine"]
            elif mod.startswith("csdgen.engine"):
                found += [(mod, a.name) for a in node.names]
    return found


def test_outside_the_engine_only_its_public_api_is_imported():
    """The rule: a module outside ``csdgen/engine/`` imports from the engine only the package
    ``csdgen.engine`` itself, and from it only names in ``csdgen.engine.__all__`` (its public API,
    no underscore). Never a submodule (``csdgen.engine.window``, ``.results``, ...): those are the
    engine's own layout, free to change; what other modules need of the engine is named in
    ``__all__``, and what the engine and others both read (:class:`Decision`, the stream kinds)
    lives below it, in :mod:`csdgen.decisions`."""
    import csdgen.engine

    public = set(csdgen.engine.__all__)
    assert not [n for n in public if n.startswith("_")]
    bad = []
    for f in PACKAGE.rglob("*.py"):
        parts = f.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[:2] == ("csdgen", "engine"):
            continue
        module = ".".join(parts).removesuffix(".__init__")
        for imported, name in _engine_imports(f, module):
            if imported != "csdgen.engine" or (name and name not in public):
                bad.append(f"{module}: {imported} {name}".strip())
    assert not bad, bad


def test_models_read_json_below_the_runs():
    """Model loaders read JSON through :mod:`csdgen.jsonio`, not the runs module above them."""
    for f in (PACKAGE / "models").rglob("*.py"):
        module = "csdgen.models." + f.stem
        assert "csdgen.runs" not in _imports(f, module, {"csdgen.runs", "csdgen.jsonio"}), f
