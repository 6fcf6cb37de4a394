"""What the two sides of a pairing exchange: training states, step outcomes, and the `Run` both implement.

    State         every variable of a training state, in TF1's names and TF1's parameterisation
    StepOutcome   what one training step (or one gradient computation) gave: loss, gradients, rate, ...
    ReplicaBatch  one modern replica's rows of a step, as the port's input path handed them over
    Run           the verbs both sides answer to: state, restore, step, predict, close

The legacy side (`compare.legacy_run.LegacyRun`) and the modern side (`compare.modern_run.ModernRun`)
return the same records, so that a check reads `outcome.gradients` on either side.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional, Protocol, Sequence

import numpy as np

from compare.interface import Batch

Arrays = dict[str, np.ndarray]
Masks = Optional[list[list[np.ndarray]]]  # masks[k][i]: dropout k's mask for tower (replica) i's rows


@dataclasses.dataclass
class State:
    """A training state in TF1's names and parameterisation.

    weights: every model variable (trainable ones and moving statistics); slots: per trainable
    variable, the optimizer's slots by TF1's names (m, v; accum; ...); step: the global step;
    shadows: per trainable variable, its moving-average shadow (None without moving averages)."""
    weights: Arrays
    slots: dict[str, Arrays]
    step: int
    shadows: Optional[Arrays] = None

    def replace(self, **changes: Any) -> State:
        return dataclasses.replace(self, **changes)


class ReplicaBatch(NamedTuple):
    """One modern replica's rows of a step: inputs, labels and each row's weight, as numpy."""
    x: np.ndarray
    y: np.ndarray
    weights: np.ndarray


@dataclasses.dataclass
class StepOutcome:
    """What one step of either side gave.

    loss: the combined loss; gradients: the (averaged, all-reduced) gradient of each trainable
    variable by TF1 name; lr: the rate the step used (None where no update ran); masks: the dropout
    masks the step drew (modern) or was given (legacy); replicas: each modern replica's rows;
    source: how the gradients were obtained, for the report; stats: the batch statistics the legacy
    towers' moving updates read (compare.tf1_graph.moving_updates order)."""
    loss: float
    gradients: Arrays
    lr: Optional[float] = None
    masks: Masks = None
    replicas: list[ReplicaBatch] = dataclasses.field(default_factory=list)
    source: str = ""
    stats: list[np.ndarray] = dataclasses.field(default_factory=list)

    @property
    def rows(self) -> list[int]:
        """Rows per modern replica."""
        return [len(r.x) for r in self.replicas]


class Run(Protocol):
    """One side of a pairing, built and ready: the verbs every check drives.

    state() -> State: every variable now, in TF1's names and parameterisation.
    restore(state, lr): set every variable of `state` (lr: the rate of the step about to run, for
      slots whose parameterisation depends on it).
    step(batch, ...) -> StepOutcome: one training step of the program's own train op / step.
    predict(x) -> logits in inference mode.
    close(): release what the side holds (a session).
    """

    def state(self) -> State: ...

    def restore(self, state: State, lr: Optional[float] = None) -> None: ...

    def step(self, batch: Batch, *args: Any, **kwargs: Any) -> StepOutcome: ...

    def predict(self, x: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...


def row_key(x: np.ndarray, y: np.ndarray) -> bytes:
    """A row's identity: its input and label bytes."""
    return np.ascontiguousarray(x).tobytes() + np.ascontiguousarray(y).tobytes()


def row_index(batch: Batch) -> dict[bytes, int]:
    return {row_key(batch.x[i], batch.y[i]): i for i in range(batch.rows)}


def replica_rows(batch: Batch, replicas: Sequence[ReplicaBatch]) -> list[tuple[list[int], float]]:
    """Each modern replica's rows as indices into `batch` (-1: a row that is no row of it), with the
    replica's total weight."""
    index = row_index(batch)
    return [([index.get(row_key(r.x[j], r.y[j]), -1) for j in range(len(r.x))], float(np.sum(r.weights)))
            for r in replicas]
