"""One pairing of a pair, built: the legacy graph in its session and the modern model under its strategy.

`build(pair, pairing, towers, files, tmp_dir, seed)` returns `Sides`, which the checks drive:

    sides.legacy     compare.legacy_run.LegacyRun: the program's own ops on fed batches
    sides.modern     compare.modern_run.ModernRun: the port's own train step
    sides.start      the common start (fresh weights, moving statistics randomised; or the
                     --checkpoint's), zero slots, step 0
    sides.tolerances compare.report.Tolerances, derived for this pairing (compare.tolerances.derive)

Both sides answer the same verbs (compare.state.Run: state, restore, step, predict) and hold the state
in TF1's names and TF1's parameterisation (`State`); the modern side converts on the way in (Keras'
momentum slot is -lr times TF1's accumulator) and out.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, Optional, Sequence, cast

import numpy as np
import tensorflow as tf

from compare import common, tf1_graph
from compare.interface import Batch, DataFiles, NotFed, Pair, Pairing
from compare.legacy_run import HarnessError, LegacyRun, TowerRows, beside
from compare.modern_run import ModernRun, check_variable_map
from compare.state import Masks, ReplicaBatch, State, StepOutcome, replica_rows, row_index, row_key
from compare.report import Tolerances

__all__ = ["HarnessError", "Sides", "State", "StepOutcome", "TowerRows", "build", "replica_rows", "row_index",
           "row_key"]


@dataclasses.dataclass
class Sides:
    pair: Pair
    pairing: Pairing
    towers: int
    legacy: LegacyRun
    modern: ModernRun
    files: DataFiles
    tmp_dir: str
    seed: int
    start: State = dataclasses.field(default_factory=lambda: State({}, {}, 0))
    start_path: str = ""
    tolerances: Optional[Tolerances] = None

    @functools.cached_property
    def always_on(self) -> list[tf1_graph.Dropout]:
        """The legacy dropouts that are on in inference mode too (the graph has no inference mode:
        a network built with is_training=True, whatever is fed); [] where inference mode is
        deterministic.  The harness imposes their masks wherever it compares logits."""
        return self.legacy.dropouts_on(self.batch(seed=97), False)

    @property
    def tol(self) -> Tolerances:
        """The derived tolerances (set by the harness once the pairing is built)."""
        if self.tolerances is None:
            raise HarnessError("the pairing's tolerances are not derived yet")
        return self.tolerances

    @property
    def label(self) -> str:
        return f"{self.pairing.label}: " if self.pairing.label else ""

    @property
    def rows(self) -> int:
        """The rows of one full batch of this pairing."""
        per = self.pair.rows_per_tower
        return per if self.pairing.same_rows_on_every_tower else per * self.towers

    def batch(self, rows: Optional[int] = None, seed: int = 0) -> Batch:
        return self.pair.data.batch(self.rows if rows is None else rows, self.seed * 1000 + seed)

    def tower_masks(self, batch: Batch, feed_rows: Sequence[Any], step_masks: Masks,
                    replicas: Sequence[ReplicaBatch]) -> Masks:
        """The modern step's masks, per dropout and legacy tower, for the rows each tower sees.

        Tower i takes replica i's masks when replica i holds exactly tower i's rows (in order);
        otherwise each row takes the mask of its first copy on the modern side."""
        if not step_masks:
            return None
        held = [rows for rows, _ in replica_rows(batch, replicas)]
        first: dict[int, tuple[int, int]] = {}
        for r, rows in enumerate(held):
            for j, b in enumerate(rows):
                first.setdefault(b, (r, j))
        out = []
        for per_replica in step_masks:
            per_tower = []
            for i, tower_rows in enumerate(feed_rows):
                rows = list(np.asarray(tower_rows).ravel())
                if i < len(held) and held[i] == rows:
                    per_tower.append(per_replica[i])
                else:
                    shape = per_replica[0].shape[1:]
                    picked = [per_replica[first[b][0]][first[b][1]] if b in first else np.ones(shape, np.float32)
                              for b in rows]
                    per_tower.append(np.stack(picked) if picked else np.zeros((0, *shape), np.float32))
            out.append(per_tower)
        return out

    def masks_for(self, batch: Batch, outcome: StepOutcome, towers: Optional[TowerRows] = None) -> Masks:
        """The masks a modern step drew, for the rows the legacy towers see of `batch`."""
        rows = towers.rows if towers is not None else self.legacy.feed(batch, True).towers.rows
        return self.tower_masks(batch, rows, outcome.masks, outcome.replicas)

    def set_both(self, state: State) -> float:
        """Both sides to `state`; returns the legacy rate at its step (the rate of the next step)."""
        self.legacy.restore(state)
        lr = self.legacy.learning_rate_at(state.step)
        self.legacy.set_step(state.step)
        self.modern.restore(state, lr)
        return lr

    def set_modern(self, state: State) -> float:
        """The modern side alone to `state`, where only the port runs next (the legacy variables, a
        few hundred MB to write, are left as they are); returns the legacy rate at its step."""
        lr = self.legacy.learning_rate_at(state.step)
        self.modern.restore(state, lr)
        return lr

    def close(self) -> None:
        self.legacy.close()
        self.modern.close()


def build(pair: Pair, pairing: Pairing, towers: int, files: DataFiles, tmp_dir: str, seed: int = 0,
          checkpoint: Optional[str] = None, start_path: Optional[str] = None, log: Callable[[str], None] = print,
          modern: Optional[ModernRun] = None, ready: Optional[Callable[[Sides], None]] = None,
          trace: bool = True) -> Sides:
    """Both sides of one pairing, from the same start: the legacy graph's fresh weights (moving
    statistics randomised: fresh ones, 0 and 1, would hide a wrong batch-norm epsilon or variance
    formula in inference mode), `checkpoint` (a TF1 checkpoint of the legacy program), or
    `start_path` (the start another pairing wrote).  `modern`: a ModernRun of another pairing with
    the same modern arguments, reused (the model and its traced steps do not depend on the legacy
    side's arguments).  `ready(sides)`: work on the legacy side alone once the start is set (the
    harness derives the tolerances there).  The legacy side's start and `ready` run beside the modern
    build, where there is one: its Python and their session runs share the machine.  `trace`: the
    port's steps then traced beside them (ModernRun.trace); the harness asks it of the last pairing
    it builds, so that no legacy graph is built (Python that holds the GIL) beside the trace."""
    common_argv = tuple(pair.harness_argv(towers))
    legacy_flags = pair.legacy.parse_args([pair.legacy.tower_flag, str(towers), *common_argv, *pairing.legacy_argv])
    modern_flags = pair.modern.parse_args([pair.modern.replica_flag, str(towers), *common_argv, *pairing.modern_argv])
    log(f"{pair.name}: {pairing.label + ': ' if pairing.label else ''}building the legacy graph ({towers} towers)")
    legacy = LegacyRun(pair, legacy_flags, towers, files, seed, start=False)
    try:
        if pairing.same_rows_on_every_tower is None:
            pairing = dataclasses.replace(pairing, same_rows_on_every_tower=every_tower_whole(pair, legacy, towers))
        sides = Sides(pair, pairing, towers, legacy, cast(ModernRun, modern), files, tmp_dir, seed)

        def set_up() -> None:
            legacy.start()
            set_start(sides, checkpoint, start_path)
            if ready is not None:
                ready(sides)
        if modern is None:
            strategy = None if getattr(pair.modern, "makes_its_strategy", False) else common.make_strategy(towers)
            log(f"{pair.name}: building the modern model ({towers} replicas)")
            with beside(set_up):
                sides.modern = ModernRun(pair, modern_flags, strategy, files, legacy)
                if trace:
                    sides.modern.trace()
            replicas = sides.modern.strategy.num_replicas_in_sync
            if replicas != towers:
                raise HarnessError(f"the port runs {replicas} replicas where the legacy program runs {towers} "
                                   f"towers: is {pair.modern.replica_flag} its replica flag?")
        else:
            check_variable_map(modern.names, legacy, modern.model)
            if trace:
                modern.trace()
            set_up()
    except BaseException:
        legacy.close()
        raise
    return sides


def set_start(sides: Sides, checkpoint: Optional[str], start_path: Optional[str]) -> None:
    """The legacy side at the pairing's start (see `build`), its checkpoint written, `sides.start` read."""
    legacy, path = sides.legacy, start_path or checkpoint
    if path:
        try:
            with legacy.graph.as_default():
                legacy.saver.restore(legacy.sess, path)
        except (tf.errors.OpError, ValueError) as e:
            raise HarnessError(f"the checkpoint {path} does not fit the legacy graph of {sides.pair.name}: "
                               f"{str(e).strip().splitlines()[0][:200]}") from None
    elif legacy.moving:
        randomise_moving_statistics(legacy, sides.seed)
    sides.start_path = start_path or legacy.save(os.path.join(sides.tmp_dir, f"{sides.pair.name}_start.ckpt"))
    sides.start = state_now(legacy)


