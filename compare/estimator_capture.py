"""What the harness takes of a tf.estimator program as it runs: its model_fn in EVAL mode, its evaluation.

A program that trains through `tf.estimator` builds its training graph inside `Estimator.train`
(`compare.capture` stops it there, as any other program), and its inference graph nowhere the
training graph shows: the Estimator calls the `model_fn` again, in EVAL mode, in a graph of its own,
when the program evaluates.  Two things are taken here, while the program runs under
`legacy.run_tf1` (its flags parsed, TF1 behaviour on, `tf.contrib` installed):

    `Watch`          while a capture runs: the Estimator whose `train` is running, and the features
                     and labels its `model_fn` was first called with in TRAIN mode; at the capture's
                     stop, `eval_graph` calls that Estimator's `model_fn` in EVAL mode on placeholders
                     of the same structure, in a graph of its own (`EvalGraph`), as
                     `Estimator.evaluate` would
    `inference_of`   that graph as the program's inference mode (`interface.LegacyInference`): its
                     towers' logits (each cross-entropy's first input) and the rows each takes

The program's own evaluation of a checkpoint (the program run again with `Estimator.train` skipped)
is `compare.capture.estimator_evaluation`, beside the other runs of a program.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator, Optional, Sequence
from unittest import mock

import numpy as np
import tensorflow as tf

from compare import tf1_graph
from compare.interface import Batch, LegacyInference, NotFed, TowerFeed

tf1 = tf.compat.v1
ESTIMATOR = "tensorflow_estimator.python.estimator.estimator"


def estimator_class() -> Any:
    """tensorflow-estimator's Estimator class (legacy/estimator_compat.py makes it import on TF 2.21)."""
    from legacy.run_tf1.estimator import load
    return load(ESTIMATOR).Estimator


@dataclasses.dataclass
class EvalGraph:
    """The program's model_fn in EVAL mode, in a graph of its own: the placeholders that stand for the
    features and labels (flattened), the training graph's tensors they stand for (the first TRAIN call's,
    in the same order), and the EVAL spec's loss; or, where the model_fn could not be called so, why."""
    graph: Any = None
    placeholders: Sequence[Any] = ()
    stands_for: Sequence[Any] = ()
    loss: Any = None
    error: str = ""


class Watch:
    """Patches `Estimator.train` and `Estimator._call_model_fn` for the duration of a capture: `running`
    is the Estimator whose train() is on the stack, `train_inputs` the (features, labels) its model_fn
    was first called with in TRAIN mode (replica 0's, under a MirroredStrategy)."""

    def __init__(self) -> None:
        self.running: list[Any] = []
        self.train_inputs: Optional[tuple[Any, Any]] = None

    @contextlib.contextmanager
    def patched(self) -> Iterator[Watch]:
        cls = estimator_class()
        train, call = cls.__dict__["train"], cls.__dict__["_call_model_fn"]

        def watched_train(estimator: Any, *args: Any, **kwargs: Any) -> Any:
            self.running.append(estimator)
            try:
                return train(estimator, *args, **kwargs)
            finally:
                self.running.pop()

        def watched_call(estimator: Any, features: Any, labels: Any, mode: Any, config: Any) -> Any:
            if self.running and mode == "train" and self.train_inputs is None:
                self.train_inputs = (features, labels)
            return call(estimator, features, labels, mode, config)

        with mock.patch.object(cls, "train", watched_train), mock.patch.object(cls, "_call_model_fn", watched_call):
            yield self

    def eval_graph(self, seed: int) -> Optional[EvalGraph]:
        """The running Estimator's model_fn in EVAL mode on placeholders (None: no Estimator is training)."""
        if not self.running:
            return None
        if self.train_inputs is None:
            return EvalGraph(error="the Estimator trains, but its model_fn was never called in TRAIN mode")
        try:
            return eval_graph(self.running[-1], *self.train_inputs, seed)
        except Exception as error:  # the program's model_fn, in a mode the capture chose: its failure is a reason
            return EvalGraph(error=f"its model_fn raised in EVAL mode ({type(error).__name__}: "
                                   f"{str(error).strip().splitlines()[0][:160] if str(error).strip() else ''})")


