"""The towers' model: a dense softmax layer and its loss (tf.contrib's TF 1.0-era names)."""
import tensorflow as tf

from towers_pkg.nets import dense

FEATURES, CLASSES = 6, 3


def tower_loss(x, onehot, reuse):
  with tf.variable_scope('model', reuse=reuse):
    logits = dense.layer(x, CLASSES, tf.contrib.layers.l2_regularizer(1e-4))
  xent = tf.contrib.nn.deprecated_flipped_softmax_cross_entropy_with_logits(logits, onehot)
  return tf.reduce_mean(xent) + tf.add_n(tf.get_collection(tf.GraphKeys.REGULARIZATION_LOSSES))
