"""The modern side of a pairing: the TF2 port's model, optimizer and steps under its strategy.

`ModernRun` builds the port with the adapter's `ModernSide.build`, pairs its variables with the legacy
graph's (by the adapter's map, or by creation order and shape), finds its dropout and batch-norm
layers by type, and answers the `compare.state.Run` verbs in TF1's names and parameterisation:

    state() / restore(state, lr)    every variable; Keras' momentum slot is -lr times TF1's accumulator
    step(batch, before)             the port's own train step on one batch -> StepOutcome, with the
                                    dropout masks it drew and each replica's rows
    predict(x)                      logits in inference mode

Dropout masks belong to rows: the modern step's masks are drawn by the model's own dropout layers
from the seed the step is about to use, the seeds then put back, so the step draws the same masks;
the legacy towers get the same masks for the same rows through their dropout noise.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import keras
import numpy as np
import tensorflow as tf

from compare import common
from compare import optimizers
from compare.interface import Batch, DataFiles, ModernBuild, Pair
from compare.legacy_run import HarnessError, LegacyRun
from compare.state import Arrays, Masks, ReplicaBatch, State, StepOutcome
from modern import keras_adapter


class ModernRun:
    """The port's model, optimizer and steps (the adapter's ModernBuild) under its strategy."""

    def __init__(self, pair: Pair, flags: Any, strategy: Any, files: DataFiles, legacy: LegacyRun):
        self.pair, self.flags = pair, flags
        if getattr(pair.modern, "makes_its_strategy", False):
            build = pair.modern.build(flags, None, files)
        else:
            with strategy.scope():
                build = pair.modern.build(flags, strategy, files)
        if not isinstance(build, ModernBuild):
            raise HarnessError(f"{type(pair.modern).__name__}.build returned {type(build).__name__}, "
                               f"not a compare.interface.ModernBuild")
        self.strategy = build.strategy if build.strategy is not None else strategy
        if self.strategy is None:
            raise HarnessError(f"{type(pair.modern).__name__} makes its own strategy but its build returned none")
        self.build = build
        self.model, self.optimizer = build.model, build.optimizer
        self.names = dict(build.variables) if build.variables is not None else default_variable_map(
            legacy, self.model)
        check_variable_map(self.names, legacy, self.model)
        self.rule = optimizers.modern_rule(self.optimizer)
        by_id = {id(v): n for n, v in self.names.items()}
        self.trainable = [by_id.get(id(v)) for v in self.model.trainable_variables]
        self.slots = {n: keras_adapter.optimizer_slots(self.optimizer, self.names[n], self.model.trainable_variables)
                      for n in legacy.trainable}
        layers = keras_adapter.all_layers(self.model)
        self.dropouts = [layer for layer in layers if isinstance(layer, keras.layers.Dropout)]
        self.batch_norms = [layer for layer in layers if isinstance(layer, keras.layers.BatchNormalization)]
        self.seeds = [layer.seed_generator.state for layer in layers
                      if isinstance(getattr(layer, "seed_generator", None), keras.random.SeedGenerator)]
        shadows = build.shadows(self.names) if callable(build.shadows) else build.shadows
        self.shadows = dict(shadows) if shadows is not None else {}
        self.mask_shapes = [tuple(d.noise.shape[1:]) for d in legacy.dropouts if d.tower == 0]
        self._draw: Any = None
        self._reads: dict[tuple[int, ...], Any] = {}  # variable list -> times read (1), or its reading function
        self.state_lr = 1.0
        # The port's optimizer state as it built it, before the harness sets anything (the
        # configuration check compares it with the legacy program's initial slots).
        self.fresh_slots = self.slot_values(legacy.trainable)
        # modern slot -> legacy slot, for an optimizer whose rule the harness does not know: found by
        # value when the steps check first compares the two (compare.checks.steps), else None.
        self.pairing: Optional[dict[str, str]] = None
        self.taps, self.tapped, self.tap_names = self.install_taps()
        self._tracing: Optional[common.Background] = None  # the trace `trace` started, once

    def install_taps(self) -> tuple[list[Any], Any, list[Optional[str]]]:
        """Keep the gradient each variable's update receives: the optimizer's `update_step` (Keras
        calls it once per variable and replica copy, with the all-reduced gradient, after any clipping
        it does itself) wrapped, before any step is traced, to copy it into a variable of its own.
        Returns (the copies in the optimizer's order, a count of the copies made, their TF1 names)."""
        optimizer = self.optimizer
        variables = keras_adapter.optimizer_order(optimizer)
        by_id = {id(v): n for n, v in self.names.items()}
        with tf.init_scope():
            taps = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in variables]
            tapped = tf.Variable(0, dtype=tf.int64, trainable=False)
        own = optimizer.__dict__.get("update_step")  # set on the instance before the harness came, if any

        def update_step(gradient: Any, variable: Any, learning_rate: Any) -> Any:
            index = keras_adapter.variable_index(optimizer, variable)
            taps[index].assign(tf.cast(gradient, taps[index].dtype))
            tapped.assign_add(1)
            # The class's update_step looked up when called (a change to the class after this is seen).
            rule = own if own is not None else functools.partial(type(optimizer).update_step, optimizer)
            return rule(gradient, variable, learning_rate)

        optimizer.update_step = update_step
        return taps, tapped, [by_id.get(id(v)) for v in variables]

    def trace(self) -> None:
        """The program's steps traced without running them, where its build says how
        (ModernBuild.trace), in a thread of their own from now until the first step (`traced`): a
        trace spends most of its time in TensorFlow's C++ (building and checking the graph's
        operations), without the GIL, beside the checks that come first.  After `install_taps`, whose
        wrapped update the trace must see."""
        if self.build.trace is not None and self._tracing is None:
            self._tracing = common.Background(self.build.trace, "modern-trace")

    def traced(self) -> None:
        """The trace `trace` started, finished (what it raised raised here, once)."""
        if self._tracing is not None:
            self._tracing.wait()

    def predict(self, x: np.ndarray) -> np.ndarray:
        out = self.build.predict(x) if self.build.predict is not None else self.model(x, training=False)
        return np.asarray(out)

    # -- state -------------------------------------------------------------------------------
    def restore(self, state: State, lr: Optional[float] = None) -> None:
        """Assign `state` (TF1 names and parameterisation) to every replica's copy of each variable;
        `lr` is the rate of the step about to run (for slots whose parameterisation depends on it)."""
        self.state_lr = 1.0 if lr is None else lr
        pairs = [(self.names[n], state.weights[n]) for n in state.weights]
        for n, slots in state.slots.items():
            for key, value in self.modern_slots(slots).items():
                pairs.append((self.slots[n][key], value))
        pairs.append((self.optimizer.iterations, np.int64(state.step)))
        if state.shadows and self.shadows:
            pairs += [(self.shadows[n], v) for n, v in state.shadows.items()]
        for target, value in pairs:
            assign_everywhere(target, value)

    def read(self, variables: list[Any]) -> list[np.ndarray]:
        """The values of `variables` (each one's first replica copy, which every copy equals between
        steps).  A list read again is read by one tf.function, traced at its second read: an eager
        read costs about a millisecond of dispatch a variable, hundreds of them a few ms in one call."""
        key = tuple(id(v) for v in variables)
        seen = self._reads.get(key)
        if seen is None:
            self._reads[key] = 1
            return [np.asarray(v.numpy()) for v in variables]
        if seen == 1:
            copies = [replica_variables(v)[0] for v in variables]
            self._reads[key] = tf.function(lambda: [c.read_value() for c in copies])
        return [np.asarray(t) for t in self._reads[key]()]

    def weights(self, names: Any) -> Arrays:
        names = list(names)
        return dict(zip(names, self.read([self.names[n] for n in names])))

    def slot_values(self, names: Any) -> dict[str, Arrays]:
        keys = [(n, k) for n in names for k in self.slots[n]]
        out: dict[str, Arrays] = {n: {} for n in names}
        for (n, k), value in zip(keys, self.read([self.slots[n][k] for n, k in keys])):
            out[n][k] = value
        return out

    def shadow_values(self) -> Arrays:
        return dict(zip(self.shadows, self.read(list(self.shadows.values()))))

    def iterations(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def state_snapshot(self) -> list[tuple[Any, list[np.ndarray]]]:
        """Every variable of the model and optimizer and every dropout seed, every replica's copy: what
        a call of the model outside a step may move (batch-norm statistics, seeds), to put back."""
        variables = list(self.model.variables) + list(self.optimizer.variables) + list(self.seeds)
        return [(v, replica_copies(v)) for v in variables]

    def restore_snapshot(self, snapshot: list[tuple[Any, list[np.ndarray]]]) -> None:
        for variable, copies in snapshot:
            for target, value in zip(replica_variables(variable), copies):
                target.assign(value)

    def state(self) -> State:
        names = [n for n in self.trainable if n is not None]
        slots = {n: self.legacy_slots_of(values) for n, values in self.slot_values(names).items()}
        return State(self.weights(self.names), slots, self.iterations(), self.shadow_values() or None)

    def legacy_slots_of(self, values: Arrays) -> Arrays:
        """The port's slots of a variable (its own names) in TF1's names and parameterisation."""
        if self.rule.known:
            try:
                return optimizers.legacy_slots_from_modern(self.rule, values, self.state_lr)
            except KeyError:
                return {}
        return {legacy: values[modern] for modern, legacy in (self.pairing or {}).items()}

    def modern_slots(self, legacy_slots: Arrays) -> Arrays:
        """The port's slots that continue a TF1 state: converted by the port's rule, or by the pairing
        found for a rule the harness does not know; {} where neither applies (the slots stay)."""
        if self.rule.known:
            try:
                return optimizers.modern_slots_from_legacy(self.rule, legacy_slots, self.state_lr)
            except KeyError:  # another rule's slots: the configuration check names the difference
                return {}
        return {modern: legacy_slots[legacy] for modern, legacy in (self.pairing or {}).items()
                if legacy in legacy_slots}

    # -- one step ------------------------------------------------------------------------------
    def distribute(self, batch: Batch) -> tuple[Any, list[ReplicaBatch]]:
        """(the distributed element for `batch`, each replica's rows as numpy)."""
        element = self.build.distribute(batch)
        parts = [common.local(self.strategy, t) for t in element]
        weights = parts[2] if len(parts) > 2 else [np.ones(len(x), np.float32) for x in parts[0]]
        return element, [ReplicaBatch(x, y, w) for x, y, w in zip(parts[0], parts[1], weights)]

    def draw_masks(self, element: Any) -> Masks:
        """masks[k][r]: the mask dropout layer k will draw on replica r in the next training step
        (1 kept, 0 dropped); the layers' seeds are put back, so the step draws the same masks."""
        if not self.dropouts:
            return []
        if len(self.mask_shapes) != len(self.dropouts):
            raise HarnessError(f"the legacy towers have {len(self.mask_shapes)} dropouts, the model "
                               f"{len(self.dropouts)} Dropout layers: the masks cannot be matched")
        if self._draw is None:
            self.traced()  # the strategy's replicas traced in one thread at a time
            layers, shapes = self.dropouts, self.mask_shapes

            @tf.function(reduce_retracing=True)
            def draw(dist: Any) -> Any:
                def replica(x: Any, *_: Any) -> list[Any]:
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

    def step(self, batch: Batch, before: Optional[State] = None) -> StepOutcome:
        """One training step of the port on `batch`: its loss, the gradients by TF1 name, the rate it
        used, the masks it drew and each replica's rows.

        before: the state the step starts from (set by the caller), for gradients read back out
        of the update when the step does not return them."""
        self.traced()
        element, replicas = self.distribute(batch)
        masks = self.draw_masks(element)
        lr = float(np.asarray(self.optimizer.learning_rate))  # the schedule at iterations, before the update
        if before is None:
            before = self.state()
        self.tapped.assign(0)
        result = self.build.train_step(element)
        if int(self.tapped.numpy()):
            grads = {n: g for n, g in zip(self.tap_names, self.read(self.taps)) if n is not None}
            source = "as the optimizer's update received them"
        elif result.gradients is not None:
            grads = {n: np.asarray(g) for n, g in zip(self.trainable, result.gradients) if n is not None}
            source = "returned by the train step"
        elif self.rule.rule in ("adam", "momentum", "sgd"):
            grads = self.gradients_from_update(before, lr)
            source = f"read back from the update ({self.rule.describe()})"
        else:
            raise HarnessError(f"the port's step neither returns its gradients nor calls its optimizer's update_step "
                               f"after the harness wrapped it ({self.rule.describe()}): give StepResult.gradients")
        return StepOutcome(float(result.loss), grads, lr=lr, masks=masks, replicas=replicas, source=source)

    def apply(self, gradients: Arrays) -> None:
        """The port's optimizer applies `gradients` (by TF1 name) once, as a step of the port applies
        them: from inside the replicas, replica 0 holding the gradients and the others zeros, so that
        the optimizer's own all-reduce (a sum) hands every copy of the weights exactly `gradients`."""
        self.traced()
        names = list(gradients)

        def values(context: Any) -> list[Any]:
            first = context.replica_id_in_sync_group == 0
            return [tf.constant(gradients[n]) if first else tf.zeros(np.shape(gradients[n]), tf.float32)
                    for n in names]

        variables = [self.names[n] for n in names]

        def replica(grads: Any) -> None:
            self.optimizer.apply_gradients(zip(grads, variables))

        # Eagerly: tracing it (every update under the strategy) costs more than the few calls a run makes.
        with self.strategy.scope():
            self.strategy.run(replica, args=(self.strategy.experimental_distribute_values_from_function(values),))

    def gradients_from_update(self, before: State, lr: float) -> Arrays:
        """The gradients the step just applied, read back from the weights and slots it changed."""
        names = list(before.slots)
        after_w, after_s = self.weights(names), self.slot_values(names)

        def one(n: str) -> np.ndarray:
            return optimizers.gradients_from_slots(self.rule, self.with_w(before, n), dict(after_s[n], w=after_w[n]),
                                                   lr)
        return {n: one(n) for n in names}

    def with_w(self, state: State, n: str) -> Arrays:
        return dict(self.modern_slots(state.slots[n]), w=state.weights[n])

    def close(self) -> None:
        """The trace, if one is still going, finished; nothing else to release: the model lives as
        long as the process."""
        if self._tracing is not None:
            self._tracing.join()


def replica_variables(variable: Any) -> list[Any]:
    """Every replica's copy of a (Keras or tf) variable, as tf variables (one where not mirrored)."""
    inner = variable.value if isinstance(variable, keras.Variable) else variable
    return list(getattr(inner, "values", None) or [inner])


def replica_copies(variable: Any) -> list[np.ndarray]:
    """Every replica's copy of a (Keras or tf) variable, as numpy."""
    return [v.numpy() for v in replica_variables(variable)]


def assign_everywhere(target: Any, value: Any) -> None:
    """Assign a value to every replica's copy of a (Keras or tf) variable, one host copy for all."""
    copies = replica_variables(target)
    value = tf.constant(value) if len(copies) > 1 else value
    for copy in copies:
        with tf.device(copy.device):
            copy.assign(value)


def default_variable_map(legacy: LegacyRun, model: Any) -> dict[str, Any]:
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


def model_weights(model: Any) -> list[Any]:
    """The model's weights without the random-number state of its layers (a seed is not a weight)."""
    seeds = {id(layer.seed_generator.state) for layer in keras_adapter.all_layers(model)
             if isinstance(getattr(layer, "seed_generator", None), keras.random.SeedGenerator)}
    return [w for w in model.weights if id(w) not in seeds]


def check_variable_map(names: dict[str, Any], legacy: LegacyRun, model: Any) -> None:
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
