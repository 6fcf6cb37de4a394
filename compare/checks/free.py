"""Free-running trajectories against the system's own sensitivity (the chaos floor)."""
from __future__ import annotations

import math
from typing import Mapping, Optional, Sequence

import numpy as np

from compare import causes, counterfactuals, diagnosis
from compare.checks import forward
from compare.measures import free_biases
from compare.report import BLOCK, Diagnosis, Part, Result, TensorError, judge, squares
from compare.sides import Sides, State

FACTOR = 2.0  # the port may drift at most this much faster than the legacy program drifts from itself


def distance(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    """||a - b|| of two lists of arrays (one vector), in float64 over blocks: no float64 copy, nor a
    flat copy, of 23.5M weights a step."""
    total = 0.0
    for x, y in zip(a, b):
        x, y = x.reshape(-1), y.reshape(-1)
        for i in range(0, x.size, BLOCK):
            d = x[i:i + BLOCK].astype(np.float64)
            d -= y[i:i + BLOCK]
            total += squares(d)
    return math.sqrt(total)


def trajectories(sides: Sides, start: State, perturbed: State, steps: int,
                 names: list[str]) -> tuple[dict[str, list[float]], list[float], list[float], list[float]]:
    """The port, the legacy program and the legacy program from `perturbed` (in a second session of
    its graph), trained in lockstep from `start`: the port's step draws each step's masks, both
    legacy runs take them for their towers' rows.  Returns the three runs' losses, and at each step
    the legacy weights' distance from the port's and from the perturbed run's, and how far they have
    moved from the start."""
    legacy, modern, other = sides.legacy, sides.modern, sides.legacy.twin()
    sides.set_both(start)
    other.restore(perturbed)
    w0 = [start.weights[n] for n in names]
    losses: dict[str, list[float]] = {"legacy": [], "modern": [], "perturbed": []}
    d_m, d_p, moved = [], [], []
    variables = [legacy.readers[n] for n in names]
    for k in range(steps):
        batch = sides.batch(seed=200 + k)
        out = modern.step(batch, before=modern.state())
        masks = sides.masks_for(batch, out)
        losses["modern"].append(out.loss)
        wm = modern.read([modern.names[n] for n in names])
        losses["legacy"].append(legacy.step(batch, masks).loss)
        wl = legacy.sess.run(variables)
        d_m.append(distance(wl, wm))
        moved.append(distance(wl, w0))
        losses["perturbed"].append(other.step(batch, masks).loss)
        d_p.append(distance(wl, other.sess.run(variables)))
    return losses, d_m, d_p, moved


def check_free_running(sides: Sides, steps: int, factor: float = FACTOR, start: Optional[State] = None,
                       suffix: str = "") -> Result:
    """Both programs train freely for K steps from the common start, on the same rows with the same
    dropout masks; the legacy program trains again from the start moved by one float32 ulp in every
    weight, in a second session of its graph (`LegacyRun.twin`), in lockstep with the other two.  At
    every step the legacy-modern distance of the weights (relative to how far the legacy weights have
    moved) must stay within `factor` times the legacy-perturbed distance (the system's
    own sensitivity to round-off, measured in this run, never below float32's resolution of the
    weights), or within k + 1 steps' model tolerance, whichever is larger; and so must each step's
    loss, unless the trajectory is chaotic.  Catches what the restart check cannot: slow drift,
    optimizer state carried wrong from step to step, a schedule that goes wrong between the checked
    steps, a regulariser that only shows in the loss."""
    model_tol = sides.tol.model.rel_l2
    names = sorted(sides.legacy.trainable)
    start = start or sides.start
    perturbed = dict(start.weights)
    for n in names:
        perturbed[n] = np.nextafter(perturbed[n], np.float32(np.inf))
    losses, d_m, d_p, moved = trajectories(sides, start, start.replace(weights=perturbed), steps, names)
    resolution = math.sqrt(sum(float(np.sum(np.square(np.spacing(np.abs(start.weights[n])), dtype=np.float64)))
                               for n in names))
    rows = []
    for k in range(steps):
        scale = max(moved[k], resolution)
        ll, lp, lm = losses["legacy"][k], losses["perturbed"][k], losses["modern"][k]
        rows.append({"d_m": d_m[k] / scale, "d_p": max(d_p[k], resolution) / scale,
                     "e_loss": abs(ll - lm) / max(abs(ll), 1e-30), "p_loss": abs(ll - lp) / max(abs(ll), 1e-30)})
    # Chaotic: the loss of the legacy program started 1 ulp away drifts from its own beyond the step
    # tolerance.  Then one run's loss says little: only the weights' distance is judged,
    # against the chaos floor.  (The weights' distance is no measure of chaos: one ulp of every weight
    # is large against the first steps' movement.)
    chaotic = any(r["p_loss"] > (k + 1) * model_tol for k, r in enumerate(rows))
    errors, ratios = [], []
    for k, r in enumerate(rows):
        ratio = r["d_m"] / max(factor * r["d_p"], (k + 1) * model_tol)
        if not chaotic:
            ratio = max(ratio, r["e_loss"] / max(factor * r["p_loss"], (k + 1) * model_tol))
        ratios.append(ratio)
        # max_abs: the legacy-modern weight distance; max_rel: the loss difference; rel_l2: what is
        # judged over what is allowed (the "chaos" tolerance is 1).
        errors.append(TensorError(f"step {k}: {'weights' if chaotic else 'weights and loss'} over allowed",
                                  r["d_m"], r["e_loss"], ratio))
    finite = all(np.isfinite(losses["legacy"] + losses["modern"]))
    worst = int(np.argmax(ratios))
    r = rows[worst]
    result = judge(f"{sides.label}{steps} free-running steps (chaos floor){suffix}", sides.pair.name, errors, "chaos",
                 ok=finite and all(q <= 1 for q in ratios),
                 note=f"{'chaotic' if chaotic else 'not chaotic'}; worst step {worst}: weights legacy-modern "
                      f"{r['d_m']:.3g} vs legacy-perturbed {r['d_p']:.3g}, loss {r['e_loss']:.3g} vs {r['p_loss']:.3g} "
                      f"(allowed: {factor} x the perturbed distance, or {worst + 1} steps x model {model_tol:.2g}"
                      f"{'; losses not judged' if chaotic else ''}); last step at {ratios[-1]:.2f} of allowed",
                 extra={"losses": losses,
                        "distances": {"modern": [r["d_m"] for r in rows], "perturbed": [r["d_p"] for r in rows]}})
    return diagnosis.guarded(result, lambda: _localise_trajectory(sides, start, steps, rows, ratios))


def _localise_trajectory(sides: Sides, start: State, steps: int, rows: Sequence[Mapping[str, float]],
                         ratios: Sequence[float]) -> Diagnosis:
    """The first free-running step beyond its allowance, and which known rule, carried along the
    port's own trajectory, explains it."""
    first = next(k for k, q in enumerate(ratios) if not q <= 1)
    parts = [Part(f"step {k}", q, 1.0, note=f"weights {rows[k]['d_m']:.3g}, loss {rows[k]['e_loss']:.3g}")
             for k, q in enumerate(ratios)]
    where = (f"first at free-running step {first} ({ratios[first]:.3g} of allowed)"
             + (f"; step{'s 0 to' if first > 1 else ''} {first - 1} within" if first else ""))
    return Diagnosis(where, causes.explain_trajectory(sides, start, steps, lambda line: first_step_cause(
        sides, start, line)), parts, "steps")


def first_step_cause(sides: Sides, start: State, line: str) -> str:
    """Where the port's updates follow the original's rule at its rates, the trajectories part by the
    gradients the updates are given: the counterfactuals on the first free step's loss and gradients
    (its rows and dropout masks), `line` where none explains them."""
    batch = sides.batch(seed=200)
    both = forward.step_both(sides, batch, start)
    symptom = counterfactuals.Symptom(start, batch, both.legacy.masks, both.legacy.loss, both.legacy.gradients,
                                      both.modern.loss, both.modern.gradients, free_biases(both.legacy.gradients))
    found = counterfactuals.explain(sides, symptom, lambda: line)
    return found if found.startswith(causes.UNEXPLAINED) else \
        f"{found} (the port's updates follow the original's rule at its rates; its first free step's loss and " \
        f"gradients, on the original's graph)"
