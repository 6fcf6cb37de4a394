"""One pairing of a pair, built: the legacy graph in its session and the modern model under its strategy.

`build(pair, pairing, towers, files, tmp_dir, seed)` returns `Sides`, which the checks drive:

    sides.legacy.run(batch, training, masks)     the program's own ops on one fed batch
    sides.legacy.state() / set_state(state)      every variable, as numpy
    sides.modern.step(batch)                     the port's own train step on one batch
    sides.modern.set_state(state)                the legacy state, in the port's parameterisation
    sides.start                                  the common start (fresh weights, moving statistics
                                                 randomised; or the --checkpoint's), zero slots, step 0

The state is always held in TF1's names and TF1's parameterisation (`State`); the modern side
converts on the way in (Keras' momentum slot is -lr times TF1's accumulator) and out.

Dropout masks belong to rows: the modern step's masks are drawn by the model's own dropout layers
(found by type) from the seed the step is about to use, the seeds then put back, so the step draws
the same masks; the legacy towers get the same masks for the same rows through their dropout noise
(a unit is kept where noise >= rate: 1 keeps, 0 drops).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

import keras
import numpy as np
import tensorflow as tf

from compare import common
from compare import optimizers
from compare import tf1_graph
from compare.interface import Batch, LegacyGraph, ModernBuild, Pair, Pairing
from modern import keras_adapter

tf1 = tf.compat.v1


class HarnessError(Exception):
    """The pair cannot be judged as built (the message names what does not fit)."""


@dataclasses.dataclass
class State:
    """A training state in TF1's names and parameterisation.

    weights: every model variable (trainable ones and moving statistics); slots: per trainable
    variable, the optimizer's slots by TF1's names (m, v; accum); step: the global step;
    shadows: per trainable variable, its moving-average shadow (None without moving averages)."""
    weights: dict
    slots: dict
    step: int
    shadows: Optional[dict] = None

    def replace(self, **kw) -> "State":
        return dataclasses.replace(self, **kw)


# ---------------------------------------------------------------------------------------------
# The legacy side

class LegacyRun:
    """The program's graph (`lg`, the adapter's LegacyGraph) in the program's own session config."""

    def __init__(self, pair: Pair, flags, towers: int, files, seed: int):
        self.pair, self.flags, self.towers = pair, flags, towers
        self.graph = tf1.Graph()
        with self.graph.as_default():
            tf1.set_random_seed(seed)
            lg = pair.legacy.build(flags, towers, files)
            if not isinstance(lg, LegacyGraph):
                raise HarnessError(f"{type(pair.legacy).__name__}.build returned {type(lg).__name__}, "
                                   f"not a compare.interface.LegacyGraph")
            self.lg = lg
            check_graph(lg, towers)
            self.by_name = tf1_graph.variables_by_name(self.graph)
            self.trainable = [v.op.name for _, v in lg.grads_and_vars]
            self.updates = tf1_graph.optimizer_updates(self.graph, lg.grads_and_vars)
            self.moving = tf1_graph.moving_updates(self.graph, lg.tower_losses)
            self.model = [v.op.name for v in tf1_graph.model_variables(self.graph, lg.grads_and_vars, self.moving)]
            self.dropouts = tf1_graph.dropouts(self.graph, lg.tower_losses)
            self.fan_ins = tf1_graph.fan_ins(lg.tower_losses[0])
            self.shadows = {}
            if lg.moving_averages is not None:
                for name in self.trainable:
                    shadow = lg.moving_averages.average(self.by_name[name])
                    if shadow is not None:
                        self.shadows[name] = shadow
            with tf1.name_scope("parity_taps/"):
                self.taps = [tf1.identity(u.value) for u in self.moving]
            self.powers = powers_of(self.updates, self.by_name)
            state_vars = [self.by_name[n] for n in self.model] + [
                s for u in self.updates.values() for s in u.slots.values()] + list(self.powers.values()) + [
                self.global_step_var] + list(self.shadows.values())
            with tf1.name_scope("parity_setters/"):
                self.setters = {}
                for v in dict.fromkeys(state_vars):
                    ph = tf1.placeholder(v.dtype.base_dtype, v.shape)
                    self.setters[v.op.name] = (ph, v.assign(ph))
            self.init = tf1.global_variables_initializer()
            self.saver = tf1.train.Saver(var_list={n: self.by_name[n] for n in self.model})
            self.full_saver = tf1.train.Saver()  # every variable, as the programs' own Saver() saves
        self.sess = tf1.Session(graph=self.graph, config=harness_config(pair.legacy.session_config(flags, towers)))
        self.sess.run(self.init)
        for init in (lg.pipeline.initializer if lg.pipeline else ()):
            self.sess.run(init)
        first = next(iter(self.updates.values()))
        self.rule = optimizers.legacy_rule(first, self.sess)
        kinds = {u.rule for u in self.updates.values()}
        if len(kinds) > 1:
            raise HarnessError(f"the legacy graph updates its variables with several rules "
                               f"({', '.join(sorted(kinds))})")

    @property
    def global_step_var(self):
        gs = self.lg.global_step
        return self.by_name.get(gs.op.name, gs)

    # -- state -------------------------------------------------------------------------------
    def state(self) -> State:
        fetch = {"weights": {n: self.by_name[n] for n in self.model},
                 "slots": {n: dict(u.slots) for n, u in self.updates.items()},
                 "step": self.global_step_var, "shadows": dict(self.shadows)}
        out = self.sess.run(fetch)
        return State(out["weights"], out["slots"], int(out["step"]), out["shadows"] or None)

    def set_state(self, state: State, powers=True):
        """Set every variable of `state`; with `powers`, Adam's beta powers to beta^(step + 1),
        what `step` steps leave in them."""
        values = dict(state.weights)
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
        self.sess.run([self.setters[n][1] for n in values], {self.setters[n][0]: v for n, v in values.items()})

    def set_step(self, step):
        ph, op = self.setters[self.global_step_var.op.name]
        self.sess.run(op, {ph: step})

    def save(self, path) -> str:
        with self.graph.as_default():
            return self.saver.save(self.sess, path, write_meta_graph=False)

    # -- running -------------------------------------------------------------------------------
    def feed(self, batch: Batch, training: bool, masks=None, towers=None):
        """(feed_dict, TowerFeed) for `batch`, with `masks` imposed on the dropouts: masks[k][i] is
        dropout k's mask for tower i's rows (from `Sides.tower_masks`).  towers: (rows, weights)
        per tower, through LegacyGraph.feed_towers."""
        tf_ = self.lg.feed(batch, training)
        feed = dict(tf_.feed_dict)
        if towers is not None:
            if self.lg.feed_towers is None:
                raise HarnessError("this legacy graph has no feed_towers")
            feed = dict(self.lg.feed_towers(batch, towers[0], towers[1], training))
            tf_ = dataclasses.replace(tf_, feed_dict=feed, rows=list(towers[0]), weights=list(towers[1]))
        if masks is not None:
            for k, per_tower in enumerate(masks):
                for d in (d for d in self.dropouts if self.dropout_index(d) == k):
                    feed[d.noise] = per_tower[d.tower]
        return feed, tf_

    def dropout_index(self, dropout):
        """The position of a dropout among its tower's dropouts (k-th dropout of the network)."""
        same = [d for d in self.dropouts if d.tower == dropout.tower]
        return same.index(dropout)

    def run(self, fetches, batch: Batch, training: bool, masks=None, towers=None):
        feed, _ = self.feed(batch, training, masks, towers)
        return self.sess.run(fetches, feed)

    def gradients(self, batch, masks=None, towers=None):
        """(combined loss, {name: averaged gradient}) of one fed batch in training mode."""
        loss, grads = self.run([self.lg.loss, [g for g, _ in self.lg.grads_and_vars]], batch, True, masks, towers)
        return float(loss), dict(zip(self.trainable, grads))

    def train(self, batch, masks=None, towers=None):
        """One training step (the program's train_op): (loss, lr, gradients, batch statistics)."""
        loss, lr, grads, stats, _ = self.run(
            [self.lg.loss, self.lg.learning_rate, [g for g, _ in self.lg.grads_and_vars], self.taps,
             self.lg.train_op], batch, True, masks, towers)
        return float(loss), float(lr), dict(zip(self.trainable, grads)), stats

    def moving_decays(self):
        """{moving statistic's name: the decay its updates use in training}, read once."""
        if self._decays is None:
            first = {}
            for u in self.moving:
                first.setdefault(u.variable.op.name, u)
            feed, _ = self.feed(self.pair.data.batch(self.pair.rows_per_tower * self.towers, 0), True)
            values = self.sess.run({n: u.one_minus_decay for n, u in first.items()}, feed)
            self._decays = {n: 1 - float(v) for n, v in values.items()}
        return self._decays

    _decays = None

    def learning_rate_at(self, step):
        """The legacy rate at a global step (its tensor evaluated without its control dependencies)."""
        if self._lr_at is None:
            self._lr_at = tf1_graph.StepFunction(self.graph, self.lg.learning_rate, self.global_step_var, self.sess)
        return self._lr_at(step)

    _lr_at = None

    def close(self):
        self.sess.close()


