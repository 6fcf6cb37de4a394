"""Beyond one machine: the modern trainers on `tf.distribute.MultiWorkerMirroredStrategy`.

The legacy programs scale to the GPUs of one host (towers); the modern ones add TensorFlow's own
multi-worker engine.  A process is a *worker* of a cluster when the standard `TF_CONFIG`
environment variable names more than one worker:

    TF_CONFIG='{"cluster": {"worker": ["host0:12345", "host1:12345"]}, "task": {"type": "worker", "index": 0}}'

Without TF_CONFIG, or with one worker in it, nothing here changes anything: the trainers build the
one-host `MirroredStrategy` of `modern/runtime.py`.  `python -m modern.launch` starts a whole
cluster on this host.  How the pieces map onto the one-host program:

  MirroredStrategy(devices)           ->  MultiWorkerMirroredStrategy (make_strategy): each worker's
                                          local GPUs; on CPU ONE device per worker (see below)
  experimental_distribute_dataset     ->  distribute(): every worker reads the same shuffled global
                                          batches (a seed agreed with the chief, shared_seed) and
                                          keeps its replicas' slices of each
  CheckpointManager(model_dir)        ->  the chief writes model_dir and the event files; every other
                                          worker writes into a temporary folder removed at exit
                                          (folder()), as TensorFlow's multi-worker tutorial does
  (none: one process cannot be preempted alone) -> PreemptionCheckpointHandler (step_runner): SIGTERM
                                          on any worker -> all save at one agreed step, exit 42

One device per CPU worker.  `CollectiveAllReduceExtended._initialize_local_devices` (TensorFlow
2.21, tensorflow/python/distribute/collective_all_reduce_strategy.py) takes `context.num_gpus()`
GPUs per worker and, with none, exactly one `/device:CPU:0`: logical CPU devices made by
`tf.config.set_logical_device_configuration` are not used (a worker split into 2 logical
CPUs still reports `num_replicas_in_sync` = number of workers).  So on CPU-only workers
`--num_replicas` must be 1 (a usage error otherwise); on GPU workers it picks the first N GPUs.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import re
import shutil
import socket
import sys
import tempfile
from typing import Any, Callable, Iterator, Mapping, Optional

import tensorflow as tf

from modern import tf_adapter
from modern.runtime import UsageError, make_strategy as make_one_host_strategy
from records.usage import at_least

LAYOUT_FILE = "cluster_layout.json"
PREEMPTED_EXIT_CODE = 42  # TensorFlow's own exit code after a preemption checkpoint (failure_handling)
DEFAULT_CONNECT_TIMEOUT = 300.0  # seconds a worker waits for the others at start (--connect_timeout)
HEARTBEAT_TIMEOUT_S = 20  # a worker whose heartbeats stop this long is lost (PeerLostError)
SHUTDOWN_TIMEOUT_S = 60  # how long a finished worker waits for the others at exit


class Worker:
    """This process's place in a multi-worker cluster (None on one host)."""

    def __init__(self, addresses: list[str], index: int, replicas_per_worker: int) -> None:
        self.addresses = addresses
        self.index = index
        self.count = len(addresses)
        self.replicas_per_worker = replicas_per_worker
        self.is_chief = index == 0  # MultiWorkerMirroredStrategy's chief when there is no 'chief' job
        self._temp: Optional[str] = None
        self.preemption_handler: Optional[Any] = None  # set by step_runner; stopped by finish

    def folder(self, path: str) -> str:
        """Where this worker writes what belongs in `path`: `path` on the chief, else a temporary
        folder removed when the process ends (every worker must save, since saving may run
        collectives, but only the chief's copy is kept)."""
        if self.is_chief:
            return path
        if self._temp is None:
            self._temp = tempfile.mkdtemp(prefix=f"worker{self.index}-")
            atexit.register(shutil.rmtree, self._temp, ignore_errors=True)
        sub = os.path.join(self._temp, os.path.abspath(path).strip(os.sep).replace(os.sep, "_"))
        os.makedirs(sub, exist_ok=True)
        return sub


# ----------------------------------------------------------------------------------------------
# TF_CONFIG: read and checked before TensorFlow is asked to connect anything.
# ----------------------------------------------------------------------------------------------
def add_flags(parser: argparse.ArgumentParser) -> None:
    """The trainers' cluster flag: --connect_timeout (used only when TF_CONFIG names workers)."""
    parser.add_argument("--connect_timeout", type=at_least(1.0, float), default=DEFAULT_CONNECT_TIMEOUT,
                        help="on a cluster (TF_CONFIG): seconds a worker waits for the others to start, "
                             "then gives up with exit code 2")


