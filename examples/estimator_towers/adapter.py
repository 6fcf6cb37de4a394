"""The adapter that lets the parity harness judge train_tf1.py against modern_train.py, by capture.

    python compare/run.py --pair examples.estimator_towers.adapter [--quick] [--towers 3]

train_tf1.py trains through `tf.estimator`: its graph exists only inside `Estimator.train`, built from
its `model_fn` once per replica of its MirroredStrategy (the pairing "mirrored"), once per tower of
`replicate_model_fn` ("replicate"), or with towers of its own inside the model_fn ("towers").
`CapturedLegacy` runs the program as it is (under legacy.run_tf1) to its first training step inside
the Estimator's session and takes its graph there; the replicas, their rows (one batch of the
input_fn's dataset each, or a tf.split shard) and how their gradients join are found in it
(compare/capture.py), and its model_fn in EVAL mode is its inference graph
(compare/estimator_capture.py).  Its evaluation is the program's own: run again with training skipped,
its `Estimator.evaluate` evaluates the harness's checkpoint (`compare.capture.estimator_evaluation`).
This adapter only says where the files are, and gives the port's functions.
"""
import os
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from compare.capture import CapturedLegacy
from compare.interface import Batch, DataFiles, ModernBuild, Pair, Pairing, StepResult
from examples.estimator_towers import modern_train

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_tf1.py")
ROWS_PER_TOWER = 8
IMAGE_SIZE = modern_train.IMAGE_SIZE
# Evaluation in batches every tower count up to 4 divides (replicate_model_fn's EVAL mode splits each
# batch into equal shards, as in training: a batch it cannot split fails), and rows a whole number of them.
EVAL_BATCH, EVAL_ROWS = 12, 120


def write_records(path: str, images: np.ndarray, labels: np.ndarray) -> str:
    """TFRecords of the programs' format: raw uint8 image bytes and an int64 label per record."""
    with tf.io.TFRecordWriter(path) as writer:
        for image, label in zip(images, labels):
            features = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return path


def learnable_rows(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Images whose class k brightens rows k..k+3 of the image, over dark noise: learnable in a few steps."""
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, modern_train.NUM_CLASSES, rows)
    images = rng.randint(0, 60, (rows, IMAGE_SIZE, IMAGE_SIZE, 3)).astype(np.uint8)
    for k in range(modern_train.NUM_CLASSES):
        images[labels == k, k:k + 4] += 150
    return images, labels


class Data:
    """train-00000.tfrecord and eval-00000.tfrecord, and batches as the model sees them."""

    def write(self, folder: str, towers: int, seed: int) -> dict[str, str]:
        os.makedirs(folder, exist_ok=True)
        train = write_records(os.path.join(folder, "train-00000.tfrecord"),
                              *learnable_rows(6 * ROWS_PER_TOWER * towers, seed))
        valid = write_records(os.path.join(folder, "eval-00000.tfrecord"), *learnable_rows(EVAL_ROWS, seed + 1))
        return {"train": train, "eval": valid}

    def batch(self, rows: int, seed: int) -> Batch:
        rng = np.random.RandomState(seed)
        x = rng.uniform(-1, 1, (rows, IMAGE_SIZE, IMAGE_SIZE, 3)).astype(np.float32)
        return Batch(x, rng.randint(0, modern_train.NUM_CLASSES, rows).astype(np.int32))


def files_argv(towers: int, files: DataFiles) -> list[str]:
    return ["--data_dir", os.path.dirname(files["train"]), "--model_dir", files["scratch"]]


class Modern:
    replica_flag = "--num_gpus"

    def parse_args(self, argv: Sequence[str]) -> Any:
        return modern_train.parse_args(argv)

    def build(self, flags: Any, strategy: Any, files: DataFiles) -> ModernBuild:
        flags.data_dir = os.path.dirname(files["train"])
        model, optimizer = modern_train.build(flags, strategy)
        step = modern_train.make_train_step(model, optimizer, strategy, flags)

        def distribute(batch: Batch) -> Any:
            dataset = tf.data.Dataset.from_tensors((batch.x, batch.y))
            return next(iter(strategy.experimental_distribute_dataset(dataset)))

        def evaluate(path: str) -> dict[str, float]:
            return modern_train.evaluate(model, flags, modern_train.load_tf1(model, path))

        return ModernBuild(model=model, optimizer=optimizer, train_step=lambda e: StepResult(*step(e)),
                           distribute=distribute, variables=modern_train.tf1_names(model),
                           dataset=lambda: modern_train.make_dataset(flags.data_dir, flags.batch_size,
                                                                     flags.shuffle_buffer),
                           evaluate=evaluate, load_tf1=lambda path: modern_train.load_tf1(model, path),
                           save_tf1=lambda path: modern_train.save_tf1(model, path))


PAIR = Pair(
    name="estimator", legacy=CapturedLegacy(PROGRAM, files_argv, tower_flag="--num_gpus", pipeline_steps=6),
    modern=Modern(), data=Data(), capabilities=frozenset({"pipelines", "evaluation", "checkpoint_converter"}),
    pairings=(Pairing(label="mirrored"),
              Pairing(label="replicate", legacy_argv=("--multi_gpu", "replicate"),
                      modern_argv=("--multi_gpu", "replicate")),
              Pairing(label="towers", legacy_argv=("--multi_gpu", "towers"), modern_argv=("--multi_gpu", "towers"))),
    harness_argv=lambda towers: ("--batch_size", str(ROWS_PER_TOWER * towers), "--shuffle_buffer", "1",
                                 "--eval_batch_size", str(EVAL_BATCH)),
    own_flags=("model_dir",), rows_per_tower=ROWS_PER_TOWER, free_steps=8, quick_free_steps=4,
    flag_values=(("--boundaries", "500,800", "--decay_rates", "1,0.5,0.1", "--learning_rate", "0.05",
                  "--momentum", "0.8", "--weight_decay", "1e-3"),),
    loop_flags={"train_steps": "the training loop's step limit",
                "batch_size": "the rows a step takes (the harness gives both programs the same batches)",
                "multi_gpu": "the multi-GPU form, which the pairings judge apart (at the one tower the flags "
                             "check builds, every form is one model_fn on the whole batch)",
                "loss_reduction": "replicate_model_fn's reduction of the towers' losses, judged by the pairings' "
                                  "steps (at one tower, SUM and MEAN are the same)",
                "data_dir": "which files the programs read (the harness gives both the same files)",
                "eval_batch_size": "how many evaluation rows a batch holds (not which, nor the metrics)",
                "shuffle_buffer": "the shuffle buffer's size: it changes the order of rows only statistically, "
                                  "which a few steps of the pipeline cannot show"},
    description="examples/estimator_towers: a tf.estimator program (MirroredStrategy replicas; replicate_model_fn "
                "towers; towers by hand in the model_fn), captured inside Estimator.train, vs its Keras 3 port",
    module=__name__,
)
