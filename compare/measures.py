"""The measurements that the checks, the catalogue of causes and the tolerances share.

Each is a number about one built pairing (compare.sides.Sides) or about two sides' values, owned here
and not by a check, so that every layer above reads it the same way:

  gradients     per-variable errors of two sets of gradients, each against its own floor: its even
                share of the whole gradient's norm, a free bias's layer weight gradient, the legacy
                program's repeat spread (`grad_errors`, `gradient_errors`, `free_biases`)
  a step        the modern change of a tensor against the legacy change (`change_error`) and the
                rate each side used or would use (`rate`, `modern_rate_at`)
  regularisers  the L2 coefficient each side applies to every trainable variable, read off the TF1
                graph and off the Keras weights' regularisers (`legacy_regularisers`,
                `modern_regularisers`)
  a search      the one-dimensional search a counterfactual's scalar is found by (`search` over a
                grid such as `scales`, refined by `golden` section)
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from compare import tf1_graph
from compare.modern_run import ModernRun
from compare.report import EPS32, MARGIN, Sums, TensorError, errors_of, share_floors, tensor_error
from compare.sides import Sides
from compare.state import StepOutcome


# ---------------------------------------------------------------------------------------------
# Gradients

# A bias whose gradient is below this fraction of its layer's weight gradient holds round-off only:
# its true gradient is zero (a bias that feeds a batch norm in training mode: the normalisation
# subtracts it again).  Its round-off is the sum of its layer's output gradients, the same terms whose
# products with the inputs make the weight gradient, so it is judged against that weight gradient.
FREE = 1e-5


def sibling_weights(name: str, grads: Mapping[str, Any]) -> Optional[str]:
    """The weight (kernel) variable beside a bias, by TF1's naming: x/biases -> x/weights, x/bias -> x/kernel."""
    for bias, weights in (("/biases", "/weights"), ("/bias", "/kernel")):
        if name.endswith(bias) and name[:-len(bias)] + weights in grads:
            return name[:-len(bias)] + weights
    return None


def free_biases(grads: Mapping[str, Any]) -> list[str]:
    """The biases whose gradient (in `grads`, the legacy program's) is round-off only: below FREE
    times their layer's weight gradient."""
    out = []
    for n, g in grads.items():
        sibling = sibling_weights(n, grads)
        if sibling and (np.linalg.norm(np.asarray(g, np.float64))
                        <= FREE * np.linalg.norm(np.asarray(grads[sibling], np.float64))):
            out.append(n)
    return sorted(out)


def grad_errors(legacy: Mapping[str, Any], modern: Mapping[str, Any], names: Optional[Sequence[str]] = None,
                free: Optional[Sequence[str]] = None,
                extra: Optional[Mapping[str, float]] = None) -> list[TensorError]:
    """Per-variable errors, each relative to max(its own norm, its even share of the total norm,
    `extra`[name]) and, for a free bias (`free_biases` of the legacy gradients), its layer's weight
    gradient's norm."""
    names = sorted(names or legacy)
    floors = share_floors({n: modern[n] for n in names})
    for n in (free_biases(legacy) if free is None else free):
        sibling = sibling_weights(n, modern)
        if n in floors and sibling:
            floors[n] = max(floors[n], float(np.linalg.norm(np.asarray(modern[sibling], np.float64))))
    for n, floor in (extra or {}).items():
        if n in floors:
            floors[n] = max(floors[n], floor)
    return [tensor_error(n, legacy[n], modern[n], floors[n], variable=n) for n in names]


def gradient_errors(sides: Sides, legacy: Mapping[str, Any], modern: Mapping[str, Any],
                    free: Optional[Sequence[str]] = None) -> list[TensorError]:
    """grad_errors with each tensor's repeat spread as a floor: a gradient that differs by
    ||spread|| when the legacy program computes it twice may differ by MARGIN times that."""
    tol = sides.tol.model.rel_l2
    extra = {n: MARGIN * s / tol for n, s in sides.tol.spread.items() if s > 0}
    own = sides.tol.tensors
    return [dataclasses.replace(e, tolerance=own[e.name].rel_l2) if e.name in own else e
            for e in grad_errors(legacy, modern, free=free, extra=extra)]



# ---------------------------------------------------------------------------------------------
# A step

def modern_rate_at(modern: ModernRun, step: int) -> float:
    """The rate the modern optimizer would use at a step: its schedule at iterations = step."""
    before = modern.optimizer.iterations.numpy()
    modern.optimizer.iterations.assign(step)
    rate = float(np.asarray(modern.optimizer.learning_rate))
    modern.optimizer.iterations.assign(before)
    return rate


def rate(outcome: StepOutcome) -> float:
    """The rate a training step used (a step that applied an update has one)."""
    if outcome.lr is None:
        raise ValueError("a training step without its learning rate")
    return outcome.lr


def change_error(name: str, before: np.ndarray, modern: np.ndarray, legacy: np.ndarray, tol: float,
                 step: Optional[int] = None, variable: Optional[str] = None, slot: Optional[str] = None) -> TensorError:
    """The modern change of a tensor against the legacy change, relative to the legacy change, with a
    floor of a few roundings of each (both sides store float32): ||ulp(before)|| + 2 ||ulp(legacy)||
    + 8 eps32 ||legacy change||; `step`, `variable`, `slot`: what it is of (compare.report.tensor_error)."""
    modern, legacy = np.asarray(modern), np.asarray(legacy)
    if modern.shape != legacy.shape:
        raise ValueError(f"{name}: shapes differ, {modern.shape} vs {legacy.shape}")
    sums = Sums.over(modern, legacy, offset=before, spacings=True)
    floor = math.sqrt(sums.spacing2) + 2 * math.sqrt(sums.ref_spacing2) + 8 * EPS32 * math.sqrt(sums.ref2)
    return errors_of(name, sums, floor / tol, step=step, variable=variable, slot=slot)


