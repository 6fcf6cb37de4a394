"""What a program pair gives the parity harness: the typed interface of one adapter module.

A *pair* is a TF1 tower program (the reference) and the TF2 port written for it.  The harness judges
the two through an adapter module, written beside the programs, that builds each side with the
program's own code and names what only the program's author knows: which tensors are the towers'
losses, how one batch is fed to the towers, which step function the port runs.  Everything else the
harness finds by itself, in the TF1 graph (trainable and model variables, the optimizer's update ops
with their configuration and slots, the batch-norm updates of `UPDATE_OPS` and the statistics they
move, dropout and its random noise) and in the Keras model (its `BatchNormalization` and `Dropout`
layers, found by type, and the optimizer's configuration and slots).

An adapter module defines one attribute, `PAIR`::

    from compare.interface import Pair, Pairing, LegacyGraph, ModernBuild, TowerFeed, StepResult

    class Legacy:                       # implements LegacySide
        tower_flag = "--num_gpus"
        def parse_args(self, argv): ...
        def build(self, flags, towers, files): ...      # -> LegacyGraph, in the default graph
        def session_config(self, flags, towers): ...

    class Modern:                       # implements ModernSide
        replica_flag = "--num_gpus"
        def parse_args(self, argv): ...
        def build(self, flags, strategy, files): ...    # -> ModernBuild, in strategy.scope()

    PAIR = Pair(name="mine", legacy=Legacy(), modern=Modern(), data=MyData())

and is judged with `python compare/run.py --pair my_package.my_adapter`.  `docs/judging-your-own-port.md`
walks through a complete adapter (`examples/cifar10_tutorial/adapter.py`, the one the tests run).

Conventions the harness relies on:
  * A `Batch` holds rows as the MODEL receives them (after the input pipeline): the same numbers go
    to both sides.  Labels in whatever form the programs' losses take (one-hot or class indices).
  * The modern program's distributed element (what `ModernBuild.distribute` returns and its train
    step consumes) is a tuple `(x, y)` or `(x, y, weights)` of per-replica values, rows first.
  * Variables are named by their TF1 names everywhere in reports (`layer1/weights`).

Optional capabilities are declared in `Pair.capabilities` and backed by the optional fields below;
a check whose capability is absent reports NOT APPLICABLE, with its reason, never PASS.
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, Union, runtime_checkable

import numpy as np

# The check groups, in the order the harness runs them (compare.harness.run_groups).
GROUPS = ("basics", "structure", "shuffle", "flags", "forward", "training", "splits", "steps", "averages", "free",
          "trained", "evaluation", "tf1")

# The capabilities an adapter may declare, and what each makes the harness check.
CAPABILITIES = {
    "pipelines": "both programs' input pipelines on the harness's files, batch for batch "
                 "(LegacyGraph.pipeline, ModernBuild.dataset)",
    "moving_averages": "moving averages of the variables against their update formula "
                       "(LegacyGraph.moving_averages, ModernBuild.shadows)",
    "evaluation": "both programs' evaluation of one TF1 checkpoint (LegacySide.evaluate, ModernBuild.evaluate)",
    "checkpoint_converter": "a TF1 checkpoint into the modern model and back, bit for bit "
                            "(ModernBuild.load_tf1, ModernBuild.save_tf1)",
    "tf1_runtime": "the legacy graph on TF1's own runtime (ref variables, v1 control flow), in a "
                   "process of its own: the adapter's LegacySide.build must work after "
                   "tf.compat.v1.disable_v2_behavior()",
    "shuffle": "both training pipelines as the programs run them, their own shuffle on, over two epochs of a "
               "file of Pair.shuffle_rows rows, compared statistically (LegacySide.input_pipeline, "
               "ModernSide.input_pipeline, DataSpec.write_rows); the same methods let the flags check rebuild "
               "the pipelines alone",
}


@dataclasses.dataclass(frozen=True)
class Batch:
    """One global batch: inputs and labels as numpy arrays, rows first, as the model receives them."""
    x: np.ndarray
    y: np.ndarray

    @property
    def rows(self) -> int:
        return int(len(self.x))

    def take(self, index: Any) -> Batch:
        """The rows `index` (a slice or an array of row indices) of this batch."""
        return Batch(self.x[index], self.y[index])

    def tile(self, copies: int) -> "Batch":
        """The rows `copies` times over, one copy after the other."""
        return Batch(np.concatenate([self.x] * copies), np.concatenate([self.y] * copies))


# The files the harness writes for one run, in the programs' own formats: {"train": path, ...},
# plus "scratch": an empty folder of the run's own, for the programs' outputs (model_dir and such).
DataFiles = Mapping[str, str]


@runtime_checkable
class DataSpec(Protocol):
    """The pair's data: the files both programs read, and batches in the model's input domain."""

    def write(self, folder: str, towers: int, seed: int) -> DataFiles:
        """Write small data files in the programs' real format under `folder`, sized for `towers`
        towers and for the batch sizes of `Pair.harness_argv` (a short last batch is worth having);
        return {split: path} ("train", and "valid" or "eval" if the programs read them)."""

    def batch(self, rows: int, seed: int) -> Batch:
        """`rows` rows as the model receives them (preprocessed inputs, labels as the loss takes
        them), deterministic in `seed`.  They need not look like real data, only lie in its range."""

    # Optional (capability "shuffle"):
    # def write_rows(self, folder, rows, seed) -> DataFiles: a training file of exactly `rows` distinct
    #     rows (and whatever else the pipelines read), for the shuffled-pipeline check.


@dataclasses.dataclass
class TowerFeed:
    """One batch handed to the legacy towers, as the program hands it (LegacyGraph.feed raises NotFed
    for a batch the program can never receive).

    feed_dict: the program's placeholders (or the input tensors its towers read, such as an
      iterator's `get_next()` outputs, which TF1 lets a feed replace) -> values.
    rows: per tower, the indices of the batch's rows that tower sees (in the order it sees them).
    weights: per tower, the weight of its loss in the combined loss the step minimises (1/N when
      the program averages the towers, rows_i / rows when it weights them by their rows).
    note: what the program itself would log about this batch (dropped rows, empty towers), or "".
    """
    feed_dict: dict
    rows: Sequence[np.ndarray]
    weights: Sequence[float]
    note: str = ""


@dataclasses.dataclass
class LegacyPipeline:
    """The program's own input pipeline, built in its training graph on the harness's files.

    train: the tensors one training step reads: one (images, labels) pair for a program that feeds
      one batch to every tower, one pair per tower for a program whose towers each read their own.
    initializer: ops to run before the first batch (an initializable iterator), or empty.
    valid / valid_initializer: the same for the validation pipeline, if the program has one.
    steps: compare this many steps (a pipeline that repeats forever); None: until it runs out.
    queue_runners: the pipeline is fed by queue runners (tf.train.string_input_producer,
      shuffle_batch, ...): the harness starts them in a session of its own to read it, and stops them.
    """
    train: Sequence[tuple[Any, Any]]
    initializer: Sequence[Any] = ()
    valid: Sequence[tuple[Any, Any]] = ()
    valid_initializer: Sequence[Any] = ()
    steps: Optional[int] = None
    queue_runners: bool = False


@dataclasses.dataclass
class LegacyInference:
    """The program's inference mode where it is a graph of its own, not a feed of the training graph
    (an Estimator calls its model_fn in EVAL mode in another graph: compare.estimator_capture).

    graph: that graph.  tower_logits: its logits per tower.  feed: batch -> TowerFeed (its inputs fed
    the rows, which rows each tower takes; NotFed where it takes no batch the harness can give).
    variables: TF1 name -> its variable; before each run the training graph's state is copied in by name.
    """
    graph: Any
    tower_logits: Sequence[Any]
    feed: Callable[[Batch], TowerFeed]
    variables: Mapping[str, Any]


@dataclasses.dataclass
class LegacyGraph:
    """What only the TF1 program's author can name in its training graph (built by `LegacySide.build`).

    feed: batch, training -> TowerFeed; with training False the program's inference feed (its
      is_training / keep_prob placeholders as its validation feeds them).
    tower_logits, tower_losses: per tower.
    loss: the combined loss the step minimises (the mean of the tower losses, or their weighted sum).
    grads_and_vars: the averaged (gradient, variable) pairs the program passes to apply_gradients.
    train_op: the op one training step runs (batch-norm updates and moving averages included).
    global_step, learning_rate: the step counter and the rate the optimizer is given.
    moving_averages: the program's tf.train.ExponentialMovingAverage of the variables (capability
      "moving_averages"); the harness finds its shadows with `average(variable)`.
    pipeline: the program's own input pipeline (capability "pipelines").
    feed_towers: optional; rows and weights per tower -> the feed that gives tower i exactly those
      rows at that weight (a program whose split takes per-tower starts, sizes and weights).  With
      it the harness also feeds the legacy towers the rows each modern replica got.
    graph: the graph the tensors are in, where it is not the default graph `build` was called in (a
      program captured as it ran: compare.capture).
    inference: the program's inference mode where it is another graph (LegacyInference); None: the
      training graph fed `feed(batch, False)`.
    """
    feed: Callable[[Batch, bool], TowerFeed]
    tower_logits: Sequence[Any]
    tower_losses: Sequence[Any]
    loss: Any
    grads_and_vars: Sequence[tuple[Any, Any]]
    train_op: Any
    global_step: Any
    learning_rate: Any
    moving_averages: Any = None
    pipeline: Optional[LegacyPipeline] = None
    feed_towers: Optional[Callable[[Batch, Sequence[np.ndarray], Sequence[float], bool], dict]] = None
    graph: Any = None
    inference: Optional[LegacyInference] = None


@runtime_checkable
class LegacySide(Protocol):
    """The TF1 program.

    tower_flag: the program's command-line flag for the number of towers ("--num_gpus").
    """
    tower_flag: str

    def parse_args(self, argv: Sequence[str]) -> argparse.Namespace:
        """The program's own command-line parser."""

    def build(self, flags: argparse.Namespace, towers: int, files: DataFiles) -> LegacyGraph:
        """Build the program's training graph in the current default graph (a fresh
        tf.compat.v1.Graph the harness has entered), with `towers` towers, by calling the program's
        own functions, as its `main` does; its input pipeline reads `files`."""

    def session_config(self, flags: argparse.Namespace, towers: int) -> Any:
        """The program's tf.compat.v1.ConfigProto for `towers` towers (virtual CPU devices when
        there is no GPU: `legacy.towers.session_config`)."""

    # Optional (capability "shuffle"; also used by the flags check to rebuild the pipeline alone):
    # def input_pipeline(self, flags, towers, files) -> LegacyPipeline: the program's own training
    #     (and validation) pipeline alone, built in the current default graph.
    # Optional (capability "evaluation"):
    # def evaluate(self, flags, checkpoint_path, files) -> Mapping[str, float]: the program's evaluation.


