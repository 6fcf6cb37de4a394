"""The TF2 port of `cifar10_multi_gpu_train.py`: Keras 3, MirroredStrategy, tf.function.

Run it (from the repository root)::

    python examples/cifar10_tutorial/modern_train.py                      # embedded synthetic data
    python examples/cifar10_tutorial/modern_train.py --num_gpus 2 --data_dir cifar-10-batches-bin
    python examples/cifar10_tutorial/modern_train.py --eval               # precision of the averages

How the TF1 program maps onto this file:
  inference() + _variable_with_weight_decay   ->  build_model(): Conv2D, MaxPool2D('same'), LRN, Dense;
                                                  weight decay wd * l2_loss = keras L2(wd / 2)
  tower_loss per tower, 'losses' by scope     ->  replica_loss(): the replica's share of the global batch
  average_gradients, apply_gradients          ->  make_train_step(): strategy.run, SUM all-reduce, apply
  exponential_decay(staircase=True), SGD      ->  make_optimizer(): SGD(ExponentialDecay(staircase=True))
  ExponentialMovingAverage(0.9999, global_step) -> make_moving_average(), after each update
  Saver(tf.global_variables())                ->  tf.train.Checkpoint (model, optimizer, averages)
Differences, on purpose: the moving average runs after the update (the TF1 program leaves the two
unordered); the logged loss is the global batch's (the TF1 program logs its last tower's); the moving
averages of the losses (summaries only) are not kept.
"""
from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from typing import Any, Callable, Mapping, Optional, Sequence


import keras
import numpy as np
import tensorflow as tf

from examples.cifar10_tutorial import cifar10_input
from modern import cluster
from modern.checkpoints import write_tf1_checkpoint
from modern.runtime import UsageError, check_writable, make_strategy, run_reporting_usage_errors

MOVING_AVERAGE_DECAY = 0.9999
NUM_EPOCHS_PER_DECAY = 350.0
LEARNING_RATE_DECAY_FACTOR = 0.1
INITIAL_LEARNING_RATE = 0.1
EMBEDDED_MAX_STEPS = 300


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch_size", type=int, default=128, help="images per batch, per replica")
    p.add_argument("--data_dir", default=None,
                   help="the CIFAR-10 binary version's folder; default: the embedded synthetic set")
    p.add_argument("--train_dir", default="cifar10_train_modern", help="event logs and checkpoints")
    p.add_argument("--max_steps", type=int, default=None,
                   help=f"batches to run (tutorial 1000000; {EMBEDDED_MAX_STEPS} on the embedded set)")
    p.add_argument("--num_gpus", type=int, default=1, help="replicas (one per GPU)")
    p.add_argument("--distort", action=argparse.BooleanOptionalAction, default=True,
                   help="the tutorial's training distortions (random crop, flip, brightness, contrast)")
    p.add_argument("--eval", action="store_true", help="evaluate the latest checkpoint's moving averages instead")
    args = p.parse_args(argv)
    if min(args.batch_size, args.num_gpus) < 1 or (args.max_steps is not None and args.max_steps < 1):
        p.error("--batch_size, --num_gpus and --max_steps must be at least 1")
    return args


