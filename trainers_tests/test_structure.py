"""The package's structure: no import circles, no arrows that run back up, no file above 500 lines.

The graph is read from the source (every ``import`` / ``from ... import``, at module level or inside a function: a
deferred import is still a dependency), over the modules of ``trl_variants``. "Up" is the method sub-packages
(``erpo``, ``eepo``, ``dph``, ``apo``, ``dapo``, ``composed``): the shared rooms (``losses.py``, ``parts.py``, the
offline pass in ``presample/``, the private ``_*.py`` helpers, ...) know no method, so nothing shared imports a method
package; only the registry, the package's public ``__init__`` and the user layer (command line, training entry
point, evaluation) name the methods."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "trl_variants"
METHODS = {"erpo", "eepo", "dph", "apo", "dapo", "composed"}
# modules that may name the methods: the catalogue of methods and what the user runs
MAY_NAME_METHODS = {"trl_variants", "trl_variants.registry", "trl_variants.cli", "trl_variants.training",
                    "trl_variants.evaluation", "trl_variants.data", "trl_variants.recipe_catalog"}
MAX_LINES = 500


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str], root: Path = ROOT) -> set[str]:
    """The ``trl_variants`` modules ``path`` imports (a name imported from a package counts as its submodule when
    there is one)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # a name inside a module: the module
                target = target.rsplit(".", 1)[0] if "." in target else ""
            if target and target != name:
                found.add(target)
    return found


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    files, root = sorted(package.rglob("*.py")), package.parent
    modules = {module_name(f, root) for f in files}
    return {module_name(f, root): imports(f, modules, root) for f in files}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Import circles between modules, a package's ``__init__`` and its own submodules aside (a package re-exporting
    its parts is not a circle)."""
    def counts(a: str, b: str) -> bool:
        return not (b.startswith(a + ".") or a.startswith(b + "."))

    found, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if not counts(node, nxt):
                continue
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found


def method_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in METHODS else None


def back_arrows(edges: dict[str, set[str]]) -> list[str]:
    """Imports of a method package from a module that is neither in that method nor allowed to name methods."""
    bad = []
    for module, targets in edges.items():
        if module in MAY_NAME_METHODS or any(module.startswith(m + ".") for m in MAY_NAME_METHODS if m != "trl_variants"):
            continue
        for target in sorted(targets):
            owner = method_of(target)
            if owner and method_of(module) is None:
                bad.append(f"{module} -> {target}")
    return bad


def test_no_import_circles():
    found = cycles(graph())
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_nothing_shared_imports_a_method():
    bad = back_arrows(graph())
    assert not bad, f"shared modules importing a method package (declare it in the method instead): {bad}"


def test_no_file_above_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"files above {MAX_LINES} lines (split by what they do): {long}"


def test_the_checks_can_fail(tmp_path):
    pkg = tmp_path / "trl_variants"
    (pkg / "erpo").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "erpo" / "__init__.py").write_text("")
    (pkg / "erpo" / "part.py").write_text("from ..losses import f\n")
    (pkg / "losses.py").write_text("def f():\n    from .erpo.part import g\n")
    edges = graph(pkg)
    assert cycles(edges) == [["trl_variants.erpo.part", "trl_variants.losses", "trl_variants.erpo.part"]]
    assert back_arrows(edges) == ["trl_variants.losses -> trl_variants.erpo.part"]
