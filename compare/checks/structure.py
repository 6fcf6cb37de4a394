"""What each side regularises and averages, compared by structure, exactly.

A difference whose effect on one step sits below round-off can still change training: a port that
also regularises the biases (1e-4 of a bias that is ~1e-2) moves each gradient by less than its
tolerance, from initialisation and from a trained state alike, and a port that averages one variable
fewer changes only what is evaluated.  So these are read off each side's structure:

  regularised   per trainable variable, the coefficient c of its L2 term c * sum(w^2): legacy, from
                the graph (each `L2Loss` of the variable (sum / 2) or `Sum(Square)` of it, times the
                constants it is multiplied by; the note says how many the loss holds); modern, from each
                weight's Keras regulariser (kernel_regularizer, bias_regularizer: what model.losses
                sums), evaluated on probes (a regulariser the port adds in its step by hand is judged
                by the gradients, not here).  The same variables, at the same scale (a few roundings:
                the scale is a float32 constant on both sides).
  averaged      the variables whose moving average each side keeps (capability 'moving_averages').
  trained       the variables each side trains (the variables check compares them too).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from compare import tf1_graph
from compare.report import EPS32, Result, TensorError, Tolerance, judge, tensor_error
from compare.sides import Sides

tf1 = tf.compat.v1
SCALE_TOLERANCE = Tolerance("structure", 8 * EPS32, "the same variables on both sides; an L2 coefficient given in "
                                                    "Python and stored in float32 on each side: a few roundings "
                                                    "(8 eps32)")


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
        terms.setdefault(variable.op.name, []).append((factor * scale_of(op.outputs[0]), op in in_loss))
    out: dict[str, float] = {}
    for name, found in terms.items():
        in_the_loss = [scale for scale, added in found if added]
        # The terms the loss adds up; where it adds none, the one the program declared (a regulariser
        # called again, by a reused scope or a second tower, builds the same term again).
        out[name] = sum(in_the_loss) if in_the_loss else max(scale for scale, _ in found)
    added = {n for n, found in terms.items() if any(a for _, a in found) and out[n] != 0}
    return {n: c for n, c in out.items() if c != 0}, added


def scale_of(term: Any) -> float:
    """The product of the constants a regularisation term is multiplied by, through Mul and Identity."""
    scale, tensor = 1.0, term
    for _ in range(8):
        consumers = [c for c in tensor.consumers() if c.type in ("Mul", "Identity") and "gradients" not in c.name]
        if len(consumers) != 1:
            break
        op = consumers[0]
        if op.type == "Mul":
            other = op.inputs[1] if op.inputs[0] is tensor else op.inputs[0]
            value = tf.get_static_value(other)
            if value is None or np.size(value) != 1:
                break
            scale *= float(value)
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


def check_structure(sides: Sides) -> Result:
    """See the module docstring."""
    name = f"{sides.label}structure (regularised, averaged, trained)"
    legacy, modern = sides.legacy, sides.modern
    errors: list[TensorError] = []
    reg_l, added = legacy_regularisers(sides)
    reg_m, other = modern_regularisers(sides)
    for n in sorted(set(reg_l) | set(reg_m)):
        a, b = reg_m.get(n, 0.0), reg_l.get(n, 0.0)
        label = (f"{n} regularised by the port only" if not b else f"{n} not regularised by the port" if not a
                 else f"{n} L2 coefficient")
        errors.append(tensor_error(label, np.float64(a), np.float64(b)) if a and b
                      else TensorError(label, abs(a - b), math.inf, math.inf))
    errors += [TensorError(f"{n}: the port's loss term is not an L2 term c sum(w^2)", 0.0, math.inf, math.inf)
               for n in other]
    notes = [f"regularised: legacy {len(reg_l)} ({len(added)} of them in its loss), modern {len(reg_m)} variables"]
    if "moving_averages" in sides.pair.capabilities and (legacy.shadows or modern.shadows):
        only_l = sorted(set(legacy.shadows) - set(modern.shadows))
        only_m = sorted(set(modern.shadows) - set(legacy.shadows))
        errors += [TensorError(f"{n} averaged by the legacy program only", 1.0, math.inf, math.inf) for n in only_l]
        errors += [TensorError(f"{n} averaged by the port only", 1.0, math.inf, math.inf) for n in only_m]
        notes.append(f"averaged: legacy {len(legacy.shadows)}, modern {len(modern.shadows)} variables")
    trained_m = {n for n in modern.trainable if n is not None}
    errors += [TensorError(f"{n} trained by the legacy program only", 1.0, math.inf, math.inf)
               for n in sorted(set(legacy.trainable) - trained_m)]
    errors += [TensorError(f"{n} trained by the port only", 1.0, math.inf, math.inf)
               for n in sorted(trained_m - set(legacy.trainable))]
    notes.append(f"trained: {len(legacy.trainable)} variables")
    return judge(name, sides.pair.name, errors or [TensorError("nothing regularised or averaged on either side",
                                                               0.0, 0.0, 0.0)], SCALE_TOLERANCE, note="; ".join(notes))
