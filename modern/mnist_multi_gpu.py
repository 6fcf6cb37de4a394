"""The MNIST multi-GPU trainer in today's TensorFlow: Keras 3, MirroredStrategy, tf.function.

The modern twin of `legacy/mnist_multi_gpu.py`, which reproduces the book's MNIST multi-GPU example
(the book's chapter-10 `mnist_multi_gpu_train.py`): the same 784-500-10 network, l2 regulariser,
learning-rate decay, gradient descent and moving average of the weights, with the towers replaced by
the replicas of a `tf.distribute.MirroredStrategy`.  Run it (from the repository root):

    python modern/mnist_multi_gpu.py                          # embedded synthetic data, 2 replicas, 1000 steps
    python modern/mnist_multi_gpu.py --towers 4 --data_path data/mnist/train.tfrecords
    python modern/mnist_multi_gpu.py --same_batch_per_replica # the legacy quirk: one batch on every replica
    python modern/mnist_multi_gpu.py --deterministic          # bit-identical reruns
    python -m modern.launch --workers 2 -- modern/mnist_multi_gpu.py   # 2 worker processes (modern/cluster.py)

A second invocation with the same --model_save_path resumes from the latest checkpoint.
Defaults are the original's constants (BATCH_SIZE 100 per replica, LEARNING_RATE_BASE 0.001,
LEARNING_RATE_DECAY 0.99, REGULARAZTION_RATE 0.0001, TRAINING_STEPS 1000, MOVING_AVERAGE_DECAY 0.99,
N_GPU 2), one flag each with the legacy program's names (`--towers`, alias `--num_replicas`; `--max_steps`,
alias `--training_steps`); the model folder is logs_and_models/modern/ (the legacy program's TF1
checkpoints keep logs_and_models/).
With fewer GPUs than replicas the GPUs are split into logical GPUs; without any, each replica runs on
its own virtual CPU device (`modern/runtime.py`).

How the legacy graph maps onto this file:
  mnist_inference.inference + l2_regularizer  ->  build_model(): Dense 'layer1', 'layer2', L2(scale/2)
  get_loss per tower                          ->  compute_replica_loss(): scaled for the global batch
  exponential_decay + GradientDescentOptimizer ->  make_optimizer(): SGD(ExponentialDecay)
  tower_grads, average_gradients, apply        ->  make_train_step(): strategy.run, SUM-reduce, apply
  ExponentialMovingAverage(0.99, global_step)  ->  make_moving_average(), applied after each update
  tf.train.Saver                              ->  tf.train.Checkpoint + CheckpointManager (+ resume)
Where this differs from the legacy program (each also commented in place):
  * each replica gets its own batch by default (the legacy's `--per_tower_batches`);
    `--same_batch_per_replica` reproduces the original's one batch on every tower;
  * the moving average always runs after the update (the legacy's `--ordered_ema`);
  * the logged loss is the global batch's (mean cross-entropy + regulariser), not the last tower's;
  * the summaries use this step's gradients instead of pulling one more batch through the towers;
  * checkpoints restore (resume), and the averaged weights are evaluated on the held-out set;
  * running out of data (repeat 10) ends training with a message and a checkpoint;
  * added: --log_every, --save_every, --seed, --deterministic, --connect_timeout (clusters), and a
    `loss` summary beside the book's histograms.
"""
from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from typing import Any, Callable, Mapping, Optional, Sequence


import keras
import tensorflow as tf

from modern import cluster
from modern.runtime import (UsageError, add_seed_flags, check_writable, seed_program,
                            run_reporting_usage_errors, write_histogram, write_scalar)
from records import mnist as mnist_records
from records.progress import progress
from records.usage import ArgumentParser, at_least, fraction

INPUT_NODE = mnist_records.IMAGE_PIXELS  # 784
LAYER1_NODE = 500
OUTPUT_NODE = mnist_records.NUM_CLASSES  # 10
EVAL_BATCH_SIZE = 1000


