"""The adapter that lets the parity harness judge `cifar10_multi_gpu_train.py` against `modern_train.py`.

    python compare/run.py --pair examples.cifar10_tutorial.adapter [--quick] [--towers 3]

It is the template docs/judging-your-own-port.md walks through: a data spec (files in the programs'
format, batches in the model's input domain), one class per side that builds the program with the
program's own functions and names the few tensors only its author knows, and the PAIR that ties them
together with the capabilities the two programs have.  No line of either program is changed for it.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from compare.interface import (Batch, DataFiles, LegacyGraph, LegacyPipeline, ModernBuild, NotFed, Pair, Pairing,
                               StepResult, TowerFeed)
from examples.cifar10_tutorial import cifar10_input
from examples.cifar10_tutorial import cifar10_multi_gpu_train as legacy_program
from examples.cifar10_tutorial import modern_train as modern_program
from legacy import towers as legacy_towers
from modern import cluster

tf1 = tf.compat.v1
ROWS_PER_TOWER = 8  # the harness's --batch_size for both programs (the tutorial's 128, smaller for speed)


class Data:
    """Files in the CIFAR-10 binary format, and batches as the network receives them (24x24, standardised)."""

    def write(self, folder: str, towers: int, seed: int) -> DataFiles:
        return self.write_rows(folder, 3 * ROWS_PER_TOWER * towers + 3, seed)

    def write_rows(self, folder: str, train_rows: int, seed: int) -> DataFiles:
        rng = np.random.RandomState(seed)
        files = {}
        for split, rows in (("train", train_rows), ("eval", 5 * ROWS_PER_TOWER)):
            images = rng.randint(0, 256, size=(rows, 32, 32, 3)).astype(np.uint8)
            files[split] = cifar10_input.write_binary(os.path.join(folder, f"{split}.bin"), images,
                                                      rng.randint(0, 10, size=rows))
        return files

    def batch(self, rows: int, seed: int) -> Batch:
        rng = np.random.RandomState(seed)
        size = cifar10_input.IMAGE_SIZE
        return Batch(rng.normal(size=(rows, size, size, 3)).astype(np.float32),
                     rng.randint(0, 10, size=rows).astype(np.int32))


class Legacy:
    """cifar10_multi_gpu_train.py: its towers each take the next batch of one stream (get_next())."""
    tower_flag = "--num_gpus"

    def parse_args(self, argv: Sequence[str]) -> argparse.Namespace:
        return legacy_program.parse_args(argv)

    def session_config(self, flags: argparse.Namespace, towers: int) -> Any:
        return legacy_towers.session_config(towers)

    def input_pipeline(self, flags: argparse.Namespace, towers: int, files: DataFiles) -> LegacyPipeline:
        return LegacyPipeline(train=legacy_program.tower_inputs([files["train"]], flags.batch_size, towers,
                                                                flags.distort))

    def build(self, flags: argparse.Namespace, towers: int, files: DataFiles) -> LegacyGraph:
        with tf1.device("/cpu:0"):  # as the program's train()
            inputs = legacy_program.tower_inputs([files["train"]], flags.batch_size, towers, flags.distort)
            g = legacy_program.build_graph(inputs, flags.batch_size, cifar10_input.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN)
        graph = tf1.get_default_graph()
        # The logits: tf.add(..., name=scope.name) in each tower's softmax_linear scope.
        logits = [graph.get_tensor_by_name(f"tower_{i}/softmax_linear/softmax_linear:0") for i in range(towers)]
        b = flags.batch_size

        def feed(batch, training):
            # Each tower's get_next() is fed its own rows in place of the stream's next batch.
            if batch.rows != b * towers:
                raise NotFed(f"the towers take full batches of {b} rows only (the input drops the remainder and "
                             f"local3 reshapes to [batch_size, -1]): {batch.rows} rows never reach them")
            feed_dict, rows = {}, []
            for i, (images, labels) in enumerate(inputs):
                r = np.arange(i * b, (i + 1) * b)
                feed_dict[images], feed_dict[labels] = batch.x[r], batch.y[r]
                rows.append(r)
            return TowerFeed(feed_dict, rows, [1 / towers] * towers)

        return LegacyGraph(feed=feed, tower_logits=logits, tower_losses=g.tower_losses,
                           loss=tf.add_n(g.tower_losses) / towers, grads_and_vars=g.grads, train_op=g.train_op,
                           global_step=g.global_step, learning_rate=g.lr, moving_averages=g.variable_averages,
                           pipeline=LegacyPipeline(train=inputs, steps=12))

    def evaluate(self, flags: argparse.Namespace, checkpoint_path: str, files: DataFiles) -> dict[str, float]:
        num = cifar10_input.count_records([files["eval"]])
        return {"precision@1": legacy_program.evaluate_checkpoint(checkpoint_path, [files["eval"]], flags.batch_size,
                                                                  num)}


class Modern:
    """modern_train.py: the same network in Keras 3, under MirroredStrategy."""
    replica_flag = "--num_gpus"

    def parse_args(self, argv: Sequence[str]) -> argparse.Namespace:
        return modern_program.parse_args(argv)

    def input_pipeline(self, flags: argparse.Namespace, num_replicas: int, files: DataFiles) -> Any:
        return modern_program.train_dataset([files["train"]], flags.batch_size, num_replicas, flags.distort)

    def build(self, flags: argparse.Namespace, strategy: Any, files: DataFiles) -> ModernBuild:
        model, optimizer, ema, shadows, _ = modern_program.build(strategy, flags)
        n = strategy.num_replicas_in_sync

        def dataset():
            return self.input_pipeline(flags, n, files)

        spec = cluster.distribute(strategy, None, dataset()).element_spec
        step = modern_program.make_train_step(model, optimizer, strategy, ema, return_grads=True, element_spec=spec)

        def distribute(batch):  # the program's input path: global batches cut by cluster.distribute
            return next(iter(cluster.distribute(strategy, None, tf.data.Dataset.from_tensors((batch.x, batch.y)))))

        def evaluate(checkpoint_path):
            reader = tf.train.load_checkpoint(checkpoint_path)
            values = {name: reader.get_tensor(f"{name}/ExponentialMovingAverage") for name in shadows}
            num = cifar10_input.count_records([files["eval"]])
            return {"precision@1": modern_program.evaluate_averaged(values, [files["eval"]], flags.batch_size, num)}

        def load_tf1(path):
            reader = tf.train.load_checkpoint(path)
            for name, v in modern_program.tf1_names(model).items():
                v.assign(reader.get_tensor(name))

        return ModernBuild(model=model, optimizer=optimizer, train_step=lambda e: StepResult(*step(e)),
                           distribute=distribute, shadows=shadows, dataset=dataset, evaluate=evaluate,
                           load_tf1=load_tf1, save_tf1=lambda path: modern_program.save_tf1(model, {}, path))


PAIR = Pair(
    name="tutorial", legacy=Legacy(), modern=Modern(), data=Data(),
    capabilities=frozenset({"pipelines", "moving_averages", "evaluation", "checkpoint_converter", "tf1_runtime",
                            "shuffle"}),
    pairings=(Pairing(""),),
    # Full batches of ROWS_PER_TOWER per tower; the random distortions off (they cannot be matched row
    # for row), so that the pipelines are compared batch for batch.
    harness_argv=lambda towers: ("--batch_size", str(ROWS_PER_TOWER), "--no-distort"),
    own_flags=("train_dir",),
    rows_per_tower=ROWS_PER_TOWER, free_steps=10, quick_free_steps=4,
    flag_values=(("--batch_size", "32", "--max_steps", "7", "--distort"),),
    # More rows than both programs' shuffle buffer (40% of an epoch, the constant 20000).
    shuffle_rows=22000, shuffle_argv=("--batch_size", "100"),
    loop_flags={"max_steps": "the training loop's step limit", "eval": "evaluates a checkpoint instead of training",
                "data_dir": "which files the program reads (the harness gives both programs the same files)"},
    description="examples/cifar10_tutorial: the classic multi-GPU tutorial's style vs its Keras port",
    module=__name__,
)
