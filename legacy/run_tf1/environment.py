"""The environment one program runs in, set and undone: `TF1Environment`, `tf1_environment`, `run_program`.

TF1 behaviour (`tf.compat.v1.disable_v2_behavior()`, `tf.compat.v1` under the names the program
uses), `tf.contrib`'s homes (`contrib`), the upgrading finder (`upgrade`), the device mapping in every
session the program opens (`devices`); the program run as `__main__` with its own argv, its exit
status and its traceback (the runner's frames left out).  Leaving the `with` block undoes all of it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import sysconfig
import threading
import time
import traceback
import types
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Optional, Union

import tensorflow as tf_root
import tensorflow.compat.v1 as tf
from absl import app as absl_app
from absl import flags as absl_flags
from legacy import slim_compat  # before tf_slim: tf-slim on TF 2.21
from legacy.run_tf1.estimator import V1_API, LazyModule
from legacy.run_tf1.estimator import alias as estimator_alias
from legacy.run_tf1.contrib import V1_ROUTES, ContribTree, import_dotted
from legacy.run_tf1.devices import DeviceMap, GPUQueries, highest_cpu, strategy_devices, with_cpu_devices
from legacy.run_tf1.log import PREFIX, Log
from legacy.run_tf1.upgrade import (
    ProgramFinder,
    Upgrade,
    UpgradingLoader,
    check_program,
    local_names,
    read_source,
    search_roots,
    upgrade_source,
)
from tensorflow.core.protobuf import config_pb2
from tensorflow.python import tf2
from tensorflow.python.client import device_lib
from tensorflow.python.client import session as tf_session
from tensorflow.python.distribute import mirrored_strategy, one_device_strategy
from tensorflow.python.framework import ops, test_util

# The strategies whose devices the environment maps, TF1's and TF2's classes.
MIRRORED = (mirrored_strategy.MirroredStrategyV1, mirrored_strategy.MirroredStrategy)
ONE_DEVICE = (one_device_strategy.OneDeviceStrategyV1, one_device_strategy.OneDeviceStrategy)


@dataclasses.dataclass
class Failure:
    """How the program's last run failed: the exception and the step it was in."""
    error: BaseException
    step: str



def v1_modules() -> list[types.ModuleType]:
    """Every module object TensorFlow builds for `tf.compat.v1` (the program's `tf`)."""
    return [sys.modules[name] for name in slim_compat.V1_MODULES if name in sys.modules]


def library_paths() -> set[str]:
    """The standard library's and the installed packages' folders."""
    paths = sysconfig.get_paths()
    return {os.path.realpath(paths[key]) for key in ("stdlib", "platstdlib", "purelib", "platlib")}


