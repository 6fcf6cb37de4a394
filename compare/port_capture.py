"""Judge a TF2 port as it runs: run it to its first training step and take its model, optimizer and step there.

The TF1 side of a pair can be captured (compare/capture.py); so can the port.  The harness runs the
port's file unmodified, as `__main__` with its own command line, and stops it at its first training
step: the first call of a `tf.function` whose trace calls `strategy.run`.  Before that call runs,
the function is traced (as its call would trace it), and the harness keeps

    strategy    the tf.distribute strategy whose `run` the trace called
    function    the innermost tf.function whose trace called it: the program's own train step in a
                custom loop (`@tf.function def train_step(dist_batch): strategy.run(...)`), Keras'
                `one_step_on_data` under `model.fit`
    model       the first Keras model the trace called, at the top (not a layer of another model)
    optimizer   the first Keras optimizer the trace applied gradients with
    dataset     the global dataset the program gave `strategy.experimental_distribute_dataset`, if any
    averages    the first `tf.train.ExponentialMovingAverage` the program applied, if any (its shadows
                are the moving averages the harness judges)

so nothing of the step has run: the weights are the program's fresh ones, and the optimizer is
built (its slots exist).  `CapturedPort` is the ModernSide that does it.  What it drives:

  * the step: the program's function traced afresh (`Function._clone`: the same Python function,
    input signature, jit and retracing options), so that the harness's gradient taps, installed
    after the capture, are in its trace; called with a distributed element in the program's own
    structure, its other arguments as the program gave them;
  * the element: the harness's rows put in the structure of the program's global dataset (a tuple
    or a dict; images, labels as indices or one-hot, row weights), then distributed through the
    program's own `experimental_distribute_dataset` call (its options), or, where the program
    distributes otherwise, cut in order as `experimental_distribute_dataset` cuts a batch.  Where the
    step's element did not come from that dataset (the port cuts its rows its own way), a batch that
    does not divide evenly over the replicas is not given (NotFed: those split checks say NOT
    APPLICABLE), since how the port would cut it is its own;
  * the loss: the step's return value (a scalar, the first scalar of a tuple, or a dict's "loss"),
    per-replica values summed; under `model.fit` its metrics are reset before each step, so that
    "loss" is that step's.

What it refuses, each with one line naming why (`PortCaptureError`): a port that exits or raises before
its first step (its traceback's last frame quoted), one that runs no step within the time limit, a
step that takes an iterator or more than one tensor argument, an element part the harness cannot
fill (neither images, labels nor row weights).

Running the port: `sys.argv = [program, *argv]`, the program's folder first on `sys.path`, its own
modules (those of its folder) and the absl flags they define forgotten between runs, so that each
run imports them afresh.  The devices are the harness's: a device configuration the program makes
after TensorFlow has started (`tf.config.set_logical_device_configuration`) is refused by
TensorFlow; the harness keeps its own then and says so once.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import threading
import types
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence
from unittest import mock

import numpy as np
import tensorflow as tf

from compare import limits
from compare.capture import (Stop, last_frame, parse_flags, quiet_tensorflow, run_to_stop,
                             working_directory)
from compare.interface import Batch, DataFiles, ModernBuild, NotFed, StepResult
from compare.legacy_run import HarnessError

class PortCaptureError(HarnessError):
    """The port could not be captured (the message says what it did instead)."""


class PortOutOfTime(PortCaptureError, limits.OutOfTime):
    """The port ran its seconds without reaching its first training step (one line)."""


# ---------------------------------------------------------------------------------------------
# Running the port

@dataclasses.dataclass
class PortFailure:
    error: BaseException
    where: str


class PortEnvironment:
    """One port's runs in this process: `run_program(argv)` runs it as `__main__`.

    Attributes: program (absolute path), folder, loaded (the modules of its folder the last run
    imported), failure (how the last run failed, or None)."""

    def __init__(self, program: Path, log: Callable[[str], None]) -> None:
        self.program, self.folder, self.log = program, program.parent, log
        self._loaded: list[str] = []
        self._before: Optional[set[str]] = None  # sys.modules when the run now going on began
        self.failure: Optional[PortFailure] = None
        self.kept_devices = False

    def run_program(self, argv: Sequence[str] = ()) -> int:
        """Run the port with `sys.argv = [program, *argv]`; its exit status (1 when it raised)."""
        self.forget_run()
        self.failure = None
        self._before = set(sys.modules)
        module = types.ModuleType("__main__")
        module.__dict__.update(__file__=str(self.program), __cached__=None, __builtins__=__builtins__)
        saved = sys.argv, sys.path[:], sys.modules["__main__"]
        sys.argv, sys.modules["__main__"] = [str(self.program), *argv], module
        sys.path.insert(0, str(self.folder))
        try:
            code = compile(self.program.read_text(), str(self.program), "exec", dont_inherit=True)
            with self.devices_kept():
                exec(code, module.__dict__)
        except SystemExit as stop:
            return 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
        except Exception as error:
            self.failure = PortFailure(error, last_frame(error, {str(self.program), *self.files()}))
            return 1
        finally:
            sys.argv, sys.path[:], sys.modules["__main__"] = saved
            self._loaded, self._before = self.loaded, None
        return 0

    @property
    def loaded(self) -> list[str]:
        """The modules of the program's folder its run (the one going on, or the last) imported."""
        if self._before is None:
            return self._loaded
        return [name for name in set(sys.modules) - self._before if self.local(sys.modules.get(name))]

    def local(self, module: Any) -> bool:
        file = getattr(module, "__file__", None)
        return isinstance(file, str) and Path(os.path.realpath(file)).is_relative_to(os.path.realpath(self.folder))

    def files(self) -> list[str]:
        return [getattr(sys.modules.get(name), "__file__", "") or "" for name in self.loaded]

    def forget_run(self) -> None:
        """Drop the last run's local modules and the absl flags they (or the program) defined."""
        from legacy.run_tf1.environment import forget_run
        forget_run(self.program, self.loaded)

    @contextlib.contextmanager
    def devices_kept(self) -> Iterator[None]:
        """The program's device configuration, where TensorFlow has started already, left as the
        harness made it (said once) instead of raising."""
        originals = [(owner, name, getattr(owner, name)) for owner, names in (
            (tf.config, ("set_logical_device_configuration", "set_visible_devices")),
            (tf.config.experimental, ("set_virtual_device_configuration", "set_visible_devices", "set_memory_growth")))
            for name in names if hasattr(owner, name)]

        def kept(original: Callable[..., Any]) -> Callable[..., Any]:
            def configure(*args: Any, **kwargs: Any) -> Any:
                try:
                    return original(*args, **kwargs)
                except RuntimeError as error:
                    if "initialized" not in str(error):
                        raise
                    if not self.kept_devices:
                        self.kept_devices = True
                        self.log(f"the port configures devices after TensorFlow started; the harness's are kept: "
                                 f"{', '.join(d.name for d in tf.config.list_logical_devices())}")
            return configure

        with contextlib.ExitStack() as stack:
            for owner, name, original in originals:
                stack.enter_context(mock.patch.object(owner, name, kept(original)))
            yield


