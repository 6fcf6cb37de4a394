"""legacy/run_tf1/replicate.py: replicate_model_fn and TowerOptimizer, against the same towers by hand.

One graph each, in this process: the replicated model_fn on a fed batch of 8 rows over two towers
(both on /cpu:0, the behaviour is the same), and the same two towers written out the classic way (the
batch cut by tf.split, the second tower reusing the variables, each tower's gradients summed and
applied once).  Bit for bit, the losses and the weights after one step agree; MEAN divides each
tower's loss by the tower count; evaluation counts every tower's rows; predictions are concatenated.
"""
import numpy as np
import pytest
import tensorflow as tf

from legacy.run_tf1 import replicate

tf1 = tf.compat.v1
ROWS, TOWERS = 8, 2


def batch():
    rng = np.random.RandomState(0)
    return rng.randn(ROWS, 5).astype(np.float32), rng.randint(0, 3, ROWS).astype(np.int32)


def logits_of(x):
    hidden = tf1.layers.dense(x, 4, activation=tf.nn.relu, name="hidden")
    return tf1.layers.dense(hidden, 3, name="logits")


def model_fn(features, labels, mode):
    keys = replicate.load(replicate.V1_API).ModeKeys
    logits = logits_of(features)
    if mode == keys.PREDICT:
        return replicate.load(replicate.V1_API).EstimatorSpec(mode, predictions={"classes": tf.argmax(logits, 1)})
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    optimizer = replicate.TowerOptimizer(tf1.train.GradientDescentOptimizer(0.5))
    return replicate.load(replicate.V1_API).EstimatorSpec(
        mode, loss=loss, train_op=optimizer.minimize(loss, tf1.train.get_or_create_global_step()),
        eval_metric_ops={"accuracy": tf1.metrics.accuracy(labels, tf.argmax(logits, 1))})


def replicated(mode, reduction=tf1.losses.Reduction.SUM):
    """(graph, x, y, spec) of the replicated model_fn in `mode`."""
    graph = tf1.Graph()
    with graph.as_default():
        tf1.set_random_seed(1)
        tf1.train.get_or_create_global_step()
        x, y = tf1.placeholder(tf.float32, [None, 5]), tf1.placeholder(tf.int32, [None])
        fn = replicate.replicate_model_fn(model_fn, loss_reduction=reduction, devices=["/cpu:0"] * TOWERS)
        spec = fn(x, y, mode)
    return graph, x, y, spec


def by_hand(scale):
    """(graph, x, y, loss, train_op): the same towers written out, each tower's loss times `scale`."""
    graph = tf1.Graph()
    with graph.as_default():
        tf1.set_random_seed(1)
        global_step = tf1.train.get_or_create_global_step()
        x, y = tf1.placeholder(tf.float32, [None, 5]), tf1.placeholder(tf.int32, [None])
        optimizer = tf1.train.GradientDescentOptimizer(0.5)
        losses, grads = [], {}
        for i, (xs, ys) in enumerate(zip(tf.split(x, TOWERS), tf.split(y, TOWERS))):
            with tf1.variable_scope("", reuse=i > 0), tf1.name_scope(f"tower_{i}" if i else ""):
                loss = tf1.losses.sparse_softmax_cross_entropy(ys, logits_of(xs)) * scale
                losses.append(loss)
                for g, v in optimizer.compute_gradients(loss):
                    grads.setdefault(v, []).append(g)
        train_op = optimizer.apply_gradients([(tf.add_n(g), v) for v, g in grads.items()], global_step)
        total = tf.add_n(losses)
    return graph, x, y, total, train_op


def start(sess):
    """Every trainable variable set to the same values in any of these graphs, by name and shape."""
    rng = np.random.RandomState(7)
    for v in sorted(tf1.trainable_variables(), key=lambda v: v.op.name):
        v.load(rng.normal(0, 0.5, v.shape.as_list()).astype(np.float32), sess)


def step(graph, x, y, loss, train_op):
    """(loss, every trainable variable after the step, the global step) from `start`."""
    xv, yv = batch()
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        sess.run(tf1.global_variables_initializer())
        start(sess)
        before = sess.run(loss, {x: xv, y: yv})
        sess.run(train_op, {x: xv, y: yv})
        after = sess.run({v.op.name: v for v in tf1.trainable_variables()})
        return before, after, sess.run(tf1.train.get_global_step())


