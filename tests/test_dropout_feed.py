"""The dropout check feeds a dropout the batch size its graph fixes (compare/checks/forward.py
`legacy_dropout_outputs`): a queue's static batch of 8 rows takes its ~8M units 8 rows a run."""
import numpy as np
import tensorflow as tf

from compare import tf1_graph
from compare.checks.forward import legacy_dropout_outputs

tf1 = tf.compat.v1


def test_a_dropout_whose_graph_fixes_the_batch_is_fed_that_batch_a_run():
    graph = tf1.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 16], name="static_batch")
        loss = tf.reduce_sum(tf.nn.dropout(tf.nn.relu(x), rate=0.25))
        found = tf1_graph.dropouts(graph, [loss])
    assert len(found) == 1 and found[0].input.shape[0] == 8
    with tf1.Session(graph=graph) as sess:
        out = legacy_dropout_outputs(sess, found, {}, np.ones((1001, 16), np.float32))[0]
    assert out.shape == (1001, 16)
    assert set(np.unique(out).tolist()) == {0.0, np.float32(1 / 0.75)}
    kept = float(np.mean(out > 0))
    assert abs(kept - 0.75) < 5 * np.sqrt(0.75 * 0.25 / out.size)
    assert len({out[i * 8:(i + 1) * 8].tobytes() for i in range(125)}) == 125  # a new mask every run
