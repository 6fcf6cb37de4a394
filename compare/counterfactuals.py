"""Causes tried as counterfactuals on the original's graph.

Each entry here names one change the original's computation can be made to take, by feeding a
tensor of its graph its changed value, and runs the changed original for the symptom that parted
(its training loss, or the gradients its update receives) to compare with what the port computed:

  regulariser_scale  each tower's regularisation (the L2 terms its loss adds) times k
  loss_scale         each tower's data loss (its loss less those terms), or its whole loss, times a
  label_smoothing    the labels smoothed by e where they meet each tower's cross-entropy
  clip_per_replica   each tower's part of the gradient through the program's own clip alone, then
                     summed, where the program clips the towers' combined gradient

An entry declares the symptoms it can explain and the structure it needs (`Entry.needs`); `explain`
tries every entry whose structure the graph has, for the symptom, and reports the one that leaves
the smallest residual (its worst error over the check's own tolerance) as the likely cause when the
difference then vanishes, with its value, and the others with theirs.  The scalar (k, a, e) is
found by a one-dimensional search over the changed run (a coarse grid, then golden section), not
assumed to be a ratio.

The gradient symptoms go through what the program does between its towers' gradients and its
update, as the program does it: the changed towers' gradients, weighted as the program weights
them (TowerFeed.weights), are fed to the tensors it hands its clip (the averaged gradients of
`grads_and_vars`), and the gradients its update receives are read.  Before an entry is believed,
the unchanged towers through that path must give the program's own applied gradients; where they
do not, the program joins its towers some other way and no entry here applies.  The label
smoothing's gradient and loss are linear in e, so the search runs on two changed runs (e = 0 and
e = 1) and the value it finds is confirmed by a run of the original with exactly that change.

What no feed can make (a port-only property, such as a regulariser on a variable the original does
not regularise) stays with the closed forms of compare.causes, which `explain` tries after these.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from compare import causes, tf1_graph
from compare.interface import Batch
from compare.legacy_run import LegacyRun
from compare.measures import (SUMS, gradient_errors, legacy_regularisers, modern_regularisers, regularisation_term,
                              scales, search)
from compare.report import TensorError, tensor_error
from compare.sides import Sides
from compare.state import Arrays, Masks, State

tf1 = tf.compat.v1
CROSS_ENTROPIES = ("SoftmaxCrossEntropyWithLogits",)


@dataclasses.dataclass(frozen=True, eq=False)
class Symptom:
    """One training step that parted, from one state on one batch with the same dropout masks: the
    original's loss and the gradients its update received (as the check read them) and the port's;
    free: variables whose gradient is round-off only (compare.checks.forward.free_biases).
    Compared by identity: the checks that share one symptom share what was tried on it (`tried_on`)."""
    state: State
    batch: Batch
    masks: Masks
    legacy_loss: float
    legacy_gradients: Arrays
    modern_loss: float
    modern_gradients: Arrays
    free: Sequence[str] = ()


@dataclasses.dataclass(frozen=True)
class Tried:
    """What one entry tried: its value (None where it has no scalar), the worst error it left (of the
    loss and every gradient, each over its own tolerance) and that tolerance, and the change in words."""
    key: str
    value: Optional[float]
    error: float
    tolerance: float
    what: str

    @property
    def residual(self) -> float:
        return self.error / self.tolerance if self.tolerance > 0 else (0.0 if self.error == 0 else math.inf)

    def brief(self) -> str:
        value = "" if self.value is None else f" at {self.value:.4g}"
        return f"{self.key}{value} ({self.residual:.3g} x its tolerance)"


# ---------------------------------------------------------------------------------------------
# The original's structure: each tower's loss, its regularisation and data terms, its labels, and
# where its gradients enter the program's join

@dataclasses.dataclass
class TowerParts:
    """One tower of the original: its loss, the regularisation tensors and the data tensors its loss
    adds (the inputs of the sums where the L2 terms meet the rest; the loss itself where it adds
    none), the dense labels each of its cross-entropies takes, its own gradients of the loss and of
    the regularisation (built here), and the program's tensors where its gradient of each variable
    enters the join of the towers."""
    loss: Any
    regularisation: list[Any]
    data: list[Any]
    labels: list[Any]
    gradients: list[Any]
    reg_gradients: list[Any]
    entries: list[Any]


@dataclasses.dataclass
class Original:
    """The original's graph as the entries change it (`structure`, built once per LegacyRun)."""
    towers: list[TowerParts]
    why_not: str = ""  # where the towers' gradients cannot be fed to the program's join

    @property
    def regularised(self) -> bool:
        return all(t.regularisation for t in self.towers)

    @property
    def joined(self) -> bool:
        return all(t.data for t in self.towers)

    @property
    def smoothable(self) -> bool:
        return all(t.labels for t in self.towers)


