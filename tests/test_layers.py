"""The packages' imports form layers: no import cycle anywhere, and the judge's files import only
the layers beneath them (../shared/STYLE.md, 'Layers inside the judge').

Read from the source with `ast`, every import counted wherever it stands (at the top, inside a
function, under TYPE_CHECKING): an import inside a function that closes a cycle is a cycle.
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("compare", "legacy", "modern", "records", "benchmarks", "examples")

# The judge bottom up; a file imports only files of its own layer or below (its own layer: only
# where that closes no cycle, which the cycle test checks).
JUDGE_LAYERS = (
    ("compare/common.py", "compare/interface.py", "compare/programs.py", "compare/report.py", "compare/settings.py",
     "compare/state.py", "compare/process.py", "compare/limits.py"),
    ("compare/optimizers.py", "compare/tf1_graph.py", "compare/multiworker.py"),
    ("compare/legacy_run.py", "compare/modern_run.py", "compare/capture.py", "compare/estimator_capture.py",
     "compare/port_capture.py"),
    ("compare/sides.py",),
    ("compare/measures.py",),
    ("compare/tolerances.py", "compare/diagnosis.py"),
    ("compare/causes.py", "compare/counterfactuals.py"),
    ("compare/checks/",),
    ("compare/harness.py", "compare/pairs/"),
    ("compare/run.py", "compare/tf1_runtime.py", "compare/flags_process.py"),
)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, name: str, is_package: bool) -> set[str]:
    """Every module name an import in `tree` names (relative imports resolved), with each
    `from X import y` counted as X.y too (y may be a module)."""
    package = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """{module: the project modules it imports} over the .py files of `packages` under `root`."""
    files = {module_name(p, root): p for package in packages for p in (root / package).rglob("*.py")}
    graph = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = {m for m in imported(tree, name, path.name == "__init__.py") if m in files and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int:
    path = module.replace(".", "/")
    for i, layer in enumerate(JUDGE_LAYERS):
        for entry in layer:
            if (entry.endswith("/") and (path + "/").startswith(entry)) or path + ".py" == entry \
                    or path + "/__init__.py" == entry:
                return i
    raise AssertionError(f"{module} is in no layer of JUDGE_LAYERS: give it one")


def test_no_import_cycle_in_any_package():
    graph = import_graph(ROOT, PACKAGES)
    assert len(graph) > 60, sorted(graph)
    assert cycles(graph) == []


def test_the_judge_imports_only_the_layers_beneath_it():
    graph = import_graph(ROOT, ("compare",))
    upward = [(a, b) for a, targets in graph.items() if a != "compare" for b in targets
              if b != "compare" and layer_of(b) > layer_of(a)]
    assert upward == []


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path):
    """The check itself can fail: a package of three files whose circle closes inside a function."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def f():\n    from pkg import high\n    return high\n")
    (package / "mid.py").write_text("from pkg import low\n")
    (package / "high.py").write_text("from . import mid\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.low"] == {"pkg", "pkg.high"} and graph["pkg.high"] == {"pkg", "pkg.mid"}
    assert cycles(graph) == [["pkg.high", "pkg.low", "pkg.mid"]]
    os.remove(package / "mid.py")
    assert cycles(import_graph(tmp_path, ("pkg",))) == []
