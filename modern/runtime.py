"""Run-time set-up shared by the modern trainers: replica devices, determinism, the model folder.

Replica devices: GPUs when there are enough, logical GPUs when there are fewer, virtual CPU
devices when there are none.

The legacy programs put tower i on `/gpu:i`, several towers on one GPU when there are fewer GPUs,
or tower i on the i-th virtual CPU device of a TF1 session (`legacy/towers.py`).  The modern
programs do the same with `tf.distribute.MirroredStrategy`:

    devices = configure_devices(2)      # before TensorFlow's runtime starts
    strategy = make_strategy(2)         # MirroredStrategy over those devices, logs where they are

A MirroredStrategy needs distinct devices, one per replica, so where TF1 put two towers on
`/gpu:0`, the modern side splits the GPU (or, without one, the CPU) into logical devices
(`tf.config.set_logical_device_configuration`).  That is only possible before the runtime
initialises (the first op, tensor or `list_logical_devices` call), so call `configure_devices`
first thing.  MirroredStrategy with no argument would only see GPUs (or the single `/cpu:0`), so
the devices are named explicitly.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Optional, Sequence

import keras
import tensorflow as tf

from records.usage import UsageError, check_writable  # noqa: F401 (re-exported: the modern programs import them here)


class DeviceSetupError(UsageError):
    """The replica devices cannot be arranged as asked."""


# A logical GPU must be given a memory limit (TF 2.21 raises "Setting memory limit is required for
# GPU virtual devices" otherwise), and no public API tells a GPU's memory before the runtime starts
# (`tf.config.experimental.get_device_details` gives only its name and compute capability).  So the
# limit is a setting: MB per logical GPU, used only when replicas share a GPU.  4096 MB is a default,
# not derived from any GPU: with k replicas per GPU, keep k times the limit below
# the GPU's memory, leaving room for CUDA's own context.
GPU_MEMORY_VARIABLE = "REPLICA_GPU_MEMORY_MB"
DEFAULT_GPU_MEMORY_MB = 4096


def gpu_memory_per_replica_mb() -> int:
    """The memory limit of each logical GPU: $REPLICA_GPU_MEMORY_MB, default 4096 (MB)."""
    value = os.environ.get(GPU_MEMORY_VARIABLE, str(DEFAULT_GPU_MEMORY_MB))
    if not value.isdigit() or int(value) < 1:
        raise DeviceSetupError(f"{GPU_MEMORY_VARIABLE} must be a whole number of MB, at least 1; "
                               f"got {value!r}.")
    return int(value)


def configure_devices(num_replicas: int) -> list[str]:
    """Make `num_replicas` devices available and return their names.

    GPUs are used when there are at least `num_replicas` of them, each taking memory as it needs it
    (memory growth: the original's `allow_growth`).  With G fewer (but some), each GPU
    is split into logical GPUs, as many as the legacy round robin puts towers on it (N // G, one more
    on the first N % G GPUs; two replicas on one GPU: two logical GPUs), each limited to
    `gpu_memory_per_replica_mb()` MB.  TF numbers logical GPUs GPU by GPU, so the replicas get
    `/gpu:0` ... `/gpu:N-1`, the first ones on GPU 0.  Without GPUs the physical CPU is split into
    `num_replicas` logical CPU devices (`/cpu:0` ... `/cpu:N-1`).  If TensorFlow's runtime has
    already started with fewer logical devices than asked, that cannot be changed any more: raise
    DeviceSetupError.  A runtime that already has at least `num_replicas` logical devices is reused
    (the first `num_replicas` of them), so a test process can build strategies of several sizes.
    """
    if num_replicas < 1:
        raise DeviceSetupError(f"--towers must be at least 1, got {num_replicas}.")
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= num_replicas:
        for gpu in gpus:  # the original's gpu_options.allow_growth: take GPU memory as needed
            try:
                tf.config.experimental.set_memory_growth(gpu, True)
            except RuntimeError:  # the runtime has started: its setting stays
                pass
        return [f"/gpu:{i}" for i in range(num_replicas)]
    if gpus:
        logical_gpu = tf.config.LogicalDeviceConfiguration(memory_limit=gpu_memory_per_replica_mb())
        try:
            for j, gpu in enumerate(gpus):
                shares = num_replicas // len(gpus) + (j < num_replicas % len(gpus))
                tf.config.set_logical_device_configuration(gpu, [logical_gpu] * shares)
        except RuntimeError as e:  # "Virtual devices cannot be modified after being initialized"
            _check_started_with_enough("GPU", num_replicas, e)
        return [f"/gpu:{i}" for i in range(num_replicas)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is None or len(current) < num_replicas:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_replicas)])
        except RuntimeError as e:  # "Virtual devices cannot be modified after being initialized"
            _check_started_with_enough("CPU", num_replicas, e)
    return [f"/cpu:{i}" for i in range(num_replicas)]


def _check_started_with_enough(kind: str, num_replicas: int, error: Exception) -> None:
    """After a refused split: fine if the started runtime has enough logical `kind` devices, else
    DeviceSetupError."""
    have = len(tf.config.list_logical_devices(kind))
    if have < num_replicas:
        raise DeviceSetupError(
            f"{num_replicas} replicas need {num_replicas} logical {kind} devices, but TensorFlow's "
            f"runtime has already started with {have}; logical devices can only be configured "
            f"before the first TensorFlow op runs. Call configure_devices({num_replicas}) "
            f"first thing in the process (TensorFlow says: {error}).") from None


def placement_message(devices: Sequence[str]) -> str:
    """One log line saying where the replicas are (the modern twin of the legacy tower line)."""
    if devices and devices[0].startswith("/gpu"):
        gpus = len(tf.config.list_physical_devices("GPU"))
        if gpus >= len(devices):
            return f"replicas placed on {len(devices)} GPUs: {', '.join(devices)}"
        return (f"{len(devices)} replicas on {gpus} GPU{'s' if gpus > 1 else ''} split into {len(devices)} "
                f"logical GPUs: {', '.join(devices)} ({gpu_memory_per_replica_mb()} MB each, "
                f"${GPU_MEMORY_VARIABLE})")
    return (f"no GPUs for {len(devices)} replicas: each replica runs on its own virtual CPU device "
            f"({', '.join(devices)})")


# One MirroredStrategy per set of devices and process.  Two strategies over the same devices in one
# process (a test run, the parity harness) number their collective all-reduces from the same keys,
# and one's reduce meets the other's: "Shape mismatch in the collective instance 100".
_STRATEGIES: dict[tuple[tuple[str, ...], str], Any] = {}
REDUCTIONS = ("auto", "collective", "one_device")


def cross_device_ops(devices: Sequence[str], reduction: str = "auto") -> Optional[Any]:
    """How the replicas' gradients are summed: None (MirroredStrategy's own choice) or an object.

    "collective": MirroredStrategy's default on CPUs, a collective all-reduce that first packs the
    174 ResNet gradients into a few large tensors (ConcatV2), reduces them, and splits them again.
    "one_device": `ReductionToOneDevice`, an add_n of the replicas' copies on the first device and
    a copy back to each: on virtual CPU devices, which share one memory and two cores, it skips the
    packing and the collective's rendezvous, and for two replicas the sum a + b is the same float32 number either way.
    "auto": "one_device" on virtual CPU devices and on logical GPUs that share a physical GPU, the
    strategy's default (NCCL) on whole GPUs.  NCCL cannot reduce between two logical devices of
    one GPU (NCCL 2.5+ refuses two ranks on one device: "Duplicate GPU detected"), and TF's own
    choice, `select_cross_device_ops`, already falls back to `ReductionToOneDevice` whenever
    logical and physical GPUs differ in number (with a warning; so "collective" does too there).
    Naming it here says so and skips the warning.
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    on_cpu = not devices[0].startswith("/gpu")
    shared_gpu = not on_cpu and len(tf.config.list_physical_devices("GPU")) < len(devices)
    if reduction == "one_device" or (reduction == "auto" and (on_cpu or shared_gpu)):
        return tf.distribute.ReductionToOneDevice(reduce_to_device=devices[0])
    return None


