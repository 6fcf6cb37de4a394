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
from legacy.run_tf1.estimator import alias as estimator_alias
from legacy.run_tf1.estimator import load as load_estimator
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
    ProgramError,
    Rewrite,
    UpgradeError,
    check_program,
    local_file,
    read_source,
    search_roots,
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


def local_imports(roots: Sequence[Path], root: Path, file: Path, tree: ast.AST) -> list[tuple[Path, Path]]:
    """(file, the root it was found under) for each file of the roots a file's import statements
    name, each module searched root by root as Python does; `root`: where `file` itself was found
    (the package a relative import starts from)."""
    package = ".".join(file.relative_to(root).parts[:-1])
    found: list[tuple[Path, Path]] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in module_names(node, package):
                for where in roots:
                    path = module_file(where, name)
                    if path:
                        if path not in [f for f, _ in found]:
                            found.append((path, where))
                        break
    return found


def program_files(program: Path, roots: Optional[Sequence[Path]] = None) -> list[Path]:
    """The program and every file of the search roots (`search_roots`) it imports, directly or
    through another, packages included."""
    roots = list(roots) if roots is not None else search_roots(program)
    files: list[Path] = []
    todo = [(program.resolve(), program.parent.resolve())]
    while todo:
        file, root = todo.pop(0)
        if file in files:
            continue
        files.append(file)
        todo += local_imports(roots, root, file, ast.parse(read_source(file)))
    return files


def file_label(file: Path, program: Path) -> str:
    """A file as the report names it: relative to the program's folder, or to the working directory
    when outside it."""
    folder = program.resolve().parent
    return str(file.relative_to(folder)) if file.is_relative_to(folder) else os.path.relpath(file)


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
    spelled = f"{home}.{attr}"
    target = estimator_alias("tensorflow.compat.v1" + spelled[2:] if spelled.startswith("tf.") else spelled)
    if target is not None:  # tf.estimator, tensorflow.python.estimator: tensorflow-estimator's, named so
        return load_estimator(target), target
    if isinstance(obj, types.ModuleType) and not hasattr(obj, attr) and \
            home.split(".")[0] in ("tensorflow", "tensorflow_estimator"):
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


@dataclasses.dataclass
class FileScan:
    """What one file contributes to a report: its import rewrites, its names (resolved) with their
    lines, the lines that name a GPU."""
    rewrites: list[Rewrite]
    names: list[tuple[NameUse, int]]
    devices: list[tuple[int, str]]


def report(program_path: Union[str, os.PathLike], gpus: Optional[int] = None,
           cache: Optional[dict[Path, FileScan]] = None, roots: Optional[Sequence[Path]] = None) -> Report:
    """The static report: the program is parsed and upgraded, never run.  cache: file -> its scan,
    shared by the reports of many programs (`report_tree`); roots: where its modules are searched
    (default `search_roots`)."""
    program = check_program(program_path)
    files = program_files(program, roots)
    result = Report(program, files, [], {}, [], machine_gpus() if gpus is None else gpus)
    contrib = ContribTree()
    cache = {} if cache is None else cache
    quiet = logging.getLogger("tensorflow")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # TensorFlow's deprecation notices for the names resolved
    try:
        for file in files:
            if file not in cache:
                cache[file] = scan_file(file, contrib)
            add_file(result, file, cache[file])
    finally:
        quiet.setLevel(level)
    return result


def scan_file(file: Path, contrib: ContribTree) -> FileScan:
    """One file, upgraded in memory: its rewrites, every TensorFlow name it uses (resolved), its GPUs."""
    source = read_source(file)
    upgrade = upgrade_source(source, str(file))
    original, upgraded = ast.parse(source), ast.parse(upgrade.text)
    names = []
    for name, line in [*from_imports(upgraded), *attribute_chains(original, tf_aliases(upgraded))]:
        use = resolve_name(name, contrib)
        if use.reason:
            use.reason += upgrader_hint(upgrade.notes, line, name)
        names.append((use, line))
    devices = [(node.lineno, node.value) for node in ast.walk(original)
               if isinstance(node, ast.Constant) and isinstance(node.value, str) and GPU_STRING.search(node.value)]
    return FileScan(list(upgrade.rewrites), names, devices)


def add_file(result: Report, file: Path, scan: FileScan) -> None:
    """Add one file's rewrites, names and /gpu: devices to the report."""
    label = file_label(file, result.program)
    result.rewrites += [(label, rewrite) for rewrite in scan.rewrites]
    for use, line in scan.names:
        result.names.setdefault(use.name, dataclasses.replace(use, where=[])).where.append(f"{label}:{line}")
    result.devices += [f"{label}:{line} {value!r}" for line, value in scan.devices]


# ---------------------------------------------------------------------------------------------
# A whole tree of programs

