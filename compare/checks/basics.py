"""Configuration, variables, checkpoint round trip, input pipelines."""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Sequence

import contextlib
import os

import numpy as np
import tensorflow as tf

from compare import causes, diagnosis, tf1_graph
from compare import optimizers
from compare.report import EPS32, judge, not_applicable, tensor_error
from compare.report import Diagnosis, Result, TensorError
from compare.interface import LegacyPipeline, settings, undeclared
from compare.legacy_run import LegacyRun, harness_config
from compare.sides import Sides
from compare.sides import row_key
from compare.checks.steps import change_points

tf1 = tf.compat.v1
Rows = tuple[np.ndarray, np.ndarray, np.ndarray]  # one step's inputs, labels and each row's weight


def tower_dests(parse_args: Callable[[list[str]], Any], flag: str) -> set[str]:
    """The parsed attributes the tower flag sets (found by parsing two tower counts)."""
    a, b = settings(parse_args([flag, "3"])), settings(parse_args([flag, "4"]))
    return {k for k in a if a[k] == 3 and b.get(k) == 4}


def check_config(sides: Sides) -> Result:
    """Both programs parse the same defaults, and the same non-default command lines
    (Pair.flag_values), to the same settings for every flag both accept; and they build what
    those settings say: each dropout's rate, each batch norm's decay and epsilon, the optimizer
    (each within one float32 rounding of the legacy graph's own arithmetic)."""
    pair = sides.pair
    towers_l = tower_dests(pair.legacy.parse_args, pair.legacy.tower_flag)
    towers_m = tower_dests(pair.modern.parse_args, pair.modern.replica_flag)
    skip = set(pair.own_flags) | set(pair.loop_flags) | towers_l | towers_m
    differ, compared = [], set()
    if not towers_l or not towers_m:
        differ.append(f"no parsed setting follows "
                      f"{pair.legacy.tower_flag if not towers_l else pair.modern.replica_flag}")
    for argv in [()] + [tuple(a) for a in pair.flag_values]:
        la = pair.legacy.parse_args([pair.legacy.tower_flag, "3", *argv])
        ma = pair.modern.parse_args([pair.modern.replica_flag, "3", *argv])
        for key in sorted((set(settings(la)) & set(settings(ma))) - skip):
            compared.add(key)
            if getattr(la, key) != getattr(ma, key):
                differ.append(f"{key}: legacy {getattr(la, key)!r} vs modern {getattr(ma, key)!r}"
                              + (f" (with {' '.join(argv)})" if argv else ""))
    errors, notes = built_settings(sides)
    # A setting the legacy graph computes in float32 (a dropout rate 1 - keep_prob, a decay 1 - (1 - d))
    # may lie one rounding from the same setting given in Python: 2 eps32 relative.
    ok = not differ and all(e.max_rel <= 2 * EPS32 for e in errors)
    loop = sorted(set(pair.loop_flags))
    note = (f"{len(compared)} shared flags agree at their defaults and at {len(pair.flag_values)} non-default "
            f"command lines" + (f" (not compared, the adapter's loop_flags: {', '.join(loop)})" if loop else "")
            + f"; built: {'; '.join(notes)}") if not differ else "differ: " + "; ".join(differ[:6])
    result = judge(f"{sides.label}configuration (flags and what they build)", pair.name, errors, "exact", ok=ok,
                   note=note)
    starts = [e for e in errors if e.slot is not None and e.max_rel > 2 * EPS32]
    return diagnosis.guarded(result, lambda: localise_slots(sides, starts)) if starts else result


