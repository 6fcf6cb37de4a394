"""Tower placement and gradient averaging for the legacy (TF1 graph) trainers.

The originals place tower i on `/gpu:i`.  Where the port must go further:
- fewer GPUs than towers (one GPU, two towers): tower i goes on `/gpu:{i % G}`, so the G GPUs take
  turns and several towers share one.  A TF1 graph may put any number of ops on one device; the
  towers' variables are shared and stay where they are, and the averaging is the same.
- no GPU at all: each tower gets its own *virtual CPU device*: a TF1 session created with
  `ConfigProto(device_count={'CPU': n})` exposes `/cpu:0` ... `/cpu:n-1`, which the placer and
  the executor treat as separate devices, so the graph has the same structure (and the same
  cross-device copies) as on n GPUs.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import tensorflow.compat.v1 as tf


def tower_devices(num_towers: int) -> list[str]:
    """Device strings for the towers: `/gpu:i` with enough GPUs, `/gpu:{i % G}` with G fewer
    (round robin: 2 towers on 1 GPU are `/gpu:0, /gpu:0`), `/cpu:i` without any."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return [f"/gpu:{i % len(gpus)}" for i in range(num_towers)]
    return [f"/cpu:{i}" for i in range(num_towers)]


def session_config(num_towers: int, log_device_placement: bool = False) -> Any:
    """The original's `ConfigProto(allow_soft_placement=True)`, plus enough virtual CPUs for the towers."""
    config = tf.ConfigProto(
        allow_soft_placement=True,
        log_device_placement=log_device_placement,
        device_count={"CPU": max(1, num_towers)},
    )
    config.gpu_options.allow_growth = True
    return config


def placement_message(devices: Sequence[str]) -> str:
    """One log line saying where the towers are."""
    if devices and devices[0].startswith("/gpu"):
        gpus = sorted(set(devices))
        if len(gpus) == len(devices):
            return f"towers placed on {len(devices)} GPUs: {', '.join(devices)}"
        fewest, most = min(map(devices.count, gpus)), max(map(devices.count, gpus))
        per_gpu = f"{most}" if fewest == most else f"{fewest}-{most}"     # 3 towers on 2 GPUs: 1-2
        return (f"{len(devices)} towers on {len(gpus)} GPU{'s' if len(gpus) > 1 else ''} "
                f"({per_gpu} per GPU): {', '.join(devices)}")
    return (f"no GPUs for {len(devices)} towers: each tower runs on its own virtual CPU device "
            f"({', '.join(devices)})")


def average_gradients(tower_grads: Sequence[Sequence[tuple[Any, Any]]]) -> list[tuple[Any, Any]]:
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


# ---------------------------------------------------------------------------------------------
# How a batch is split across towers (the original's `current_batch_size` story)
# ---------------------------------------------------------------------------------------------
# Tower i trains on rows [starts[i], starts[i] + sizes[i]) of the fed batch.
#   'fix'      the original's fix: current_batch_size = rows // N, fed per batch.  Remainder rows are
#              dropped; with fewer rows than towers every tower is empty.
#   'static'   the original's bug: a constant current_batch_size = batch_size // N.  On a short last
#              batch the later towers get a short or EMPTY slice; an empty tower's mean loss is 0/0.
#   'weighted' a deviation that loses nothing: sizes differ by at most one row (the remainder goes
#              to the first towers) and tower i's gradient is weighted by sizes[i] / rows, so
#              sum_i w_i * grad(mean loss_i) = grad(mean loss over all rows), the full-batch gradient.
#              A tower that would be empty (rows < N) gets a copy of row 0 with weight 0.
SPLITS = ("fix", "static", "weighted")


class SplitError(ValueError):
    """A batch that a split cannot handle (the message says why)."""


class TowerSplit:
    """The rows each tower gets from one batch.

    starts, sizes: per tower; weights: per tower (sizes / rows, 'weighted' only, else 1 / N);
    dropped: rows of the batch that no tower sees; empty: indices of towers that get no row
    (a 'weighted' tower padded with a weight-0 row is counted in `padded` instead).
    """

    def __init__(self, rows: int, starts: Iterable[int], sizes: Iterable[int], weights: Iterable[float],
                 padded: Iterable[int] = ()) -> None:
        self.rows, self.starts, self.sizes, self.weights = rows, list(starts), list(sizes), list(weights)
        self.padded = list(padded)
        used = sum(s for i, s in enumerate(self.sizes) if i not in self.padded)
        self.dropped = rows - used
        self.empty = [i for i, s in enumerate(self.sizes) if s == 0]

    def __repr__(self) -> str:
        return (f"TowerSplit(rows={self.rows}, starts={self.starts}, sizes={self.sizes}, "
                f"weights={self.weights}, dropped={self.dropped}, empty={self.empty}, padded={self.padded})")


def split_rows(rows: int, num_towers: int, mode: str = "fix", static_batch_size: Optional[int] = None) -> TowerSplit:
    """Which rows of a batch of `rows` each of `num_towers` towers gets, under split `mode`.

    `static_batch_size` is the constant per-tower size of mode 'static' (the original's batch_size / 2).
    """
    n = num_towers
    if mode == "fix":
        size = rows // n                                    # c_batch_size = int(batch_x.shape[0] / 2)
        return TowerSplit(rows, [i * size for i in range(n)], [size] * n, [1.0 / n] * n)
    if mode == "static":
        if static_batch_size is None or static_batch_size < 1:
            raise SplitError(f"split 'static' needs a per-tower batch size >= 1, got {static_batch_size}")
        if rows < n:
            raise SplitError(f"a batch of {rows} rows is smaller than the {n} towers: under --split=static "
                             f"(a constant {static_batch_size} rows per tower) towers {list(range(rows, n))} "
                             f"would get nothing. Use a batch size of at least {n} rows.")
        size = static_batch_size
        starts = [min(i * size, rows) for i in range(n)]
        sizes = [min((i + 1) * size, rows) - starts[i] for i in range(n)]
        return TowerSplit(rows, starts, sizes, [1.0 / n] * n)
    if mode == "weighted":
        if rows < 1:
            raise SplitError("split 'weighted' needs at least one row")
        base, extra = divmod(rows, n)
        sizes = [base + (i < extra) for i in range(n)]
        starts = [sum(sizes[:i]) for i in range(n)]
        weights = [s / rows for s in sizes]
        padded = [i for i in range(n) if sizes[i] == 0]
        for i in padded:                                    # rows < N: a weight-0 copy of row 0
            starts[i], sizes[i] = 0, 1
        return TowerSplit(rows, starts, sizes, weights, padded)
    raise SplitError(f"unknown split {mode!r}: choose one of {', '.join(SPLITS)}")


def weighted_average_gradients(tower_grads: Sequence[Sequence[tuple[Any, Any]]],
                               tower_weights: Sequence[Any]) -> list[tuple[Any, Any]]:
    """sum_i w_i * grad_i per variable: `average_gradients` with weights instead of 1/N.

    tower_grads as for `average_gradients`; tower_weights: one scalar (tensor or float) per tower,
    summing to 1.  With w_i = rows_i / rows and each tower's loss a mean over its rows, the result
    is the gradient of the mean loss over the whole batch.
    """
    average_grads = []
    for grad_and_vars in zip(*tower_grads):
        grad = tf.add_n([w * g for w, (g, _) in zip(tower_weights, grad_and_vars)])
        average_grads.append((grad, grad_and_vars[0][1]))
    return average_grads
