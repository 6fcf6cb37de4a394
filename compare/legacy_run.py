"""The legacy side of a pairing: the TF1 program's graph in a session of its own config.

`LegacyRun` builds the graph with the adapter's `LegacySide.build`, finds in it what the harness needs
(variables, the optimizer's updates and slots, moving statistics, dropouts: `compare.tf1_graph`), adds
its own taps and setters beside the program's ops, and answers the `compare.state.Run` verbs:

    state() / restore(state)        every variable, as numpy, in TF1's names
    step(batch, masks, towers)      the program's train op on one fed batch -> StepOutcome
    gradients(batch, masks, towers) the combined loss and the averaged gradients, nothing applied
    predict(x)                      the towers' logits in inference mode, rows in batch order
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from typing import Any, Callable, Iterator, NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf

from compare import common
from compare import optimizers
from compare import tf1_graph
from compare.interface import Batch, DataFiles, LegacyGraph, LegacyInference, Pair, TowerFeed
from compare.state import Masks, State, StepOutcome

tf1 = tf.compat.v1


class HarnessError(Exception):
    """The pair cannot be judged as built (the message names what does not fit)."""


class TowerRows(NamedTuple):
    """Rows (indices into a batch) and the loss weight of each legacy tower, for LegacyGraph.feed_towers."""
    rows: Sequence[np.ndarray]
    weights: Sequence[float]


class Fed(NamedTuple):
    """One batch as the program's towers receive it: the feed dict, and the adapter's TowerFeed."""
    feed_dict: dict
    towers: TowerFeed


class InferenceRun:
    """The program's inference graph where it is a graph of its own (LegacyInference: an Estimator's
    model_fn in EVAL mode) in a session of its own, its variables set from a state before each run."""

    def __init__(self, inference: LegacyInference, config: Any):
        self.inference = inference
        with inference.graph.as_default(), tf1.name_scope("parity_setters/"):
            self.setters = {}
            for name, v in inference.variables.items():
                ph = tf1.placeholder(v.dtype.base_dtype, v.shape)
                self.setters[name] = (ph, v.assign(ph))
            init = [tf1.global_variables_initializer(), tf1.local_variables_initializer(), tf1.tables_initializer()]
        self.sess = tf1.Session(graph=inference.graph, config=config)
        self.sess.run(init)

    def run(self, fetches: Any, feed_dict: dict, values: dict[str, np.ndarray]) -> Any:
        """`fetches` with `feed_dict`, the graph's variables named in `values` set to them first."""
        names = [n for n in values if n in self.setters]
        self.sess.run([self.setters[n][1] for n in names], {self.setters[n][0]: values[n] for n in names})
        return self.sess.run(fetches, feed_dict)

    def close(self) -> None:
        self.sess.close()


class ModeView(NamedTuple):
    """One mode of the program as a localisation reads it: the batch as fed, the towers' logits, and a
    run of any tensors of that mode's graph on that feed."""
    fed: Fed
    tower_logits: Sequence[Any]
    run: Callable[[Any], Any]


