"""The Keras 3 port of train_tf1.py: the same convnet, MirroredStrategy replicas, a custom loop.

    python examples/estimator_towers/modern_train.py --data_dir DIR --num_gpus 2
    python examples/estimator_towers/modern_train.py --data_dir DIR --num_gpus 2 --multi_gpu replicate

How the TF1 program maps onto this file:
  network(): tf.layers, fused batch norm  ->  build_model(): Conv2D, SlimBatchNorm (TF1's fused batch norm:
                                              the Bessel-corrected variance in the moving statistics, the
                                              replicas' updates averaged), Dense
  loss + weight_decay * l2_loss(kernels)  ->  replica_loss(): the replica's mean cross-entropy plus the
                                              kernels' L2(weight_decay / 2) (l2_loss is sum(w^2) / 2), times
                                              `scale`
  MirroredStrategy(num_gpus=N), a v1       ->  scale 1/N: the v1 optimizer divides each replica's loss by N
    optimizer: gradients summed               and sums the gradients (the global batch's mean, the
                                              weight decay once)
  replicate_model_fn, loss_reduction SUM  ->  scale 1: each tower's mean and its weight decay, summed
  replicate_model_fn, loss_reduction MEAN ->  scale 1/N
  towers by hand, gradients averaged      ->  scale 1, the summed gradients times 1/N (`gradient_scale`: the
  (batch norm: the first tower's updates)     program's tf.multiply(tf.add_n(grads), 1/N), rounded alike);
                                              the moving statistics moved by the first replica's batch alone
                                              (FirstReplicaBatchNorm)
  MomentumOptimizer(piecewise_constant)   ->  TF1Momentum (TF1's rule: a = m a + g, w -= lr a; Keras' SGD
                                              keeps -lr a, which a change of rate tells apart) on
                                              keras.optimizers.schedules.PiecewiseConstantDecay
  input_fn: TFRecords, shuffle, repeat    ->  make_dataset(): global batches, each replica its rows
  Estimator.evaluate: accuracy, mean loss ->  evaluate()
  the Estimator's checkpoints             ->  save_tf1() / load_tf1(): the TF1 names, both ways
Differences, on purpose: one dataset of global batches (the TF1 program's input_fn gives each replica
a batch of its own); the loss printed is the global batch's; one checkpoint, at the end.
"""
import argparse
import glob
import os
import time
from typing import Any, Callable, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from modern.checkpoints import write_tf1_checkpoint
from modern.resnet_v2 import SlimBatchNorm

IMAGE_SIZE, NUM_CLASSES = 16, 10


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data_dir", default="/tmp/estimator_towers_data",
                   help="folder of train-*.tfrecord and eval-*.tfrecord files")
    p.add_argument("--model_dir", default="/tmp/estimator_towers_model_modern", help="where the checkpoint goes")
    p.add_argument("--num_gpus", type=int, default=2, help="replicas, one per GPU")
    p.add_argument("--multi_gpu", choices=("mirrored", "replicate", "towers"), default="mirrored",
                   help="the TF1 program's multi-GPU form this run reproduces")
    p.add_argument("--loss_reduction", choices=("sum", "mean"), default="sum",
                   help="--multi_gpu replicate: the towers' losses summed or averaged")
    p.add_argument("--batch_size", type=int, default=128, help="images per step, across all replicas")
    p.add_argument("--eval_batch_size", type=int, default=100)
    p.add_argument("--train_steps", type=int, default=2000)
    p.add_argument("--shuffle_buffer", type=int, default=1000, help="rows the training input shuffles among")
    p.add_argument("--learning_rate", type=float, default=0.1, help="learning rate until the first boundary")
    p.add_argument("--boundaries", default="1000,1500", help="steps at which the rate drops")
    p.add_argument("--decay_rates", default="1,0.1,0.01", help="the rate's factor before, between and after them")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight_decay", type=float, default=2e-4, help="factor of every kernel's l2_loss")
    p.add_argument("--batch_norm_decay", type=float, default=0.997)
    p.add_argument("--batch_norm_epsilon", type=float, default=1e-5)
    return p.parse_args(argv)


# Data ------------------------------------------------------------------------------------------
def parse(serialized: Any) -> tuple[Any, Any]:
    features = tf.io.parse_single_example(serialized, {"image": tf.io.FixedLenFeature([], tf.string),
                                                       "label": tf.io.FixedLenFeature([], tf.int64)})
    image = tf.reshape(tf.io.decode_raw(features["image"], tf.uint8), [IMAGE_SIZE, IMAGE_SIZE, 3])
    return tf.cast(image, tf.float32) / 127.5 - 1.0, tf.cast(features["label"], tf.int32)


