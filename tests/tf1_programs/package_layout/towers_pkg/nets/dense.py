"""A dense layer from tf.get_variable."""
import tensorflow as tf


def layer(x, units, regularizer):
  w = tf.get_variable('weights', [x.get_shape()[1].value, units], regularizer=regularizer,
                      initializer=tf.truncated_normal_initializer(stddev=0.1))
  b = tf.get_variable('biases', [units], initializer=tf.zeros_initializer())
  return tf.matmul(x, w) + b
