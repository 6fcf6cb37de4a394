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

from compare import common
from compare import optimizers
from compare.checks.forward import gradient_errors
from compare.report import EPS32, judge, tensor_error

HORIZON = 2 ** 22  # the schedule is probed up to this global step


def change_points(legacy, limit=16):
    """The global steps s at which the legacy rate changes (lr(s) != lr(s + 1)), up to HORIZON; None
    when it changes at almost every step (a continuous decay)."""
    probes = [0] + [2 ** k for k in range(23)]
    cache = {}

    def lr(s):
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


def schedule_probes(points):
    """Global steps at which both schedules are read without training: 0, 1, each change point and
    the step after it, and powers of ten up to 10^6."""
    probes = [0, 1] + [s + k for s in (points or [])[:8] for k in (0, 1)] + [10 ** k for k in range(2, 7)]
    return sorted(set(probes))


def modern_rate_at(modern, step):
    """The rate the modern optimizer would use at a step: its schedule at iterations = step."""
    before = modern.optimizer.iterations.numpy()
    modern.optimizer.iterations.assign(step)
    rate = float(np.asarray(modern.optimizer.learning_rate))
    modern.optimizer.iterations.assign(before)
    return rate


def restart_steps(points, count):
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


def check_training_steps(sides, count, steps_at=None, start=None, suffix=""):
    """See the module docstring; the first step starts from the common start (or `start`), each
    later one from where the legacy program's previous step left it."""
    legacy, modern, tol = sides.legacy, sides.modern, sides.tolerances["model"]
    points = change_points(legacy)
    steps_at = steps_at or restart_steps(points, count)
    rule_l, rule_m = legacy.rule, modern.rule
    names = list(legacy.trainable)
    losses_l, losses_m, lr_errors, grad_err, opt_err, count_err, moving = [], [], [], [], [], [], []
    first = start or sides.start
    for k, step in enumerate(steps_at):
        state = (legacy.state() if k else first).replace(step=step)
        lr_state = sides.set_both(state)
        batch = sides.batch(seed=100 + k)
        out_m = modern.step(batch, before=state)
        _, tower_feed = legacy.feed(batch, True)
        masks = sides.tower_masks(batch, tower_feed.rows, out_m["masks"], out_m["replicas"])
        loss_l, lr_l, grads_l, stats = legacy.train(batch, masks)
        after_l = legacy.state()
        after_w = modern.weights(names)
        after_s = modern.slot_values(names)
        t = modern.iterations()
        losses_l.append(loss_l)
        losses_m.append(out_m["loss"])
        lr_errors.append(tensor_error(f"lr at step {step}", np.float32(out_m["lr"]), np.float32(lr_l)))
        grad_err += [dataclasses.replace(e, name=f"step {step}: {e.name} gradient")
                     for e in gradient_errors(sides, grads_l, out_m["gradients"])]
        b1p = np.float32(rule_l.beta1) ** (step + 1)
        b2p = np.float32(rule_l.beta2) ** (step + 1)
        powers_m = (float(np.float32(rule_m.beta1) ** np.float32(t)), float(np.float32(rule_m.beta2) ** np.float32(t)))
        keras_before = {n: optimizers.modern_slots_from_legacy(rule_m, state.slots[n], lr_state) for n in names}
        jobs = [("legacy", n) for n in names] + [("modern", n) for n in names]

        def judge_one(job, step=step, state=state, after_l=after_l, grads_l=grads_l, lr_l=lr_l, out_m=out_m,
                      b1p=b1p, b2p=b2p, keras_before=keras_before, after_s=after_s, after_w=after_w,
                      powers_m=powers_m):
            side, n = job
            if side == "legacy":
                return optimizers.update_errors(
                    f"legacy step {step}: {n}", rule_l, dict(state.slots[n], w=state.weights[n]),
                    dict(after_l.slots[n], w=after_l.weights[n]), grads_l[n], lr_l, (float(b1p), float(b2p)),
                    sides.tolerances["optimizer"].rel_l2)
            return optimizers.update_errors(
                f"modern step {step}: {n}", rule_m, dict(keras_before[n], w=state.weights[n]),
                dict(after_s[n], w=after_w[n]), out_m["gradients"][n], out_m["lr"], powers_m,
                sides.tolerances["optimizer"].rel_l2)
        for errors in common.parallel_map(judge_one, jobs):
            opt_err += errors
        count_err += [tensor_error(f"step {step}: legacy global step", np.float64(after_l.step), np.float64(step + 1)),
                      tensor_error(f"step {step}: modern iterations", np.float64(t), np.float64(step + 1))]
        if legacy.powers:
            after_powers = legacy.sess.run([legacy.powers["beta1_power"], legacy.powers["beta2_power"]])
            count_err.append(tensor_error(f"step {step}: legacy beta powers", np.array(after_powers, np.float64),
                                          np.float32([rule_l.beta1, rule_l.beta2]) ** np.float64(step + 2)))
        moving.append((state.weights, after_l.weights, modern.weights([u.variable.op.name for u in legacy.moving]),
                       stats, step))
    loss_err = [tensor_error(f"loss at step {s}", a, b) for s, a, b in zip(steps_at, losses_l, losses_m)]
    counters_ok = all(e.max_abs == 0 for e in count_err if "beta" not in e.name) and all(
        e.max_rel <= 64 * EPS32 for e in count_err if "beta" in e.name)
    plural = "s" if len(steps_at) != 1 else ""
    schedule = ("continuous" if points is None else f"changes after steps {points}" if points else "constant")
    label, name = sides.label, sides.pair.name
    lr_tol = sides.tolerances["schedule"] if points is None else "exact"
    probes = schedule_probes(points) if not suffix else []
    lr_errors += [tensor_error(f"lr at step {s} (probed)", np.float32(modern_rate_at(modern, s)),
                               np.float32(legacy.learning_rate_at(s))) for s in probes]
    results = [
        judge(f"{label}lr schedule{suffix}", name, lr_errors, lr_tol,
              note=f"the rate each step used, at global steps {steps_at}, and the schedules probed at {probes}; "
                   f"the legacy schedule {schedule}"),
        judge(f"{label}{len(steps_at)} training step{plural}: loss and gradients{suffix}", name, loss_err + grad_err,
              tol,
              note=f"each step from the legacy state; modern gradients {out_m['source']}",
              extra={"losses": {"legacy": losses_l, "modern": losses_m}}),
        judge(f"{label}{len(steps_at)} training step{plural}: optimizer on each side{suffix}", name, opt_err,
              sides.tolerances["optimizer"],
              note=f"every variable's update and slots against its own rule: legacy {rule_l.describe()}, "
                   f"modern {rule_m.describe()}"),
        judge(f"{label}step counters{suffix}", name, count_err, "exact", ok=counters_ok,
              note="legacy global step and modern iterations +1 per step"
                   + ("; TF1's running beta powers = beta^t (64 eps32)" if legacy.powers else "")),
    ]
    if legacy.moving:
        results.append(check_moving_statistics(sides, moving, suffix))
    return results


