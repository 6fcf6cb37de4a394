"""What each side regularises and averages, compared by structure, exactly.

A difference whose effect on one step sits below round-off can still change training: a port that
also regularises the biases (1e-4 of a bias that is ~1e-2) moves each gradient by less than its
tolerance, from initialisation and from a trained state alike, and a port that averages one variable
fewer changes only what is evaluated.  So these are read off each side's structure:

  regularised   per trainable variable, the coefficient c of its L2 term c * sum(w^2): legacy, from
                the graph (each `L2Loss` of the variable (sum / 2) or `Sum(Square)` of it, times the
                constants it is multiplied by; the note says how many the loss holds); modern, from each
                weight's Keras regulariser (kernel_regularizer, bias_regularizer: what model.losses
                sums), evaluated on probes.  A port whose model holds no regulariser at all adds
                what it adds in its step by hand: that is judged by the step (the gradients, and the
                flags check through the step), not here.  The same variables, at the same scale (a few roundings:
                the scale is a float32 constant on both sides).
  averaged      the variables whose moving average each side keeps (capability 'moving_averages').
  trained       the variables each side trains (the variables check compares them too).
"""
from __future__ import annotations

import math

import numpy as np

from compare import causes, diagnosis
from compare.measures import legacy_regularisers, modern_regularisers
from compare.report import EPS32, Diagnosis, Result, TensorError, Tolerance, judge, tensor_error
from compare.sides import Sides

SCALE_TOLERANCE = Tolerance("structure", 8 * EPS32, "the same variables on both sides; an L2 coefficient given in "
                                                    "Python and stored in float32 on each side: a few roundings "
                                                    "(8 eps32)")


def check_structure(sides: Sides) -> Result:
    """See the module docstring."""
    name = f"{sides.label}structure (regularised, averaged, trained)"
    legacy, modern = sides.legacy, sides.modern
    errors: list[TensorError] = []
    reg_l, added = legacy_regularisers(sides)
    reg_m, other = modern_regularisers(sides)
    # A port whose model holds no regulariser at all adds its own in its step, if any: that is judged
    # by the step (the gradients checks, and the flags check through the step), not read off the model.
    by_hand = bool(reg_l) and not reg_m and not other
    for n in sorted(set(reg_l) | set(reg_m)) if not by_hand else ():
        a, b = reg_m.get(n, 0.0), reg_l.get(n, 0.0)
        label = (f"{n} regularised by the port only" if not b else f"{n} not regularised by the port" if not a
                 else f"{n} L2 coefficient")
        errors.append(tensor_error(label, np.float64(a), np.float64(b)) if a and b
                      else TensorError(label, abs(a - b), math.inf, math.inf))
    errors += [TensorError(f"{n}: the port's loss term is not an L2 term c sum(w^2)", 0.0, math.inf, math.inf)
               for n in other]
    notes = [f"regularised: legacy {len(reg_l)} ({len(added)} of them in its loss), modern {len(reg_m)} variables"
             + ("; the port's model holds no regulariser: what its step adds is judged by the step (the "
                "gradients, and the flags check through the step), not here" if by_hand else "")]
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
    nothing = ("the same variables trained; the port regularises in its step" if by_hand
               else "nothing regularised or averaged on either side")
    result = judge(name, sides.pair.name, errors or [TensorError(nothing, 0.0, 0.0, 0.0)], SCALE_TOLERANCE,
                   note="; ".join(notes))
    if by_hand or other:
        return result
    return diagnosis.guarded(result, lambda: Diagnosis(
        "the regularised variables" if set(reg_l) != set(reg_m) else "the L2 coefficients",
        causes.explain_structure(reg_l, reg_m, SCALE_TOLERANCE.rel_l2)))
