"""Every optimizer rule the harness knows (compare/optimizers.py) against the optimizer itself: each
`tf.compat.v1.train` optimizer's update op, found in its graph with its hyper-parameters and slots
(compare/tf1_graph.py), and each Keras 3 optimizer, with its slots found by their names, update a
variable twice; the harness's float64 prediction of each update, from the state before it and the
gradient, must hold within the optimizer tolerance.  An optimizer the harness does not know is a
Rule of its own, never an exception."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from compare import optimizers, tf1_graph
from modern.keras_adapter import optimizer_slots
from compare.report import STATIC

tf1 = tf.compat.v1
TOLERANCE = STATIC["optimizer"].rel_l2
SHAPE = (5, 3)

TF1_OPTIMIZERS = {
    "sgd": lambda: tf1.train.GradientDescentOptimizer(0.1),
    "momentum": lambda: tf1.train.MomentumOptimizer(0.1, 0.9),
    "nesterov": lambda: tf1.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
    "adam": lambda: tf1.train.AdamOptimizer(0.01),
    "rmsprop": lambda: tf1.train.RMSPropOptimizer(0.01, 0.9, momentum=0.9, epsilon=1.0),
    "centered_rmsprop": lambda: tf1.train.RMSPropOptimizer(0.01, 0.9, momentum=0.5, epsilon=1e-3, centered=True),
    "adagrad": lambda: tf1.train.AdagradOptimizer(0.1),
    "adadelta": lambda: tf1.train.AdadeltaOptimizer(1.0, rho=0.95, epsilon=1e-6),
    "ftrl": lambda: tf1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.02),
    "ftrl_shrinkage": lambda: tf1.train.FtrlOptimizer(0.1, l2_shrinkage_regularization_strength=0.05),
    "proximal_sgd": lambda: tf1.train.ProximalGradientDescentOptimizer(0.1, 0.01, 0.02),
    "proximal_adagrad": lambda: tf1.train.ProximalAdagradOptimizer(0.1, l1_regularization_strength=0.01,
                                                                  l2_regularization_strength=0.02),
}

KERAS_OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "nesterov": lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01, momentum=0.9, epsilon=1.0),
    "rmsprop_plain": lambda: keras.optimizers.RMSprop(0.01),
    "centered_rmsprop": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "adadelta": lambda: keras.optimizers.Adadelta(1.0),
    "ftrl": lambda: keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.02,
                                          beta=0.1),
}


def gradients(seed):
    return np.random.RandomState(seed).normal(size=SHAPE).astype(np.float32)


@pytest.mark.parametrize("name", sorted(TF1_OPTIMIZERS))
def test_each_tf1_optimizers_update_is_predicted_from_its_graph(name):
    graph = tf1.Graph()
    with graph.as_default():
        w = tf1.get_variable("w", initializer=np.random.RandomState(0).normal(size=SHAPE).astype(np.float32))
        g = tf1.placeholder(tf.float32, SHAPE)
        step = tf1.train.get_or_create_global_step()
        train = TF1_OPTIMIZERS[name]().apply_gradients([(g, w)], global_step=step)
        updates = tf1_graph.optimizer_updates(graph, [(g, w)])
        update = updates["w"]
        sess = tf1.Session()
        sess.run(tf1.global_variables_initializer())
    rule = optimizers.legacy_rule(update, sess)
    assert rule.known and set(update.slots) == set(rule.slots)
    lr = float(sess.run(update.rate))
    for k in range(2):
        fetch = {"w": w, **update.slots}
        before = sess.run(fetch)
        powers = tuple(sess.run([update.inputs["beta1_power"], update.inputs["beta2_power"]])) \
            if rule.rule == "adam" else (0.0, 0.0)
        grad = gradients(k)
        sess.run(train, {g: grad})
        errors = optimizers.update_errors(name, rule, before, sess.run(fetch), grad, lr, powers, TOLERANCE)
        assert max(e.rel_l2 for e in errors) <= TOLERANCE, (k, errors)


@pytest.mark.parametrize("name", sorted(KERAS_OPTIMIZERS))
def test_each_keras_optimizers_update_is_predicted_from_its_configuration(name):
    w = keras.Variable(np.random.RandomState(0).normal(size=SHAPE).astype(np.float32), name="w")
    optimizer = KERAS_OPTIMIZERS[name]()
    optimizer.build([w])
    rule = optimizers.modern_rule(optimizer)
    slots = optimizer_slots(optimizer, w, [w])
    assert rule.known and set(slots) == set(rule.slots), (rule, sorted(slots))
    for k in range(2):
        before = {"w": w.numpy(), **{s: v.numpy() for s, v in slots.items()}}
        t = np.float32(int(optimizer.iterations.numpy()) + 1)
        powers = (float(np.float32(rule.beta1) ** t), float(np.float32(rule.beta2) ** t))
        lr = float(np.asarray(optimizer.learning_rate))
        grad = gradients(k)
        optimizer.apply_gradients([(tf.constant(grad), w)])
        after = {"w": w.numpy(), **{s: v.numpy() for s, v in slots.items()}}
        errors = optimizers.update_errors(name, rule, before, after, grad, lr, powers, TOLERANCE)
        assert max(e.rel_l2 for e in errors) <= TOLERANCE, (k, errors)


@pytest.mark.parametrize("optimizer", [keras.optimizers.AdamW(), keras.optimizers.Nadam(), keras.optimizers.Lion(),
                                       keras.optimizers.Adamax(), keras.optimizers.Adam(amsgrad=True),
                                       keras.optimizers.SGD(weight_decay=0.01)])
def test_an_optimizer_the_harness_does_not_know_is_a_rule_of_its_own(optimizer):
    rule = optimizers.modern_rule(optimizer)
    assert not rule.known and type(optimizer).__name__ in rule.describe()


def test_slots_pair_by_value_whatever_their_names():
    legacy = {"ms": np.ones(3), "mom": np.zeros(3)}
    modern = {"velocity": np.zeros(3), "mean_square": np.ones(3)}
    assert optimizers.pair_slots(legacy, modern, np.array_equal) == {"velocity": "mom", "mean_square": "ms"}
    assert optimizers.pair_slots(legacy, {"v": np.full(3, 2.0), "m": np.zeros(3)}, np.array_equal) is None
