"""What both parity checks share: one process holding a TF1 session and a MirroredStrategy.

The legacy graph runs in the program's own `tf.compat.v1.Session` config, its towers on virtual CPU devices
(`legacy.towers.session_config`); the modern model runs eagerly / in `tf.function` under a
`MirroredStrategy` over the same number of logical devices (`modern.runtime.configure_devices`).
Both see `/cpu:0 ... /cpu:N-1` because the logical-device split is set once, first thing.
"""
from typing import Any, Callable, Iterable, TypeVar

import numpy as np

from modern import runtime

T = TypeVar("T")
R = TypeVar("R")


def setup_devices(num_towers: int) -> list[str]:
    """Split the CPU (or take the GPUs) for N towers / replicas.  Call before any TF op runs."""
    return runtime.configure_devices(num_towers)


def make_strategy(num_towers: int) -> Any:
    return runtime.make_strategy(num_towers, log=None)


def local(strategy: Any, value: Any) -> list[np.ndarray]:
    """Per-replica values as a list of numpy arrays."""
    return [np.asarray(v) for v in strategy.experimental_local_results(value)]


def parallel_map(fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """[fn(item) for item in items] on a thread per core: numpy releases the GIL on large arrays,
    so the per-tensor checks of 23.5M weights run on every core the TF graph build leaves idle."""
    import concurrent.futures
    import os
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(fn, items))