def harness_config(config):
    """The program's session config, with grappler's constant folding off.  The harness feeds its rows
    in place of tensors the program computes (an iterator's get_next()); constant folding would fold
    the static shape of such a tensor into a constant that keeps a control edge to the op that made it,
    and so pull the program's input stream on every fetch that takes a gradient through a convolution.
    Folding changes no value the graph computes."""
    config = tf1.ConfigProto.FromString(config.SerializeToString())
    rewrite = config.graph_options.rewrite_options
    rewrite.constant_folding = rewrite.OFF  # the RewriterConfig enum, as the message exposes it
    return config


def powers_of(updates, by_name):
    """Adam's running beta powers (TF1 keeps them as variables, read by every Adam update op)."""
    out = {}
    for u in updates.values():
        if u.rule == "adam":
            for key in ("beta1_power", "beta2_power"):
                var = tf1_graph.variable_of(u.inputs[key], by_name)
                if var is not None:
                    out[key] = var
    return out


def check_graph(lg: LegacyGraph, towers: int):
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


# ---------------------------------------------------------------------------------------------
# The modern side

class ModernRun:
    """The port's model, optimizer and steps (the adapter's ModernBuild) under its strategy."""

    def __init__(self, pair: Pair, flags, strategy, files, legacy: LegacyRun):
        self.pair, self.flags, self.strategy = pair, flags, strategy
        with strategy.scope():
            build = pair.modern.build(flags, strategy, files)
        if not isinstance(build, ModernBuild):
            raise HarnessError(f"{type(pair.modern).__name__}.build returned {type(build).__name__}, "
                               f"not a compare.interface.ModernBuild")
        self.build = build
        self.model, self.optimizer = build.model, build.optimizer
        self.names = dict(build.variables) if build.variables is not None else default_variable_map(
            legacy, self.model)
        check_variable_map(self.names, legacy, self.model)
        self.rule = optimizers.modern_rule(self.optimizer)
        by_id = {id(v): n for n, v in self.names.items()}
        self.trainable = [by_id.get(id(v)) for v in self.model.trainable_variables]
        self.slots = {n: keras_adapter.optimizer_slots(self.optimizer, self.names[n]) for n in legacy.trainable}
        layers = keras_adapter.all_layers(self.model)
        self.dropouts = [layer for layer in layers if isinstance(layer, keras.layers.Dropout)]
        self.batch_norms = [layer for layer in layers if isinstance(layer, keras.layers.BatchNormalization)]
        self.seeds = [layer.seed_generator.state for layer in layers
                      if isinstance(getattr(layer, "seed_generator", None), keras.random.SeedGenerator)]
        self.shadows = dict(build.shadows) if build.shadows is not None else {}
        self.mask_shapes = [tuple(d.noise.shape[1:]) for d in legacy.dropouts if d.tower == 0]
        self._draw = None

    def predict(self, x):
        out = self.build.predict(x) if self.build.predict is not None else self.model(x, training=False)
        return np.asarray(out)

    # -- state -------------------------------------------------------------------------------
    def set_state(self, state: State, lr: float):
        """Assign `state` (TF1 names and parameterisation) to every replica's copy of each variable;
        `lr` is the rate of the step about to run (for slots whose parameterisation depends on it)."""
        self.state_lr = lr
        pairs = [(self.names[n], state.weights[n]) for n in state.weights]
        for n, slots in state.slots.items():
            for key, value in optimizers.modern_slots_from_legacy(self.rule, slots, lr).items():
                pairs.append((self.slots[n][key], value))
        pairs.append((self.optimizer.iterations, np.int64(state.step)))
        if state.shadows and self.shadows:
            pairs += [(self.shadows[n], v) for n, v in state.shadows.items()]
        for target, value in pairs:
            assign_everywhere(target, value)

    def weights(self, names):
        return {n: np.asarray(self.names[n].numpy()) for n in names}

    def slot_values(self, names):
        return {n: {k: np.asarray(v.numpy()) for k, v in self.slots[n].items()} for n in names}

    def shadow_values(self):
        return {n: np.asarray(v.numpy()) for n, v in self.shadows.items()}

    def iterations(self):
        return int(self.optimizer.iterations.numpy())

    # -- one step ------------------------------------------------------------------------------
    def distribute(self, batch: Batch):
        """(the distributed element for `batch`, each replica's (x, y, weights) as numpy)."""
        element = self.build.distribute(batch)
        parts = [common.local(self.strategy, t) for t in element]
        weights = parts[2] if len(parts) > 2 else [np.ones(len(x), np.float32) for x in parts[0]]
        return element, [(x, y, w) for x, y, w in zip(parts[0], parts[1], weights)]

    def draw_masks(self, element):
        """masks[k][r]: the mask dropout layer k will draw on replica r in the next training step
        (1 kept, 0 dropped); the layers' seeds are put back, so the step draws the same masks."""
        if not self.dropouts:
            return []
        if len(self.mask_shapes) != len(self.dropouts):
            raise HarnessError(f"the legacy towers have {len(self.mask_shapes)} dropouts, the model "
                               f"{len(self.dropouts)} Dropout layers: the masks cannot be matched")
        if self._draw is None:
            layers, shapes = self.dropouts, self.mask_shapes

            @tf.function(reduce_retracing=True)
            def draw(dist):
                def replica(x, *_):
                    rows = tf.shape(x)[0]
                    return [layer(tf.ones(tf.concat([[rows], shape], 0)), training=True)
                            for layer, shape in zip(layers, shapes)]
                with self.strategy.scope():
                    return self.strategy.run(replica, args=dist)
            self._draw = draw
        before = [s.numpy() for s in self.seeds]
        drawn = self._draw(element)
        for s, value in zip(self.seeds, before):
            s.assign(value)
        return [[(m != 0).astype(np.float32) for m in common.local(self.strategy, per_layer)] for per_layer in drawn]

    def step(self, batch: Batch, before: Optional[State] = None):
        """One training step of the port on `batch`: a dict of loss, gradients by TF1 name, the
        rate the step used, the masks it drew and each replica's rows.

        before: the state the step starts from (set by the caller), for gradients read back out
        of the update when the step does not return them."""
        element, replicas = self.distribute(batch)
        masks = self.draw_masks(element)
        lr = float(np.asarray(self.optimizer.learning_rate))  # the schedule at iterations, before the update
        if before is None:
            before = self.snapshot()
        result = self.build.train_step(element)
        if result.gradients is not None:
            grads = {n: np.asarray(g) for n, g in zip(self.trainable, result.gradients) if n is not None}
            source = "returned by the train step"
        else:
            after_w = self.weights(before.slots)
            after_s = self.slot_values(before.slots)
            grads = dict(zip(list(before.slots), common.parallel_map(lambda n: optimizers.gradients_from_slots(
                self.rule, self.with_w(before, n), dict(after_s[n], w=after_w[n]), lr), list(before.slots))))
            source = f"read back from the update ({self.rule.describe()})"
        return {"loss": float(result.loss), "gradients": grads, "lr": lr, "masks": masks,
                "replicas": replicas, "source": source}

    def with_w(self, state: State, n):
        slots = optimizers.modern_slots_from_legacy(self.rule, state.slots[n], self.state_lr)
        return dict(slots, w=state.weights[n])

    def snapshot(self) -> State:
        names = [n for n in self.trainable if n is not None]
        slots = {n: self.legacy_slots(n) for n in names}
        return State(self.weights(self.names), slots, self.iterations(), self.shadow_values() or None)

    def legacy_slots(self, n):
        values = {k: np.asarray(v.numpy()) for k, v in self.slots[n].items()}
        if self.rule.rule == "momentum":
            return {"accum": values["momentum"] / -np.float32(self.state_lr)}
        return values

    state_lr = 1.0


