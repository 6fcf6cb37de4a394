"""Parity checks for the MNIST program: `legacy/mnist_multi_gpu.py` against `modern/mnist_multi_gpu.py`.

Each side is built by the program's own functions from the program's own parsed command line:

  legacy: `parse_args`, `get_input`, `build_train_graph`, `session_config`, and
          `legacy/mnist_eval.py`'s `evaluate_checkpoint`;
  modern: `parse_args`, `get_input`, `build_model`, `make_optimizer`, `make_moving_average`,
          `make_train_step` (its loss and the gradients it applies), `evaluate_averaged`.

Both read the same TFRecord file through their own input pipelines (shuffling off: the original's
`shuffle(10000)` is the only random step, and it is made the identity for both).  Two pairings are
trained for K free-running steps, each in two regimes (from step 0, in the moving average's
warm-up, and from step 5000, past it, where the decay itself shows):

  the original as it runs   legacy default (one batch on every tower, unordered moving average)
                            vs modern --same_batch_per_replica;
  the honest deviation      legacy --per_tower_batches --ordered_ema vs modern default.
"""
import contextlib
import dataclasses
import os

import numpy as np
import tensorflow as tf

from compare import common
from compare import programs
from compare.report import TOLERANCES, judge, tensor_error
from legacy.towers import session_config
from modern import cluster
from records import mnist as mnist_records

tf1 = tf.compat.v1
MODEL = "mnist"
BATCH = 16          # per tower (the original's 100, smaller for speed)
LATE_START = 5000   # past the warm-up: (1 + n) / (10 + n) > 0.99 from n = 890 on


@dataclasses.dataclass
class LegacyMnist:
    graph: object
    ns: object          # build_train_graph's namespace
    sess: object
    weights: dict       # TF1 name -> variable
    shadows: dict       # TF1 name -> moving-average shadow


@dataclasses.dataclass
class ModernMnist:
    model: object
    optimizer: object
    ema: object
    shadows: dict
    train_step: object
    weights: dict
    iterator: object


@contextlib.contextmanager
def shuffle_off():
    """Both programs' `dataset.shuffle(...)` made the identity (the file order), for the duration."""
    classes = {tf.data.Dataset, tf1.data.Dataset}
    saved = {c: c.__dict__.get("shuffle") for c in classes}
    for c in classes:
        c.shuffle = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        for c, method in saved.items():
            if method is None:
                del c.shuffle
            else:
                c.shuffle = method


def write_data(tmp_dir, num_towers, steps, seed):
    """A training file for 2 * steps + 2 batches per tower and a held-out file, real format."""
    rng = np.random.RandomState(seed)
    files = {}
    for name, rows in (("train", (2 * steps + 2) * num_towers * BATCH), ("eval", 200)):
        images = rng.randint(0, 256, size=(rows, 784)) * (rng.rand(rows, 784) < 0.15)
        labels = rng.randint(0, 10, size=rows)
        files[name] = os.path.join(tmp_dir, f"mnist_{name}.tfrecords")
        mnist_records.write_tfrecords(files[name], images, labels)
    return files


def program_args(num_towers):
    legacy = programs.legacy_mnist.parse_args(["--num_gpus", str(num_towers), "--batch_size", str(BATCH)])
    modern = programs.modern_mnist.parse_args(["--num_replicas", str(num_towers), "--batch_size", str(BATCH)])
    return legacy, modern


def build_legacy(args, data_path, original=True):
    """The program's graph: the original (one `get_input()` for every tower, unordered moving
    average) or --per_tower_batches --ordered_ema."""
    n = args.num_gpus
    graph = tf1.Graph()
    with graph.as_default(), tf1.device("/cpu:0"), shuffle_off():
        tf1.set_random_seed(0)
        inputs = (programs.legacy_mnist.get_input(data_path, args.batch_size) * n if original
                  else programs.legacy_mnist.get_input(data_path, args.batch_size, num_batches=n))
        ns = programs.legacy_mnist.build_train_graph(
            inputs, regularization_rate=args.regularization_rate, learning_rate_base=args.learning_rate_base,
            learning_rate_decay=args.learning_rate_decay, decay_steps=60000 / args.batch_size,
            moving_average_decay=args.moving_average_decay, ordered_ema=not original)
        weights = {v.op.name: v for v in tf1.trainable_variables()}
        shadows = {n_: ns.variable_averages.average(v) for n_, v in weights.items()}
        init = tf1.global_variables_initializer()
    sess = tf1.Session(graph=graph, config=session_config(n))
    sess.run(init)
    return LegacyMnist(graph=graph, ns=ns, sess=sess, weights=weights, shadows=shadows)