def localise_slots(sides: Sides, starts: Sequence[TensorError]) -> Diagnosis:
    """Where the port's optimizer starts from other slots than the original's, and whether its own
    parameterisation holds the original's start (the slot_init entry)."""
    legacy, modern = sides.legacy, sides.modern
    first = starts[0]
    name, key = first.variable or "", first.slot or ""
    want, have = legacy.initial_slots[name][key], modern.legacy_slots_of(modern.fresh_slots[name]).get(key)
    where = (f"the optimizer's slots at the start: {name} {key} legacy {float(np.mean(want)):g}, modern "
             f"{float(np.mean(have)) if have is not None else float('nan'):g} ({len(starts)} slots differ)")
    return Diagnosis(where, causes.explain_slot_init(legacy.rule.describe(), {
        n: (legacy.initial_slots[n], modern.legacy_slots_of(modern.modern_slots(legacy.initial_slots[n])))
        for n in legacy.trainable}), [], "optimizer")


def built_settings(sides: Sides) -> tuple[list[TensorError], list[str]]:
    """[errors], [notes]: the settings the two programs built, legacy (from the graph) against
    modern (from the layers found by type and the optimizer's configuration)."""
    legacy, modern = sides.legacy, sides.modern
    errors, notes = [], []
    batch = sides.batch(seed=1)
    tower0 = [d for d in legacy.dropouts if d.tower == 0]
    if tower0 or modern.dropouts:
        rates = legacy.run([d.rate for d in tower0], batch, True) if tower0 else []
        if len(tower0) != len(modern.dropouts):
            errors.append(tensor_error("dropout count", np.float32(len(tower0)), np.float32(len(modern.dropouts))))
        for k, (rate, layer) in enumerate(zip(rates, modern.dropouts)):
            errors.append(tensor_error(f"dropout {k} rate", np.float32(layer.rate), np.float32(rate)))
        notes.append(f"{len(modern.dropouts)} dropout(s) at rate {', '.join(f'{float(r):g}' for r in rates)}")
    if legacy.moving or modern.batch_norms:
        by_var: dict[str, tf1_graph.MovingUpdate] = {}
        for u in legacy.moving:
            by_var.setdefault(u.variable.op.name, u)
        by_id = {id(v): n for n, v in modern.names.items()}
        decays = legacy.moving_decays()
        eps_found = 0
        for layer in modern.batch_norms:
            name = by_id.get(id(layer.moving_mean))
            if name is None or name not in by_var:
                errors.append(tensor_error(f"batch norm {layer.name}: no legacy moving update", np.float32(1),
                                           np.float32(0)))
                continue
            scope = name.rsplit("/", 1)[0]
            legacy_decay = np.float32(decays[name])
            errors.append(tensor_error(f"{scope} decay (momentum)", np.float32(layer.momentum), legacy_decay))
            eps = tf1_graph.batch_norm_epsilon(legacy.graph, by_var[name].value)
            if eps is not None:
                eps_found += 1
                errors.append(tensor_error(f"{scope} epsilon", np.float32(layer.epsilon), np.float32(eps)))
        notes.append(f"{len(modern.batch_norms)} batch norms as the legacy graph's "
                     f"(decay, and epsilon for {eps_found} found fused)")
    optimizer_errors, optimizer_note = optimizer_settings(sides)
    return errors + optimizer_errors, notes + [optimizer_note]


def optimizer_settings(sides: Sides) -> tuple[list[TensorError], str]:
    """The two optimizers: the same rule with the same hyper-parameters (where the harness knows both),
    the same slots at the start (the port's as it built them, against the legacy program's as its
    initializers set them), and, for momentum, a parameterisation that agrees under the schedule."""
    legacy, modern = sides.legacy.rule, sides.modern.rule
    errors = []
    if legacy.known and modern.known:
        if not optimizers.same_rule(legacy, modern):
            errors.append(tensor_error(f"optimizer: legacy {legacy.describe()} vs modern {modern.describe()}",
                                       np.float32(1), np.float32(0)))
        else:
            errors += [tensor_error(f"optimizer {key}", np.float32(modern.hyper()[key]), np.float32(value))
                       for key, value in legacy.hyper().items() if key in modern.hyper()]
            errors += momentum_parameterisation(sides)
    errors += initial_slots(sides)
    return errors, f"optimizer {legacy.describe()}" + ("" if modern.known else f", modern {modern.describe()}")


