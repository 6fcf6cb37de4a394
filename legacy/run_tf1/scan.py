"""`--report`: what a run would map and what it cannot, found statically, without running the program.

The upgrader's import rewrites, every `tf.X.Y` and `tf.contrib` name the program and its local
modules use and whether each maps (`Report`, `format_report`), and the towers it places on GPUs.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import re
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional, Union

import tensorflow as tf_root
import tensorflow.compat.v1 as tf
from legacy.run_tf1.contrib import (
    REMOVED,
    V1_ROUTES,
    ContribAttributeError,
    ContribImportError,
    ContribModule,
    ContribTree,
    import_dotted,
)
from legacy.run_tf1.environment import machine_gpus
from legacy.run_tf1.log import PREFIX
from legacy.run_tf1.upgrade import (
    Rewrite,
    check_program,
    local_file,
    read_source,
    upgrade_source,
)

GPU_STRING = re.compile(r"(?i)(^|/)(device:)?gpu(:|$)")


@dataclasses.dataclass
class NameUse:
    """A `tf.X.Y` or `tf.contrib...` name: where it is used and what it maps to, or why not."""
    name: str
    where: list[str] = dataclasses.field(default_factory=list)
    home: Optional[str] = None
    reason: Optional[str] = None


@dataclasses.dataclass
class Report:
    """Everything `--report` lists for a program and the local modules it imports."""
    program: Path
    files: list[Path]
    rewrites: list[tuple[str, Rewrite]]
    names: dict[str, NameUse]
    devices: list[str]
    gpus: int

    @property
    def cannot(self) -> list[NameUse]:
        """The names that do not map."""
        return [use for use in self.names.values() if use.reason]


def module_names(node: ast.AST, package: str) -> list[str]:
    """The modules an import statement may load (`from a import b`: `a` and `a.b`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        parts = package.split(".") if package else []
        parent = ".".join(parts[:len(parts) - node.level + 1])
        base = ".".join(p for p in (parent, base) if p)
    return [base, *(f"{base}.{alias.name}" if base else alias.name for alias in node.names)]


def module_file(folder: Path, name: str) -> Optional[Path]:
    """The file in `folder` that module `name` (dotted) is, or None."""
    parts = name.split(".")
    found = local_file(folder.joinpath(*parts[:-1]), parts[-1]) if all(parts) else None
    return found[0] if found else None


def local_imports(folder: Path, file: Path, tree: ast.AST) -> list[Path]:
    """The program-folder files a file's import statements name (its package for relative ones)."""
    package = ".".join(file.relative_to(folder).parts[:-1])  # the package a relative import starts from
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in module_names(node, package):
                path = module_file(folder, name)
                if path and path not in found:
                    found.append(path)
    return found


def program_files(program: Path) -> list[Path]:
    """The program and every file of its folder it imports, directly or through another."""
    files, todo = [], [program]
    while todo:
        file = todo.pop(0)
        if file in files:
            continue
        files.append(file)
        todo += local_imports(program.parent, file, ast.parse(read_source(file)))
    return files


def tf_aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the TensorFlow name it is bound to, in `tf.*` spelling for tf.compat.v1."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tensorflow":
                    local = alias.asname or "tensorflow"
                    aliases[local] = tf_spelling(alias.name if alias.asname else "tensorflow")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tensorflow" and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = tf_spelling(f"{node.module}.{alias.name}")
    return aliases


def tf_spelling(module: str) -> str:
    """`tensorflow.compat.v1.X` -> `tf.X`, `tensorflow.contrib.X` -> `tf.contrib.X`, others as written."""
    for prefix, short in (("tensorflow.compat.v1", "tf"), ("tensorflow.contrib", "tf.contrib")):
        if module == prefix or module.startswith(prefix + "."):
            return short + module[len(prefix):]
    return module


def attribute_chains(tree: ast.AST, aliases: dict[str, str]) -> Iterator[tuple[str, int]]:
    """(full TensorFlow name, line) of each maximal `alias.a.b` chain."""
    inner = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            inner.add(id(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            parts: list[str] = []
            base: ast.expr = node
            while isinstance(base, ast.Attribute):
                parts.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in aliases:
                yield ".".join([aliases[base.id], *parts]), node.lineno


def from_imports(tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(full TensorFlow name, line) of each name a `from tensorflow... import name` statement binds."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tensorflow" and not node.level:
            for alias in node.names:
                yield tf_spelling(f"{node.module}.{alias.name}"), node.lineno


def resolve_name(name: str, contrib: ContribTree) -> NameUse:
    """Whether a TensorFlow name resolves: walked attribute by attribute while the object is a module
    or a class (the name is cut where an instance or function starts: `tf.app.flags.FLAGS`)."""
    parts = name.split(".")
    if parts[0] == "tf":
        obj, home = tf, "tf"
    else:
        obj, home = tf_root, "tensorflow"
    for i, attr in enumerate(parts[1:], start=1):
        if not isinstance(obj, (types.ModuleType, type)):
            return NameUse(".".join(parts[:i]), home=home)
        try:
            obj, home = step_into(obj, attr, contrib, home)
        except Exception as error:  # a missing name, or a lazy module that fails to load
            return NameUse(".".join(parts[:i + 1]), reason=cannot_reason(".".join(parts[:i + 1]), error))
    return NameUse(name, home=home)


def step_into(obj: Any, attr: str, contrib: ContribTree, home: str) -> tuple[Any, str]:
    """`getattr(obj, attr)` and the name of where it lives; `contrib` stands for `tf.contrib`."""
    if isinstance(obj, ContribModule):
        return contrib.resolve(obj, attr)
    if home.startswith("tf.") and f"{home[3:]}.{attr}" in V1_ROUTES:
        return import_dotted(V1_ROUTES[f"{home[3:]}.{attr}"]), f"{home}.{attr}"
    if attr == "contrib" and obj in (tf, tf_root):
        return contrib.module(""), "tf.contrib"
    if isinstance(obj, types.ModuleType) and not hasattr(obj, attr) and home.split(".")[0] == "tensorflow":
        return importlib.import_module(f"{home}.{attr}"), f"{home}.{attr}"  # TensorFlow's own packages
    return getattr(obj, attr), f"{home}.{attr}"


def cannot_reason(name: str, error: Exception) -> str:
    """One line: why a name does not resolve."""
    if isinstance(error, (ContribAttributeError, ContribImportError)):
        return str(error)
    for prefix, reason in REMOVED.items():
        if name == prefix or name.startswith(prefix + "."):
            return reason
    if isinstance(error, AttributeError):
        return f"TF 2.21's tf.compat.v1 has no {name}: replace it by hand"
    return f"{name} does not load on TF 2.21 ({type(error).__name__}: {str(error).splitlines()[0]})"


def report(program_path: Union[str, os.PathLike], gpus: Optional[int] = None) -> Report:
    """The static report: the program is parsed and upgraded, never run."""
    program = check_program(program_path)
    files = program_files(program)
    result = Report(program, files, [], {}, [], machine_gpus() if gpus is None else gpus)
    contrib = ContribTree()
    quiet = logging.getLogger("tensorflow")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # TensorFlow's deprecation notices for the names resolved
    try:
        for file in files:
            add_file(result, file, contrib)
    finally:
        quiet.setLevel(level)
    return result


def add_file(result: Report, file: Path, contrib: ContribTree) -> None:
    """Add one file's rewrites, names and /gpu: devices to the report."""
    source = read_source(file)
    upgrade = upgrade_source(source, str(file))
    label = str(file.relative_to(result.program.parent))
    result.rewrites += [(label, rewrite) for rewrite in upgrade.rewrites]
    original, upgraded = ast.parse(source), ast.parse(upgrade.text)
    for name, line in [*from_imports(upgraded), *attribute_chains(original, tf_aliases(upgraded))]:
        use = resolve_name(name, contrib)
        if use.reason:
            use.reason += upgrader_hint(upgrade.notes, line, name)
        result.names.setdefault(use.name, use).where.append(f"{label}:{line}")
    for node in ast.walk(original):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and GPU_STRING.search(node.value):
            result.devices.append(f"{label}:{node.lineno} {node.value!r}")


def upgrader_hint(notes: Sequence[tuple[int, str]], line: int, name: str) -> str:
    """TensorFlow's upgrader's pointer to a name's new home, where it has one (its TensorFlow Addons
    mappings); its generic "tf.contrib cannot be converted" errors are left out."""
    for note_line, note in notes:
        found = re.search(r"`([\w.]+)` has been migrated to `([\w.]+)`[^.]*", note)
        if note_line == line and found and found[1] == name:
            return f" (TensorFlow's upgrader: {found[0]})"
    return ""


def format_report(result: Report) -> list[str]:
    """The report's lines."""
    folder = result.program.parent
    shown = os.path.relpath(result.program)
    lines = [f"{PREFIX} --report {result.program if shown.startswith('..') else shown}",
             f"files: {', '.join(str(f.relative_to(folder)) for f in result.files)} "
             "(the program and the local modules it imports)", "",
             "import rewrites (TensorFlow's upgrader, tf_upgrade_v2 --mode SAFETY, applied in memory):"]
    lines += [f"  {label}:{r.line}  {r.old}  ->  {r.new}" for label, r in result.rewrites] or ["  none"]
    for title, contrib in (("tf names (under tf.compat.v1 of TF 2.21):", False), ("tf.contrib names:", True)):
        uses = sorted((u for u in result.names.values() if is_contrib(u.name) == contrib), key=lambda u: u.name)
        lines += ["", title] + ([name_line(use, contrib) for use in uses] or ["  none"])
    lines += ["", "devices:", *device_lines(result), "",
              f"summary: {len(result.names) - len(result.cannot)} names mapped, {len(result.cannot)} cannot"]
    return lines


def is_contrib(name: str) -> bool:
    """Whether a name is under `tf.contrib` (or `tensorflow.contrib`)."""
    return name.split(".")[:2] in (["tf", "contrib"], ["tensorflow", "contrib"])


def name_line(use: NameUse, contrib: bool) -> str:
    """`  mapped  tf.train.Saver  (a.py:3)`, with the home of a contrib name, or the reason it cannot."""
    where = use.where[0] + (f" +{len(use.where) - 1}" if len(use.where) > 1 else "")
    if use.reason:
        return f"  cannot  {use.name}  ({where}): {use.reason}"
    home = f" -> {use.home}" if contrib and use.home else ""
    return f"  mapped  {use.name}{home}  ({where})"


def device_lines(result: Report) -> list[str]:
    """Where the program names GPUs, and what the runner will do with them."""
    if not result.devices:
        return ["  the program names no /gpu: device"]
    have = ("no GPU: a tower on /gpu:N" if result.gpus == 0 else
            f"{result.gpus} GPU{'s' if result.gpus > 1 else ''}: a tower on /gpu:N with N >= {result.gpus}")
    return [*(f"  {d}" for d in result.devices),
            f"  this machine has {have} runs on the virtual CPU device /cpu:N, and each session gets "
            "ConfigProto.device_count['CPU'] = 1 + the highest CPU index its graph uses"]