# ---------------------------------------------------------------------------------------------
# Batch-norm moving statistics

def schedules(n):
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
        done, sets, reads = set(), {}, []
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


_SCHEDULES = {}


def predictions_legacy(before, stats, decay):
    """Every value n unordered updates (one per schedule) can leave in a shared variable:
    v_after = v - sum_i (v_read_i - a_i)(1 - d)."""
    n = len(stats)
    if n not in _SCHEDULES:
        _SCHEDULES[n] = schedules(n)
    preds = []
    for reads, sets in _SCHEDULES[n]:
        delta = {}
        for i in reads:
            delta[i] = (before - sum(delta[j] for j in sets[i]) - stats[i]) * (1 - decay)
        preds.append(before - sum(delta.values()))
    return preds


def moving_groups(legacy):
    """{variable name: [indices into legacy.moving]}: the updates of each moving statistic, in tower order."""
    groups = {}
    for i, u in enumerate(legacy.moving):
        groups.setdefault(u.variable.op.name, []).append(i)
    return {n: sorted(ix, key=lambda i: legacy.moving[i].tower or 0) for n, ix in groups.items()}


def check_moving_statistics(sides, per_step, suffix=""):
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
    legacy, modern, tol = sides.legacy, sides.modern, sides.tolerances["model"]
    groups = moving_groups(legacy)
    decay = legacy.moving_decays()
    n_updates = max(len(ix) for ix in groups.values())
    errors, seen, gaps = [], {}, []
    for before, after_l, after_m, stats, step in per_step:
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


def replica_copies(variable):
    import keras
    inner = variable.value if isinstance(variable, keras.Variable) else variable
    values = getattr(inner, "values", None)
    return [v.numpy() for v in values] if values else [inner.numpy()]
