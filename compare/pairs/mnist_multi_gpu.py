"""The adapter of the MNIST pair: `legacy/mnist_multi_gpu.py` (the book's towers: 784-500-10, l2 per tower
scope, exponential decay, SGD, moving averages) against `modern/mnist_multi_gpu.py` (MirroredStrategy).

Both sides are built by the programs' own functions (`compare.programs.Programs` names the modules,
so `--program modern_mnist=...` judges another module written the same way):

  legacy  get_input (the towers read the iterator's get_next(); the harness's rows are fed in their
          place), build_train_graph, towers.session_config; mnist_eval.evaluate_checkpoint
  modern  build_model, make_optimizer, make_moving_average, make_train_step (which returns the
          gradients it applied), get_input / same_batch_on_every_replica and cluster.distribute
          (the input path its loop runs), evaluate_averaged

Two pairings, each judged by every check:
  original    the legacy program as it runs (one get_input() batch on every tower, the moving
              average unordered with the update) against modern --same_batch_per_replica;
  deviation   legacy --per_tower_batches --ordered_ema against the modern default.
"""
from __future__ import annotations

import argparse

import os
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from compare.interface import Batch, LegacyGraph, LegacyPipeline, ModernBuild, Pair, Pairing, StepResult, TowerFeed
from compare.interface import DataFiles
from legacy import towers as legacy_towers
from modern import cluster
from compare.programs import Programs
from modern.checkpoints import write_tf1_checkpoint
from records import mnist as mnist_records

tf1 = tf.compat.v1
NAME = "mnist"
BATCH = 16          # rows per tower (the original's 100, smaller for speed)
TRAIN_ROWS = 12 * BATCH  # 10 epochs = 120 batches: whole steps for 1, 2, 3, 4 towers


class Data:
    """MNIST TFRecords in the original's format (records.mnist) and raw-pixel batches (0..255, sparse)."""

    def write(self, folder: str, towers: int, seed: int) -> dict[str, str]:
        return self.write_rows(folder, TRAIN_ROWS, seed)

    def write_rows(self, folder: str, train_rows: int, seed: int) -> dict[str, str]:
        os.makedirs(folder, exist_ok=True)
        rng = np.random.RandomState(seed)
        files = {}
        for split, rows in (("train", train_rows), ("eval", 200)):
            images = rng.randint(0, 256, size=(rows, 784)) * (rng.rand(rows, 784) < 0.15)
            labels = rng.randint(0, 10, size=rows)
            files[split] = os.path.join(folder, f"mnist_{split}.tfrecords")
            mnist_records.write_tfrecords(files[split], images, labels)
        return files

    def batch(self, rows: int, seed: int) -> Batch:
        rng = np.random.RandomState(seed)
        x = (rng.randint(0, 256, size=(rows, 784)) * (rng.rand(rows, 784) < 0.15)).astype(np.float32)
        return Batch(x, rng.randint(0, 10, size=rows).astype(np.int32))


class Legacy:
    tower_flag = "--towers"

    def __init__(self, programs: Programs) -> None:
        self.programs = programs

    def parse_args(self, argv: Sequence[str]) -> argparse.Namespace:
        return self.programs.legacy_mnist.parse_args(argv)

    def session_config(self, flags: argparse.Namespace, towers: int) -> Any:
        return legacy_towers.session_config(towers)

    def input_pipeline(self, flags: argparse.Namespace, towers: int, files: DataFiles) -> LegacyPipeline:
        return LegacyPipeline(train=self.inputs(flags, towers, files, distinct=True))

    def inputs(self, flags: argparse.Namespace, towers: int, files: DataFiles, distinct: bool = False) -> list[Any]:
        """The towers' inputs as the program's train() makes them: one get_input() for every tower, or
        one per tower (--per_tower_batches); `distinct`: each get_next() once."""
        if flags.per_tower_batches:
            return self.programs.legacy_mnist.get_input(files["train"], flags.batch_size, num_batches=towers)
        return self.programs.legacy_mnist.get_input(files["train"], flags.batch_size) * (1 if distinct else towers)

    def build(self, flags: argparse.Namespace, towers: int, files: DataFiles) -> LegacyGraph:
        program = self.programs.legacy_mnist
        b = flags.batch_size
        with tf1.device("/cpu:0"):  # as the program's train(): simple ops on the CPU, the towers on theirs
            inputs = self.inputs(flags, towers, files)
            ns = program.build_train_graph(
                inputs, regularization_rate=flags.regularization_rate, learning_rate_base=flags.learning_rate_base,
                learning_rate_decay=flags.learning_rate_decay, decay_steps=60000 / b,
                moving_average_decay=flags.moving_average_decay, ordered_ema=flags.ordered_ema)
        graph = tf1.get_default_graph()
        logits = [graph.get_tensor_by_name(f"GPU_{i}/layer2/add:0") for i in range(towers)]

        def feed(batch: Batch, training: bool) -> TowerFeed:
            if not flags.per_tower_batches:  # the towers read one get_next(): feed it the whole batch
                x, y = inputs[0]
                return TowerFeed({x: batch.x, y: batch.y}, [np.arange(batch.rows)] * towers, [1 / towers] * towers)
            # Each tower's get_next() takes up to batch_size rows of the stream, in order.
            rows = [np.arange(min(i * b, batch.rows), min((i + 1) * b, batch.rows)) for i in range(towers)]
            feed_dict = {}
            for (x, y), r in zip(inputs, rows):
                feed_dict[x], feed_dict[y] = batch.x[r], batch.y[r]
            return TowerFeed(feed_dict, rows, [1 / towers] * towers)

        distinct = inputs if flags.per_tower_batches else inputs[:1]
        return LegacyGraph(feed=feed, tower_logits=logits, tower_losses=ns.tower_losses,
                           loss=tf1.add_n(ns.tower_losses) / towers, grads_and_vars=ns.grads, train_op=ns.train_op,
                           global_step=ns.global_step, learning_rate=ns.learning_rate,
                           moving_averages=ns.variable_averages, pipeline=LegacyPipeline(train=distinct))

    def evaluate(self, flags: argparse.Namespace, checkpoint_path: str, files: DataFiles) -> dict[str, float]:
        """The legacy evaluator's accuracy of the checkpoint's moving averages (its own decay flag)."""
        images, labels = mnist_records.load_tfrecords(files["eval"])
        decay = self.programs.legacy_mnist_eval.parse_args([]).moving_average_decay
        _, accuracy = self.programs.legacy_mnist_eval.evaluate_checkpoint(
            images.astype(np.float32), labels, os.path.dirname(checkpoint_path), decay)
        return {"accuracy": accuracy}