_STRUCTURES: "weakref.WeakKeyDictionary[LegacyRun, Original]" = weakref.WeakKeyDictionary()


def joins(loss: Any) -> tuple[list[Any], list[Any]]:
    """(regularisation tensors, data tensors): the inputs of each sum among `loss`'s ops (and its own)
    that adds L2 terms (compare.measures.regularisation_term) to something that is none."""
    known: dict[Any, bool] = {}
    reg, data = [], []
    for op in tf1_graph.ancestors([loss]) | {loss.op}:
        if op.type not in SUMS or "gradients" in op.name:
            continue
        terms = [regularisation_term(t, known) for t in op.inputs]
        if any(terms) and not all(terms):
            reg += [t for t, is_term in zip(op.inputs, terms) if is_term]
            data += [t for t, is_term in zip(op.inputs, terms) if not is_term]
    return reg, data


def owners(ops: Sequence[Any], towers: tf1_graph.Towers) -> dict[Any, frozenset[int]]:
    """{op: the towers whose own ops it depends on}, over `ops` and their ancestors."""
    out: dict[Any, frozenset[int]] = {}
    stack = [(op, False) for op in ops]
    while stack:
        op, ready = stack.pop()
        if op in out:
            continue
        inputs = [i.op for i in op.inputs] + list(op.control_inputs)
        if not ready:
            stack.append((op, True))
            stack += [(i, False) for i in inputs if i not in out]
            continue
        own = towers.of(op)
        out[op] = frozenset().union(*(out[i] for i in inputs), {own} if own is not None else set())
    return out


def entry_points(applied: Any, size: int, towers: int, owned: dict[Any, frozenset[int]]) -> Optional[list[Any]]:
    """The tensors, one per tower, where the towers' gradients of one variable (`size` elements) meet:
    the inputs of the op nearest the update that takes one input from each tower alone, found by
    walking back from what the update receives through tensors of the variable's size (or N times it,
    a stack of the towers' gradients)."""
    every = frozenset(range(towers))
    stack, seen = [applied.op], set()
    while stack:
        op = stack.pop(0)
        if op in seen or owned.get(op) != every:
            continue
        seen.add(op)
        alone = {next(iter(owned[i.op])): i for i in op.inputs if len(owned[i.op]) == 1}
        if len(alone) == towers:
            return [alone[k] for k in range(towers)]
        for i in op.inputs:
            n = i.shape.num_elements()
            if n is None or n in (size, towers * size):
                stack.append(i.op)
    return None


def gradient_of(applied: Any, size: int) -> Optional[Any]:
    """One tower's program: the tensor where its gradient of one variable (`size` elements) leaves the
    backward pass on its way to the update (through a clip, a scale), found by walking back from what
    the update receives through tensors of that size to the first an op of a `gradients` scope makes."""
    stack, seen = [applied], set()
    while stack:
        t = stack.pop(0)
        if t.ref() in seen:
            continue
        seen.add(t.ref())
        if "gradients" in t.op.name.split("/"):
            return t
        stack += [i for i in t.op.inputs if i.dtype.is_floating and i.shape.num_elements() == size]
    return None


def dense(y: Any, variables: Sequence[Any]) -> list[Any]:
    """d y / d each variable, zeros where y does not depend on it."""
    return [g if g is not None else tf.zeros_like(v) for g, v in zip(tf1.gradients(y, variables), variables)]


