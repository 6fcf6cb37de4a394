"""The legacy graph on TF1's own runtime (ref variables, v1 control flow), in a process of its own."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, NamedTuple, Optional, Sequence

import numpy as np

from compare import limits, process
from compare.checks.forward import gradient_errors
from compare.report import judge, tensor_error
from compare.report import Result, Tolerance
from compare.settings import Settings
from compare.sides import Sides
from compare.state import StepOutcome


class Launched(NamedTuple):
    """The TF1-runtime process, started (compare.process): where it writes, and the modern step it is
    compared with."""
    started: process.Started
    out_path: str
    step: StepOutcome

    def stop(self) -> None:
        """End the process if it still runs (a run that ends before collecting it)."""
        self.started.stop()


def launch(sides: Sides, settings: Settings) -> Launched:
    """Start compare/tf1_runtime.py on one batch, with the masks the modern step drew from the start:
    it runs beside the harness's other checks (a process of its own, mostly the Python of its graph's
    build) until `check_tf1_runtime` collects it."""
    batch = sides.batch(seed=3)
    sides.set_modern(sides.start)  # the process sets its legacy graph from the start checkpoint
    step = sides.modern.step(batch, before=sides.start)
    masks = sides.masks_for(batch, step) or []
    in_path = os.path.join(sides.tmp_dir, f"{sides.pair.name}_tf1_in.npz")
    out_path = os.path.join(sides.tmp_dir, f"{sides.pair.name}_tf1_out.npz")
    meta = {"adapter": sides.pair.module, "programs": dict(sides.pair.programs), "pairing": sides.pairing.label,
            "towers": sides.towers, "seed": sides.seed, "start": sides.start_path, "files": dict(sides.files),
            "dropouts": len(masks), "repeats": settings.tf1_repeats,
            "argv": list(sides.pair.harness_argv(sides.towers)), "seconds": limits.seconds()}
    arrays = {f"mask:{k}": np.array(per_tower, dtype=object) for k, per_tower in enumerate(masks)}
    np.savez(in_path, x=batch.x, y=batch.y, meta=np.array(json.dumps(meta)), **arrays)  # type: ignore[arg-type]
    started = process.start("compare.tf1_runtime", [in_path, out_path],
                            os.path.join(sides.tmp_dir, f"{sides.pair.name}_tf1.log"))
    return Launched(started, out_path, step)


def check_tf1_runtime(sides: Sides, launched: Launched) -> list[Result]:
    """The legacy graph built by the adapter after `disable_v2_behavior()` (compare/tf1_runtime.py),
    from the start checkpoint, with the masks the modern step drew (`launch`): its loss and gradients
    against the modern step's (PASS), and one step's moving statistics against the unordered-update
    predictions (EXPECTED: with ref variables the towers' assign_sub ops on one shared variable are
    unordered and unlocked, so each element may see its own schedule)."""
    name = f"{sides.label}legacy on TF1's runtime"
    program = getattr(sides.pair.legacy, "program", sides.pair.name)
    if launched.started.wait_limited(f"the TF1-runtime process (compare/tf1_runtime.py) of {program}") != 0:
        return [judge(name, sides.pair.name, [], sides.tol.model, ok=False,
                      note=f"compare/tf1_runtime.py failed: {[launched.started.last_line()]}")]
    step = launched.step
    out = np.load(launched.out_path, allow_pickle=True)
    grads = {k[5:]: out[k] for k in out.files if k.startswith("grad:")}
    errors = [tensor_error("loss", out["loss"], step.loss)] + gradient_errors(sides, grads, step.gradients)
    results = [judge(f"{name}: loss and gradients", sides.pair.name, errors, sides.tol.model,
                     note=f"{len(grads)} gradients, the legacy graph on TF1's runtime ({out['variable_class']}) "
                          f"vs the modern train step")]
    updates = json.loads(str(out["updates"]))
    if updates:
        results.append(moving_on_ref_variables(sides, out, updates))
    return results


def interleavings(n: int) -> list[tuple[list[tuple[int, str]], bool]]:
    """Every way n unlocked `v -= delta_i` on one ref variable can interleave, as event orders.

    Tower i reads v for its delta (R: delta_i = (v_read - a_i)(1 - d)), then its AssignSub reads v
    again (r) and writes v_read' - delta_i (w), with nothing locked between r and w (use_locking=False):
    another tower's write between them is lost.  Returns [(order, atomic)] over every order of the 3n
    events with R_i < r_i < w_i, one per distinct outcome (found by evaluating each at random values);
    `atomic`: no write lands between another tower's r and w (nothing lost)."""
    import itertools
    events = [(i, k) for i in range(n) for k in "Rrw"]
    rng = np.random.RandomState(0)
    v0, a, c = rng.normal(size=1)[0], rng.normal(size=n), 0.3
    seen: dict[float, int] = {}
    out: list[tuple[list[tuple[int, str]], bool]] = []
    for perm in itertools.permutations(range(3 * n)):
        order = [events[p] for p in perm]
        pos = {e: k for k, e in enumerate(order)}
        if any(not (pos[(i, "R")] < pos[(i, "r")] < pos[(i, "w")]) for i in range(n)):
            continue
        value = round(float(outcome(order, v0, a, c)), 10)
        atomic = not any(pos[(j, "r")] < pos[(i, "w")] < pos[(j, "w")] for i in range(n) for j in range(n) if i != j)
        if value not in seen or (atomic and not out[seen[value]][1]):
            if value in seen:
                out[seen[value]] = (order, atomic)
            else:
                seen[value] = len(out)
                out.append((order, atomic))
    return out