def initial_slots(sides: Sides) -> list[TensorError]:
    """The port's optimizer slots as it built them against the legacy program's initial ones, in TF1's
    names (converted by the port's rule, or paired by value for a rule the harness does not know)."""
    legacy, modern = sides.legacy, sides.modern
    errors = []
    for n in legacy.trainable:
        want, have = legacy.initial_slots[n], modern.fresh_slots[n]
        pairing = {} if modern.rule.known else optimizers.pair_slots(want, have, np.array_equal) or {}
        converted = modern.legacy_slots_of(have) if modern.rule.known else {
            legacy_key: have[m] for m, legacy_key in pairing.items()}
        if sorted(converted) != sorted(want):
            errors.append(tensor_error(f"{n} optimizer slots at the start: legacy {sorted(want)} vs modern "
                                       f"{sorted(have)}", np.float32(1), np.float32(0)))
            continue
        errors += [tensor_error(f"{n} {key} at the start", converted[key], want[key], variable=n, slot=key)
                   for key in sorted(want)]
    return errors


def momentum_parameterisation(sides: Sides) -> list[TensorError]:
    """TF1's momentum (a = mom a + g; w -= lr a) against Keras' (m = mom m - lr g; w += m): the same
    update only while the rate stays the same (Keras folds each step's rate into its velocity, TF1
    applies today's rate to all of it)."""
    legacy, modern = sides.legacy.rule, sides.modern.rule
    if legacy.rule != "momentum" or legacy.side == modern.side:
        return []
    points = change_points(sides.legacy)
    if points == []:
        return []
    when = "at every step" if points is None else f"after steps {points[:4]}"
    return [tensor_error(f"momentum: Keras' SGD folds the rate into its velocity, TF1's momentum does not, and the "
                         f"legacy rate changes {when}", np.float32(1), np.float32(0))]


def check_variables(sides: Sides) -> Result:
    """The same variables after name mapping: names, shapes, trainable; one set for all towers
    (every trainable variable of the legacy graph is trained, once)."""
    legacy, modern = sides.legacy, sides.modern
    with legacy.graph.as_default():
        graph_trainable = [v.op.name for v in tf1.trainable_variables()]
    trainable_m = {id(v) for v in modern.model.trainable_variables}
    ours = {n: (tuple(legacy.by_name[n].shape.as_list()), n in set(legacy.trainable)) for n in legacy.model}
    theirs = {n: (tuple(v.shape), id(v) in trainable_m) for n, v in modern.names.items()}
    differ = sorted(set(ours.items()) ^ set(theirs.items()))
    untrained = sorted(set(graph_trainable) - set(legacy.trainable))
    ok = not differ and not untrained and len(legacy.trainable) == len(modern.model.trainable_variables)
    note = (f"{len(ours)} variables ({len(legacy.trainable)} trainable), one set for {sides.towers} towers" if ok
            else f"differ: {differ[:6]}; trainable but not trained (a tower's own copy?): {untrained[:6]}")
    return judge(f"{sides.label}variables", sides.pair.name, [], "exact", ok=ok, note=note)


def check_checkpoint_round_trip(sides: Sides) -> Result:
    """The legacy Saver's checkpoint -> the modern model -> a TF1 checkpoint: every tensor bit for bit."""
    name = f"{sides.label}checkpoint round trip"
    build = sides.modern.build
    if "checkpoint_converter" not in sides.pair.capabilities or build.load_tf1 is None or build.save_tf1 is None:
        return not_applicable(name, sides.pair.name,
                              undeclared(sides.pair, "a checkpoint converter", "checkpoint_converter"))
    build.load_tf1(sides.start_path)
    back = build.save_tf1(os.path.join(sides.tmp_dir, f"{sides.pair.name}_back.ckpt"))
    src, dst = tf.train.load_checkpoint(sides.start_path), tf.train.load_checkpoint(back)
    names = sorted(src.get_variable_to_shape_map())
    same = sorted(dst.get_variable_to_shape_map()) == names
    errors = [tensor_error(n, dst.get_tensor(n), src.get_tensor(n)) for n in names] if same else []
    exact = same and len(names) == len(sides.legacy.model) and all(
        np.array_equal(dst.get_tensor(n), src.get_tensor(n)) for n in names)
    return judge(name, sides.pair.name, errors, "exact", ok=exact,
                 note=f"{len(names)} tensors TF1 -> modern -> TF1, compared bit for bit"
                      + ("" if same else
                         f"; names differ: {sorted(set(dst.get_variable_to_shape_map()) ^ set(names))[:4]}"))


