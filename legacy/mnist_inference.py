"""The book's `mnist_inference` module: the 784-500-10 network the MNIST multi-GPU example imports.

The original (the book's MNIST multi-GPU example) does `import mnist_inference` and calls
`mnist_inference.inference(x, regularizer)`; this is that module (the book's section 5.5), under
`tf.compat.v1`.  Two details matter to the trainer:

- `get_weight_variable` adds `regularizer(weights)` to the `losses` collection *each time it is
  called*, so with towers reusing the variables every tower adds its own copy; the trainer's
  `get_loss` keeps each tower's copy only, by filtering the collection on the tower's name scope.
- `l2_regularizer` replaces `tf.contrib.layers.l2_regularizer` (tf.contrib is gone), with the same
  value: `scale * sum(w**2) / 2`.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import tensorflow.compat.v1 as tf

# The network's shape.
INPUT_NODE = 784
OUTPUT_NODE = 10
LAYER1_NODE = 500


def l2_regularizer(scale: float) -> Callable[[Any], Any]:
    """`tf.contrib.layers.l2_regularizer(scale)`, which TF 2 no longer has.

    Returns a function `w -> scale * tf.nn.l2_loss(w) = scale * sum(w**2) / 2`.  Mind the 1/2:
    `tf.keras.regularizers.l2(scale)` computes `scale * sum(w**2)`, twice as much.

    As contrib did, a negative scale is rejected.  Contrib returned `None` for scale 0 (which made
    the original's `tf.add_n` fail); this returns a zero loss instead.
    """
    if scale < 0.0:
        raise ValueError(f"Setting a scale less than 0 on a regularizer: {scale}")

    def l2(weights: Any) -> Any:
        with tf.name_scope(None, 'l2_regularizer', [weights]) as name:
            my_scale = tf.convert_to_tensor(scale, dtype=weights.dtype.base_dtype, name='scale')
            return tf.multiply(my_scale, tf.nn.l2_loss(weights), name=name)

    return l2


def get_weight_variable(shape: Sequence[int], regularizer: Optional[Callable[[Any], Any]]) -> Any:
    """A weight matrix (truncated normal, stddev 0.1); its regularisation loss goes to 'losses'."""
    weights = tf.get_variable(
        "weights", shape, initializer=tf.truncated_normal_initializer(stddev=0.1))
    # Added on every call, so once per tower when the towers reuse the variables.
    if regularizer is not None:
        tf.add_to_collection('losses', regularizer(weights))
    return weights


def inference(input_tensor: Any, regularizer: Optional[Callable[[Any], Any]]) -> Any:
    """The forward pass: 784 -> 500 (relu) -> 10 logits."""
    with tf.variable_scope('layer1'):
        weights = get_weight_variable([INPUT_NODE, LAYER1_NODE], regularizer)
        biases = tf.get_variable("biases", [LAYER1_NODE], initializer=tf.constant_initializer(0.0))
        layer1 = tf.nn.relu(tf.matmul(input_tensor, weights) + biases)

    with tf.variable_scope('layer2'):
        weights = get_weight_variable([LAYER1_NODE, OUTPUT_NODE], regularizer)
        biases = tf.get_variable("biases", [OUTPUT_NODE], initializer=tf.constant_initializer(0.0))
        layer2 = tf.matmul(layer1, weights) + biases

    return layer2
