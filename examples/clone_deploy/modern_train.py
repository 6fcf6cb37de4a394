"""The Keras 3 port of train_tf1.py: the same CifarNet, MirroredStrategy replicas, TF1's RMSProp.

    python examples/clone_deploy/modern_train.py --dataset_dir DIR --num_clones 2

How the TF1 program maps onto this file:
  cifarnet(is_training=True), slim.l2_regularizer(wd)  ->  build_model(): Conv2D, MaxPool2D, Dense,
                                                          ReplicaDropout(1 - keep_prob): each replica its
                                                          own mask, as each clone (Keras' Dropout draws one
                                                          mask for every replica); L2(wd / 2) (slim's
                                                          regulariser is wd * l2_loss = wd * sum(w^2) / 2)
  clone_loss / num_clones, regularisation on clone 0  ->  replica_loss(): the rows' cross-entropy over
                                                          the GLOBAL batch, the regularisation over the
                                                          replicas (their sum is model_deploy's total_loss)
  _sum_clones_gradients, apply_gradients              ->  train_step(): the replicas' gradients summed
  RMSPropOptimizer(decay, momentum, opt_epsilon)      ->  TF1RMSProp (split_towers' port): TF1's rule,
                                                          its mean square starting at 1
  exponential_decay(staircase=True)                   ->  ExponentialDecay(staircase=True), its steps
                                                          counted in one clone's batch, as the trainer's
  tf.train.batch + prefetch_queue, one clone a batch  ->  make_dataset(): tf.data in file order, global
                                                          batches of batch_size x replicas, replica r
                                                          the r-th clone's rows
The TF1 graph has no inference mode (its dropout is always on); predict() here is the network
without dropout, as an evaluator of the TF1 program builds it.  No checkpoint is written.
"""
import argparse
import glob
import os
import time
from typing import Any, Callable, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from examples.split_towers.modern_train import IMAGE_SIZE, TF1RMSProp, parse  # the same records and rule
from modern.resnet_v2 import ReplicaDropout

NUM_CLASSES = 10


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset_dir", default="/tmp/clone_deploy_data")
    p.add_argument("--train_dir", default="/tmp/clone_deploy_train_modern")
    p.add_argument("--num_clones", type=int, default=1, help="replicas")
    p.add_argument("--batch_size", type=int, default=32, help="images per replica per step")
    p.add_argument("--max_number_of_steps", type=int, default=1000)
    p.add_argument("--num_preprocessing_threads", type=int, default=4)
    p.add_argument("--num_samples", type=int, default=10000, help="training images per epoch")
    p.add_argument("--weight_decay", type=float, default=0.00004)
    p.add_argument("--learning_rate", type=float, default=0.01)
    p.add_argument("--learning_rate_decay_factor", type=float, default=0.94)
    p.add_argument("--num_epochs_per_decay", type=float, default=2.0)
    p.add_argument("--rmsprop_decay", type=float, default=0.9)
    p.add_argument("--rmsprop_momentum", type=float, default=0.9)
    p.add_argument("--opt_epsilon", type=float, default=1.0)
    p.add_argument("--label_smoothing", type=float, default=0.0)
    p.add_argument("--dropout_keep_prob", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0, help="the dropout's seed")
    return p.parse_args(argv)


# Data ------------------------------------------------------------------------------------------
def make_dataset(dataset_dir: str, global_batch: int, num_threads: int = 4) -> Any:
    """Global batches of training rows in file order, repeated forever (the TF1 program does not shuffle)."""
    files = sorted(glob.glob(os.path.join(dataset_dir, "train-*.tfrecord")))
    if not files:
        raise ValueError(f"no train-*.tfrecord file in {dataset_dir}")
    dataset = tf.data.TFRecordDataset(files).map(parse, num_parallel_calls=num_threads, deterministic=True)
    return dataset.repeat().batch(global_batch, drop_remainder=True).prefetch(2)