def outcome(order: Sequence[tuple[int, str]], v0: Any, stats: Any, c: float) -> Any:
    """The value `order` leaves in the variable (elementwise: v0 and stats may be arrays)."""
    stored, delta, rmw = v0, {}, {}
    for i, kind in order:
        if kind == "R":
            delta[i] = (stored - stats[i]) * c
        elif kind == "r":
            rmw[i] = stored
        else:
            stored = rmw[i] - delta[i]
    return stored


_ORDERS: dict[int, list[tuple[list[tuple[int, str]], bool]]] = {}


def moving_on_ref_variables(sides: Sides, out: Any, updates: Sequence[tuple[str, Optional[int]]]) -> Result:
    return ref_variable_result(out, updates, sides.legacy.moving_decays(), sides.tol.model,
                               f"{sides.label}legacy on TF1's runtime: bn moving statistics", sides.pair.name)


def ref_variable_result(out: Any, updates: Sequence[tuple[str, Optional[int]]], decays: Mapping[str, float],
                        tolerance: Tolerance, check: str, model: str) -> Result:
    """EXPECTED (several towers): each moving statistic after the step(s) TF1's runtime ran, against
    every outcome its towers' unlocked read-modify-writes allow (`interleavings`): each element must
    be one of them (a wrong decay matches none), and a lost update, which a race leaves in some
    statistics of some steps, may not be the only explanation of more than half of the statistics of a
    step (a tower's update missing altogether leaves it in all of them).

    out: the TF1-runtime process's arrays (before:V, after:R:V, stat:R:I, repeats); updates: [(V, tower)]
    in the order of the stat:R:I indices; decays: {V: decay}."""
    tol = tolerance.rel_l2
    groups: dict[str, list[tuple[int, int]]] = {}
    for i, (var, tower) in enumerate(updates):
        groups.setdefault(var, []).append((tower or 0, i))
    n = max(len(v) for v in groups.values())
    if n not in _ORDERS:
        _ORDERS[n] = interleavings(n)
    orders = _ORDERS[n]
    repeats = int(out["repeats"])
    errors, whole, racy_per_step, gaps = [], 0, [], []
    for r in range(repeats):
        racy = 0
        for var, members in sorted(groups.items()):
            c = 1 - decays[var]
            v = out[f"before:{var}"].astype(np.float64)
            a = [out[f"stat:{r}:{i}"].astype(np.float64) for _, i in sorted(members)]
            after = out[f"after:{r}:{var}"]
            preds = np.stack([outcome(order, v, a, c) for order, _ in orders])
            atomic = np.array([is_atomic for _, is_atomic in orders])
            floor = ((len(a) + 1) * np.linalg.norm(np.spacing(np.abs(out[f"before:{var}"])))
                     + 4 * c * sum(np.linalg.norm(np.spacing(np.abs(s.astype(np.float32)))) for s in a)) / tol
            scores = [tensor_error("", after - v, p - v, floor).rel_l2 for p in preds[atomic]]
            if min(scores) <= tol:  # one atomic order for the whole tensor
                whole += 1
                best = preds[atomic][int(np.argmin(scores))]
            else:  # element by element, lost updates included
                pick = np.argmin(np.abs(preds - after), axis=0)
                best = np.take_along_axis(preds, pick[None], axis=0)[0]
                atomic_best = np.take_along_axis(preds[atomic], np.argmin(np.abs(preds[atomic] - after), axis=0)[None],
                                                 axis=0)[0]
                racy += int(tensor_error("", after - v, atomic_best - v, floor).rel_l2 > tol)
            errors.append(tensor_error(f"{var}" + (f" (step {r})" if repeats > 1 else ""), after - v, best - v, floor))
            gaps.append(tensor_error("", v - (v - np.mean(a, axis=0)) * c - v, best - v, floor).rel_l2)
        racy_per_step.append(racy)
    distinct = n == 1 or min(gaps) > tol
    statistics = len(groups)
    few_lost = all(k <= statistics / 2 for k in racy_per_step)
    ok = distinct and few_lost and all(e.rel_l2 <= tol for e in errors)
    return judge(check, model, errors, tolerance, expected=n > 1, ok=ok,
                 note=f"{statistics} moving statistics x {repeats} step(s) of {n} unordered, unlocked ref-variable "
                      f"updates ({len(orders)} outcomes, {int(sum(o[1] for o in orders))} without a lost update): "
                      f"{whole} matched one atomic order as a whole; statistics with a lost update per step: "
                      f"max {max(racy_per_step)} (allowed: half, {statistics // 2})"
                      + (f"; a single mean update is off by >= {min(gaps):.2g}" if n > 1 else ""))