class TF1Environment:
    """What `tf1_environment` installed for one program, and that program's runs.

    Attributes: program (absolute path), folder, roots (where its own modules are found: its folder,
    the working directory, PYTHONPATH), devices (DeviceMap), virtual_gpus (the GPUs its GPU queries
    report), contrib (ContribTree), cpu_devices (the most CPU devices a session needed), device_line
    (the mapping line, None until a session used the mapping), graphs (the graphs of the sessions the
    program opened), upgrades (file -> Upgrade), loaded (the local modules the last run imported),
    failure (how the last run failed, or None).
    """

    active: Optional[TF1Environment] = None  # the environment installed now (one at a time)

    def __init__(self, program: Path, log: Log, gpus: int, virtual_gpus: int = 0) -> None:
        self.program, self.folder, self.log = program, program.parent, log
        self.roots = search_roots(program)
        self.devices = DeviceMap(gpus)
        self.virtual_gpus = virtual_gpus
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
        self._route_estimator(undo)
        self._install_contrib(undo)
        finder = ProgramFinder(self)
        sys.meta_path.insert(0, finder)
        undo.callback(sys.meta_path.remove, finder)
        self._patch(undo, ops.Graph, "device", self._mapped_device)
        self._patch(undo, tf_session.BaseSession, "__init__", self._session_init)
        for cls in MIRRORED:
            self._patch(undo, cls, "__init__", self._mirrored_init)
        for cls in ONE_DEVICE:
            self._patch(undo, cls, "__init__", self._one_device_init)
        if self.virtual_gpus:
            self._answer_gpu_queries(undo)
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

    @staticmethod
    def _route_estimator(undo: contextlib.ExitStack) -> None:
        """`tf.estimator` (the program's `tf` is tf.compat.v1): tensorflow-estimator's TF1 API, imported at
        its first use; its import names (`tensorflow.estimator`, ...) are the finder's."""
        route = LazyModule("tensorflow.compat.v1.estimator", V1_API)
        for module in [*v1_modules(), tf_root]:
            if "estimator" not in module.__dict__:
                module.estimator = route
                undo.callback(module.__dict__.pop, "estimator", None)
        undo.callback(lambda: [sys.modules.pop(name) for name in list(sys.modules) if estimator_alias(name)])

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
        """Set aside modules named like the program's own (`roots`: but from elsewhere, not a
        library's): the program imports its own."""
        names, libraries = set().union(*(local_names(root) for root in self.roots)), library_paths()
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

    def _mirrored_init(self, original: Callable[..., None]) -> Callable[..., None]:
        def __init__(strategy: Any, devices: Any = None, cross_device_ops: Any = None) -> None:
            original(strategy, strategy_devices(self.devices, devices, self.virtual_gpus), cross_device_ops)
        return __init__

    def _one_device_init(self, original: Callable[..., None]) -> Callable[..., None]:
        def __init__(strategy: Any, device: Any) -> None:
            original(strategy, self.devices.map(device))
        return __init__

    def _answer_gpu_queries(self, undo: contextlib.ExitStack) -> None:
        """device_lib.list_local_devices, tf.test.is_gpu_available and tf.test.gpu_device_name answer with
        the virtual GPUs, in every TensorFlow module that holds them (`tf.test` is several)."""
        queries = GPUQueries(self.devices, self.virtual_gpus)
        for function, make in ((device_lib.list_local_devices, queries.list_local_devices),
                               (test_util.is_gpu_available, queries.is_gpu_available),
                               (test_util.gpu_device_name, queries.gpu_device_name)):
            replacement, name = functools.wraps(function)(make(function)), function.__name__
            for module in [m for key, m in list(sys.modules.items()) if key.startswith("tensorflow") and m is not None]:
                if module.__dict__.get(name) is function:
                    module.__dict__[name] = replacement
                    undo.callback(module.__dict__.__setitem__, name, function)

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
        self._say_devices()
        return with_cpu_devices(config, cpus)

    def _say_devices(self) -> None:
        """The device line, once for each new mapping: when a session opens, or when the program
        fails before any session did."""
        if self.devices.mapped and self.devices.line() != self.device_line:
            self.device_line = self.devices.line()
            self.log(self.device_line)

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
        forget_run(self.program, self.loaded)

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
        self._say_devices()  # towers placed, perhaps no session opened yet
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


def forget_run(program: Union[str, os.PathLike], loaded: Sequence[str]) -> None:
    """Drop a run's local modules (`loaded`) from sys.modules and the absl flags they or the program
    defined, so that the next run imports and defines them afresh."""
    owners = {str(program), *loaded}
    for name in list(absl_flags.FLAGS):
        if name in absl_flags.FLAGS and absl_flags.FLAGS.find_module_defining_flag(name) in owners:
            delattr(absl_flags.FLAGS, name)
    for name in loaded:
        sys.modules.pop(name, None)


def hidden_frame(filename: str) -> bool:
    """A frame of this runner or of importlib, left out of the program's traceback."""
    return (os.path.dirname(filename) == os.path.dirname(os.path.abspath(__file__))  # any file of this package
            or filename.startswith("<frozen importlib"))


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
                    gpus: Optional[int] = None, virtual_gpus: int = 0) -> Iterator[TF1Environment]:
    """TF1 behaviour, `tf.contrib`, tf.estimator, the upgrading finder and the device mapping for one program.

    Args:
      program_path: the program's .py file (ProgramError, one line, if it is not one).
      log: where the runner's own lines go (the device mapping, a failed run's step).
      gpus: the GPUs to treat as present (default: the machine's); `/gpu:N` with N >= gpus runs on `/cpu:N`.
      virtual_gpus: the GPUs the program's GPU queries report (`device_lib.list_local_devices`,
        `tf.test.is_gpu_available`), the ones past the machine's running on virtual CPU devices; 0: the
        machine's own.
    Yields:
      The TF1Environment; `env.run_program(argv)` runs the program.  Leaving the block removes the
      finder, the local modules, the flags the program defined, `tf.contrib` and the
      `tensorflow.contrib*` modules, the device and Session patches, and turns TF2 behaviour back
      on if it was on.
    """
    if TF1Environment.active is not None:
        raise RuntimeError(f"a tf1_environment for {TF1Environment.active.program} is active: leave it first")
    program = check_program(program_path)
    env = TF1Environment(program, log, machine_gpus() if gpus is None else gpus, virtual_gpus)
    env.upgrade(program)  # an UpgradeError here, before anything is installed
    with contextlib.ExitStack() as undo:
        env.install(undo)
        yield env


def run_program(program_path: Union[str, os.PathLike], argv: Sequence[str] = (), log: Log = print,
                gpus: Optional[int] = None, virtual_gpus: int = 0) -> int:
    """Run a TF1 program once in a fresh `tf1_environment`; returns its exit status."""
    with tf1_environment(program_path, log, gpus, virtual_gpus) as env:
        return env.run_program(argv)


