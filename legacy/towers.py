"""Tower placement and gradient averaging for the legacy (TF1 graph) trainers.

The originals place tower i on `/gpu:i`.  On a machine with fewer GPUs than towers, each tower
gets its own *virtual CPU device* instead: a TF1 session created with
`ConfigProto(device_count={'CPU': n})` exposes `/cpu:0` ... `/cpu:n-1`, which the placer and
the executor treat as separate devices, so the graph has the same structure (and the same
cross-device copies) as on n GPUs.
"""
import tensorflow.compat.v1 as tf


def tower_devices(num_towers):
    """Device strings for the towers: `/gpu:i` when enough GPUs exist, else `/cpu:i`."""
    gpus = tf.config.list_physical_devices("GPU")
    kind = "gpu" if len(gpus) >= num_towers else "cpu"
    return [f"/{kind}:{i}" for i in range(num_towers)]


def session_config(num_towers, log_device_placement=False):
    """The original's `ConfigProto(allow_soft_placement=True)`, plus enough virtual CPUs for the towers."""
    config = tf.ConfigProto(
        allow_soft_placement=True,
        log_device_placement=log_device_placement,
        device_count={"CPU": max(1, num_towers)},
    )
    config.gpu_options.allow_growth = True
    return config


def placement_message(devices):
    """One log line saying where the towers are."""
    if devices and devices[0].startswith("/gpu"):
        return f"towers placed on {len(devices)} GPUs: {', '.join(devices)}"
    return (f"no GPUs for {len(devices)} towers: each tower runs on its own virtual CPU device "
            f"({', '.join(devices)})")


def average_gradients(tower_grads):
    """The originals' `average_gradients`: the mean over towers of each variable's gradient.

    tower_grads: one list of (gradient, variable) pairs per tower, as `compute_gradients` returns.
    Returns one list of (mean gradient, variable) pairs.  The variable is taken from tower 0,
    which is right because the towers share their variables.
    """
    average_grads = []
    for grad_and_vars in zip(*tower_grads):
        grads = [tf.expand_dims(g, 0) for g, _ in grad_and_vars]
        grad = tf.reduce_mean(tf.concat(grads, 0), 0)
        average_grads.append((grad, grad_and_vars[0][1]))
    return average_grads
