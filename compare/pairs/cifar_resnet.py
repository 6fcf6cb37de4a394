"""The adapter of the CIFAR pair: `legacy/cifar_resnet.py` (two slim ResNet-v2-50 towers sliced by a fed
`current_batch_size`, Adam on piecewise_constant) against `modern/cifar_resnet.py` (MirroredStrategy).

Both sides are built by the programs' own functions (`compare.programs.Programs` names the modules,
so `--program legacy_cifar=...` judges another module written the same way):

  legacy  make_datasets, build_graph, make_feed, tower_split, session_config (the graph the trainer
          runs: control flow v2, its session config); validate, for the validation check
  modern  build (model and optimizer), make_train_step, make_eval_step, spread_short_batch and
          cluster.distribute (the input path the trainer feeds its step with), make_datasets,
          checkpoints.load_tf1_checkpoint / save_tf1_checkpoint, validate

Pairings: the original's split ('fix') with everything; --split=weighted (the port that loses no
rows, whose towers can be fed any rows at any weight) for the split checks.  This pair's own checks
(`extra_checks`): both programs' validation passes, whose known difference is predicted; the original's
bug under --split=static; the embedded and original size profiles.
"""
from __future__ import annotations

import argparse

import dataclasses
import functools
import os
import tempfile
from types import ModuleType
from typing import Any, Callable, Optional, Sequence, cast

import numpy as np
import tensorflow as tf

from compare.checks.splits import finite
from compare.interface import Batch, LegacyGraph, LegacyPipeline, ModernBuild, Pair, Pairing, StepResult, TowerFeed
from compare.interface import DataFiles
from compare.programs import Programs
from compare.report import Result, judge, tensor_error
from compare.settings import Settings
from compare.sides import Sides
from modern import checkpoints, cluster
from records import cifar10

tf1 = tf.compat.v1
NAME = "cifar"


class Data:
    """CIFAR-10 TFRecords in the programs' format (records.cifar10) and preprocessed-looking batches."""

    @staticmethod
    def sizes(towers: int) -> dict[str, int]:
        """Training batches of N + 2 rows over 3 (N + 2) + 1 rows, so that each epoch ends on ONE row
        (fewer than the towers, for N > 1); validation batches of N + 1 rows over 3 (N + 1) - 1, so
        that the last has N."""
        n = towers
        return {"batch_size": n + 2, "valid_batch_size": n + 1, "epochs": 2,
                "train": 3 * (n + 2) + 1, "valid": 3 * (n + 1) - 1}

    def write(self, folder: str, towers: int, seed: int) -> dict[str, str]:
        sizes = self.sizes(towers)
        return self.write_rows(folder, sizes["train"], seed, sizes["valid"])

    def write_rows(self, folder: str, rows: int, seed: int, valid_rows: int = 10) -> dict[str, str]:
        os.makedirs(folder, exist_ok=True)
        rng = np.random.RandomState(seed + 1)
        files = {}
        for split, count in (("train", rows), ("valid", valid_rows)):
            images = rng.randint(0, 256, size=(count, 32, 32, 3)).astype(np.uint8)
            labels = rng.randint(0, cifar10.NUM_CLASSES, size=count)
            files[split] = os.path.join(folder, f"{split}.tfrecords")
            cifar10.write_tfrecords(files[split], images, labels)
        return files

    def batch(self, rows: int, seed: int) -> Batch:
        rng = np.random.RandomState(seed)
        x = rng.uniform(-1, 1, size=(rows, 32, 32, 3)).astype(np.float32)
        return Batch(x, np.eye(cifar10.NUM_CLASSES, dtype=np.float32)[rng.randint(0, cifar10.NUM_CLASSES, rows)])


def harness_argv(towers: int, units_per_block: Optional[Sequence[int]] = None) -> tuple[str, ...]:
    s = Data.sizes(towers)
    units = ("--units_per_block", *map(str, units_per_block)) if units_per_block else ()
    return ("--batch_size", str(s["batch_size"]), "--valid_batch_size", str(s["valid_batch_size"]),
            "--epochs", str(s["epochs"]), *units)


@dataclasses.dataclass
class CifarGraph(LegacyGraph):
    """The LegacyGraph, with the program's own namespace and datasets (for this pair's own checks)."""
    ns: object = None
    data: tuple = ()


