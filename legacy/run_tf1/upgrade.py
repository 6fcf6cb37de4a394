"""TensorFlow's upgrader in memory, and the finder and loaders that run a program's modules through it.

`upgrade_source` applies `tf_upgrade_v2 --mode SAFETY` (`ASTCodeUpgrader(tf_upgrade_v2_safety.
TFAPIChangeSpec())`) to one file's text and parses its log (the import rewrites, its notes);
`ProgramFinder` (a `sys.meta_path` finder) finds the program's own modules (`search_roots`: its folder,
the working directory, PYTHONPATH), the `tensorflow.contrib` modules and tf.estimator's import names,
`UpgradingLoader` executes each file as the upgrader rewrites it, compiled under its real file name
(tracebacks show the user's lines).  Nothing is written: the folders stay byte for byte as they were.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import os
import re
import types
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Optional, Protocol, Union

from legacy.run_tf1.estimator import alias as estimator_alias
from legacy.run_tf1.estimator import load as load_estimator
from legacy.run_tf1.contrib import ContribTree
from tensorflow.tools.compatibility import ast_edits, tf_upgrade_v2_safety

# Imports kept as written.  The upgrader keeps tensorflow.contrib and tensorflow.compat imports, and
# tensorflow.flags, which TF 2.21 has only as tf.compat.v1.flags: that one is rewritten here.  Kept
# too: TensorFlow's own packages, which the upgrader would send to `tensorflow.compat.v1.python...`,
# and tensorflow.keras (`tensorflow.compat.v1.keras`, the same Keras 3, is no importable module).
UPGRADER_KEEPS_FLAGS = "tensorflow.flags"
KEPT_IMPORTS = ("tensorflow.python.", "tensorflow.core.", "tensorflow.tools.", "tensorflow.lite.",
                "tensorflow.compiler.", "tensorflow.tsl.", "tensorflow.dtensor.", "tensorflow.keras")
CHANGED_IMPORT = re.compile(r"Changed import from (?P<old>'.*?'|\".*?\") to (?P<new>'.*?'|\".*?\")"
                            r"(?: and (?P<also>'.*?'|\".*?\"))?\.$")


class UpgradeError(Exception):
    """TensorFlow's upgrader cannot read a file (one-line message)."""


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """One import statement the upgrader rewrote."""
    line: int
    old: str
    new: str


@dataclasses.dataclass(frozen=True)
class Upgrade:
    """A file's text after the upgrader, its import rewrites, and the upgrader's notes by line."""
    text: str
    rewrites: tuple[Rewrite, ...]
    notes: tuple[tuple[int, str], ...]


@functools.lru_cache(maxsize=1)
def upgrader() -> ast_edits.ASTCodeUpgrader:
    """`tf_upgrade_v2 --mode SAFETY`'s upgrader, keeping `KEPT_IMPORTS` as written (and not tensorflow.flags)."""
    spec = tf_upgrade_v2_safety.TFAPIChangeSpec()
    rename = spec.import_renames["tensorflow"]
    kept = [prefix for prefix in rename.excluded_prefixes if prefix != UPGRADER_KEEPS_FLAGS]
    spec.import_renames["tensorflow"] = ast_edits.ImportRename(rename.new_name,
                                                               excluded_prefixes=[*kept, *KEPT_IMPORTS])
    return ast_edits.ASTCodeUpgrader(spec)


def upgrade_source(text: str, filename: str) -> Upgrade:
    """The upgrader's `update_string_pasta` on `text` (its log, which it prints, is captured)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            # pasta's visitor has visit_Str & co., which Python's ast calls with a DeprecationWarning
            warnings.filterwarnings("ignore", r"visit_\w+ is deprecated", DeprecationWarning)
            ok, new_text, logs, _ = upgrader().update_string_pasta(text, filename)
    except Exception as error:  # pasta raises NameError, AnnotationError... on syntax it does not know
        ok, logs = 0, [f"{type(error).__name__}: {error}"]
    if not ok:
        detail = str(logs[0]).strip().splitlines()[-1] if logs else "no detail"
        raise UpgradeError(f"TensorFlow's upgrader cannot parse {filename} ({detail}); it reads TF1-era "
                           "Python (no := or match statements)")
    return Upgrade(new_text, *parse_upgrade_log(logs))


def parse_upgrade_log(logs: Sequence[str]) -> tuple[tuple[Rewrite, ...], tuple[tuple[int, str], ...]]:
    """The upgrader's log lines ("LINE:COL: LEVEL: message") as import rewrites and other notes."""
    rewrites, notes = [], []
    for entry in logs:
        line, _, _, message = entry.split(":", 3)
        match = CHANGED_IMPORT.search(message.strip())
        if match:
            new = ast.literal_eval(match["new"]).strip()
            if match["also"]:
                new += "; " + ast.literal_eval(match["also"]).strip()
            rewrites.append(Rewrite(int(line), ast.literal_eval(match["old"]).strip(), new))
        else:
            notes.append((int(line), message.strip()))
    return tuple(rewrites), tuple(notes)


class ProgramError(Exception):
    """The program's path is not a Python file the runner can run (one-line message)."""