class Modern:
    replica_flag = "--towers"

    def __init__(self, programs: Programs) -> None:
        self.programs = programs

    def parse_args(self, argv: Sequence[str]) -> argparse.Namespace:
        return self.programs.modern_mnist.parse_args(argv)

    def input_pipeline(self, flags: argparse.Namespace, num_replicas: int, files: DataFiles) -> Any:
        return self.programs.modern_mnist.get_input(files["train"], flags.batch_size, num_replicas,
                                                    flags.same_batch_per_replica)

    def build(self, flags: argparse.Namespace, strategy: Any, files: DataFiles) -> ModernBuild:
        program = self.programs.modern_mnist
        n = strategy.num_replicas_in_sync
        model = program.build_model(flags.regularization_rate)
        optimizer = program.make_optimizer(flags.learning_rate_base, 60000 / flags.batch_size,
                                           flags.learning_rate_decay)
        optimizer.build(model.trainable_variables)
        ema, shadows = program.make_moving_average(model, optimizer, flags.moving_average_decay)
        same = flags.same_batch_per_replica

        def dataset() -> Any:
            return self.input_pipeline(flags, n, files)

        spec = cluster.distribute(strategy, None, dataset()).element_spec
        train_step = program.make_train_step(model, optimizer, strategy, ema, return_grads=True, element_spec=spec)

        def step(element: Any) -> StepResult:
            loss, grads = train_step(element)
            return StepResult(loss, grads)

        def distribute(batch: Batch) -> Any:
            ds = tf.data.Dataset.from_tensors((batch.x, batch.y))
            if same:
                ds = ds.map(lambda x, y: program.same_batch_on_every_replica(x, y, n))
            return next(iter(cluster.distribute(strategy, None, ds)))

        names = {program.legacy_name(v): v for v in model.trainable_variables}

        def evaluate(checkpoint_path: str) -> dict[str, float]:
            reader = tf.train.load_checkpoint(checkpoint_path)
            for name, shadow in shadows.items():
                shadow.assign(reader.get_tensor(f"{name}/ExponentialMovingAverage"))
            return {"accuracy": program.evaluate_averaged(shadows, files["eval"], flags.regularization_rate)}

        def load_tf1(path: str) -> None:
            reader = tf.train.load_checkpoint(path)
            for name, v in names.items():
                v.assign(reader.get_tensor(name))

        def save_tf1(path: str) -> str:
            return write_tf1_checkpoint({name: v.numpy() for name, v in names.items()}, path)

        return ModernBuild(model=model, optimizer=optimizer, train_step=step, distribute=distribute,
                           variables=names, shadows=shadows, dataset=dataset, evaluate=evaluate,
                           load_tf1=load_tf1, save_tf1=save_tf1, trace=train_step.get_concrete_function)


def make_pair(programs: Programs) -> Pair:
    """The pair, its sides driving the modules `programs` names."""
    return Pair(
        name=NAME, legacy=Legacy(programs), modern=Modern(programs), data=Data(),
        capabilities=frozenset({"pipelines", "moving_averages", "evaluation", "checkpoint_converter", "shuffle"}),
        pairings=(Pairing("original", modern_argv=("--same_batch_per_replica",), same_rows_on_every_tower=True),
                  Pairing("deviation", legacy_argv=("--per_tower_batches", "--ordered_ema"))),
        harness_argv=lambda towers: ("--batch_size", str(BATCH)),
        own_flags=("model_save_path",),
        rows_per_tower=BATCH, free_steps=10, quick_free_steps=4,
        # More rows than both programs' shuffle buffer (the constant 10000), so that its size shows.
        shuffle_rows=12000, shuffle_argv=("--batch_size", "100"),
        loop_flags={"training_steps": "the training loop's step limit", "model_name": "the checkpoint files' name",
                    "data_path": "which file the program reads (the harness gives both programs the same file)",
                    "seed": "seeds the programs' random generators (the harness sets both programs' rows and state)"},
        flag_values=(("--batch_size", "37", "--learning_rate_base", "0.2", "--learning_rate_decay", "0.5",
                      "--regularization_rate", "0.01", "--max_steps", "7", "--moving_average_decay", "0.9"),),
        description="legacy/mnist_multi_gpu.py (the book's towers) vs modern/mnist_multi_gpu.py",
        module=__name__,
    )


PAIR = make_pair(Programs.load())
