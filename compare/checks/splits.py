"""Batches that do not split evenly: short, uneven, fewer rows than towers, a replica left empty.

Each prediction is computed from how the legacy program hands the batch to its towers (the rows
of its TowerFeed, and each tower's share of the step, its weight over the weights' sum: a
model_deploy clone weighs 1 and divides its own loss by the clones) and how the modern input path
hands it to the replicas (each replica's rows and weights, read off the distributed element):

  short batch       a multiple of the towers, fewer rows than a full one: legacy = modern.
  uneven batch      N b - 1 rows.
                    The legacy towers see every row, weighted by their rows: legacy = modern.
                    The legacy towers drop rows (equal slices, each 1/N): the modern program keeps
                      every row (EXPECTED: the legacy step equals the modern step on the rows it kept,
                      and differs from it on all rows).  A modern step that drops rows FAILs, the same
                      rows as the legacy or not: a strategy's input path never drops one, so a port
                      that does has a split of its own.
                    The legacy towers see every row in unequal slices, each weighted 1/N (rows of
                      different towers weigh differently): legacy = sum_i w_i M(rows_i), M the modern
                      step on tower i's rows alone, when the model's rows are independent (no batch
                      norm, no dropout); EXPECTED.
  fewer rows        N - 1 rows.  A legacy tower left without rows fails (a mean over no rows is
                    NaN; on this CPU build oneDNN's Conv2D raises instead); the modern step must be
                    finite, with every row weighing alike (EXPECTED).  Legacy towers that all see rows:
                    legacy = modern, or, where they see other rows than the replicas and batch norm
                    couples a tower's rows, the legacy towers fed the replicas' rows = modern.
  empty replica     N + 1 rows on N >= 3 replicas, which the strategy's cut (ceil(rows/N) in order)
                    leaves a replica without rows: the modern step finite, every row weighing alike.
With LegacyGraph.feed_towers, the legacy towers are also fed exactly the rows each modern replica got,
at the modern weights, and must then equal the modern step.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf


from compare.checks.forward import gradient_errors, step_both
from compare.interface import Batch, NotFed, TowerFeed
from compare.report import Result, TensorError, judge, not_applicable, tensor_error
from compare.sides import Sides, StepOutcome, TowerRows, replica_rows, row_index, row_key
from compare.state import ReplicaBatch

UNEVEN = "uneven batch"  # the case whose dropped rows are "split: remainder dropped", unqualified


def errors_of(sides: Sides, legacy: StepOutcome, modern: StepOutcome) -> list[TensorError]:
    return [tensor_error("loss", legacy.loss, modern.loss)] + gradient_errors(sides, legacy.gradients,
                                                                              modern.gradients)


def finite(outcome: StepOutcome) -> bool:
    return bool(np.isfinite(outcome.loss)) and all(np.all(np.isfinite(g)) for g in outcome.gradients.values())


def modern_row_weights(batch: Batch, replicas: Sequence[ReplicaBatch]) -> tuple[np.ndarray, int]:
    """Each batch row's share of the modern step's loss: the weights of its copies over all replicas,
    over the total weight (the step divides the summed loss by the rows counted by weight); and the
    number of modern rows that are no row of the batch."""
    index = row_index(batch)
    total = np.zeros(batch.rows)
    unknown = 0
    for x, y, w in replicas:
        for j in range(len(x)):
            b = index.get(row_key(x[j], y[j]))
            if b is None:
                unknown += 1
            else:
                total[b] += float(w[j])
    return total / max(total.sum(), 1e-30), unknown


def keeps_every_row(batch: Batch, replicas: Sequence[ReplicaBatch]) -> bool:
    """Whether the modern step weighs every row of the batch alike (a mean over all its rows)."""
    share, unknown = modern_row_weights(batch, replicas)
    return unknown == 0 and bool(np.all(np.abs(share * batch.rows - 1) <= 1e-6))


def tower_outcome(sides: Sides, batch: Batch) -> tuple[list[int], str]:
    """Which legacy towers fail on `batch` (each tower's loss run on its own): NaN, or the op raises."""
    feed = sides.legacy.feed(batch, True).feed_dict
    failed, how = [], set()
    for i, loss in enumerate(sides.legacy.lg.tower_losses):
        try:
            if not np.isfinite(sides.legacy.sess.run(loss, feed)):
                failed.append(i)
                how.add("NaN")
        except tf.errors.InvalidArgumentError:
            failed.append(i)
            how.add("the op raised (oneDNN on an empty batch)")
    return failed, ", ".join(sorted(how)) or "none failed"


def check_splits(sides: Sides) -> list[Result]:
    results = fed(sides, "short last batch", lambda: [check_short(sides)])
    if sides.towers == 1 or sides.pairing.same_rows_on_every_tower:
        return results  # one tower, or every tower sees every row: nothing is split
    results += fed(sides, "uneven batch", lambda: check_uneven(sides))
    results += fed(sides, "fewer rows than towers", lambda: [check_fewer(sides)])
    if sides.towers >= 3:
        results += fed(sides, "a replica the strategy leaves empty", lambda: [check_empty_replica(sides)])
    return results


def fed(sides: Sides, case: str, run: Callable[[], list[Result]]) -> list[Result]:
    """`run()`, or NOT APPLICABLE when the legacy program can never receive such a batch (NotFed)."""
    try:
        return run()
    except NotFed as reason:
        return [not_applicable(f"{sides.label}split: {case}", sides.pair.name, str(reason))]


def check_short(sides: Sides) -> Result:
    """The short last batch of an epoch, still a multiple of the towers: N (b - 1) rows."""
    n, b = sides.towers, sides.pair.rows_per_tower
    rows = max(1, (b - 1)) * (1 if sides.pairing.same_rows_on_every_tower else n)
    return judge_cut(sides, rows, "short last batch", seed=5)


def check_uneven(sides: Sides) -> list[Result]:
    """N b - 1 rows (not a multiple of the towers, for N > 1)."""
    rows = sides.towers * sides.pair.rows_per_tower - 1
    results = [judge_cut(sides, rows, UNEVEN, seed=6)]
    if sides.legacy.lg.feed_towers is not None:
        batch = sides.batch(rows, seed=6)
        sides.set_modern(sides.start)  # the legacy towers are set by check_replica_rows
        step = sides.modern.step(batch, before=sides.start)
        results.append(check_replica_rows(sides, batch, step, UNEVEN))
    return results


def shares(feed: TowerFeed) -> np.ndarray:
    """Each tower's share of the step, w_i / sum(w): the TowerFeed's weights are the towers' weights in
    the combined loss, where a tower's loss may hold a factor of its own (a model_deploy clone's loss
    is divided by the clone count, and its weight is 1).  How large the step is as a whole is the
    forward and gradient checks' to judge; these checks judge how the batch is shared among its rows."""
    weights = np.asarray(feed.weights, np.float64)
    total = float(np.sum(weights))
    return weights / total if total else weights


def judge_cut(sides: Sides, rows: int, case: str, seed: int) -> Result:
    """One batch of `rows` rows, judged by how the legacy program cuts it over its towers (see the
    module docstring): equal, remainder dropped, or towers weighted equally."""
    tol = sides.tol.model
    batch = sides.batch(rows, seed=seed)
    both = step_both(sides, batch, sides.start)
    step, feed = both.modern, both.towers
    kept = [np.asarray(r, int) for r, w in zip(feed.rows, feed.weights) if w > 0]
    sizes = [len(r) for r in kept]
    seen = set(np.concatenate(kept).tolist()) if kept else set()
    keeps_all = keeps_every_row(batch, step.replicas)
    share = shares(feed)
    shared = "" if np.allclose(share, feed.weights) else f", shares {np.round(share, 4).tolist()}"
    cut = (f"{rows} rows: legacy towers {[len(r) for r in feed.rows]} (weights {np.round(feed.weights, 4).tolist()}"
           f"{shared}), modern rows {step.rows}")
    weighted_by_rows = np.allclose(share, [len(r) / rows for r in feed.rows], rtol=1e-6)
    same_rows = all(len(r) == rows for r in feed.rows)  # every tower sees every row
    if len(seen) == rows and (weighted_by_rows or same_rows):
        return judge(f"{sides.label}split: {case}", sides.pair.name, errors_of(sides, both.legacy, step),
                     tol, ok=None if keeps_all else False,
                     note=cut + ("; every row weighs alike on both sides" if keeps_all
                                 else "; the modern input path does not weigh every row alike"))
    if len(seen) < rows and len(set(sizes)) == 1:
        return judge_dropped(sides, batch, feed, both.legacy, step, keeps_all, cut,
                             "" if case == UNEVEN else f" ({case})")
    return check_equal_weights(sides, batch, feed, both.legacy, step,
                               f"{sides.label}split: {case}, towers weighted equally", cut)


def judge_dropped(sides: Sides, batch: Batch, feed: TowerFeed, legacy: StepOutcome, step: StepOutcome,
                  keeps_all: bool, cut: str, qualifier: str) -> Result:
    """The legacy split drops rows (equal slices): compare it with the modern step on the rows it kept."""
    tol = sides.tol.model
    kept = [np.asarray(r, int) for r, w in zip(feed.rows, feed.weights) if w > 0]
    seen = set(np.concatenate(kept).tolist())
    dropped = batch.rows - len(seen)
    name = f"{sides.label}split: remainder dropped{qualifier}"
    if keeps_all:
        order = np.concatenate(kept)
        step_k = step_both(sides, batch.take(order), sides.start).modern
        dropped_l = sides.legacy.gradients(batch, sides.tower_masks(batch, feed.rows, step_k.masks, step_k.replicas))
        errors = errors_of(sides, dropped_l, step_k)
        gap = max(e.rel_l2 for e in gradient_errors(sides, legacy.gradients, step.gradients))
        ok = gap > 10 * tol.rel_l2 and all(e.rel_l2 <= tol.rel_l2 for e in errors)
        return judge(name, sides.pair.name, errors, tol, expected=True, ok=ok,
                     note=f"{cut}: legacy drops {dropped} and equals the modern step on the {len(order)} rows it "
                          f"keeps; on all {batch.rows} rows the modern step differs from it by {gap:.2g} "
                          f"(> 10 x tolerance)")
    # The strategy's input path never drops a row: a modern step that does has a split of its own.
    share, _ = modern_row_weights(batch, step.replicas)
    same = set(np.flatnonzero(share > 0).tolist()) == seen
    return judge(name, sides.pair.name, [], tol, ok=False,
                 note=f"{cut}: the modern step does not weigh every row alike"
                      + (": it drops the rows the legacy split drops (a split of its own?)" if same else ""))


def check_equal_weights(sides: Sides, batch: Batch, feed: TowerFeed, legacy: StepOutcome, step: StepOutcome,
                        name: str, cut: str) -> Result:
    """Legacy towers of unequal rows, each weighted as the program weighs it: predicted from the
    modern step on each tower's rows alone (rows independent: no batch norm, no dropout)."""
    modern, tol = sides.modern, sides.tol.model
    if modern.batch_norms or modern.dropouts:
        return not_applicable(name, sides.pair.name, f"{cut}: the towers weigh their rows unequally; the "
                                                     "prediction needs rows independent of each other (the model "
                                                     "has batch norm or dropout)")
    loss_p, grads_p = 0.0, {k: np.zeros(np.shape(g)) for k, g in legacy.gradients.items()}
    for rows, w in zip(feed.rows, shares(feed)):
        if not len(rows) or not w:
            continue
        sides.set_modern(sides.start)
        part = modern.step(batch.take(np.asarray(rows, int)), before=sides.start)
        loss_p += w * part.loss
        grads_p = {k: grads_p[k] + w * np.asarray(part.gradients[k], np.float64) for k in grads_p}
    errors = errors_of(sides, legacy, StepOutcome(loss_p, grads_p))
    gap = max(e.rel_l2 for e in gradient_errors(sides, grads_p, step.gradients))
    ok = (gap > 10 * tol.rel_l2 and all(e.rel_l2 <= tol.rel_l2 for e in errors)
          and keeps_every_row(batch, step.replicas))
    return judge(name, sides.pair.name, errors, tol, expected=True, ok=ok,
                 note=f"{cut}: legacy = sum of its towers' weights x the modern step on each tower's rows alone; "
                      f"the modern step on all rows (each alike) differs from it by {gap:.2g} (> 10 x tolerance)")


def check_fewer(sides: Sides) -> Result:
    """Fewer rows than towers: N - 1 rows."""
    n, tol = sides.towers, sides.tol.model
    rows = n - 1
    batch = sides.batch(rows, seed=7)
    name = f"{sides.label}split: fewer rows than towers"
    feed = sides.legacy.feed(batch, True).towers
    empty = [i for i, (r, w) in enumerate(zip(feed.rows, feed.weights)) if not len(r) and w > 0]
    sides.set_both(sides.start)
    try:
        step = sides.modern.step(batch, before=sides.start)
    except tf.errors.InvalidArgumentError as error:  # an empty replica the port does not handle
        return judge(name, sides.pair.name, [], tol, ok=False,
                     note=f"{rows} rows: the modern step failed ({str(error).strip().splitlines()[-1][:100]})")
    ok_m = finite(step) and keeps_every_row(batch, step.replicas)
    cut = f"{rows} rows on {n} towers: legacy towers {[len(r) for r in feed.rows]}, modern rows {step.rows}"
    if empty:
        failed, how = tower_outcome(sides, batch)
        errors = []
        if sides.legacy.lg.feed_towers is not None and ok_m:
            errors = replica_row_errors(sides, batch, step)
        return judge(name, sides.pair.name, errors, tol, expected=True,
                     ok=failed == empty and ok_m and all(e.rel_l2 <= tol.rel_l2 for e in errors),
                     note=f"{cut}: legacy towers {failed} failed ({how}), predicted {empty} (no rows); the modern "
                          f"step finite, every row weighing alike"
                          + (", = the legacy towers fed the modern replicas' rows"
                                                           if errors else ""))
    # Every tower sees rows.  legacy = modern when the towers see the rows the replicas see, or when
    # no layer couples a tower's rows; batch norm in training normalises over a tower's own rows, so
    # other cuts give other numbers: then the legacy towers are fed the replicas' rows instead.
    if sides.legacy.moving and not same_cut(feed.rows, feed.weights, replica_rows(batch, step.replicas)):
        if sides.legacy.lg.feed_towers is None:
            return not_applicable(name, sides.pair.name,
                                  f"{cut}: the towers and the replicas cut the batch differently and batch norm "
                                  f"couples a tower's rows (declare LegacyGraph.feed_towers to judge it)")
        errors = replica_row_errors(sides, batch, step) if ok_m else []
        return judge(name, sides.pair.name, errors, tol, ok=None if ok_m else False,
                     note=f"{cut}: every tower sees rows, not the replicas' (batch norm normalises over each "
                          f"one's own): = the legacy towers fed the modern replicas' rows")
    sides.legacy.restore(sides.start)
    masks = sides.tower_masks(batch, feed.rows, step.masks, step.replicas)
    return judge(name, sides.pair.name, errors_of(sides, sides.legacy.gradients(batch, masks), step), tol,
                 ok=None if ok_m else False, note=cut + ": every tower sees rows")


def same_cut(tower_rows: Sequence[Any], tower_weights: Sequence[float],
             replicas: Sequence[tuple[Sequence[int], float]]) -> bool:
    """Whether the legacy towers that carry weight see the same rows as the modern replicas that do
    (as multisets of row lists, in any tower order)."""
    towers = sorted(sorted(int(i) for i in r) for r, w in zip(tower_rows, tower_weights) if w > 0 and len(r))
    return towers == sorted(sorted(r) for r, w in replicas if w > 0 and len(r))


def check_empty_replica(sides: Sides) -> Result:
    """N + 1 rows on N >= 3 replicas, which the strategy's cut leaves a replica without rows."""
    n, tol = sides.towers, sides.tol.model
    rows = n + 1
    batch = sides.batch(rows, seed=8)
    name = f"{sides.label}split: a replica the strategy leaves empty"
    sides.legacy.feed(batch, True)  # NotFed: a batch the legacy program never receives
    sides.set_modern(sides.start)  # the legacy towers are set by replica_row_errors
    try:
        step = sides.modern.step(batch, before=sides.start)
    except tf.errors.InvalidArgumentError as error:
        return judge(name, sides.pair.name, [], tol, ok=False,
                     note=f"{rows} rows on {n} replicas: the modern step failed "
                          f"({str(error).strip().splitlines()[-1][:100]})")
    ok = finite(step) and keeps_every_row(batch, step.replicas)
    errors = replica_row_errors(sides, batch, step) if sides.legacy.lg.feed_towers is not None and ok else []
    return judge(name, sides.pair.name, errors, tol, ok=ok and all(e.rel_l2 <= tol.rel_l2 for e in errors),
                 note=f"{rows} rows on {n} replicas (the strategy's cut: {-(-rows // n)} per replica in order): "
                      f"modern rows {step.rows}, finite, every row weighing alike"
                      + (", = the legacy towers fed the modern replicas' rows" if errors else ""))


def replica_row_errors(sides: Sides, batch: Batch, step: StepOutcome) -> list[TensorError]:
    """The legacy towers fed exactly the rows (and weights) of each modern replica, against the
    modern step (LegacyGraph.feed_towers)."""
    cut = replica_rows(batch, step.replicas)
    if any(i < 0 for rows, _ in cut for i in rows):
        raise KeyError("a modern replica holds a row that is no row of the batch")
    rows = [np.array(r, int) for r, _ in cut]
    weights = [w / sum(w_ for _, w_ in cut) for _, w in cut]
    sides.legacy.restore(sides.start)
    masks = sides.tower_masks(batch, rows, step.masks, step.replicas)
    return errors_of(sides, sides.legacy.gradients(batch, masks, towers=TowerRows(rows, weights)), step)


def check_replica_rows(sides: Sides, batch: Batch, step: StepOutcome, what: str) -> Result:
    return judge(f"{sides.label}split: legacy towers fed the replicas' rows ({what})", sides.pair.name,
                 replica_row_errors(sides, batch, step), sides.tol.model,
                 note=f"modern rows {step.rows}, fed to the legacy towers through feed_towers")