# ---------------------------------------------------------------------------------------------
# Input pipelines

@contextlib.contextmanager
def shuffle_off() -> Iterator[None]:
    """The file order, for the duration: every `tf.data.Dataset.shuffle` the identity, and the queue
    pipelines of TF1 (`tf.compat.v1.train`) unshuffled and read by one thread: `shuffle_batch` is
    `batch`, the input producers do not shuffle, the batching ops run one thread."""
    classes = {tf.data.Dataset, tf1.data.Dataset}
    saved = {c: c.__dict__.get("shuffle") for c in classes}
    for c in classes:
        c.shuffle = lambda self, *args, **kwargs: self
    queues = tf1.train
    originals = {name: getattr(queues, name) for name in QUEUE_FUNCTIONS}
    for name, replace in QUEUE_FUNCTIONS.items():
        setattr(queues, name, replace(originals))
    try:
        yield
    finally:
        for c, method in saved.items():
            if method is None:
                del c.shuffle
            else:
                c.shuffle = method
        for name, original in originals.items():
            setattr(queues, name, original)


def unshuffled_batch(originals: dict[str, Any]) -> Callable[..., Any]:
    def shuffle_batch(tensors: Any, batch_size: Any, capacity: Any = 32, min_after_dequeue: Any = 0,
                      num_threads: int = 1, seed: Any = None, enqueue_many: bool = False, shapes: Any = None,
                      allow_smaller_final_batch: bool = False, shared_name: Any = None, name: Any = None) -> Any:
        return originals["batch"](tensors, batch_size, num_threads=1, capacity=capacity, enqueue_many=enqueue_many,
                                  shapes=shapes, allow_smaller_final_batch=allow_smaller_final_batch,
                                  shared_name=shared_name, name=name)
    return shuffle_batch


def one_thread(function: str) -> Callable[[dict[str, Any]], Callable[..., Any]]:
    def make(originals: dict[str, Any]) -> Callable[..., Any]:
        def batch(*args: Any, **kwargs: Any) -> Any:
            kwargs["num_threads"] = 1
            return originals[function](*args, **kwargs)
        return batch
    return make


def no_shuffle(function: str) -> Callable[[dict[str, Any]], Callable[..., Any]]:
    def make(originals: dict[str, Any]) -> Callable[..., Any]:
        def producer(*args: Any, **kwargs: Any) -> Any:
            kwargs["shuffle"] = False
            return originals[function](*args, **kwargs)
        return producer
    return make


QUEUE_FUNCTIONS: dict[str, Callable[[dict[str, Any]], Callable[..., Any]]] = {
    "shuffle_batch": unshuffled_batch, "batch": one_thread("batch"),
    "string_input_producer": no_shuffle("string_input_producer"),
    "slice_input_producer": no_shuffle("slice_input_producer"), "input_producer": no_shuffle("input_producer"),
}


@contextlib.contextmanager
def legacy_session(legacy: LegacyRun, pipeline: LegacyPipeline) -> Iterator[Any]:
    """The legacy session to read a pipeline in: its own, or, for a queue-runner pipeline, one of its
    own on the same graph with the queue runners started (and stopped, their queues closed, after)."""
    if not pipeline.queue_runners:
        yield legacy.sess
        return
    config = harness_config(legacy.pair.legacy.session_config(legacy.flags, legacy.towers))
    with started_pipeline(legacy.graph, config) as sess:
        yield sess