def read_tf_config(environ: Optional[Mapping[str, str]] = None) -> Optional[tuple[list[str], int]]:
    """(worker addresses, this task's index) from TF_CONFIG, or None when it is absent or empty.

    Raises UsageError naming the problem: bad JSON, no worker list, a task other than a worker,
    an index out of range, an address without a port, or a worker listed twice.
    """
    raw = (os.environ if environ is None else environ).get("TF_CONFIG", "").strip()
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise UsageError(f"TF_CONFIG is not valid JSON ({e}): {raw[:200]}") from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not isinstance(cluster.get("worker"), list) or not cluster["worker"]:
        raise UsageError('TF_CONFIG has no "cluster": {"worker": ["host:port", ...]} list')
    other_jobs = sorted(set(cluster) - {"worker"})
    if other_jobs:
        raise UsageError(f"TF_CONFIG names jobs {other_jobs}: these trainers run only 'worker' tasks "
                         f"(worker 0 is the chief)")
    addresses = cluster["worker"]
    for address in addresses:
        host, _, port = str(address).rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"TF_CONFIG worker address {address!r} is not host:port")
    seen: dict[str, int] = {}
    for i, address in enumerate(addresses):
        if address in seen:
            raise UsageError(f"TF_CONFIG lists worker {address} twice (indexes {seen[address]} and {i})")
        seen[address] = i
    task = config.get("task")
    if not isinstance(task, dict) or task.get("type") != "worker":
        raise UsageError(f'TF_CONFIG "task" must be {{"type": "worker", "index": i}}, got {task!r}')
    index = task.get("index")
    if not isinstance(index, int) or not 0 <= index < len(addresses):
        raise UsageError(f"TF_CONFIG task index {index!r} is out of range for {len(addresses)} workers "
                         f"(0..{len(addresses) - 1})")
    return addresses, index


def _check_port_free(address: str) -> None:
    """This worker's own port must be free to listen on (a port in use is a usage error)."""
    host, _, port = address.rpartition(":")
    if host not in ("localhost", "127.0.0.1", socket.gethostname(), "0.0.0.0"):
        return  # another interface of this host: TensorFlow binds all interfaces, probe them
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as gRPC binds: a port left in TIME_WAIT by the previous run of this worker is free
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", int(port)))
            s.listen()
        except OSError as e:
            raise UsageError(f"this worker's address {address} (TF_CONFIG task index) cannot be "
                             f"listened on: port {port} is in use ({e.strerror})") from None


