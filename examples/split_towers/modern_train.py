"""The Keras 3 port of train_tf1.py: the same convnet, MirroredStrategy replicas, TF1's RMSProp.

    python examples/split_towers/modern_train.py --data_dir DIR --num_gpus 2

How the TF1 program maps onto this file:
  inference(), l2_regularizer(wd)        ->  build_model(): Conv2D, MaxPool2D, Dense; L2(wd / 2) (wd * l2_loss)
  tf.split over the towers, tower_loss   ->  replica_loss(): each replica's rows, the loss scaled by the
                                             global batch, the weight decay by the replicas
  average_gradients, clip_by_global_norm ->  train_step(): the replicas' gradients summed, then clipped
                                             by their global norm, then applied once
  RMSPropOptimizer(decay, momentum, eps) ->  TF1RMSProp: TF1's rule and state (Keras' RMSprop starts
                                             its mean square at 0, TF1's at 1)
  exponential_decay(staircase=False)     ->  keras.optimizers.schedules.ExponentialDecay
  shuffle_batch of TFRecords             ->  make_dataset(): tf.data, shuffled, repeated, batched
Differences, on purpose: the step's loss is the global batch's (the TF1 program prints the last
tower's); no checkpoint is written.
"""
import argparse
import glob
import os
import time
from typing import Any, Callable, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

IMAGE_SIZE, NUM_CLASSES = 32, 10


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data_dir", default="/tmp/split_towers_data")
    p.add_argument("--train_dir", default="/tmp/split_towers_train_modern")
    p.add_argument("--num_gpus", type=int, default=1, help="replicas")
    p.add_argument("--batch_size", type=int, default=64, help="global batch")
    p.add_argument("--max_steps", type=int, default=1000)
    p.add_argument("--num_examples_per_epoch", type=int, default=10000)
    p.add_argument("--initial_learning_rate", type=float, default=0.01)
    p.add_argument("--num_epochs_per_decay", type=float, default=2.0)
    p.add_argument("--learning_rate_decay_factor", type=float, default=0.94)
    p.add_argument("--rmsprop_decay", type=float, default=0.9)
    p.add_argument("--rmsprop_momentum", type=float, default=0.9)
    p.add_argument("--rmsprop_epsilon", type=float, default=1.0)
    p.add_argument("--clip_norm", type=float, default=2.0)
    p.add_argument("--label_smoothing", type=float, default=0.1)
    p.add_argument("--weight_decay", type=float, default=0.00004)
    p.add_argument("--num_preprocess_threads", type=int, default=4)
    p.add_argument("--min_after_dequeue", type=int, default=1000, help="rows the shuffle buffer keeps")
    return p.parse_args(argv)


# Data ------------------------------------------------------------------------------------------
def parse(serialized: Any) -> tuple[Any, Any]:
    features = tf.io.parse_single_example(serialized, {"image": tf.io.FixedLenFeature([], tf.string),
                                                       "label": tf.io.FixedLenFeature([], tf.int64)})
    image = tf.reshape(tf.io.decode_raw(features["image"], tf.uint8), [IMAGE_SIZE, IMAGE_SIZE, 3])
    return tf.cast(image, tf.float32) / 127.5 - 1.0, tf.cast(features["label"], tf.int32)


def make_dataset(data_dir: str, batch_size: int, min_after_dequeue: int, num_threads: int = 4) -> Any:
    """Global batches of shuffled training rows, repeated forever."""
    files = sorted(glob.glob(os.path.join(data_dir, "train-*.tfrecord")))
    if not files:
        raise ValueError(f"no train-*.tfrecord file in {data_dir}")
    dataset = tf.data.TFRecordDataset(files).map(parse, num_parallel_calls=num_threads)
    return dataset.repeat().shuffle(min_after_dequeue + 3 * batch_size).batch(batch_size).prefetch(2)


# Model -----------------------------------------------------------------------------------------
def build_model(weight_decay: float) -> keras.Model:
    """The TF1 program's inference(): its l2_regularizer(wd) is wd * sum(w^2) / 2, Keras' L2(wd / 2)."""
    l2 = keras.regularizers.L2(weight_decay / 2)
    init = keras.initializers.TruncatedNormal(stddev=0.05)
    return keras.Sequential([
        keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3)),
        keras.layers.Conv2D(32, 5, padding="same", activation="relu", kernel_initializer=init, kernel_regularizer=l2,
                            name="conv1"),
        keras.layers.MaxPool2D(3, 2, padding="same"),
        keras.layers.Conv2D(64, 5, padding="same", activation="relu", kernel_initializer=init, kernel_regularizer=l2,
                            name="conv2"),
        keras.layers.MaxPool2D(3, 2, padding="same"),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu", kernel_initializer=init, kernel_regularizer=l2, name="fc3"),
        keras.layers.Dense(NUM_CLASSES, kernel_initializer=init, kernel_regularizer=l2, name="logits"),
    ])