def assign_everywhere(target, value):
    """Assign a value to every replica's copy of a (Keras or tf) variable, one host copy for all."""
    variable = target.value if isinstance(target, keras.Variable) else target
    copies = getattr(variable, "values", None) or (variable,)
    value = tf.constant(value) if len(copies) > 1 else value
    for copy in copies:
        with tf.device(copy.device):
            copy.assign(value)


def default_variable_map(legacy: LegacyRun, model) -> dict:
    """TF1 name -> model variable by creation order and shape: the legacy model variables (in the
    order the graph created them) against the model's weights (in the order Keras lists them)."""
    weights = model_weights(model)
    names = legacy.model
    if len(weights) != len(names):
        raise HarnessError(f"cannot pair the variables by creation order: the legacy graph has {len(names)} "
                           f"model variables, the model {len(weights)} weights (give ModernBuild.variables)")
    mismatched = [f"{n} {legacy.by_name[n].shape.as_list()} vs {w.path} {list(w.shape)}"
                  for n, w in zip(names, weights) if legacy.by_name[n].shape.as_list() != list(w.shape)]
    if mismatched:
        raise HarnessError("cannot pair the variables by creation order, shapes differ: " + "; ".join(mismatched[:6])
                           + " (give ModernBuild.variables, TF1 name -> variable)")
    return dict(zip(names, weights))


