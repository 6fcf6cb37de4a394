"""Forward passes and gradients: inference, dropout, the training forward pass, gradients, free variables."""
from __future__ import annotations

import itertools
import types
from typing import Any, Mapping, NamedTuple, Optional, Sequence

import numpy as np

from compare import causes, common, counterfactuals, diagnosis
from compare import tf1_graph
from compare.interface import Batch, NotFed, TowerFeed
from compare.measures import FREE, free_biases, grad_errors, gradient_errors
from compare.report import EPS32, MARGIN, Tolerance, judge, not_applicable, tensor_error
from compare.modern_run import ModernRun
from compare.report import Result, TensorError
from compare.state import Masks
from compare.sides import Sides, State, StepOutcome, TowerRows
from modern.resnet_v2 import ReplicaDropout

__all__ = ["FREE", "check_dropout", "check_free_variables", "check_inference", "check_training", "free_biases",
           "grad_errors", "gradient_errors", "gradient_judge", "step_both"]


def gradient_judge(sides: Sides, legacy: Mapping[str, Any], free: Optional[Sequence[str]] = None) -> causes.Judge:
    """Candidate modern gradients -> (every variable within its tolerance against `legacy`, the worst
    error, its tolerance): how the catalogue's gradient counterfactuals are judged, as the check was."""
    check = sides.tol.model.rel_l2

    def judge_candidate(candidate: dict[str, np.ndarray]) -> tuple[bool, float, float]:
        errors = gradient_errors(sides, legacy, candidate, free=free)
        worst = max(errors, key=lambda e: e.rel_l2 / e.limit(check))
        return all(e.rel_l2 <= e.limit(check) for e in errors), worst.rel_l2, worst.limit(check)
    return judge_candidate


class BothSteps(NamedTuple):
    """One batch on both sides from one state: the legacy gradients (nothing applied), the modern
    step, and how the legacy program handed the batch to its towers."""
    legacy: StepOutcome
    modern: StepOutcome
    towers: TowerFeed


def own_tolerances(sides: Sides) -> str:
    """The note on the gradients that have tolerances of their own (compare.tolerances.row_order_tolerances)."""
    own = sides.tol.tensors
    if not own:
        why = " (batch norm couples a tower's rows)" if sides.legacy.moving else ""
        return f"; every gradient at the model tolerance{why}"
    top = max(own.values(), key=lambda t: t.rel_l2)
    return (f"; {len(own)} gradient(s) with a tolerance of their own, {MARGIN} x their spread with each tower's "
            f"rows in another order (largest: {top.name[len('gradient '):]} {top.rel_l2:.2g})")


def step_both(sides: Sides, batch: Batch, state: State, towers: Optional[TowerRows] = None) -> BothSteps:
    """From `state`, the modern train step on `batch`, then the legacy gradients with the masks the
    modern step drew, for the rows each tower sees."""
    tower_feed = sides.legacy.feed(batch, True, towers=towers).towers  # first: NotFed before any step runs
    sides.set_both(state)
    step = sides.modern.step(batch, before=state)
    masks = sides.tower_masks(batch, tower_feed.rows, step.masks, step.replicas)
    return BothSteps(sides.legacy.gradients(batch, masks, towers=towers), step, tower_feed)


def check_inference(sides: Sides) -> Result:
    """Inference mode (the program's validation feed): each legacy tower's logits against the
    model's on the same rows.  NOT APPLICABLE where the legacy graph has no inference mode (a
    dropout on whatever is fed): its "inference" logits are training-mode logits with random masks,
    which the port's inference does not compute; the training forward pass is judged instead, with
    the same masks on both sides."""
    if sides.always_on:
        noise = sorted(d.noise.op.name for d in sides.always_on if not d.tower)
        return not_applicable(f"{sides.label}forward (inference)", sides.pair.name,
                              f"the legacy graph has no inference mode: its dropout noise ({', '.join(noise)}) "
                              f"is drawn whatever the program feeds (a network built with is_training=True); the "
                              f"forward pass is judged in training mode, with the same masks on both sides, by "
                              f"'forward (training, same dropout masks)'")
    sides.set_both(sides.start)
    batch = sides.batch(seed=2)
    try:
        logits, tower_feed = sides.legacy.inference_logits(batch)
    except NotFed as why:
        return not_applicable(f"{sides.label}forward (inference)", sides.pair.name, str(why))
    predicted = sides.modern.predict(batch.x)
    errors = [tensor_error(f"tower {i} logits ({len(rows)} rows)", out, predicted[np.asarray(rows, int)])
              for i, (out, rows) in enumerate(zip(logits, tower_feed.rows)) if len(rows)]
    result = judge(f"{sides.label}forward (inference)", sides.pair.name, errors, sides.tol.model,
                   note=f"{batch.rows} rows, logits of {len(errors)} towers against the model's")
    return diagnosis.guarded(result, lambda: diagnosis.localise_layers(
        sides, batch, training=False, explain=causes.explain_layer, outside=lambda: causes.unexplained([])))