class TF1RMSProp(keras.optimizers.Optimizer):
    """tf.compat.v1.train.RMSPropOptimizer's rule and state in Keras 3 (the `ApplyRMSProp` kernel):

        ms += (g^2 - ms) (1 - rho);  mom = momentum mom + lr g / sqrt(ms + epsilon);  w -= mom

    with ms starting at 1 (TF1's slot initialiser; Keras' RMSprop starts at 0, which a large epsilon
    such as 1.0 does not hide in the first steps)."""

    def __init__(self, learning_rate: Any, rho: float = 0.9, momentum: float = 0.9, epsilon: float = 1.0,
                 name: str = "tf1_rmsprop", **kwargs: Any) -> None:
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.rho, self.momentum, self.epsilon = rho, momentum, epsilon

    def build(self, var_list: Sequence[Any]) -> None:
        if self.built:
            return
        super().build(var_list)
        self._ms = [self.add_variable_from_reference(v, "ms", initializer="ones") for v in var_list]
        self._mom = [self.add_variable_from_reference(v, "mom") for v in var_list]

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        index = self._get_variable_index(variable)
        ms, mom = self._ms[index], self._mom[index]
        lr = tf.cast(learning_rate, variable.dtype)
        self.assign(ms, ms + (tf.square(gradient) - ms) * (1 - self.rho))
        self.assign(mom, self.momentum * mom + lr * gradient / tf.sqrt(ms + self.epsilon))
        self.assign_sub(variable, mom)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "rho": self.rho, "momentum": self.momentum, "epsilon": self.epsilon}


def make_optimizer(args: argparse.Namespace) -> TF1RMSProp:
    decay_steps = int(args.num_examples_per_epoch / args.batch_size * args.num_epochs_per_decay)
    schedule = keras.optimizers.schedules.ExponentialDecay(args.initial_learning_rate, decay_steps,
                                                           args.learning_rate_decay_factor)
    return TF1RMSProp(schedule, args.rmsprop_decay, args.rmsprop_momentum, args.rmsprop_epsilon)


# Training --------------------------------------------------------------------------------------
def replica_loss(model: keras.Model, x: Any, y: Any, global_batch: Any, label_smoothing: float) -> Any:
    """One replica's share of the step's loss: its rows' smoothed cross-entropy over the GLOBAL batch,
    and the weight decay over the replicas (the sum over replicas is the TF1 towers' mean)."""
    logits = model(x, training=True)
    onehot = tf.one_hot(y, NUM_CLASSES)
    per_row = keras.losses.categorical_crossentropy(onehot, logits, from_logits=True, label_smoothing=label_smoothing)
    return (tf.nn.compute_average_loss(per_row, global_batch_size=global_batch)
            + tf.nn.scale_regularization_loss(tf.add_n(model.losses)))


def clip_and_apply(optimizer: Any, grads: Sequence[Any], variables: Sequence[Any], clip_norm: float) -> list[Any]:
    """The summed gradients clipped by their global norm, then applied: as the TF1 program clips its
    averaged gradients (not each replica's part of them)."""
    clipped, _ = tf.clip_by_global_norm(grads, clip_norm)
    optimizer.apply_gradients(zip(clipped, variables))
    return clipped


def make_train_step(model: keras.Model, optimizer: Any, strategy: Any,
                    args: argparse.Namespace) -> Callable[[Any], Any]:
    """A tf.function(distributed batch) -> (loss, the gradients applied) of one training step."""
    variables = model.trainable_variables

    def replica(x: Any, y: Any) -> tuple[Any, Any]:
        global_batch = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.shape(y)[0])
        with tf.GradientTape() as tape:
            loss = replica_loss(model, x, y, global_batch, args.label_smoothing)
        return loss, tape.gradient(loss, variables)

    @tf.function
    def train_step(element: Any) -> tuple[Any, list[Any]]:
        losses, grads = strategy.run(replica, args=element)
        total = [strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in grads]
        clipped = clip_and_apply(optimizer, total, variables, args.clip_norm)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None), clipped

    return train_step


def build(args: argparse.Namespace, strategy: Any) -> tuple[keras.Model, TF1RMSProp]:
    with strategy.scope():
        model = build_model(args.weight_decay)
        optimizer = make_optimizer(args)
        optimizer.build(model.trainable_variables)
    return model, optimizer


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    from modern.runtime import configure_devices, make_strategy
    configure_devices(args.num_gpus)  # GPUs, or as many virtual CPU devices as replicas
    strategy = make_strategy(args.num_gpus)
    model, optimizer = build(args, strategy)
    step = make_train_step(model, optimizer, strategy, args)
    dataset = strategy.experimental_distribute_dataset(
        make_dataset(args.data_dir, args.batch_size, args.min_after_dequeue, args.num_preprocess_threads))
    for k, element in zip(range(args.max_steps), dataset):
        start = time.time()
        loss, _ = step(element)
        if k % 10 == 0:
            print(f"step {k}, loss = {float(loss):.3f} ({time.time() - start:.3f} sec/step)")
    return 0 if np.isfinite(float(loss)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