def model_weights(model):
    """The model's weights without the random-number state of its layers (a seed is not a weight)."""
    seeds = {id(layer.seed_generator.state) for layer in keras_adapter.all_layers(model)
             if isinstance(getattr(layer, "seed_generator", None), keras.random.SeedGenerator)}
    return [w for w in model.weights if id(w) not in seeds]


def check_variable_map(names, legacy: LegacyRun, model):
    """Every legacy model variable maps to exactly one model weight of its shape, and back."""
    problems = []
    missing = [n for n in legacy.model if n not in names]
    if missing:
        problems.append(f"legacy variables with no modern variable: {', '.join(missing[:6])}")
    unknown = [n for n in names if n not in legacy.by_name]
    if unknown:
        problems.append(f"names that are not legacy variables: {', '.join(unknown[:6])}")
    ids = [id(v) for v in names.values()]
    twice = sorted({n for n, v in names.items() if ids.count(id(v)) > 1})
    if twice:
        problems.append(f"legacy variables mapped to the same modern variable: {', '.join(twice[:6])}")
    shapes = [f"{n} {legacy.by_name[n].shape.as_list()} vs {list(v.shape)}" for n, v in names.items()
              if n in legacy.by_name and legacy.by_name[n].shape.as_list() != list(v.shape)]
    if shapes:
        problems.append(f"shapes differ: {'; '.join(shapes[:6])}")
    unmapped = [w.path for w in model_weights(model) if id(w) not in set(ids)]
    if unmapped:
        problems.append(f"model weights no legacy variable maps to: {', '.join(unmapped[:6])}")
    if problems:
        raise HarnessError("the variable map does not pair the two models one to one: " + "; ".join(problems))


