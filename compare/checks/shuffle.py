"""The training pipelines as the programs run them: their own shuffle, over two epochs.

Each side's pipeline (LegacySide.input_pipeline, ModernSide.input_pipeline) reads a training file of
`Pair.shuffle_rows` rows (DataSpec.write_rows), once with shuffling off (which gives each row's index
in the file) and once as the program builds it, for two epochs.  The two sides draw their
permutations from different seeds, so the orders are not compared row for row; their statistics are,
each with a bound a correct port stays inside and a wrong shuffle does not:

  epoch 1 a permutation   every row once before the second epoch starts (shuffle before repeat): the
                          same on both sides.  Legacy towers that take their batches from one pipeline
                          in one session run take them in an order TF1 does not fix: there the epoch's
                          end is known to within that step's rows (every row read once by the end of
                          the step that ends the epoch, none twice before it)
  displacement            each row's position in epoch 1 minus its index in the file: the two
                          distributions alike (two-sample Kolmogorov-Smirnov at alpha 1e-6).  A buffer
                          ten times smaller moves rows ten times less.
  neighbours kept         the fraction of consecutive rows of epoch 1 that are neighbours in the file:
                          alike within 5 sigma.  A shuffle after batching keeps each batch's rows together.
  epochs alike            the fraction of positions holding the same row in both epochs: alike within
                          5 sigma.  Without reshuffling every position does.
"""
from __future__ import annotations

import math
import os
from typing import NamedTuple
from typing import Any, Sequence
from typing import Callable

import numpy as np
import tensorflow as tf

from compare.checks.basics import legacy_batches, modern_batches, shuffle_off
from compare.report import TensorError, Tolerance, judge, not_applicable
from compare.interface import DataFiles
from compare.interface import optional, undeclared
from compare.report import Result
from compare.sides import Sides, row_key

tf1 = tf.compat.v1
Row = tuple[np.ndarray, np.ndarray]  # one row's input and label
ALPHA = 1e-6
SIGMAS = 5


def legacy_rows(sides: Sides, flags: Any, files: DataFiles, rows: int, shuffled: bool = True
                ) -> tuple[list[Row], int]:
    """At least `rows` of the legacy pipeline's rows, in order, from a graph of their own; and the rows
    of one session run (the towers' batches of one step, in an order TF1 does not fix)."""
    graph = tf1.Graph()
    with graph.as_default():
        if shuffled:
            tf1.set_random_seed(sides.seed + 11)
            pipeline = required(sides.pair.legacy, "input_pipeline")(flags, sides.towers, files)
        else:
            with shuffle_off():
                pipeline = required(sides.pair.legacy, "input_pipeline")(flags, sides.towers, files)
    with tf1.Session(graph=graph) as sess:
        batches = legacy_batches(sess, pipeline.train, pipeline.initializer, 1, rows=rows)
    unordered = len(batches[0][0]) if batches and len(pipeline.train) > 1 else 1
    return [row for x, y, _ in batches for row in zip(x, y)], unordered


