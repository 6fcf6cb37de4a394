"""Training steps from shared states, across the learning-rate schedule.

Before every step the modern model and optimizer are set to the legacy program's state (weights,
moving statistics, optimizer slots, step counter; TF1's Adam beta powers to beta^(step + 1)), both
take one step on the same rows with the same dropout masks, and then:

  lr         the legacy learning-rate tensor against the rate the modern optimizer used;
  loss, gradients   legacy grads_and_vars against the modern step's;
  optimizer  each side's update and slots against its own rule (compare.optimizers), from its
             own slots, gradient and rate: legacy and modern updates are not compared directly
             (Adam divides each element by its own size: where a gradient is ~0, a round-off
             difference in g is a full +-lr difference in the step);
  counters   global step and iterations both +1; TF1's running beta powers = beta^t;
  moving statistics (when UPDATE_OPS moves any): EXPECTED, see check_moving_statistics.

The global steps are chosen from the legacy schedule itself: the steps where its rate changes
(found by probing the graph's learning-rate tensor), each boundary b and b + 1, far past the last.
"""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from typing import Optional
from typing import Any, Sequence

from compare import common
from compare import optimizers
from compare.checks.forward import gradient_errors
from compare.legacy_run import LegacyRun
from compare.modern_run import ModernRun
from compare.report import EPS32, Result, TensorError, judge, tensor_error
from compare.sides import Sides
from compare.state import Arrays, State, StepOutcome

HORIZON = 2 ** 22  # the schedule is probed up to this global step


def change_points(legacy: LegacyRun, limit: int = 16) -> Optional[list[int]]:
    """The global steps s at which the legacy rate changes (lr(s) != lr(s + 1)), up to HORIZON; None
    when it changes at almost every step (a continuous decay)."""
    probes = [0] + [2 ** k for k in range(23)]
    cache = {}

    def lr(s: int) -> float:
        if s not in cache:
            cache[s] = legacy.learning_rate_at(s)
        return cache[s]
    found = []
    for a, b in zip(probes, probes[1:]):
        if lr(a) == lr(b):
            continue
        lo, hi = a, b  # lr(lo) != lr(hi): the first change in [lo, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if lr(mid) != lr(lo) else (mid, hi)
        found.append(lo)
        if len(found) > limit:
            return None
    continuous = sum(lr(s) != lr(s + 1) for s in (3, 17, 1001, 40009)) >= 3
    return None if continuous else found


def schedule_probes(points: Optional[Sequence[int]]) -> list[int]:
    """Global steps at which both schedules are read without training: 0, 1, each change point and
    the step after it, and powers of ten up to 10^6."""
    probes = [0, 1] + [s + k for s in (points or [])[:8] for k in (0, 1)] + [10 ** k for k in range(2, 7)]
    return sorted(set(probes))


def modern_rate_at(modern: ModernRun, step: int) -> float:
    """The rate the modern optimizer would use at a step: its schedule at iterations = step."""
    before = modern.optimizer.iterations.numpy()
    modern.optimizer.iterations.assign(step)
    rate = float(np.asarray(modern.optimizer.learning_rate))
    modern.optimizer.iterations.assign(before)
    return rate


