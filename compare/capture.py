"""Judge a TF1 program as it runs: run it to its first training step and take its graph there.

A TF1 program whose graph is built inside the function that trains it (a monolithic `train()` or
`main()`: graph, session and loop in one) has no function an adapter could call to build its graph.
The harness runs it instead, unmodified, under `legacy.run_tf1` (TF1 behaviour, tf.contrib's homes,
towers on virtual CPU devices, the files of its folder upgraded in memory), and stops it at its first
training `Session.run`: the first run, on the program's main thread, whose fetches lead to an
optimizer's update ops (through a plain Session, MonitoredTrainingSession, MonitoredSession or
Supervisor alike: all of them run through Session.run).  It takes there

    graph      the program's graph, as built
    config     the ConfigProto of the session the program opened (with its virtual CPU devices)
    train_op   the fetch that leads to the updates

and finds in the graph (`find`): each variable's update op and the gradient it receives, the learning
rate the updates read, the global step, the towers' losses (where each tower's gradient ops start),
each tower's logits (the first input of its softmax cross-entropy), and each tower's input rows (the
queue dequeue, iterator or placeholder they come from, split across the towers by `tf.split` or not).
`CapturedLegacy` is the LegacySide that does all of it; an adapter gives it the program, how to
point the program at the harness's files, and names only what cannot be found.

The program's flags (`tf.app.flags` / absl, or argparse) are read the same way: the program runs
until it has parsed its command line (`parse_flags`).

A finalized graph is never modified.  `MonitoredSession`, `MonitoredTrainingSession`, `Supervisor`
and `slim.learning.train` finalize the graph before they train (a guard against a training loop
that grows its graph); while the program runs, the harness takes each `Graph.finalize()` as a
request, recorded (`Captured.finalized`) and not applied: the graph the harness takes stays open, so
that it and its checks can add their own ops beside the program's (taps, setters, savers, the
schedule read at any step), none of the program's ops changed.  No private TensorFlow call undoes a
finalize.

TensorFlow's global behaviour: the program runs with TF1 behaviour, and TF2 behaviour is turned back
on as soon as the graph is taken (`legacy.run_tf1.tf1_environment` undoes what it set), so the modern
side runs as it would alone.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import sys
import tempfile
import threading
import traceback
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union
from unittest import mock

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import values as ds_values

from compare import estimator_capture, limits, tf1_graph
from compare.interface import Batch, DataFiles, LegacyGraph, LegacyPipeline, NotFed, TowerFeed
from compare.legacy_run import HarnessError
from compare.optimizers import TF1_OPS

if sys.version_info >= (3, 11):
    from contextlib import chdir
else:  # Python 3.10, which TensorFlow 2.21 still supports, has no contextlib.chdir
    @contextlib.contextmanager
    def chdir(folder: str) -> Iterator[None]:
        before = os.getcwd()
        os.chdir(folder)
        try:
            yield
        finally:
            os.chdir(before)

tf1 = tf.compat.v1
CAPTURE_SECONDS = limits.SECONDS  # each phase's seconds unless the run sets its own (compare.limits)


class CaptureError(HarnessError):
    """The program could not be captured (the message says what it did instead)."""


class CaptureOutOfTime(CaptureError, limits.OutOfTime):
    """The program ran its seconds without reaching what the harness came for (one line)."""


class Stop(BaseException):
    """Raised inside the program where the harness has what it came for; ends the program's run."""


@dataclasses.dataclass
class Captured:
    """What the program had built when it ran its first training step."""
    graph: Any
    config: Any
    train_op: Any
    fetches: Any
    device_line: Optional[str]
    finalized: bool = False  # the program asked to finalize the graph (recorded, not applied)
    feed: Any = None  # the feed_dict of that run, as the program gave it
    # a tf.estimator program: its model_fn in EVAL mode, built as the training stopped (None: no Estimator)
    evaluated: Optional[estimator_capture.EvalGraph] = None


# ---------------------------------------------------------------------------------------------
# Running the program to a point

def fetched_ops(graph: Any, fetches: Any) -> list[Any]:
    """The ops a Session.run's fetches name (nested lists, tuples, dicts; tensors, ops, names)."""
    out: list[Any] = []
    stack = [fetches]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, str):
            with contextlib.suppress(KeyError, ValueError, TypeError):
                stack.append(graph.as_graph_element(item))
        elif isinstance(item, tf.Operation):
            out.append(item)
        elif isinstance(item, ds_values.DistributedValues):  # a MirroredVariable: the ops of its components
            stack.extend(item.values)
        elif hasattr(item, "op"):
            out.append(item.op)
    return out


def updating(op: Any) -> bool:
    """Whether `op` is an optimizer's update kernel."""
    kind = op.type[len("Resource"):] if op.type.startswith("Resource") else op.type
    return kind in TF1_OPS


def training_fetch(graph: Any, fetches: Any) -> Optional[Any]:
    """The fetched op that leads to an optimizer's update ops, or None (not a training run)."""
    for op in fetched_ops(graph, fetches):
        if any(updating(a) for a in tf1_graph.ancestors([op])):
            return op
    return None


def run_to_stop(env: Any, argv: Sequence[str], seconds: Optional[float], what: str) -> tuple[Optional[int], bool]:
    """Run a program in its environment (`env.run_program`) until it ends, is stopped (`Stop`) or its
    `seconds` are up (the phase `what`, compare.limits; None: the run's limit): (its exit status, None
    where it did not end; whether its time ran out)."""
    try:
        with limits.phase(what, seconds):
            return env.run_program(list(argv)), False
    except Stop:
        return None, False
    except limits.OutOfTime:
        return None, True