@dataclasses.dataclass
class StepResult:
    """What one modern training step returned.

    loss: the step's loss (the global batch's, summed over the replicas).
    gradients: the all-reduced gradients the step applied, aligned with
      model.trainable_variables, if the program's step returns them; else None and the harness
      reads them back from the optimizer's slots (Adam, momentum) or from the update itself.
    """
    loss: Any
    gradients: Optional[Sequence[Any]] = None


@dataclasses.dataclass
class ModernBuild:
    """The TF2 program's model and steps, as built by `ModernSide.build` in the strategy's scope.

    model, optimizer: the Keras model and optimizer the program trains (the optimizer built, so
      that its slots exist).
    train_step: distributed element -> StepResult: the program's own traced train step.
    distribute: Batch -> distributed element, through the program's own input path (the same
      function its training loop feeds the step with).
    variables: TF1 name -> model variable.  None: the harness pairs the legacy model variables
      with the model's by creation order and shape (and says which do not pair).
    predict: x -> logits in inference mode; None: model(x, training=False).
    shadows: TF1 name -> the moving-average shadow of that variable (capability "moving_averages"); or
      a callable (TF1 name -> model variable) -> that mapping, for a side that learns the TF1 names only
      when the harness pairs the variables (a port captured as it ran).
    dataset, valid_dataset: the program's own tf.data pipelines of global batches on the harness's
      files (capability "pipelines"): elements (x, y) or (x, y, weights).
    evaluate: a TF1 checkpoint path -> the program's evaluation metrics (capability "evaluation").
    load_tf1, save_tf1: the program's checkpoint converter (capability "checkpoint_converter"):
      load a TF1 checkpoint into `model`; write `model` as a TF1 checkpoint at a path, returning it.
    layer_scopes: optional; Keras layer name -> the TF1 name scope that computes it, for the layers the
      harness cannot pair by their variables or names when it localises a FAIL (compare.diagnosis).
    strategy: the strategy the port built under, where it is not the one the harness gave `build`
      (a port captured as it ran, which makes its own: compare.port_capture).
    trace: optional; traces the program's steps without running them (each tf.function's
      `get_concrete_function()`, for a step traced for its input signature), so that the harness
      traces them beside the legacy side's start; None: each step is traced at its first call.
    """
    model: Any
    optimizer: Any
    train_step: Callable[[Any], StepResult]
    distribute: Callable[[Batch], Any]
    variables: Optional[Mapping[str, Any]] = None
    predict: Optional[Callable[[np.ndarray], Any]] = None
    shadows: Union[Mapping[str, Any], Callable[[Mapping[str, Any]], Mapping[str, Any]], None] = None
    dataset: Optional[Callable[[], Any]] = None
    valid_dataset: Optional[Callable[[], Any]] = None
    evaluate: Optional[Callable[[str], Mapping[str, float]]] = None
    load_tf1: Optional[Callable[[str], Any]] = None
    save_tf1: Optional[Callable[[str], str]] = None
    layer_scopes: Optional[Mapping[str, str]] = None
    strategy: Any = None
    trace: Optional[Callable[[], Any]] = None


