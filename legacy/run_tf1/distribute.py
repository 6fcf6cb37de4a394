"""tf.contrib.distribute's TF 1.x names on TF 2.21's `tf.compat.v1.distribute`.

contrib's strategies took arguments the core ones no longer do: `MirroredStrategy(num_gpus=2)`
(TF 1.8-1.13) is `MirroredStrategy(devices=['/device:GPU:0', '/device:GPU:1'])`, its
`cross_tower_ops` is `cross_device_ops`; the "tower" functions are the "replica" ones.  Each name
here builds the core object from contrib's arguments; where the machine has no GPU for a device,
the runner's device mapping (`legacy.run_tf1.environment`) puts it on the virtual CPU device of the
same index, as it does for `tf.device('/gpu:N')`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import tensorflow.compat.v1 as tf


def contrib_devices(devices: Optional[Sequence[str]], num_gpus: Optional[int],
                    num_gpus_per_worker: Optional[int] = None) -> Optional[list[str]]:
    """The devices contrib's MirroredStrategy mirrored over: `devices`, else `num_gpus` GPUs (the CPU
    for 0), else None (every local GPU, or the CPU: the core strategy's own choice)."""
    if devices:
        return list(devices)
    count = num_gpus if num_gpus is not None else num_gpus_per_worker
    if count is None:
        return None
    return [f"/device:GPU:{i}" for i in range(count)] if count > 0 else ["/device:CPU:0"]


def MirroredStrategy(devices: Optional[Sequence[str]] = None, num_gpus: Optional[int] = None,  # noqa: N802
                     num_gpus_per_worker: Optional[int] = None, cross_tower_ops: Any = None,
                     prefetch_on_device: Optional[bool] = None, auto_shard_dataset: bool = False,
                     cross_device_ops: Any = None) -> Any:
    """`tf.contrib.distribute.MirroredStrategy`: the core `tf.compat.v1.distribute.MirroredStrategy` over
    `contrib_devices`.  `prefetch_on_device` and `auto_shard_dataset` have no core argument: the core
    strategy prefetches to each device and, on one machine, shards nothing."""
    return tf.distribute.MirroredStrategy(devices=contrib_devices(devices, num_gpus, num_gpus_per_worker),
                                          cross_device_ops=cross_device_ops or cross_tower_ops)


def OneDeviceStrategy(device: str, prefetch_on_device: Optional[bool] = None) -> Any:  # noqa: N802
    """`tf.contrib.distribute.OneDeviceStrategy`: the core one on `device`."""
    return tf.distribute.OneDeviceStrategy(device)


def has_distribution_strategy() -> bool:
    """`tf.contrib.distribute.has_distribution_strategy`: `tf.distribute.has_strategy`."""
    return tf.distribute.has_strategy()


def get_distribution_strategy() -> Any:
    """`tf.contrib.distribute.get_distribution_strategy`: `tf.distribute.get_strategy`."""
    return tf.distribute.get_strategy()


def get_tower_context() -> Any:
    """`tf.contrib.distribute.get_tower_context`: `tf.distribute.get_replica_context`."""
    return tf.distribute.get_replica_context()


def get_cross_tower_context() -> Any:
    """`tf.contrib.distribute.get_cross_tower_context`: the strategy in cross-replica context, else None."""
    return tf.distribute.get_strategy() if tf.distribute.in_cross_replica_context() else None


def in_cross_tower_context() -> bool:
    """`tf.contrib.distribute.in_cross_tower_context`: `tf.distribute.in_cross_replica_context`."""
    return tf.distribute.in_cross_replica_context()


# The names of this module that stand for tf.contrib.distribute's.
CONTRIB_NAMES = ("MirroredStrategy", "OneDeviceStrategy", "has_distribution_strategy", "get_distribution_strategy",
                 "get_tower_context", "get_cross_tower_context", "in_cross_tower_context")