# ----------------------------------------------------------------------------------------------
# Parameters: the original's constants, one flag each (names as in legacy/mnist_multi_gpu.py).
# ----------------------------------------------------------------------------------------------
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch_size", type=at_least(1), default=100, help="BATCH_SIZE, per replica")
    p.add_argument("--learning_rate_base", type=float, default=0.001, help="LEARNING_RATE_BASE")
    p.add_argument("--learning_rate_decay", type=fraction(), default=0.99, help="LEARNING_RATE_DECAY")
    p.add_argument("--regularization_rate", type=float, default=0.0001, help="REGULARAZTION_RATE")
    p.add_argument("--max_steps", "--training_steps", dest="training_steps", type=at_least(1), default=1000,
                   metavar="N", help="TRAINING_STEPS: steps to train, in all across resumes")
    p.add_argument("--moving_average_decay", type=fraction(), default=0.99, help="MOVING_AVERAGE_DECAY")
    p.add_argument("--towers", "--num_replicas", dest="num_replicas", type=at_least(1), default=2, metavar="N",
                   help="N_GPU: the number of replicas, the towers of the original")
    p.add_argument("--model_save_path", default="logs_and_models/modern/",
                   help="MODEL_SAVE_PATH: checkpoints and events (a folder of its own: the legacy "
                        "program's TF1 checkpoints live in logs_and_models/)")
    p.add_argument("--model_name", default="model.ckpt", help="MODEL_NAME")
    p.add_argument("--data_path", default=None,
                   help="DATA_PATH, a TFRecord in the original's format (default: the embedded "
                        "synthetic set, made under data/mnist/ on first use)")
    p.add_argument("--eval_data_path", default=None,
                   help="held-out TFRecord for the averaged model's accuracy (default: the embedded "
                        "held-out set when --data_path is not given, else no evaluation)")
    p.add_argument("--same_batch_per_replica", action="store_true",
                   help="reproduce the original: every replica trains on the same batch")
    p.add_argument("--log_every", type=at_least(1), default=10, help="log (and write summaries) every N steps")
    p.add_argument("--save_every", type=at_least(1), default=1000, help="save a checkpoint every N steps")
    cluster.add_flags(p)
    add_seed_flags(p)
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------------------
# Data: the original's pipeline (parse, shuffle 10000, repeat 10, batch), fed to the replicas.
# ----------------------------------------------------------------------------------------------
def get_input(data_path: str, batch_size: int, num_replicas: int, same_batch_per_replica: bool = False,
              skip_batches: int = 0, shuffle_seed: Optional[int] = None) -> Any:
    """The original's `get_input`, as a dataset of *global* batches for `cluster.distribute`.

    Each replica receives `batch_size` rows.  By default they are different rows (the global batch is
    batch_size * num_replicas consecutive examples); with `same_batch_per_replica` one batch of
    `batch_size` is tiled num_replicas times, so the strategy hands every replica the same rows, as
    the original's single `get_input()` call feeds every tower.  `skip_batches` skips the batches a
    resumed run has already trained on; `shuffle_seed` makes the shuffle the same in every worker
    of a cluster (`modern.cluster.shared_seed`, kept in the checkpoint).

    Speed (the same batches): the original parses each record, then shuffles and batches; here the
    serialized records are shuffled and batched, then the original's parser runs over the whole
    batch at once (`records.mnist.parse_batch`: one ParseExample and one DecodeRaw for the batch).
    Parsing has no randomness and the shuffle's order does not depend on what it shuffles, so
    every batch holds the same rows in the same order (the harness's pipeline check compares
    them), at a fraction of the input cost of parsing record by record (or of `tf.vectorized_map`
    of the parser, whose DecodeRaw falls back to a while loop).
    """
    dataset = tf.data.TFRecordDataset([data_path])
    dataset = dataset.shuffle(buffer_size=10000, seed=shuffle_seed)
    dataset = dataset.repeat(10)
    if same_batch_per_replica:
        dataset = dataset.batch(batch_size)
    else:
        dataset = dataset.batch(batch_size * num_replicas)
    # the original's parser (raw 0..255 pixel floats), over a batch of records at once
    dataset = dataset.map(mnist_records.parse_batch)
    if same_batch_per_replica:
        dataset = dataset.map(lambda x, y: same_batch_on_every_replica(x, y, num_replicas))
    return dataset.skip(skip_batches).prefetch(2)


