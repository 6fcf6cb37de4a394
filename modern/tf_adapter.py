"""The one module that reaches into TensorFlow's private modules where it has no public API (for
the multi-worker engine, modern/cluster.py; pinned by tests/test_multiworker.py, whose connect
timeout, lost-peer and SIGTERM/SIGKILL tests fail first when a TensorFlow release moves these, and
by `tensorflow==2.21.*` in pyproject.toml).

    configure_coordination_service(...)  the coordination service, with a register barrier
    stop_termination_watcher(handler)    a PreemptionCheckpointHandler's watcher thread, released
    wait_at_barrier(name, timeout_ms)    every worker meets at a named barrier

Imported where used, so that a TensorFlow release that moves them breaks only the multi-worker runs.
"""
from __future__ import annotations

from typing import Any


def configure_coordination_service(num_workers: int, register_timeout_ms: int, heartbeat_timeout_ms: int,
                                   shutdown_timeout_ms: int) -> None:
    """The service MultiWorkerMirroredStrategy configures (standalone, led by worker 0, every worker
    a coordinated task), with time limits and `cluster_register_with_barrier` set.

    Private: `context.context().configure_coordination_service` (the call the strategy makes) and
    its `_coordination_service_config` (the barrier flag has no argument).
    """
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.configure_coordination_service(
        service_type="standalone",
        service_leader="/job:worker/replica:0/task:0",
        coordinated_jobs=[coordination_config_pb2.CoordinatedJob(name="worker", num_tasks=num_workers)],
        cluster_register_timeout_in_ms=register_timeout_ms,
        heartbeat_timeout_in_ms=heartbeat_timeout_ms,
        shutdown_barrier_timeout_in_ms=shutdown_timeout_ms)
    ctx._coordination_service_config.cluster_register_with_barrier = True


def stop_termination_watcher(handler: Any) -> None:
    """Release the thread a `tf.distribute.experimental.PreemptionCheckpointHandler` keeps blocked on
    a key of the chief's coordination service (private: the handler's own clean-up,
    `_stop_cluster_wise_termination_watcher_thread`)."""
    handler._stop_cluster_wise_termination_watcher_thread()


def wait_at_barrier(name: str, timeout_ms: int) -> None:
    """Wait until every worker reaches the coordination-service barrier `name` (private:
    `context.context().wait_at_barrier`)."""
    from tensorflow.python.eager import context

    context.context().wait_at_barrier(name, timeout_ms)