class LocalResponseNorm(keras.layers.Layer):
    """tf.nn.local_response_normalization as a layer (Keras 3 has none): the tutorial's parameters."""

    def __init__(self, depth_radius: int = 4, bias: float = 1.0, alpha: float = 0.001 / 9.0, beta: float = 0.75,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.depth_radius, self.bias, self.alpha, self.beta = depth_radius, bias, alpha, beta

    def call(self, inputs: Any) -> Any:
        return tf.nn.local_response_normalization(inputs, self.depth_radius, self.bias, self.alpha, self.beta)


def build_model() -> Any:
    """The tutorial's network; every Dense kernel with weight decay wd carries keras L2(wd / 2)
    (wd * tf.nn.l2_loss(w) = wd * sum(w**2) / 2).  The layers' order is the TF1 variables' order."""
    normal = keras.initializers.TruncatedNormal

    def conv(name: str, bias: float) -> Any:
        return keras.layers.Conv2D(64, 5, padding="same", activation="relu", name=name,
                                   kernel_initializer=normal(stddev=5e-2),
                                   bias_initializer=keras.initializers.Constant(bias))

    def dense(units: int, name: str, stddev: float, wd: float, bias: float, activation: Optional[str] = "relu") -> Any:
        return keras.layers.Dense(units, activation=activation, name=name, kernel_initializer=normal(stddev=stddev),
                                  bias_initializer=keras.initializers.Constant(bias),
                                  kernel_regularizer=keras.regularizers.L2(wd / 2) if wd else None)

    size = cifar10_input.IMAGE_SIZE
    return keras.Sequential([
        keras.Input((size, size, 3)),
        conv("conv1", 0.0), keras.layers.MaxPooling2D(3, 2, padding="same", name="pool1"),
        LocalResponseNorm(name="norm1"),
        conv("conv2", 0.1), LocalResponseNorm(name="norm2"),
        keras.layers.MaxPooling2D(3, 2, padding="same", name="pool2"),
        keras.layers.Flatten(),
        dense(384, "local3", 0.04, 0.004, 0.1), dense(192, "local4", 0.04, 0.004, 0.1),
        dense(cifar10_input.NUM_CLASSES, "softmax_linear", 1 / 192.0, 0.0, 0.0, activation=None)], name="cifar10")


def tf1_names(model: Any) -> dict[str, Any]:
    """TF1 name -> variable: layer conv1's kernel -> 'conv1/weights', its bias -> 'conv1/biases'."""
    names = {}
    for layer in model.layers:
        if getattr(layer, "kernel", None) is not None:
            names[f"{layer.name}/weights"], names[f"{layer.name}/biases"] = layer.kernel, layer.bias
    return names


def make_optimizer(batch_size: int,
                   num_examples_per_epoch: int = cifar10_input.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN) -> Any:
    """Gradient descent on the tutorial's staircase decay: 0.1 x 0.1^floor(step / decay_steps)."""
    decay_steps = int(num_examples_per_epoch / batch_size * NUM_EPOCHS_PER_DECAY)
    schedule = keras.optimizers.schedules.ExponentialDecay(INITIAL_LEARNING_RATE, decay_steps,
                                                           LEARNING_RATE_DECAY_FACTOR, staircase=True)
    return keras.optimizers.SGD(learning_rate=schedule)


def make_moving_average(model: Any, optimizer: Any, decay: float = MOVING_AVERAGE_DECAY) -> tuple[Any, dict[str, Any]]:
    """ExponentialMovingAverage(decay, num_updates=iterations) of the trainable variables; returns
    (ema, shadows by TF1 name).  Call in the strategy's scope."""
    ema = tf.train.ExponentialMovingAverage(decay, num_updates=optimizer.iterations)
    ema.apply([v.value for v in model.trainable_variables])
    return ema, {name: ema.average(v.value) for name, v in tf1_names(model).items()}


def replica_loss(model: Any, images: Any, labels: Any, global_batch_size: Any) -> Any:
    """This replica's share: its rows' cross-entropy over the global batch, plus the weight decay
    over the replicas (their sum is the TF1 towers' average)."""
    logits = model(images, training=True)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(labels, tf.int32), logits=logits)
    return (tf.nn.compute_average_loss(ce, global_batch_size=global_batch_size)
            + tf.nn.scale_regularization_loss(tf.add_n(model.losses)))


def make_train_step(model: Any, optimizer: Any, strategy: Any, ema: Optional[Any] = None, return_grads: bool = False,
                    element_spec: Optional[Any] = None) -> Callable[[Any], Any]:
    """A tf.function(dist_batch) -> loss (and, with return_grads, the summed gradients it applied)."""
    variables = model.trainable_variables

    def replica_step(images, labels):
        rows = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.shape(labels)[0])
        with tf.GradientTape() as tape:
            loss = replica_loss(model, images, labels, rows)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        return loss, grads

    @tf.function(input_signature=None if element_spec is None else [element_spec])
    def train_step(dist_batch):
        with strategy.scope():
            losses, grads = strategy.run(replica_step, args=dist_batch)
            loss = strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
            if ema is not None:
                ema.apply([v.value for v in variables])  # after the update (ordered by tf.function)
            if return_grads:
                return loss, [strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in grads]
        return loss

    return train_step


def train_dataset(train_files: Sequence[str], batch_size: int, num_replicas: int, distorted: bool = True) -> Any:
    """Global batches: batch_size rows per replica, the tutorial's stream."""
    return cifar10_input.train_dataset(train_files, batch_size * num_replicas, distorted)