def check_dropout(sides: Sides, units: int = 2 ** 23) -> Result:
    """Each dropout in training mode on a large input of ones (~8M units per tower): the kept
    fraction is 1 - rate within 5 sigma of binomial noise, kept units are scaled by exactly
    1 / (1 - rate), and different towers (replicas) draw different masks (independent masks agree on
    a fraction kp^2 + (1 - kp)^2 of the units, identical ones on all).  Legacy dropouts are found in
    the graph, modern ones by type (keras.layers.Dropout)."""
    legacy, modern = sides.legacy, sides.modern
    name = f"{sides.label}dropout (training mode)"
    if not legacy.dropouts and not modern.dropouts:
        return not_applicable(name, sides.pair.name, "neither program has a dropout")
    batch = sides.batch(seed=4)
    feed = legacy.feed(batch, True).feed_dict
    errors, notes, ok = [], [], True
    kept_m: dict[int, tuple[float, float, float]] = {}  # dropout k -> the port's kept fraction, legacy rate, sigma
    by_k: dict[int, list[tf1_graph.Dropout]] = {}
    for d in legacy.dropouts:
        by_k.setdefault(legacy.dropout_index(d), []).append(d)
    if len(by_k) != len(modern.dropouts):
        return judge(name, sides.pair.name, [], sides.tol.model, ok=False,
                     note=f"the legacy towers have {len(by_k)} dropouts each, the model {len(modern.dropouts)}")
    for k in sorted(by_k):
        ds = sorted(by_k[k], key=lambda d: d.tower or 0)
        shape, rows = units_of(ds, units)
        ones = np.ones((rows, *shape), np.float32)
        rate = float(legacy.sess.run(ds[0].rate, feed))
        out_l = legacy_dropout_outputs(legacy.sess, ds, feed, ones)
        out_m = modern_dropout(modern, k, rows, shape, sides.towers)
        kp = 1 - rate
        sigma = np.sqrt(kp * (1 - kp) / ones.size)
        for side, outs in (("legacy", out_l), ("modern", out_m)):
            side_errors, side_ok, kept = _mask_statistics(f"{side} dropout {k}", outs, kp)
            errors += side_errors
            ok &= side_ok
            notes.append(f"{side} {k}: kept {np.round(kept, 4).tolist()}")
            if side == "modern":
                kept_m[k] = (float(np.mean(kept)), rate, sigma)
    sampling = Tolerance("sampling", 5 * sigma / kp, f"kept fractions within 5 sigma of binomial noise "
                                                      f"({5 * sigma:.1e} over {ones.size} units), masks agreeing "
                                                      f"within 5 sigma of kp^2 + (1 - kp)^2, kept values 1/kp "
                                                      f"within 2 eps32")
    result = judge(name, sides.pair.name, errors, sampling, ok=ok,
                   note=f"rate {rate:g}, {rows}x{'x'.join(map(str, shape))} units per tower: " + "; ".join(notes))

    return diagnosis.guarded(result, lambda: _localise_dropout(sides, by_k, kept_m, units))