def build_modern(strategy, args, data_path, start, same_batch):
    """The program's model, optimizer, moving average, train step and input, from `start` weights."""
    with strategy.scope():
        model = programs.modern_mnist.build_model(args.regularization_rate)
        optimizer = programs.modern_mnist.make_optimizer(args.learning_rate_base, 60000 / args.batch_size,
                                                         args.learning_rate_decay)
        for v in model.trainable_variables:
            v.assign(start[programs.modern_mnist.legacy_name(v)])
        optimizer.build(model.trainable_variables)
        ema, shadows = programs.modern_mnist.make_moving_average(model, optimizer, args.moving_average_decay)
    with shuffle_off():
        dataset = programs.modern_mnist.get_input(data_path, args.batch_size, strategy.num_replicas_in_sync, same_batch)
    dist = cluster.distribute(strategy, None, dataset)  # the program's input path
    train_step = programs.modern_mnist.make_train_step(model, optimizer, strategy, ema, return_grads=True,
                                                       element_spec=dist.element_spec)
    return ModernMnist(model=model, optimizer=optimizer, ema=ema, shadows=shadows, train_step=train_step,
                       weights={programs.modern_mnist.legacy_name(v): v for v in model.trainable_variables},
                       iterator=iter(dist))


def set_global_step(g, value):
    with g.graph.as_default():
        g.ns.global_step.load(value, g.sess)


# ---------------------------------------------------------------------------------------------
# Checks

def check_config(num_towers):
    """Both programs parse the same defaults and the same non-default command line."""
    differ = []
    extra = ["--batch_size", "37", "--learning_rate_base", "0.2", "--learning_rate_decay", "0.5",
             "--regularization_rate", "0.01", "--training_steps", "7", "--moving_average_decay", "0.9"]
    for argv in ([], extra):
        la = programs.legacy_mnist.parse_args(["--num_gpus", str(num_towers), *argv])
        ma = programs.modern_mnist.parse_args(["--num_replicas", str(num_towers), *argv])
        for key in ("batch_size", "learning_rate_base", "learning_rate_decay", "regularization_rate",
                    "training_steps", "moving_average_decay", "model_name"):
            if getattr(la, key) != getattr(ma, key):
                differ.append(f"{key}: legacy {getattr(la, key)} vs modern {getattr(ma, key)}")
    eval_decay = programs.legacy_mnist_eval.parse_args([]).moving_average_decay
    if eval_decay != programs.modern_mnist.parse_args([]).moving_average_decay:
        differ.append("mnist_eval moving_average_decay")
    return judge("configuration (parsed defaults)", MODEL, [], "exact", ok=not differ,
                 note="; ".join(differ) or f"defaults and {len(extra) // 2} non-default arguments agree")


def check_lr_schedule(g, m, args):
    """The rate at global steps from 0 to far into the decay: legacy `learning_rate` with
    global_step set, modern `optimizer.learning_rate` with iterations set."""
    decay_steps = 60000 / args.batch_size
    steps = [0, 1, int(decay_steps) - 1, int(decay_steps), int(decay_steps) + 1, 10 * int(decay_steps), 10 ** 6]
    errors = []
    for step in steps:
        set_global_step(g, step)
        m.optimizer.iterations.assign(step)
        errors.append(tensor_error(f"lr at step {step}", g.sess.run(g.ns.learning_rate),
                                   float(m.optimizer.learning_rate)))
    set_global_step(g, 0)
    m.optimizer.iterations.assign(0)
    return judge("lr schedule", MODEL, errors, "mlp", note=f"exponential decay over {decay_steps:g} steps, "
                                                           f"at steps {steps}")


def check_variables(g, m):
    legacy = {n: tuple(v.shape) for n, v in g.weights.items()}
    modern = {n: tuple(v.shape) for n, v in m.weights.items()}
    legacy_shadows = sorted(s.op.name for s in g.shadows.values())
    modern_shadows = sorted(f"{n}/ExponentialMovingAverage" for n in m.shadows)
    ok = legacy == modern and len(m.model.trainable_variables) == len(legacy) == 4 and legacy_shadows == modern_shadows
    return judge("variables", MODEL, [], "exact", ok=ok,
                 note=(f"{len(legacy)} trainable variables, {len(legacy_shadows)} moving-average shadows each" if ok
                       else f"legacy {legacy} {legacy_shadows} vs modern {modern} {modern_shadows}"))