@runtime_checkable
class ModernSide(Protocol):
    """The TF2 port.

    replica_flag: the port's command-line flag for the number of replicas.
    makes_its_strategy: optional, True for a side that makes its own strategy (a port captured as it
      runs): `build` is then called outside any strategy's scope, with strategy None, and returns the
      strategy in `ModernBuild.strategy`.
    """
    replica_flag: str

    def parse_args(self, argv: Sequence[str]) -> argparse.Namespace:
        """The port's own command-line parser."""

    def build(self, flags: argparse.Namespace, strategy: Any, files: DataFiles) -> ModernBuild:
        """Build the port's model, optimizer and steps under `strategy` by calling the port's own
        functions, as its `main` does; its input pipelines read `files`."""

    # Optional (capability "shuffle"; also used by the flags check):
    # def input_pipeline(self, flags, num_replicas, files) -> tf.data.Dataset: the port's own training
    #     pipeline of global batches alone.


@dataclasses.dataclass(frozen=True)
class Pairing:
    """One configuration of the two programs judged against each other.

    label: prefixes the check names ("original: gradients ...") when the pair has several pairings.
    legacy_argv, modern_argv: command-line arguments each program is built with.
    same_rows_on_every_tower: the legacy program feeds one batch to every tower (and the port
      copies it to every replica): a batch then has rows_per_tower rows, not towers x rows_per_tower.
      None: found when the pairing is built, from the legacy feed (every tower given the whole batch).
    groups: the check groups run for this pairing (None: all); see compare.harness.GROUPS.
    quick: whether `compare/run.py --quick` runs this pairing.
    """
    label: str = ""
    legacy_argv: tuple[str, ...] = ()
    modern_argv: tuple[str, ...] = ()
    same_rows_on_every_tower: Optional[bool] = False
    groups: Optional[tuple[str, ...]] = None
    quick: bool = True