# ---------------------------------------------------------------------------------------------
# Regularisers

def legacy_regularisers(sides: Sides) -> tuple[dict[str, float], set[str]]:
    """({variable: c} for every L2 term c * sum(w^2) the graph builds of a trainable variable, [those
    in tower 0's loss]): each `L2Loss` of the variable (sum / 2) or `Sum(Square)` of it, times the
    constants it is multiplied by (a regulariser's scale).  A program may build terms it never adds to
    its loss (slim's regularisers, in REGULARIZATION_LOSSES): they count, as the port's regularisers
    count whether or not its step adds them; the gradients judge what the losses hold."""
    legacy = sides.legacy
    in_loss = tf1_graph.ancestors([legacy.lg.tower_losses[0]])
    towers = tf1_graph.Towers(legacy.lg.tower_losses)
    terms: dict[str, list[tuple[float, bool]]] = {}
    known: dict[Any, bool] = {}
    for op in legacy.graph.get_operations():
        if "gradients" in op.name or not op.inputs or towers.of(op) not in (0, None):
            continue
        source = op.inputs[0]
        if op.type == "L2Loss":
            variable, factor = tf1_graph.variable_of(source, legacy.by_name), 0.5
        elif op.type == "Sum" and source.op.type == "Square":
            variable, factor = tf1_graph.variable_of(source.op.inputs[0], legacy.by_name), 1.0
        else:
            continue
        if variable is None or variable.op.name not in legacy.trainable:
            continue
        terms.setdefault(variable.op.name, []).append((factor * scale_of(op.outputs[0], known), op in in_loss))
    out: dict[str, float] = {}
    for name, found in terms.items():
        in_the_loss = [scale for scale, added in found if added]
        # The terms the loss adds up; where it adds none, the one the program declared (a regulariser
        # called again, by a reused scope or a second tower, builds the same term again).
        out[name] = sum(in_the_loss) if in_the_loss else max(scale for scale, _ in found)
    added = {n for n, found in terms.items() if any(a for _, a in found) and out[n] != 0}
    return {n: c for n, c in out.items() if c != 0}, added


SUMS = ("AddN", "Add", "AddV2")


def regularisation_term(tensor: Any, known: dict[Any, bool]) -> bool:
    """Whether a tensor is built of L2 terms (an `L2Loss`, or a `Sum(Square)`, among its ops); `known`
    holds the answers so far."""
    if tensor not in known:
        known[tensor] = any(op.type == "L2Loss" or (op.type == "Sum" and op.inputs and op.inputs[0].op.type == "Square")
                            for op in tf1_graph.ancestors([tensor]) | {tensor.op})
    return known[tensor]


def scale_of(term: Any, known: Optional[dict[Any, bool]] = None) -> float:
    """The product of the constants a regularisation term is multiplied by, through Mul and Identity,
    and through sums with other regularisation terms only (`wd * add_n([l2_loss(w), ...])`, the
    official models' weight decay): a sum with the data loss is where the regularisation ends."""
    known = {} if known is None else known
    scale, tensor = 1.0, term
    for _ in range(16):
        consumers = [c for c in tensor.consumers()
                     if c.type in ("Mul", "Identity", *SUMS) and "gradients" not in c.name]
        if len(consumers) != 1:
            break
        op = consumers[0]
        if op.type == "Mul":
            other = op.inputs[1] if op.inputs[0] is tensor else op.inputs[0]
            value = tf.get_static_value(other)
            if value is None or np.size(value) != 1:
                break
            scale *= float(value)
        elif op.type in SUMS and not all(regularisation_term(i, known) for i in op.inputs if i is not tensor):
            break
        tensor = op.outputs[0]
    return scale


def modern_regularisers(sides: Sides) -> tuple[dict[str, float], list[str]]:
    """({variable: c} of the Keras regularisers on the model's weights, [variables whose regulariser is
    not c * sum(w^2)]): each weight's own `regularizer` (what a layer's kernel_regularizer and
    bias_regularizer set, and what `model.losses` sums), evaluated on probes of ones and twos, where
    an L2 term gives c * size and 4 c * size whatever the weights are now (zero biases included)."""
    coefficients, other = {}, []
    for name in sides.legacy.trainable:
        variable = sides.modern.names[name]
        regularizer = getattr(variable, "regularizer", None)
        if regularizer is None:
            continue
        size = float(np.prod(variable.shape))
        ones = tf.ones(variable.shape, variable.dtype)
        once, twice = float(regularizer(ones)), float(regularizer(2 * ones))
        if once == 0 and twice == 0:
            continue
        if abs(twice - 4 * once) > 1e-5 * abs(twice):
            other.append(name)
        coefficients[name] = once / size
    return coefficients, other


# ---------------------------------------------------------------------------------------------
# A one-dimensional search

def golden(f: Callable[[float], float], lo: float, hi: float, steps: int = 32) -> float:
    """The minimum of `f` on [lo, hi] by golden section."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return (a + b) / 2


def search(f: Callable[[float], float], grid: Sequence[float]) -> float:
    """The value that minimises `f`: the best of `grid`, refined between its neighbours."""
    grid = sorted(set(grid))
    scores = [f(v) for v in grid]
    i = int(np.argmin(scores))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    best = golden(f, lo, hi) if hi > lo else grid[i]
    return best if f(best) <= scores[i] else grid[i]


def scales(towers: int) -> list[float]:
    """The search grid of a scale: powers of sqrt(2) from 1/16 to 16, and the tower count and its inverse."""
    return [2 ** (j / 2) for j in range(-8, 9)] + ([float(towers), 1 / towers] if towers > 1 else [])
