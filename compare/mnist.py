"""Parity checks for the MNIST program: `legacy/mnist_multi_gpu.py` against `modern/mnist.py`.

Both sides are built by their own packages (`legacy.mnist_multi_gpu.build_train_graph`,
`modern.mnist.build_model` / `compute_replica_loss` / `make_train_step`), started from identical
weights, fed identical rows, and compared tensor by tensor.  Each check is a function returning
`compare.report.Result`s.
"""
from types import SimpleNamespace

import numpy as np
import tensorflow as tf

from compare import common
from compare.report import judge, tensor_error
from legacy import mnist_inference
from legacy.mnist_multi_gpu import build_train_graph
from legacy.towers import tower_devices
from modern import mnist as modern_mnist

tf1 = tf.compat.v1
MODEL = "mnist"


def make_batches(steps, rows, seed):
    """Deterministic MNIST-like batches: raw 0..255 pixels (unscaled, as the original feeds them)."""
    rng = np.random.RandomState(seed)
    x = rng.randint(0, 256, size=(steps, rows, 784)).astype(np.float32)
    # Sparse strokes rather than uniform noise, so the logits are not saturated everywhere.
    x *= rng.rand(steps, rows, 784) < 0.15
    y = rng.randint(0, 10, size=(steps, rows)).astype(np.int32)
    return x, y


# ---------------------------------------------------------------------------------------------
# The two sides

def build_legacy(num_towers, cfg, same_batch=False):
    """The legacy training graph on placeholders (one (x, y) per tower, or one shared)."""
    graph = tf1.Graph()
    with graph.as_default():
        tf1.set_random_seed(cfg.seed)
        n_inputs = 1 if same_batch else num_towers
        xs = [tf1.placeholder(tf.float32, [None, 784], name=f"x_{i}") for i in range(n_inputs)]
        ys = [tf1.placeholder(tf.int32, [None], name=f"y_{i}") for i in range(n_inputs)]
        pairs = list(zip(xs, ys)) * (num_towers if same_batch else 1)
        g = build_train_graph(
            pairs, regularization_rate=cfg.regularization_rate, learning_rate_base=cfg.lr_base,
            learning_rate_decay=cfg.lr_decay, decay_steps=cfg.decay_steps,
            moving_average_decay=cfg.ema_decay, ordered_ema=True,
            devices=tower_devices(num_towers))
        with tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
            logits = mnist_inference.inference(xs[0], None)  # inference on tower 0's rows
        g.graph, g.xs, g.ys, g.logits = graph, xs, ys, logits
        g.weights = {v.op.name: v for v in tf1.trainable_variables()}
        g.shadows = {v.op.name: g.variable_averages.average(v) for v in tf1.trainable_variables()}
        g.init = tf1.global_variables_initializer()
    g.sess = common.legacy_session(graph, num_towers)
    g.sess.run(g.init)
    return g


def build_modern(strategy, weights, cfg):
    """The modern model, optimizer and moving average, loaded with the legacy starting weights."""
    with strategy.scope():
        model = modern_mnist.build_model(cfg.regularization_rate)
        optimizer = cfg.make_optimizer(cfg.lr_base, cfg.decay_steps, cfg.lr_decay)
        for v in model.trainable_variables:
            v.assign(weights[modern_mnist.legacy_name(v)])
        optimizer.build(model.trainable_variables)
        ema, shadows = cfg.make_moving_average(model, optimizer, cfg.ema_decay)
    train_step = modern_mnist.make_train_step(model, optimizer, strategy, ema=ema)

    @tf.function
    def gradients(dist_batch):
        """Per-replica losses and the replica-summed gradients, without applying them."""
        def replica(x, labels):
            rows = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, tf.shape(labels)[0])
            with tf.GradientTape() as tape:
                loss = modern_mnist.compute_replica_loss(model, x, labels, rows, training=True)
            return loss, tape.gradient(loss, model.trainable_variables)
        losses, grads = strategy.run(replica, args=dist_batch)
        return losses, [strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in grads]

    return SimpleNamespace(model=model, optimizer=optimizer, ema=ema, shadows=shadows,
                           train_step=train_step, gradients=gradients,
                           weights={modern_mnist.legacy_name(v): v for v in model.trainable_variables})