@dataclasses.dataclass
class Pair:
    """A TF1 program and its TF2 port, as one adapter module hands them to the harness.

    name: the pair's short name in reports ("cifar").
    harness_argv: towers -> arguments both programs get in every pairing, before the pairing's own:
      the sizes that suit the harness's small files (batch sizes, epochs).
    own_flags: flags both programs accept that each keeps its own value of (output folders); the
      configuration check compares every other flag both accept.
    rows_per_tower: rows each tower gets in the harness's batches (keep it small; enough rows for
      batch norm to be well conditioned).
    free_steps, quick_free_steps: free-running (and moving-average) steps, by default and with
      --quick (0: none; a chaotic model needs many steps to say anything, and each costs).
    shuffle_rows, shuffle_argv: the training file's rows for the shuffled-pipeline check (more than
      the programs' shuffle buffer, so that its size shows) and arguments for that check.
    loop_flags: flags both programs accept that only their training loop or data resolution reads
      (a step limit, a log interval, a data folder), or that size what the harness judges at the size
      given (a smaller network for tests), each with that reason: the flags check, which
      requires every other shared flag to change something both programs build, reports them.
    flag_values: shared flags at non-default values, argv lists that both programs must parse to the
      same settings (the configuration check adds the defaults); the flags check takes each flag's
      value from them (a flag not given there gets one from the type of its default).
    extra_checks: optional; (built pairing, log) -> more Results: checks of this pair's own quirks,
      built on the harness's helpers (`compare.sides`).
    description: one line for the report and the log.
    """
    name: str
    legacy: LegacySide
    modern: ModernSide
    data: DataSpec
    capabilities: frozenset = frozenset()
    pairings: tuple[Pairing, ...] = (Pairing(),)
    harness_argv: Callable[[int], Sequence[str]] = lambda towers: ()
    own_flags: tuple[str, ...] = ()
    rows_per_tower: int = 8
    free_steps: int = 20
    quick_free_steps: int = 4
    flag_values: tuple[tuple[str, ...], ...] = ()
    shuffle_rows: int = 0
    shuffle_argv: tuple[str, ...] = ()
    loop_flags: Mapping[str, str] = dataclasses.field(default_factory=dict)
    extra_checks: Optional[Callable[..., list]] = None
    description: str = ""
    module: str = ""  # the adapter module's name (set by the harness when it loads the adapter)
    # role -> module of the programs a seed adapter's make_pair was given (set by the harness), so that a
    # process of the harness's own can load the same pair again (compare.harness.reload_pair)
    programs: Mapping[str, str] = dataclasses.field(default_factory=dict)