MAIN_GUARD = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]|\bapp\.run\(""", re.M)


@dataclasses.dataclass
class TreeReport:
    """`--report` over every program of a folder: each tf.contrib and tf.estimator name (`tracked`), how
    it resolves, and the programs that use it (through their own modules too); the programs that could
    not be read."""
    folder: Path
    programs: list[Path]
    files: int
    contrib: dict[str, tuple[NameUse, list[Path]]]
    unread: list[tuple[Path, str]]


def is_program(path: Path) -> bool:
    """A file that runs as a program: a `__main__` guard or `tf.app.run()` / `absl.app.run()`."""
    try:
        return bool(MAIN_GUARD.search(read_source(path)))
    except ProgramError:
        return False


def report_tree(folder: Union[str, os.PathLike], log: Any = None) -> TreeReport:
    """The report of every program under `folder` (the files each imports shared between them), its
    tf.contrib and tf.estimator names gathered.  A program the upgrader cannot read (Python 2 syntax)
    is listed."""
    root = Path(os.path.abspath(folder))
    if not root.is_dir():
        raise ProgramError(f"{folder}: no such folder")
    programs = sorted(p for p in root.rglob("*.py") if is_program(p))
    cache: dict[Path, FileScan] = {}
    uses: dict[str, tuple[NameUse, list[Path]]] = {}
    unread: list[tuple[Path, str]] = []
    for k, program in enumerate(programs):
        if log is not None and k % 50 == 0:
            log(f"{PREFIX}: --report-tree {k}/{len(programs)} programs")
        # Run from its own folder or from any folder above it in the tree: its own modules found
        # wherever a user's working directory would put them on the path.
        roots = [program.parent, *(p for p in program.parent.parents if p.is_relative_to(root))]
        try:
            result = report(program, gpus=0, cache=cache, roots=roots)
        except (ProgramError, UpgradeError, SyntaxError, ValueError) as error:
            unread.append((program, f"{type(error).__name__}: {str(error).strip().splitlines()[0][:120]}"))
            continue
        for use in result.names.values():
            if tracked(use.name):
                uses.setdefault(use.name, (use, []))[1].append(program)
    return TreeReport(root, programs, len(cache), uses, unread)


def format_tree(tree: TreeReport) -> list[str]:
    """The tree report as a Markdown table: name, programs that use it, where it maps or why not; the
    first line counts each family's names and the programs that use one that cannot map."""
    counts = []
    for family, of in (("tf.contrib", is_contrib), ("tf.estimator", is_estimator)):
        uses = {n: u for n, u in tree.contrib.items() if of(n)}
        mapped = sum(1 for use, _ in uses.values() if not use.reason)
        using = {p for _, programs in uses.values() for p in programs}
        stopped = {p for use, programs in uses.values() if use.reason for p in programs}
        counts.append(f"{len(uses)} {family} names: {mapped} mapped, {len(uses) - mapped} cannot; {len(using)} "
                      f"programs use {family}, {len(stopped)} of them a name that cannot map")
    stopped = {p for use, programs in tree.contrib.values() if use.reason for p in programs}
    lines = [f"{len(tree.programs)} programs under {tree.folder.name}/ ({tree.files} files read, "
             f"{len(tree.unread)} programs unreadable); {'; '.join(counts)}; {len(stopped)} programs in all use a "
             f"name that cannot map", "",
             "| tf.contrib or tf.estimator name | programs | maps to, or why not |", "|---|---|---|"]
    for name, (use, programs) in sorted(tree.contrib.items(), key=lambda kv: (-len(kv[1][1]), kv[0])):
        where = f"`{use.home}`" if not use.reason else use.reason.replace("|", "\\|")
        lines.append(f"| `{name}` | {len(programs)} | {where} |")
    if tree.unread:
        lines += ["", "programs not read:"] + [f"  {os.path.relpath(p, tree.folder)}: {why}" for p, why in tree.unread]
    return lines


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
    shown = os.path.relpath(result.program)
    lines = [f"{PREFIX} --report {result.program if shown.startswith('..') else shown}",
             f"files: {', '.join(file_label(f, result.program) for f in result.files)} "
             "(the program and the modules it imports from its folder, the working directory and PYTHONPATH)",
             "",
             "import rewrites (TensorFlow's upgrader, tf_upgrade_v2 --mode SAFETY, applied in memory):"]
    lines += [f"  {label}:{r.line}  {r.old}  ->  {r.new}" for label, r in result.rewrites] or ["  none"]
    for title, contrib in (("tf names (under tf.compat.v1 of TF 2.21):", False), ("tf.contrib names:", True)):
        uses = sorted((u for u in result.names.values() if is_contrib(u.name) == contrib), key=lambda u: u.name)
        lines += ["", title] + ([name_line(use, contrib) for use in uses] or ["  none"])
    lines += ["", "devices:", *device_lines(result), "",
              f"summary: {len(result.names) - len(result.cannot)} names mapped, {len(result.cannot)} cannot"]
    return lines


def is_estimator(name: str) -> bool:
    """Whether a name is tf.estimator's (`tf.estimator...`, `tensorflow.python.estimator...`)."""
    return name.split(".")[:2] == ["tf", "estimator"] or name.startswith("tensorflow.python.estimator")


def tracked(name: str) -> bool:
    """A name `--report-tree` tables: tf.contrib's and tf.estimator's."""
    return is_contrib(name) or is_estimator(name)


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