@contextlib.contextmanager
def port_environment(program: Any, log: Callable[[str], None] = print) -> Iterator[PortEnvironment]:
    """A PortEnvironment for `program` (a .py file); leaving the block forgets its last run."""
    path = Path(program).resolve()
    if path.suffix != ".py" or not path.is_file():
        raise PortCaptureError(f"{program}: not a Python file")
    env = PortEnvironment(path, log)
    try:
        yield env
    finally:
        env.forget_run()


# ---------------------------------------------------------------------------------------------
# Stopping it at its first step

@dataclasses.dataclass
class Taken:
    """What the port had built when its first training step was about to run."""
    strategy: Any
    function: Any
    args: tuple
    kwargs: dict
    model: Any
    optimizer: Any
    dataset: Any = None
    options: Any = None
    averages: Any = None  # the first tf.train.ExponentialMovingAverage the program applied, if any
    from_dataset: bool = False  # the step's element came from the distributed dataset (its cut is the strategy's)


class Watch:
    """The patches that find the first training step, and what they saw."""

    def __init__(self) -> None:
        self.stack: list[tuple[Any, tuple, dict]] = []  # the tf.functions being called, innermost last
        self.run: Optional[tuple[Any, Any, tuple, dict]] = None  # (strategy, function, args, kwargs)
        self.models: list[Any] = []
        self.optimizers: list[Any] = []
        self.distributed: Optional[tuple[Any, Any]] = None  # (dataset, options)
        self.averages: Any = None
        self.yielded: Any = None  # the last element a distributed dataset's iterator gave, eagerly
        self.from_dataset = False
        self.depth = 0
        self.probing = False
        self.main = threading.main_thread()

    def patches(self) -> list[Any]:
        import keras
        from keras.src.optimizers.base_optimizer import BaseOptimizer
        from tensorflow.python.distribute import distribute_lib, input_lib
        from tensorflow.python.eager.polymorphic_function import polymorphic_function as pf
        from tensorflow.python.training import moving_averages

        call, run = pf.Function.__call__, distribute_lib.StrategyBase.run
        distribute_dataset = distribute_lib.StrategyBase.experimental_distribute_dataset
        apply, layer_call = BaseOptimizer.apply, keras.layers.Layer.__call__
        average = moving_averages.ExponentialMovingAverage.apply
        iterator_next = input_lib.DistributedIteratorBase.__next__
        watch = self

        def next_element(iterator: Any) -> Any:
            watch.yielded = iterator_next(iterator)
            return watch.yielded

        def average_apply(ema: Any, *args: Any, **kwargs: Any) -> Any:
            if watch.averages is None:
                watch.averages = ema
            return average(ema, *args, **kwargs)

        def function_call(function: Any, *args: Any, **kwargs: Any) -> Any:
            if watch.probing or not tf.executing_eagerly() or threading.current_thread() is not watch.main:
                watch.stack.append((function, args, kwargs))
                try:
                    return call(function, *args, **kwargs)
                finally:
                    watch.stack.pop()
            watch.probing = True
            first = args[0] if args else None
            watch.from_dataset = isinstance(first, input_lib.DistributedIteratorBase) or same_values(first,
                                                                                                    watch.yielded)
            watch.stack.append((function, args, kwargs))
            try:
                function.get_concrete_function(*args, **kwargs)  # the trace its call would make, nothing run
            except Exception:
                if watch.run is not None:
                    raise
                return call(function, *args, **kwargs)  # no step here: the program's own call, as it would run
            finally:
                watch.stack.pop()
                watch.probing = False
            if watch.run is not None:
                raise Stop()
            watch.models.clear()
            watch.optimizers.clear()
            return call(function, *args, **kwargs)

        def strategy_run(strategy: Any, fn: Any, args: Any = (), kwargs: Any = None, options: Any = None) -> Any:
            if watch.probing and watch.run is None and watch.stack:
                function, fargs, fkwargs = watch.stack[-1]
                watch.run = (strategy, function, fargs, fkwargs)
            return run(strategy, fn, args=args, kwargs=kwargs, options=options)

        def distribute(strategy: Any, dataset: Any, options: Any = None) -> Any:
            if watch.distributed is None:
                watch.distributed = (dataset, options)
            return distribute_dataset(strategy, dataset, options)

        def optimizer_apply(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if watch.probing and optimizer not in watch.optimizers:
                watch.optimizers.append(optimizer)
            return apply(optimizer, *args, **kwargs)

        def model_call(layer: Any, *args: Any, **kwargs: Any) -> Any:
            if watch.probing and watch.depth == 0 and isinstance(layer, keras.Model) and layer not in watch.models:
                watch.models.append(layer)
            watch.depth += 1
            try:
                return layer_call(layer, *args, **kwargs)
            finally:
                watch.depth -= 1

        return [mock.patch.object(pf.Function, "__call__", function_call),
                mock.patch.object(distribute_lib.StrategyBase, "run", strategy_run),
                mock.patch.object(distribute_lib.StrategyBase, "experimental_distribute_dataset", distribute),
                mock.patch.object(BaseOptimizer, "apply", optimizer_apply),
                mock.patch.object(keras.layers.Layer, "__call__", model_call),
                mock.patch.object(moving_averages.ExponentialMovingAverage, "apply", average_apply),
                mock.patch.object(input_lib.DistributedIteratorBase, "__next__", next_element)]

    def taken(self) -> Optional[Taken]:
        if self.run is None:
            return None
        strategy, function, args, kwargs = self.run
        dataset, options = self.distributed or (None, None)
        optimizer = self.optimizers[0] if self.optimizers else None
        trained = {id(v) for v in getattr(optimizer, "_trainable_variables", [])}
        # The model the optimizer trains: of the models the step called, the one most of whose weights it updates.
        models = sorted(self.models, key=lambda m: -len(trained & {id(v) for v in m.trainable_variables}))
        return Taken(strategy, function, args, kwargs, models[0] if models else None, optimizer, dataset, options,
                     self.averages,
                     self.from_dataset and dataset is not None)


def same_values(a: Any, b: Any) -> bool:
    """Whether two nests hold the very same value objects (an element passed on as it was drawn)."""
    if a is None or b is None:
        return False
    flat_a, flat_b = tf.nest.flatten(a), tf.nest.flatten(b)
    return len(flat_a) == len(flat_b) and all(x is y for x, y in zip(flat_a, flat_b))


def capture_port(program: str, argv: Sequence[str], seconds: Optional[float] = None, cwd: Optional[str] = None,
                 log: Callable[[str], None] = print) -> Taken:
    """Run the port `program` with `argv` until its first training step is about to run; what it built.
    PortCaptureError, one line, if it ends, fails or runs out of time first."""
    watch = Watch()
    with working_directory(cwd), quiet_tensorflow(), port_environment(program, log) as env:
        with contextlib.ExitStack() as stack:
            for patch in watch.patches():
                stack.enter_context(patch)
            status, timed_out = run_to_stop(env, argv, seconds, f"running the port {program} to its first training "
                                                                f"step")
    taken = watch.taken()
    run_as = f"run as {program} {' '.join(argv)}"
    if taken is None:
        if timed_out:
            why = (f"it ran {limits.seconds() if seconds is None else seconds:g} s without calling strategy.run "
                   f"inside a tf.function")
            raise PortOutOfTime(f"no training step of the port to capture: {why}; {run_as}")
        elif env.failure is not None:
            error = env.failure.error
            why = (f"it raised {type(error).__name__} at {env.failure.where} "
                   f"({str(error).strip().splitlines()[0][:200] if str(error).strip() else ''})")
        else:
            why = f"it ended with exit status {status} without calling strategy.run inside a tf.function"
        raise PortCaptureError(f"no training step of the port to capture: {why}; {run_as}")
    if taken.model is None or taken.optimizer is None:
        lacks = " and ".join(w for w, v in (("a Keras model", taken.model), ("a Keras optimizer's apply_gradients",
                                                                             taken.optimizer)) if v is None)
        raise PortCaptureError(f"the port's step {taken.function.name} calls strategy.run but not {lacks}: the "
                               f"harness cannot drive it; {run_as}")
    return taken


# ---------------------------------------------------------------------------------------------
# The distributed element in the port's own structure

@dataclasses.dataclass
class Part:
    """One part of the port's global element: what it holds, and its spec."""
    role: str  # "x", "y", "onehot" or "weights"
    spec: Any


def parts_of(spec: Any, where: str, classes: Optional[int] = None) -> list[Part]:
    """The roles of the flattened element spec: the images (the float part of rank >= 2, the highest),
    the labels (an integer part of rank 1, or a float part of rank 2 beside the images: one-hot; of
    `classes` columns, the model's outputs, where a rank-2 image part could be either), the row
    weights (a float part of rank 1).  PortCaptureError for anything else."""
    flat = tf.nest.flatten(spec)
    ranks = [s.shape.rank for s in flat]
    floats = [s.dtype.is_floating for s in flat]
    images = [i for i, s in enumerate(flat) if floats[i] and (ranks[i] or 0) >= 2
              and (ranks[i] or 0) == max(r or 0 for r in ranks)]
    if len(images) == 2 and ranks[images[0]] == 2 and classes is not None:
        images = [i for i in images if flat[i].shape[-1] != classes] or images
    if len(images) != 1:
        raise PortCaptureError(f"{where}: {len(images)} parts of its element look like images (float, the highest "
                               f"rank): the harness cannot tell which rows to put where; element {spec}")
    out: list[Part] = []
    for i, s in enumerate(flat):
        if i == images[0]:
            out.append(Part("x", s))
        elif s.dtype.is_integer and ranks[i] == 1:
            out.append(Part("y", s))
        elif floats[i] and ranks[i] == 2:
            out.append(Part("onehot", s))
        elif floats[i] and ranks[i] == 1:
            out.append(Part("weights", s))
        else:
            raise PortCaptureError(f"{where}: a part of its element is neither images, labels nor row weights: {s}")
    if sum(p.role in ("y", "onehot") for p in out) != 1:
        raise PortCaptureError(f"{where}: its element has no single labels part: {spec}")
    return out


def output_units(model: Any) -> Optional[int]:
    """The last dimension of a Keras model's (first) output, where the model knows it."""
    try:
        units = model.outputs[0].shape[-1]
    except Exception:  # a subclassed model has no symbolic outputs
        return None
    return None if units is None else int(units)


def fill(part: Part, batch: Batch) -> np.ndarray:
    """The batch's rows as the port's part `part` takes them."""
    dtype = part.spec.dtype.as_numpy_dtype
    y = np.asarray(batch.y)
    if part.role == "x":
        return np.asarray(batch.x).astype(dtype)
    if part.role == "weights":
        return np.ones(batch.rows, dtype)
    if part.role == "onehot":
        depth = part.spec.shape[-1]
        return (y if y.ndim == 2 else np.eye(int(depth), dtype=dtype)[y.astype(np.int64)]).astype(dtype)
    return (y.argmax(-1) if y.ndim == 2 else y).astype(dtype)


def global_spec(spec: Any) -> Any:
    """A per-replica element's spec with the batch dimension left open."""
    def one(value: Any) -> Any:
        value = value.values[0] if hasattr(value, "values") else value
        return tf.TensorSpec([None, *value.shape[1:]], value.dtype)
    return tf.nest.map_structure(one, spec)


class Element(tuple):
    """A distributed element as the harness reads it, (x, y[, weights]), each a per-replica value;
    `program` holds the same values in the port's own structure, which its step takes."""
    program: Any

    def __new__(cls, parts: Sequence[Any], program: Any) -> "Element":
        made = super().__new__(cls, parts)
        made.program = program
        return made


# ---------------------------------------------------------------------------------------------
# The ModernSide

class CapturedPort:
    """A ModernSide for a TF2 port judged by running it (see the module docstring).

    program: the port's .py file.  replica_flag: its flag for the number of replicas.  files_argv:
    (files) -> the arguments that point it at the harness's files, or None.  seconds: its time to
    reach a training step (default: the run's limit, compare.limits).  It makes its own strategy: the
    harness takes it from the capture.
    """
    makes_its_strategy = True

    def __init__(self, program: str, replica_flag: str,
                 files_argv: Optional[Callable[[DataFiles], Sequence[str]]] = None, seconds: Optional[float] = None,
                 log: Callable[[str], None] = lambda _: None):
        self.program, self.replica_flag, self.files_argv = program, replica_flag, files_argv
        self.seconds, self.log = seconds, log
        self.taken: Optional[Taken] = None

    def parse_args(self, argv: Sequence[str]) -> Any:
        return parse_flags(self.program, argv, environment=lambda program: port_environment(program, self.log))

    def build(self, flags: Any, strategy: Any, files: DataFiles) -> ModernBuild:
        argv = [*getattr(flags, "_argv", ()), *(self.files_argv(files) if self.files_argv else ())]
        taken = capture_port(self.program, argv, self.seconds, log=self.log)
        self.taken = taken
        name = f"the port's step {taken.function.name}"
        element, others = self.element_argument(taken, name)
        spec = taken.dataset.element_spec if taken.dataset is not None else global_spec(element)
        parts = parts_of(spec, name, output_units(taken.model))
        step = taken.function._clone(python_function=None)
        fit = getattr(taken.model, "train_function", None) is not None

        def train_step(dist: Element) -> StepResult:
            if fit:
                taken.model.reset_metrics()
            return StepResult(step_loss(taken.strategy, step(dist.program, *others, **taken.kwargs), name))

        replicas = taken.strategy.num_replicas_in_sync

        def distribute(batch: Batch) -> Element:
            if not taken.from_dataset and batch.rows % replicas:
                raise NotFed(f"the port feeds its step rows it distributes its own way (not an element of "
                             f"experimental_distribute_dataset): how it cuts {batch.rows} rows over {replicas} "
                             f"replicas is its own; an adapter names its distribute (ModernBuild.distribute)")
            program = tf.nest.pack_sequence_as(spec, [fill(p, batch) for p in parts])
            dist = distributed(taken, program)
            flat = tf.nest.flatten(dist)
            order = [next(i for i, p in enumerate(parts) if p.role == role) for role in ("x", "y", "onehot", "weights")
                     if any(p.role == role for p in parts)]
            return Element([flat[i] for i in order], dist)

        dataset = taken.dataset
        return ModernBuild(model=taken.model, optimizer=taken.optimizer, train_step=train_step,
                           distribute=distribute, strategy=taken.strategy,
                           dataset=None if dataset is None else lambda: dataset,
                           shadows=None if taken.averages is None else functools.partial(shadows, taken.averages))

    @staticmethod
    def element_argument(taken: Taken, name: str) -> tuple[Any, tuple]:
        """(the step's element argument, its other arguments): the first argument must be the element,
        the others not tensors."""
        if not taken.args or taken.kwargs and any(tf.is_tensor(v) for v in tf.nest.flatten(taken.kwargs)):
            raise PortCaptureError(f"{name} takes no positional element argument: the harness cannot drive it")
        element, others = taken.args[0], taken.args[1:]
        if hasattr(element, "get_next") or isinstance(element, tf.data.Iterator):
            raise PortCaptureError(f"{name} takes an iterator, not an element: the harness cannot hand it rows; "
                                   f"write an adapter (docs/judging-your-own-port.md)")
        if any(tf.is_tensor(v) or hasattr(v, "values") for v in tf.nest.flatten(others)):
            raise PortCaptureError(f"{name} takes tensors besides its element: the harness cannot drive it")
        return element, others


def shadows(ema: Any, names: Mapping[str, Any]) -> dict[str, Any]:
    """TF1 name -> the shadow `ema` keeps of that model variable (of the Keras variable or the tf.Variable
    under it), for the variables it averages."""
    out = {}
    for name, variable in names.items():
        for candidate in (variable, getattr(variable, "value", None)):
            try:
                found = ema.average(candidate)
            except (AttributeError, TypeError):  # a Keras variable: its tf.Variable is `value`
                continue
            if found is not None:
                out[name] = found
                break
    return out


def distributed(taken: Taken, program: Any) -> Any:
    """The port's element of the global batch `program`, distributed as the port distributes its data."""
    strategy = taken.strategy
    if taken.dataset is not None:
        dataset = tf.data.Dataset.from_tensors(program)
        return next(iter(strategy.experimental_distribute_dataset(dataset, taken.options)))
    n = strategy.num_replicas_in_sync
    rows = len(tf.nest.flatten(program)[0])
    share = -(-rows // n)  # experimental_distribute_dataset's cut: ceil(rows / N) in order

    def replica(context: Any) -> Any:
        k = context.replica_id_in_sync_group
        return tf.nest.map_structure(lambda a: a[k * share:(k + 1) * share], program)
    return strategy.experimental_distribute_values_from_function(replica)


def step_loss(strategy: Any, out: Any, name: str) -> float:
    """The loss in a step's return value: a scalar, the first scalar of a sequence, a mapping's 'loss';
    per-replica values summed."""
    if isinstance(out, dict):
        if "loss" not in out:
            raise PortCaptureError(f"{name} returns a mapping without 'loss': {sorted(out)}")
        out = out["loss"]
    elif isinstance(out, (list, tuple)) and out:
        out = out[0]
    values = [np.asarray(v) for v in (strategy.experimental_local_results(out) if hasattr(out, "values") else [out])]
    if any(v.size != 1 for v in values):
        raise PortCaptureError(f"{name} returns no scalar loss first (shapes {[v.shape for v in values]})")
    return float(sum(float(v) for v in values))


__all__ = ["CapturedPort", "PortCaptureError", "capture_port", "port_environment"]
