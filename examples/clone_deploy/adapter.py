"""The adapter that lets the parity harness judge train_tf1.py against modern_train.py, by capture.

    python compare/run.py --pair examples.clone_deploy.adapter [--quick] [--towers 3]

train_tf1.py trains through `slim.learning.train`, whose Supervisor finalizes the graph: `CapturedLegacy`
runs the program as it is (under legacy.run_tf1) to its first training step and takes its graph there,
the finalize recorded, not applied.  Everything the checks need is found in that graph: the clones'
losses and the weight of each in the summed gradients (1: model_deploy's clones already divide their
losses by the clone count), the prefetch queue each clone dequeues from, the dropout that is on in
every run, RMSProp.  This adapter only says how to point the program at the harness's files.
"""
import os
from typing import Any, Sequence

import tensorflow as tf

from compare.capture import CapturedLegacy
from compare.interface import Batch, DataFiles, ModernBuild, Pair, StepResult
from examples.clone_deploy import modern_train
from examples.split_towers.adapter import Data as TFRecordImages

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_tf1.py")
ROWS_PER_TOWER = 8


class Data(TFRecordImages):
    """The split_towers pair's files (TFRecords of 32x32x3 uint8 images and int64 labels, the format
    both programs read): rows for six steps of every clone."""

    def write(self, folder: str, towers: int, seed: int) -> dict[str, str]:
        return self.write_rows(folder, 6 * ROWS_PER_TOWER * towers, seed)


def files_argv(towers: int, files: DataFiles) -> list[str]:
    return ["--dataset_dir", os.path.dirname(files["train"]), "--train_dir", files["scratch"]]


class Modern:
    replica_flag = "--num_clones"

    def parse_args(self, argv: Sequence[str]) -> Any:
        return modern_train.parse_args(argv)

    def input_pipeline(self, flags: Any, num_replicas: int, files: DataFiles) -> Any:
        return modern_train.make_dataset(os.path.dirname(files["train"]), flags.batch_size * max(num_replicas, 1), 1)

    def build(self, flags: Any, strategy: Any, files: DataFiles) -> ModernBuild:
        model, optimizer = modern_train.build(flags, strategy)
        step = modern_train.make_train_step(model, optimizer, strategy, flags)

        def distribute(batch: Batch) -> Any:
            dataset = tf.data.Dataset.from_tensors((batch.x, batch.y))
            return next(iter(strategy.experimental_distribute_dataset(dataset)))

        return ModernBuild(model=model, optimizer=optimizer, train_step=lambda e: StepResult(*step(e)),
                           distribute=distribute,
                           dataset=lambda: self.input_pipeline(flags, strategy.num_replicas_in_sync, files))


PAIR = Pair(
    name="clone_deploy", legacy=CapturedLegacy(PROGRAM, files_argv, tower_flag="--num_clones", pipeline_steps=6),
    modern=Modern(), data=Data(), capabilities=frozenset({"pipelines"}),
    harness_argv=lambda towers: ("--batch_size", str(ROWS_PER_TOWER), "--num_preprocessing_threads", "1"),
    own_flags=("train_dir",), rows_per_tower=ROWS_PER_TOWER, free_steps=8, quick_free_steps=4,
    loop_flags={"max_number_of_steps": "the training loop's step limit",
                "dataset_dir": "which files the programs read (the harness gives both the same files)",
                "num_preprocessing_threads": "how many threads batch the input (not what they read)"},
    description="examples/clone_deploy: a TF1 program in TF-Slim's model_deploy style (clones' losses divided and "
                "summed, regularisation on clone 0, always-on dropout, a static-batch prefetch queue, "
                "slim.learning.train), captured as it runs, vs its Keras 3 port",
    module=__name__,
)