def optional(side: object, method: str) -> Optional[Callable[..., Any]]:
    """An optional method of an adapter's side (`input_pipeline`, `evaluate`, `write_rows`), bound,
    or None where the side does not define it."""
    found = getattr(side, method, None)
    return found if callable(found) else None


def settings(flags: argparse.Namespace) -> dict[str, Any]:
    """A program's parsed flags by name: its Namespace without the harness's own attributes (a captured
    program's `_argv`, the command line it is run with)."""
    return {k: v for k, v in vars(flags).items() if not k.startswith("_")}


def undeclared(pair: Pair, what: str, capability: str) -> str:
    """Why a check of an optional capability judges nothing: its adapter does not declare it, or there
    is no adapter (two programs judged alone), which is where it would be declared."""
    if pair.module:
        return f"the adapter declares no {what.removeprefix('a ')} (capability '{capability}')"
    return f"judged with no adapter, which is where {what} would be declared (capability '{capability}')"


class AdapterError(Exception):
    """An adapter that does not implement the interface (the message names what is wrong)."""


class NotFed(Exception):
    """Raised by LegacyGraph.feed for a batch the program can never receive (its towers take full
    batches only, say): the checks that need such a batch are NOT APPLICABLE, with this message."""


def validate(pair: Any, source: str = "the adapter") -> Pair:
    """`pair` if it implements the interface, else AdapterError naming the first thing missing."""
    if not isinstance(pair, Pair):
        raise AdapterError(f"{source}: PAIR must be a compare.interface.Pair, got {type(pair).__name__}")
    for side, protocol, attrs in ((pair.legacy, LegacySide, ("tower_flag", "parse_args", "build", "session_config")),
                                  (pair.modern, ModernSide, ("replica_flag", "parse_args", "build")),
                                  (pair.data, DataSpec, ("write", "batch"))):
        lacks = [a for a in attrs if not hasattr(side, a) or (a not in ("tower_flag", "replica_flag")
                                                               and not callable(getattr(side, a)))]
        if lacks:
            raise AdapterError(f"{source}: {type(side).__name__} does not implement {protocol.__name__}: "
                               f"it lacks {', '.join(lacks)}")
    unknown = sorted(set(pair.capabilities) - set(CAPABILITIES))
    if unknown:
        raise AdapterError(f"{source}: unknown capabilities {', '.join(unknown)}; "
                           f"the capabilities are {', '.join(CAPABILITIES)}")
    if pair.rows_per_tower < 1:
        raise AdapterError(f"{source}: rows_per_tower must be at least 1, got {pair.rows_per_tower}")
    if not pair.pairings:
        raise AdapterError(f"{source}: a pair needs at least one Pairing")
    return pair