def legacy_feed(g, x, y, same_batch=False):
    """Tower i gets rows [i*b, (i+1)*b) of the global batch (or all towers the same rows)."""
    if same_batch:
        return {g.xs[0]: x, g.ys[0]: y}
    b = len(x) // len(g.xs)
    feed = {}
    for i, (xp, yp) in enumerate(zip(g.xs, g.ys)):
        feed[xp], feed[yp] = x[i * b:(i + 1) * b], y[i * b:(i + 1) * b]
    return feed


# ---------------------------------------------------------------------------------------------
# Checks

def check_variables(g, m):
    legacy = {n: tuple(v.shape) for n, v in g.weights.items()}
    modern = {n: tuple(v.shape) for n, v in m.weights.items()}
    legacy_shadows = sorted(s.op.name for s in g.shadows.values())
    modern_shadows = sorted(f"{n}/ExponentialMovingAverage" for n in m.shadows)
    ok = (legacy == modern and len(m.model.trainable_variables) == len(legacy)
          and legacy_shadows == modern_shadows)
    note = (f"{len(legacy)} trainable variables, {len(legacy_shadows)} moving-average shadows on each side"
            if ok else f"legacy {legacy} {legacy_shadows} vs modern {modern} {modern_shadows}")
    return judge("variables", MODEL, [], "exact", ok=ok, note=note)


def check_inference(g, m, x, y):
    logits_l = g.sess.run(g.logits, {g.xs[0]: x})
    logits_m = m.model(x, training=False).numpy()
    ce = lambda logits: tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=y, logits=logits)).numpy()
    errors = [tensor_error("logits", logits_l, logits_m),
              tensor_error("cross_entropy", ce(logits_l), ce(logits_m))]
    return judge("forward (inference)", MODEL, errors, "mlp")


def check_training_forward_and_gradients(g, m, strategy, x, y, same_batch=False):
    """Per-tower losses, their mean, and every averaged gradient, legacy against modern.

    Modern replica i returns l_i = sum_i(ce)/B + R/N (see modern.mnist.compute_replica_loss); with
    b = B/N rows per replica the legacy tower loss is L_i = mean_i(ce) + R = N * l_i, and the legacy
    average of tower gradients is the SUM of the replica gradients.
    """
    n = len(g.tower_losses)
    feed = legacy_feed(g, x, y, same_batch)
    tower_losses, grads = g.sess.run([g.tower_losses, [gv[0] for gv in g.grads]], feed)
    xm, ym = (np.concatenate([x] * n), np.concatenate([y] * n)) if same_batch else (x, y)
    element, rows = common.distribute_batch(strategy, xm, ym)
    losses_m, grads_m = m.gradients(element)
    replica_losses = [n * l for l in common.local(strategy, losses_m)]
    names = [v.op.name for _, v in g.grads]
    modern_by_name = dict(zip([modern_mnist.legacy_name(v) for v in m.model.trainable_variables],
                              [gr.numpy() for gr in grads_m]))
    tag = "same batch: " if same_batch else ""
    loss_errors = [tensor_error(f"tower_{i}/loss", tower_losses[i], replica_losses[i]) for i in range(n)]
    loss_errors.append(tensor_error("mean tower loss", np.mean(tower_losses), np.mean(replica_losses)))
    grad_errors = [tensor_error(name, gl, modern_by_name[name]) for name, gl in zip(names, grads)]
    note = f"rows per replica {rows}" + (", legacy: one batch fed to every tower" if same_batch else "")
    return [judge(tag + "forward (training)", MODEL, loss_errors, "mlp", note=note),
            judge(tag + "gradients", MODEL, grad_errors, "mlp")]