def eval_graph(estimator: Any, features: Any, labels: Any, seed: int) -> EvalGraph:
    """`estimator`'s model_fn in EVAL mode in a new graph, as `Estimator.evaluate` builds it (the global
    step first, the graph-level seed), on placeholders shaped as the TRAIN call's inputs, rows free."""
    graph = tf1.Graph()
    flat = tf.nest.flatten((features, labels))
    with graph.as_default():
        tf1.set_random_seed(seed)
        tf1.train.get_or_create_global_step()
        holders = [tf1.placeholder(t.dtype, [None, *t.shape.as_list()[1:]] if t.shape.rank else None,
                                   name=f"eval_input_{k}") for k, t in enumerate(flat)]
        eval_features, eval_labels = tf.nest.pack_sequence_as((features, labels), holders)
        spec = estimator._call_model_fn(eval_features, eval_labels, "eval", estimator.config)
    if spec.loss is None:
        return EvalGraph(error="its EVAL spec has no loss to find the logits by")
    return EvalGraph(graph, holders, flat, spec.loss)


def forward_xents(loss: Any) -> list[Any]:
    """The softmax cross-entropies the loss is computed from (its towers'), in the order of their names."""
    ops = [op for op in tf1_graph.ancestors([loss]) if op.type in tf1_graph.XENT and "gradients" not in op.name]
    return sorted(ops, key=lambda op: tf1_graph.natural(op.name))


def inference_of(evaluated: Optional[EvalGraph], images: Any, labels: Any) -> Optional[LegacyInference]:
    """The EVAL graph as the program's inference mode, its rows fed where the training graph's `images`
    and `labels` (tower 0's source) stood: each tower's logits (its cross-entropy's first input) and its
    rows (all of them, or its tf.split part).  None where the program trains no Estimator; a feed that
    raises NotFed (with why) where the EVAL graph could not be built or takes more than rows."""
    if evaluated is None:
        return None
    why = evaluated.error
    names = [t.name for t in evaluated.stands_for]
    if not why and (images.name not in names or labels.name not in names):
        why = "the model_fn's inputs are not the rows the towers read"
    elif not why and len(names) > 2:
        why = (f"its model_fn takes {len(names)} input tensors, not only rows and labels: the harness has no "
               f"values for the others")
    if why:
        def refuse(batch: Batch) -> TowerFeed:
            raise NotFed(f"the program's inference mode is its model_fn in EVAL mode, which the harness could not "
                         f"build: {why}")
        return LegacyInference(graph=evaluated.graph, tower_logits=[], feed=refuse, variables={})
    x = evaluated.placeholders[names.index(images.name)]
    y = evaluated.placeholders[names.index(labels.name)]
    xents = forward_xents(evaluated.loss)
    logits = [tf1_graph.logits_of(op.outputs[0]) for op in xents]
    try:
        parts = [tf1_graph.source_of(op.inputs[1]) for op in xents]
    except tf1_graph.Uncut as uncut:
        why_uncut = (f"the EVAL graph's towers take their rows through {uncut}, which the harness cannot cut a "
                     f"batch into")

        def uncut_feed(batch: Batch) -> TowerFeed:
            raise NotFed(why_uncut)
        return LegacyInference(graph=evaluated.graph, tower_logits=[], feed=uncut_feed, variables={})
    with evaluated.graph.as_default():
        variables = {v.op.name: v for v in tf1.global_variables()}

    def feed(batch: Batch) -> TowerFeed:
        rows = []
        for source, part, count, _ in parts:
            if source is not y:
                raise NotFed("the EVAL graph's towers take their labels from elsewhere than its input")
            if batch.rows % count:
                raise NotFed(f"the EVAL graph's towers cut {batch.rows} rows into {count} equal parts (tf.split): "
                             f"it cannot")
            share = batch.rows // count
            rows.append(np.arange(part * share, (part + 1) * share))
        return TowerFeed({x: batch.x, y: batch.y}, rows, [1.0 / len(parts)] * len(parts))

    return LegacyInference(graph=evaluated.graph, tower_logits=logits, feed=feed, variables=variables)