# Model -----------------------------------------------------------------------------------------
def build_model(weight_decay: float, keep_prob: float, seed: int) -> keras.Model:
    """The TF1 program's cifarnet(): slim's l2_regularizer(wd) is wd * sum(w^2) / 2, Keras' L2(wd / 2)."""
    l2 = keras.regularizers.L2(weight_decay / 2)
    init = keras.initializers.TruncatedNormal(stddev=0.05)
    return keras.Sequential([
        keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3)),
        keras.layers.Conv2D(32, 5, padding="same", activation="relu", kernel_initializer=init, kernel_regularizer=l2,
                            name="conv1"),
        keras.layers.MaxPool2D(2, 2),
        keras.layers.Conv2D(64, 5, padding="same", activation="relu", kernel_initializer=init, kernel_regularizer=l2,
                            name="conv2"),
        keras.layers.MaxPool2D(2, 2),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu", kernel_initializer=init, kernel_regularizer=l2, name="fc3"),
        ReplicaDropout(1 - keep_prob, seed=seed, name="dropout3"),  # a mask of its own on every replica
        keras.layers.Dense(64, activation="relu", kernel_initializer=init, kernel_regularizer=l2, name="fc4"),
        keras.layers.Dense(NUM_CLASSES, kernel_initializer=keras.initializers.TruncatedNormal(stddev=1 / 64),
                           name="logits"),
    ])


def make_optimizer(args: argparse.Namespace) -> TF1RMSProp:
    """The trainer's decay steps count one clone's batch (num_samples * epochs_per_decay / batch_size)."""
    decay_steps = int(args.num_samples / args.batch_size * args.num_epochs_per_decay)
    schedule = keras.optimizers.schedules.ExponentialDecay(args.learning_rate, decay_steps,
                                                           args.learning_rate_decay_factor, staircase=True)
    return TF1RMSProp(schedule, args.rmsprop_decay, args.rmsprop_momentum, args.opt_epsilon)


# Training --------------------------------------------------------------------------------------
def replica_loss(model: keras.Model, x: Any, y: Any, global_batch: Any, label_smoothing: float) -> Any:
    """One replica's share of model_deploy's total_loss: its rows' cross-entropy over the GLOBAL batch
    (a clone's mean over its rows, divided by the clones), and the regularisation over the replicas
    (model_deploy adds it once, to the first clone; the replicas' gradients are summed)."""
    logits = model(x, training=True)
    onehot = tf.one_hot(y, NUM_CLASSES)
    per_row = keras.losses.categorical_crossentropy(onehot, logits, from_logits=True, label_smoothing=label_smoothing)
    return (tf.nn.compute_average_loss(per_row, global_batch_size=global_batch)
            + tf.nn.scale_regularization_loss(tf.add_n(model.losses)))


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
        optimizer.apply_gradients(zip(total, variables))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None), total

    return train_step


def build(args: argparse.Namespace, strategy: Any) -> tuple[keras.Model, TF1RMSProp]:
    with strategy.scope():
        model = build_model(args.weight_decay, args.dropout_keep_prob, args.seed)
        optimizer = make_optimizer(args)
        optimizer.build(model.trainable_variables)
    return model, optimizer


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    from modern.runtime import configure_devices, make_strategy
    configure_devices(args.num_clones)  # GPUs, or as many virtual CPU devices as replicas
    strategy = make_strategy(args.num_clones)
    model, optimizer = build(args, strategy)
    step = make_train_step(model, optimizer, strategy, args)
    dataset = strategy.experimental_distribute_dataset(
        make_dataset(args.dataset_dir, args.batch_size * args.num_clones, args.num_preprocessing_threads))
    for k, element in zip(range(args.max_number_of_steps), dataset):
        start = time.time()
        loss, _ = step(element)
        if k % 10 == 0:
            print(f"global step {k}: loss = {float(loss):.4f} ({time.time() - start:.3f} sec/step)")
    return 0 if np.isfinite(float(loss)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