# ----------------------------------------------------------------------------------------------
# The strategy.
# ----------------------------------------------------------------------------------------------
def make_strategy(num_replicas: int, log: Optional[Callable[[str], Any]] = print,
                  connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> tuple[Any, Optional[Worker]]:
    """(strategy, worker): MultiWorkerMirroredStrategy when TF_CONFIG names more than one worker,
    else the one-host MirroredStrategy of `modern.runtime.make_strategy` and worker None.

    num_replicas is per worker.  Call first thing, before any other TensorFlow op: the strategy
    starts this worker's server and, like the logical devices, can only be set up once.
    Waits up to `connect_timeout` seconds for every other worker to start, then raises
    UsageError naming the workers that never came (configure_coordination).
    """
    config = read_tf_config()
    if config is None or len(config[0]) == 1:
        return make_one_host_strategy(num_replicas, log=log), None
    addresses, index = config
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if num_replicas > len(gpus):
            raise UsageError(f"--num_replicas {num_replicas} per worker, but worker {index} has "
                             f"{len(gpus)} GPUs")
        tf.config.set_visible_devices(gpus[:num_replicas], "GPU")
    elif num_replicas != 1:
        raise UsageError(
            f"--num_replicas {num_replicas} with {len(addresses)} CPU-only workers: "
            f"MultiWorkerMirroredStrategy runs one replica per CPU worker (it uses GPUs or the one "
            f"/device:CPU:0, never logical CPU devices); pass --num_replicas 1, or run more workers")
    _check_port_free(addresses[index])
    configure_coordination(len(addresses), connect_timeout)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as e:
        missing = tasks_named(e.message, index)
        who = (", ".join(f"worker {i} ({addresses[i]})" for i in missing) if missing
               else f"the chief, worker 0 ({addresses[0]})" if index else "the other workers")
        raise UsageError(
            f"worker {index} ({addresses[index]}) could not reach {who} within --connect_timeout "
            f"{connect_timeout:g} s: start every worker named in TF_CONFIG (same cluster list, its own "
            f"task index), check the addresses and firewalls, or raise --connect_timeout") from None
    worker = Worker(addresses, index, num_replicas)
    if log is not None:
        log(f"worker {index} of {worker.count} ({'chief' if worker.is_chief else 'not chief'}), "
            f"{strategy.num_replicas_in_sync} replicas in all on {', '.join(strategy.extended.worker_devices)}")
    return strategy, worker


def configure_coordination(num_workers: int, connect_timeout: float) -> None:
    """Set up TensorFlow's coordination service as MultiWorkerMirroredStrategy would, plus time limits.

    The strategy's constructor configures the service itself (`CollectiveAllReduceExtended.
    _initialize_multi_worker`, collective_all_reduce_strategy.py) unless one is already configured,
    and its own configuration waits for the other workers without a limit, in C++, holding Python's
    GIL (no Python watchdog can run).  Configured here first, with the same service (standalone,
    led by worker 0, every worker a coordinated task) and three limits from
    `CoordinationServiceConfig` (xla/tsl/protobuf/coordination_config.proto):

      cluster_register_timeout_in_ms   a worker whose peers have not all registered within
      + cluster_register_with_barrier  connect_timeout fails with DeadlineExceededError, the chief
                                       included (without the barrier the chief waits forever)
      heartbeat_timeout_in_ms          a worker silent this long is declared lost: the others'
                                       collectives fail instead of hanging (PeerLostError)
      shutdown_barrier_timeout_in_ms   at exit every worker waits for the others this long, so a
                                       finished chief does not leave its peers talking to a closed
                                       socket

    TensorFlow dependencies, private: the calls the strategy makes (`modern.tf_adapter`).
    """
    tf_adapter.configure_coordination_service(num_workers, int(connect_timeout * 1000),
                                              HEARTBEAT_TIMEOUT_S * 1000, SHUTDOWN_TIMEOUT_S * 1000)


def distribute(strategy: Any, worker: Optional[Worker], dataset: Any) -> ReplicaBatches:
    """A dataset of GLOBAL batches -> an iterable of distributed batches for `strategy.run`.

    Each global batch of B rows is cut as `experimental_distribute_dataset` cuts it: replica
    batches of ceil(B/N) rows, in order (7 rows on 2 replicas: 4 + 3; 1 row: 1 + 0, on one
    host and across workers), so `spread_short_batch` still knows which batches would leave a
    replica empty.  On a cluster every worker builds the same global batches (same files, same
    shuffle seed: see shared_seed) and takes its own replicas' slices, by their global replica id;
    file sharding would give workers different rows per global batch than one host sees.  Cost:
    each worker reads the whole input.

    Speed: the slices are cut from the batch the plain `tf.data` iterator yields
    (`experimental_distribute_values_from_function`), not by `experimental_distribute_dataset`,
    whose distributed iterator adds a fixed cost to every step on CPU, the same at 1 and 2
    replicas (`benchmarks/bench.py --variants modern modern-strategy-iterator` shows it).
    `element_spec` is the strategy's own, for the train step's input signature.
    """
    spec_of = dataset
    if worker is not None:  # the strategy's spec, from a dataset it can shard (never iterated)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        spec_of = dataset.with_options(options)
    return ReplicaBatches(strategy, dataset, strategy.experimental_distribute_dataset(spec_of).element_spec)


class ReplicaBatches:
    """`distribute`'s iterable: each global batch of `dataset` cut into its replicas' slices."""

    def __init__(self, strategy: Any, dataset: Any, element_spec: Any) -> None:
        self.strategy, self.dataset, self.element_spec = strategy, dataset, element_spec
        # A plain TensorSpec: the strategy hands its one replica plain tensors (MirroredStrategy
        # on one device); MultiWorkerMirroredStrategy wraps even one local replica's (PerReplicaSpec).
        self.plain = isinstance(tf.nest.flatten(element_spec)[0], tf.TensorSpec)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.dataset:
            yield self.split(batch)

    def split(self, batch: Any) -> Any:
        """One global batch (a tuple of tensors, rows first) -> its distributed value."""
        rows = int(batch[0].shape[0])

        def part(ctx):
            per_replica = -(-rows // ctx.num_replicas_in_sync)
            start = min(ctx.replica_id_in_sync_group * per_replica, rows)
            end = min(start + per_replica, rows)
            return tuple(t[start:end] for t in batch)

        value = self.strategy.experimental_distribute_values_from_function(part)
        if self.plain:
            value = tuple(self.strategy.experimental_local_results(t)[0] for t in value)
        return value


def shared_seed(strategy: Any, worker: Optional[Worker]) -> dict[str, Any]:
    """{"shuffle_seed": a variable every worker agrees on} for the checkpoint, or {} on one host.

    A variable made in MultiWorkerMirroredStrategy's scope starts, on every worker, from the
    chief's initial value (a broadcast): each worker draws its own number, all keep the chief's.
    The draw follows --seed (Python's generator, which `--seed`/`--deterministic` seed) and is
    random without it.  Given to `tf.train.Checkpoint(..., **shared_seed(...))` before the restore,
    it is saved with the model and comes back on resume, so a resumed cluster, with or without
    --seed, keeps the shuffle order it started with: the batches after the checkpoint are those
    the uninterrupted run would have trained on (the resumed pipeline skips the trained ones).
    Read it with `shuffle_seed(checkpoint)` after the restore.
    """
    if worker is None:
        return {}
    with strategy.scope():
        return {"shuffle_seed": tf.Variable(random.getrandbits(31), dtype=tf.int64, trainable=False)}


def shuffle_seed(checkpoint: Any) -> Optional[int]:
    """The agreed (or restored) shuffle seed in `checkpoint` as an int, or None on one host."""
    seed = getattr(checkpoint, "shuffle_seed", None)
    return None if seed is None else int(seed.numpy())


# ----------------------------------------------------------------------------------------------
# Checkpoints: the layout they were written by, and preemption.
# ----------------------------------------------------------------------------------------------
def check_layout(folder: str, worker: Optional[Worker], num_replicas: int) -> None:
    """Refuse to resume a checkpoint folder written by another cluster layout; record ours.

    A multi-worker chief writes `cluster_layout.json` (workers, replicas per worker) next to its
    checkpoints.  Resuming needs the same layout (the input position and the replicas' share of
    each batch depend on it): a folder holding checkpoints with another layout, or with none (one
    host) under a cluster, or a cluster's under one host, raises UsageError before anything is
    written.  One-host runs write nothing here.
    """
    path = os.path.join(folder, LAYOUT_FILE)
    ours = {"workers": 1 if worker is None else worker.count,
            "replicas_per_worker": num_replicas if worker is None else worker.replicas_per_worker}
    has_checkpoint = tf.train.latest_checkpoint(folder) is not None
    recorded = None
    if os.path.exists(path):
        try:
            with open(path) as f:
                recorded = json.load(f)
        except (OSError, ValueError) as e:
            raise UsageError(f"{path} is unreadable ({e}); it records the cluster layout of the "
                             f"checkpoints there") from None
    if has_checkpoint:
        if recorded is None and worker is not None:
            raise UsageError(f"{folder} holds checkpoints written on one host (no {LAYOUT_FILE}); a "
                             f"{ours['workers']}-worker cluster will not resume them: use another folder")
        if recorded is not None and recorded != ours and (worker is not None or recorded["workers"] > 1):
            raise UsageError(f"{folder} holds checkpoints written by {recorded['workers']} worker(s) x "
                             f"{recorded['replicas_per_worker']} replica(s); this run is {ours['workers']} x "
                             f"{ours['replicas_per_worker']}: run with that layout, or use another folder")
    if worker is not None and worker.is_chief:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(ours, f)
        os.replace(tmp, path)  # atomic: never half-written


def checkpoint_managers(checkpoint: Any, folder: str, worker: Optional[Worker], **kwargs: Any) -> tuple[Any, Any]:
    """(read, write) CheckpointManagers: one and the same on `folder` on one host and on the chief;
    another worker reads the chief's `folder` and writes into its temporary one (Worker.folder)."""
    read = tf.train.CheckpointManager(checkpoint, folder, **kwargs)
    if worker is None or worker.is_chief:
        return read, read
    return read, tf.train.CheckpointManager(checkpoint, worker.folder(folder), **kwargs)


def step_runner(worker: Optional[Worker], checkpoint: Any, folder: str, write_manager: Any, step: Callable[[], int],
                log: Callable[[str], Any] = print) -> Callable[..., Any]:
    """run(train_step, batch): on a cluster, through a PreemptionCheckpointHandler; else a call.

    On SIGTERM to any worker, the handler has every worker finish the same step, save (the chief
    into `folder`, the others into their temporary one: save_fn), and exit with code
    42, TensorFlow's restart code.  The handler adds its own run counter to `checkpoint` and
    restores it (with the rest, again) from `folder`'s latest checkpoint; it never writes through its
    reading manager.  step(): the training step, to number the checkpoint.  A worker
    killed outright (SIGKILL) saves nothing: the run resumes from the last periodic checkpoint.
    """
    if worker is None:
        return lambda train_step, *args: train_step(*args)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()

    def save():
        path = write_manager.save(checkpoint_number=step())
        log(f"preemption: checkpoint {path} saved; exiting with code {PREEMPTED_EXIT_CODE} "
            f"(run again to resume)")

    config = tf.distribute.experimental.TerminationConfig(
        exit_fn=lambda: sys.exit(PREEMPTED_EXIT_CODE), save_fn=save)
    reader = tf.train.CheckpointManager(checkpoint, folder, max_to_keep=None)
    handler = tf.distribute.experimental.PreemptionCheckpointHandler(resolver, reader,
                                                                     termination_config=config)
    worker.preemption_handler = handler
    return reporting_lost_peers(worker, folder, handler.run)


def finish(worker: Optional[Worker]) -> None:
    """At the clean end of a run, on every worker: leave together, without error noise.

    The PreemptionCheckpointHandler keeps a thread per worker blocked on a key of the chief's
    coordination service (`_watch_step_to_save_key`); a chief that exits first leaves it raising
    "UnavailableError: Socket closed".  So: release every worker's
    watcher (the handler's own clean-up, private), then wait at a coordination-service barrier until
    every worker has (both through `modern.tf_adapter`).
    """
    if worker is None:
        return
    if worker.preemption_handler is not None:
        tf_adapter.stop_termination_watcher(worker.preemption_handler)
    tf_adapter.wait_at_barrier("modern.cluster.finish", SHUTDOWN_TIMEOUT_S * 1000)


# ----------------------------------------------------------------------------------------------
# A worker lost mid-run.
# ----------------------------------------------------------------------------------------------
class PeerLostError(UsageError):
    """Another worker stopped answering mid-run: one paragraph, exit code 2 (run_reporting_usage_errors)."""


# What a collective raises when a peer is gone: UnavailableError (connection reset, or the
# coordination service's heartbeat timeout), DeadlineExceededError, AbortedError/CancelledError
# (collectives aborted after another worker's failure).  After a SIGKILL of worker 1 mid-run,
# worker 0's next train step raises UnavailableError "Collective ops is aborted by: ..." naming
# the reset connection or the tasks that stopped sending heartbeats.
PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError,
               tf.errors.CancelledError)


def tasks_named(message: str, index: int) -> list[int]:
    """The worker indices a TensorFlow error message names (`/job:worker/replica:0/task:i`), other than `index`."""
    return sorted(set(int(i) for i in re.findall(r"/job:worker/replica:0/task:(\d+)", message)) - {index})


def reporting_lost_peers(worker: Optional[Worker], folder: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn, raising PeerLostError instead of the collective errors of a lost worker (on a cluster)."""
    if worker is None:
        return fn

    def guarded(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PEER_ERRORS as e:
            raise PeerLostError(lost_peer_message(worker, e, folder)) from None
    return guarded


def lost_peer_message(worker: Worker, error: Any, folder: str) -> str:
    """The paragraph a surviving worker prints: who is lost, why, and how the run goes on."""
    lost = tasks_named(error.message, worker.index)
    who = ", ".join(f"worker {i} ({worker.addresses[i]})" for i in lost if i < worker.count) or "another worker"
    reason = next((line.strip() for line in error.message.splitlines()
                   if "aborted by" in line or "Connection" in line or "heartbeat" in line.lower()),
                  error.message.strip().splitlines()[0])
    latest = tf.train.latest_checkpoint(folder)
    return (f"worker {worker.index} ({worker.addresses[worker.index]}) lost {who} mid-run "
            f"({type(error).__name__}: {reason[:200]}). A MultiWorkerMirroredStrategy step needs every "
            f"worker, so this worker stops too. Nothing is lost before the last checkpoint "
            f"({latest or 'none yet'} in {folder}): start the whole cluster again (the same "
            f"python -m modern.launch command, or every worker's own command) and it resumes there.")
