"""What both parity checks share: one process holding a TF1 session and a MirroredStrategy.

The legacy graph runs in a `tf.compat.v1.Session` whose towers sit on virtual CPU devices
(`legacy.towers.session_config`); the modern model runs eagerly / in `tf.function` under a
`MirroredStrategy` over the same number of logical devices (`modern.runtime.configure_devices`).
Both see `/cpu:0 ... /cpu:N-1` because the logical-device split is set once, first thing.
"""
import numpy as np
import tensorflow as tf

from legacy import towers
from modern import runtime


def setup_devices(num_towers):
    """Split the CPU (or take the GPUs) for N towers / replicas.  Call before any TF op runs."""
    return runtime.configure_devices(num_towers)


def legacy_session(graph, num_towers, config=None):
    """A TF1 session with the legacy programs' config (default: soft placement, N virtual CPUs)."""
    return tf.compat.v1.Session(graph=graph, config=config or towers.session_config(num_towers))


def make_strategy(num_towers):
    return runtime.make_strategy(num_towers, log=None)


def distribute_batch(strategy, x, y):
    """One global batch, split over the replicas exactly as the modern trainers' tf.data path does.

    `experimental_distribute_dataset` re-batches a global batch of B rows into per-replica batches
    of ceil(B/N), ..., rows in order: replica 0 gets the first rows.  Returns the distributed
    (x, y) element and the row counts each replica received.
    """
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x))
    element = next(iter(strategy.experimental_distribute_dataset(dataset)))
    rows = [int(t.shape[0]) for t in strategy.experimental_local_results(element[1])]
    return element, rows


def local(strategy, value):
    """Per-replica values as a list of numpy arrays."""
    return [np.asarray(v) for v in strategy.experimental_local_results(value)]
