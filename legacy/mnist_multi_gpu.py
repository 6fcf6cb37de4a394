"""The classic TF1 MNIST multi-GPU trainer, ported faithfully to `tf.compat.v1` on TensorFlow 2.21.

Reproduces the book's MNIST multi-GPU example (`mnist_multi_gpu_train.py` from the book
"TensorFlow: 实战Google深度学习框架", chapter 10): N towers share one 784-500-10 network
(`legacy/mnist_inference.py`), each computes its loss and gradients, the gradients are averaged on
the CPU and applied once, and a moving average of the weights is kept for evaluation.

Run it (from the repository root):

    python legacy/mnist_multi_gpu.py                      # embedded synthetic data, 2 towers, 1000 steps
    python legacy/mnist_multi_gpu.py --towers 4 --data_path data/mnist/train.tfrecords
    python legacy/mnist_eval.py                           # accuracy of the moving averages

Real MNIST: `python -m records.mnist --images train-images-idx3-ubyte.gz
--labels train-labels-idx1-ubyte.gz --out data/mnist/train.tfrecords`, then pass `--data_path`.

Defaults are the original's constants (BATCH_SIZE 100, LEARNING_RATE_BASE 0.001, ...), one flag
each.  With fewer GPUs than towers, towers share the GPUs (round robin); without any, each tower
runs on its own virtual CPU device (see `legacy/towers.py`).

Where the port differs, and why (each also commented in place):
- The original's quirk is kept: `get_input()` is called once, so every tower trains on the *same*
  batch and examples/sec counts that batch once per tower.  The log says so.
  `--per_tower_batches` gives each tower its own batch (a deviation: the honest version).
- The original's `train_op = tf.group(update, moving average)` leaves the two unordered (the
  average may read the weights before or after the update).  Kept; `--ordered_ema` orders them.
- `--seed` (default: unseeded, as the original) and `--log_device_placement` (the original turns
  it on; here off by default, since it floods the log) are additions.
- The data is `--data_path` (the original's DATA_PATH "output.tfrecords"; default here the
  embedded synthetic set), the tower count `--towers` (alias `--num_gpus`, the original's N_GPU),
  the step count `--max_steps` (alias `--training_steps`).  The session adds `allow_growth` and,
  without GPUs, one virtual CPU device per tower (`legacy/towers.py`); the graph runs on TF2's
  runtime unless `--tf1_behavior`.
- Bad input (missing or corrupt data, unwritable model folder) stops with one clear paragraph
  (exit code 2); running out of data (repeat 10) stops training with a message, as a clean end.
  The log lines add an ETA.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence


import tensorflow.compat.v1 as tf

from legacy import mnist_inference
from legacy.runtime import UsageError, check_writable, run_main
from legacy.towers import average_gradients, placement_message, session_config, tower_devices
from records import mnist as mnist_records
from records.progress import progress
from records.usage import ArgumentParser, at_least, fraction


# ----------------------------------------------------------------------------------------------
# Parameters: the original's constants, one flag each.
# ----------------------------------------------------------------------------------------------
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch_size", type=at_least(1), default=100, help="BATCH_SIZE, per tower")
    p.add_argument("--learning_rate_base", type=float, default=0.001, help="LEARNING_RATE_BASE")
    p.add_argument("--learning_rate_decay", type=fraction(), default=0.99, help="LEARNING_RATE_DECAY")
    p.add_argument("--regularization_rate", type=float, default=0.0001, help="REGULARAZTION_RATE")
    p.add_argument("--max_steps", "--training_steps", dest="training_steps", type=at_least(1), default=1000,
                   metavar="N", help="TRAINING_STEPS: steps to train")
    p.add_argument("--moving_average_decay", type=fraction(), default=0.99, help="MOVING_AVERAGE_DECAY")
    p.add_argument("--towers", "--num_gpus", dest="num_gpus", type=at_least(1), default=2, metavar="N",
                   help="N_GPU: the number of towers")
    p.add_argument("--model_save_path", default="logs_and_models/", help="MODEL_SAVE_PATH: checkpoints, events")
    p.add_argument("--model_name", default="model.ckpt", help="MODEL_NAME")
    p.add_argument("--data_path", default=None,
                   help="DATA_PATH, a TFRecord in the original's format (default: the embedded "
                        "synthetic set, made under data/mnist/ on first use)")
    p.add_argument("--per_tower_batches", action="store_true",
                   help="deviation: each tower reads its own batch (the original feeds all towers one batch)")
    p.add_argument("--ordered_ema", action="store_true",
                   help="deviation: run the moving average after the update (the original leaves them unordered)")
    p.add_argument("--seed", type=int, default=None, help="addition: graph-level random seed (default: unseeded, "
                                                          "as the original)")
    p.add_argument("--tf1_behavior", action="store_true",
                   help="run on TF1's runtime, as the original did: tf.compat.v1.disable_v2_behavior() "
                        "before the graph is built (ref variables, v1 control flow, no eager)")
    p.add_argument("--log_device_placement", action="store_true",
                   help="the original's ConfigProto(log_device_placement=True); off by default here")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------------------
# Data: the original's TFRecord input pipeline.
# ----------------------------------------------------------------------------------------------
def get_input(data_path: str, batch_size: int, num_batches: int = 1) -> list[tuple[Any, Any]]:
    """The original's `get_input`: parse, shuffle 10000, repeat 10, batch, one-shot iterator.

    Returns a list of `num_batches` (features, labels) pairs, one `get_next()` each, all from the
    one iterator.  The original calls `get_next()` once (num_batches=1) and gives that one batch to
    every tower; `--per_tower_batches` asks for one per tower.
    """
    dataset = tf.data.TFRecordDataset([data_path])
    dataset = dataset.map(mnist_records.parser)  # the original's parser (records/mnist.py)
    dataset = dataset.shuffle(buffer_size=10000)
    dataset = dataset.repeat(10)
    dataset = dataset.batch(batch_size)
    iterator = tf.data.make_one_shot_iterator(dataset)
    return [iterator.get_next() for _ in range(num_batches)]


# ----------------------------------------------------------------------------------------------
# Loss of one tower.
# ----------------------------------------------------------------------------------------------
def get_loss(x: Any, y_: Any, regularizer: Optional[Callable[[Any], Any]], scope: Optional[str],
             reuse_variables: Optional[bool] = None) -> tuple[Any, Any, Any]:
    """The original's `get_loss`: cross-entropy plus *this tower's* regularisation losses.

    Every tower's `inference` adds its own copies of the l2 terms to the 'losses' collection;
    `tf.get_collection('losses', scope)` keeps only those created under this tower's name scope,
    so each loss holds the terms once, not once per tower.
    Returns (loss, cross_entropy, regularization_loss); the original returns `loss` only.
    """
    with tf.variable_scope(tf.get_variable_scope(), reuse=reuse_variables):
        y = mnist_inference.inference(x, regularizer)
    cross_entropy = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(logits=y, labels=y_))
    regularization_loss = tf.add_n(tf.get_collection('losses', scope))
    loss = cross_entropy + regularization_loss
    return loss, cross_entropy, regularization_loss


# ----------------------------------------------------------------------------------------------
# The training graph (everything in the original's `main` between the input and the Saver).
# ----------------------------------------------------------------------------------------------
def build_train_graph(tower_inputs: Sequence[tuple[Any, Any]], regularization_rate: float = 0.0001,
                      learning_rate_base: float = 0.001, learning_rate_decay: float = 0.99,
                      decay_steps: float = 60000 / 100, moving_average_decay: float = 0.99,
                      ordered_ema: bool = False, devices: Optional[Sequence[str]] = None) -> SimpleNamespace:
    """Build the original's training graph in the current default graph.

    Args:
      tower_inputs: one (x, y_) pair per tower: x float32 [batch, 784], y_ int32 [batch].  The same
        pair repeated reproduces the original (every tower on one batch).
      regularization_rate, learning_rate_base, learning_rate_decay, moving_average_decay: the
        original's constants.
      decay_steps: `60000 / BATCH_SIZE` in the original (one MNIST epoch), a float.
      ordered_ema: False as the original (update and moving average unordered); True runs the
        moving average after the update.
      devices: one device string per tower; default `tower_devices(len(tower_inputs))`.
    Returns:
      A SimpleNamespace with global_step, learning_rate, optimizer, tower_losses,
      tower_cross_entropy, tower_regularization, tower_grads, grads (averaged), apply_gradient_op,
      variable_averages (the ExponentialMovingAverage), variables_averages_op, train_op,
      cur_loss (the last tower's loss, as the original logs), saver, devices.
    """
    num_towers = len(tower_inputs)
    devices = list(devices or tower_devices(num_towers))
    regularizer = mnist_inference.l2_regularizer(regularization_rate)

    # float32, as in the original (get_variable's default dtype); it counts exactly up to 2**24.
    global_step = tf.get_variable('global_step', [], initializer=tf.constant_initializer(0), trainable=False)
    # Not staircase: lr = base * decay ** (global_step / decay_steps).
    learning_rate = tf.train.exponential_decay(
        learning_rate_base, global_step, decay_steps, learning_rate_decay)

    opt = tf.train.GradientDescentOptimizer(learning_rate)

    tower_grads, tower_losses, tower_cross_entropy, tower_regularization = [], [], [], []
    reuse_variables = False
    for i, (x, y_) in enumerate(tower_inputs):
        with tf.device(devices[i]):
            with tf.name_scope('GPU_%d' % i) as scope:
                cur_loss, cross_entropy, regularization_loss = get_loss(x, y_, regularizer, scope, reuse_variables)
                # After the first tower creates the variables, the others reuse them.
                reuse_variables = True
                grads = opt.compute_gradients(cur_loss)
                tower_grads.append(grads)
                tower_losses.append(cur_loss)
                tower_cross_entropy.append(cross_entropy)
                tower_regularization.append(regularization_loss)

    # Average the gradients over the towers (each tower weighs 1/N).
    grads = average_gradients(tower_grads)
    for grad, var in grads:
        if grad is not None:
            tf.summary.histogram('gradients_on_average/%s' % var.op.name, grad)

    # Apply the averaged gradients once.
    apply_gradient_op = opt.apply_gradients(grads, global_step=global_step)
    for var in tf.trainable_variables():
        tf.summary.histogram(var.op.name, var)

    # Moving average of the weights, with the warm-up that num_updates=global_step gives:
    #   decay_n = min(moving_average_decay, (1 + n) / (10 + n)),  n = global_step as read by the op
    #   shadow <- decay_n * shadow + (1 - decay_n) * var
    variable_averages = tf.train.ExponentialMovingAverage(moving_average_decay, global_step)
    variables_to_average = tf.trainable_variables() + tf.moving_average_variables()
    if ordered_ema:
        # Deviation (--ordered_ema): average the updated weights, with n = the incremented step.
        with tf.control_dependencies([apply_gradient_op]):
            variables_averages_op = variable_averages.apply(variables_to_average)
    else:
        # The original: no order between the two, so each shadow may average the weights (and
        # read global_step) from before or after this step's update.
        variables_averages_op = variable_averages.apply(variables_to_average)
    train_op = tf.group(apply_gradient_op, variables_averages_op)

    saver = tf.train.Saver()
    return SimpleNamespace(
        global_step=global_step, learning_rate=learning_rate, optimizer=opt,
        tower_losses=tower_losses, tower_cross_entropy=tower_cross_entropy,
        tower_regularization=tower_regularization, tower_grads=tower_grads, grads=grads,
        apply_gradient_op=apply_gradient_op, variable_averages=variable_averages,
        variables_averages_op=variables_averages_op, train_op=train_op, cur_loss=cur_loss,
        saver=saver, devices=devices)


# ----------------------------------------------------------------------------------------------
# Checks that turn bad input into one clear paragraph.
# ----------------------------------------------------------------------------------------------
def resolve_data_path(data_path: Optional[str]) -> tuple[str, int]:
    """The data file to train on (the embedded default when None) and its number of examples."""
    try:
        if data_path is None:
            data_path = mnist_records.ensure_default_data().train
        images, _ = mnist_records.load_tfrecords(data_path)  # reads every record: CRCs and format
    except mnist_records.MnistDataError as e:
        raise UsageError(str(e)) from None
    return data_path, len(images)


# ----------------------------------------------------------------------------------------------
# The main training process.
# ----------------------------------------------------------------------------------------------
def train(args: argparse.Namespace) -> None:
    data_path, num_examples = resolve_data_path(args.data_path)
    check_writable(args.model_save_path, "--model_save_path")
    n_gpu = args.num_gpus
    devices = tower_devices(n_gpu)
    print(f"data: {data_path} ({num_examples} examples); {placement_message(devices)}")
    if args.per_tower_batches:
        print(f"--per_tower_batches (deviation): each of the {n_gpu} towers reads its own batch of "
              f"{args.batch_size}; examples/sec counts {args.batch_size * n_gpu} distinct examples per step.")
    else:
        print(f"As in the original, get_input() is called once: all {n_gpu} towers train on the same batch "
              f"of {args.batch_size}, and examples/sec counts it once per tower ({args.batch_size * n_gpu} "
              f"per step, {args.batch_size} distinct).  --per_tower_batches gives each tower its own batch.")

    # Simple operations on the CPU; only the towers' training on the GPUs.
    with tf.Graph().as_default(), tf.device('/cpu:0'):
        if args.seed is not None:
            tf.set_random_seed(args.seed)
        if args.per_tower_batches:
            tower_inputs = get_input(data_path, args.batch_size, num_batches=n_gpu)
        else:
            tower_inputs = get_input(data_path, args.batch_size) * n_gpu  # one batch, every tower
        g = build_train_graph(
            tower_inputs, regularization_rate=args.regularization_rate,
            learning_rate_base=args.learning_rate_base, learning_rate_decay=args.learning_rate_decay,
            decay_steps=60000 / args.batch_size, moving_average_decay=args.moving_average_decay,
            ordered_ema=args.ordered_ema, devices=devices)

        summary_op = tf.summary.merge_all()
        init = tf.global_variables_initializer()
        checkpoint_path = os.path.join(args.model_save_path, args.model_name)
        with tf.Session(config=session_config(n_gpu, args.log_device_placement)) as sess:
            init.run()
            summary_writer = tf.summary.FileWriter(args.model_save_path, sess.graph)
            step, done, saved = -1, None, None
            begin = time.time()
            try:
                for step in range(args.training_steps):
                    start_time = time.time()
                    _, loss_value = sess.run([g.train_op, g.cur_loss])
                    duration = time.time() - start_time
                    done = step

                    if step != 0 and step % 10 == 0:
                        # The original's count: each tower uses one batch per step, so
                        # BATCH_SIZE * N_GPU examples (without --per_tower_batches, the same
                        # batch N_GPU times), and duration / N_GPU seconds per batch.
                        num_examples_per_step = args.batch_size * n_gpu
                        examples_per_sec = num_examples_per_step / duration
                        sec_per_batch = duration / n_gpu
                        format_str = '%s: step %d, loss = %.2f (%.1f examples/sec; %.3f sec/batch)'
                        print(format_str % (datetime.now(), step, loss_value, examples_per_sec, sec_per_batch)
                              + progress(step + 1, args.training_steps, time.time() - begin, step + 1))

                        # As in the original, the summaries run on their own, which pulls one more
                        # batch through the towers (the gradient histograms need one), unused for training.
                        summary = sess.run(summary_op)
                        summary_writer.add_summary(summary, step)

                    if step % 1000 == 0 or (step + 1) == args.training_steps:
                        g.saver.save(sess, checkpoint_path, global_step=step)
                        saved = step
            except tf.errors.OutOfRangeError:
                # The original would die here with a traceback.
                print(f"The input ran out (repeat 10 of {num_examples} examples) at step {step}; "
                      "stopping here.")
                if done is not None and saved != done:
                    g.saver.save(sess, checkpoint_path, global_step=done)
            except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
                raise UsageError(f"reading {data_path} failed at step {step}: {e.message}") from None
            finally:
                summary_writer.close()
    print(f"checkpoints and events in {args.model_save_path}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.tf1_behavior:
        tf.disable_v2_behavior()  # before any graph is built: the whole process runs TF1's runtime
    return run_main(train, args)


if __name__ == '__main__':
    sys.exit(main())
