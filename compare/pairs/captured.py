"""A pair made of two program files, with no adapter: both captured as they run.

    python compare/run.py --legacy train_tf1.py --modern train_tf2.py [--towers N] -- --data_dir DIR ...

`program_pair` makes the Pair the harness judges: the TF1 program as `compare.capture.CapturedLegacy`
runs it, the port as `compare.port_capture.CapturedPort` runs it, both with the arguments given after
`--` (the same for both: a data folder, small batch sizes), each with its tower (replica) count flag,
found among the flags it parses (`TOWER_FLAGS`, first found) or named.

The rows both sides get come from the TF1 program's own input pipeline (`ProgramRows`): the feed of its
first training step (placeholders), or its queues and iterators read for a few steps in a session of
the harness's own on the captured graph (queue runners started and stopped).  A batch of more rows
than those reads gave repeats them, each repeat moved by a hundredth of the rows' own spread (a
float input), so that no two rows are the same.  The towers get as many rows each as the program's
first step gives them.

Flags both programs accept and that name files or folders (`PATH_LIKE`) keep each program's own value
(outputs; a data folder given after `--` is the same for both anyway); the flags check reports
them, and the flags named with `--loop`, as loop flags.
"""
from __future__ import annotations

import argparse
import re
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from compare import limits
from compare.capture import (CaptureError, CapturedLegacy, fed_tensors, iterator_initializers,
                             parse_flags, quiet_tensorflow)
from compare.checks.basics import legacy_batches, started_pipeline
from compare.interface import Batch, DataFiles, LegacyGraph, Pair, Pairing
from compare.port_capture import CapturedPort, port_environment

tf1 = tf.compat.v1

TOWER_FLAGS = ("num_gpus", "num_towers", "num_replicas", "num_clones", "towers", "replicas", "gpus", "num_devices")
PATH_LIKE = re.compile(r"(dir|path|file|folder|logdir|checkpoint|ckpt)s?$")
READ_STEPS, READ_ROWS = 8, 256  # how much of a queue or iterator pipeline the rows are read from


def tower_flag(flags: argparse.Namespace, named: Optional[str], program: str, option: str) -> str:
    """`--NAME` of the program's tower count: `named`, else the first of TOWER_FLAGS it parses."""
    if named:
        name = named.lstrip("-")
        if name not in vars(flags):
            raise CaptureError(f"{program} parses no flag {name} ({option}); it parses "
                               f"{', '.join(sorted(k for k in vars(flags) if not k.startswith('_'))) or 'none'}")
        return f"--{name}"
    found = next((name for name in TOWER_FLAGS if name in vars(flags)), None)
    if found is None:
        raise CaptureError(f"{program} parses none of {', '.join(TOWER_FLAGS)}: name its tower count flag "
                           f"with {option}")
    return f"--{found}"


class ProgramLegacy(CapturedLegacy):
    """The TF1 program captured with no file arguments of the harness's; the first build also sets
    the pair's rows per tower to what the program's first step gives a tower."""
    pair: Optional[Pair] = None
    sized = False  # the pair's rows per tower set, by the first build

    def build(self, flags: argparse.Namespace, towers: int, files: DataFiles) -> LegacyGraph:
        built = super().build(flags, towers, files)
        if self.pair is not None and not self.sized:
            self.sized = True
            rows = first_tower_rows(self, built)
            if rows:
                self.pair.rows_per_tower = rows
        return built


def first_tower_rows(side: CapturedLegacy, built: LegacyGraph) -> Optional[int]:
    """The rows the program's first tower gets a step: what the feed gives it of the rows the first
    step fed (over its tf.split parts, or its slice of them), or its source's static batch size over
    its tf.split parts; None where neither says."""
    if not side.inputs or side.captured is None:
        return None
    first = side.inputs[0]
    fed_x, fed_y = fed_value(side.captured.feed, first.x), fed_value(side.captured.feed, first.y)
    if fed_x is not None and fed_y is not None:
        sources = len(dict.fromkeys(t.x for t in side.inputs))
        return len(built.feed(Batch(np.concatenate([fed_x] * sources), np.concatenate([fed_y] * sources)),
                              True).rows[0])
    rows = first.x.shape[0] if first.x.shape.rank else None
    return int(rows) // first.parts if rows else None


def fed_value(feed: Any, tensor: Any) -> Optional[np.ndarray]:
    """The value a Session.run feed gives `tensor` (keyed by the tensor, its name or its op's), or None."""
    value = fed_tensors(tensor.graph, feed).get(tensor)
    return None if value is None else np.asarray(value)


