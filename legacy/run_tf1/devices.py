"""Towers on virtual CPU devices: /gpu:N without that GPU runs on /cpu:N, with enough CPUs in every session.

`DeviceMap` maps a device string the program places a tower on, and says so in one line;
`with_cpu_devices` gives a session's ConfigProto `device_count['CPU']` = 1 + the highest CPU index the
graph uses (without it, soft placement would silently put every tower on one CPU); `strategy_devices`
maps the devices a `tf.distribute` strategy mirrors over; `GPUQueries` answers a program's GPU count
with virtual GPUs (`--virtual-gpus`).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Optional, cast

from legacy.run_tf1.log import PREFIX
from tensorflow.core.framework import device_attributes_pb2
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.framework import device_spec, ops


def span(prefix: str, indices: Sequence[Optional[int]]) -> str:
    """'/gpu:0../gpu:3' for consecutive indices, else a list; None is the device's wildcard."""
    if None in indices:
        return prefix.rstrip(":")
    numbers = cast(Sequence[int], indices)  # no None past the check above, which mypy cannot narrow
    if len(numbers) > 1 and list(numbers) == list(range(numbers[0], numbers[-1] + 1)):
        return f"{prefix}{indices[0]}..{prefix}{indices[-1]}"
    return ", ".join(f"{prefix}{i}" for i in indices)


class DeviceMap:
    """Maps a device the program names to the one it runs on: `/gpu:N` -> `/cpu:N` when N >= gpus."""

    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.mapped: dict[Optional[int], Optional[int]] = {}   # GPU index -> CPU index

    def map(self, device: Any) -> Any:
        """A device string, DeviceSpec, device function or None, mapped."""
        if callable(device) and not isinstance(device, (str, device_spec.DeviceSpecV2)):
            return functools.wraps(device)(lambda op: self.map(device(op)))
        if not device:
            return device
        spec = device_spec.DeviceSpecV2.from_string(device if isinstance(device, str) else device.to_string())
        if (spec.device_type or "").upper() != "GPU" or (spec.device_index or 0) < self.gpus:
            return device
        self.mapped[spec.device_index] = spec.device_index
        return spec.replace(device_type="CPU").to_string()

    def line(self) -> str:
        """The one line saying which GPU devices run on which virtual CPU devices."""
        gpus = sorted(self.mapped, key=lambda i: -1 if i is None else i)
        have = "no GPU" if self.gpus == 0 else f"only {self.gpus} GPU{'s' if self.gpus > 1 else ''}"
        they = "they run on virtual CPU devices" if len(gpus) > 1 else "it runs on virtual CPU device"
        return (f"{PREFIX}: {have} for the towers the program places on {span('/gpu:', gpus)}: "
                f"{they} {span('/cpu:', [self.mapped[g] for g in gpus])}")


def highest_cpu(graph: ops.Graph) -> int:
    """The highest CPU device index the graph's ops name (-1 if none)."""
    highest = -1
    for name in {op.device for op in graph.get_operations()}:
        spec = device_spec.DeviceSpecV2.from_string(name) if name else None
        if spec and (spec.device_type or "").upper() == "CPU" and spec.device_index is not None:
            highest = max(highest, spec.device_index)
    return highest


def with_cpu_devices(config: Optional[config_pb2.ConfigProto], cpus: int) -> Optional[config_pb2.ConfigProto]:
    """A copy of the program's ConfigProto with `device_count['CPU'] >= cpus` (itself where it has them)."""
    have = config.device_count.get("CPU", 1) if config is not None else 1
    if cpus <= have:
        return config
    merged = config_pb2.ConfigProto()
    if config is not None:
        merged.CopyFrom(config)
    merged.device_count["CPU"] = cpus
    return merged




# ---------------------------------------------------------------------------------------------
# The GPUs a program counts, and the devices its strategies mirror over

def virtual_gpu(index: int) -> device_attributes_pb2.DeviceAttributes:
    """What `device_lib.list_local_devices` lists for the virtual GPU `index` (a CPU device)."""
    return device_attributes_pb2.DeviceAttributes(
        name=f"/device:GPU:{index}", device_type="GPU", memory_limit=1 << 30,
        physical_device_desc=f"virtual GPU {index}: runs on /device:CPU:{index} (legacy.run_tf1 --virtual-gpus)")


class GPUQueries:
    """A program's GPU queries answered with `count` GPUs: the machine's, then virtual ones, each of
    which the device mapping runs on the CPU device of its index (`--virtual-gpus`).

    `device_lib.list_local_devices()` lists them (device_type "GPU"), `tf.test.is_gpu_available()` is
    True, `tf.test.gpu_device_name()` is '/device:GPU:0': a program that counts its GPUs to choose its
    towers (`replicate_model_fn` without devices, the CIFAR-10 Estimator tutorial's check) builds
    `count` towers.
    """

    def __init__(self, devices: DeviceMap, count: int):
        self.devices, self.count = devices, count

    def list_local_devices(self, original: Any) -> Any:
        def list_local_devices(session_config: Any = None) -> list[Any]:
            listed = list(original(session_config))
            have = sum(1 for d in listed if d.device_type == "GPU")
            return listed + [virtual_gpu(i) for i in range(have, self.count)]
        return list_local_devices

    def is_gpu_available(self, original: Any) -> Any:
        def is_gpu_available(cuda_only: bool = False, min_cuda_compute_capability: Any = None) -> bool:
            return True if self.count > 0 else original(cuda_only, min_cuda_compute_capability)
        return is_gpu_available

    def gpu_device_name(self, original: Any) -> Any:
        def gpu_device_name() -> str:
            return "/device:GPU:0" if self.count > 0 else original()
        return gpu_device_name


def strategy_devices(devices: DeviceMap, given: Optional[Sequence[Any]], virtual: int) -> Optional[list[Any]]:
    """The devices a MirroredStrategy mirrors over on this machine: the program's, each mapped (a GPU
    the machine lacks becomes the CPU device of its index); where it gives none, the `virtual` GPUs
    it would have found (None: TensorFlow's own choice)."""
    if given:
        return [devices.map(d) for d in given]
    return [devices.map(f"/device:GPU:{i}") for i in range(virtual)] if virtual else None