def capture(program: str, argv: Sequence[str], seed: int = 0, cwd: Optional[str] = None,
            log: Callable[[str], None] = print, seconds: Optional[float] = None) -> Captured:
    """Run `program` with `argv` under legacy.run_tf1 until its first training Session.run; its graph
    (every graph it makes gets the graph-level seed `seed`); where that run is inside `Estimator.train`,
    the Estimator's model_fn in EVAL mode too, in a graph of its own (compare.estimator_capture).
    CaptureError if it ends, fails or runs `seconds` first (default: the run's limit, compare.limits)."""
    from legacy.run_tf1 import tf1_environment
    from tensorflow.python.client import session as tf_session
    from tensorflow.python.framework import ops

    taken: list[Captured] = []
    main = threading.main_thread()
    run, graph_init = tf_session.BaseSession.__dict__["run"], ops.Graph.__dict__["__init__"]
    env_line: list[Optional[str]] = [None]
    watch = estimator_capture.Watch()

    def session_run(session: Any, fetches: Any, *args: Any, **kwargs: Any) -> Any:
        if not taken and threading.current_thread() is main:
            op = training_fetch(session.graph, fetches)
            if op is not None:
                feed = args[0] if args else kwargs.get("feed_dict")
                taken.append(Captured(session.graph, getattr(session, "_config", None), op, fetches, env_line[0],
                                      feed=feed, evaluated=watch.eval_graph(seed)))
                raise Stop()
        return run(session, fetches, *args, **kwargs)

    def seeded_graph(graph: Any, *args: Any, **kwargs: Any) -> None:
        graph_init(graph, *args, **kwargs)
        graph.seed = seed

    asked: set[int] = set()

    def held_finalize(graph: Any) -> None:
        asked.add(id(graph))

    with working_directory(cwd), quiet_tensorflow(), tf1_environment(program, log=log) as env, resource_variables():
        with mock.patch.object(tf_session.BaseSession, "run", session_run), \
                mock.patch.object(ops.Graph, "__init__", seeded_graph), \
                mock.patch.object(ops.Graph, "finalize", held_finalize), watch.patched():
            status, timed_out = run_to_stop(env, argv, seconds,
                                            f"running {program} to its first training Session.run")
        env_line[0] = env.device_line
    if not taken:
        limit = limits.seconds() if seconds is None else seconds
        why = stopped_short(env, status, timed_out, f"it ran {limit:g} s without a training Session.run")
        error = CaptureOutOfTime if timed_out else CaptureError
        raise error(f"no training Session.run to capture: {why}; run as {program} {' '.join(argv)}")
    return dataclasses.replace(taken[0], device_line=env_line[0], finalized=id(taken[0].graph) in asked)


def stopped_short(env: Any, status: Optional[int], timed_out: bool, out_of_time: str) -> str:
    """Why a program's run ended before the harness had what it came for: `out_of_time`, the failure
    (its step, the program's own last frame, the error's first line), or its exit status."""
    if timed_out:
        return out_of_time
    if env.failure is not None:
        error = env.failure.error
        where = last_frame(error, {str(env.program), *map(str, env.upgrades)})
        message = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        return f"it raised while {env.failure.step}, at {where} ({type(error).__name__}: {message})"
    return f"it ended with exit status {status}"


@contextlib.contextmanager
def resource_variables() -> Iterator[None]:
    """TF1 programs' variables made as resource variables for the duration (`tf.compat.v1.
    enable_resource_variables`), as the harness builds an adapter's legacy graph.  TF1's ref variables
    let every reader alias the variable's buffer: on the virtual CPU devices of one process a tower's
    gradient can read a weight the same step's update has already written (a program that takes its
    gradients with `tf.gradients`, ungated, as the CIFAR-10 Estimator tutorial does), a race its GPUs,
    which copy each read, did not have.  The legacy graph on TF1's own runtime is its own check
    (compare/checks/tf1.py)."""
    before = tf1.resource_variables_enabled()
    tf1.enable_resource_variables()
    try:
        yield
    finally:
        if not before:
            tf1.disable_resource_variables()


def last_frame(error: BaseException, files: set[str]) -> str:
    """'file:line in function: code' of the innermost traceback frame in `files` (the program's own),
    else of the innermost frame."""
    frames = traceback.extract_tb(error.__traceback__)
    own = [f for f in frames if f.filename in files] or frames
    if not own:
        return "its top level"
    f = own[-1]
    return f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}: {(f.line or '').strip()}"


@contextlib.contextmanager
def quiet_tensorflow() -> Iterator[None]:
    """TensorFlow's Python log at ERROR for the duration: a TF1 program's every call of a deprecated
    name logs a notice, pages of them per run."""
    logger = tf.get_logger()
    level = logger.level
    logger.setLevel("ERROR")
    try:
        yield
    finally:
        logger.setLevel(level)


def working_directory(folder: Optional[str]) -> contextlib.AbstractContextManager[Any]:
    """The current directory set to `folder` (made where missing; None: unchanged) for the duration."""
    if not folder:
        return contextlib.nullcontext()
    os.makedirs(folder, exist_ok=True)
    return chdir(folder)