def evaluate_averaged(shadows: Mapping[str, Any], eval_files: Sequence[str], batch_size: int,
                      num_examples: int) -> float:
    """The precision @ 1 of a network whose weights are the shadows, as the tutorial's eval counts it."""
    averaged = build_model()
    for name, v in tf1_names(averaged).items():
        v.assign(shadows[name].read_value() if hasattr(shadows[name], "read_value") else shadows[name])
    dataset, num_iter = cifar10_input.eval_dataset(eval_files, batch_size, num_examples)
    true_count = 0
    for images, labels in dataset:
        true_count += int(tf.reduce_sum(tf.cast(tf.nn.in_top_k(labels, averaged(images, training=False), 1), tf.int32)))
    return true_count / (num_iter * batch_size)


def save_tf1(model: Any, shadows: Mapping[str, Any], path: str) -> str:
    """The model (and its averages) as a TF1 checkpoint with the TF1 program's names."""
    values = {name: v.numpy() for name, v in tf1_names(model).items()}
    values.update({f"{name}/ExponentialMovingAverage": s.numpy() for name, s in shadows.items()})
    return write_tf1_checkpoint(values, path)


def resolve_data(args: argparse.Namespace) -> tuple[list[str], list[str], int]:
    try:
        train_files, eval_files, embedded = cifar10_input.resolve(args.data_dir)
        num_train, num_eval = cifar10_input.count_records(train_files), cifar10_input.count_records(eval_files)
    except cifar10_input.Cifar10BinaryError as e:
        raise UsageError(str(e)) from None
    if args.max_steps is None:
        args.max_steps = EMBEDDED_MAX_STEPS if embedded else 1000000
    print(f"data: {len(train_files)} training file(s), {num_train} images; {num_eval} evaluation images"
          + (f"; the embedded synthetic set, {args.max_steps} steps" if embedded else ""))
    return train_files, eval_files, num_eval


def build(strategy: Any, args: argparse.Namespace) -> tuple[Any, Any, Any, dict[str, Any], Any]:
    with strategy.scope():
        model = build_model()
        optimizer = make_optimizer(args.batch_size)
        optimizer.build(model.trainable_variables)
        ema, shadows = make_moving_average(model, optimizer)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, moving_averages=shadows)
    return model, optimizer, ema, shadows, checkpoint


def train(args: argparse.Namespace) -> None:
    strategy = make_strategy(args.num_gpus)
    train_files, _, _ = resolve_data(args)
    check_writable(args.train_dir, "--train_dir")
    model, optimizer, ema, shadows, checkpoint = build(strategy, args)
    manager = tf.train.CheckpointManager(checkpoint, args.train_dir, max_to_keep=5)
    n = strategy.num_replicas_in_sync
    dist = cluster.distribute(strategy, None, train_dataset(train_files, args.batch_size, n, args.distort))
    train_step = make_train_step(model, optimizer, strategy, ema, element_spec=dist.element_spec)
    iterator = iter(dist)
    for step in range(args.max_steps):
        start_time = time.time()
        loss_value = float(train_step(next(iterator)))
        duration = time.time() - start_time
        if np.isnan(loss_value):
            raise UsageError(f"the model diverged with loss = NaN at step {step}")
        if step % 10 == 0:
            print(f"{datetime.now()}: step {step}, loss = {loss_value:.2f} ({args.batch_size * n / duration:.1f} "
                  f"examples/sec; {duration / n:.3f} sec/batch)", flush=True)
        if step % 1000 == 0 or (step + 1) == args.max_steps:
            manager.save(checkpoint_number=step)
    print(f"checkpoints in {args.train_dir}")


def evaluate(args: argparse.Namespace) -> None:
    _, eval_files, num_eval = resolve_data(args)
    latest = tf.train.latest_checkpoint(args.train_dir)
    if latest is None:
        raise UsageError(f"no checkpoint in {args.train_dir}: train first")
    model, optimizer, _, shadows, checkpoint = build(make_strategy(1), args)
    checkpoint.restore(latest).expect_partial()
    precision = evaluate_averaged(shadows, eval_files, args.batch_size, num_eval)
    print(f"{datetime.now()}: precision @ 1 = {precision:.3f} ({latest})")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    return run_reporting_usage_errors(evaluate if args.eval else train, args)


if __name__ == "__main__":
    sys.exit(main())