def ema_candidates(shadow, w_before, w_after, n_before, decay):
    """The shadow after one step of the original's unordered `tf.group(update, average)`: the
    average reads w and global_step before or after the update (4 schedules); the ordered one
    (--ordered_ema, and the modern program) is (w_after, n_before + 1).
        decay_n = min(decay, (1 + n) / (10 + n));   shadow <- shadow - (1 - decay_n) * (shadow - w)"""
    out = {}
    for w_name, w in (("w before", w_before), ("w after", w_after)):
        for n_name, n in (("step before", n_before), ("step after", n_before + 1)):
            d = min(decay, (1.0 + n) / (10.0 + n))
            out[f"{w_name}, {n_name}"] = shadow - (1 - d) * (shadow - w)
    return out


def run_pair(g, m, steps, label, original, decay):
    """K free-running steps of both programs from their inputs; two regimes: from step 0 and from
    LATE_START.  Returns the check results of this pairing."""
    start = g.sess.run(g.weights)
    losses_l, losses_m, grad_err, errors, ema_err, schedules, gaps = [], [], [], [], [], {}, []
    half = max(1, steps // 2)
    for k in range(steps):
        if k == half:  # jump both counters past the warm-up
            set_global_step(g, LATE_START)
            m.optimizer.iterations.assign(LATE_START)
        before_w, before_s, n_before = g.sess.run([g.weights, g.shadows, g.ns.global_step])
        before_wm = {n: v.numpy() for n, v in m.weights.items()}
        before_sm = {n: v.numpy() for n, v in m.shadows.items()}
        n_before_m = float(m.optimizer.iterations.numpy())
        grads_l, losses, _ = g.sess.run([[gv[0] for gv in g.ns.grads], g.ns.tower_losses, g.ns.train_op])
        after_w, after_s = g.sess.run([g.weights, g.shadows])
        loss_m, grads_m = m.train_step(next(m.iterator))
        losses_l.append(float(np.mean(losses)))
        losses_m.append(float(loss_m))
        by_name = dict(zip([programs.modern_mnist.legacy_name(v) for v in m.model.trainable_variables], grads_m))
        grad_err += [tensor_error(f"step {k}: {v.op.name} gradient", gl, by_name[v.op.name].numpy())
                     for gl, (_, v) in zip(grads_l, g.ns.grads)]
        for n in sorted(after_s):
            cands = ema_candidates(before_s[n].astype(np.float64), before_w[n], after_w[n], float(n_before), decay)
            # The shadow is stored in float32: its update is a small difference of near-equal
            # numbers, so 2 ulps of the shadow per element count as exactly the tolerance.
            floor = 2 * np.linalg.norm(np.spacing(np.abs(before_s[n]))) / TOLERANCES["mlp_steps"][0]
            gaps.append(tensor_error("", cands["w before, step before"] - before_s[n],
                                     cands["w after, step after"] - before_s[n], floor).rel_l2)
            if original:
                best = min(cands, key=lambda c: np.linalg.norm(after_s[n] - cands[c]))
                schedules[best] = schedules.get(best, 0) + 1
            else:
                best = "w after, step after"
            ema_err.append(tensor_error(f"step {k}: legacy {n} shadow update ({best})", after_s[n] - before_s[n],
                                        cands[best] - before_s[n], floor))
            # The modern moving average: always the ordered schedule, from its own values.
            ordered = ema_candidates(before_sm[n].astype(np.float64), before_wm[n], m.weights[n].numpy(),
                                     n_before_m, decay)["w after, step after"]
            ema_err.append(tensor_error(f"step {k}: modern {n} shadow update", m.shadows[n].numpy() - before_sm[n],
                                        ordered - before_sm[n], floor))
    weights_m = {n: v.numpy() for n, v in m.weights.items()}
    shadows_m = {n: v.numpy() for n, v in m.shadows.items()}
    weights_l, shadows_l = g.sess.run([g.weights, g.shadows])
    errors = [tensor_error(f"loss step {k}", a, b) for k, (a, b) in enumerate(zip(losses_l, losses_m))]
    errors += [tensor_error(f"{n} - w0", weights_l[n] - start[n], weights_m[n] - start[n]) for n in sorted(start)]
    shadow_err = [tensor_error(f"{n}/ExponentialMovingAverage - w0", shadows_l[n] - start[n],
                               shadows_m[n] - start[n]) for n in sorted(start)]
    counters = [tensor_error("global_step", g.sess.run(g.ns.global_step), LATE_START + steps - half),
                tensor_error("iterations", int(m.optimizer.iterations.numpy()), LATE_START + steps - half)]
    results = [
        judge(f"{label}: gradients of every step", MODEL, grad_err, "mlp_steps",
              note="legacy average_gradients vs the gradients the modern train step applied (step 0 from the "
                   "same weights: worst " + f"{max(e.rel_l2 for e in grad_err[:4]):.2g}, within the one-pass "
                   "'mlp' tolerance: " + ("yes" if max(e.rel_l2 for e in grad_err[:4]) <= TOLERANCES["mlp"][0]
                                           else "NO") + ")",
              ok=all(e.rel_l2 <= TOLERANCES["mlp_steps"][0] for e in grad_err)
              and all(e.rel_l2 <= TOLERANCES["mlp"][0] for e in grad_err[:4])),
        judge(f"{label}: {steps} free-running steps", MODEL, errors + counters, "mlp_steps",
              note=f"losses, weights after {half} steps from 0 and {steps - half} from {LATE_START}, step counters",
              extra={"losses": {"legacy": losses_l, "modern": losses_m}})]
    if original:
        # EXPECTED: the original's moving average may see the weights before the update; the
        # modern one averages the updated weights.  Each legacy shadow update is one of the four
        # schedules; the modern shadows equal the ordered prediction only (checked on the deviation
        # pairing, where the legacy program is ordered too).
        # The prediction must be able to fail: the ordered and the unordered schedules must differ.
        tol = TOLERANCES["mlp_steps"][0]
        results.append(judge(f"{label}: moving average (unordered)", MODEL, ema_err, "mlp_steps", expected=True,
                             ok=max(gaps) > 10 * tol and all(e.rel_l2 <= tol for e in ema_err),
                             note="each legacy shadow update matched one of the 4 schedules (seen: " +
                                  ", ".join(f"{k} {v}" for k, v in sorted(schedules.items())) +
                                  f"); modern = ordered; the schedules differ by up to {max(gaps):.2g}"))
    else:
        results.append(judge(f"{label}: moving averages", MODEL, ema_err + shadow_err, "mlp_steps",
                             note=f"legacy --ordered_ema shadows and the modern ones, decay {decay} past the warm-up"))
    return results


def check_pipelines(args_l, args_m, data_path, num_towers, steps):
    """Both programs' `get_input` on the same file, shuffle off: the first batches, row for row."""
    graph = tf1.Graph()
    errors, note = [], ""
    with graph.as_default(), shuffle_off():
        batches_l = programs.legacy_mnist.get_input(data_path, args_l.batch_size, num_batches=num_towers)
    with tf1.Session(graph=graph) as sess:
        legacy = [sess.run(batches_l) for _ in range(steps)]
    with shuffle_off():
        modern = programs.modern_mnist.get_input(data_path, args_m.batch_size, num_towers)
        same = programs.modern_mnist.get_input(data_path, args_m.batch_size, num_towers, same_batch_per_replica=True)
    for k, global_m in enumerate(modern.take(steps)):
        # The N get_next() ops of one legacy step run in no fixed order, so which tower gets which
        # of the N consecutive batches varies (harmless: every tower has the same weights); compare
        # the N batches as a set with the replicas' N slices of the global batch.
        chunks_m = list(zip(np.split(global_m[0].numpy(), num_towers), np.split(global_m[1].numpy(), num_towers)))
        key = lambda b: b[1].tobytes() + b[0].tobytes()  # noqa: E731
        for i, (bl, bm) in enumerate(zip(sorted(legacy[k], key=key), sorted(chunks_m, key=key))):
            errors += [tensor_error(f"batch {k} slice {i} images", bl[0], bm[0]),
                       tensor_error(f"batch {k} slice {i} labels", bl[1], bm[1])]
    # --same_batch_per_replica tiles one batch: its first batch is the legacy first tower batch, N times.
    first, global_0 = next(iter(same)), next(iter(modern))
    errors.append(tensor_error("same batch: images", np.tile(global_0[0].numpy()[:args_m.batch_size], [num_towers, 1]),
                               first[0].numpy()))
    note = f"{steps} batches of {num_towers} x {args_l.batch_size} rows; --same_batch_per_replica tiled"
    return judge("input pipelines (get_input)", MODEL, errors, "exact",
                 ok=bool(errors) and all(e.max_abs == 0 for e in errors), note=note)


def check_evaluation(g, m, args, files, tmp_dir):
    """One legacy checkpoint (after training): `mnist_eval.evaluate_checkpoint` (the shadows) against
    the modern `evaluate_averaged` given the same checkpoint's shadows; both must differ from the
    raw weights' accuracy only if the shadows do."""
    folder = os.path.join(tmp_dir, "mnist_eval_ckpt")
    os.makedirs(folder, exist_ok=True)
    with g.graph.as_default():
        path = g.ns.saver.save(g.sess, os.path.join(folder, "model.ckpt"), global_step=1)
    images, labels = mnist_records.load_tfrecords(files["eval"])
    _, acc_l = programs.legacy_mnist_eval.evaluate_checkpoint(images.astype(np.float32), labels, folder,
                                                              args.moving_average_decay)
    reader = tf.train.load_checkpoint(path)
    for name, shadow in m.shadows.items():
        shadow.assign(reader.get_tensor(f"{name}/ExponentialMovingAverage"))
    acc_m = programs.modern_mnist.evaluate_averaged(m.shadows, files["eval"], args.regularization_rate)
    return judge("evaluation (mnist_eval vs evaluate_averaged)", MODEL, [tensor_error("accuracy", acc_l, acc_m)],
                 "mlp", note=f"the moving averages of one legacy checkpoint: legacy {acc_l:.4f}, modern {acc_m:.4f} "
                               f"on {len(labels)} held-out rows")


def check_checkpoint_round_trip(g, tmp_dir, strategy, args):
    """A legacy Saver checkpoint into the modern model and back out as TF1: bit-exact."""
    from modern.checkpoints import write_tf1_checkpoint
    with g.graph.as_default():
        prefix = g.ns.saver.save(g.sess, f"{tmp_dir}/mnist_legacy.ckpt", write_meta_graph=False)
    reader = tf.train.load_checkpoint(prefix)
    with strategy.scope():
        model = programs.modern_mnist.build_model(args.regularization_rate)
    for v in model.trainable_variables:
        v.assign(reader.get_tensor(programs.modern_mnist.legacy_name(v)))
    back = write_tf1_checkpoint({programs.modern_mnist.legacy_name(v): v.numpy() for v in model.trainable_variables},
                                f"{tmp_dir}/mnist_back.ckpt")
    back_reader = tf.train.load_checkpoint(back)
    names = sorted(back_reader.get_variable_to_shape_map())
    errors = [tensor_error(n, back_reader.get_tensor(n), reader.get_tensor(n)) for n in names]
    exact = all(np.array_equal(back_reader.get_tensor(n), reader.get_tensor(n)) for n in names)
    return judge("checkpoint round trip", MODEL, errors, "exact", ok=exact and len(names) == 4,
                 note=f"{len(names)} tensors TF1 -> modern -> TF1, compared bit for bit")


# ---------------------------------------------------------------------------------------------

def run(num_towers=2, steps=10, seed=0, tmp_dir="/tmp", log=print):
    """All MNIST checks; returns a list of Results."""
    strategy = common.make_strategy(num_towers)
    args_l, args_m = program_args(num_towers)
    files = write_data(tmp_dir, num_towers, steps, seed)
    results = [check_config(num_towers), check_pipelines(args_l, args_m, files["train"], num_towers, 3)]
    for label, original in (("original", True), ("deviation", False)):
        log(f"mnist: legacy {'default' if original else '--per_tower_batches --ordered_ema'} vs modern "
            f"{'--same_batch_per_replica' if original else 'default'}, {steps} steps")
        g = build_legacy(args_l, files["train"], original=original)
        m = build_modern(strategy, args_m, files["train"], g.sess.run(g.weights), same_batch=original)
        if not original:
            results += [check_variables(g, m), check_lr_schedule(g, m, args_l),
                        check_checkpoint_round_trip(g, tmp_dir, strategy, args_m)]
        results += run_pair(g, m, steps, label, original, args_l.moving_average_decay)
        if not original:
            results.append(check_evaluation(g, m, args_m, files, tmp_dir))
        g.sess.close()
    return results
