"""A tiny program pair for the harness's own tests: a TF1 tower program (softmax regression, towers
sliced by a fed `current_batch_size`, momentum SGD) and its Keras port, with an adapter (`PAIR`).

It exercises what neither of this repository's pairs does (momentum, whose slots TF1 and Keras keep
in different parameterisations) and gives the bad-adapter tests something quick to break.  Both
programs are a few lines, written here; `make_pair(**changes)` returns variants.
"""
import argparse
import dataclasses

import keras
import numpy as np
import tensorflow as tf

from compare.interface import Batch, LegacyGraph, ModernBuild, Pair, StepResult, TowerFeed
from legacy import towers as legacy_towers
from modern import cluster

tf1 = tf.compat.v1
FEATURES, CLASSES = 8, 4


def parse_args(argv, tower_flag):
    p = argparse.ArgumentParser()
    p.add_argument(tower_flag, type=int, default=2, dest="towers")
    p.add_argument("--learning_rate", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--decay", type=float, default=1.0, help="the rate times decay ** (step / 10); 1: constant")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# The TF1 program

def build_graph(num_towers, learning_rate, momentum, decay=1.0, noise=0.0, cosine_steps=0, cosine_alpha=0.0):
    x = tf1.placeholder(tf.float32, [None, FEATURES], name="x")
    y = tf1.placeholder(tf.int32, [None], name="y")
    current_batch_size = tf1.placeholder(tf.int32, name="current_batch_size")
    global_step = tf1.train.get_or_create_global_step()
    if decay != 1.0:
        learning_rate = tf1.train.exponential_decay(learning_rate, global_step, 10, decay)
    if cosine_steps:
        learning_rate = tf1.train.cosine_decay(learning_rate, global_step, cosine_steps, alpha=cosine_alpha)
    opt = tf1.train.MomentumOptimizer(learning_rate, momentum)
    tower_grads, losses, logits_all = [], [], []
    devices = legacy_towers.tower_devices(num_towers)
    with tf1.variable_scope(tf1.get_variable_scope()):
        for i in range(num_towers):
            with tf1.device(devices[i]), tf1.name_scope(f"tower_{i}"):
                xs, ys = (x[i * current_batch_size:(i + 1) * current_batch_size],
                          y[i * current_batch_size:(i + 1) * current_batch_size])
                w = tf1.get_variable("softmax/weights", [FEATURES, CLASSES],
                                     initializer=tf1.truncated_normal_initializer(stddev=0.1))
                b = tf1.get_variable("softmax/biases", [CLASSES], initializer=tf1.zeros_initializer())
                if noise:  # randomness on whatever is fed, which the harness cannot impose
                    xs = xs * (1 + noise * tf1.random_uniform(tf.shape(xs)))
                logits = tf.matmul(xs, w) + b
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ys, logits=logits))
                tf1.get_variable_scope().reuse_variables()
                tower_grads.append(opt.compute_gradients(loss))
                losses.append(loss)
                logits_all.append(logits)
    grads = legacy_towers.average_gradients(tower_grads)
    train_op = opt.apply_gradients(grads, global_step=global_step)
    return dict(x=x, y=y, current_batch_size=current_batch_size, global_step=global_step, grads=grads,
                train_op=train_op, losses=losses, logits=logits_all, lr=tf1.convert_to_tensor(learning_rate))


class Legacy:
    tower_flag = "--num_gpus"
    noise = 0.0  # > 0: the inputs multiplied by 1 + noise U(0, 1), in training and inference alike
    cosine: tuple = ()  # (steps, alpha): the rate decays by tf.compat.v1.train.cosine_decay

    def parse_args(self, argv):
        return parse_args(argv, self.tower_flag)

    def session_config(self, flags, towers):
        return legacy_towers.session_config(towers)

    def build(self, flags, towers, files):
        g = build_graph(towers, flags.learning_rate, flags.momentum, flags.decay, self.noise, *self.cosine)

        def feed(batch, training):
            c = batch.rows // towers
            return TowerFeed({g["x"]: batch.x, g["y"]: batch.y, g["current_batch_size"]: c},
                             [np.arange(i * c, (i + 1) * c) for i in range(towers)], [1 / towers] * towers)

        return LegacyGraph(feed=feed, tower_logits=g["logits"], tower_losses=g["losses"],
                           loss=tf.add_n(g["losses"]) / towers, grads_and_vars=g["grads"], train_op=g["train_op"],
                           global_step=g["global_step"], learning_rate=g["lr"])