def make_dataset(data_dir: str, batch_size: int, shuffle_buffer: int, training: bool = True) -> Any:
    """Training rows shuffled and repeated, or evaluation rows once, in global batches."""
    pattern = "train-*.tfrecord" if training else "eval-*.tfrecord"
    files = sorted(glob.glob(os.path.join(data_dir, pattern)))
    if not files:
        raise ValueError(f"no {pattern} file in {data_dir}")
    dataset = tf.data.TFRecordDataset(files)
    if training:
        dataset = dataset.shuffle(shuffle_buffer).repeat()
    return dataset.map(parse).batch(batch_size)


# Model -----------------------------------------------------------------------------------------
class FirstReplicaBatchNorm(SlimBatchNorm):
    """SlimBatchNorm whose moving statistics take the first replica's update alone (aggregation
    ONLY_FIRST_REPLICA), as the TF1 program's hand-built towers run only the first tower's UPDATE_OPS."""

    def add_weight(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("name") in ("moving_mean", "moving_variance"):
            kwargs["aggregation"] = "only_first_replica"
            return keras.layers.BatchNormalization.add_weight(self, *args, **kwargs)
        return super().add_weight(*args, **kwargs)


def build_model(args: argparse.Namespace) -> keras.Model:
    """network(): tf.layers' defaults are Keras' (glorot_uniform kernels, zero biases); the weight decay
    of every kernel, weight_decay * l2_loss(w) = weight_decay * sum(w^2) / 2, is Keras' L2(weight_decay / 2)."""
    l2 = keras.regularizers.L2(args.weight_decay / 2)

    def batch_norm(name: str) -> keras.layers.Layer:
        kind = FirstReplicaBatchNorm if args.multi_gpu == "towers" else SlimBatchNorm
        return kind(momentum=args.batch_norm_decay, epsilon=args.batch_norm_epsilon, name=name)

    return keras.Sequential([
        keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3)),
        keras.layers.Conv2D(16, 3, padding="same", use_bias=False, kernel_regularizer=l2, name="conv1"),
        batch_norm("bn1"), keras.layers.ReLU(),
        keras.layers.Conv2D(32, 3, strides=2, padding="same", use_bias=False, kernel_regularizer=l2, name="conv2"),
        batch_norm("bn2"), keras.layers.ReLU(),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(NUM_CLASSES, kernel_regularizer=l2, name="logits"),
    ])


def tf1_names(model: keras.Model) -> dict[str, Any]:
    """{TF1 name: the model's variable}: `conv1/kernel`, `bn1/gamma`, ..., `logits/bias`."""
    return {f"{layer.name}/{w.name}": w for layer in model.layers for w in layer.weights}


class TF1Momentum(keras.optimizers.Optimizer):
    """tf.compat.v1.train.MomentumOptimizer's rule and state in Keras 3 (the `ApplyMomentum` kernel):

        accum = momentum accum + g;  w -= lr accum

    Keras' SGD keeps m = momentum m - lr g and adds it, the same steps only while the rate is constant."""

    def __init__(self, learning_rate: Any, momentum: float = 0.9, name: str = "tf1_momentum", **kwargs: Any) -> None:
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.momentum = momentum

    def build(self, var_list: Sequence[Any]) -> None:
        if self.built:
            return
        super().build(var_list)
        self._accum = [self.add_variable_from_reference(v, "momentum") for v in var_list]

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        accum = self._accum[self._get_variable_index(variable)]
        self.assign(accum, self.momentum * accum + gradient)
        self.assign_sub(variable, tf.cast(learning_rate, variable.dtype) * accum)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "momentum": self.momentum}


def make_optimizer(args: argparse.Namespace) -> TF1Momentum:
    """learning_rate(): tf.train.piecewise_constant(step, boundaries, lr * rates), read before the step."""
    boundaries = [int(b) for b in args.boundaries.split(",")]
    values = [args.learning_rate * float(d) for d in args.decay_rates.split(",")]
    return TF1Momentum(keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, values), args.momentum)


# Training --------------------------------------------------------------------------------------
def loss_scale(args: argparse.Namespace, replicas: int) -> float:
    """Each replica's loss factor: 1/N, where the TF1 program divides each replica's loss (MirroredStrategy's
    v1 optimizer, replicate_model_fn with MEAN); 1 where replicate_model_fn sums its towers (SUM, contrib's
    default), and for the towers by hand, which average their gradients instead (`gradient_scale`)."""
    summed = args.multi_gpu == "towers" or (args.multi_gpu == "replicate" and args.loss_reduction == "sum")
    return 1.0 if summed else 1.0 / replicas


def gradient_scale(args: argparse.Namespace, replicas: int) -> float:
    """The factor of the replicas' summed gradients: 1/N for the towers by hand (their average), else 1."""
    return 1.0 / replicas if args.multi_gpu == "towers" else 1.0


def model_loss(model: keras.Model, x: Any, y: Any, training: bool) -> tuple[Any, Any]:
    """The TF1 model_fn's `loss` on a batch: the rows' mean cross-entropy plus the weight decay."""
    logits = model(x, training=training)
    cross_entropy = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    return cross_entropy + tf.add_n(model.losses), logits