def same_batch_on_every_replica(x: Any, labels: Any, num_replicas: int) -> tuple[Any, Any]:
    """One batch tiled num_replicas times: the strategy's cut (ceil(rows / N) in order) then hands
    every replica the same rows, as the original feeds its one batch to every tower."""
    return tf.tile(x, [num_replicas, 1]), tf.tile(labels, [num_replicas])


def check_data(data_path: Optional[str], eval_data_path: Optional[str]) -> tuple[str, int, Optional[str], int]:
    """The data files to read (the embedded default when None), each checked record by record."""
    try:
        if data_path is None:
            default = mnist_records.ensure_default_data()
            data_path, eval_data_path = default.train, eval_data_path or default.eval
        num_examples = len(mnist_records.load_tfrecords(data_path)[1])
        num_eval = len(mnist_records.load_tfrecords(eval_data_path)[1]) if eval_data_path else 0
    except mnist_records.MnistDataError as e:
        raise UsageError(str(e)) from None
    return data_path, num_examples, eval_data_path, num_eval


# ----------------------------------------------------------------------------------------------
# Model: the book's mnist_inference, 784 -> 500 (relu) -> 10.
# ----------------------------------------------------------------------------------------------
def build_model(regularization_rate: float = 0.0001) -> Any:
    """The 784-500-10 network of `legacy/mnist_inference.py` as a Keras model.

    Dense layers 'layer1' and 'layer2' (kernel <-> TF1 'layerN/weights', bias <-> 'layerN/biases'),
    kernels truncated normal with stddev 0.1, biases zero.  The l2 regulariser has the legacy scale:
        contrib l2_regularizer(s)(w) = s * tf.nn.l2_loss(w) = s * sum(w**2) / 2 = keras L2(s / 2)(w)
    (keras' L2(s) alone would be twice the legacy term).  Only the kernels are regularised.
    """
    def dense(units: int, name: str, activation: Optional[str] = None) -> Any:
        return keras.layers.Dense(
            units, activation=activation, name=name,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.1),
            bias_initializer="zeros",
            kernel_regularizer=keras.regularizers.L2(regularization_rate / 2))

    return keras.Sequential([keras.Input((INPUT_NODE,)),
                             dense(LAYER1_NODE, "layer1", activation="relu"),
                             dense(OUTPUT_NODE, "layer2")], name="mnist")


LEGACY_NAMES = {"kernel": "weights", "bias": "biases"}


def legacy_name(variable: Any) -> str:
    """The TF1 name of a model variable: 'layer1/kernel' -> 'layer1/weights', 'layer1/bias' -> 'layer1/biases'."""
    layer, kind = variable.path.split("/")[-2:]
    return f"{layer}/{LEGACY_NAMES[kind]}"


# ----------------------------------------------------------------------------------------------
# Loss of one replica.
# ----------------------------------------------------------------------------------------------
def compute_replica_loss(model: Any, x: Any, labels: Any, global_batch_size: Any, training: bool = True) -> Any:
    """One replica's share of the loss: summed over the replicas it is the legacy loss.

    Legacy tower i (b rows):  L_i = mean_i(ce) + R(w),  update gradient  (1/N) sum_i grad L_i.
    Replica i here:           l_i = sum_i(ce) / B + R(w) / N,   B = global batch rows,
    and the strategy SUMS the replicas' gradients:
        sum_i grad l_i = (1/B) sum_rows grad ce + grad R
                       = (1/N) sum_i grad mean_i(ce) + grad R      when every replica has b = B/N rows,
    i.e. the regulariser counts once (as each legacy tower holds its own terms once), and the
    average over towers becomes a sum over replicas.  With the same batch on every replica
    (B = N*b) it is the gradient of one tower's loss, as in the original.

    Args:
      x: float32 [rows, 784] raw pixels (0..255, unscaled as the original feeds them).
      labels: int32 [rows].
      global_batch_size: rows in the whole step's batch, over all replicas (int or int32 tensor).
    Returns the scalar loss for this replica.
    """
    logits = model(x, training=training)
    per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    cross_entropy = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
    regularization = tf.nn.scale_regularization_loss(tf.add_n(model.losses))  # R(w) / N
    return cross_entropy + regularization


