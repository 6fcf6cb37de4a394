"""Free-running trajectories against the system's own sensitivity (the chaos floor)."""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np

from compare import causes, diagnosis
from compare.interface import Batch
from compare.report import Diagnosis, Part, Result, TensorError, judge
from compare.state import Masks
from compare.sides import Sides, State

FACTOR = 2.0  # the port may drift at most this much faster than the legacy program drifts from itself


def modern_trajectory(sides: Sides, start: State, steps: int,
                      names: list[str]) -> tuple[list[Batch], list[Masks], list[float], list[np.ndarray]]:
    """The port trained freely from `start`: each step's batch, the masks it drew (for the legacy
    towers' rows), its loss, and the trainable weights after it."""
    modern = sides.modern
    sides.set_both(start)
    batches, masks, losses, weights = [], [], [], []
    for k in range(steps):
        batch = sides.batch(seed=200 + k)
        out = modern.step(batch, before=modern.state())
        batches.append(batch)
        masks.append(sides.masks_for(batch, out))
        losses.append(out.loss)
        weights.append(np.concatenate([modern.names[n].numpy().ravel() for n in names]))
    return batches, masks, losses, weights


def legacy_trajectory(sides: Sides, start: State, batches: list[Batch], masks: list[Masks],
                      names: list[str]) -> tuple[list[float], list[np.ndarray]]:
    """The legacy program trained from `start` on the same batches and masks: losses, weights after each step."""
    legacy = sides.legacy
    legacy.restore(start)
    losses, weights = [], []
    for batch, m in zip(batches, masks):
        losses.append(legacy.step(batch, m).loss)
        weights.append(np.concatenate([v.ravel() for v in legacy.sess.run([legacy.by_name[n] for n in names])]))
    return losses, weights


def check_free_running(sides: Sides, steps: int, factor: float = FACTOR, start: Optional[State] = None,
                       suffix: str = "") -> Result:
    """Both programs train freely for K steps from the common start, on the same rows with the same
    dropout masks; the legacy program trains again from the start moved by one float32 ulp in every
    weight.  At every step the legacy-modern distance of the weights (relative to how far the legacy
    weights have moved) must stay within `factor` times the legacy-perturbed distance (the system's
    own sensitivity to round-off, measured in this run, never below float32's resolution of the
    weights), or within k + 1 steps' model tolerance, whichever is larger; and so must each step's
    loss, unless the trajectory is chaotic.  Catches what the restart check cannot: slow drift,
    optimizer state carried wrong from step to step, a schedule that goes wrong between the checked
    steps, a regulariser that only shows in the loss."""
    legacy = sides.legacy
    model_tol = sides.tol.model.rel_l2
    names = sorted(legacy.trainable)
    start = start or sides.start
    w0 = np.concatenate([start.weights[n].ravel() for n in names]).astype(np.float64)
    batches, masks, losses_m, traj_m = modern_trajectory(sides, start, steps, names)
    perturbed = dict(start.weights)
    for n in names:
        perturbed[n] = np.nextafter(perturbed[n], np.float32(np.inf))
    runs: dict[str, tuple[list[float], list[np.ndarray]]] = {}
    for label, weights in (("legacy", start.weights), ("perturbed", perturbed)):
        runs[label] = legacy_trajectory(sides, start.replace(weights=weights), batches, masks, names)
    resolution = np.linalg.norm(np.spacing(np.abs(w0).astype(np.float32)))
    rows = []
    for k in range(steps):
        wl, wp, wm = runs["legacy"][1][k], runs["perturbed"][1][k], traj_m[k]
        moved = max(np.linalg.norm(wl - w0), resolution)
        ll, lp, lm = runs["legacy"][0][k], runs["perturbed"][0][k], losses_m[k]
        rows.append({"d_m": np.linalg.norm(wl - wm) / moved, "d_p": max(np.linalg.norm(wl - wp), resolution) / moved,
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
    finite = all(np.isfinite(runs["legacy"][0] + losses_m))
    worst = int(np.argmax(ratios))
    r = rows[worst]
    result = judge(f"{sides.label}{steps} free-running steps (chaos floor){suffix}", sides.pair.name, errors, "chaos",
                 ok=finite and all(q <= 1 for q in ratios),
                 note=f"{'chaotic' if chaotic else 'not chaotic'}; worst step {worst}: weights legacy-modern "
                      f"{r['d_m']:.3g} vs legacy-perturbed {r['d_p']:.3g}, loss {r['e_loss']:.3g} vs {r['p_loss']:.3g} "
                      f"(allowed: {factor} x the perturbed distance, or {worst + 1} steps x model {model_tol:.2g}"
                      f"{'; losses not judged' if chaotic else ''}); last step at {ratios[-1]:.2f} of allowed",
                 extra={"losses": {"legacy": runs["legacy"][0], "modern": losses_m, "perturbed": runs["perturbed"][0]},
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
    return Diagnosis(where, causes.explain_trajectory(sides, start, steps), parts, "steps")
