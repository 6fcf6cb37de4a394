"""Run a user's TF1 multi-GPU tower program, unmodified, on TensorFlow 2.21.

    python -m legacy.run_tf1 [--gpus N] PROGRAM.py [PROGRAM ARGS...]   # run it
    python -m legacy.run_tf1 --report PROGRAM.py                      # what would be mapped, without running it
    legacy-run-tf1 PROGRAM.py --num_gpus 2                            # the same, installed

Runner options come before the program's path; everything after it is the program's own argv.
Before the program runs, the runner gives it

1. TF1 behaviour and `tf.compat.v1` under the names it uses.  TensorFlow's own upgrader
   (`tf_upgrade_v2 --mode SAFETY`: `ASTCodeUpgrader(tf_upgrade_v2_safety.TFAPIChangeSpec())`)
   rewrites `import tensorflow as tf` to `import tensorflow.compat.v1 as tf` in the program and in
   the Python files of its folder that it imports, in memory: a `sys.meta_path` finder reads each
   file, upgrades it, and compiles it under its real file name (tracebacks show the user's lines);
   nothing is written, the folder stays byte for byte as it was.  `tf.compat.v1.disable_v2_behavior()`
   runs first; `tf.nn.rnn_cell`, which TF 2.21 looks for in Keras 3, is tf-keras's TF1 cells.
2. `tf.contrib`: each contrib module with a maintained home gets that home (`CONTRIB_HOMES`, one
   line per module: tf-slim for `slim`, `layers`, `framework`, `losses`, `metrics`, `training`;
   `tf.compat.v1.data` for `data`; ...), as the attribute `tf.contrib` and as importable modules
   (`import tensorflow.contrib.slim as slim`).  A contrib name without a home raises an error whose
   one-line message names it and says what to do.
3. Towers on virtual CPU devices: a tower the program places on `/gpu:N` with fewer than N+1 GPUs
   present runs on `/cpu:N`, and every session the program opens gets
   `ConfigProto.device_count['CPU']` = 1 + the highest CPU index its graph uses (without it, soft
   placement would silently put every tower on one CPU).  One line says so.

`--report` lists, without running anything, the upgrader's import rewrites, every `tf.X.Y` name and
`tf.contrib` name the program and its local modules use, and whether each maps; exit status 1 when
some name cannot.  As a library, for a harness that runs programs in its own process::

    with tf1_environment("train.py", log=print) as env:
        status = env.run_program(["--num_gpus", "2"])
        print(env.cpu_devices, env.device_line)

Leaving the `with` block undoes all of it.  Guide: docs/running-your-own-tf1-program.md.
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
import logging
import os
import re
import sys
import sysconfig
import threading
import time
import traceback
import types
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Optional, Union, cast

import tensorflow as tf_root
import tensorflow.compat.v1 as tf
from absl import app as absl_app
from absl import flags as absl_flags
from tensorflow.core.protobuf import config_pb2
from tensorflow.python import tf2
from tensorflow.python.client import session as tf_session
from tensorflow.python.framework import device_spec, ops
from tensorflow.tools.compatibility import ast_edits, tf_upgrade_v2_safety

from legacy import slim_compat  # before tf_slim: tf-slim on TF 2.21
from records.usage import ArgumentParser, at_least

Log = Callable[[str], None]
PREFIX = "run_tf1"


# ---------------------------------------------------------------------------------------------
# tf.contrib: the maintained home of each module
# ---------------------------------------------------------------------------------------------
def batch_and_drop_remainder(batch_size: int) -> Callable[[Any], Any]:
    """`tf.contrib.data.batch_and_drop_remainder`: `dataset.batch(batch_size, drop_remainder=True)`."""
    return lambda dataset: dataset.batch(batch_size, drop_remainder=True)


def padded_batch_and_drop_remainder(batch_size: int, padded_shapes: Any,
                                    padding_values: Any = None) -> Callable[[Any], Any]:
    """`tf.contrib.data.padded_batch_and_drop_remainder`: `padded_batch(..., drop_remainder=True)`."""
    return lambda dataset: dataset.padded_batch(batch_size, padded_shapes, padding_values, drop_remainder=True)


# The contrib.data transformations TF 1.10 replaced by a `drop_remainder` argument.
DATA_REMAINDER = types.SimpleNamespace(batch_and_drop_remainder=batch_and_drop_remainder,
                                       padded_batch_and_drop_remainder=padded_batch_and_drop_remainder)
RNN_CELLS = "tf_keras.api._v1.keras.__internal__.legacy.rnn_cell"  # tf.compat.v1.nn.rnn_cell under Keras 2

# tf.contrib.<module>: where its names live now, searched in order (the name is looked up lazily
# with getattr on each home).  contrib.losses is tf-slim's copy, which keeps contrib's argument
# order (logits first); tf.compat.v1.losses takes the labels first.
CONTRIB_HOMES: dict[str, tuple[Union[str, object], ...]] = {
    "slim": ("tf_slim",),
    "slim.nets": ("tf_slim.nets",),
    "slim.prefetch_queue": ("tf_slim.data.prefetch_queue",),
    "layers": ("tf_slim.layers", "tf_slim"),
    "framework": ("tf_slim", "tensorflow.compat.v1.train", "tensorflow.compat.v1"),
    "data": ("tensorflow.compat.v1.data", "tensorflow.compat.v1.data.experimental", DATA_REMAINDER),
    "losses": ("tf_slim.losses",),
    "metrics": ("tf_slim.metrics",),
    "training": ("tf_slim.training.training", "tf_slim.training.evaluation"),
    "rnn": (RNN_CELLS, "tensorflow.compat.v1.nn"),
    "distribute": ("tensorflow.compat.v1.distribute", "tensorflow.compat.v1.distribute.experimental"),
    "cluster_resolver": ("tensorflow.compat.v1.distribute.cluster_resolver",),
    "staging": ("tensorflow.python.ops.data_flow_ops",),
    "nccl": ("tensorflow.python.ops.nccl_ops",),
}

# tf.contrib.<module> with no maintained home: what to do instead.
BY_HAND = "has no maintained home on TF 2.21"
CONTRIB_NO_HOME: dict[str, str] = {
    "learn": "port this part to Keras by hand (tf.estimator, its successor, is gone since TF 2.16 too)",
    "estimator": "port this part to Keras by hand (tf.estimator is gone since TF 2.16)",
    "opt": "use a tf.compat.v1.train optimizer, or port to a Keras optimizer",
    "seq2seq": "port this part to Keras layers by hand",
    "cudnn_rnn": "use tf.keras.layers.LSTM / GRU, which run cuDNN kernels themselves",
    "keras": "use tf.keras (Keras 3) or tf_keras (Keras 2)",
    "summary": "use tf.compat.v1.summary in the TF1 graph, tf.summary in TF2 code",
    "quantize": "use the TensorFlow Model Optimization Toolkit",
    "tpu": "use tf.compat.v1.tpu or tf.distribute.TPUStrategy",
    "image": "use tf.image, or port the op by hand",
}

# tf.compat.v1 names TensorFlow routes to Keras 3, which lacks them: the program gets tf-keras's TF1
# ones, what they are under Keras 2 (`tf.compat.v1.layers` is legacy/slim_compat.py's).
V1_ROUTES: dict[str, str] = {
    "nn.rnn_cell": RNN_CELLS,
}

# tf.compat.v1 names TensorFlow 2.21 removed, with what to do.
REMOVED: dict[str, str] = {
    "tf.estimator": "tf.estimator is gone since TF 2.16: port this part to Keras by hand",
}


class ContribAttributeError(AttributeError):
    """A `tf.contrib` name with no maintained home, reached as an attribute (one-line message)."""
    __module__ = "legacy.run_tf1"  # the same name in tracebacks under `python -m legacy.run_tf1`


class ContribImportError(ImportError):
    """A `tensorflow.contrib` module with no maintained home, imported (one-line message)."""
    __module__ = "legacy.run_tf1"


def no_home_message(name: str, home_modules: Sequence[str] = ()) -> str:
    """One line: `tf.contrib.<name>` has no home, and what to do."""
    top = name.split(".")[0]
    if top in CONTRIB_NO_HOME:
        return f"tf.contrib.{top} {BY_HAND}: {CONTRIB_NO_HOME[top]}"
    if home_modules:
        homes = " / ".join(home_modules)
        lack = "lacks" if len(home_modules) == 1 else "lack"
        return (f"tf.contrib.{name} {BY_HAND}: tf.contrib.{name.rpartition('.')[0]} maps to {homes}, "
                f"which {lack} it; replace it by hand")
    return f"tf.contrib.{name} {BY_HAND}: replace it by hand (TF 2.21 ships no tf.contrib)"


@functools.lru_cache(maxsize=None)
def import_dotted(path: str) -> Any:
    """The object at a dotted path: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no module {parts[0]}")