class Legacy:
    tower_flag = "--towers"

    def __init__(self, programs: Programs) -> None:
        self.programs = programs

    def parse_args(self, argv: Sequence[str]) -> argparse.Namespace:
        return self.programs.legacy_cifar.parse_args(argv)

    def session_config(self, flags: argparse.Namespace, towers: int) -> Any:
        return self.programs.legacy_cifar.session_config(towers)

    def input_pipeline(self, flags: argparse.Namespace, towers: int, files: DataFiles) -> LegacyPipeline:
        return self.pipeline(self.programs.legacy_cifar.make_datasets(
            [files["train"]], [files["valid"]], flags.batch_size, flags.valid_batch_size, flags.shuffle_buffer,
            flags.epochs))

    @staticmethod
    def pipeline(data: Any) -> LegacyPipeline:
        iterator, images, labels, val_iterator, val_images, val_labels = data
        return LegacyPipeline(train=[(images, labels)], initializer=[iterator.initializer],
                              valid=[(val_images, val_labels)], valid_initializer=[val_iterator.initializer])

    def build(self, flags: argparse.Namespace, towers: int, files: DataFiles) -> CifarGraph:
        program = self.programs.legacy_cifar
        data = program.make_datasets([files["train"]], [files["valid"]], flags.batch_size, flags.valid_batch_size,
                                     flags.shuffle_buffer, flags.epochs)
        ns = program.build_graph(num_towers=towers, split=flags.split,
                                 static_batch_size=max(1, flags.batch_size // towers),
                                 boundaries=flags.boundaries, values=flags.values,
                                 units_per_block=getattr(flags, "units_per_block", None))

        def feed(batch: Batch, training: bool) -> TowerFeed:
            keep = flags.keep_prob if training else 1.0
            feed_dict, _ = program.make_feed(ns, batch.x, batch.y, training, keep)
            cut = program.tower_split(ns, batch.rows)
            rows = [np.arange(s, s + n) for s, n in zip(cut.starts, cut.sizes)]
            weights = [0.0 if i in cut.padded else w for i, w in enumerate(cut.weights)]
            return TowerFeed(feed_dict, rows, weights, program.describe_split(0, cut, flags.split) or "")

        feed_towers = None
        if flags.split == "weighted":
            def feed_towers(batch: Batch, rows: Sequence[np.ndarray], weights: Sequence[float],
                            training: bool) -> dict:
                feed_dict, _ = program.make_feed(ns, batch.x, batch.y, training, flags.keep_prob if training else 1.0)
                starts, sizes = [], []
                for r in rows:
                    r = np.asarray(r, int)
                    if len(r) and not np.array_equal(r, np.arange(r[0], r[0] + len(r))):
                        raise ValueError("the weighted split feeds each tower a contiguous range of rows")
                    starts.append(int(r[0]) if len(r) else 0)
                    sizes.append(len(r))
                feed_dict.update({ns.tower_starts: starts, ns.tower_sizes: sizes, ns.tower_weights: list(weights)})
                return feed_dict

        return CifarGraph(
            feed=feed, tower_logits=ns.tower_logits, tower_losses=ns.tower_losses, loss=ns.total_loss,
            grads_and_vars=ns.grads, train_op=ns.train_step, global_step=ns.global_step,
            learning_rate=ns.learning_rate,
            pipeline=self.pipeline(data), feed_towers=feed_towers, ns=ns, data=data)


@dataclasses.dataclass
class CifarBuild(ModernBuild):
    """The ModernBuild, with the program's eval step (for the validation check) and the element_spec
    its steps are traced for."""
    eval_step: object = None
    strategy: object = None
    spec: object = None


def replica_batches(program: ModuleType, strategy: Any, x: np.ndarray, y: np.ndarray) -> Any:
    """One global batch through the modern program's input path: `spread_short_batch` on a dataset of
    global batches, then `cluster.distribute`, as `make_datasets` and `train` feed the trainer."""
    n = strategy.num_replicas_in_sync
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x)).map(
        lambda a, b: program.spread_short_batch(a, b, n))
    return cluster.distribute(strategy, None, dataset)