def structure(legacy: LegacyRun) -> Original:
    """The original's towers, their terms and where their gradients join, found by structure (cached)."""
    if legacy in _STRUCTURES:
        return _STRUCTURES[legacy]
    lg, n = legacy.lg, len(legacy.lg.tower_losses)
    variables = [legacy.by_name[name] for name in legacy.trainable]
    why_not = ""
    if n > 1:
        owned = owners([a.op for a in legacy.applied], tf1_graph.Towers(lg.tower_losses))
        points = [entry_points(a, int(np.prod(v.shape)), n, owned) for a, v in zip(legacy.applied, variables)]
        missing = [name for name, p in zip(legacy.trainable, points) if p is None]
        if missing:
            why_not = f"no op joins the towers' gradients of {missing[0]} on its way to the update"
    else:  # one tower: where its gradients leave the backward pass (a clip between them and the update ran)
        points = [[g] if (g := gradient_of(a, int(np.prod(v.shape)))) is not None else None
                  for a, v in zip(legacy.applied, variables)]
        if any(p is None for p in points):
            points = [None] * len(variables)
    towers = []
    with legacy.graph.as_default(), tf1.name_scope("parity_counterfactuals/"):
        for i, loss in enumerate(lg.tower_losses):
            reg, data = joins(loss)
            data = data or [loss]  # a loss that adds no L2 terms is its data loss whole
            labels = [op.inputs[1] for op in tf1_graph.ancestors([loss]) if op.type in CROSS_ENTROPIES]
            copies = [legacy.replica_copy(name, i) for name in legacy.trainable]
            reg_grads = dense(tf.add_n([tf.reduce_sum(r) for r in reg]), copies) if reg else \
                [tf.zeros_like(v) for v in copies]
            entries = [p[i] if p is not None else None for p in points]
            towers.append(TowerParts(loss, reg, data, labels, dense(loss, copies), reg_grads, entries))
    _STRUCTURES[legacy] = Original(towers, why_not)
    return _STRUCTURES[legacy]


# ---------------------------------------------------------------------------------------------
# Running the changed original

Gradients = dict[str, np.ndarray]


class Trial:
    """One symptom on the original's graph: its unchanged parts read once, and the runs each entry
    makes of it with one change.  A changed run's towers' gradients are fed where the program joins
    them (each tower's entry point, scaled as the program scales it there), and the program's own
    join and clip make what its update would receive."""

    def __init__(self, sides: Sides, symptom: Symptom) -> None:
        self.sides, self.symptom = sides, symptom
        self.legacy = sides.legacy
        self.original = structure(self.legacy)
        self.legacy.restore(symptom.state)
        self.fed = self.legacy.feed(symptom.batch, True, symptom.masks)
        self.names = list(self.legacy.trainable)
        self.tol = sides.tol.model.rel_l2
        towers = self.original.towers
        base = self.run([[t.gradients, t.reg_gradients, t.regularisation, t.data, t.labels, t.loss,
                          [e for e in t.entries if e is not None]] for t in towers])
        self.grads = [self.arrays(b[0]) for b in base]
        self.reg_grads = [self.arrays(b[1]) for b in base]
        self.reg_values, self.data_values, self.label_values = ([b[k] for b in base] for k in (2, 3, 4))
        self.loss_values = [b[5] for b in base]
        # Where the program scales a tower's gradient before it joins the others (a weight): the scale.
        self.fed_at = all(e is not None for t in towers for e in t.entries)
        self.scales = [self.scale(g, b[6]) for g, b in zip(self.grads, base)] if self.fed_at else []

    def run(self, fetches: Any, changes: Optional[dict] = None) -> Any:
        return self.legacy.sess.run(fetches, {**self.fed.feed_dict, **(changes or {})})

    def arrays(self, values: Sequence[np.ndarray]) -> Gradients:
        return {n: np.asarray(v, np.float64) for n, v in zip(self.names, values)}

    def scale(self, grads: Gradients, entered: Sequence[np.ndarray]) -> Optional[float]:
        """c where what enters the join is c times the tower's gradient (within the model tolerance)."""
        g = np.concatenate([grads[n].ravel() for n in self.names])
        p = np.concatenate([np.asarray(e, np.float64).ravel() for e in entered])
        c = float(g @ p) / max(float(g @ g), 1e-300)
        return c if float(np.linalg.norm(p - c * g)) <= self.tol * max(float(np.linalg.norm(p)), 1e-30) else None

    @property
    def why_not(self) -> str:
        if self.original.why_not:
            return self.original.why_not
        if any(c is None for c in self.scales):
            return "what enters the program's join is not a multiple of a tower's gradient of its loss"
        return ""

    def applied(self, parts: Sequence[Gradients]) -> Gradients:
        """What the program's update receives where tower i's gradients are parts[i]."""
        if not self.fed_at:  # one tower handing its update its gradient as it is (`reproduces` tells)
            return parts[0]
        feed = {}
        for tower, c, part in zip(self.original.towers, self.scales, parts):
            for n, e in zip(self.names, tower.entries):
                feed[e] = np.reshape(c * part[n], e.shape).astype(np.float32)
        return self.arrays(self.run(self.legacy.applied, feed))

    def loss(self, changes: dict) -> float:
        return float(self.run(self.legacy.lg.loss, changes))

    def loss_scaled(self, tensors: Sequence[Sequence[Any]], values: Sequence[Sequence[np.ndarray]], a: float) -> float:
        """The original's loss with each of its towers' `tensors` fed a times its value."""
        return self.loss({t: a * np.asarray(v) for ts, vs in zip(tensors, values) for t, v in zip(ts, vs)})

    def applied_with(self, a: float, b: float) -> Gradients:
        """What the update receives where each tower's gradient is a times its data term's plus b times
        its regularisation's."""
        return self.applied([{v: a * (g[v] - r[v]) + b * r[v] for v in g} for g, r in zip(self.grads, self.reg_grads)])

    # -- judging a changed run against the port ---------------------------------------------------

    def gap(self, loss: float, gradients: Gradients) -> tuple[float, float]:
        """(worst error, its tolerance) of a changed original against the port, as the checks judge
        them: the loss at the model tolerance, each gradient at its own."""
        errors = [tensor_error("loss", np.float64(loss), np.float64(self.symptom.modern_loss))]
        errors += gradient_errors(self.sides, gradients, self.symptom.modern_gradients, free=self.symptom.free)
        w = worst(errors, self.tol)
        return w.rel_l2, w.limit(self.tol)

    def distance(self, loss: float, gradients: Gradients) -> float:
        """The search's measure: the larger of the loss's relative distance and all gradients' together."""
        modern = self.symptom.modern_gradients
        num = sum(float(np.sum(np.square(gradients[n] - np.asarray(modern[n], np.float64)))) for n in self.names)
        den = sum(float(np.sum(np.square(np.asarray(modern[n], np.float64)))) for n in self.names)
        ref = abs(self.symptom.modern_loss)
        return max(math.sqrt(num / max(den, 1e-300)), abs(loss - self.symptom.modern_loss) / max(ref, 1e-30))

    def reproduces(self) -> tuple[bool, float, float]:
        """Whether the unchanged towers, fed where the program joins them, give the loss and the
        gradients its update received (the path every entry goes through)."""
        errors = [tensor_error("loss", np.float64(self.loss({})), np.float64(self.symptom.legacy_loss))]
        errors += gradient_errors(self.sides, self.unchanged, self.symptom.legacy_gradients, free=self.symptom.free)
        w = worst(errors, self.tol)
        return all(e.rel_l2 <= e.limit(self.tol) for e in errors), w.rel_l2, w.limit(self.tol)

    @functools.cached_property
    def unchanged(self) -> Gradients:
        """What the update receives from the unchanged towers, fed where the program joins them."""
        return self.applied(self.grads)


