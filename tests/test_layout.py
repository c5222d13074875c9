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
    """The core modules imported first (fresh interpreter) load at most the engine's results and stream kinds."""
    code = ("import sys, csdgen.sampling, csdgen.acceptance, csdgen.drafting, csdgen.trees; "
            "print(sorted(m for m in sys.modules if m.startswith('csdgen.engine')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert eval(out) == ["csdgen.engine", "csdgen.engine.results", "csdgen.engine.streams"]


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