def restart_steps(points: Optional[list[int]], count: int) -> list[int]:
    """`count` global steps for the restart check: for a stepwise schedule the first boundary b0 (a
    schedule one step ahead shows there), the last boundary + 1 (one step behind), b0 + 1, far past the
    last, the other crossings, step 0; for a continuous or constant one, 0, far, 1 and between."""
    if points:
        far = 4 * points[-1] + 4
        wanted = [points[0], points[-1] + 1, points[0] + 1, far] + [b + k for b in points[1:-1] for k in (0, 1)] \
            + points[1:] + [b + 1 for b in points[:-1]] + [0]
    else:
        far = 100000
        wanted = [0, far, 1, far // 4, far // 2]
    wanted = list(dict.fromkeys(wanted))
    while len(wanted) < count:
        wanted.append(far + len(wanted))
    return sorted(wanted[:count])


@dataclasses.dataclass
class RestartStep:
    """One restart step: the state both sides started from, each side's outcome and state after."""
    step: int
    before: State
    lr_state: float              # the legacy rate at the state's step (the modern slots' conversion)
    legacy: StepOutcome
    modern: StepOutcome
    legacy_after: State
    modern_weights: Arrays       # the modern trainable weights after the step
    modern_slots: dict[str, Arrays]
    iterations: int              # the modern optimizer's iterations after the step
    modern_moving: Arrays        # the modern moving statistics after the step
    powers: tuple[float, ...] = ()  # the legacy beta powers after the step (Adam)


def run_restart_step(sides: Sides, k: int, step: int, state: State) -> RestartStep:
    """Both sides from `state` (its step set to `step`), one step on the same rows and masks."""
    legacy, modern = sides.legacy, sides.modern
    names = list(legacy.trainable)
    lr_state = sides.set_both(state)
    batch = sides.batch(seed=100 + k)
    out_m = modern.step(batch, before=state)
    out_l = legacy.step(batch, sides.masks_for(batch, out_m))
    powers = tuple(legacy.sess.run([legacy.powers["beta1_power"], legacy.powers["beta2_power"]])) \
        if legacy.powers else ()
    return RestartStep(step, state, lr_state, out_l, out_m, legacy.state(), modern.weights(names),
                       modern.slot_values(names), modern.iterations(),
                       modern.weights(sorted({u.variable.op.name for u in legacy.moving})), powers)


def optimizer_errors(sides: Sides, r: RestartStep) -> list[TensorError]:
    """Each side's update and slots of every variable against its own rule (compare.optimizers)."""
    rule_l, rule_m = sides.legacy.rule, sides.modern.rule
    names = list(sides.legacy.trainable)
    tol = sides.tol.optimizer.rel_l2
    b1p, b2p = np.float32(rule_l.beta1) ** (r.step + 1), np.float32(rule_l.beta2) ** (r.step + 1)
    t = np.float32(r.iterations)
    powers_m = (float(np.float32(rule_m.beta1) ** t), float(np.float32(rule_m.beta2) ** t))

    def legacy_update(n: str) -> list[TensorError]:
        return optimizers.update_errors(
            f"legacy step {r.step}: {n}", rule_l, dict(r.before.slots[n], w=r.before.weights[n]),
            dict(r.legacy_after.slots[n], w=r.legacy_after.weights[n]), r.legacy.gradients[n], rate(r.legacy),
            (float(b1p), float(b2p)), tol)

    def modern_update(n: str) -> list[TensorError]:
        before = optimizers.modern_slots_from_legacy(rule_m, r.before.slots[n], r.lr_state)
        return optimizers.update_errors(
            f"modern step {r.step}: {n}", rule_m, dict(before, w=r.before.weights[n]),
            dict(r.modern_slots[n], w=r.modern_weights[n]), r.modern.gradients[n], rate(r.modern), powers_m, tol)

    jobs = [(legacy_update, n) for n in names] + [(modern_update, n) for n in names]
    return [e for errors in common.parallel_map(lambda job: job[0](job[1]), jobs) for e in errors]


def rate(outcome: StepOutcome) -> float:
    """The rate a training step used (a step that applied an update has one)."""
    if outcome.lr is None:
        raise ValueError("a training step without its learning rate")
    return outcome.lr


def counter_errors(sides: Sides, r: RestartStep) -> tuple[list[TensorError], list[TensorError]]:
    """(the step counters, each +1 exactly; TF1's running beta powers = beta^t)."""
    exact = [tensor_error(f"step {r.step}: legacy global step", np.float64(r.legacy_after.step),
                          np.float64(r.step + 1)),
             tensor_error(f"step {r.step}: modern iterations", np.float64(r.iterations), np.float64(r.step + 1))]
    powers = []
    if r.powers:
        rule = sides.legacy.rule
        powers.append(tensor_error(f"step {r.step}: legacy beta powers", np.array(r.powers, np.float64),
                                   np.array([rule.beta1, rule.beta2], np.float32) ** np.float64(r.step + 2)))
    return exact, powers


def check_training_steps(sides: Sides, count: int, steps_at: Optional[list[int]] = None,
                         start: Optional[State] = None, suffix: str = "") -> list[Result]:
    """See the module docstring; the first step starts from the common start (or `start`), each
    later one from where the legacy program's previous step left it."""
    legacy, modern = sides.legacy, sides.modern
    points = change_points(legacy)
    steps_at = steps_at or restart_steps(points, count)
    runs: list[RestartStep] = []
    for k, step in enumerate(steps_at):
        state = (legacy.state() if k else (start or sides.start)).replace(step=step)
        runs.append(run_restart_step(sides, k, step, state))
    results = [check_lr(sides, runs, points, suffix),
               check_losses_and_gradients(sides, runs, suffix),
               judge(f"{sides.label}{len(runs)} training step{plural(runs)}: optimizer on each side{suffix}",
                     sides.pair.name, [e for r in runs for e in optimizer_errors(sides, r)], sides.tol.optimizer,
                     note=f"every variable's update and slots against its own rule: legacy {legacy.rule.describe()}, "
                          f"modern {modern.rule.describe()}"),
               check_counters(sides, runs, suffix)]
    if legacy.moving:
        results.append(check_moving_statistics(sides, runs, suffix))
    return results


def plural(runs: list[RestartStep]) -> str:
    return "s" if len(runs) != 1 else ""


def check_lr(sides: Sides, runs: list[RestartStep], points: Optional[list[int]], suffix: str) -> Result:
    """The rate each step used, and both schedules probed without training."""
    legacy, modern = sides.legacy, sides.modern
    errors = [tensor_error(f"lr at step {r.step}", np.float32(r.modern.lr), np.float32(r.legacy.lr)) for r in runs]
    probes = schedule_probes(points) if not suffix else []
    errors += [tensor_error(f"lr at step {s} (probed)", np.float32(modern_rate_at(modern, s)),
                            np.float32(legacy.learning_rate_at(s))) for s in probes]
    schedule = ("continuous" if points is None else f"changes after steps {points}" if points else "constant")
    return judge(f"{sides.label}lr schedule{suffix}", sides.pair.name, errors,
                 sides.tol.schedule if points is None else "exact",
                 note=f"the rate each step used, at global steps {[r.step for r in runs]}, and the schedules probed "
                      f"at {probes}; the legacy schedule {schedule}")


def check_losses_and_gradients(sides: Sides, runs: list[RestartStep], suffix: str) -> Result:
    errors = [tensor_error(f"loss at step {r.step}", r.legacy.loss, r.modern.loss) for r in runs]
    for r in runs:
        errors += [dataclasses.replace(e, name=f"step {r.step}: {e.name} gradient")
                   for e in gradient_errors(sides, r.legacy.gradients, r.modern.gradients)]
    return judge(f"{sides.label}{len(runs)} training step{plural(runs)}: loss and gradients{suffix}", sides.pair.name,
                 errors, sides.tol.model,
                 note=f"each step from the legacy state; modern gradients {runs[-1].modern.source}",
                 extra={"losses": {"legacy": [r.legacy.loss for r in runs], "modern": [r.modern.loss for r in runs]}})


def check_counters(sides: Sides, runs: list[RestartStep], suffix: str) -> Result:
    exact, powers = [], []
    for r in runs:
        e, p = counter_errors(sides, r)
        exact += e
        powers += p
    ok = all(e.max_abs == 0 for e in exact) and all(e.max_rel <= 64 * EPS32 for e in powers)
    return judge(f"{sides.label}step counters{suffix}", sides.pair.name, exact + powers, "exact", ok=ok,
                 note="legacy global step and modern iterations +1 per step"
                      + ("; TF1's running beta powers = beta^t (64 eps32)" if sides.legacy.powers else ""))


# ---------------------------------------------------------------------------------------------
# Batch-norm moving statistics

def schedules(n: int) -> list[tuple[tuple[int, ...], tuple[frozenset[int], ...]]]:
    """The distinct ways n unordered read-modify-write updates of one variable can interleave.

    Update i reads v, computes delta_i = (v_read - a_i)(1 - d), and atomically subtracts it
    (AssignSubVariableOp).  Which earlier subtractions update i's read sees is a set S_i; a schedule
    is one consistent choice of S_0..S_n-1 over all orders of the 2n read/write events.  Returns a
    list of (order of reads, tuple of S_i) with duplicates removed.
    """
    events = [(i, kind) for i in range(n) for kind in "rw"]
    seen, out = set(), []
    for perm in itertools.permutations(range(2 * n)):
        order = [events[p] for p in perm]
        if any(order.index((i, "r")) > order.index((i, "w")) for i in range(n)):
            continue
        done: set[int] = set()
        sets: dict[int, frozenset[int]] = {}
        reads: list[int] = []
        for i, kind in order:
            if kind == "r":
                sets[i] = frozenset(done)
                reads.append(i)
            else:
                done.add(i)
        key = tuple(sets[i] for i in range(n))
        if key not in seen:
            seen.add(key)
            out.append((tuple(reads), key))
    return out


_SCHEDULES: dict[int, list[tuple[tuple[int, ...], tuple[frozenset[int], ...]]]] = {}


def predictions_legacy(before: np.ndarray, stats: Sequence[np.ndarray], decay: float) -> list[np.ndarray]:
    """Every value n unordered updates (one per schedule) can leave in a shared variable:
    v_after = v - sum_i (v_read_i - a_i)(1 - d)."""
    n = len(stats)
    if n not in _SCHEDULES:
        _SCHEDULES[n] = schedules(n)
    preds = []
    for reads, sets in _SCHEDULES[n]:
        delta: dict[int, np.ndarray] = {}
        for i in reads:
            delta[i] = (before - sum(delta[j] for j in sets[i]) - stats[i]) * (1 - decay)
        preds.append(before - sum(delta.values()))
    return preds


def moving_groups(legacy: LegacyRun) -> dict[str, list[int]]:
    """{variable name: [indices into legacy.moving]}: the updates of each moving statistic, in tower order."""
    groups: dict[str, list[int]] = {}
    for i, u in enumerate(legacy.moving):
        groups.setdefault(u.variable.op.name, []).append(i)
    return {n: sorted(ix, key=lambda i: legacy.moving[i].tower or 0) for n, ix in groups.items()}


def check_moving_statistics(sides: Sides, runs: list[RestartStep], suffix: str = "") -> Result:
    """EXPECTED (more than one update per statistic): legacy moves each moving statistic once per
    tower per step; the modern model once, by the replicas' mean.

    Predictions, from the batch statistics a_i the legacy towers' updates read (tapped in the legacy
    step; the modern replicas' equal them, by the training-forward check) and the value v before:
      legacy:  one of `predictions_legacy` (n unordered updates of one shared variable)
      modern:  v - (v - mean_i a_i)(1 - d), on every replica's copy alike
    with the legacy graph's own decay d.  Compared as the update (after - before), relative to its
    own size, with a floor: each side stores v in float32 after up to n + 1 roundings, and computes
    each a_i with its own kernel, so n + 1 ulps of v and 4 (1 - d) ulps of each a_i per element count
    as exactly the tolerance.  With n > 1 the modern update would FAIL the
    legacy prediction and vice versa (the gap is in the note).
    """
    legacy, modern, tol = sides.legacy, sides.modern, sides.tol.model
    groups = moving_groups(legacy)
    decay = legacy.moving_decays()
    n_updates = max(len(ix) for ix in groups.values())
    errors: list[TensorError] = []
    seen: dict[int, int] = {}
    gaps: list[float] = []
    for r in runs:
        before, after_l, after_m, stats, step = (r.before.weights, r.legacy_after.weights, r.modern_moving,
                                                 r.legacy.stats, r.step)
        for name, ix in sorted(groups.items()):
            v = np.asarray(before[name], np.float64)
            a = [np.asarray(stats[i], np.float64) for i in ix]
            floor = ((len(ix) + 1) * np.linalg.norm(np.spacing(np.abs(before[name])))
                     + 4 * (1 - decay[name]) * sum(np.linalg.norm(np.spacing(np.abs(stats[i])))
                                                   for i in ix)) / tol.rel_l2
            preds = predictions_legacy(v, a, decay[name])
            scored = [tensor_error("", after_l[name] - v, p - v, floor).rel_l2 for p in preds]
            best = int(np.argmin(scored))
            seen[best] = seen.get(best, 0) + 1
            errors.append(tensor_error(f"legacy {name} step {step} (schedule {best})", after_l[name] - v,
                                       preds[best] - v, floor))
            modern_pred = v - (v - np.mean(a, axis=0)) * (1 - decay[name])
            errors.append(tensor_error(f"modern {name} step {step}", after_m[name] - v, modern_pred - v, floor))
            copies = [np.asarray(c) for c in replica_copies(modern.names[name])]
            if len(copies) > 1:
                errors.append(tensor_error(f"modern {name} step {step}: replica copies equal", np.stack(copies),
                                           np.stack([copies[0]] * len(copies))))
            if len(ix) > 1:
                gaps.append(tensor_error("", modern_pred - v, preds[best] - v, floor).rel_l2)
    distinct = n_updates == 1 or min(gaps) > tol.rel_l2
    ok = distinct and all(e.rel_l2 <= tol.rel_l2 for e in errors)
    note = (f"legacy: {n_updates} unordered update(s) of each of {len(groups)} shared statistics per step "
            f"({len(_SCHEDULES.get(n_updates, [0]))} possible schedules, {len(seen)} seen); modern: one update "
            f"by the replicas' mean" + (f"; the two predictions differ by >= {min(gaps):.2g}" if gaps else ""))
    return judge(f"{sides.label}bn moving statistics{suffix}", sides.pair.name, errors, tol, expected=n_updates > 1,
                 ok=ok, note=note)


def replica_copies(variable: Any) -> list[np.ndarray]:
    import keras
    inner = variable.value if isinstance(variable, keras.Variable) else variable
    values = getattr(inner, "values", None)
    return [v.numpy() for v in values] if values else [inner.numpy()]