def read_source(path: Path) -> str:
    """A Python file's text (PEP 263 encoding, universal newlines), checked to compile."""
    try:
        source = importlib.util.decode_source(path.read_bytes())
    except (OSError, UnicodeDecodeError, SyntaxError) as error:
        raise ProgramError(f"cannot read {path}: {error}") from None
    try:
        compile(source, str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        lineno = getattr(error, "lineno", None)  # SyntaxError's; a ValueError (null bytes) has none
        where = f" (line {lineno})" if lineno else ""
        raise ProgramError(f"{path} is not valid Python: {getattr(error, 'msg', error)}{where}") from None
    return source


def check_program(path: Union[str, os.PathLike]) -> Path:
    """The absolute path of a program to run, or ProgramError saying why it is not one."""
    program = Path(os.path.abspath(path))
    if not program.exists():
        raise ProgramError(f"{path}: no such file")
    if program.is_dir():
        raise ProgramError(f"{path} is a folder: give the program's .py file")
    if program.suffix != ".py":
        raise ProgramError(f"{path} is not a Python file (.py)")
    read_source(program)
    return program




# ---------------------------------------------------------------------------------------------
# The program's own modules, upgraded on import

# This repository's root: its own packages (legacy, compare, ...) are never a user's program's modules,
# wherever the program runs from; they load as they are.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def search_roots(program: Path) -> list[Path]:
    """Where a run imports the program's own modules from, in the order Python searches them: the
    program's folder (the runner puts it first), the working directory (`python -m` puts it on
    sys.path: a program run from above its folder imports that folder as a package), and the entries
    of PYTHONPATH; installed packages and this repository's own are not the program's."""
    roots = [program.parent, Path.cwd(), *(Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return [r for r in dict.fromkeys(r.resolve() for r in roots if r.is_dir())
            if not {"site-packages", "dist-packages"} & set(r.parts) and r != PROJECT_ROOT]


class ProgramModules(Protocol):
    """What the finder and loaders read of the environment they serve (environment.TF1Environment)."""
    roots: list[Path]
    contrib: ContribTree
    loaded: list[str]

    def compile_file(self, file: Path) -> types.CodeType: ...


def local_file(directory: Path, tail: str) -> Optional[tuple[Path, bool]]:
    """(file, is_package) of module `tail` in `directory`, or None."""
    package = directory / tail / "__init__.py"
    if package.is_file():
        return package, True
    module = directory / f"{tail}.py"
    return (module, False) if module.is_file() else None


def local_names(folder: Path) -> set[str]:
    """The top-level module names the program's folder provides."""
    return {p.stem for p in folder.glob("*.py")} | {p.parent.name for p in folder.glob("*/__init__.py")}


class ProgramFinder(importlib.abc.MetaPathFinder):
    """Finds the program's own modules (its folder, the working directory, PYTHONPATH: `roots`), the
    `tensorflow.contrib` modules and tf.estimator's import names, for an environment."""

    def __init__(self, env: ProgramModules) -> None:
        self.env = env

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[types.ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname == "tensorflow.contrib" or fullname.startswith("tensorflow.contrib."):
            return importlib.util.spec_from_loader(fullname, ContribLoader(self.env.contrib), is_package=True)
        target_name = estimator_alias(fullname)
        if target_name is not None:
            return importlib.util.spec_from_loader(fullname, AliasLoader(target_name), is_package=True)
        roots = self.env.roots
        dirs = roots if path is None else [Path(p) for p in path if any(Path(p).is_relative_to(r) for r in roots)]
        for directory in dirs:
            found = local_file(directory, fullname.rpartition(".")[2])
            if found:
                return self._spec(fullname, *found)
        return None

    def _spec(self, fullname: str, file: Path, package: bool) -> importlib.machinery.ModuleSpec:
        spec = importlib.util.spec_from_file_location(
            fullname, file, loader=UpgradingLoader(self.env, file),
            submodule_search_locations=[str(file.parent)] if package else None)
        assert spec is not None
        spec.cached = None  # nothing written, nothing read from __pycache__
        return spec


class ContribLoader(importlib.abc.Loader):
    """Loads `tensorflow.contrib.<name>` as the environment's ContribModule for it."""

    def __init__(self, tree: ContribTree) -> None:
        self.tree = tree

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.tree.module(spec.name[len("tensorflow.contrib."):] if spec.name != "tensorflow.contrib" else "")

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class AliasLoader(importlib.abc.Loader):
    """Loads a TF1 import name of tf.estimator (`tensorflow.estimator`, `tensorflow.python.estimator.*`)
    as the tensorflow-estimator module it is now (legacy/run_tf1/estimator.py)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return load_estimator(self.target)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class UpgradingLoader(importlib.abc.InspectLoader):
    """Executes a program file as TensorFlow's upgrader rewrites it; the file is only read."""

    def __init__(self, env: ProgramModules, file: Path) -> None:
        self.env, self.file = env, file

    def get_source(self, fullname: str) -> str:
        return read_source(self.file)

    def get_code(self, fullname: str) -> types.CodeType:
        return self.env.compile_file(self.file)

    def is_package(self, fullname: str) -> bool:
        return self.file.name == "__init__.py"

    def exec_module(self, module: types.ModuleType) -> None:
        self.env.loaded.append(module.__name__)
        exec(self.get_code(module.__name__), module.__dict__)


