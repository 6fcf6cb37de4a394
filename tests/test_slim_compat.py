"""The tf-slim compatibility alias: slim's ResNet-v2-50 builds and trains on TF 2.21."""
import sys

import numpy as np
import pytest

import legacy  # noqa: F401  (installs the alias)
import tensorflow.compat.v1 as tf
import tf_slim as slim
from tf_slim.nets import resnet_v2


def test_alias_points_at_tf_keras_src():
    import tf_keras.src.legacy_tf_layers.normalization as real
    assert sys.modules["tf_keras.legacy_tf_layers.normalization"] is real


def test_resnet_v2_50_builds_and_trains_one_step():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.placeholder(tf.float32, [None, 32, 32, 3])
        with slim.arg_scope(resnet_v2.resnet_arg_scope()):
            net, _ = resnet_v2.resnet_v2_50(x, num_classes=None, is_training=True)
        update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
        # Two updates (mean, variance) for each of the 49 batch norms of ResNet-v2-50.
        assert len(update_ops) == 98
        loss = tf.reduce_mean(tf.square(net))
        with tf.control_dependencies(update_ops):
            train = tf.train.AdamOptimizer(1e-3).minimize(loss)
        mean = [v for v in tf.global_variables() if v.op.name == "resnet_v2_50/postnorm/moving_mean"][0]
        with tf.Session(graph=graph) as sess:
            sess.run(tf.global_variables_initializer())
            before = sess.run(mean)
            value, _ = sess.run([loss, train], {x: np.random.RandomState(0).rand(4, 32, 32, 3)})
            after = sess.run(mean)
    assert np.isfinite(value)
    # The batch-norm update ran: moving statistics moved off their zero initial value.
    assert not np.allclose(before, after)