def legacy_dropout_outputs(sess: Any, ds: Sequence[tf1_graph.Dropout], feed: dict,
                           ones: np.ndarray) -> list[np.ndarray]:
    """Each tower's dropout (`ds`, one per tower) on `ones`, as the legacy graph computes it.  Where the
    graph fixes the dropout input's batch (a queue's static batch size), the rows are fed that many at
    a time, each run drawing new masks, and put together: no tensor is fed a batch of another size."""
    static = ds[0].input.shape[0] if ds[0].input.shape.rank else None
    if static is None or int(static) == len(ones):
        return sess.run([d.output for d in ds], {**feed, **{d.input: ones for d in ds}})
    size = int(static)
    chunks = [sess.run([d.output for d in ds], {**feed, **{d.input: ones[:size] for d in ds}})
              for _ in range(-(-len(ones) // size))]
    return [np.concatenate([chunk[t] for chunk in chunks])[:len(ones)] for t in range(len(ds))]


def _mask_statistics(label: str, outs: Sequence[np.ndarray], kp: float
                     ) -> tuple[list[TensorError], bool, list[float]]:
    """One side's dropout `outs` (one per tower) on inputs of ones: its kept fractions against kp,
    its kept values against 1/kp, and its towers' mask agreement against kp^2 + (1 - kp)^2."""
    size = outs[0].size
    sigma, agree_sigma = np.sqrt(kp * (1 - kp) / size), np.sqrt(0.25 / size)
    kept = [float(np.mean(o != 0)) for o in outs]
    scale = np.unique(np.concatenate([o[o != 0] for o in outs]))
    e_kept = tensor_error(f"{label} kept fraction (5 sigma = {5 * sigma:.1e})", np.array(kept), np.full(len(kept), kp))
    e_scale = tensor_error(f"{label} kept value 1/(1 - rate)", np.array([scale.min(), scale.max()]),
                           np.full(2, np.float32(1 / kp)))
    errors = [e_kept, e_scale]
    ok = bool(e_kept.max_abs <= 5 * sigma and e_scale.max_rel <= 2 * EPS32)
    agree = agreements(outs)
    if agree:
        e = tensor_error(f"{label} mask agreement between towers (5 sigma = {5 * agree_sigma:.1e})",
                         np.array(agree), np.full(len(agree), kp * kp + (1 - kp) ** 2))
        errors.append(e)
        ok &= bool(e.max_abs <= 5 * agree_sigma)
    return errors, ok, kept


def _localise_dropout(sides: Sides, by_k: dict[int, list[tf1_graph.Dropout]],
                      kept_m: dict[int, tuple[float, float, float]], units: int) -> diagnosis.Diagnosis:
    """The first dropout whose kept fraction parts from the legacy's, and whether the port reading
    the rate as a keep probability (or the reverse) explains it."""
    modern = sides.modern
    for k, (kept, rate_k, sigma) in sorted(kept_m.items()):
        if abs(kept - (1 - rate_k)) <= 5 * sigma:
            continue
        layer = modern.dropouts[k]
        shape_k, rows_k = units_of(by_k[k], units)

        def retry(layer: Any = layer, k: int = k, rows_k: int = rows_k, shape_k: tuple[int, ...] = shape_k) -> float:
            old = layer.rate
            layer.rate = 1 - old
            try:
                outs = modern_dropout(modern, k, rows_k, shape_k, sides.towers)
            finally:
                layer.rate = old
            return float(np.mean([np.mean(o != 0) for o in outs]))
        where = (f"dropout {k} (the model's {layer.name}) keeps {kept:.4f} of the units where the legacy "
                 f"keeps {1 - rate_k:g}")
        return diagnosis.Diagnosis(where, causes.explain_dropout(kept, rate_k, sigma, retry), [], "dropouts")
    for k in sorted(kept_m):
        layer = modern.dropouts[k]
        shape_k, rows_k = units_of(by_k[k], units)
        kp = 1 - kept_m[k][1]
        expected, sigma = kp * kp + (1 - kp) ** 2, np.sqrt(0.25 / (rows_k * int(np.prod(shape_k))))
        agree = mask_agreement(modern_dropout(modern, k, rows_k, shape_k, sides.towers))
        if agree - expected <= 5 * sigma:
            continue

        def own_masks(layer: Any = layer, k: int = k, rows_k: int = rows_k,
                      shape_k: tuple[int, ...] = shape_k) -> float:
            layer.call = types.MethodType(ReplicaDropout.call, layer)  # each replica's id folded into its seed
            try:
                return mask_agreement(modern_dropout(modern, k, rows_k, shape_k, sides.towers))
            finally:
                del layer.call
        where = (f"dropout {k} (the model's {layer.name}): its replicas' masks agree on {agree:.4f} of the units, "
                 f"independent masks on {expected:.4f}")
        return diagnosis.Diagnosis(where, causes.explain_replica_masks(agree, expected, sigma, own_masks), [],
                                   "dropouts")
    return diagnosis.Diagnosis("every dropout keeps its legacy fraction: the masks or the scale part",
                               causes.unexplained(["keep_prob", "replica_masks"]), [], "dropouts")


def units_of(ds: Sequence[tf1_graph.Dropout], units: int) -> tuple[tuple[int, ...], int]:
    """(the shape of one row of a dropout's input, the rows of ones that make about `units` units)."""
    shape = tuple(ds[0].noise.shape[1:])
    return shape, max(1, units // int(np.prod(shape)))


def agreements(outs: Sequence[np.ndarray]) -> list[float]:
    """For every two towers' (replicas') dropout outputs on ones, the fraction of units their masks agree on."""
    return [float(np.mean((a != 0) == (b != 0))) for a, b in itertools.combinations(outs, 2)]


def mask_agreement(outs: Sequence[np.ndarray]) -> float:
    """The largest fraction of units on which two replicas' (towers') masks agree."""
    return max(agreements(outs), default=0.0)


def modern_dropout(modern: ModernRun, k: int, rows: int, shape: tuple[int, ...], replicas: int) -> list[np.ndarray]:
    """Dropout layer k of the model in training mode on ones [rows, *shape], on every replica; its
    seed put back afterwards."""
    import tensorflow as tf
    layer = modern.dropouts[k]
    before = [s.numpy() for s in modern.seeds]

    @tf.function
    def draw() -> Any:
        with modern.strategy.scope():
            return modern.strategy.run(lambda: layer(tf.ones([rows, *shape]), training=True))

    out = common.local(modern.strategy, draw())
    for s, value in zip(modern.seeds, before):
        s.assign(value)
    return out


def check_training(sides: Sides, state: Optional[State] = None, suffix: str = "") -> list[Result]:
    """Training mode on one batch from the common start (or `state`): the legacy combined loss and
    averaged gradients (the graph's `loss` and `grads_and_vars`) against the modern train step's loss
    and the gradients it applied, with the masks the modern dropout drew fed to the legacy towers."""
    batch = sides.batch(seed=3)
    both = step_both(sides, batch, state or sides.start)
    grads_l, step = both.legacy.gradients, both.modern
    free = free_biases(grads_l)
    start = state or sides.start
    loss = judge(f"{sides.label}forward (training, same dropout masks){suffix}", sides.pair.name,
                 [tensor_error("loss", both.legacy.loss, step.loss)], sides.tol.model,
                 note=f"rows per replica {step.rows}")
    gradients = judge(f"{sides.label}gradients (read out of the train step){suffix}", sides.pair.name,
                      gradient_errors(sides, grads_l, step.gradients, free=free), sides.tol.model,
                      note=f"{len(grads_l)} variables ({len(free)} free biases: round-off only), the gradients each "
                           f"legacy update received vs the modern step's, {step.source}" + own_tolerances(sides),
                      extra={"free": free, "plot": "gradients" if not suffix else ""})

    symptom = counterfactuals.Symptom(start, batch, both.legacy.masks, both.legacy.loss, grads_l, step.loss,
                                      step.gradients, free)

    def closed_loss() -> str:
        return causes.first_cause([
            lambda: causes.explain_loss(sides, both.legacy.loss, step.loss, start.weights, sides.tol.model.rel_l2),
            lambda: smoothing_cause(sides, batch, both, start)])

    def outside() -> str:
        return counterfactuals.explain(sides, symptom, closed_loss)

    def localise_loss() -> diagnosis.Diagnosis:
        sides.set_both(start)
        return diagnosis.localise_layers(sides, batch, training=True, explain=causes.explain_layer, outside=outside)

    def localise_gradients() -> diagnosis.Diagnosis:
        forward = loss.diagnosis
        if forward is not None and any(p.parts for p in forward.parts):
            # A layer parts in the forward pass already: every gradient inherits it.  (Where every
            # layer agrees and only the loss parts, say a regulariser, the gradients say where.)
            return diagnosis.Diagnosis(f"the forward pass parts before the gradients do: {forward.where}",
                                       forward.cause, forward.parts, forward.kind)
        judge_g = gradient_judge(sides, grads_l, free)

        def clip_cause() -> str:
            sides.legacy.restore(start)
            parts = [{n: w * g[n] for n in g} for w, g in zip(
                both.towers.weights, sides.legacy.tower_gradients(batch, both.legacy.masks))]
            combined = {n: np.sum([p[n] for p in parts], axis=0) for n in grads_l}
            return causes.explain_clip_per_replica(parts, combined, grads_l, step.gradients, judge_g)

        def closed_gradients() -> str:
            return causes.first_cause([
                lambda: causes.explain_gradients(sides, grads_l, step.gradients, start.weights, judge_g), clip_cause])
        return diagnosis.localise_gradients(
            sides, gradients, lambda layer: counterfactuals.explain(sides, symptom, closed_gradients))
    diagnosis.guarded(loss, localise_loss)
    return [loss, diagnosis.guarded(gradients, localise_gradients)]


def smoothing_cause(sides: Sides, batch: Batch, both: BothSteps, start: State) -> str:
    """The label_smoothing entry (causes.explain_smoothing), measured on the legacy towers' logits of
    `batch` from `start` with the masks the step used: every row the towers see weighs the same."""
    legacy = sides.legacy
    bias = tf1_graph.logits_bias(legacy.lg.tower_logits[0], legacy.by_name)
    if bias is None or bias not in both.modern.gradients:
        return causes.unexplained(["label_smoothing"])
    legacy.restore(start)
    logits = legacy.run(list(legacy.lg.tower_logits), batch, True, both.legacy.masks)
    rows = [np.asarray(r, int) for r in both.towers.rows]
    z = np.concatenate([np.asarray(t, np.float64) for t, r in zip(logits, rows) if len(r)])
    k = z.shape[-1]
    y = np.concatenate([np.asarray(batch.y)[r] for r in rows if len(r)])
    onehot = y.astype(np.float64) if y.ndim == 2 else np.eye(k)[y.astype(int)]
    log_p = z - z.max(axis=1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
    per_smoothing = float(np.mean(-log_p.mean(axis=1) + (onehot * log_p).sum(axis=1)))
    return causes.explain_smoothing((both.legacy.gradients[bias], both.modern.gradients[bias]),
                                    np.mean(onehot - 1.0 / k, axis=0), (both.legacy.loss, both.modern.loss),
                                    per_smoothing, sides.tol.model.rel_l2)


def check_free_variables(sides: Sides) -> Result:
    """The free biases (`free_biases`): the training loss does not depend on them: the modern train
    step from the start and from the start with those biases moved by +-0.1 gives the same loss."""
    name = f"{sides.label}free biases (zero gradient)"
    batch = sides.batch(seed=3)
    sides.legacy.restore(sides.start)
    free = free_biases(sides.legacy.gradients(batch, fixed_ones(sides, batch)).gradients)
    if not free:
        return not_applicable(name, sides.pair.name, "no bias has a gradient below "
                                                     f"{FREE:g} of its layer's weight gradient")
    rng = np.random.RandomState(sides.seed)
    moved = dict(sides.start.weights)
    for n in free:
        moved[n] = moved[n] + 0.1 * np.sign(rng.randn(*moved[n].shape)).astype(np.float32)
    losses = []
    seeds = [s.numpy() for s in sides.modern.seeds]
    for weights in (sides.start.weights, moved):
        for s, value in zip(sides.modern.seeds, seeds):
            s.assign(value)
        state = sides.start.replace(weights=weights)
        sides.set_modern(state)
        losses.append(sides.modern.step(batch, before=state).loss)
    return judge(name, sides.pair.name, [tensor_error("loss", losses[1], losses[0])], sides.tol.model,
                 note=f"{len(free)} biases each moved by +-0.1: the training loss is the same")


def fixed_ones(sides: Sides, batch: Batch) -> Masks:
    """Masks that keep every unit (noise 1 >= any rate): a legacy training pass without dropout noise."""
    legacy = sides.legacy
    if not legacy.dropouts:
        return None
    tower_feed = legacy.feed(batch, True).towers
    ks = sorted({legacy.dropout_index(d) for d in legacy.dropouts})
    shapes = {legacy.dropout_index(d): tuple(d.noise.shape[1:]) for d in legacy.dropouts if d.tower == 0}
    return [[np.ones((len(rows), *shapes[k]), np.float32) for rows in tower_feed.rows] for k in ks]
