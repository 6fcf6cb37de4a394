"""The adapter that lets the parity harness judge train_tf1.py against modern_train.py, by capture.

    python compare/run.py --pair examples.split_towers.adapter [--quick] [--towers 3]

train_tf1.py builds its graph, opens its session and trains in one function, `train()`: there is no
function to call for its graph.  `CapturedLegacy` runs the program as it is (under legacy.run_tf1)
to its first training step and takes its graph there; everything the checks need is found in it
(compare/capture.py).  This adapter only says how to point the program at the harness's files.
"""
import os
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from compare.capture import CapturedLegacy
from compare.interface import Batch, DataFiles, ModernBuild, Pair, StepResult
from examples.split_towers import modern_train

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_tf1.py")
ROWS_PER_TOWER = 8


class Data:
    """TFRecords of 32x32 images and labels (the programs' format), and batches as the model sees them."""

    def write(self, folder: str, towers: int, seed: int) -> dict[str, str]:
        return self.write_rows(folder, 6 * ROWS_PER_TOWER * towers, seed)

    def write_rows(self, folder: str, rows: int, seed: int) -> dict[str, str]:
        rng = np.random.RandomState(seed)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "train-00000.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            images, labels = rng.randint(0, 256, (rows, 32, 32, 3)).astype(np.uint8), rng.randint(0, 10, rows)
            for image, label in zip(images, labels):
                features = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
        return {"train": path}

    def batch(self, rows: int, seed: int) -> Batch:
        rng = np.random.RandomState(seed)
        x = rng.uniform(-1, 1, (rows, 32, 32, 3)).astype(np.float32)
        return Batch(x, rng.randint(0, 10, rows).astype(np.int32))


def files_argv(towers: int, files: DataFiles) -> list[str]:
    return ["--data_dir", os.path.dirname(files["train"]), "--train_dir", files["scratch"]]


class Modern:
    replica_flag = "--num_gpus"

    def parse_args(self, argv: Sequence[str]) -> Any:
        return modern_train.parse_args(argv)

    def input_pipeline(self, flags: Any, num_replicas: int, files: DataFiles) -> Any:
        return modern_train.make_dataset(os.path.dirname(files["train"]), flags.batch_size, flags.min_after_dequeue, 1)

    def build(self, flags: Any, strategy: Any, files: DataFiles) -> ModernBuild:
        model, optimizer = modern_train.build(flags, strategy)
        step = modern_train.make_train_step(model, optimizer, strategy, flags)

        def distribute(batch: Batch) -> Any:
            dataset = tf.data.Dataset.from_tensors((batch.x, batch.y))
            return next(iter(strategy.experimental_distribute_dataset(dataset)))

        return ModernBuild(model=model, optimizer=optimizer, train_step=lambda e: StepResult(*step(e)),
                           distribute=distribute, dataset=lambda: self.input_pipeline(flags, 0, files))


PAIR = Pair(
    name="split_towers", legacy=CapturedLegacy(PROGRAM, files_argv, tower_flag="--num_gpus", pipeline_steps=6),
    modern=Modern(), data=Data(), capabilities=frozenset({"pipelines"}),
    harness_argv=lambda towers: ("--batch_size", str(ROWS_PER_TOWER * towers), "--num_preprocess_threads", "1",
                                 "--min_after_dequeue", "40"),
    own_flags=("train_dir",), rows_per_tower=ROWS_PER_TOWER, free_steps=8, quick_free_steps=4,
    loop_flags={"max_steps": "the training loop's step limit",
                "data_dir": "which files the programs read (the harness gives both the same files)",
                "num_preprocess_threads": "how many threads read the input (not what they read)",
                "min_after_dequeue": "the shuffle buffer's size: it changes the order of rows only "
                                     "statistically, which a few steps of the pipeline cannot show"},
    description="examples/split_towers: a TF1 program as found (tf.split towers, RMSProp, clipping, label "
                "smoothing), captured as it runs, vs its Keras 3 port",
    module=__name__,
)