# ----------------------------------------------------------------------------------------------
# Learning rate, optimizer and moving average.
# ----------------------------------------------------------------------------------------------
def make_optimizer(learning_rate_base: float = 0.001, decay_steps: float = 60000 / 100,
                   learning_rate_decay: float = 0.99) -> Any:
    """SGD on the legacy schedule: lr = base * decay ** (step / decay_steps), not staircase.

    Keras evaluates the schedule at `optimizer.iterations` before incrementing it, as the legacy
    graph reads `global_step` before `apply_gradients` increments it: step n uses the same lr.
    """
    schedule = keras.optimizers.schedules.ExponentialDecay(
        learning_rate_base, decay_steps, learning_rate_decay, staircase=False)
    return keras.optimizers.SGD(learning_rate=schedule)


def make_moving_average(model: Any, optimizer: Any, decay: float = 0.99) -> tuple[Any, dict[str, Any]]:
    """The legacy `ExponentialMovingAverage(decay, global_step)` over the trainable variables.

    With num_updates n = optimizer.iterations (read after the update, as the legacy `--ordered_ema`):
        decay_n = min(decay, (1 + n) / (10 + n));   shadow <- shadow - (1 - decay_n) * (shadow - w)
    Call in the strategy's scope: the shadows are mirrored like the weights.  The `apply` here only
    creates them (each starts equal to its variable, and averaging w with w leaves w: no change).
    Returns (ema, shadows) with shadows a dict legacy name -> shadow variable, for checkpoints.
    """
    ema = tf.train.ExponentialMovingAverage(decay, num_updates=optimizer.iterations)
    variables = [v.value for v in model.trainable_variables]  # the tf.Variables under the Keras ones
    ema.apply(variables)
    shadows = {legacy_name(v): ema.average(v.value) for v in model.trainable_variables}
    return ema, shadows


# ----------------------------------------------------------------------------------------------
# One training step over all replicas.
# ----------------------------------------------------------------------------------------------
def make_train_step(model: Any, optimizer: Any, strategy: Any, ema: Optional[Any] = None, return_grads: bool = False,
                    element_spec: Optional[Any] = None) -> Callable[[Any], Any]:
    """A tf.function(dist_batch) that trains one step and returns the loss (summed over replicas).

    dist_batch is an (x, labels) element of `cluster.distribute`.  Each
    replica computes its loss and gradients and calls `apply_gradients`, which SUM-all-reduces the
    replicas' gradients (the legacy `average_gradients`, see compute_replica_loss) and applies them
    once to every copy of the weights; then `ema` (if given) averages the updated weights.
    Each step counts the rows actually present in it, so a short last batch is weighted by its
    true size.
    With return_grads, returns (loss, the summed gradients aligned with model.trainable_variables).
    element_spec: the distributed dataset's `element_spec`, to trace once for every batch size.
    """
    variables = model.trainable_variables

    def replica_step(x, labels):
        rows = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.shape(labels)[0])
        with tf.GradientTape() as tape:
            loss = compute_replica_loss(model, x, labels, rows, training=True)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))  # all-reduce (SUM), then one update
        return loss, grads

    @tf.function(input_signature=None if element_spec is None else [element_spec])
    def train_step(dist_batch):
        with strategy.scope():  # this strategy's cross-replica context, wherever we are called from
            per_replica_loss, per_replica_grads = strategy.run(replica_step, args=dist_batch)
            loss = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)
            if ema is not None:
                # Cross-replica, on the mirrored weights; tf.function orders it after the update
                # (the legacy --ordered_ema), so num_updates reads the incremented step.
                ema.apply([v.value for v in variables])
            if return_grads:
                return loss, [strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None)
                              for g in per_replica_grads]
        return loss

    return train_step