@pytest.mark.parametrize("reduction, scale", [(tf1.losses.Reduction.SUM, 1.0), (tf1.losses.Reduction.MEAN, 0.5)],
                         ids=["sum", "mean"])
def test_a_replicated_step_is_the_towers_by_hand_bit_for_bit(reduction, scale):
    graph, x, y, spec = replicated("train", reduction)
    loss_r, after_r, steps_r = step(graph, x, y, spec.loss, spec.train_op)
    loss_h, after_h, steps_h = step(*by_hand(scale))
    assert loss_r == loss_h and steps_r == steps_h == 1
    assert sorted(after_r) == sorted(after_h) == ["hidden/bias", "hidden/kernel", "logits/bias", "logits/kernel"]
    for name in after_r:
        np.testing.assert_array_equal(after_r[name], after_h[name], err_msg=name)
    # The towers' ops in their scopes, one set of variables (the first tower's names are a one-device run's).
    names = {op.name for op in graph.get_operations()}
    assert {"split_inputs/split", "tower_1/hidden/MatMul", "gradient_aggregating/AddN"} <= names
    assert len(graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES)) == 4


def test_a_sum_step_moves_the_weights_twice_as_far_as_a_mean_step():
    """SUM (contrib's default) adds the towers' mean losses: at two towers, twice the gradient of MEAN."""
    graph, x, y, spec = replicated("train", tf1.losses.Reduction.SUM)
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        sess.run(tf1.global_variables_initializer())
        start(sess)
        before = sess.run({v.op.name: v for v in tf1.trainable_variables()})
    _, after_sum, _ = step(graph, x, y, spec.loss, spec.train_op)
    graph_m, x_m, y_m, spec_m = replicated("train", tf1.losses.Reduction.MEAN)
    _, after_mean, _ = step(graph_m, x_m, y_m, spec_m.loss, spec_m.train_op)
    for name in before:
        np.testing.assert_allclose(after_sum[name] - before[name], 2 * (after_mean[name] - before[name]), rtol=1e-5,
                                   atol=1e-6, err_msg=name)


def test_evaluation_counts_every_towers_rows_and_prediction_concatenates_them():
    xv, yv = batch()
    graph, x, y, spec = replicated("eval")
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
        start(sess)
        sess.run([op for _, op in spec.eval_metric_ops.values()], {x: xv, y: yv})
        accuracy = sess.run(spec.eval_metric_ops["accuracy"][0])
        towers = sess.run([graph.get_tensor_by_name(f"{scope}logits/BiasAdd:0") for scope in ("", "tower_1/")], {x: xv})
        total = sess.run(graph.get_collection(tf1.GraphKeys.METRIC_VARIABLES))
    predicted = np.concatenate([np.argmax(t, 1) for t in towers])  # tower 0: rows 0..3, tower 1: rows 4..7
    assert accuracy == pytest.approx(np.mean(predicted == yv))
    # accuracy's (total, count): every tower's in the first tower's pair, the other towers' zeroed
    assert (total[0], total[1]) == (np.sum(predicted == yv), ROWS) and all(v == 0 for v in total[2:])
    graph, x, y, spec = replicated("infer")
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        sess.run(tf1.global_variables_initializer())
        start(sess)
        classes = sess.run(spec.predictions["classes"], {x: xv})
    np.testing.assert_array_equal(classes, predicted)


def test_a_model_fn_whose_optimizer_is_not_a_tower_optimizer_is_refused():
    def plain(features, labels, mode):
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits_of(features))
        return replicate.load(replicate.V1_API).EstimatorSpec(
            mode, loss=loss, train_op=tf1.train.GradientDescentOptimizer(0.5).minimize(loss))

    with tf1.Graph().as_default():
        fn = replicate.replicate_model_fn(plain, devices=["/cpu:0"] * TOWERS)
        with pytest.raises(ValueError, match="wrap optimizers with TowerOptimizer"):
            fn(tf1.placeholder(tf.float32, [None, 5]), tf1.placeholder(tf.int32, [None]), "train")
    with pytest.raises(ValueError, match="need to be reduced"):
        replicate.replicate_model_fn(plain, loss_reduction=tf1.losses.Reduction.NONE)