def parse_flags(program: str, argv: Sequence[str], cwd: Optional[str] = None,
                environment: Optional[Callable[[str], Any]] = None) -> argparse.Namespace:
    """The program's own flags as it parses `argv`: it runs until it has parsed its command line
    (absl / `tf.app.flags`, or argparse) and stops there.  The flags its own files define, by name;
    the Namespace remembers `argv` (as `_argv`), which `capture` runs the program with.
    environment: program -> the context it runs in (default: `legacy.run_tf1.tf1_environment`, quiet;
    a port's: `compare.port_capture.port_environment`)."""
    from absl import flags as absl_flags

    from legacy.run_tf1 import tf1_environment
    environment = environment or (lambda path: tf1_environment(path, log=lambda _: None))
    parsed: list[argparse.Namespace] = []
    absl_call, known = absl_flags.FlagValues.__dict__["__call__"], argparse.ArgumentParser.__dict__["parse_known_args"]

    def absl_parse(values: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
        left = absl_call(values, args, *rest, **kwargs)
        if values is absl_flags.FLAGS and not parsed:
            owners = {str(env.program), *env.loaded}
            parsed.append(argparse.Namespace(**{f.name: f.value for module, defined in
                                                values.flags_by_module_dict().items() if module in owners
                                                for f in defined}))
            raise Stop()
        return left

    def argparse_parse(parser: Any, *args: Any, **kwargs: Any) -> Any:
        namespace, left = known(parser, *args, **kwargs)
        if not parsed:
            parsed.append(namespace)
            raise Stop()
        return namespace, left

    with working_directory(cwd), quiet_tensorflow(), environment(program) as env:
        with mock.patch.object(absl_flags.FlagValues, "__call__", absl_parse), \
                mock.patch.object(argparse.ArgumentParser, "parse_known_args", argparse_parse):
            try:
                with limits.phase(f"reading the flags of {program}"):
                    env.run_program(list(argv))
            except Stop:
                pass
    flags = parsed[0] if parsed else argparse.Namespace()
    flags._argv = tuple(argv)
    return flags


# ---------------------------------------------------------------------------------------------
# An Estimator program's own evaluation of a checkpoint

def estimator_evaluation(program: str, argv: Sequence[str], checkpoint: str, cwd: Optional[str] = None,
                         seconds: Optional[float] = None) -> Mapping[str, float]:
    """The metrics the program's first `Estimator.evaluate` returns for `checkpoint`, run as
    `program argv` with every `Estimator.train` skipped (it returns at once, the graph never built) and
    that evaluate given `checkpoint_path=checkpoint`: the program's own input_fn, model_fn in EVAL mode
    and metrics.  CaptureError if the program evaluates nothing in `seconds` (default: the run's limit)."""
    from legacy.run_tf1 import tf1_environment

    cls = estimator_capture.estimator_class()
    evaluate = cls.__dict__["evaluate"]
    got: list[Mapping[str, Any]] = []

    def skipped_train(estimator: Any, *args: Any, **kwargs: Any) -> Any:
        return estimator

    def given_checkpoint(estimator: Any, input_fn: Any, steps: Any = None, hooks: Any = None,
                         checkpoint_path: Any = None, name: Any = None) -> Any:
        got.append(evaluate(estimator, input_fn, steps=steps, hooks=hooks, checkpoint_path=checkpoint, name=name))
        raise Stop()

    with working_directory(cwd), quiet_tensorflow(), tf1_environment(program, log=lambda _: None) as env, \
            mock.patch.object(cls, "train", skipped_train), mock.patch.object(cls, "evaluate", given_checkpoint):
        status, timed_out = run_to_stop(env, argv, seconds, f"{program}'s own Estimator.evaluate")
    if not got:
        limit = limits.seconds() if seconds is None else seconds
        why = stopped_short(env, status, timed_out, f"it ran {limit:g} s without an Estimator.evaluate")
        error = CaptureOutOfTime if timed_out else CaptureError
        raise error(f"the program's evaluation: no Estimator.evaluate with training skipped: {why}; run as "
                    f"{os.path.basename(program)} {' '.join(argv)}")
    return {k: float(np.asarray(v)) for k, v in got[0].items() if np.size(v) == 1}


# ---------------------------------------------------------------------------------------------
# What is found in a captured training graph

@dataclasses.dataclass
class TowerInput:
    """Where one tower's rows come from: `x` and `y`, the source's outputs (a queue dequeue, an
    iterator's get_next(), placeholders) the tower's inputs and labels derive from, and which part
    of them the tower takes: all of them, part `part` of `parts` equal slices (tf.split), or the
    rows between `bounds`, the begin and end of a slice of the rows (`x[begin:end]`, bounds that a
    fed size such as the original's `current_batch_size` sets)."""
    x: Any
    y: Any
    part: int = 0
    parts: int = 1
    bounds: Optional[tuple[Any, Any]] = None
    image_bounds: Optional[tuple[Any, Any]] = None  # the same slice's bounds on the images' path


@dataclasses.dataclass
class Found:
    """What `find` finds in a training graph."""
    train_op: Any
    updates: dict[str, tf1_graph.OptimizerUpdate]
    grads_and_vars: list[tuple[Any, Any]]
    learning_rate: Any
    global_step: Any
    tower_losses: list[Any]
    tower_logits: list[Any]
    inputs: list[TowerInput]
    tower_weights: Optional[list[float]] = None  # each tower's weight in what is applied (tower_weights)
    uncut: Optional[str] = None  # where a tower's rows come through an op that takes rows of its own (Uncut)


GRAD_SCOPE = re.compile(r"(?:^|/)gradients(?:_\d+)?/(.+?)_grad(?:_\d+)?/")


# Ops whose gradient passes the incoming gradient on unchanged, building no op of its own (TF's gradients
# of an Add of two tensors of one fully known shape, of an AddN, of an Identity).
PASS_ON = ("Add", "AddV2", "AddN", "Identity")


def gradient_starts(graph: Any, updates: Mapping[str, tf1_graph.OptimizerUpdate]) -> dict[Any, Any]:
    """{loss: the op its gradient starts from}, for the losses the applied gradients come from: each
    `tf.gradients` call starts from the ones it fills in the loss's shape (its `grad_ys`), which the
    gradient of the loss's op reads first (in the name scope `gradients/<the loss op>_grad`, TF1's
    naming); in the order of the towers' names.  A loss that is a sum of scalars (`cross_entropy +
    l2`) has a gradient that builds no op: its grad_ys go straight to the gradients of the terms, and
    the loss is the sum of them (`loss_of`)."""
    feeding = tf1_graph.ancestors([u.grad for u in updates.values() if u.grad is not None])
    starts: dict[Any, Any] = {}
    for op in graph.get_operations():
        if op.type != "Fill" or op not in feeding or "grad_ys" not in op.name.rsplit("/", 1)[-1]:
            continue
        if op.inputs[0].op.type == "Shape":
            starts.setdefault(op.inputs[0].op.inputs[0], op)
            continue
        terms = []
        for consumer in op.outputs[0].consumers():
            found = GRAD_SCOPE.search(consumer.name)
            if found:
                with contextlib.suppress(KeyError, ValueError):
                    terms.append(graph.get_operation_by_name(found.group(1)))
        loss = loss_of(list(dict.fromkeys(terms)))
        if loss is not None:
            starts.setdefault(loss, op)
    return {loss: starts[loss] for loss in sorted(starts, key=lambda t: tf1_graph.natural(t.name))}


def loss_of(terms: Sequence[Any]) -> Optional[Any]:
    """The loss whose grad_ys the gradients of `terms` (forward ops) read first: the one op's output, or,
    where several read them, the sum of their outputs (its gradient passes them on): the smallest tensor
    that pass-on sums build of them alone and that depends on every term."""
    if len(terms) <= 1:
        return terms[0].outputs[0] if terms else None
    covered = {t.outputs[0] for t in terms}
    grown = True
    while grown:
        grown = False
        for tensor in list(covered):
            for consumer in tensor.consumers():
                if consumer.type in PASS_ON and consumer.outputs[0] not in covered and set(consumer.inputs) <= covered:
                    covered.add(consumer.outputs[0])
                    grown = True
    ahead = {t: tf1_graph.ancestors([t]) | {t.op} for t in covered}
    whole = [t for t in covered if set(terms) <= ahead[t]]
    return min(whole, key=lambda t: len(ahead[t])) if whole else terms[0].outputs[0]


def tower_losses(graph: Any, updates: Mapping[str, tf1_graph.OptimizerUpdate]) -> list[Any]:
    """The losses the applied gradients come from (`gradient_starts`), in the order of the towers' names."""
    return list(gradient_starts(graph, updates))


SUMS = ("AddN", "Add", "AddV2")
STACKS = ("ConcatV2", "Pack")
SCALES = {"Mul": 1, "RealDiv": -1, "Div": -1, "Truediv": -1}


def tower_weights(applied: Sequence[Any], starts: Sequence[Any]) -> Optional[list[float]]:
    """Each tower's weight in the gradients the optimizer applies, read from how the graph combines
    the towers' gradients (None where it is not one of the ways below, or differs between variables):
    the op that first joins one gradient of every tower (its ancestors `starts`, one per tower), an
    AddN / Add (a sum: weight 1 each; model_deploy) or a concat / stack reduced by Mean (1/N: the
    classic average_gradients) or Sum (1), times every constant scalar the joined gradient is then
    multiplied or divided by on its way to the update (a clip-by-norm scale is no constant).  One
    tower: nothing joins, its weight is 1 (model_deploy with one clone, or any program at --num_gpus 1)."""
    towers = len(starts)
    if towers == 1:
        return [1.0]
    regions = [tf1_graph.descendants([s]) for s in starts]
    found: set[float] = set()
    for g in applied:
        if g is None:
            continue
        upstream = tf1_graph.ancestors([g]) | {g.op}
        weight = None
        for op in upstream:
            if not all(op in r for r in regions):
                continue
            inputs = [i.op for i in op.inputs if any(i.op in r for r in regions)]
            if len(inputs) != towers or any(sum(i in r for r in regions) != 1 for i in inputs):
                continue
            if op.type in SUMS:
                weight, joined = 1.0, op
            elif op.type in STACKS:
                reduce = [c for c in op.outputs[0].consumers() if c in upstream and c.type in ("Mean", "Sum")]
                if not reduce:
                    return None
                weight, joined = (1.0 / towers if reduce[0].type == "Mean" else 1.0), reduce[0]
            else:
                return None
            break
        if weight is None:
            return None
        path = tf1_graph.descendants([joined]) & upstream
        for op in path - {joined}:
            if op.type not in SCALES:
                continue
            # A scaling of the gradient itself (the on-path input has its shape), not of a scalar on the
            # way to it (a norm, a clip scale), by a constant the path does not feed.
            along = [i for i in op.inputs if i.op in path]
            other = [i for i in op.inputs if i.op not in path]
            if len(along) != 1 or len(other) != 1 or along[0].shape != g.shape or not g.shape.is_fully_defined():
                continue
            if op.type != "Mul" and op.inputs[1] is not other[0]:
                continue
            value = tf.get_static_value(other[0])
            if value is not None and np.size(value) == 1:
                weight *= float(np.asarray(value)) ** SCALES[op.type]
        found.add(round(weight, 12))
    return [found.pop()] * towers if len(found) == 1 else None


def tower_input(loss: Any) -> Optional[TowerInput]:
    """A tower's source of rows: the labels its cross-entropy reads, and the images beside them."""
    xent = next((op for op in tf1_graph.ancestors([loss])
                 if op.type in tf1_graph.XENT and "gradients" not in op.name), None)
    if xent is None:
        return None
    y, part, parts, bounds = tf1_graph.source_of(xent.inputs[1])
    if y is None:
        return None
    ahead = tf1_graph.ancestors([loss])
    if y.op.type == "Placeholder":
        images = [op.outputs[0] for op in ahead if op.type == "Placeholder"
                  and op is not y.op and op.outputs[0].shape.rank is not None and op.outputs[0].shape.rank >= 2]
    else:
        images = [t for t in y.op.outputs if t is not y and t.shape.rank is not None and t.shape.rank >= 2]
    if not images:
        return None
    cut = next((op for op in ahead if tf1_graph.rows_slice(op) and op.inputs[0] is images[0]), None) if bounds else None
    return TowerInput(images[0], y, part, parts, bounds, (cut.inputs[1], cut.inputs[2]) if cut is not None else None)


def find(graph: Any, train_op: Any) -> Found:
    """What the harness needs of a training graph, found from the op the training run fetched."""
    ahead = tf1_graph.ancestors([train_op])
    collected = graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
    order = {tf1_graph.primary(v).op.name: i for i, v in enumerate(collected)}
    applied = [op for op in ahead if updating(op)]
    by_name = tf1_graph.variables_by_name(graph)
    pairs = []
    for op in applied:
        inputs = dict(zip([arg.name for arg in op.op_def.input_arg], op.inputs))
        variable = tf1_graph.variable_of(inputs["var"], by_name)
        # A MirroredStrategy updates every replica's copy with the same reduced gradient: the first's is the one.
        if variable is not None and tf1_graph.of_first_replica(inputs["var"], variable):
            pairs.append((inputs.get("grad", inputs.get("delta")), variable))
    pairs.sort(key=lambda gv: order.get(gv[1].op.name, len(order)))
    if not pairs:
        raise CaptureError(f"the training run fetched {train_op.name}, which leads to no update of a variable")
    updates = tf1_graph.optimizer_updates(graph, pairs)
    rates = [u.rate for u in updates.values() if u.rate is not None]
    starts = gradient_starts(graph, updates)
    losses = list(starts)
    global_step = find_global_step(graph, ahead, by_name)
    rows: list[TowerInput] = []
    uncut: Optional[str] = None
    for i, loss in enumerate(losses):
        try:
            source = tower_input(loss)
        except tf1_graph.Uncut as op:
            uncut = uncut or f"tower {i}'s labels reach its cross-entropy through {op}"
            continue
        if source is not None:
            rows.append(source)
    return Found(train_op, updates, pairs, rates[0] if rates else None, global_step, losses,
                 [tf1_graph.logits_of(loss) for loss in losses], rows,
                 tower_weights([g for g, _ in pairs], list(starts.values())), uncut)


def find_global_step(graph: Any, ahead: set[Any], by_name: dict[str, Any]) -> Any:
    """The step counter: the GLOBAL_STEP collection's, else the variable the training run increments
    (apply_gradients(global_step=...) adds one to it, of whatever dtype it was made), else the
    variable named global_step."""
    collected = graph.get_collection(tf1.GraphKeys.GLOBAL_STEP)
    if collected:
        return tf1_graph.primary(collected[0])
    for op in ahead:
        if op.type in ("AssignAdd", "AssignAddVariableOp") and op.inputs:
            variable = tf1_graph.variable_of(op.inputs[0], by_name)
            if variable is not None and variable.shape.rank == 0 and not variable.trainable:
                return variable
    return by_name.get("global_step")


def iterator_initializers(graph: Any) -> list[Any]:
    """The ops that start the graph's tf.data iterators: each `MakeIterator`; where a MirroredStrategy's
    multi-device iterator feeds the per-device ones, one op that runs its `MultiDeviceIteratorInit` and
    every `MakeIterator` together (run apart, each would start the multi-device iterator again, and the
    per-device iterators made before would read from a stale incarnation of it)."""
    ops = graph.get_operations()
    makes = [op for op in ops if op.type == "MakeIterator"]
    multi = [op for op in ops if op.type == "MultiDeviceIteratorInit"]
    if not multi:
        return makes
    with graph.as_default():
        return [tf.group(*multi, *makes, name="parity_iterators_init")]


# ---------------------------------------------------------------------------------------------
# The LegacySide of a captured program

class Shadows:
    """The moving-average shadows of a graph's variables, by their update `s -= (s - v)(1 - d)`
    (tf.train.ExponentialMovingAverage's): `average(variable)` as the EMA object answers it."""

    def __init__(self, graph: Any):
        by_name = tf1_graph.variables_by_name(graph)
        self.of: dict[str, Any] = {}
        for op in graph.get_operations():
            parts = tf1_graph.assign_sub_parts(op, by_name)
            if parts is not None:
                shadow, value, _ = parts
                source = tf1_graph.variable_of(value, by_name)
                if source is not None and source is not shadow:
                    self.of.setdefault(source.op.name, shadow)

    def average(self, variable: Any) -> Any:
        return self.of.get(variable.op.name)


# ---------------------------------------------------------------------------------------------
# What the program's first step fed besides its rows

class Evaluator:
    """A session of the harness's own on the captured graph, for the few small tensors the feed
    needs the values of (the bounds of the towers' slices, the dropouts' rates); opened when first
    asked."""

    def __init__(self, graph: Any, config: Any):
        self.graph, self.config = graph, config
        self.sess: Any = None

    def __call__(self, fetches: Any, feed: Mapping[Any, Any]) -> Any:
        if self.sess is None:
            self.sess = tf1.Session(graph=self.graph, config=self.config)
        return self.sess.run(fetches, dict(feed))


@dataclasses.dataclass
class FirstFeed:
    """What the first training step fed besides the towers' rows, each tensor with its value in
    training (the step's) and in inference mode; `sizes`, those the bounds of the towers' slices
    depend on (the original's `current_batch_size`), fed rows // towers; `notes`, how each
    inference value was found."""
    training: dict[Any, Any]
    inference: dict[Any, Any]
    sizes: list[Any]
    notes: list[str]


def fed_tensors(graph: Any, feed: Any) -> dict[Any, Any]:
    """A Session.run feed with its keys as tensors (a key may be a tensor, its name or its op's)."""
    out = {}
    for key, value in (feed or {}).items() if isinstance(feed, Mapping) else ():
        with contextlib.suppress(KeyError, ValueError, TypeError):
            element = graph.as_graph_element(key) if isinstance(key, str) else key
            out[element.outputs[0] if isinstance(element, tf.Operation) else element] = value
    return out


def cond_predicate(tensor: Any) -> int:
    """How many Switch ops (a v1 tf.cond's, one per tensor it takes in) take `tensor`, or an identity
    of it, as their predicate."""
    preds = [tensor, *(op.outputs[0] for op in tensor.consumers() if op.type == "Identity")]
    return len({op for p in preds for op in p.consumers() if op.type in ("Switch", "RefSwitch")
                and op.inputs[1] is p})


def first_feed(graph: Any, feed: Mapping[Any, Any], inputs: Sequence[TowerInput], losses: Sequence[Any],
               evaluate: Callable[[Any, Mapping[Any, Any]], Any]) -> FirstFeed:
    """The first step's feed besides the rows (`FirstFeed`).  In inference mode a bool that is the
    predicate of tf.conds and was fed True (an `is_training`: batch norm's branch) is fed False; a
    float the dropouts' rates depend on (a `keep_prob`) is fed the value, 1 or 0, at which every
    one of those rates is 0; every other tensor keeps its training value.  A size must have been fed
    rows // towers (CaptureError otherwise: the harness knows no other rule)."""
    rows = {t.x for t in inputs} | {t.y for t in inputs}
    bounding = tf1_graph.ancestors([b for t in inputs if t.bounds for b in t.bounds])
    training = {t: v for t, v in feed.items() if t not in rows}
    sizes = [t for t in training if t.op in bounding]
    for t in sizes:
        fed, source = np.asarray(training[t]), next(i.x for i in inputs if i.bounds)
        first = len(feed[source]) if source in feed else None
        if first is None or fed.shape != () or fed.dtype.kind not in "iu" or int(fed) != first // len(inputs):
            raise CaptureError(f"the towers' rows are cut by {t.op.name}, fed {fed.tolist()} at the first step "
                               f"({first} rows on {len(inputs)} towers): the harness feeds a size rows // towers "
                               f"and knows no other rule: name the feed (names={{'feed': ...}})")
    inference, notes = dict(training), []
    rates = [d.rate for d in tf1_graph.dropouts(graph, losses)]
    for t, v in training.items():
        value = np.asarray(v)
        if t in sizes or value.shape != ():
            continue
        conds = cond_predicate(t) if value.dtype == bool else 0
        if conds and bool(value):
            inference[t] = False
            notes.append(f"{t.op.name} False (True in training; the predicate of {conds} tf.cond switches)")
        elif value.dtype.kind == "f":
            its = [r for r in rates if t.op in tf1_graph.ancestors([r])]
            off = next((c for c in (1.0, 0.0) if its and not np.any(evaluate(its, {**training, t: c}))), None)
            if off is not None and off != float(value):
                inference[t] = off
                notes.append(f"{t.op.name} {off:g} ({float(value):g} in training; {len(its)} dropouts' rates 0)")
    return FirstFeed(training, inference, sizes, notes)


def slice_bounds(inputs: Sequence[TowerInput], evaluate: Callable[[Any, Mapping[Any, Any]], Any],
                 feed: Mapping[Any, Any]) -> list[Optional[slice]]:
    """Each tower's slice of its source's rows, evaluated with `feed` (None: no slice).  The images'
    slice must be the labels'."""
    sliced = [t for t in inputs if t.bounds is not None]
    if not sliced:
        return [None] * len(inputs)
    values = iter(evaluate([[*(t.bounds or ()), *(t.image_bounds or ())] for t in sliced], feed))
    out: list[Optional[slice]] = []
    for t in inputs:
        if t.bounds is None:
            out.append(None)
            continue
        begin, end, *image = (int(np.ravel(v)[0]) for v in next(values))
        if image != [begin, end]:
            images = f"[{image[0]}:{image[1]}]" if image else "otherwise"
            raise NotFed(f"a tower slices its labels [{begin}:{end}] and its images {images}: which rows it trains "
                         f"on is not one slice")
        out.append(slice(begin, end))
    return out


def found_feed(inputs: Sequence[TowerInput], weights: Sequence[float], fed: Optional[FirstFeed] = None,
               evaluate: Optional[Callable[[Any, Mapping[Any, Any]], Any]] = None
               ) -> Callable[[Batch, bool], TowerFeed]:
    """The feed of a captured program: the batch cut in equal parts over the distinct sources (in
    tower order), each source's outputs fed its part, each tower taking all of its source's rows,
    its tf.split part of them, or its slice of them; `weights`, each tower's weight in what is
    applied (`tower_weights`); `fed`, what the first step fed besides the rows (in training or
    inference mode), its sizes fed rows // towers.  A source with a static batch size takes exactly
    that many rows, and rows of the shape its graph fixes (NotFed otherwise: a batch the program
    never receives)."""
    sources = list(dict.fromkeys(t.x for t in inputs))
    cuts: dict[tuple[int, bool], list[Optional[slice]]] = {}

    def feed(batch: Batch, training: bool) -> TowerFeed:
        if batch.rows % len(sources):
            raise NotFed(f"{len(sources)} input sources take equal parts of a batch: {batch.rows} rows cannot be "
                         f"cut so")
        size = batch.rows // len(sources)
        feed_dict: dict[Any, Any] = dict((fed.training if training else fed.inference) if fed else {})
        if fed and fed.sizes:
            if batch.rows % len(inputs):
                raise NotFed(f"the towers' rows are cut by {', '.join(t.op.name for t in fed.sizes)}, which the "
                             f"program fed rows // towers at its first step; what it feeds for {batch.rows} rows, "
                             f"which its {len(inputs)} towers cannot share evenly, is its own: name the feed in an "
                             f"adapter (names={{'feed': ...}})")
            feed_dict.update({t: np.asarray(batch.rows // len(inputs), fed.training[t].dtype
                                            if hasattr(fed.training[t], "dtype") else np.int32)
                              for t in fed.sizes})
        parts: dict[Any, np.ndarray] = {}
        for k, x in enumerate(sources):
            static = x.shape[0] if x.shape.rank else None
            if static is not None and int(static) != size:
                raise NotFed(f"{x.op.name} gives {int(static)} rows a step (its static batch size): a part of "
                             f"{size} rows never reaches the towers")
            parts[x] = np.arange(k * size, (k + 1) * size)
            y = next(t.y for t in inputs if t.x is x)
            feed_dict[x], feed_dict[y] = batch.x[parts[x]], batch.y[parts[x]]
            for tensor in (x, y):
                if not tensor.shape.is_compatible_with(feed_dict[tensor].shape):
                    raise NotFed(f"{tensor.name} takes rows of shape {tensor.shape.as_list()[1:]}: the harness's "
                                 f"rows have {list(feed_dict[tensor].shape[1:])} (this program builds its input "
                                 f"otherwise)")
        key = (batch.rows, training)
        if key not in cuts:
            cuts[key] = slice_bounds(inputs, evaluate, feed_dict) if evaluate else [None] * len(inputs)
        rows = []
        for t, cut in zip(inputs, cuts[key]):
            take = parts[t.x]
            if t.parts > 1:
                if len(take) % t.parts:
                    raise NotFed(f"tf.split cuts {len(take)} rows into {t.parts} equal parts: it cannot")
                share = len(take) // t.parts
                take = take[t.part * share:(t.part + 1) * share]
            rows.append(take[cut] if cut is not None else take)
        return TowerFeed(feed_dict, rows, list(weights))
    return feed


# What an adapter may name: every field of the LegacyGraph, the towers' input rows and their weights.
FOUND_ONLY = ("inputs", "tower_weights")
NAMES = tuple(f.name for f in dataclasses.fields(LegacyGraph)) + FOUND_ONLY


class CapturedLegacy:
    """A LegacySide for a TF1 program judged by running it (see the module docstring).

    program: the program's .py file.  files_argv: (towers, files) -> the arguments that point the
    program at the harness's files and scratch folder (its data and output folders).  tower_flag:
    its flag for the tower count, which the harness sets last.  cwd: the folder to run it in, or files -> it
    (for a program that reads or writes relative paths), or None.  names: what `find` cannot find or
    finds otherwise than the program means it, by field of LegacyGraph (any of NAMES: `loss`,
    `tower_losses`, `feed`, ...), `inputs` (the towers' TowerInputs) or `tower_weights`, each a callable of the captured
    graph and Found; every one named is used, and a name of no field is refused when the side is made.
    evaluate: an optional (flags, checkpoint, files) -> metrics.  pipeline_steps: with a queue-runner or iterator
    input found, the pipeline check reads this many steps of it (capability 'pipelines').  seconds: its time to
    reach a training step (default: the run's limit, compare.limits: compare/run.py --capture_seconds).
    """

    def __init__(self, program: str, files_argv: Callable[[int, DataFiles], Sequence[str]], tower_flag: str,
                 cwd: Union[str, Callable[[DataFiles], str], None] = None,
                 names: Optional[Mapping[str, Callable[[Any, Found], Any]]] = None,
                 evaluate: Optional[Callable[[argparse.Namespace, str, DataFiles], Mapping[str, float]]] = None,
                 pipeline_steps: int = 0, log: Callable[[str], None] = lambda _: None,
                 seconds: Optional[float] = None):
        self.program, self.files_argv, self.tower_flag, self.seconds = program, files_argv, tower_flag, seconds
        self.cwd, self.names, self.pipeline_steps, self.log = cwd, dict(names or {}), pipeline_steps, log
        unknown = sorted(set(self.names) - set(NAMES))
        if unknown:
            raise CaptureError(f"names= has no field {', '.join(map(repr, unknown))}: it takes {', '.join(NAMES)}")
        self._config: Any = None
        self.captured: Optional[Captured] = None
        self.inputs: list[TowerInput] = []  # the towers' input rows in the last captured graph
        self.first_feed: Optional[FirstFeed] = None  # what its first step fed besides the rows
        self.evaluates = evaluate is not None  # an evaluation given (else an Estimator program gets its own)
        if evaluate is not None:
            self.evaluate = evaluate

    def parse_args(self, argv: Sequence[str]) -> argparse.Namespace:
        return parse_flags(self.program, argv)

    def estimator_evaluate(self, flags: argparse.Namespace, checkpoint: str, files: DataFiles) -> Mapping[str, float]:
        """An Estimator program's own evaluation of `checkpoint` (`estimator_evaluation`), run with the
        arguments and tower count its build with `flags` had (`flags._towers`, beside its `_argv`)."""
        towers = getattr(flags, "_towers", 1)
        argv = [*getattr(flags, "_argv", ()), *self.files_argv(towers, files), self.tower_flag, str(towers)]
        cwd = self.cwd(files) if callable(self.cwd) else self.cwd
        return estimator_evaluation(self.program, argv, checkpoint, cwd=cwd, seconds=self.seconds)

    def session_config(self, flags: argparse.Namespace, towers: int) -> Any:
        return self._config if self._config is not None else tf1.ConfigProto(device_count={"CPU": max(1, towers)})

    def build(self, flags: argparse.Namespace, towers: int, files: DataFiles) -> LegacyGraph:
        # The tower count the harness asks for, whatever the flags were parsed with (the flags check
        # builds each flag's program with one tower); the last value of a flag wins.
        # A scratch folder of its own for every build: a Supervisor or MonitoredTrainingSession would
        # otherwise restore what an earlier build wrote there (another flag's graph, another start).
        own = dict(files, scratch=tempfile.mkdtemp(prefix="capture_", dir=files["scratch"])) if "scratch" in files \
            else files
        argv = [*getattr(flags, "_argv", ()), *self.files_argv(towers, own), self.tower_flag, str(towers)]
        cwd = self.cwd(files) if callable(self.cwd) else self.cwd
        captured = capture(self.program, argv, cwd=cwd, log=self.log, seconds=self.seconds)
        self.captured, self._config = captured, captured.config
        found = find(captured.graph, captured.train_op)
        named = {field: make(captured.graph, found) for field, make in self.names.items()}
        losses = named.get("tower_losses", found.tower_losses)
        logits = named.get("tower_logits", found.tower_logits)
        inputs = named.get("inputs", found.inputs)
        if any(t is None for t in logits):
            raise CaptureError("a tower's logits are not the first input of a softmax cross-entropy: name them "
                               "(names={'tower_logits': ...})")
        if found.uncut and "inputs" not in named:
            raise CaptureError(f"{found.uncut}, which takes rows of its own choosing: the harness cannot cut a batch "
                               f"into the towers' rows; name each tower's input in an adapter (CapturedLegacy(names="
                               f"{{'inputs': ...}}), a TowerInput each)")
        if len(inputs) != len(losses):
            raise CaptureError(f"found the input rows of {len(inputs)} of {len(losses)} towers: name them "
                               f"(names={{'inputs': ...}})")
        self.inputs = list(inputs)
        weights = named.get("tower_weights", found.tower_weights)
        if weights is None or len(weights) != len(losses):
            raise CaptureError(f"how the graph combines the {len(losses)} towers' gradients is not a sum or a mean "
                               f"of them: name each tower's weight (names={{'tower_weights': ...}})")
        evaluate = Evaluator(captured.graph, captured.config or self.session_config(flags, towers))
        fed = first_feed(captured.graph, fed_tensors(captured.graph, captured.feed), inputs, losses, evaluate)
        self.first_feed = fed
        if fed.notes:
            self.log(f"inference mode: {'; '.join(fed.notes)}")
        with captured.graph.as_default():  # the combined loss the applied gradients are the gradients of
            loss = named["loss"] if "loss" in named else tf.add_n([w * t for w, t in zip(weights, losses)])
        pipeline = None
        sources = list(dict.fromkeys((t.x, t.y) for t in inputs))
        if captured.graph.get_collection(tf1.GraphKeys.QUEUE_RUNNERS) and self.pipeline_steps:
            pipeline = LegacyPipeline(train=sources, steps=self.pipeline_steps, queue_runners=True)
        elif self.pipeline_steps and sources and all(x.op.type == "IteratorGetNext" for x, _ in sources):
            pipeline = LegacyPipeline(train=sources, initializer=iterator_initializers(captured.graph),
                                      steps=self.pipeline_steps)
        inference = estimator_capture.inference_of(captured.evaluated, inputs[0].x, inputs[0].y) if inputs else None
        flags._towers = towers
        if captured.evaluated is not None and not self.evaluates:
            self.evaluate = self.estimator_evaluate
        built = LegacyGraph(feed=found_feed(inputs, weights, fed, evaluate), tower_logits=logits, tower_losses=losses,
                            loss=loss, grads_and_vars=found.grads_and_vars, train_op=found.train_op,
                            global_step=found.global_step, learning_rate=found.learning_rate,
                            moving_averages=Shadows(captured.graph), pipeline=pipeline, graph=captured.graph,
                            inference=inference)
        return dataclasses.replace(built, **{k: v for k, v in named.items() if k not in FOUND_ONLY})