# ----------------------------------------------------------------------------------------------
# Evaluation with the averaged weights (the book's mnist_eval.py).
# ----------------------------------------------------------------------------------------------
def evaluate_averaged(shadows: Mapping[str, Any], eval_data_path: str, regularization_rate: float = 0.0001) -> float:
    """Accuracy on `eval_data_path` of the network whose weights are the moving-average shadows."""
    averaged = build_model(regularization_rate)
    for v in averaged.trainable_variables:
        v.assign(shadows[legacy_name(v)].read_value())
    dataset = tf.data.TFRecordDataset([eval_data_path]).map(mnist_records.parser).batch(EVAL_BATCH_SIZE)

    @tf.function
    def correct(x, labels):
        predictions = tf.argmax(averaged(x, training=False), 1, output_type=tf.int32)
        return tf.reduce_sum(tf.cast(tf.equal(predictions, labels), tf.int32))

    right = total = 0
    for x, labels in dataset:
        right += int(correct(x, labels))
        total += int(labels.shape[0])
    return right / total


# ----------------------------------------------------------------------------------------------
# The main training process.
# ----------------------------------------------------------------------------------------------
def check_inputs(args: argparse.Namespace, worker: Optional[cluster.Worker],
                 n: int) -> tuple[str, int, Optional[str]]:
    """Set-up before any model: the data and folders checked (UsageError otherwise), and logged.
    Returns (data_path, num_examples, eval_data_path or None)."""
    data_path, num_examples, eval_data_path, num_eval = check_data(args.data_path, args.eval_data_path)
    check_writable(args.model_save_path, "--model_save_path")
    cluster.check_layout(args.model_save_path, worker, args.num_replicas)
    print(f"data: {data_path} ({num_examples} examples)"
          + (f"; held-out: {eval_data_path} ({num_eval} examples)" if eval_data_path else ""))
    if args.same_batch_per_replica:
        print(f"--same_batch_per_replica: as the original, all {n} replicas train on the same batch of "
              f"{args.batch_size}; examples/sec counts it once per replica.")
    else:
        print(f"Each of the {n} replicas trains on its own batch of {args.batch_size} "
              f"({args.batch_size * n} distinct examples per step).")
    return data_path, num_examples, eval_data_path


def write_summaries(writer: Any, step: int, loss_value: float, grads: Sequence[Any], variables: Sequence[Any]) -> None:
    """The legacy histograms (averaged gradients, weights) under the legacy names, plus the loss."""
    with writer.as_default():
        write_scalar("loss", loss_value, step)  # addition: the legacy writes histograms only
        for g, v in zip(grads, variables):
            write_histogram(f"gradients_on_average/{legacy_name(v)}", g, step)
        for v in variables:
            write_histogram(legacy_name(v), v.value, step)