# ---------------------------------------------------------------------------------------------
# Both sides

@dataclasses.dataclass
class Sides:
    pair: Pair
    pairing: Pairing
    towers: int
    legacy: LegacyRun
    modern: ModernRun
    files: Any
    tmp_dir: str
    seed: int
    start: State = None
    start_path: str = ""
    tolerances: dict = None
    spread: dict = None          # per gradient: the norm of the legacy program's repeat spread

    @property
    def label(self):
        return f"{self.pairing.label}: " if self.pairing.label else ""

    @property
    def rows(self):
        """The rows of one full batch of this pairing."""
        per = self.pair.rows_per_tower
        return per if self.pairing.same_rows_on_every_tower else per * self.towers

    def batch(self, rows=None, seed=0) -> Batch:
        return self.pair.data.batch(self.rows if rows is None else rows, self.seed * 1000 + seed)

    def tower_masks(self, batch: Batch, feed_rows, step_masks, replicas):
        """The modern step's masks, per dropout and legacy tower, for the rows each tower sees.

        Tower i takes replica i's masks when replica i holds exactly tower i's rows (in order);
        otherwise each row takes the mask of its first copy on the modern side."""
        if not step_masks:
            return None
        held = [rows for rows, _ in replica_rows(batch, replicas)]
        first = {}
        for r, rows in enumerate(held):
            for j, b in enumerate(rows):
                first.setdefault(b, (r, j))
        out = []
        for per_replica in step_masks:
            per_tower = []
            for i, rows in enumerate(feed_rows):
                rows = list(np.asarray(rows).ravel())
                if i < len(held) and held[i] == rows:
                    per_tower.append(per_replica[i])
                else:
                    shape = per_replica[0].shape[1:]
                    picked = [per_replica[first[b][0]][first[b][1]] if b in first else np.ones(shape, np.float32)
                              for b in rows]
                    per_tower.append(np.stack(picked) if picked else np.zeros((0, *shape), np.float32))
            out.append(per_tower)
        return out

    def set_both(self, state: State):
        self.legacy.set_state(state)
        lr = self.legacy.learning_rate_at(state.step)
        self.legacy.set_step(state.step)
        self.modern.set_state(state, lr)
        return lr

    def close(self):
        self.legacy.close()