def state_now(legacy: LegacyRun) -> State:
    """The legacy program's weights now, as a start: its initial slots, step 0, shadows at the weights."""
    weights = legacy.read(legacy.model)
    return State(weights, legacy.initial_slots, 0, {n: weights[n] for n in legacy.shadows} or None)


def every_tower_whole(pair: Pair, legacy: LegacyRun, towers: int) -> bool:
    """Whether the legacy feed gives every tower the whole batch (one batch fed to all towers), read
    from its feed of a batch of towers x rows_per_tower rows, or of rows_per_tower rows where it
    takes no other."""
    for rows in (pair.rows_per_tower * towers, pair.rows_per_tower):
        try:
            feed = legacy.lg.feed(pair.data.batch(rows, 0), True)
        except NotFed:
            continue
        return towers > 1 and all(len(r) == rows for r in feed.rows)
    return False


def randomise_moving_statistics(legacy: LegacyRun, seed: int) -> None:
    """Moving means ~ N(0, 0.1), moving variances ~ U(0.5, 1.5): away from their initial 0 and 1."""
    rng = np.random.RandomState(seed)
    weights = legacy.read(legacy.model)
    for u in {u.variable.op.name: u for u in legacy.moving}:
        shape = weights[u].shape
        weights[u] = (rng.normal(0, 0.1, shape) if "mean" in u.rsplit("/", 1)[-1]
                      else rng.uniform(0.5, 1.5, shape)).astype(np.float32)
    legacy.assign(weights)