@contextlib.contextmanager
def started_pipeline(graph: Any, config: Any, initializers: Sequence[Any] = ()) -> Iterator[Any]:
    """A session of its own on `graph`: its local variables and `initializers` run, its queue runners
    started (stopped, their queues closed, after)."""
    with graph.as_default():
        init = tf1.local_variables_initializer()
    sess = tf1.Session(graph=graph, config=config)
    coord = tf1.train.Coordinator()
    threads: list[Any] = []
    try:
        sess.run([init, *initializers])
        with graph.as_default():
            threads = tf1.train.start_queue_runners(sess=sess, coord=coord)
        yield sess
    finally:
        coord.request_stop()
        with contextlib.suppress(Exception):
            coord.join(threads, stop_grace_period_secs=10)
        sess.close()


QUEUE_TIMEOUT_MS = 30000  # a read from a queue-runner pipeline that waits this long: the queue starved


class PipelineStarved(Exception):
    """A queue-runner pipeline gave no batch in time (the message names the queue's tensors)."""


def legacy_batches(sess: Any, pairs: Sequence[Any], initializers: Sequence[Any], towers_each: int,
                   steps: Optional[int] = None, rows: Optional[int] = None) -> list[Rows]:
    """Every step's rows from a legacy pipeline, until it runs out (or `steps` steps, or `rows` rows):
    [(x, y, weights)]; a batch fed to every tower counts once per tower (`towers_each`)."""
    for init in initializers:
        sess.run(init)
    out: list[Rows] = []
    seen = 0
    options = tf1.RunOptions(timeout_in_ms=QUEUE_TIMEOUT_MS)
    while (steps is None or len(out) < steps) and (rows is None or seen < rows):
        try:
            parts = sess.run(list(pairs), options=options)
        except tf.errors.OutOfRangeError:
            return out
        except tf.errors.DeadlineExceededError:
            names = ", ".join(sorted({t.op.name for pair in pairs for t in pair}))
            raise PipelineStarved(f"no batch from {names} in {QUEUE_TIMEOUT_MS / 1000:g} s: a queue starved (its "
                                  f"queue runners read nothing more)") from None
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        out.append((x, y, np.full(len(x), float(towers_each))))
        seen += len(x)
    return out


def modern_batches(dataset: Any, steps: Optional[int] = None, rows: Optional[int] = None,
                   towers_each: int = 1) -> list[Rows]:
    """Every element of a modern dataset as (x, y, weights), until it runs out (or `steps`, or `rows`)."""
    out, seen = [], 0
    for element in (dataset if steps is None else dataset.take(steps)):
        parts = [np.asarray(t) for t in element]
        w = parts[2] if len(parts) > 2 else np.ones(len(parts[0]))
        out.append((parts[0], parts[1], w * towers_each))
        seen += len(parts[0])
        if rows is not None and seen >= rows:
            break
    return out