def train(args: argparse.Namespace) -> None:
    seed_program(args.seed, args.deterministic)
    # before any other TF op: may split the CPU; MultiWorkerMirroredStrategy when TF_CONFIG names workers
    strategy, worker = cluster.make_strategy(args.num_replicas, connect_timeout=args.connect_timeout)
    n = strategy.num_replicas_in_sync
    data_path, num_examples, eval_data_path = check_inputs(args, worker, n)

    with strategy.scope():
        model = build_model(args.regularization_rate)
        optimizer = make_optimizer(args.learning_rate_base, 60000 / args.batch_size, args.learning_rate_decay)
        optimizer.build(model.trainable_variables)
        ema, shadows = make_moving_average(model, optimizer, args.moving_average_decay)
    # on a cluster the agreed shuffle seed is saved too: a resumed cluster keeps its batch order
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, moving_averages=shadows,
                                     **cluster.shared_seed(strategy, worker))
    # On a cluster only the chief's `manager` writes model_save_path (the others a temporary folder).
    reader, manager = cluster.checkpoint_managers(checkpoint, args.model_save_path, worker, max_to_keep=5,
                                                  checkpoint_name=args.model_name)
    run_step = cluster.step_runner(worker, checkpoint, args.model_save_path, manager,
                                   lambda: int(optimizer.iterations.numpy()) - 1)
    if reader.latest_checkpoint:
        checkpoint.restore(reader.latest_checkpoint).assert_consumed()
        print(f"Resuming from {reader.latest_checkpoint}: step {int(optimizer.iterations.numpy())}")
    start = int(optimizer.iterations.numpy())
    if start >= args.training_steps:
        print(f"Nothing to train: the checkpoint is at step {start}, --max_steps is {args.training_steps}.")

    dataset = get_input(data_path, args.batch_size, n, args.same_batch_per_replica, skip_batches=start,
                        shuffle_seed=cluster.shuffle_seed(checkpoint))
    dist_dataset = cluster.distribute(strategy, worker, dataset)
    iterator = iter(dist_dataset)
    train_step = make_train_step(model, optimizer, strategy, ema, return_grads=True,
                                 element_spec=dist_dataset.element_spec)
    writer = tf.summary.create_file_writer(worker.folder(args.model_save_path) if worker else args.model_save_path)
    variables = model.trainable_variables

    step, done, saved, loss_value = start - 1, None, None, float("nan")
    begin = time.time()
    try:
        for step in range(start, args.training_steps):
            start_time = time.time()
            try:
                batch = next(iterator)
            except StopIteration:
                print(f"The input ran out (repeat 10 of {num_examples} examples) at step {step}; stopping here.")
                break
            loss, grads = run_step(train_step, batch)  # on a cluster, saves and exits on SIGTERM
            loss_value = float(loss)
            duration = time.time() - start_time
            done = step
            if step != 0 and step % args.log_every == 0:
                # The legacy count: batch_size rows per replica per step (with --same_batch_per_replica
                # the same rows num_replicas times), and duration / num_replicas seconds per batch.
                examples_per_sec = args.batch_size * n / duration
                format_str = '%s: step %d, loss = %.2f (%.1f examples/sec; %.3f sec/batch)'
                print(format_str % (datetime.now(), step, loss_value, examples_per_sec, duration / n)
                      + progress(step + 1, args.training_steps, time.time() - begin, step + 1 - start), flush=True)
                write_summaries(writer, step, loss_value, grads, variables)
            if step % args.save_every == 0 or (step + 1) == args.training_steps:
                manager.save(checkpoint_number=step)
                saved = step
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
        raise UsageError(f"reading {data_path} failed at step {step}: {e.message}") from None
    finally:
        writer.close()
    if done is not None and saved != done:
        manager.save(checkpoint_number=done)
    elapsed = time.time() - begin

    steps_run = 0 if done is None else done + 1 - start
    print(f"Ended: {steps_run} steps (through step {step}) in {elapsed:.1f} s"
          + (f", {steps_run * args.batch_size * n / elapsed:.1f} examples/sec; last loss {loss_value:.4f}."
             if steps_run else "."))
    if eval_data_path:
        accuracy = evaluate_averaged(shadows, eval_data_path, args.regularization_rate)
        # The book's mnist_eval.py line.
        print("After %d training step(s), validation accuracy using average model is %g"
              % (int(optimizer.iterations.numpy()), accuracy))
    print(f"checkpoints and events in {args.model_save_path}")
    cluster.finish(worker)  # on a cluster: every worker leaves together, quietly


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_reporting_usage_errors(train, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