class Modern:
    replica_flag = "--towers"

    def __init__(self, programs: Programs) -> None:
        self.programs = programs

    def parse_args(self, argv: Sequence[str]) -> argparse.Namespace:
        return self.programs.modern_cifar.parse_args(argv)

    def input_pipeline(self, flags: argparse.Namespace, num_replicas: int, files: DataFiles) -> Any:
        return self.programs.modern_cifar.make_datasets([files["train"]], [files["valid"]], flags.batch_size,
                                                   flags.valid_batch_size, flags.shuffle_buffer, flags.epochs,
                                                   num_replicas=num_replicas)

    def build(self, flags: argparse.Namespace, strategy: Any, files: DataFiles) -> CifarBuild:
        program = self.programs.modern_cifar
        flags.model_dir = os.path.join(files["scratch"], "modern_model")  # empty: nothing to resume
        flags.pretrained = None
        model, optimizer, *_ = program.build(strategy, flags)
        x, y = Data().batch(3, 0).x, Data().batch(3, 0).y
        spec = replica_batches(program, strategy, x, y).element_spec  # no static row count: one trace for all
        train_step = program.make_train_step(model, optimizer, strategy, return_metrics=True, element_spec=spec)
        eval_step = program.make_eval_step(model, strategy, element_spec=spec)
        n = strategy.num_replicas_in_sync

        def datasets() -> Any:
            return self.input_pipeline(flags, n, files)

        return CifarBuild(
            model=model, optimizer=optimizer,
            train_step=lambda element: StepResult(train_step(element)[0]),
            distribute=lambda batch: next(iter(replica_batches(program, strategy, batch.x, batch.y))),
            variables=checkpoints.tf1_variable_map(model),
            dataset=lambda: datasets()[0], valid_dataset=lambda: datasets()[1],
            load_tf1=lambda path: checkpoints.load_tf1_checkpoint(model, path),
            save_tf1=lambda path: checkpoints.save_tf1_checkpoint(model, path),
            eval_step=eval_step, strategy=strategy, spec=spec,
            trace=lambda: (train_step.get_concrete_function(), eval_step.get_concrete_function()))


# ---------------------------------------------------------------------------------------------
# This pair's own checks

def extra_checks(programs: Programs, sides: Sides, settings: Settings, log: Callable[[str], None]) -> list[Result]:
    log("cifar: validation, the original's static split, the size profiles")
    return [check_validation(programs, sides), check_static_bug(programs, sides), check_profiles(programs)]


def check_validation(programs: Programs, sides: Sides) -> Result:
    """EXPECTED: both programs' `validate` on the same weights and TFRecords.

    Predictions from per-row inference results, for B rows per batch and N towers:
      legacy (quirk kept): mean over batches of the accuracy of tower 0's B // N rows, and of the
        LAST tower's mean loss (batches with fewer rows than towers skipped);
      modern: correct rows / all rows, summed cross-entropy / all rows."""
    legacy, modern, n = sides.legacy, sides.modern, sides.towers
    tol = sides.tol.model
    lg, build = cast(CifarGraph, legacy.lg), cast(CifarBuild, modern.build)
    ns, data = lg.ns, lg.data
    sides.set_both(sides.start)
    _, _, _, val_iterator, val_images, val_labels = data
    with tempfile.TemporaryDirectory() as events, legacy.graph.as_default():
        writer = tf1.summary.FileWriter(events)
        acc_l, loss_l = programs.legacy_cifar.validate(legacy.sess, ns, val_iterator, val_images, val_labels,
                                                       writer, 0, "fix")
        writer.close()
    assert build.valid_dataset is not None
    acc_m, loss_m = programs.modern_cifar.validate(build.eval_step, cluster.distribute(
        modern.strategy, None, build.valid_dataset()))
    legacy.sess.run(val_iterator.initializer)
    per_batch, hits, ces = [], [], []
    while True:
        try:
            x, y = legacy.sess.run([val_images, val_labels])
        except tf.errors.OutOfRangeError:
            break
        full = modern.predict(x)
        b = len(x) // n
        if b > 0:
            feed, _ = legacy.feed(Batch(x, y), False)
            logits = np.concatenate(legacy.sess.run(list(legacy.lg.tower_logits), feed))
            right = np.argmax(logits, 1) == np.argmax(y[:len(logits)], 1)
            ce = tf.nn.softmax_cross_entropy_with_logits(labels=y[:len(logits)], logits=logits).numpy()
            per_batch.append((np.mean(right[:b]), np.mean(ce[-b:])))
        hits += list(np.argmax(full, 1) == np.argmax(y, 1))
        ces += list(tf.nn.softmax_cross_entropy_with_logits(labels=y, logits=full).numpy())
    pred_l = np.mean(per_batch, axis=0)
    errors = [tensor_error("legacy Valid_Acc", acc_l, pred_l[0]), tensor_error("legacy Valid_Loss", loss_l, pred_l[1]),
              tensor_error("modern accuracy", acc_m, np.mean(hits)), tensor_error("modern loss", loss_m, np.mean(ces))]
    differs = abs(pred_l[0] - np.mean(hits)) > 0 or abs(pred_l[1] - np.mean(ces)) > 1e-4
    return judge("validation (validate)", NAME, errors, tol, expected=True,
                 ok=differs and all(e.rel_l2 <= tol.rel_l2 for e in errors),
                 note=f"legacy {acc_l:.4f} / {loss_l:.4f} (mean of per-batch tower-0 accuracy, last-tower loss), "
                      f"modern {acc_m:.4f} / {loss_m:.4f} (over all {len(hits)} rows)")


