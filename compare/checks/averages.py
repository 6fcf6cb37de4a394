"""Moving averages of the variables (tf.train.ExponentialMovingAverage and its ports).

The legacy graph's own decay is read from the graph (the `1 - decay` tensor its shadow updates
multiply by, evaluated with the global step set to n), so the warm-up `min(decay, (1 + n)/(10 + n))`
of `num_updates`, or its absence, is the program's, not a formula of the harness:

    shadow <- shadow - (1 - d(n)) (shadow - w)

Both sides train freely for K steps, half from step 0 (inside the warm-up) and half from a step past
it (found from the same tensor: the first n with d(n) = d(infinity)), where the decay itself shows.
At every step each side's shadow update is predicted from its own values:
  legacy, when its averaging is ordered after the update (the apply op is an ancestor of the
    shadow's update): w after, n + 1;  when unordered (EXPECTED): one of the four schedules,
    w before or after the update, the step read before or after its increment;
  modern: w after, its iterations after the step, with the LEGACY decay function.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np

from compare import causes, diagnosis, tf1_graph
from compare.interface import undeclared
from compare.report import Diagnosis, Result, TensorError, Tolerance, judge, not_applicable, tensor_error
from compare.sides import Sides, State
from compare.state import Arrays

FAR = 10 ** 9


def decay_function(sides: Sides) -> tuple[Callable[[float], float], bool]:
    """(d(n) from the legacy graph, whether the legacy averaging runs after the update)."""
    legacy = sides.legacy
    name = sorted(legacy.shadows)[0]
    op, _, one_minus = tf1_graph.shadow_update(legacy.graph, legacy.shadows[name])
    ordered = legacy.updates[name].op in tf1_graph.ancestors([op])
    one_minus_at = tf1_graph.StepFunction(legacy.graph, one_minus, legacy.global_step_var, legacy.sess)
    return (lambda n: 1.0 - one_minus_at(n)), ordered


def decay_changes(sides: Sides) -> list[tuple[str, float, Callable[[float], Callable[[float], float]]]]:
    """The decay d(n) of the original's graph with one of its scalar constants fed another value: for
    each constant of the `1 - decay` tensor's subgraph (the decay itself, the warm-up's 1 and 10), its
    name, its value, and value -> the changed d(n)."""
    legacy = sides.legacy
    _, _, one_minus = tf1_graph.shadow_update(legacy.graph, legacy.shadows[sorted(legacy.shadows)[0]])
    f = tf1_graph.StepFunction(legacy.graph, one_minus, legacy.global_step_var, legacy.sess)

    def changed(name: str, value: float) -> Callable[[float], float]:
        return lambda n: 1.0 - f(n, {name: value})
    return [(name, f.value(name), functools.partial(changed, name)) for name, t in f.constants.items()
            if t.dtype.is_floating]


def past_warm_up(d: Callable[[float], float]) -> int:
    """The first global step from which the decay is its final value (bisection), plus ten."""
    final = d(FAR)
    if d(0) == final:
        return 10
    lo, hi = 0, FAR
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if d(mid) != final else (lo, mid)
    return hi + 10


def candidates(shadow: np.ndarray, w_before: np.ndarray, w_after: np.ndarray, n_before: float,
               d: Callable[[float], float]) -> dict[str, np.ndarray]:
    out = {}
    for w_name, w in (("w before", w_before), ("w after", w_after)):
        for n_name, n in (("step before", n_before), ("step after", n_before + 1)):
            out[f"{w_name}, {n_name}"] = shadow - (1 - d(n)) * (shadow - w)
    return out


class ShadowStep(NamedTuple):
    """One modern step as the shadows see it: the step counter before it, the shadows and the
    weights before it, the weights and the shadows after it."""
    n: float
    shadows: Arrays
    w_before: Arrays
    w_after: Arrays
    s_after: Arrays


def _modern_shadow_errors(step: ShadowStep, names: Sequence[str], d: Callable[[float], float], tol: Tolerance,
                          label: str = "", step_of: Optional[int] = None) -> list[TensorError]:
    """The port's shadow updates of one step against the prediction with decay function `d`.  The
    shadow is stored in float32: its update is a small difference of near-equal numbers, so 2 ulps
    of the shadow per element count as exactly the tolerance."""
    errors = []
    for n in names:
        m0 = step.shadows[n].astype(np.float64)
        predicted = candidates(m0, step.w_before[n], step.w_after[n], step.n, d)["w after, step after"]
        floor = 2 * np.linalg.norm(np.spacing(np.abs(step.shadows[n]))) / tol.rel_l2
        errors.append(tensor_error(f"{label}modern {n} shadow update", step.s_after[n] - m0, predicted - m0, floor,
                                   step=step_of, variable=n))
    return errors


def _localise_averages(result: Result, modern_errors: Sequence[TensorError], steps: Sequence[ShadowStep],
                       names: Sequence[str], d: Callable[[float], float], tol: Tolerance, regimes: str,
                       sides: Sides) -> Result:
    """The first of the port's shadow updates (`modern_errors`) that parts, and whether another
    warm-up explains it."""
    failing = [e for e in modern_errors if e.rel_l2 > tol.rel_l2]
    if not failing:
        return result

    def modern_judge(variant: Callable[[float], float]) -> tuple[bool, float, float]:
        worst = max(e.rel_l2 for step in steps for e in _modern_shadow_errors(step, names, variant, tol))
        return worst <= tol.rel_l2, worst, tol.rel_l2
    where = f"first at {failing[0].name} ({failing[0].rel_l2:.3g} against {tol.rel_l2:.3g}); {regimes}"
    return diagnosis.guarded(result, lambda: Diagnosis(
        where, causes.explain_averages(modern_judge, d, FAR, fitted_decay(steps[-1], names), decay_changes(sides),
                                       steps[-1].n + 1), [], "averages"))


def fitted_decay(step: ShadowStep, names: Sequence[str]) -> Optional[float]:
    """The decay d that the port's shadow update of `step` took, s_after = s - (1 - d)(s - w_after),
    by least squares over every shadow (None where no weight moved away from its shadow)."""
    num = den = 0.0
    for n in names:
        gap = step.shadows[n].astype(np.float64) - step.w_after[n]
        num += float(np.sum((step.shadows[n].astype(np.float64) - step.s_after[n]) * gap))
        den += float(np.sum(gap * gap))
    return 1 - num / den if den > 0 else None


def check_moving_averages(sides: Sides, steps: int, start: Optional[State] = None, suffix: str = "") -> list[Result]:
    """See the module docstring; from `start` (a state past the warm-up) every step is past it."""
    name = f"{sides.label}moving averages{suffix}"
    legacy, modern = sides.legacy, sides.modern
    if "moving_averages" not in sides.pair.capabilities:
        return [not_applicable(name, sides.pair.name, undeclared(sides.pair, "moving averages", "moving_averages"))]
    if not legacy.shadows:
        return [not_applicable(name, sides.pair.name, "the legacy program keeps no moving averages of its variables")]
    if not modern.shadows:
        return [judge(name, sides.pair.name, [], "exact", ok=False,
                      note=f"the legacy program keeps moving averages of {len(legacy.shadows)} variables "
                           f"({', '.join(sorted(legacy.shadows)[:3])}, ...); none were found in the port")]
    d, ordered = decay_function(sides)
    late = past_warm_up(d)
    tol = sides.tol.optimizer
    half = max(1, steps // 2) if start is None else 0
    start = start or sides.start
    sides.set_both(start)
    names = sorted(legacy.shadows)
    errors: list[TensorError] = []
    modern_errors: list[TensorError] = []
    gaps: list[float] = []
    seen: dict[str, int] = {}
    modern_steps: list[ShadowStep] = []
    for k in range(steps):
        if k == half and half:  # jump both counters past the warm-up
            legacy.set_step(late)
            modern.optimizer.iterations.assign(late)
        before_l = legacy.state()
        before_m = modern.state()
        n_m = float(modern.iterations())
        batch = sides.batch(seed=300 + k)
        out_m = modern.step(batch, before=before_m)
        legacy.step(batch, sides.masks_for(batch, out_m))
        after_l = legacy.state()
        after_wm, after_sm = modern.weights(names), modern.shadow_values()
        modern_steps.append(ShadowStep(n_m, before_m.shadows or {}, before_m.weights, after_wm, after_sm))
        shadows_l, after_shadows_l = before_l.shadows or {}, after_l.shadows or {}
        for n in names:
            s0 = shadows_l[n].astype(np.float64)
            cands = candidates(s0, before_l.weights[n], after_l.weights[n], float(before_l.step), d)
            floor = 2 * np.linalg.norm(np.spacing(np.abs(shadows_l[n]))) / tol.rel_l2
            gaps.append(tensor_error("", cands["w before, step before"] - s0, cands["w after, step after"] - s0,
                                     floor).rel_l2)
            if ordered:
                best = "w after, step after"
            else:
                best = min(cands, key=lambda c: np.linalg.norm(after_shadows_l[n] - cands[c]))
                seen[best] = seen.get(best, 0) + 1
            errors.append(tensor_error(f"step {k}: legacy {n} shadow update ({best})", after_shadows_l[n] - s0,
                                       cands[best] - s0, floor, step=k, variable=n))
        shadows_m = _modern_shadow_errors(modern_steps[-1], names, d, tol, f"step {k}: ", step_of=k)
        modern_errors += shadows_m
        errors += shadows_m
    regimes = (f"{half} steps from step 0 (warm-up), {steps - half} from step {late} (past it: decay {d(late):g})"
               if half else f"{steps} steps from step {start.step} (decay {d(start.step):g})")

    def localise(result: Result) -> Result:
        return _localise_averages(result, modern_errors, modern_steps, names, d, tol, regimes, sides)
    if ordered:
        return [localise(judge(name, sides.pair.name, errors, tol,
                               note=f"legacy averages after the update, as the modern program; {regimes}"))]
    ok = max(gaps) > 10 * tol.rel_l2 and all(e.rel_l2 <= tol.rel_l2 for e in errors)
    return [localise(judge(f"{sides.label}moving average (unordered){suffix}", sides.pair.name, errors, tol,
                           expected=True, ok=ok,
                  note="each legacy shadow update matched one of the 4 schedules (seen: "
                       + ", ".join(f"{c} {v}" for c, v in sorted(seen.items()))
                       + f"); modern = ordered; the schedules differ by up to {max(gaps):.2g}; {regimes}"))]