class LegacyRun:
    """The program's graph (`lg`, the adapter's LegacyGraph) in the program's own session config."""

    def __init__(self, pair: Pair, flags: Any, towers: int, files: DataFiles, seed: int, start: bool = True):
        """The graph, built by the adapter, and its session; with `start`, its variables initialised
        (else `start()` does it: `started_beside`)."""
        self.pair, self.flags, self.towers = pair, flags, towers
        self.graph = tf1.Graph()
        with self.graph.as_default():
            tf1.set_random_seed(seed)
            lg = pair.legacy.build(flags, towers, files)
        if not isinstance(lg, LegacyGraph):
            raise HarnessError(f"{type(pair.legacy).__name__}.build returned {type(lg).__name__}, "
                               f"not a compare.interface.LegacyGraph")
        self.graph = lg.graph if lg.graph is not None else self.graph  # a program captured as it ran
        self.lg = lg
        with self.graph.as_default():
            check_graph(lg, towers)
            self.by_name = tf1_graph.variables_by_name(self.graph)
            self.mirrors = tf1_graph.mirrors(self.graph)  # a MirroredStrategy's variables: one copy per replica
            self.trainable = [v.op.name for _, v in lg.grads_and_vars]
            self.updates = tf1_graph.optimizer_updates(self.graph, lg.grads_and_vars)
            # The gradients each update receives (after any clipping between averaging and applying).
            self.applied = [self.updates[n].grad if self.updates[n].grad is not None else g
                            for n, (g, _) in zip(self.trainable, lg.grads_and_vars)]
            # The moving-statistic updates a training step runs (a program may collect a tower's and leave
            # it out of its train op: the CIFAR-10 Estimator tutorial runs the first tower's only).
            ran = tf1_graph.ancestors([lg.train_op])
            self.moving = [u for u in tf1_graph.moving_updates(self.graph, lg.tower_losses) if u.op in ran]
            self.model = [v.op.name for v in tf1_graph.model_variables(self.graph, lg.grads_and_vars, self.moving)]
            self.dropouts = tf1_graph.dropouts(self.graph, lg.tower_losses)
            self.fan_ins = tf1_graph.fan_ins(lg.tower_losses[0])
            self.shadows = self.find_shadows()
            with tf1.name_scope("parity_taps/"):
                self.taps = [tf1.identity(u.value) for u in self.moving]
            self.powers = powers_of(self.updates, self.by_name)
            self.readers = self.make_readers()
            self.setters = self.make_setters()
            self.init = tf1.global_variables_initializer()
            self.saver = tf1.train.Saver(var_list={n: self.by_name[n] for n in self.model})
            self.full_saver = tf1.train.Saver()  # every variable, as the programs' own Saver() saves
        self.config = harness_config(pair.legacy.session_config(flags, towers))
        self.sess = tf1.Session(graph=self.graph, config=self.config)
        # The program's inference graph where it is another graph (an Estimator's EVAL mode).
        self.inference = (InferenceRun(lg.inference, self.config)
                          if lg.inference is not None and lg.inference.graph is not None else None)
        self._twin: Optional[LegacyRun] = None
        self._decays: Optional[dict[str, float]] = None
        self._tower_grads: Optional[list[list[Any]]] = None
        self._lr_at: Optional[tf1_graph.StepFunction] = None
        self.started = False
        if start:
            self.start()

    def start(self) -> None:
        """The program's initializers run (variables and pipelines); the optimizer's initial slots and
        rule read."""
        self.sess.run(self.init)
        for init in (self.lg.pipeline.initializer if self.lg.pipeline else ()):
            self.sess.run(init)
        # The optimizer's slots as the program's initializers set them (TF1's RMSProp starts its mean
        # square at 1, Adagrad its accumulator at 0.1): the common start's.
        self.initial_slots = self.sess.run({n: dict(u.slots) for n, u in self.updates.items()})
        self.read_rule()
        self.started = True

    def read_rule(self) -> None:
        """The optimizer's rule, read off its update ops (their hyper-parameters are constants, or
        evaluated: no variable need be initialised for a rule whose are not computed from one)."""
        kinds = sorted({u.rule for u in self.updates.values()})
        if len(kinds) > 1:
            raise HarnessError(f"the legacy graph updates its variables with several rules "
                               f"({', '.join(k or 'one the harness does not know' for k in kinds)})")
        self.rule = optimizers.legacy_rule(next(iter(self.updates.values())), self.sess)

    def find_shadows(self) -> dict[str, Any]:
        """{trainable variable: its moving-average shadow}, through the program's ExponentialMovingAverage."""
        shadows = {}
        if self.lg.moving_averages is not None:
            for name in self.trainable:
                shadow = self.lg.moving_averages.average(self.by_name[name])
                if shadow is not None:
                    shadows[name] = shadow
        return shadows

    def state_variables(self) -> list[Any]:
        """Every variable a State holds: the model's, the optimizer's slots and powers, the step, the shadows."""
        return list(dict.fromkeys([self.by_name[n] for n in self.model] + [
            s for u in self.updates.values() for s in u.slots.values()] + list(self.powers.values()) + [
            self.global_step_var] + list(self.shadows.values())))

    def components(self, name: str) -> list[Any]:
        """The variable `name` as the graph stores it: one copy per replica of a MirroredStrategy's
        variable, else the variable itself."""
        return self.mirrors[name].components if name in self.mirrors else [self.by_name[name]]

    def make_readers(self) -> dict[str, Any]:
        """{variable name: what reading it gives} for every variable a State holds: the variable; for
        a replica-local one (a MirroredStrategy's batch-norm statistic, each replica moving its own
        copy) the aggregate of its copies, as a read outside the replicas and a checkpoint take it."""
        readers: dict[str, Any] = {}
        with tf1.name_scope("parity_readers/"):
            for v in self.state_variables():
                mirror = self.mirrors.get(v.op.name)
                if mirror is None or not mirror.on_read:
                    readers[v.op.name] = v
                    continue
                total = tf.add_n([c.read_value() for c in mirror.components])
                mean = mirror.aggregation == tf.VariableAggregation.MEAN
                readers[v.op.name] = total / len(mirror.components) if mean else total
        return readers

    def make_setters(self) -> dict[str, tuple[Any, Any]]:
        """{variable name: (placeholder, assign op)} for every variable a State sets: every replica's
        copy of a MirroredStrategy's variable alike."""
        setters = {}
        with tf1.name_scope("parity_setters/"):
            for v in self.state_variables():
                ph = tf1.placeholder(v.dtype.base_dtype, v.shape)
                setters[v.op.name] = (ph, tf.group(*[c.assign(ph) for c in self.components(v.op.name)]))
        return setters

    def replica_copy(self, name: str, tower: int) -> Any:
        """The copy of variable `name` that tower `tower` reads (itself, where the towers share one)."""
        copies = self.components(name)
        return copies[tower] if len(copies) > 1 else copies[0]

    @property
    def global_step_var(self) -> Any:
        gs = self.lg.global_step
        return self.by_name.get(gs.op.name, gs)

    # -- state -------------------------------------------------------------------------------
    def state(self) -> State:
        read = self.readers
        fetch = {"weights": {n: read[n] for n in self.model},
                 "slots": {n: {k: read[s.op.name] for k, s in u.slots.items()} for n, u in self.updates.items()},
                 "step": read[self.global_step_var.op.name],
                 "shadows": {n: read[s.op.name] for n, s in self.shadows.items()}}
        out = self.sess.run(fetch)
        return State(out["weights"], out["slots"], int(out["step"]), out["shadows"] or None)

    def read(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """The values of the variables `names` (of a State), as `state` reads them."""
        return self.sess.run({n: self.readers[n] for n in names})

    def restore(self, state: State, lr: Optional[float] = None, powers: bool = True) -> None:
        """Set every variable of `state`; with `powers`, Adam's beta powers to beta^(step + 1),
        what `step` steps leave in them.  (`lr` is the modern side's concern: TF1's slots do not
        depend on the rate.)"""
        values: dict[str, Any] = dict(state.weights)
        for name, slots in state.slots.items():
            for key, value in slots.items():
                values[self.updates[name].slots[key].op.name] = value
        values[self.global_step_var.op.name] = state.step
        if state.shadows and self.shadows:
            values.update((self.shadows[n].op.name, v) for n, v in state.shadows.items())
        if powers and self.powers:
            for key, var in self.powers.items():
                beta = self.rule.beta1 if key == "beta1_power" else self.rule.beta2
                values[var.op.name] = np.float32(beta) ** (state.step + 1)
        self.assign(values)

    def assign(self, values: dict[str, Any]) -> None:
        """Set variables by name through their setters."""
        self.sess.run([self.setters[n][1] for n in values], {self.setters[n][0]: v for n, v in values.items()})

    def set_step(self, step: int) -> None:
        self.assign({self.global_step_var.op.name: step})

    def save(self, path: str) -> str:
        with self.graph.as_default():
            return self.saver.save(self.sess, path, write_meta_graph=False)

    # -- running -------------------------------------------------------------------------------
    def feed(self, batch: Batch, training: bool, masks: Masks = None, towers: Optional[TowerRows] = None) -> Fed:
        """`batch` as the program feeds it, with `masks` imposed on the dropouts: masks[k][i] is
        dropout k's mask for tower i's rows (from `Sides.tower_masks`).  towers: the rows and weight
        of each tower, through LegacyGraph.feed_towers."""
        tower_feed = self.lg.feed(batch, training)
        feed: dict[Any, Any] = dict(tower_feed.feed_dict)
        if towers is not None:
            if self.lg.feed_towers is None:
                raise HarnessError("this legacy graph has no feed_towers")
            feed = dict(self.lg.feed_towers(batch, towers.rows, towers.weights, training))
            tower_feed = dataclasses.replace(tower_feed, feed_dict=feed, rows=list(towers.rows),
                                             weights=list(towers.weights))
        if masks is not None:
            for k, per_tower in enumerate(masks):
                for d in (d for d in self.dropouts if self.dropout_index(d) == k):
                    feed[d.noise] = per_tower[d.tower or 0]
        return Fed(feed, tower_feed)

    def dropouts_on(self, batch: Batch, training: bool) -> list[tf1_graph.Dropout]:
        """The dropouts that drop units when the towers' logits are computed from `batch` as the
        program feeds it (their noise runs, at a rate above 0): in inference mode, none for a program
        that has an inference mode (is_training fed False, or keep_prob fed 1, or an inference graph of
        its own); every one of a network built with is_training=True in the training graph (slim's
        default), which has none."""
        if not training and self.lg.inference is not None:
            return []
        feed = self.feed(batch, training).feed_dict
        runs = tf1_graph.running(self.lg.tower_logits, feed)
        on = [d for d in self.dropouts if d.noise.op in runs]
        rates = self.sess.run([d.rate for d in on], feed)
        return [d for d, rate in zip(on, rates) if float(rate) > 0]

    def dropout_index(self, dropout: tf1_graph.Dropout) -> int:
        """The position of a dropout among its tower's dropouts (k-th dropout of the network)."""
        same = [d for d in self.dropouts if d.tower == dropout.tower]
        return same.index(dropout)

    def run(self, fetches: Any, batch: Batch, training: bool, masks: Masks = None,
            towers: Optional[TowerRows] = None) -> Any:
        return self.sess.run(fetches, self.feed(batch, training, masks, towers).feed_dict)

    def changed_step(self, state: State, batch: Batch, masks: Masks, changes: dict[Any, Any]) -> dict[str, np.ndarray]:
        """From `state`, one training step (the program's train_op) on `batch` with `changes` fed (tensors
        of its graph: the values they take instead): its trainable weights after it.  `state` is put back."""
        self.restore(state)
        try:
            self.sess.run(self.lg.train_op, {**self.feed(batch, True, masks).feed_dict, **changes})
            return self.read(list(self.trainable))
        finally:
            self.restore(state)

    def gradients(self, batch: Batch, masks: Masks = None, towers: Optional[TowerRows] = None) -> StepOutcome:
        """The combined loss and the averaged gradients of one fed batch in training mode (nothing applied)."""
        loss, grads = self.run([self.lg.loss, self.applied], batch, True, masks, towers)
        return StepOutcome(float(loss), dict(zip(self.trainable, grads)), masks=masks,
                           source="legacy grads_and_vars")

    def tower_gradients(self, batch: Batch, masks: Masks = None) -> list[dict[str, np.ndarray]]:
        """Each tower's own gradients (of its loss, before the towers are joined; nothing applied)."""
        if self._tower_grads is None:
            with self.graph.as_default(), tf1.name_scope("parity_tower_gradients/"):
                self._tower_grads = []
                for i, loss in enumerate(self.lg.tower_losses):
                    # A replica of a MirroredStrategy reads its own copy of each variable.
                    variables = [self.replica_copy(n, i) for n in self.trainable]
                    self._tower_grads.append([g if g is not None else tf.zeros_like(v) for g, v in
                                              zip(tf1.gradients(loss, variables), variables)])
        return [dict(zip(self.trainable, g)) for g in self.run(self._tower_grads, batch, True, masks)]

    def step(self, batch: Batch, masks: Masks = None, towers: Optional[TowerRows] = None) -> StepOutcome:
        """One training step (the program's train_op): its loss, rate, gradients and batch statistics."""
        loss, lr, grads, stats, _ = self.run(
            [self.lg.loss, self.lg.learning_rate, self.applied, self.taps,
             self.lg.train_op], batch, True, masks, towers)
        return StepOutcome(float(loss), dict(zip(self.trainable, grads)), lr=float(lr), masks=masks,
                           source="legacy train op", stats=list(stats))

    def view(self, batch: Batch, training: bool, masks: Masks = None) -> ModeView:
        """`batch` in training mode (the training graph, as the program feeds it) or in inference mode
        (`inference_view`)."""
        if not training:
            return self.inference_view(batch, masks)
        fed = self.feed(batch, True, masks)
        return ModeView(fed, self.lg.tower_logits, lambda fetches: self.sess.run(fetches, fed.feed_dict))

    def inference_view(self, batch: Batch, masks: Masks = None) -> ModeView:
        """Inference mode on `batch`: the training graph fed the program's inference feed, or the
        program's inference graph of its own (LegacyInference, NotFed where it takes no such batch) with
        the training side's variables copied in."""
        if self.lg.inference is None:
            fed = self.feed(batch, False, masks)
            return ModeView(fed, self.lg.tower_logits, lambda fetches: self.sess.run(fetches, fed.feed_dict))
        towers = self.lg.inference.feed(batch)
        if self.inference is None:
            raise HarnessError("the program's inference graph was not built")
        inference, values = self.inference, self.read(self.model)
        return ModeView(Fed(dict(towers.feed_dict), towers), self.lg.inference.tower_logits,
                        lambda fetches: inference.run(fetches, towers.feed_dict, values))

    def inference_logits(self, batch: Batch, masks: Masks = None) -> tuple[list[np.ndarray], TowerFeed]:
        """Each tower's logits in inference mode (`inference_view`), and which rows each took."""
        view = self.inference_view(batch, masks)
        return list(view.run(list(view.tower_logits))), view.fed.towers

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The towers' logits in inference mode (the program's validation feed), in the rows' order.
        Rows no tower sees are NaN."""
        logits, towers = self.inference_logits(Batch(x, np.zeros(len(x), np.int32)))
        out = np.full((len(x), np.shape(logits[0])[-1]), np.nan, np.float32)
        for rows, values in zip(towers.rows, logits):
            out[np.asarray(rows, int)] = values
        return out

    def moving_decays(self) -> dict[str, float]:
        """{moving statistic's name: the decay its updates use in training}, read once."""
        if self._decays is None:
            first: dict[str, tf1_graph.MovingUpdate] = {}
            for u in self.moving:
                first.setdefault(u.variable.op.name, u)
            if not first:
                self._decays = {}
                return self._decays
            feed = self.feed(self.pair.data.batch(self.pair.rows_per_tower * self.towers, 0), True).feed_dict
            values = self.sess.run({n: u.one_minus_decay for n, u in first.items()}, feed)
            self._decays = {n: 1 - float(v) for n, v in values.items()}
        return self._decays

    def learning_rate_at(self, step: int, changes: Optional[dict[str, float]] = None) -> float:
        """The legacy rate at a global step (its tensor evaluated without its control dependencies);
        changes: {a constant of the schedule's graph: the value it is fed instead} (`schedule`)."""
        return self.schedule(step, changes)

    @property
    def schedule(self) -> tf1_graph.StepFunction:
        """The legacy rate as a function of the global step, with the constants it is computed from."""
        if self._lr_at is None:
            self._lr_at = tf1_graph.StepFunction(self.graph, self.lg.learning_rate, self.global_step_var, self.sess)
        return self._lr_at

    def twin(self) -> "LegacyRun":
        """The same graph in a second session of the same config, its variables initialised: a
        second copy of the program's state, to train beside this one (made once, closed with it)."""
        if self._twin is None:
            twin = copy.copy(self)
            twin.sess, twin._twin, twin._lr_at = tf1.Session(graph=self.graph, config=self.config), None, None
            twin.sess.run(self.init)
            for init in (self.lg.pipeline.initializer if self.lg.pipeline else ()):
                twin.sess.run(init)
            self._twin = twin
        return self._twin

    def close(self) -> None:
        if self._twin is not None:
            self._twin.close()
            self._twin = None
        if self.inference is not None:
            self.inference.close()
        self.sess.close()


def harness_config(config: Any) -> Any:
    """The program's session config, with grappler's constant folding off.  The harness feeds its rows
    in place of tensors the program computes (an iterator's get_next()); constant folding would fold
    the static shape of such a tensor into a constant that keeps a control edge to the op that made it,
    and so pull the program's input stream on every fetch that takes a gradient through a convolution.
    Folding changes no value the graph computes."""
    config = tf1.ConfigProto.FromString(config.SerializeToString())
    rewrite = config.graph_options.rewrite_options
    rewrite.constant_folding = rewrite.OFF  # the RewriterConfig enum, as the message exposes it
    return config


def powers_of(updates: dict[str, tf1_graph.OptimizerUpdate], by_name: dict[str, Any]) -> dict[str, Any]:
    """Adam's running beta powers (TF1 keeps them as variables, read by every Adam update op)."""
    out = {}
    for u in updates.values():
        if u.rule == "adam":
            for key in ("beta1_power", "beta2_power"):
                var = tf1_graph.variable_of(u.inputs[key], by_name)
                if var is not None:
                    out[key] = var
    return out


def check_graph(lg: LegacyGraph, towers: int) -> None:
    """The LegacyGraph's shapes: one logit and loss tensor per tower, scalar losses."""
    problems = []
    for field in ("tower_logits", "tower_losses"):
        if len(getattr(lg, field)) != towers:
            problems.append(f"{field} has {len(getattr(lg, field))} entries for {towers} towers")
    for t in list(lg.tower_losses) + [lg.loss]:
        if t.shape.rank not in (None, 0):
            problems.append(f"{t.name} is not a scalar (shape {t.shape})")
    for t in lg.tower_logits:
        if t.shape.rank not in (None, 2):
            problems.append(f"{t.name} is not [rows, classes] (shape {t.shape})")
    if not lg.grads_and_vars or any(g is None for g, _ in lg.grads_and_vars):
        problems.append("grads_and_vars is empty or holds a None gradient")
    if problems:
        raise HarnessError("the legacy graph does not fit the interface: " + "; ".join(problems))


@contextlib.contextmanager
def started_beside(legacy: LegacyRun) -> Iterator[None]:
    """`legacy.start()` beside the block (`beside`)."""
    with beside(legacy.start):
        yield


@contextlib.contextmanager
def beside(work: Callable[[], Any]) -> Iterator[None]:
    """`work()` in a thread of its own for the duration of the block, and what it raised raised after
    it: a TF1 session run holds no GIL, so the legacy program's first runs of a large graph (its import
    into the session, pruning, Grappler) go on beside the Python work of the block (the modern build)."""
    background = common.Background(work, "legacy-start")
    try:
        yield
    except BaseException:
        background.join()
        raise
    background.wait()