# ---------------------------------------------------------------------------------------------
# The Keras port

class TF1Momentum(keras.optimizers.Optimizer):
    """tf.compat.v1.train.MomentumOptimizer's rule in Keras 3: a = momentum a + g; w -= lr a (Keras'
    SGD keeps m = momentum m - lr g instead: the same only while the rate stays the same)."""

    def __init__(self, learning_rate, momentum, name="tf1_momentum", **kwargs):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.momentum = momentum

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._accums = [self.add_variable_from_reference(v, "accum") for v in var_list]

    def update_step(self, gradient, variable, learning_rate):
        accum = self._accums[self._get_variable_index(variable)]
        self.assign(accum, self.momentum * accum + gradient)
        self.assign_sub(variable, tf.cast(learning_rate, variable.dtype) * accum)


class Modern:
    replica_flag = "--num_gpus"
    nesterov = False
    tf1_momentum = False  # the port's own optimizer with TF1's rule instead of Keras' SGD
    staircase = False     # the port's decay in steps where TF1's exponential_decay is continuous
    cosine: tuple = ()    # (steps, alpha): the rate decays by Keras' CosineDecay
    # ModernBuild.trace: None, or (self, the step's tf.function) -> what the harness calls to trace it
    # (the step then traced for its element's signature, once for every batch size).
    trace = None

    def parse_args(self, argv):
        return parse_args(argv, self.replica_flag)

    def build(self, flags, strategy, files):
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES, name="softmax")])
        rate = flags.learning_rate if flags.decay == 1.0 else keras.optimizers.schedules.ExponentialDecay(
            flags.learning_rate, 10, flags.decay, staircase=self.staircase)
        if self.cosine:
            rate = keras.optimizers.schedules.CosineDecay(flags.learning_rate, self.cosine[0], alpha=self.cosine[1])
        optimizer = (TF1Momentum(rate, flags.momentum) if self.tf1_momentum
                     else keras.optimizers.SGD(rate, momentum=flags.momentum, nesterov=self.nesterov))
        optimizer.build(model.trainable_variables)
        variables = model.trainable_variables

        def replica(x, y):
            rows = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.shape(y)[0])
            with tf.GradientTape() as tape:
                ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=model(x, training=True))
                loss = tf.nn.compute_average_loss(ce, global_batch_size=rows)
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables))
            return loss, grads

        signature = None
        if self.trace is not None:  # batches of any number of rows (a batch's rows are not static)
            rows = Data().batch(2, 0)
            signature = [cluster.distribute(strategy, None, tf.data.Dataset.from_tensor_slices(
                (rows.x, rows.y)).batch(2)).element_spec]

        @tf.function(reduce_retracing=True, input_signature=signature)
        def step(element):
            with strategy.scope():
                loss, grads = strategy.run(replica, args=element)
                total = lambda t: strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None)  # noqa: E731
                return total(loss), [total(g) for g in grads]

        def distribute(batch):
            return next(iter(cluster.distribute(strategy, None, tf.data.Dataset.from_tensors((batch.x, batch.y)))))

        return ModernBuild(model=model, optimizer=optimizer, train_step=lambda e: StepResult(*step(e)),
                           distribute=distribute, trace=self.trace(step) if self.trace is not None else None)


class Data:
    def write(self, folder, towers, seed):
        return {}

    def batch(self, rows, seed):
        rng = np.random.RandomState(seed)
        return Batch(rng.normal(size=(rows, FEATURES)).astype(np.float32),
                     rng.randint(0, CLASSES, rows).astype(np.int32))


def make_pair(**changes):
    pair = Pair(name="tiny", legacy=Legacy(), modern=Modern(), data=Data(), rows_per_tower=4, free_steps=3,
                quick_free_steps=3, description="tests/tiny_pair.py: softmax regression, momentum SGD",
                module=__name__)
    return dataclasses.replace(pair, **changes)


PAIR = make_pair()
