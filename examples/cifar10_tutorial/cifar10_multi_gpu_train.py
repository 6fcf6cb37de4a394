"""Train the tutorial's CIFAR-10 network on several towers with synchronous updates (TF1, `tf.compat.v1`).

Run it (from the repository root)::

    python examples/cifar10_tutorial/cifar10_multi_gpu_train.py                  # embedded synthetic data
    python examples/cifar10_tutorial/cifar10_multi_gpu_train.py --num_gpus 2 --data_dir cifar-10-batches-bin
    python examples/cifar10_tutorial/cifar10_multi_gpu_train.py --eval           # precision of the averages

Written here in the manner of the classic tensorflow/models `tutorials/image/cifar10/
cifar10_multi_gpu_train.py` (another style than this repository's two programs): one tower per
GPU under the name scope `tower_i`, each dequeuing its own batch from one input stream, computing
`tower_loss` (the cross-entropy and its own copy of the weight decay from the 'losses' collection,
filtered by its scope), with moving averages of the last tower's losses; the gradients averaged on
the CPU, applied by plain gradient descent on a staircase exponential decay; a moving average of every
variable (decay 0.9999 with the global step's warm-up) grouped with the update, unordered; a Saver of
every variable.  `--eval` is the tutorial's `cifar10_eval.py`: the precision @ 1 of the moving
averages of the latest checkpoint.

Defaults are the tutorial's (batch 128 per tower, 1 GPU, 1000000 steps), except that with no
--data_dir the program trains on a small synthetic set in the binary format for 300 steps (the log
says so).  Without GPUs the towers run on virtual CPU devices (`legacy/towers.py`).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from datetime import datetime
from types import SimpleNamespace
from typing import Any, Optional, Sequence


import numpy as np
import tensorflow.compat.v1 as tf

from examples.cifar10_tutorial import cifar10, cifar10_input
from legacy.runtime import UsageError, check_writable, run_main
from legacy.towers import average_gradients, placement_message, session_config, tower_devices

EMBEDDED_MAX_STEPS = 300


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch_size", type=int, default=128, help="images per batch, per tower")
    p.add_argument("--data_dir", default=None,
                   help="the CIFAR-10 binary version's folder (data_batch_*.bin, test_batch.bin); default: the "
                        "embedded synthetic set")
    p.add_argument("--train_dir", default="cifar10_train", help="event logs and checkpoints")
    p.add_argument("--max_steps", type=int, default=None,
                   help=f"batches to run (tutorial 1000000; {EMBEDDED_MAX_STEPS} on the embedded set)")
    p.add_argument("--num_gpus", type=int, default=1, help="towers (one per GPU)")
    p.add_argument("--distort", action=argparse.BooleanOptionalAction, default=True,
                   help="the tutorial's training distortions (random crop, flip, brightness, contrast)")
    p.add_argument("--log_device_placement", action="store_true")
    p.add_argument("--eval", action="store_true", help="evaluate the latest checkpoint's moving averages instead")
    args = p.parse_args(argv)
    if min(args.batch_size, args.num_gpus) < 1 or (args.max_steps is not None and args.max_steps < 1):
        p.error("--batch_size, --num_gpus and --max_steps must be at least 1")
    return args


def tower_loss(scope: str, images: Any, labels: Any, batch_size: int) -> tuple[Any, list[Any]]:
    """The total loss of one tower: its cross-entropy and the weight decay its copy of the network
    added to 'losses' (the collection filtered by the tower's scope).  Returns (total, its terms)."""
    logits = cifar10.inference(images, batch_size)
    _ = cifar10.loss(logits, labels)
    losses = tf.get_collection("losses", scope)
    return tf.add_n(losses, name="total_loss"), losses


def add_loss_averages(losses: list[Any], total_loss: Any) -> tuple[Any, list[Any]]:
    """Moving averages (decay 0.9) of the last tower's losses and their summaries, raw and averaged.
    Made outside the towers' reused variable scope: the averages are variables of their own."""
    loss_averages = tf.train.ExponentialMovingAverage(0.9, name="avg")
    loss_averages_op = loss_averages.apply(losses + [total_loss])
    summaries = []
    for item in losses + [total_loss]:
        name = re.sub(f"{cifar10.TOWER_NAME}_[0-9]*/", "", item.op.name)
        summaries += [tf.summary.scalar(name + " (raw)", item), tf.summary.scalar(name, loss_averages.average(item))]
    return loss_averages_op, summaries


def build_graph(tower_batches: Sequence[tuple[Any, Any]], batch_size: int, num_examples_per_epoch: int,
                devices: Optional[Sequence[str]] = None) -> SimpleNamespace:
    """The training graph in the default graph, on `tower_batches` (one (images, labels) per tower).

    Returns a namespace: global_step, lr, opt, tower_losses, grads (averaged), apply_gradient_op,
    variable_averages, train_op, saver, summary_op."""
    num_gpus = len(tower_batches)
    devices = devices or tower_devices(num_gpus)
    global_step = tf.get_variable("global_step", [], initializer=tf.constant_initializer(0), trainable=False)
    num_batches_per_epoch = num_examples_per_epoch / batch_size
    decay_steps = int(num_batches_per_epoch * cifar10.NUM_EPOCHS_PER_DECAY)
    lr = tf.train.exponential_decay(cifar10.INITIAL_LEARNING_RATE, global_step, decay_steps,
                                    cifar10.LEARNING_RATE_DECAY_FACTOR, staircase=True)
    opt = tf.train.GradientDescentOptimizer(lr)
    tower_grads, tower_losses = [], []
    with tf.variable_scope(tf.get_variable_scope()):
        for i, (images, labels) in enumerate(tower_batches):
            with tf.device(devices[i]):
                with tf.name_scope(f"{cifar10.TOWER_NAME}_{i}") as scope:
                    loss, losses = tower_loss(scope, images, labels, batch_size)
                    tf.get_variable_scope().reuse_variables()  # the next towers share the variables
                    tower_grads.append(opt.compute_gradients(loss))
                    tower_losses.append(loss)
    grads = average_gradients(tower_grads)  # the synchronisation point of the towers
    loss_averages_op, summaries = add_loss_averages(losses, tower_losses[-1])
    summaries.append(tf.summary.scalar("learning_rate", lr))
    apply_gradient_op = opt.apply_gradients(grads, global_step=global_step)
    variable_averages = tf.train.ExponentialMovingAverage(cifar10.MOVING_AVERAGE_DECAY, global_step)
    variables_averages_op = variable_averages.apply(tf.trainable_variables())
    # As the tutorial: the update and the moving averages grouped, with no order between them.
    train_op = tf.group(apply_gradient_op, variables_averages_op, loss_averages_op)
    return SimpleNamespace(global_step=global_step, lr=lr, opt=opt, tower_losses=tower_losses, grads=grads,
                           apply_gradient_op=apply_gradient_op, variable_averages=variable_averages,
                           train_op=train_op, saver=tf.train.Saver(tf.global_variables()),
                           summary_op=tf.summary.merge(summaries))


def tower_inputs(train_files: Sequence[str], batch_size: int, num_gpus: int,
                 distorted: bool = True) -> list[tuple[Any, Any]]:
    """One input stream; each tower takes the next batch of it (the tutorial's batch_queue.dequeue())."""
    iterator = tf.data.make_one_shot_iterator(cifar10_input.train_dataset(train_files, batch_size, distorted))
    return [iterator.get_next() for _ in range(num_gpus)]


def resolve_data(args: argparse.Namespace) -> tuple[list[str], list[str], int, int]:
    try:
        train_files, eval_files, embedded = cifar10_input.resolve(args.data_dir)
        num_train = cifar10_input.count_records(train_files)
        num_eval = cifar10_input.count_records(eval_files)
    except cifar10_input.Cifar10BinaryError as e:
        raise UsageError(str(e)) from None
    if args.max_steps is None:
        args.max_steps = EMBEDDED_MAX_STEPS if embedded else 1000000
    print(f"data: {len(train_files)} training file(s), {num_train} images; {num_eval} evaluation images"
          + (f"; the embedded synthetic set, {args.max_steps} steps (the tutorial's: 1000000 on CIFAR-10)"
             if embedded else ""))
    return train_files, eval_files, num_train, num_eval


def train(args: argparse.Namespace) -> None:
    train_files, _, num_train, _ = resolve_data(args)
    check_writable(args.train_dir, "--train_dir")
    devices = tower_devices(args.num_gpus)
    print(placement_message(devices))
    with tf.Graph().as_default(), tf.device("/cpu:0"):
        g = build_graph(tower_inputs(train_files, args.batch_size, args.num_gpus, args.distort),
                        args.batch_size, cifar10_input.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN, devices)
        init = tf.global_variables_initializer()
        config = session_config(args.num_gpus, args.log_device_placement)
        with tf.Session(config=config) as sess:
            sess.run(init)
            summary_writer = tf.summary.FileWriter(args.train_dir, sess.graph)
            checkpoint_path = os.path.join(args.train_dir, "model.ckpt")
            for step in range(args.max_steps):
                start_time = time.time()
                _, loss_value = sess.run([g.train_op, g.tower_losses[-1]])
                duration = time.time() - start_time
                if np.isnan(loss_value):
                    raise UsageError(f"the model diverged with loss = NaN at step {step}")
                if step % 10 == 0:
                    examples_per_sec = args.batch_size * args.num_gpus / duration
                    print(f"{datetime.now()}: step {step}, loss = {loss_value:.2f} ({examples_per_sec:.1f} "
                          f"examples/sec; {duration / args.num_gpus:.3f} sec/batch)", flush=True)
                if step % 100 == 0:
                    summary_writer.add_summary(sess.run(g.summary_op), step)
                if step % 1000 == 0 or (step + 1) == args.max_steps:
                    g.saver.save(sess, checkpoint_path, global_step=step)
            summary_writer.close()
    print(f"checkpoints and events in {args.train_dir}")


def evaluate_checkpoint(checkpoint_path: str, eval_files: Sequence[str], batch_size: int,
                        num_examples: int) -> float:
    """The tutorial's eval_once: precision @ 1 of the checkpoint's moving averages, over
    ceil(examples / batch) full batches (the last wraps around the file)."""
    with tf.Graph().as_default():
        dataset, num_iter = cifar10_input.eval_dataset(eval_files, batch_size, num_examples)
        images, labels = tf.data.make_one_shot_iterator(dataset).get_next()
        logits = cifar10.inference(images, batch_size)
        top_k_op = tf.nn.in_top_k(logits, labels, 1)
        variable_averages = tf.train.ExponentialMovingAverage(cifar10.MOVING_AVERAGE_DECAY)
        saver = tf.train.Saver(variable_averages.variables_to_restore())
        with tf.Session() as sess:
            try:
                saver.restore(sess, checkpoint_path)
            except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError, ValueError) as e:
                raise UsageError(f"cannot restore the moving averages from {checkpoint_path}: "
                                 f"{str(e).splitlines()[0]}") from None
            true_count = sum(int(np.sum(sess.run(top_k_op))) for _ in range(num_iter))
    return true_count / (num_iter * batch_size)


def evaluate(args: argparse.Namespace) -> None:
    _, eval_files, _, num_eval = resolve_data(args)
    latest = tf.train.latest_checkpoint(args.train_dir)
    if latest is None:
        raise UsageError(f"no checkpoint in {args.train_dir}: train first")
    precision = evaluate_checkpoint(latest, eval_files, args.batch_size, num_eval)
    print(f"{datetime.now()}: precision @ 1 = {precision:.3f} ({latest})")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    return run_main(evaluate if args.eval else train, args, also=(cifar10_input.Cifar10BinaryError,))


if __name__ == "__main__":
    sys.exit(main())