def row_key(x, y):
    return np.ascontiguousarray(x).tobytes() + np.ascontiguousarray(y).tobytes()


def row_index(batch: Batch):
    return {row_key(batch.x[i], batch.y[i]): i for i in range(batch.rows)}


def replica_rows(batch: Batch, replicas):
    """Each modern replica's rows as indices into `batch` (-1: a row that is no row of it), with the
    replica's total weight."""
    index = row_index(batch)
    return [([index.get(row_key(x[j], y[j]), -1) for j in range(len(x))], float(np.sum(w))) for x, y, w in replicas]


def build(pair: Pair, pairing: Pairing, towers: int, files, tmp_dir: str, seed: int = 0,
          checkpoint: Optional[str] = None, start_path: Optional[str] = None, log=print,
          modern: Optional[ModernRun] = None) -> Sides:
    """Both sides of one pairing, from the same start: the legacy graph's fresh weights (moving
    statistics randomised: fresh ones, 0 and 1, would hide a wrong batch-norm epsilon or variance
    formula in inference mode), `checkpoint` (a TF1 checkpoint of the legacy program), or
    `start_path` (the start another pairing wrote).  `modern`: a ModernRun of another pairing with
    the same modern arguments, reused (the model and its traced steps do not depend on the legacy
    side's arguments)."""
    common_argv = tuple(pair.harness_argv(towers))
    legacy_flags = pair.legacy.parse_args([pair.legacy.tower_flag, str(towers), *common_argv, *pairing.legacy_argv])
    modern_flags = pair.modern.parse_args([pair.modern.replica_flag, str(towers), *common_argv, *pairing.modern_argv])
    log(f"{pair.name}: {pairing.label + ': ' if pairing.label else ''}building the legacy graph ({towers} towers)")
    legacy = LegacyRun(pair, legacy_flags, towers, files, seed)
    if modern is None:
        strategy = common.make_strategy(towers)
        log(f"{pair.name}: building the modern model ({towers} replicas)")
        modern = ModernRun(pair, modern_flags, strategy, files, legacy)
    else:
        check_variable_map(modern.names, legacy, modern.model)
    sides = Sides(pair, pairing, towers, legacy, modern, files, tmp_dir, seed)
    path = start_path or checkpoint
    if path:
        try:
            with legacy.graph.as_default():
                legacy.saver.restore(legacy.sess, path)
        except (tf.errors.OpError, ValueError) as e:
            legacy.close()
            raise HarnessError(f"the checkpoint {path} does not fit the legacy graph of {pair.name}: "
                               f"{str(e).strip().splitlines()[0][:200]}") from None
    elif legacy.moving:
        rng = np.random.RandomState(seed)
        weights = legacy.sess.run({n: legacy.by_name[n] for n in legacy.model})
        for u in {u.variable.op.name: u for u in legacy.moving}:
            shape = weights[u].shape
            weights[u] = (rng.normal(0, 0.1, shape) if "mean" in u.rsplit("/", 1)[-1]
                          else rng.uniform(0.5, 1.5, shape)).astype(np.float32)
        legacy.sess.run([legacy.setters[n][1] for n in weights], {legacy.setters[n][0]: v for n, v in weights.items()})
    sides.start_path = start_path or legacy.save(os.path.join(tmp_dir, f"{pair.name}_start.ckpt"))
    weights = legacy.sess.run({n: legacy.by_name[n] for n in legacy.model})
    zero = {n: {k: np.zeros_like(weights[n]) for k in legacy.updates[n].slots} for n in legacy.trainable}
    sides.start = State(weights, zero, 0, {n: weights[n] for n in legacy.shadows} or None)
    return sides