def replica_loss(model: keras.Model, x: Any, y: Any, scale: float) -> Any:
    """One replica's share of the step's loss: its model_fn loss times `scale` (`loss_scale`)."""
    return model_loss(model, x, y, training=True)[0] * scale


def make_train_step(model: keras.Model, optimizer: Any, strategy: Any,
                    args: argparse.Namespace) -> Callable[[Any], Any]:
    """A tf.function(distributed batch) -> (loss, the gradients applied) of one training step."""
    variables = model.trainable_variables
    scale = loss_scale(args, strategy.num_replicas_in_sync)
    average = gradient_scale(args, strategy.num_replicas_in_sync)

    def replica(x: Any, y: Any) -> tuple[Any, Any]:
        with tf.GradientTape() as tape:
            loss = replica_loss(model, x, y, scale)
        return loss, tape.gradient(loss, variables)

    @tf.function
    def train_step(element: Any) -> tuple[Any, list[Any]]:
        losses, grads = strategy.run(replica, args=element)
        total = [strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in grads]
        if average != 1.0:
            total = [tf.multiply(g, average) for g in total]
        optimizer.apply_gradients(zip(total, variables))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None) * average, total

    return train_step


def build(args: argparse.Namespace, strategy: Any) -> tuple[keras.Model, TF1Momentum]:
    with strategy.scope():
        model = build_model(args)
        optimizer = make_optimizer(args)
        optimizer.build(model.trainable_variables)
    return model, optimizer


# Checkpoints and evaluation --------------------------------------------------------------------
def load_tf1(model: keras.Model, path: str) -> int:
    """A TF1 checkpoint of train_tf1.py (the Estimator's, or the harness's) into the model; its global step."""
    reader = tf.train.load_checkpoint(path)
    for name, variable in tf1_names(model).items():
        variable.assign(reader.get_tensor(name))
    return int(reader.get_tensor("global_step")) if reader.has_tensor("global_step") else 0


def save_tf1(model: keras.Model, path: str, step: Optional[int] = None) -> str:
    """The model as a TF1 checkpoint with train_tf1.py's names (and its global step, where given)."""
    values = {name: v.numpy() for name, v in tf1_names(model).items()}
    return write_tf1_checkpoint({**values, **({"global_step": np.int64(step)} if step is not None else {})}, path)


def evaluate(model: keras.Model, args: argparse.Namespace, step: int) -> dict[str, float]:
    """Estimator.evaluate's metrics: accuracy over every evaluation row, the mean over batches of the
    batch's loss (the TF1 model_fn's `loss`; with towers (replicate_model_fn's, or by hand) the batch cut
    into one shard per tower, their losses scaled and summed as in training), and the global step."""
    towers = 1 if args.multi_gpu == "mirrored" else args.num_gpus
    scale = 1.0 if args.multi_gpu == "mirrored" else loss_scale(args, towers) * gradient_scale(args, towers)
    correct = rows = 0
    losses = []
    for x, y in make_dataset(args.data_dir, args.eval_batch_size, 1, training=False):
        shards = [model_loss(model, xs, ys, training=False)[0]
                  for xs, ys in zip(tf.split(x, towers), tf.split(y, towers))]
        losses.append(float(tf.add_n(shards) * scale))
        logits = model(x, training=False)
        correct += int(tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), y), tf.int32)))
        rows += int(tf.shape(y)[0])
    return {"accuracy": correct / rows, "loss": float(np.mean(losses)), "global_step": step}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.num_gpus < 1 or args.batch_size % args.num_gpus:
        raise SystemExit(f"--batch_size {args.batch_size} must be a multiple of --num_gpus {args.num_gpus} "
                         f"(at least 1)")
    from modern.runtime import configure_devices, make_strategy
    configure_devices(args.num_gpus)  # GPUs, or as many virtual CPU devices as replicas
    strategy = make_strategy(args.num_gpus)
    model, optimizer = build(args, strategy)
    step = make_train_step(model, optimizer, strategy, args)
    dataset = strategy.experimental_distribute_dataset(make_dataset(args.data_dir, args.batch_size,
                                                                    args.shuffle_buffer))
    start = time.time()
    for k, element in zip(range(args.train_steps), dataset):
        loss, _ = step(element)
        if k % 100 == 0:
            print(f"step {k}, loss = {float(loss):.4f} ({time.time() - start:.1f} s)")
    if not np.isfinite(float(loss)):
        print(f"the loss is {float(loss)} at step {args.train_steps}")
        return 1
    os.makedirs(args.model_dir, exist_ok=True)
    save_tf1(model, os.path.join(args.model_dir, f"model.ckpt-{args.train_steps}"), args.train_steps)
    results = evaluate(model, args, args.train_steps)
    print(f"step {results['global_step']}: eval accuracy {results['accuracy']:.4f}, loss {results['loss']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