def modern_rows(sides: Sides, flags: Any, files: DataFiles, rows: int, shuffled: bool = True
                ) -> tuple[list[Row], int]:
    """At least `rows` of the modern pipeline's rows, in order (and 1: the order is the dataset's)."""
    n = sides.towers
    if shuffled:
        dataset = required(sides.pair.modern, "input_pipeline")(flags, n, files)
    else:
        with shuffle_off():
            dataset = required(sides.pair.modern, "input_pipeline")(flags, n, files)
    dataset = dataset[0] if isinstance(dataset, tuple) else dataset  # (train, valid): the training one
    copies = sides.towers if sides.pairing.same_rows_on_every_tower else 1  # one batch tiled for every replica
    return [row for x, y, w in modern_batches(dataset, rows=rows * copies)
            for row in list(zip(x, y))[:len(x) // copies]], 1


def required(side: object, method: str) -> Callable[..., Any]:
    """An optional method the check's capability requires (checked by check_shuffle)."""
    found = optional(side, method)
    if found is None:
        raise AttributeError(f"{type(side).__name__} has no {method}")
    return found


def keys(rows: Sequence[Row]) -> list[bytes]:
    return [row_key(x, y) for x, y in rows]


class ShuffleStats(NamedTuple):
    """One side's shuffle, as the module docstring defines its statistics."""
    permutation: bool          # epoch 1 holds every row once
    displacement: np.ndarray   # each row's position in epoch 1 minus its index in the file
    neighbours: float          # the fraction of consecutive rows of epoch 1 that are neighbours in the file
    alike: float               # the fraction of positions holding the same row in both epochs


def statistics(stream: list[bytes], index: dict[bytes, int], rows: int, unordered: int = 1) -> ShuffleStats:
    """The statistics of two epochs of a stream of row keys, `index` giving each row's place in the
    file; the stream's order known to within runs of `unordered` rows (the permutation test then
    holds to the epoch's end within that run)."""
    first = [index.get(k, -1) for k in stream[:rows]]
    second = [index.get(k, -1) for k in stream[rows:2 * rows]]
    before = rows - rows % unordered  # the rows before the run that holds the epoch's end
    through = [index.get(k, -1) for k in stream[:before + (unordered if before < rows else 0)]]
    permutation = len(set(first[:before])) == before and set(range(rows)) <= set(through)
    displacement = np.array([p - i for p, i in enumerate(first)], np.float64)
    neighbours = float(np.mean([abs(a - b) == 1 for a, b in zip(first, first[1:])]))
    alike = float(np.mean([a == b for a, b in zip(first, second)])) if len(second) == rows else float("nan")
    return ShuffleStats(permutation, displacement, neighbours, alike)


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    values = np.sort(np.concatenate([a, b]))
    cdf_a = np.searchsorted(np.sort(a), values, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), values, side="right") / len(b)
    return float(np.max(np.abs(cdf_a - cdf_b)))


def check_shuffle(sides: Sides) -> Result:
    name = f"{sides.label}shuffled pipelines (two epochs)"
    pair = sides.pair
    write_rows = optional(pair.data, "write_rows")
    if ("shuffle" not in pair.capabilities or optional(pair.legacy, "input_pipeline") is None
            or optional(pair.modern, "input_pipeline") is None or write_rows is None):
        return not_applicable(name, pair.name, undeclared(pair, "shuffled pipelines", "shuffle"))
    rows = pair.shuffle_rows
    files = dict(write_rows(os.path.join(sides.tmp_dir, f"{pair.name}_shuffle"), rows, sides.seed))
    argv = (*pair.harness_argv(sides.towers), *pair.shuffle_argv)
    legacy_flags = pair.legacy.parse_args([pair.legacy.tower_flag, str(sides.towers), *argv,
                                           *sides.pairing.legacy_argv])
    modern_flags = pair.modern.parse_args([pair.modern.replica_flag, str(sides.towers), *argv,
                                           *sides.pairing.modern_argv])
    out = {}
    for side, read, flags in (("legacy", legacy_rows, legacy_flags), ("modern", modern_rows, modern_flags)):
        # Each row's place in the file: its first appearance (the towers of the step that ends the
        # epoch may take their batches in any order, rows of the second epoch among them).
        order = list(dict.fromkeys(keys(read(sides, flags, files, rows, shuffled=False)[0])))[:rows]
        index = {k: i for i, k in enumerate(order)}
        read_rows, unordered = read(sides, flags, files, 2 * rows)
        stream = keys(read_rows)
        if len(index) != rows or len(stream) < 2 * rows:
            return judge(name, pair.name, [], "exact", ok=False,
                         note=f"{side}: {len(index)} distinct rows in file order, {len(stream)} rows in the stream "
                              f"(two epochs of {rows} needed)")
        out[side] = statistics(stream, index, rows, unordered)
    (perm_l, disp_l, nb_l, alike_l), (perm_m, disp_m, nb_m, alike_m) = out["legacy"], out["modern"]
    d = ks_statistic(disp_l, disp_m)
    d_crit = math.sqrt(-math.log(ALPHA / 2) / 2) * math.sqrt(2 / rows)

    def binomial(a: float, b: float) -> float:
        p = max((a + b) / 2, 1 / rows)
        return abs(a - b) / (SIGMAS * math.sqrt(2 * p * (1 - p) / rows))

    errors = [TensorError("epoch 1 a permutation (legacy, modern)", float(perm_l), float(perm_m),
                          0.0 if perm_l == perm_m else math.inf),
              TensorError("displacement in epoch 1: KS statistic over its alpha 1e-6 bound", d, d_crit, d / d_crit),
              TensorError("neighbours kept: |legacy - modern| over 5 sigma", abs(nb_l - nb_m), nb_l,
                          binomial(nb_l, nb_m)),
              TensorError("epochs alike: |legacy - modern| over 5 sigma", abs(alike_l - alike_m), alike_l,
                          binomial(alike_l, alike_m))]
    spread = lambda disp: f"{np.mean(np.abs(disp)):.0f}"  # noqa: E731
    tolerance = Tolerance("sampling", 1.0, "each statistic over its bound: the KS statistic over its critical value "
                                           "at alpha 1e-6, the fractions' difference over 5 binomial sigma")
    return judge(name, pair.name, errors, tolerance,
                 note=f"{rows} rows, two epochs each: mean |displacement| legacy {spread(disp_l)} "
                      f"/ modern {spread(disp_m)} "
                      f"rows, neighbours kept {nb_l:.3f} / {nb_m:.3f}, epochs alike {alike_l:.3f} / {alike_m:.3f}, "
                      f"epoch 1 a permutation {perm_l} / {perm_m}")