def home_label(home: Union[str, object]) -> str:
    """A home's name for messages: its dotted path, or `legacy.run_tf1` for the adapters defined here."""
    return home if isinstance(home, str) else "legacy.run_tf1"


class ContribModule(types.ModuleType):
    """`tensorflow.contrib[.<name>]`: resolves each attribute lazily from the homes of `name`.

    A package (it has `__path__`), so `from tensorflow.contrib import learn` reaches the finder and
    raises the one-line ContribImportError instead of Python's generic "cannot import name".
    """

    def __init__(self, tree: ContribTree, name: str, homes: tuple[Union[str, object], ...]) -> None:
        super().__init__("tensorflow.contrib" + (f".{name}" if name else ""))
        self.__path__: list[str] = []
        self._contrib = (tree, name, homes)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr == "_contrib":
            raise AttributeError(attr)
        value = self.__dict__[attr] = self._contrib[0].resolve(self, attr)[0]
        return value

    def __dir__(self) -> list[str]:
        tree, name, homes = self._contrib
        names = set(super().__dir__()) | tree.children(name)
        for home in homes:
            with contextlib.suppress(ImportError, AttributeError):
                names |= set(dir(import_dotted(home) if isinstance(home, str) else home))
        return sorted(names)


class ContribTree:
    """The `tensorflow.contrib` modules of one environment; `installed`: each also in sys.modules."""

    def __init__(self) -> None:
        self.modules: dict[str, ContribModule] = {}
        self.installed = False

    def module(self, name: str) -> ContribModule:
        """The module for `tf.contrib.<name>` ('' for `tf.contrib`), made on first use."""
        if name not in self.modules:
            self.modules[name] = ContribModule(self, name, self._homes(name))
            if self.installed:
                sys.modules[self.modules[name].__name__] = self.modules[name]
        return self.modules[name]

    def _homes(self, name: str) -> tuple[Union[str, object], ...]:
        if not name or name in CONTRIB_HOMES:
            return CONTRIB_HOMES.get(name, ())
        parent, _, attr = name.rpartition(".")
        if not parent:
            raise ContribImportError(no_home_message(name), name=f"tensorflow.contrib.{name}")
        target = self.resolve(self.module(parent), attr)[0]
        if not isinstance(target, types.ModuleType):
            raise ContribImportError(f"tensorflow.contrib.{name} is not a module", name=f"tensorflow.contrib.{name}")
        return (target,)

    def children(self, name: str) -> set[str]:
        """The sub-modules `CONTRIB_HOMES` lists under `tf.contrib.<name>`."""
        prefix = f"{name}." if name else ""
        return {key[len(prefix):].split(".")[0] for key in CONTRIB_HOMES if key.startswith(prefix) and key != name}

    def resolve(self, module: ContribModule, attr: str) -> tuple[Any, str]:
        """(object, where it lives) for `module.attr`, or ContribAttributeError with one line."""
        _, name, homes = module._contrib
        full = f"{name}.{attr}" if name else attr
        if full in CONTRIB_HOMES:
            return self.module(full), "/".join(home_label(h) for h in CONTRIB_HOMES[full])
        if not name:
            raise ContribAttributeError(no_home_message(attr))
        for home in homes:
            with contextlib.suppress(ImportError, AttributeError):
                target = import_dotted(home) if isinstance(home, str) else home
                return getattr(target, attr), f"{home_label(home)}.{attr}"
        raise ContribAttributeError(no_home_message(full, [home_label(h) for h in homes]))