def check_static_bug(programs: Programs, sides: Sides) -> Result:
    """The original's bug: a constant per-tower size b on a batch of b rows leaves towers 1..N-1 empty."""
    n, b = sides.towers, sides.pair.rows_per_tower
    if n == 1:
        return judge("split: --split=static (the original's bug)", NAME, [], "exact", ok=True,
                     note="one tower: the constant split is the whole batch")
    legacy = sides.legacy
    batch = sides.batch(b, seed=9)
    legacy.restore(sides.start)
    ns = cast(CifarGraph, legacy.lg).ns
    feed, _ = programs.legacy_cifar.make_feed(ns, batch.x, batch.y, True, legacy.flags.keep_prob, split="static",
                                              static_batch_size=b)
    failed, how = [], set()
    for i, loss in enumerate(legacy.lg.tower_losses):
        try:
            if not np.isfinite(legacy.sess.run(loss, feed)):
                failed.append(i)
                how.add("NaN")
        except tf.errors.InvalidArgumentError:
            failed.append(i)
            how.add("oneDNN error")
    predicted = [i for i in range(n) if i * b >= b]
    sides.set_both(sides.start)
    step = sides.modern.step(batch, before=sides.start)
    return judge("split: --split=static (the original's bug)", NAME, [], "exact", expected=True,
                 ok=failed == predicted and finite(step),
                 note=f"{b} rows, constant {b} per tower: legacy towers {failed} failed ({', '.join(sorted(how))}), "
                      f"predicted {predicted} (i * {b} >= {b}); "
                      f"modern rows {step.rows}, finite")


def check_profiles(programs: Programs) -> Result:
    """Both programs' embedded-data and original size profiles are the same."""
    differ = [key for key in ("EMBEDDED_PROFILE", "ORIGINAL_PROFILE")
              if getattr(programs.legacy_cifar, key) != getattr(programs.modern_cifar, key)]
    return judge("size profiles (embedded, original)", NAME, [], "exact", ok=not differ,
                 note="differ: " + ", ".join(differ) if differ else
                 f"embedded {programs.legacy_cifar.EMBEDDED_PROFILE}, "
                 f"original {programs.legacy_cifar.ORIGINAL_PROFILE}")


def make_pair(programs: Programs, units_per_block: Optional[Sequence[int]] = None) -> Pair:
    """The pair, its sides driving the modules `programs` names; with `units_per_block`, both programs
    build ResNet-v2 with that many units in blocks 1-4 (their --units_per_block: the test suite's
    smaller network, through the programs' own code; default ResNet-v2-50's 3 4 6 3)."""
    return Pair(
        name=NAME, legacy=Legacy(programs), modern=Modern(programs), data=Data(),
        capabilities=frozenset({"pipelines", "checkpoint_converter", "tf1_runtime", "shuffle"}),
        pairings=(Pairing(""), Pairing("--split=weighted", legacy_argv=("--split", "weighted"), groups=("splits",),
                                       quick=False)),
        harness_argv=functools.partial(harness_argv, units_per_block=units_per_block),
        own_flags=("model_dir", "log_dir"),
        # 8 rows per tower: batch norm at block4's 1x1 maps normalises over a tower's rows only; with 2
        # rows the training loss amplifies float32 round-off past 1e-1 on either program alone.
        rows_per_tower=8, free_steps=20, quick_free_steps=0,
        flag_values=(("--boundaries", "3", "7", "--values", "0.002", "0.0005", "0.0001", "--keep_prob", "0.5",
                      "--batch_size", "5", "--valid_batch_size", "3", "--epochs", "3", "--shuffle_buffer", "1",
                      "--valid_every", "7"),),
        shuffle_rows=400, shuffle_argv=("--shuffle_buffer", "40", "--batch_size", "8", "--epochs", "2"),
        loop_flags={"max_steps": "the training loop's step limit", "log_every": "the training loop's log interval",
                    "valid_every": "the training loop's validation interval",
                    "data_dir": "which files the program reads (the harness gives both programs the same files)",
                    "train_tfrecords": "which files the program reads",
                    "test_tfrecords": "which files the program reads",
                    "pretrained": "the checkpoint restored before the first step (the harness sets both programs' "
                                  "state)",
                    "units_per_block": "the network's size, for tests: the harness judges the programs at the size "
                                       "given (the test suite builds both at 1 1 1 1)"},
        extra_checks=functools.partial(extra_checks, programs),
        description="legacy/cifar_resnet.py (slim ResNet-v2-50 towers) vs modern/cifar_resnet.py",
        module=__name__,
    )


PAIR = make_pair(Programs.load())