def worst(errors: Sequence[TensorError], tol: float) -> TensorError:
    """The error that is the most over its own limit (the largest where a limit is 0)."""
    return max(errors, key=lambda e: e.rel_l2 / e.limit(tol) if e.limit(tol) > 0 else e.rel_l2)


def ratio(value: float, towers: int) -> str:
    """A scale in words: 'N times', '1/N of', or the number."""
    if towers > 1 and abs(value - towers) <= 1e-3 * towers:
        return f"{towers} times"
    if towers > 1 and abs(value * towers - 1) <= 1e-3:
        return f"1/{towers} of"
    return f"{value:.4g} times"


def tried(trial: Trial, key: str, changed: Callable[[float], tuple[float, Gradients]], grid: Sequence[float],
          what: Callable[[float], str]) -> Tried:
    """An entry with a scalar: `changed(v)` -> the changed original's (loss, applied gradients); v found
    by `search` over `grid`, and judged as the checks judge."""
    v = search(lambda v: trial.distance(*changed(v)), grid)
    return Tried(key, v, *trial.gap(*changed(v)), what(v))


# ---------------------------------------------------------------------------------------------
# The entries

@dataclasses.dataclass(frozen=True)
class Entry:
    """One counterfactual: the catalogue key it tries, the structure it needs (Original -> None where
    the graph has it, else why not), and the run (Trial -> Tried)."""
    key: str
    needs: Callable[[Original], Optional[str]]
    run: Callable[[Trial], Tried]


def needs_regularisation(o: Original) -> Optional[str]:
    return None if o.regularised and o.joined else "no tower's loss adds L2 terms to a data loss"


def needs_join(o: Original) -> Optional[str]:
    return None if o.joined else "no tower's data loss found"


def needs_labels(o: Original) -> Optional[str]:
    return None if o.smoothable else "no tower's cross-entropy takes dense labels"