class ProgramRows:
    """The pair's DataSpec: no files of the harness's (the programs read the data their arguments
    name); rows from the TF1 program's own input pipeline, read once."""

    def __init__(self, legacy: CapturedLegacy):
        self.legacy = legacy
        self.pool: Optional[tuple[np.ndarray, np.ndarray]] = None

    def write(self, folder: str, towers: int, seed: int) -> dict[str, str]:
        return {}

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        if self.pool is None:
            self.pool = read_rows(self.legacy)
        return self.pool

    def batch(self, rows: int, seed: int) -> Batch:
        x, y = self.rows()
        order = np.random.RandomState(seed).permutation(len(x))
        take = np.resize(order, rows)
        bx, by = x[take], y[take]
        repeat = np.arange(rows) >= len(x)
        if repeat.any() and np.issubdtype(bx.dtype, np.floating):
            spread = x.std(axis=0, keepdims=True) + 1e-6
            noise = np.random.RandomState(seed + 1).normal(size=bx[repeat].shape) * spread / 100
            bx[repeat] = (bx[repeat] + noise).astype(bx.dtype)
        return Batch(bx, by)


def read_rows(side: CapturedLegacy) -> tuple[np.ndarray, np.ndarray]:
    """The rows the program's towers receive: its first step's feed (placeholders), or a few steps
    of its queues or iterators."""
    if side.captured is None or not side.inputs:
        raise CaptureError("the TF1 program's input rows were not found: no rows for the harness to give both sides")
    sources = list(dict.fromkeys((t.x, t.y) for t in side.inputs))
    fed = [(fed_value(side.captured.feed, x), fed_value(side.captured.feed, y)) for x, y in sources]
    if all(x is not None and y is not None for x, y in fed):
        return np.concatenate([x for x, _ in fed]), np.concatenate([y for _, y in fed])
    graph = side.captured.graph
    with graph.as_default():
        initializers = [tf1.tables_initializer(), *iterator_initializers(graph)]
    with limits.phase(f"reading the input rows of {side.program} through its pipeline"), quiet_tensorflow(), \
            started_pipeline(graph, side.captured.config, initializers) as sess:
        got = legacy_batches(sess, sources, (), 1, steps=READ_STEPS, rows=READ_ROWS)
    if not got:
        raise CaptureError("the TF1 program's input pipeline gave no rows in a session of the harness's")
    return np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])


def program_pair(legacy_program: str, modern_program: str, argv: Sequence[str] = (),
                 tower_flag_name: Optional[str] = None, replica_flag_name: Optional[str] = None,
                 loop: Sequence[str] = (), seconds: Optional[float] = None, legacy_argv: Sequence[str] = (),
                 modern_argv: Sequence[str] = (), log: Any = lambda _: None) -> Pair:
    """The Pair of two program files, judged with `argv` given to both, and `legacy_argv`, `modern_argv`
    to each alone (see the module docstring)."""
    legacy_flags = parse_flags(legacy_program, [*argv, *legacy_argv])
    modern_flags = parse_flags(modern_program, [*argv, *modern_argv], environment=lambda p: port_environment(p, log))
    towers = tower_flag(legacy_flags, tower_flag_name, legacy_program, "--tower_flag")
    replicas = tower_flag(modern_flags, replica_flag_name, modern_program, "--replica_flag")
    legacy = ProgramLegacy(legacy_program, lambda towers, files: [], tower_flag=towers, pipeline_steps=READ_STEPS,
                           log=log, seconds=seconds)
    modern = CapturedPort(modern_program, replicas, seconds=seconds, log=log)
    shared = sorted(set(k for k in vars(legacy_flags) if not k.startswith("_"))
                    & set(k for k in vars(modern_flags) if not k.startswith("_")))
    own = tuple(k for k in shared if PATH_LIKE.search(k))
    loop_flags = {k: "named with --loop" for k in loop}
    loop_flags.update({k: "names files or folders, which each program keeps its own of" for k in own})
    loop_flags.update({k.lstrip("-"): "the tower and replica count, which the harness sets"
                       for k in {towers, replicas}})
    pair = Pair(name="programs", legacy=legacy, modern=modern, data=ProgramRows(legacy),
                capabilities=frozenset({"pipelines", "moving_averages"}),
                pairings=(Pairing(legacy_argv=tuple(legacy_argv), modern_argv=tuple(modern_argv),
                                  same_rows_on_every_tower=None),),
                harness_argv=lambda towers: tuple(argv), own_flags=own, loop_flags=loop_flags,
                description=f"{legacy_program} vs {modern_program}, both captured as they run")
    legacy.pair = pair
    return pair