def check_training_steps(g, m, strategy, xs, ys):
    """K steps: loss and lr at every step, then every weight and moving-average shadow.

    Weights and shadows are compared as their change from the common starting weights w0
    (w_K - w0, shadow_K - w0): comparing w_K itself would hide the updates' errors behind w0.
    """
    start = g.sess.run(g.weights)
    legacy_losses, modern_losses, lr_errors = [], [], []
    for k in range(len(xs)):
        lr_l = g.sess.run(g.learning_rate)
        lr_m = float(m.optimizer.learning_rate)  # Keras evaluates the schedule at `iterations`
        losses, _ = g.sess.run([g.tower_losses, g.train_op], legacy_feed(g, xs[k], ys[k]))
        element, _ = common.distribute_batch(strategy, xs[k], ys[k])
        loss_m = float(m.train_step(element))
        legacy_losses.append(float(np.mean(losses)))
        modern_losses.append(loss_m)
        lr_errors.append(tensor_error(f"lr step {k}", lr_l, lr_m))
    weights_l = g.sess.run(g.weights)
    shadows_l = g.sess.run(g.shadows)
    errors = [tensor_error(f"loss step {k}", a, b) for k, (a, b) in enumerate(zip(legacy_losses, modern_losses))]
    errors += [tensor_error(f"{n} - w0", weights_l[n] - start[n], m.weights[n].numpy() - start[n])
               for n in sorted(weights_l)]
    errors += [tensor_error(f"{n}/ExponentialMovingAverage - w0", shadows_l[n] - start[n],
                            m.shadows[n].numpy() - start[n]) for n in sorted(shadows_l)]
    return [judge("lr schedule", MODEL, lr_errors, "exact", note="lr at every step, float32 on both sides"),
            judge(f"{len(xs)} training steps", MODEL, errors, "mlp_steps",
                  note="losses per step, weights, moving-average shadows (legacy --ordered_ema)",
                  extra={"losses": {"legacy": legacy_losses, "modern": modern_losses}})]


def check_checkpoint_round_trip(g, tmp_dir, strategy, cfg):
    """A legacy Saver checkpoint into the modern model and back out as TF1: bit-exact."""
    from modern.checkpoints import write_tf1_checkpoint
    with g.graph.as_default():
        prefix = g.saver.save(g.sess, f"{tmp_dir}/mnist_legacy.ckpt", write_meta_graph=False)
    reader = tf.train.load_checkpoint(prefix)
    with strategy.scope():
        model = modern_mnist.build_model(cfg.regularization_rate)
    for v in model.trainable_variables:
        v.assign(reader.get_tensor(modern_mnist.legacy_name(v)))
    back = write_tf1_checkpoint({modern_mnist.legacy_name(v): v.numpy() for v in model.trainable_variables},
                                f"{tmp_dir}/mnist_back.ckpt")
    back_reader = tf.train.load_checkpoint(back)
    names = sorted(back_reader.get_variable_to_shape_map())
    errors = [tensor_error(n, back_reader.get_tensor(n), reader.get_tensor(n)) for n in names]
    exact = all(np.array_equal(back_reader.get_tensor(n), reader.get_tensor(n)) for n in names)
    return judge("checkpoint round trip", MODEL, errors, "exact", ok=exact and len(names) == 4,
                 note=f"{len(names)} tensors TF1 -> modern -> TF1, compared bit for bit")


# ---------------------------------------------------------------------------------------------

def default_config(steps=10, seed=0):
    return SimpleNamespace(
        seed=seed, steps=steps, rows_per_tower=16,
        regularization_rate=0.0001, lr_base=0.001, lr_decay=0.99, ema_decay=0.99,
        # The original decays once per 600 steps; here a short period, so that K steps move the lr.
        decay_steps=3.0,
        make_optimizer=modern_mnist.make_optimizer,
        make_moving_average=modern_mnist.make_moving_average)


def run(num_towers=2, steps=10, seed=0, tmp_dir="/tmp", cfg=None, log=print):
    """All MNIST checks; returns a list of Results."""
    cfg = cfg or default_config(steps, seed)
    strategy = common.make_strategy(num_towers)
    xs, ys = make_batches(steps + 1, num_towers * cfg.rows_per_tower, seed)
    results = []

    log("mnist: building the legacy graph and the modern model")
    g = build_legacy(num_towers, cfg)
    start = g.sess.run(g.weights)
    m = build_modern(strategy, start, cfg)
    results.append(check_variables(g, m))
    results.append(check_inference(g, m, xs[-1], ys[-1]))
    results += check_training_forward_and_gradients(g, m, strategy, xs[-1], ys[-1])
    results.append(check_checkpoint_round_trip(g, tmp_dir, strategy, cfg))
    log(f"mnist: {steps} training steps on both sides")
    results += check_training_steps(g, m, strategy, xs[:steps], ys[:steps])
    g.sess.close()

    log("mnist: the original's quirk, the same batch on every tower")
    g = build_legacy(num_towers, cfg, same_batch=True)
    m = build_modern(strategy, g.sess.run(g.weights), cfg)
    results += check_training_forward_and_gradients(g, m, strategy, xs[-1][:cfg.rows_per_tower],
                                                    ys[-1][:cfg.rows_per_tower], same_batch=True)
    g.sess.close()
    return results