def needs_towers(o: Original) -> Optional[str]:
    return None if len(o.towers) > 1 else "one tower"


def coefficients(trial: Trial) -> tuple[str, Optional[float]]:
    """The L2 coefficients each side gives (c in c sum(w^2)) in words, where the port declares
    regularisers, and the one ratio of the port's to the original's where there is one."""
    reg_l, added = legacy_regularisers(trial.sides)
    reg_m, _ = modern_regularisers(trial.sides)
    names = [n for n in trial.names if n in reg_m or n in reg_l]
    if not reg_m or not names:
        return "", None
    original = {n: reg_l.get(n, 0.0) if n in added else 0.0 for n in names}
    pairs = sorted({f"{reg_m.get(n, 0.0):g} against {original[n]:g}" for n in names})
    ratios = {round(reg_m.get(n, 0.0) / original[n], 4) if original[n] else None for n in names}
    one = next(iter(ratios)) if len(ratios) == 1 else None
    return f"the port's L2 coefficient{'s' if len(names) > 1 else ''} {', '.join(pairs)} (c in c sum(w^2)); ", one


def regulariser_scale(trial: Trial) -> Tried:
    """Each tower's regularisation times k (a port that counts its regularisers k times as often:
    Keras' L2(wd) for l2_loss's wd / 2 is k = 2, model.losses added in every replica is k = N)."""
    n = len(trial.original.towers)

    def changed(k: float) -> tuple[float, Gradients]:
        return (trial.loss_scaled([t.regularisation for t in trial.original.towers], trial.reg_values, k),
                trial.applied_with(1.0, k))

    def what(k: float) -> str:
        words, coefficient = coefficients(trial)
        close = lambda x: x is not None and abs(k - x) <= 1e-3 * max(abs(x), 1.0)  # noqa: E731
        how = (" (the port's coefficients that many times the original's)" if close(coefficient) and coefficient != 1
               else f" (its regularisation added once per replica, {n})" if n > 1 and close(float(n))
               else " (its regularisation not added at all)" if close(0.0) else "")
        return f"{words}the original run with each tower's regularisation times {k:.4g}{how}"
    return tried(trial, "regulariser_scale", changed, [0.0] + scales(n), what)


def loss_scale(trial: Trial) -> Tried:
    """Each tower's data loss times a (a mean over each replica's own rows summed over the replicas
    is a = N), or its whole loss: whichever leaves less."""
    n = len(trial.original.towers)
    towers = trial.original.towers

    def data(a: float) -> tuple[float, Gradients]:
        return trial.loss_scaled([t.data for t in towers], trial.data_values, a), trial.applied_with(a, 1.0)

    def whole(a: float) -> tuple[float, Gradients]:
        return trial.loss_scaled([[t.loss] for t in towers], [[v] for v in trial.loss_values], a), \
            trial.applied_with(a, a)

    def what(part: str) -> Callable[[float], str]:
        return lambda a: f"the port's {part} {ratio(a, n)} the original's: the original run with each tower's {part} " \
                         f"times {a:.4g}"
    parts = (("data loss (its loss less its regularisation)", data), ("whole loss", whole))
    found = [tried(trial, "loss_scale", changed, scales(n), what(part))
             for part, changed in (parts if trial.original.regularised else parts[1:])]
    return min(found, key=lambda t: t.residual)


def label_smoothing(trial: Trial) -> Tried:
    """The labels smoothed by e where they meet each tower's cross-entropy, y (1 - e) + e / K for the
    one-hot y the original's labels are (their largest entry): the loss and the gradients are linear
    in the labels, so two changed runs (e = 0, e = 1) give every e; the e found is run as it is."""
    towers = trial.original.towers
    onehots = [[np.eye(v.shape[-1])[np.argmax(v, axis=-1)] for v in values] for values in trial.label_values]
    first = np.asarray(trial.label_values[0][0], np.float64)
    k = first.shape[-1]
    own = float(np.mean(1 - first.max(axis=-1)) * k / (k - 1))

    def changes(e: float) -> dict:
        return {t: (y * (1 - e) + e / k).astype(np.float32) for tower, ys in zip(towers, onehots)
                for t, y in zip(tower.labels, ys)}
    ends = [trial.run([trial.legacy.lg.loss, [t.gradients for t in towers]], changes(e)) for e in (0.0, 1.0)]
    losses = [float(end[0]) for end in ends]
    grads = [[trial.arrays(g) for g in end[1]] for end in ends]

    def linear(e: float) -> tuple[float, Gradients]:
        return (losses[0] + e * (losses[1] - losses[0]),
                trial.applied([{v: g0[v] + e * (g1[v] - g0[v]) for v in g0} for g0, g1 in zip(*grads)]))
    e = search(lambda e: trial.distance(*linear(e)), list(np.linspace(0, 1, 21)))
    loss, applied = trial.run([trial.legacy.lg.loss, trial.legacy.applied], changes(e))  # the program's own run
    return Tried("label_smoothing", e, *trial.gap(float(loss), trial.arrays(applied)),
                 f"the port's label smoothing {e - own:+.3g} from the original's: the original run with its labels "
                 f"smoothed by {e:.3g} (its own {own:.3g}) where they meet its cross-entropy")