# ---------------------------------------------------------------------------------------------
# TensorFlow's upgrader, in memory
# ---------------------------------------------------------------------------------------------
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
# The program's folder: its modules, upgraded on import
# ---------------------------------------------------------------------------------------------
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
    """Finds the program folder's modules and the `tensorflow.contrib` modules of an environment."""

    def __init__(self, env: TF1Environment) -> None:
        self.env = env

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[types.ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname == "tensorflow.contrib" or fullname.startswith("tensorflow.contrib."):
            return importlib.util.spec_from_loader(fullname, ContribLoader(self.env.contrib), is_package=True)
        folder = self.env.folder
        dirs = [folder] if path is None else [Path(p) for p in path if Path(p).is_relative_to(folder)]
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


class UpgradingLoader(importlib.abc.InspectLoader):
    """Executes a program file as TensorFlow's upgrader rewrites it; the file is only read."""

    def __init__(self, env: TF1Environment, file: Path) -> None:
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


# ---------------------------------------------------------------------------------------------
# Devices: /gpu:N without that GPU -> /cpu:N, and enough CPU devices in every session
# ---------------------------------------------------------------------------------------------
def span(prefix: str, indices: Sequence[Optional[int]]) -> str:
    """'/gpu:0../gpu:3' for consecutive indices, else a list; None is the device's wildcard."""
    if None in indices:
        return prefix.rstrip(":")
    numbers = cast(Sequence[int], indices)  # no None past the check above, which mypy cannot narrow
    if len(numbers) > 1 and list(numbers) == list(range(numbers[0], numbers[-1] + 1)):
        return f"{prefix}{indices[0]}..{prefix}{indices[-1]}"
    return ", ".join(f"{prefix}{i}" for i in indices)


class DeviceMap:
    """Maps a device the program names to the one it runs on: `/gpu:N` -> `/cpu:N` when N >= gpus."""

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.mapped: dict[Optional[int], Optional[int]] = {}   # GPU index -> CPU index

    def map(self, device: Any) -> Any:
        """A device string, DeviceSpec, device function or None, mapped."""
        if callable(device) and not isinstance(device, (str, device_spec.DeviceSpecV2)):
            return functools.wraps(device)(lambda op: self.map(device(op)))
        if not device:
            return device
        spec = device_spec.DeviceSpecV2.from_string(device if isinstance(device, str) else device.to_string())
        if (spec.device_type or "").upper() != "GPU" or (spec.device_index or 0) < self.gpus:
            return device
        self.mapped[spec.device_index] = spec.device_index
        return spec.replace(device_type="CPU").to_string()

    def line(self) -> str:
        """The one line saying which GPU devices run on which virtual CPU devices."""
        gpus = sorted(self.mapped, key=lambda i: -1 if i is None else i)
        have = "no GPU" if self.gpus == 0 else f"only {self.gpus} GPU{'s' if self.gpus > 1 else ''}"
        they = "they run on virtual CPU devices" if len(gpus) > 1 else "it runs on virtual CPU device"
        return (f"{PREFIX}: {have} for the towers the program places on {span('/gpu:', gpus)}: "
                f"{they} {span('/cpu:', [self.mapped[g] for g in gpus])}")


def highest_cpu(graph: ops.Graph) -> int:
    """The highest CPU device index the graph's ops name (-1 if none)."""
    highest = -1
    for name in {op.device for op in graph.get_operations()}:
        spec = device_spec.DeviceSpecV2.from_string(name) if name else None
        if spec and (spec.device_type or "").upper() == "CPU" and spec.device_index is not None:
            highest = max(highest, spec.device_index)
    return highest


def with_cpu_devices(config: Optional[config_pb2.ConfigProto], cpus: int) -> Optional[config_pb2.ConfigProto]:
    """A copy of the program's ConfigProto with `device_count['CPU'] >= cpus` (itself where it has them)."""
    have = config.device_count.get("CPU", 1) if config is not None else 1
    if cpus <= have:
        return config
    merged = config_pb2.ConfigProto()
    if config is not None:
        merged.CopyFrom(config)
    merged.device_count["CPU"] = cpus
    return merged


# ---------------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Failure:
    """How the program's last run failed: the exception and the step it was in."""
    error: BaseException
    step: str


def stderr_log(line: str) -> None:
    """The command line's log: one line on stderr."""
    print(line, file=sys.stderr, flush=True)


def v1_modules() -> list[types.ModuleType]:
    """Every module object TensorFlow builds for `tf.compat.v1` (the program's `tf`)."""
    return [sys.modules[name] for name in slim_compat.V1_MODULES if name in sys.modules]


def library_paths() -> set[str]:
    """The standard library's and the installed packages' folders."""
    paths = sysconfig.get_paths()
    return {os.path.realpath(paths[key]) for key in ("stdlib", "platstdlib", "purelib", "platlib")}


class TF1Environment:
    """What `tf1_environment` installed for one program, and that program's runs.

    Attributes: program (absolute path), folder, devices (DeviceMap), contrib (ContribTree),
    cpu_devices (the most CPU devices a session needed), device_line (the mapping line, None
    until a session used the mapping), graphs (the graphs of the sessions the program opened),
    upgrades (file -> Upgrade), loaded (the local modules the last run imported), failure (how
    the last run failed, or None).
    """

    active: Optional[TF1Environment] = None  # the environment installed now (one at a time)

    def __init__(self, program: Path, log: Log, gpus: int) -> None:
        self.program, self.folder, self.log = program, program.parent, log
        self.devices = DeviceMap(gpus)
        self.contrib = ContribTree()
        self.cpu_devices = 1
        self.device_line: Optional[str] = None
        self.graphs: list[ops.Graph] = []
        self.upgrades: dict[Path, Upgrade] = {}
        self.loaded: list[str] = []
        self.failure: Optional[Failure] = None
        self._sessions: weakref.WeakSet[tf_session.BaseSession] = weakref.WeakSet()

    # -- install and undo ------------------------------------------------------------------------
    def install(self, undo: contextlib.ExitStack) -> None:
        """Install TF1 behaviour, tf.contrib, the finder and the device patches; `undo` reverts each."""
        TF1Environment.active = self
        undo.callback(setattr, TF1Environment, "active", None)
        self._v1_behaviour(undo)
        self._route_v1_names(undo)
        self._install_contrib(undo)
        finder = ProgramFinder(self)
        sys.meta_path.insert(0, finder)
        undo.callback(sys.meta_path.remove, finder)
        self._patch(undo, ops.Graph, "device", self._mapped_device)
        self._patch(undo, tf_session.BaseSession, "__init__", self._session_init)
        self._stash_shadowed(undo)
        absl_app.define_help_flags()  # absl's own flags, defined once here rather than during a run
        undo.callback(self._forget_run)

    def _v1_behaviour(self, undo: contextlib.ExitStack) -> None:
        if tf2.enabled():
            undo.callback(tf.enable_v2_behavior)
        tf.disable_v2_behavior()
        undo.callback(self._reset_graph)

    @staticmethod
    def _route_v1_names(undo: contextlib.ExitStack) -> None:
        for name, home in V1_ROUTES.items():
            parent, _, attr = name.rpartition(".")
            owner = functools.reduce(getattr, parent.split("."), tf)
            undo.callback(setattr, owner, attr, owner.__dict__[attr])
            setattr(owner, attr, import_dotted(home))

    def _install_contrib(self, undo: contextlib.ExitStack) -> None:
        root = self.contrib.module("")
        self.contrib.installed = True
        sys.modules[root.__name__] = root
        for module in [*v1_modules(), tf_root]:
            module.contrib = root
        undo.callback(self._remove_contrib)

    def _remove_contrib(self) -> None:
        self.contrib.installed = False
        for name in [n for n in sys.modules if n == "tensorflow.contrib" or n.startswith("tensorflow.contrib.")]:
            del sys.modules[name]
        for module in [*v1_modules(), tf_root]:
            with contextlib.suppress(AttributeError):
                delattr(module, "contrib")

    @staticmethod
    def _patch(undo: contextlib.ExitStack, owner: type, name: str, make: Callable[[Any], Any]) -> None:
        original = owner.__dict__[name]
        setattr(owner, name, functools.wraps(original)(make(original)))
        undo.callback(setattr, owner, name, original)

    def _stash_shadowed(self, undo: contextlib.ExitStack) -> None:
        """Set aside modules named like the folder's (but from elsewhere, not a library's): the
        program imports its own."""
        names, libraries = local_names(self.folder), library_paths()
        stash = {name: module for name, module in sys.modules.items()
                 if name.split(".")[0] in names and not self._from_library(module, libraries)}
        for name in stash:
            del sys.modules[name]
        undo.callback(sys.modules.update, stash)

    @staticmethod
    def _from_library(module: types.ModuleType, libraries: set[str]) -> bool:
        file = getattr(module, "__file__", None)
        return file is None or any(os.path.realpath(file).startswith(lib + os.sep) for lib in libraries)

    @staticmethod
    def _reset_graph() -> None:
        try:
            tf.reset_default_graph()
        except AssertionError:
            # The caller is inside a graph of its own: keep it, and drop only TF1's implicit global
            # graph the program may have made, which would stop TF2 behaviour coming back
            # ("tf.enable_eager_execution must be called at program startup").
            ops._default_graph_stack._global_default_graph = None

    # -- the patches -----------------------------------------------------------------------------
    def _mapped_device(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def device(graph: ops.Graph, device_name_or_function: Any) -> Any:
            return original(graph, self.devices.map(device_name_or_function))
        return device

    def _session_init(self, original: Callable[..., None]) -> Callable[..., None]:
        def __init__(session: tf_session.BaseSession, target: str = "", graph: Optional[ops.Graph] = None,
                     config: Optional[config_pb2.ConfigProto] = None) -> None:
            graph = graph if graph is not None else ops.get_default_graph()
            original(session, target, graph, self._session_config(config, graph))
            self.graphs.append(graph)
            self._sessions.add(session)
        return __init__

    def _session_config(self, config: Optional[config_pb2.ConfigProto],
                        graph: ops.Graph) -> Optional[config_pb2.ConfigProto]:
        mapped = [i for i in self.devices.mapped.values() if i is not None]
        cpus = 1 + max([highest_cpu(graph), *mapped], default=0)
        self.cpu_devices = max(self.cpu_devices, cpus)
        if self.devices.mapped and self.devices.line() != self.device_line:
            self.device_line = self.devices.line()
            self.log(self.device_line)
        return with_cpu_devices(config, cpus)

    # -- the program's files ---------------------------------------------------------------------
    def upgrade(self, file: Path) -> Upgrade:
        """The file as TensorFlow's upgrader rewrites it (once per environment)."""
        if file not in self.upgrades:
            self.upgrades[file] = upgrade_source(read_source(file), str(file))
        return self.upgrades[file]

    def compile_file(self, file: Path) -> types.CodeType:
        """The upgraded file, compiled under its real name (tracebacks show the user's lines)."""
        return compile(self.upgrade(file).text, str(file), "exec", dont_inherit=True)

    # -- running ---------------------------------------------------------------------------------
    def run_program(self, argv: Sequence[str] = ()) -> int:
        """Run the program as `__main__` with `sys.argv = [program, *argv]`; returns its exit status.

        0 when it ends, n for `sys.exit(n)` (`tf.app.run` included).  When it raises: its traceback
        on stderr, one line through `log` naming the step, `failure` set, and status 1.  Local
        modules and flags of a previous run are dropped first, so each run imports them afresh.
        Sessions the program leaves open are closed after it (their queues first, so that the
        queue-runner threads end quietly).
        """
        if TF1Environment.active is not self:
            raise RuntimeError("run_program runs inside its `with tf1_environment(...)` block only")
        self._forget_run()
        self.loaded, self.failure = [], None
        try:
            code = self.compile_file(self.program)
            with self._as_main(argv) as module:
                exec(code, module.__dict__)
        except SystemExit as stop:
            return exit_status(stop)
        except Exception as error:
            self._report(error)
            return 1
        finally:
            self._close_sessions()
        return 0

    @contextlib.contextmanager
    def _as_main(self, argv: Sequence[str]) -> Iterator[types.ModuleType]:
        module = types.ModuleType("__main__")
        module.__dict__.update(__file__=str(self.program), __cached__=None, __builtins__=__builtins__,
                               __loader__=UpgradingLoader(self, self.program))
        saved = sys.argv, sys.path[:], sys.modules["__main__"], sys.dont_write_bytecode
        sys.argv, sys.modules["__main__"], sys.dont_write_bytecode = [str(self.program), *argv], module, True
        sys.path.insert(0, str(self.folder))
        self._reset_graph()
        try:
            yield module
        finally:
            sys.argv, sys.path[:], sys.modules["__main__"], sys.dont_write_bytecode = saved

    def _forget_run(self) -> None:
        """Drop the last run's local modules from sys.modules and the flags they defined."""
        owners = {str(self.program), *self.loaded}
        for name in list(absl_flags.FLAGS):
            if name in absl_flags.FLAGS and absl_flags.FLAGS.find_module_defining_flag(name) in owners:
                delattr(absl_flags.FLAGS, name)
        for name in self.loaded:
            sys.modules.pop(name, None)

    def _close_sessions(self) -> None:
        """Close the sessions the program left open, after ending their queue-runner threads: each
        runner takes any op error as "queue closed" (it returns quietly instead of logging and
        raising), its queue is cancelled, and its threads are joined."""
        sessions = [session for session in list(self._sessions) if not session._closed]
        for session in sessions:
            runners = session.graph.get_collection(tf.GraphKeys.QUEUE_RUNNERS)
            for runner in runners:
                runner._queue_closed_exception_types = (tf.errors.OpError,)
            with contextlib.suppress(Exception):
                session.run([runner.cancel_op for runner in runners])
        deadline = time.monotonic() + 10
        for thread in threading.enumerate():
            if thread.name.startswith("QueueRunnerThread-"):
                thread.join(max(0.0, deadline - time.monotonic()))
        for session in sessions:
            session.close()

    def _report(self, error: Exception) -> None:
        print(program_traceback(error), end="", file=sys.stderr, flush=True)
        self.failure = Failure(error, self._step(error))
        self.log(f"{PREFIX}: the program raised while {self.failure.step} ({type(error).__name__})")

    def _step(self, error: BaseException) -> str:
        """What the program was doing: importing a local module, running a function, or its top level."""
        files = {str(self.program), *(str(f) for f in self.upgrades)}
        frames = [frame for frame, _ in traceback.walk_tb(error.__traceback__) if frame.f_code.co_filename in files]
        first_call = next((i for i, f in enumerate(frames) if f.f_code.co_name != "<module>"), len(frames))
        imports = frames[:first_call]
        name = getattr(error, "name", None) if isinstance(error, ImportError) else None
        if len(imports) > 1:
            module = imports[-1].f_globals.get("__name__", "?")
            return f"importing {module}" + (f", which imports {name}" if name and name != module else "")
        if len(frames) > len(imports):
            return f"running {frames[len(imports)].f_code.co_name}"
        return f"importing {name}" if name else "running the program's top level"


def hidden_frame(filename: str) -> bool:
    """A frame of this runner or of importlib, left out of the program's traceback."""
    return filename == os.path.abspath(__file__) or filename.startswith("<frozen importlib")


def program_traceback(error: BaseException) -> str:
    """The program's traceback as Python prints it, without the runner's and importlib's frames."""
    top = traceback.TracebackException.from_exception(error)
    todo, seen = [top], set()
    while todo:
        exception = todo.pop()
        if id(exception) not in seen:
            seen.add(id(exception))
            exception.stack = traceback.StackSummary.from_list(
                [frame for frame in exception.stack if not hidden_frame(frame.filename)])
            todo += [e for e in (exception.__cause__, exception.__context__) if e is not None]
    return "".join(top.format())


def exit_status(stop: SystemExit) -> int:
    """The process exit status Python gives `sys.exit(code)`."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


def machine_gpus() -> int:
    """The GPUs TensorFlow sees."""
    return len(tf.config.list_physical_devices("GPU"))


@contextlib.contextmanager
def tf1_environment(program_path: Union[str, os.PathLike], log: Log = print,
                    gpus: Optional[int] = None) -> Iterator[TF1Environment]:
    """TF1 behaviour, `tf.contrib`, the upgrading finder and the device mapping for one program.

    Args:
      program_path: the program's .py file (ProgramError, one line, if it is not one).
      log: where the runner's own lines go (the device mapping, a failed run's step).
      gpus: the GPUs to treat as present (default: the machine's); `/gpu:N` with N >= gpus runs on `/cpu:N`.
    Yields:
      The TF1Environment; `env.run_program(argv)` runs the program.  Leaving the block removes the
      finder, the local modules, the flags the program defined, `tf.contrib` and the
      `tensorflow.contrib*` modules, the device and Session patches, and turns TF2 behaviour back
      on if it was on.
    """
    if TF1Environment.active is not None:
        raise RuntimeError(f"a tf1_environment for {TF1Environment.active.program} is active: leave it first")
    program = check_program(program_path)
    env = TF1Environment(program, log, machine_gpus() if gpus is None else gpus)
    env.upgrade(program)  # an UpgradeError here, before anything is installed
    with contextlib.ExitStack() as undo:
        env.install(undo)
        yield env


def run_program(program_path: Union[str, os.PathLike], argv: Sequence[str] = (), log: Log = print,
                gpus: Optional[int] = None) -> int:
    """Run a TF1 program once in a fresh `tf1_environment`; returns its exit status."""
    with tf1_environment(program_path, log, gpus) as env:
        return env.run_program(argv)


# ---------------------------------------------------------------------------------------------
# --report: what would be mapped, found statically
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
EPILOG = ("Before the program runs: TensorFlow's upgrader rewrites `import tensorflow as tf` to "
          "`tensorflow.compat.v1` in the program and the modules of its folder, in memory (nothing is written); "
          "TF1 behaviour is on; tf.contrib names get their maintained homes (tf-slim, tf.compat.v1.data, ...); "
          "a tower on /gpu:N without that GPU runs on the virtual CPU device /cpu:N. Exit status: the program's "
          "own (0 when it ends, n for sys.exit(n)), 1 when it raises, 2 when PROGRAM.py is not a Python file; "
          "--report: 0 when every name maps, 1 when some cannot. Guide: docs/running-your-own-tf1-program.md")


def parse_args(argv: Optional[Sequence[str]]) -> Any:
    """The runner's options, the program's path, and the program's own arguments."""
    p = ArgumentParser(prog="python -m legacy.run_tf1", description=__doc__.split("\n\n")[0], epilog=EPILOG)
    p.add_argument("--report", action="store_true",
                   help="list what would be mapped and what cannot, without running the program; "
                        "exit status 1 when some name cannot")
    p.add_argument("--gpus", type=at_least(0), default=None, metavar="N",
                   help="the GPUs to treat as present (default: the machine's): /gpu:K with K >= N runs on /cpu:K")
    p.add_argument("program", metavar="PROGRAM.py", help="the TF1 program's .py file")
    p.add_argument("args", nargs="...", help="the program's own arguments")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m legacy.run_tf1` and `legacy-run-tf1`: run or report; returns the exit status."""
    args = parse_args(argv)
    try:
        if args.report:
            result = report(args.program, args.gpus)
            print("\n".join(format_report(result)), flush=True)
            return 1 if result.cannot else 0
        return run_program(args.program, args.args, log=stderr_log, gpus=args.gpus)
    except (ProgramError, UpgradeError) as error:
        stderr_log(f"{PREFIX}: {error}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
