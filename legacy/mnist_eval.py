"""Accuracy of the moving-average weights that `legacy/mnist_multi_gpu.py` saved: the book's `mnist_eval`.

The original (the book's MNIST multi-GPU example) trains and keeps an
`ExponentialMovingAverage` of the weights but never evaluates; its book pairs it with this program
(section 5.5's `mnist_eval.py`): build the forward pass with no regulariser, restore each variable
from its moving-average *shadow* (`variable_averages.variables_to_restore()`), and report the
accuracy on held-out data.

Run it (from the repository root), after training:

    python legacy/mnist_eval.py                           # held-out split of the embedded synthetic data
    python legacy/mnist_eval.py --data_path data/mnist/test.tfrecords --model_save_path logs_and_models/

Real MNIST's test split: `python -m records.mnist --images t10k-images-idx3-ubyte.gz
--labels t10k-labels-idx1-ubyte.gz --out data/mnist/test.tfrecords`.

Defaults: MODEL_SAVE_PATH and MOVING_AVERAGE_DECAY as the trainer's.  The book's program
re-evaluates the newest checkpoint every EVAL_INTERVAL_SECS (10) forever; here it evaluates once
unless `--eval_interval_secs` is given (then it loops like the book, until interrupted).
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Sequence

import numpy as np
import tensorflow.compat.v1 as tf

from legacy import mnist_inference
from legacy.runtime import UsageError, run_main
from records import mnist as mnist_records
from records.usage import ArgumentParser, at_least, fraction


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model_save_path", default="logs_and_models/", help="MODEL_SAVE_PATH of the trainer")
    p.add_argument("--moving_average_decay", type=fraction(), default=0.99, help="MOVING_AVERAGE_DECAY")
    p.add_argument("--data_path", default=None,
                   help="held-out TFRecord in the original's format (default: the embedded synthetic "
                        "eval split)")
    p.add_argument("--eval_interval_secs", type=at_least(0.0, float), default=0,
                   help="EVAL_INTERVAL_SECS: 0 evaluates once; > 0 re-evaluates the newest checkpoint "
                        "this often until interrupted, as the book does every 10 s")
    return p.parse_args(argv)


def evaluate_checkpoint(images: np.ndarray, labels: np.ndarray, model_save_path: str,
                        moving_average_decay: float = 0.99) -> tuple[str, float]:
    """Restore the latest checkpoint's moving averages and return (global step string, accuracy)."""
    with tf.Graph().as_default():
        x = tf.placeholder(tf.float32, [None, mnist_inference.INPUT_NODE], name='x-input')
        y_ = tf.placeholder(tf.int64, [None], name='y-input')
        validate_feed = {x: images, y_: labels}

        # No regulariser at evaluation time.
        y = mnist_inference.inference(x, None)
        correct_prediction = tf.equal(tf.argmax(y, 1), y_)
        accuracy = tf.reduce_mean(tf.cast(correct_prediction, tf.float32))

        # Load each variable from its shadow: {'layer1/weights/ExponentialMovingAverage': layer1/weights, ...}.
        variable_averages = tf.train.ExponentialMovingAverage(moving_average_decay)
        variables_to_restore = variable_averages.variables_to_restore()
        saver = tf.train.Saver(variables_to_restore)

        ckpt = tf.train.get_checkpoint_state(model_save_path)
        if not (ckpt and ckpt.model_checkpoint_path):
            raise UsageError(f"no checkpoint found in {model_save_path}: train first "
                            "(python legacy/mnist_multi_gpu.py) or pass --model_save_path")
        with tf.Session() as sess:
            try:
                saver.restore(sess, ckpt.model_checkpoint_path)
            except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError, ValueError) as e:
                message = getattr(e, "message", str(e)).split("\n")[0]
                raise UsageError(f"cannot restore the moving averages from {ckpt.model_checkpoint_path} "
                                f"(not a checkpoint of legacy/mnist_multi_gpu.py?): {message}") from None
            global_step = ckpt.model_checkpoint_path.split('/')[-1].split('-')[-1]
            return global_step, float(sess.run(accuracy, feed_dict=validate_feed))


def evaluate(args: argparse.Namespace) -> float:
    try:
        data_path = args.data_path or mnist_records.ensure_default_data().eval
        images, labels = mnist_records.load_tfrecords(data_path)
    except mnist_records.MnistDataError as e:
        raise UsageError(str(e)) from None
    # The trainer's parser casts the raw 0..255 pixels to float without scaling; so does this.
    images = images.astype('float32')
    while True:
        global_step, accuracy_score = evaluate_checkpoint(
            images, labels, args.model_save_path, args.moving_average_decay)
        print("After %s training step(s), validation accuracy = %g (%d examples of %s)"
              % (global_step, accuracy_score, len(labels), data_path))
        if args.eval_interval_secs <= 0:
            return accuracy_score
        time.sleep(args.eval_interval_secs)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    return run_main(evaluate, args)


if __name__ == '__main__':
    sys.exit(main())