def clip_per_replica(trial: Trial) -> Tried:
    """Each tower's part of what the update receives made alone (the others' gradients fed as zeros
    to the program's join and clip), the parts then summed: a port that clips each replica's
    gradient before the sum, where the original clips what the towers' gradients join into."""
    zeros = [{v: np.zeros_like(g[v]) for v in g} for g in trial.grads]
    parts = [trial.applied([g if j == i else zeros[j] for j in range(len(zeros))]) for i, g in enumerate(trial.grads)]
    return Tried("clip_per_replica", None, *trial.gap(trial.symptom.legacy_loss,
                                                     {v: np.sum([p[v] for p in parts], axis=0) for v in trial.names}),
                 f"each of the {len(parts)} replicas' parts clipped by the original's own clip alone, then summed "
                 f"(the original clips what their gradients join into)")


ENTRIES: tuple[Entry, ...] = (
    Entry("regulariser_scale", needs_regularisation, regulariser_scale),
    Entry("loss_scale", needs_join, loss_scale),
    Entry("label_smoothing", needs_labels, label_smoothing),
    Entry("clip_per_replica", needs_towers, clip_per_replica),
)


# ---------------------------------------------------------------------------------------------
# The diagnosis

def tried_on(sides: Sides, symptom: Symptom) -> tuple[list[Tried], str]:
    """Every entry that applies, run on `symptom`: (what each tried, best first; why none applies)."""
    original = structure(sides.legacy)
    entries = [e for e in ENTRIES if e.needs(original) is None]
    if original.why_not or not entries:
        return [], original.why_not or "no entry's structure is in the original's graph"
    trial = Trial(sides, symptom)
    try:
        if trial.why_not:
            return [], trial.why_not
        ok, error, tol = trial.reproduces()
        if not ok:
            return [], (f"the towers fed where the program joins them do not give its loss and applied gradients "
                        f"({error:.3g} against {tol:.3g})")
        error, limit = trial.gap(symptom.legacy_loss, trial.unchanged)
        if error <= limit:
            return [], "the unchanged original already agrees with the port"
        return sorted((e.run(trial) for e in entries), key=lambda t: t.residual), ""
    finally:
        sides.legacy.restore(symptom.state)


_TRIED: "weakref.WeakKeyDictionary[Symptom, tuple[list[Tried], str]]" = weakref.WeakKeyDictionary()


def explain(sides: Sides, symptom: Symptom, closed_forms: Callable[[], str]) -> str:
    """The report's cause line for `symptom`: the counterfactual that leaves the least, where the
    difference then vanishes, with the others tried; else the closed forms on the port's own values
    (what no feed of the original's graph can change), with what the counterfactuals left."""
    if symptom not in _TRIED:  # a training step's loss and gradient checks share one symptom: tried once
        _TRIED[symptom] = tried_on(sides, symptom)
    found, why_not = _TRIED[symptom]
    if found and found[0].residual <= 1:
        best, others = found[0], found[1:]
        line = causes.likely(best.key, best.what, best.error, best.tolerance)
        return line + (f" Tried too: {'; '.join(t.brief() for t in others)}." if others else "")
    closed = closed_forms()
    if not closed.startswith(causes.UNEXPLAINED):  # a closed form named it: it says so, and why the graph did not
        why = (f"the changes of the original's graph left more: {', '.join(t.brief() for t in found)}" if found
               else f"no change of the original's graph is tried here: {why_not}")
        return f"{closed} (Found on the port's own values; {why}.)"
    tail = closed[len(causes.UNEXPLAINED):].strip()
    on_graph = (f"on the original's graph: {', '.join(t.brief() for t in found)}" if found else
                f"on the original's graph: none ({why_not})")
    return f"{causes.UNEXPLAINED} (tried {on_graph}; on the port's own values{': ' + tail if tail else ''})"
