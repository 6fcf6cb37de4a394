"""The CIFAR-10 network of the classic TensorFlow tutorial, in TF1 style (`tf.compat.v1`).

Written here in the manner of tensorflow/models' `tutorials/image/cifar10/cifar10.py`:

    conv1   5x5x3x64, relu             pool1  3x3/2 SAME     norm1  local response normalisation
    conv2   5x5x64x64, relu            norm2                 pool2  3x3/2 SAME
    local3  fully connected -> 384, relu, weight decay 0.004
    local4  384 -> 192, relu, weight decay 0.004
    softmax_linear  192 -> 10 (logits)

Variables are created on the CPU with `tf.get_variable`, so that towers on several GPUs share them
(`_variable_on_cpu`); each weight matrix adds its weight decay, `wd * tf.nn.l2_loss(w)` =
wd * sum(w**2) / 2, to the 'losses' collection (`_variable_with_weight_decay`), once per tower that
builds it.  Quirk kept: local3 reshapes its input to [batch_size, -1] with the configured batch size,
so the towers only take full batches (the input never yields a short one).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import tensorflow.compat.v1 as tf

from examples.cifar10_tutorial import cifar10_input

# The training constants.
MOVING_AVERAGE_DECAY = 0.9999     # the decay of the variables' moving averages
NUM_EPOCHS_PER_DECAY = 350.0      # epochs after which the learning rate decays
LEARNING_RATE_DECAY_FACTOR = 0.1  # the learning rate's decay factor
INITIAL_LEARNING_RATE = 0.1
TOWER_NAME = "tower"              # the name scope prefix of each tower's ops
NUM_CLASSES = cifar10_input.NUM_CLASSES


def _variable_on_cpu(name: str, shape: Sequence[Any], initializer: Any) -> Any:
    """A variable stored on the CPU, shared by every tower (tf.get_variable)."""
    with tf.device("/cpu:0"):
        return tf.get_variable(name, shape, initializer=initializer, dtype=tf.float32)


def _variable_with_weight_decay(name: str, shape: Sequence[Any], stddev: float, wd: Optional[float]) -> Any:
    """A truncated-normal variable; with `wd`, its weight decay wd * l2_loss(var) goes to 'losses'."""
    var = _variable_on_cpu(name, shape, tf.truncated_normal_initializer(stddev=stddev, dtype=tf.float32))
    if wd is not None:
        weight_decay = tf.multiply(tf.nn.l2_loss(var), wd, name="weight_loss")
        tf.add_to_collection("losses", weight_decay)
    return var


def local_response_norm(inputs: Any, name: str) -> Any:
    """The tutorial's normalisation: depth radius 4, bias 1, alpha 0.001 / 9, beta 0.75."""
    return tf.nn.lrn(inputs, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75, name=name)


def inference(images: Any, batch_size: int) -> Any:
    """The network on `images` [batch_size, 24, 24, 3]; returns the logits [batch_size, 10]."""
    with tf.variable_scope("conv1") as scope:
        kernel = _variable_with_weight_decay("weights", shape=[5, 5, 3, 64], stddev=5e-2, wd=0.0)
        conv = tf.nn.conv2d(images, kernel, [1, 1, 1, 1], padding="SAME")
        biases = _variable_on_cpu("biases", [64], tf.constant_initializer(0.0))
        conv1 = tf.nn.relu(tf.nn.bias_add(conv, biases), name=scope.name)
    pool1 = tf.nn.max_pool(conv1, ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1], padding="SAME", name="pool1")
    norm1 = local_response_norm(pool1, "norm1")

    with tf.variable_scope("conv2") as scope:
        kernel = _variable_with_weight_decay("weights", shape=[5, 5, 64, 64], stddev=5e-2, wd=0.0)
        conv = tf.nn.conv2d(norm1, kernel, [1, 1, 1, 1], padding="SAME")
        biases = _variable_on_cpu("biases", [64], tf.constant_initializer(0.1))
        conv2 = tf.nn.relu(tf.nn.bias_add(conv, biases), name=scope.name)
    norm2 = local_response_norm(conv2, "norm2")
    pool2 = tf.nn.max_pool(norm2, ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1], padding="SAME", name="pool2")

    with tf.variable_scope("local3") as scope:
        # Quirk kept: the configured batch size, not the batch's own (full batches only).
        reshape = tf.reshape(pool2, [batch_size, -1])
        dim = reshape.get_shape()[1]
        weights = _variable_with_weight_decay("weights", shape=[dim, 384], stddev=0.04, wd=0.004)
        biases = _variable_on_cpu("biases", [384], tf.constant_initializer(0.1))
        local3 = tf.nn.relu(tf.matmul(reshape, weights) + biases, name=scope.name)

    with tf.variable_scope("local4") as scope:
        weights = _variable_with_weight_decay("weights", shape=[384, 192], stddev=0.04, wd=0.004)
        biases = _variable_on_cpu("biases", [192], tf.constant_initializer(0.1))
        local4 = tf.nn.relu(tf.matmul(local3, weights) + biases, name=scope.name)

    with tf.variable_scope("softmax_linear") as scope:
        weights = _variable_with_weight_decay("weights", [192, NUM_CLASSES], stddev=1 / 192.0, wd=0.0)
        biases = _variable_on_cpu("biases", [NUM_CLASSES], tf.constant_initializer(0.0))
        softmax_linear = tf.add(tf.matmul(local4, weights), biases, name=scope.name)
    return softmax_linear


def loss(logits: Any, labels: Any) -> Any:
    """Adds the batch's mean cross-entropy to 'losses'; returns the sum of the collection."""
    labels = tf.cast(labels, tf.int64)
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits,
                                                                   name="cross_entropy_per_example")
    cross_entropy_mean = tf.reduce_mean(cross_entropy, name="cross_entropy")
    tf.add_to_collection("losses", cross_entropy_mean)
    return tf.add_n(tf.get_collection("losses"), name="total_loss")