def make_strategy(num_replicas: int, log: Optional[Callable[[str], Any]] = print,
                  reduction: str = "auto") -> Any:
    """The MirroredStrategy over `configure_devices(num_replicas)`, after logging where replicas are.

    reduction: how gradients are summed across replicas (see `cross_device_ops`).
    Made once per process, set of devices and reduction, then shared (see _STRATEGIES).
    """
    devices = tuple(configure_devices(num_replicas))
    key = devices, reduction
    if key not in _STRATEGIES:
        _STRATEGIES[key] = tf.distribute.MirroredStrategy(
            devices=list(devices), cross_device_ops=cross_device_ops(devices, reduction))
    if log is not None:
        log(placement_message(devices))
    return _STRATEGIES[key]


def run_reporting_usage_errors(train: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> int:
    """`train(args)`; a UsageError becomes one line on stderr and exit code 2 (no traceback)."""
    try:
        train(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def enable_determinism(seed: int) -> None:
    """Seed every generator (Python, numpy, TensorFlow, Keras) and make TF's kernels deterministic.

    `enable_op_determinism` makes ops that would pick a non-deterministic kernel (or reduce in a
    racy order) either pick a deterministic one or raise; with the seeds fixed, two runs give
    bit-identical losses and weights.  tf.data stays deterministic as long as the pipeline does not
    set `deterministic=False`.
    """
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()


def add_seed_flags(parser: argparse.ArgumentParser) -> None:
    """The modern trainers' --seed and --deterministic (read by `seed_program`)."""
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: unseeded, as the original)")
    parser.add_argument("--deterministic", action="store_true",
                        help="seed everything (--seed, default 0) and enable op determinism")


def seed_program(seed: Optional[int], deterministic: bool) -> None:
    """The modern trainers' --seed and --deterministic: determinism seeded with `seed` (0 when
    None), or only the generators seeded, or neither."""
    if deterministic:
        enable_determinism(0 if seed is None else seed)
    elif seed is not None:
        keras.utils.set_random_seed(seed)


# TensorBoard is not a dependency of TF 2.21 (nor of this project), and without it `tf.summary.scalar`
# and `tf.summary.histogram` raise TBNotInstalledError.  TF's own summary ops (the ones the legacy
# graph's `tf.summary.scalar` builds) write the same records, readable by TensorBoard and by
# `tf.compat.v1.train.summary_iterator`; `write_raw_pb` puts them in the tf.summary default writer.
def write_scalar(tag: str, value: Any, step: Any) -> Any:
    """Write one scalar summary (a legacy `simple_value`) to the default tf.summary writer."""
    summary = tf.raw_ops.ScalarSummary(tags=tag, values=tf.cast(value, tf.float32))
    return tf.summary.experimental.write_raw_pb(summary, step=step)


def write_histogram(tag: str, values: Any, step: Any) -> Any:
    """Write one histogram summary (a legacy `histo`) to the default tf.summary writer."""
    summary = tf.raw_ops.HistogramSummary(tag=tag, values=values)
    return tf.summary.experimental.write_raw_pb(summary, step=step)
