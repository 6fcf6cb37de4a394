"""The type checker over the packages (`[tool.mypy]` in pyproject.toml): every function of compare/
annotated, the annotations of legacy/, modern/, records/, benchmarks/ and examples/ consistent; and
every public function of those packages annotated (mypy checks the annotations it finds, this test
that they are there)."""
import ast
import subprocess
import sys

from conftest import ROOT

PACKAGES = ("legacy", "modern", "records", "benchmarks", "examples")
# TF1 programs kept as a user would bring them (run by legacy/run_tf1/, not imported): not annotated.
AS_FOUND = ("examples/split_towers/train_tf1.py", "examples/split_towers/towers_input.py",
            "examples/clone_deploy/train_tf1.py", "examples/estimator_towers/train_tf1.py")


def test_mypy_finds_no_error():
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def unannotated(path):
    """Public functions and methods (and __init__) of a file that lack a parameter or return annotation."""
    found = []

    def visit(node, prefix, public):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                own = public and (not child.name.startswith("_") or child.name == "__init__")
                args = child.args.posonlyargs + child.args.args + child.args.kwonlyargs
                if args and args[0].arg in ("self", "cls") and prefix:
                    args = args[1:]
                params = [a for a in args if a.annotation is None]
                params += [a for a in (child.args.vararg, child.args.kwarg) if a is not None and a.annotation is None]
                if own and (params or (child.returns is None and child.name != "__init__")):
                    found.append(f"{path.relative_to(ROOT)}:{child.lineno} {prefix}{child.name}")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", public and not child.name.startswith("_"))

    visit(ast.parse(path.read_text()), "", True)
    return found


def test_every_public_function_outside_the_harness_is_annotated():
    missing = [line for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
               if str(path.relative_to(ROOT)) not in AS_FOUND for line in unannotated(path)]
    assert missing == []