def same_rows(label: str, a: Rows, b: Rows, scale: float) -> list[TensorError]:
    """Errors of one step's rows, legacy `a` against modern `b` ((x, y, weights) each): the same
    distinct rows (compared bit for bit), and each row's total weight the same (float32 weights of
    1/N copies sum to 1 within a few roundings: 4 eps32 per copy)."""
    def grouped(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> dict[bytes, float]:
        sums: dict[bytes, float] = {}
        for i in range(len(x)):
            key = row_key(x[i], y[i])
            sums[key] = sums.get(key, 0.0) + float(w[i])
        return sums
    ga, gb = grouped(*a), grouped(*b)
    one_side = len(set(ga) ^ set(gb))
    errors = [tensor_error(f"{label}: rows on one side only (of {len(set(ga) | set(gb))})", np.float32(one_side),
                           np.float32(0))]
    if not one_side:
        keys = sorted(ga)
        wa, wb = np.array([ga[k] for k in keys]) / scale, np.array([gb[k] for k in keys]) / scale
        slack = 4 * np.finfo(np.float32).eps * max(1, scale)
        errors.append(tensor_error(f"{label}: each row's weight", np.where(np.abs(wa - wb) <= slack, wb, wa), wb))
    return errors


def check_pipelines(sides: Sides) -> Result:
    """Both programs' own input pipelines on the harness's files (built with shuffling off: the
    file order): every step's rows of the whole run, the short last batch included, as the same
    multiset of rows, each row weighted as the step weighs it; and the validation pipelines."""
    name = f"{sides.label}input pipelines"
    lp, build = sides.legacy.lg.pipeline, sides.modern.build
    if "pipelines" not in sides.pair.capabilities:
        return not_applicable(name, sides.pair.name, undeclared(sides.pair, "input pipelines", "pipelines"))
    if lp is None or build.dataset is None:
        return not_applicable(name, sides.pair.name, "no pipeline of the legacy program's own to read (its towers "
                                                     "are fed)" if lp is None else "the port gives its step no "
                                                     "dataset of its own")
    each = sides.towers if sides.pairing.same_rows_on_every_tower else 1
    errors, problems, sizes = [], [], {}
    splits = [("train", lp.train, lp.initializer, build.dataset)]
    if lp.valid and build.valid_dataset is not None:
        splits.append(("valid", lp.valid, lp.valid_initializer, build.valid_dataset))
    for split, pairs, inits, dataset in splits:
        steps = lp.steps if split == "train" else None
        with shuffle_off():
            built = dataset()
        random = {"legacy": tf1_graph.pipeline_random_draws(sides.legacy.graph, [t for pair in pairs for t in pair]),
                  "port": dataset_random_draws(built)}
        if any(random.values()):
            drawn = "; ".join(f"the {side}'s {'input' if split == 'train' else split} pipeline draws random numbers "
                              f"({', '.join(ops)})"
                              for side, ops in random.items() if ops)
            return not_applicable(name, sides.pair.name, f"{drawn}: augmentation the harness cannot turn off, so its "
                                                         f"rows are not the file's (the steps are judged on rows the "
                                                         f"legacy pipeline gave)")
        with legacy_session(sides.legacy, lp) as sess:
            got_l = legacy_batches(sess, pairs, inits, each if split == "train" else 1, steps)
        got_m = modern_batches(built, steps)
        sizes[split] = [len(b[0]) // (each if split == "train" else 1) for b in got_l]
        if len(got_l) != len(got_m):
            problems.append(f"{split}: {len(got_l)} legacy steps vs {len(got_m)} modern")
            continue
        for k, (a, b) in enumerate(zip(got_l, got_m)):
            errors += same_rows(f"{split} step {k}", a, b, each if split == "train" else 1)
    ok = not problems and bool(errors) and all(e.max_abs == 0 for e in errors)
    return judge(name, sides.pair.name, errors, "exact", ok=ok,
                 note="; ".join(problems) or ", ".join(f"{s}: {runs(v)}" for s, v in sizes.items())
                 + "; shuffling off (the file order)" + ("; the legacy queue runners started and stopped by the harness"
                                                        if lp.queue_runners else ""))


def dataset_random_draws(dataset: Any) -> list[str]:
    """The random op types a tf.data pipeline runs (in its serialized graph and functions)."""
    graph_def = tf1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    return tf1_graph.random_draws(graph_def)


def runs(sizes: Sequence[int]) -> str:
    """[4, 4, 4, 1, 4, 4, 4, 1] -> '3 x 4, 1, 3 x 4, 1' (the rows of each step)."""
    out, i = [], 0
    while i < len(sizes):
        j = i
        while j < len(sizes) and sizes[j] == sizes[i]:
            j += 1
        out.append(f"{j - i} x {sizes[i]}" if j - i > 1 else str(sizes[i]))
        i = j
    return f"{len(sizes)} steps of " + ", ".join(out) + " rows"
