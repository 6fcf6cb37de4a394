"""A tiny classifier for the session-kind programs beside it, and their data (numpy, in memory).

Each program builds its towers from `tower_loss`, trains a few steps on `data()`, and differs from the
others in how it opens its session (plain Session, MonitoredSession, MonitoredTrainingSession,
Supervisor, slim.learning.train) and how it combines the towers' gradients.
"""
import numpy as np
import tensorflow as tf

FEATURES = 6
HIDDEN = 8
CLASSES = 3


def data(rows, seed=0):
  """`rows` rows of features and integer labels."""
  rng = np.random.RandomState(seed)
  return rng.randn(rows, FEATURES).astype(np.float32), rng.randint(0, CLASSES, rows).astype(np.int32)


def inference(x):
  """Logits of a two-layer network (its variables shared by every tower: tf.get_variable)."""
  w1 = tf.get_variable('w1', [FEATURES, HIDDEN], initializer=tf.truncated_normal_initializer(stddev=0.5))
  b1 = tf.get_variable('b1', [HIDDEN], initializer=tf.zeros_initializer())
  w2 = tf.get_variable('w2', [HIDDEN, CLASSES], initializer=tf.truncated_normal_initializer(stddev=0.5))
  b2 = tf.get_variable('b2', [CLASSES], initializer=tf.zeros_initializer())
  hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
  return tf.matmul(hidden, w2) + b2


def tower_loss(x, y):
  """The mean cross-entropy of one tower's rows."""
  logits = inference(x)
  return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
