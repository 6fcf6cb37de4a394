"""Accuracy of the moving-average weights that `modern/mnist_multi_gpu.py` saved: the modern `mnist_eval`.

The twin of `legacy/mnist_eval.py` (the book's section 5.5 program): it builds the network, restores
the latest checkpoint's moving-average shadows (`moving_averages/...`, written by the trainer's
`tf.train.Checkpoint`) into its weights, and reports the accuracy on held-out data.  The trainer
prints the same figure at its end (`--eval_data_path`); this program computes it again from the
checkpoint alone, as the book's does.

Run it (from the repository root), after training:

    python modern/mnist_eval.py                           # held-out split of the embedded synthetic data
    python modern/mnist_eval.py --data_path data/mnist/test.tfrecords --model_save_path logs_and_models/modern/

Defaults: the trainer's --model_save_path and MOVING_AVERAGE_DECAY.  Evaluates once unless
`--eval_interval_secs` is given (then it loops like the book, until interrupted).
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Sequence


import tensorflow as tf

from modern import mnist_multi_gpu as mnist
from modern.runtime import UsageError, run_reporting_usage_errors
from records import mnist as mnist_records
from records.usage import ArgumentParser, at_least, fraction


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model_save_path", default="logs_and_models/modern/", help="the trainer's --model_save_path")
    p.add_argument("--moving_average_decay", type=fraction(), default=0.99, help="MOVING_AVERAGE_DECAY")
    p.add_argument("--data_path", default=None,
                   help="held-out TFRecord in the original's format (default: the embedded synthetic "
                        "eval split)")
    p.add_argument("--eval_interval_secs", type=at_least(0.0, float), default=0,
                   help="EVAL_INTERVAL_SECS: 0 evaluates once; > 0 re-evaluates the newest checkpoint "
                        "this often until interrupted, as the book does every 10 s")
    return p.parse_args(argv)


def evaluate_checkpoint(data_path: str, model_save_path: str, moving_average_decay: float = 0.99) -> tuple[int, float]:
    """(global step, accuracy of the latest checkpoint's moving averages on `data_path`)."""
    latest = tf.train.latest_checkpoint(model_save_path)
    if latest is None:
        raise UsageError(f"no checkpoint found in {model_save_path}: train first "
                         "(python modern/mnist_multi_gpu.py) or pass --model_save_path")
    model = mnist.build_model()
    optimizer = mnist.make_optimizer()
    optimizer.build(model.trainable_variables)
    _, shadows = mnist.make_moving_average(model, optimizer, moving_average_decay)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, moving_averages=shadows)
    try:
        checkpoint.restore(latest).assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as e:
        raise UsageError(f"cannot restore the moving averages from {latest} (not a checkpoint of "
                         f"modern/mnist_multi_gpu.py?): {str(e).splitlines()[0]}") from None
    return int(optimizer.iterations.numpy()), mnist.evaluate_averaged(shadows, data_path)


def evaluate(args: argparse.Namespace) -> float:
    try:
        data_path = args.data_path or mnist_records.ensure_default_data().eval
        _, labels = mnist_records.load_tfrecords(data_path)  # every record read: CRCs and format
    except mnist_records.MnistDataError as e:
        raise UsageError(str(e)) from None
    while True:
        step, accuracy = evaluate_checkpoint(data_path, args.model_save_path, args.moving_average_decay)
        print("After %s training step(s), validation accuracy = %g (%d examples of %s)"
              % (step, accuracy, len(labels), data_path))
        if args.eval_interval_secs <= 0:
            return accuracy
        time.sleep(args.eval_interval_secs)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_reporting_usage_errors(evaluate, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
