"""What both parity checks share: one process holding a TF1 session and a MirroredStrategy.

The legacy graph runs in the program's own `tf.compat.v1.Session` config, its towers on virtual CPU devices
(`legacy.towers.session_config`); the modern model runs eagerly / in `tf.function` under a
`MirroredStrategy` over the same number of logical devices (`modern.runtime.configure_devices`).
Both see `/cpu:0 ... /cpu:N-1` because the logical-device split is set once, first thing.
"""
import contextlib
import threading
from typing import Any, Callable, Iterator

import numpy as np
import threadpoolctl

from modern import runtime


def setup_devices(num_towers: int) -> list[str]:
    """Split the CPU (or take the GPUs) for N towers / replicas.  Call before any TF op runs."""
    return runtime.configure_devices(num_towers)


def blas_on_one_thread() -> None:
    """numpy's BLAS (np.dot, np.linalg.norm: the measures over every weight, gradient and slot) on
    one thread in this process.  A harness process runs TensorFlow's thread pools on every core, beside
    its numpy and beside the other processes of a run; OpenBLAS's own pool, a thread a core, spins
    between calls on the cores that TensorFlow's threads are waiting for."""
    threadpoolctl.threadpool_limits(1, user_api="blas")


def make_strategy(num_towers: int) -> Any:
    return runtime.make_strategy(num_towers, log=None)


def local(strategy: Any, value: Any) -> list[np.ndarray]:
    """Per-replica values as a list of numpy arrays."""
    return [np.asarray(v) for v in strategy.experimental_local_results(value)]


class Background:
    """`work()` in a daemon thread of its own from now on: for work that holds no GIL most of its
    time (a TF1 session run, a tf.function's trace), beside the caller's Python."""

    def __init__(self, work: Callable[[], Any], name: str):
        self._failed: list[BaseException] = []

        def run() -> None:
            try:
                work()
            except BaseException as error:  # noqa: B036 (re-raised in the caller's thread by `wait`)
                self._failed.append(error)

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def wait(self) -> None:
        """Joined, and what the work raised raised here (once)."""
        self._thread.join()
        if self._failed:
            raise self._failed.pop()


@contextlib.contextmanager
def data_autotune_off() -> Iterator[None]:
    """tf.data's autotuning off for every iterator made in the duration (graph and eager): each
    dataset an iterator is made of gets `options.autotune.enabled = False`, as TF1's runtime ran.

    On TF 2.21 an autotuned iterator keeps a model thread that sleeps between optimisations, for
    periods that double up to a minute; making its iterator again (a TF1 initializer run a second
    time, an eager iterator collected) can wait out that sleep: seconds, and up to a minute, at random
    points of a run.  Autotuning sets parallelism and buffer sizes only, never which elements come
    in which order, so nothing the harness compares changes; the programs themselves are unchanged."""
    from tensorflow.python.data.ops import dataset_ops
    import tensorflow as tf
    cls = dataset_ops.DatasetV2
    original = cls.__dict__["_apply_debug_options"]
    if hasattr(original, "original"):  # already in effect (nested)
        yield
        return
    options = tf.data.Options()
    options.autotune.enabled = False

    def apply(self: Any) -> Any:
        return dataset_ops._OptionsDataset(original(self), options)

    apply.original = original  # type: ignore[attr-defined]  # the patch's mark, and what it wraps
    cls._apply_debug_options = apply
    try:
        yield
    finally:
        cls._apply_debug_options = original
