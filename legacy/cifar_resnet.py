"""The faithful TF1 two-tower CIFAR-10 ResNet-v2-50 trainer, on TensorFlow 2.21 through `tf.compat.v1`.

Run it (from the repository root)::

    python legacy/cifar_resnet.py                                  # embedded synthetic data, minutes on 2 CPUs
    python -m records.cifar10 --src cifar-10-batches-py --out data/cifar10
    python legacy/cifar_resnet.py --data_dir data/cifar10          # real CIFAR-10, the original's settings
    python legacy/cifar_resnet.py --data_dir data/cifar10 --pretrained resnet_v2_50.ckpt
    python legacy/cifar_resnet.py --split=static                   # watch the original's NaN bug

What it reproduces: the training-with-validation program of the blog post on NaN losses in multi-GPU training
("tensorflow multi-GPU training gives loss nan"): slim `resnet_v2_50(num_classes=None)` under
`resnet_arg_scope`, a `Logits` head (squeeze, dropout, `fc`), one tower per GPU slicing the fed batch
as `inputs[i*current_batch_size:(i+1)*current_batch_size]`, variables shared by `reuse_variables`,
per-tower `compute_gradients`, `average_gradients`, Adam on a `piecewise_constant` learning rate, the
batch-norm update ops run before `apply_gradients`, validation every 100 steps over the whole
validation set, the best model saved by validation accuracy, a final save.  The sections below follow
the original's order: parameters, data, placeholders, learning rate, optimizer, towers, averaging,
summaries, restore, session loop.

Defaults are the original's constants (2 towers, batch 256, validation batch 256, shuffle buffer
50000, 200 epochs, boundaries [10000, 25000], values [0.001, 0.0001, 0.00001], keep_prob 0.6, a
line every 10 steps, validation every 100), each a flag.  One exception, the *embedded default
profile*: when no data is given (no --data_dir / --train_tfrecords) the program trains on a small
synthetic CIFAR-shaped set (`records.cifar10.make_synthetic`, 997 training and 250 validation
images) and, unless set on the command line, uses batch_size 16, valid_batch_size 50 and 8 epochs
(504 steps) instead of 256, 256 and 200 (`records.cifar10.EMBEDDED_PROFILE`), so that the run ends in
minutes on 2 CPU cores with enough steps for the batch-norm moving
averages (decay 0.997) to settle before the last validation; the log says which values differ.  On
real data every default is the original's.

The original's quirks are kept and marked "Quirk kept": training images go through
`preprocess_for_test` (no augmentation); the logged loss is the LAST tower's; the accuracy is tower
0's; validation accuracy is the mean of per-batch accuracies.  Deviations, each marked "Port:":
--split=weighted (loses no rows); a NaN loss stops training with an error (except under
--split=static, where it is the point); a batch with fewer rows than towers, which leaves every
tower empty under the original's split, is logged and skipped; a step limit; a missing pretrained
checkpoint means training from scratch (with a log line), and a present one is checked for names and
shapes first; grappler off on CPU towers (--grappler); the folders are made (the original's os.mkdir
failed without ./logs); the original's CUDA_VISIBLE_DEVICES = "0, 1" is left to the user; the graph
runs on TF2's runtime unless --tf1_behavior; --units_per_block builds a smaller ResNet-v2 for tests
(slim's own builder, the same scopes and names); the final checkpoint is numbered by the steps run;
the log lines are in English and add examples/sec and an ETA.

On a machine without GPUs each tower runs on its own virtual CPU device (`legacy/towers.py`).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import types
import warnings
from typing import Any, NamedTuple, Optional, Sequence

# The original pinned os.environ["CUDA_VISIBLE_DEVICES"] = "0, 1"; the port leaves the GPUs to the user
# and places towers with towers.tower_devices (GPUs, shared round robin when fewer than towers;
# virtual CPU devices without any).

import numpy as np
from numpy.typing import ArrayLike

from legacy import towers  # installs the tf-slim compatibility alias first
from legacy.towers import average_gradients  # the original: from prepared_functions import ...
from legacy.runtime import UsageError, check_writable, run_main
from records.usage import ArgumentParser, at_least, fraction
import tensorflow.compat.v1 as tf
import tf_slim as slim
from tf_slim import nets  # the original: tensorflow.contrib.slim.nets
from records import cifar10
from records.progress import progress
from records.cifar10 import parser_tfrecords, preprocess_for_test  # were utils.*

"""
""net parameters (the original's constants; each is a flag below)
"""
num_gpus = 2
num_classes = cifar10.NUM_CLASSES
image_size = cifar10.IMAGE_SIZE
batch_size = 256
valid_batch_size = 256

shuffle_buffer = 50000
NUM_EPOCHS = 200
starter_learning_rate = 0.001  # defined but unused by the original (values[0] is the rate)
boundaries = [10000, 25000]
values = [0.001, 0.0001, 0.00001]
keep_prob_train = 0.6
log_every = 10
valid_every = 100
"""
""path parameters
"""
resnet_model_path = "./resnet_v2_50.ckpt"
models_dir = "./models/temporary"          # the original's saver path is models_dir/train-model.ckpt
logs_dir = "./logs/temporary"
tfrecords_dir = "./tfrecords/cifar10"      # the original's train.tfrecords / test.tfrecords folder

checkpoint_exclude_scopes = "Logits"

# The embedded default profile (used only when no data is given; see the module docstring).
EMBEDDED_DATA_DIR = cifar10.DEFAULT_DATA_DIR
EMBEDDED_PROFILE = cifar10.EMBEDDED_PROFILE  # batch_size 16, valid_batch_size 50, epochs 8
ORIGINAL_PROFILE = {"batch_size": batch_size, "valid_batch_size": valid_batch_size, "epochs": NUM_EPOCHS}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--towers", "--num_towers", "--num_gpus", dest="num_towers", type=at_least(1),
                   default=num_gpus, metavar="N",
                   help="towers (the original's num_gpus; one per GPU, shared when there are fewer GPUs, "
                        "virtual CPU devices without any)")
    cifar10.add_profile_flags(p, ORIGINAL_PROFILE, "rows fed per step, split across towers")
    p.add_argument("--max_steps", type=at_least(1), default=None,
                   help="Port: stop after this many steps (default: no limit, the epochs decide)")
    cifar10.add_schedule_flags(p, shuffle_buffer, boundaries, values)
    p.add_argument("--keep_prob", type=fraction(low_open=True), default=keep_prob_train,
                   help="dropout keep probability in training")
    p.add_argument("--split", choices=towers.SPLITS, default="fix",
                   help="fix: the original's current_batch_size = rows // towers; static: the bug it cured "
                        "(constant batch_size // towers, NaN on the short last batch); weighted: Port, "
                        "loses no rows, towers weighted by rows")
    p.add_argument("--data_dir", help=f"folder with train.tfrecords and test.tfrecords (default: the embedded "
                                      f"synthetic set; the original read {tfrecords_dir})")
    p.add_argument("--train_tfrecords", nargs="+",
                   help="training TFRecord files, instead of --data_dir's (default: --data_dir's train.tfrecords)")
    p.add_argument("--test_tfrecords", nargs="+",
                   help="validation TFRecord files, instead of --data_dir's (default: --data_dir's test.tfrecords)")
    p.add_argument("--pretrained", default=None,
                   help=f"slim resnet_v2_50 checkpoint to restore all but Logits from (default: "
                        f"{resnet_model_path} if present, as the original; else training from scratch)")
    p.add_argument("--model_dir", default=models_dir, help="best and final checkpoints")
    p.add_argument("--log_dir", default=logs_dir, help="event files (train/ and valid/)")
    p.add_argument("--grappler", choices=["auto", "on", "off"], default="auto",
                   help="TensorFlow's graph optimizer: on with GPU towers (as the original ran), off on CPU "
                        "towers (auto), where its start-up pass is long and gains nothing")
    p.add_argument("--log_every", type=at_least(1), default=log_every, help="a training line every N steps")
    p.add_argument("--valid_every", type=at_least(1), default=valid_every, help="validate every N steps")
    p.add_argument("--units_per_block", type=at_least(1), nargs=4, default=None, metavar="N",
                   help="Port, for quick tests only: units in blocks 1-4 of slim's resnet_v2 builder, under the "
                        "same scope and names (default: the original's resnet_v2_50, 3 4 6 3)")
    p.add_argument("--tf1_behavior", action="store_true",
                   help="run on TF1's runtime, as the original did: tf.compat.v1.disable_v2_behavior() "
                        "before the graph is built (ref variables, v1 control flow, no eager)")
    args = p.parse_args(argv)
    cifar10.check_schedule_flags(p, args)
    return args


"""
""Datasets
"""


class Pipelines(NamedTuple):
    """The original's two pipelines: each iterator and the batch it gives (labels one-hot)."""
    iterator: Any
    image_batch: Any
    label_batch: Any
    val_iterator: Any
    val_image_batch: Any
    val_label_batch: Any


def make_datasets(train_tfrecords: Sequence[str], test_tfrecords: Sequence[str], batch_size: int,
                  valid_batch_size: int, shuffle_buffer: int, num_epochs: int) -> Pipelines:
    """The original's two pipelines."""
    dataset = tf.data.TFRecordDataset(train_tfrecords)
    dataset = dataset.map(parser_tfrecords)
    # Quirk kept: the original preprocesses TRAINING images with preprocess_for_test (no augmentation).
    dataset = dataset.map(
        lambda image, label: (
            preprocess_for_test(image), label))

    dataset = dataset.shuffle(shuffle_buffer)
    dataset = dataset.batch(batch_size)
    dataset = dataset.repeat(num_epochs)  # batch before repeat: every epoch ends on a short batch
    iterator = tf.data.make_initializable_iterator(dataset)  # the original: dataset.make_initializable_iterator()
    image_batch, label_batch = iterator.get_next()
    label_batch = tf.one_hot(indices=tf.cast(label_batch, tf.int32), depth=num_classes)

    val_dataset = tf.data.TFRecordDataset(test_tfrecords)
    val_dataset = val_dataset.map(parser_tfrecords)
    val_dataset = val_dataset.map(
        lambda image, label: (
            preprocess_for_test(image), label))

    val_dataset = val_dataset.batch(valid_batch_size)
    val_iterator = tf.data.make_initializable_iterator(val_dataset)
    val_image_batch, val_label_batch = val_iterator.get_next()
    val_label_batch = tf.one_hot(indices=tf.cast(val_label_batch, tf.int32), depth=num_classes)
    return Pipelines(iterator, image_batch, label_batch, val_iterator, val_image_batch, val_label_batch)


"""
""The graph: placeholders, learning rate, optimizer, towers, averaging, summaries, restore list
"""


def build_graph(num_towers: int = num_gpus, split: str = "fix", static_batch_size: Optional[int] = None,
                boundaries: Sequence[int] = boundaries, values: Sequence[float] = values,
                num_classes: int = num_classes, image_size: int = image_size,
                devices: Optional[Sequence[str]] = None,
                units_per_block: Optional[Sequence[int]] = None) -> types.SimpleNamespace:
    """Build the original's training graph in the default graph; return its tensors by name.

    Call inside `with tf.Graph().as_default():`.  `split` decides how the fed batch reaches the
    towers (see `legacy/towers.py`): 'fix' is the original graph (`current_batch_size` a placeholder
    fed with rows // num_towers); 'static' makes `current_batch_size` the constant
    `static_batch_size` (the original's bug); 'weighted' (Port) slices with per-tower start/size
    placeholders and weights each tower's gradient by its share of the rows.
    `devices`: one device string per tower (default `towers.tower_devices(num_towers)`).
    `units_per_block`: Port, for quick tests: the units of blocks 1-4 (default: resnet_v2_50's).

    Returns a SimpleNamespace with the original's names (inputs, labels, keep_prob, is_training,
    current_batch_size, global_step, learning_rate, optimizer, tower_grads, grads, update_ops,
    train_step, loss, accuracy, summary_op, variables_to_restore) plus, for tests and the parity
    harness: tower_logits, tower_losses, pre_dropout and dropout_noise (per tower; feed a
    dropout_noise tensor uniform values to impose a dropout mask: a unit is kept where
    noise >= 1 - keep_prob), total_loss (the loss of the rows the towers saw: mean of the tower
    losses, or their row-weighted sum under 'weighted'), and under 'weighted' tower_starts,
    tower_sizes, tower_weights.
    """
    if split not in towers.SPLITS:
        raise towers.SplitError(f"unknown split {split!r}: choose one of {', '.join(towers.SPLITS)}")
    if split == "static" and not static_batch_size:
        raise towers.SplitError("split 'static' needs static_batch_size (the original used batch_size / 2)")
    devices = devices or towers.tower_devices(num_towers)
    g = types.SimpleNamespace(num_towers=num_towers, split=split, static_batch_size=static_batch_size,
                              devices=devices, tower_logits=[], tower_losses=[], pre_dropout=[],
                              dropout_noise=[], units_per_block=units_per_block)
    inputs, labels, keep_prob, is_training, current_batch_size = placeholders(
        g, split, static_batch_size, num_towers, image_size, num_classes)
    """
    ""Learning rate
    """
    global_step = tf.Variable(0, trainable=False)
    learning_rate = tf.train.piecewise_constant(global_step, boundaries, values)

    # optimizer
    optimizer = tf.train.AdamOptimizer(learning_rate=learning_rate)
    # the towers' gradients
    tower_grads = []

    with tf.variable_scope(tf.get_variable_scope()):
        for i in range(num_towers):
            with tf.device(devices[i]):
                # split the batch across the towers
                if split == "weighted":
                    begin, end = g.tower_starts[i], g.tower_starts[i] + g.tower_sizes[i]
                else:
                    begin, end = i * current_batch_size, (i + 1) * current_batch_size
                _inputs = inputs[begin:end]
                _labels = labels[begin:end]
                logits, loss = tower_loss(g, _inputs, _labels, is_training, keep_prob, num_classes)
                # the towers share the model's variables
                tf.get_variable_scope().reuse_variables()
                # compute this tower's gradients and keep them
                grads = optimizer.compute_gradients(loss)
                tower_grads.append(grads)
                g.tower_logits.append(logits)
                g.tower_losses.append(loss)

                if i == 0:
                    """
                    ""Accuracy (Quirk kept: tower 0's rows only)
                    """
                    correct_prediction = tf.equal(
                        tf.cast(tf.argmax(logits, 1), tf.int32), tf.cast(tf.argmax(_labels, 1), tf.int32))
                    accuracy = tf.reduce_mean(tf.cast(correct_prediction, tf.float32))
    """
    ""Optimizer
    """
    if split == "weighted":
        weights = tf.unstack(g.tower_weights)
        grads = towers.weighted_average_gradients(tower_grads, weights)
        g.total_loss = tf.add_n([w * l for w, l in zip(weights, g.tower_losses)])
    else:
        grads = average_gradients(tower_grads)
        g.total_loss = tf.add_n(g.tower_losses) / num_towers
    # Both towers' batch-norm updates are here, and they update the SAME moving mean/variance
    # variables: each applies moving -= (1 - decay) * (moving - its batch statistic), N times a step.
    update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
    with tf.control_dependencies(update_ops):
        train_step = optimizer.apply_gradients(grads, global_step)
    """
    ""Summary
    """
    tf.summary.scalar("lr", learning_rate)
    tf.summary.scalar("accuracy", accuracy)
    tf.summary.scalar("loss", loss)  # Quirk kept: `loss` is the LAST tower's loss
    summary_op = tf.summary.merge_all()
    variables_to_restore, exclusions = restore_list()
    g.__dict__.update(
        inputs=inputs, labels=labels, keep_prob=keep_prob, is_training=is_training,
        current_batch_size=current_batch_size, global_step=global_step, learning_rate=learning_rate,
        optimizer=optimizer, tower_grads=tower_grads, grads=grads, update_ops=update_ops,
        train_step=train_step, loss=loss, accuracy=accuracy, summary_op=summary_op,
        variables_to_restore=variables_to_restore, exclusions=exclusions)
    return g


class Placeholders(NamedTuple):
    """The original's placeholders (current_batch_size a constant under --split=static)."""
    inputs: Any
    labels: Any
    keep_prob: Any
    is_training: Any
    current_batch_size: Any


def placeholders(g: types.SimpleNamespace, split: str, static_batch_size: Optional[int], num_towers: int,
                 image_size: int, num_classes: int) -> Placeholders:
    """The original's placeholders (inputs, labels, keep_prob, is_training, current_batch_size),
    with --split's variations: 'static' makes current_batch_size a constant, 'weighted' adds
    g.tower_starts, g.tower_sizes, g.tower_weights."""
    inputs = tf.placeholder(tf.float32, [None, image_size, image_size, 3], name="inputs")
    labels = tf.placeholder(tf.int32, [None, num_classes], name="labels")
    keep_prob = tf.placeholder(tf.float32, name="keep_prob")
    is_training = tf.placeholder(tf.bool, name="is_training")
    if split == "static":
        # The original's bug: the per-tower size is a constant (batch_size / 2), wrong on the short last batch.
        current_batch_size = tf.constant(static_batch_size, tf.int32, name="current_batch_size")
    else:
        current_batch_size = tf.placeholder(tf.int32, name="current_batch_size")
    if split == "weighted":
        # Port: --split=weighted.  Tower i gets rows [start_i, start_i + size_i) and weight size_i / rows.
        g.tower_starts = tf.placeholder(tf.int32, [num_towers], name="tower_starts")
        g.tower_sizes = tf.placeholder(tf.int32, [num_towers], name="tower_sizes")
        g.tower_weights = tf.placeholder(tf.float32, [num_towers], name="tower_weights")
    return Placeholders(inputs, labels, keep_prob, is_training, current_batch_size)


def restore_list() -> tuple[list[Any], Optional[list[str]]]:
    """ Restore resnet50: the model variables outside checkpoint_exclude_scopes, and those scopes
    (the Saver is made by the caller)."""
    exclusions = None
    if checkpoint_exclude_scopes:
        exclusions = [
            scope.strip() for scope in checkpoint_exclude_scopes.split(",")]
    variables_to_restore = []
    for var in slim.get_model_variables():
        excluded = False
        for exclusion in exclusions:  # type: ignore[union-attr]  # None only if checkpoint_exclude_scopes were empty
            if var.op.name.startswith(exclusion):
                excluded = True
        if not excluded:
            variables_to_restore.append(var)
    return variables_to_restore, exclusions


def tower_loss(g: types.SimpleNamespace, inputs: Any, labels: Any, is_training: Any, keep_prob: Any,
               num_classes: int = num_classes) -> tuple[Any, Any]:
    """One tower: ResNet-v2-50 on the tower's rows, the dropout and fc head, the mean cross-entropy.

    The original's inline tower body (the `tower_loss` of TF's cifar10_multi_gpu_train), creating
    the same ops under the same names; records the tower's dropout input and noise in `g`.
    Returns (logits, loss).
    """
    """
    ""inference
    """
    with slim.arg_scope(nets.resnet_v2.resnet_arg_scope()):
        if g.units_per_block is None:
            net, end_points = nets.resnet_v2.resnet_v2_50(inputs, num_classes=None, is_training=is_training)
        else:  # Port: fewer units, slim's own builder, the same scope and names (--units_per_block)
            net, end_points = smaller_resnet_v2_50(inputs, g.units_per_block, is_training)
    with tf.variable_scope("Logits"):
        net = tf.squeeze(net, axis=[1, 2])
        g.pre_dropout.append(net)
        # slim.dropout's is_training defaults to True: the original switches dropout off
        # in validation by feeding keep_prob 1.
        net = slim.dropout(net, keep_prob=keep_prob, scope="scope")
        g.dropout_noise.append(_dropout_noise(tf.get_default_graph().get_name_scope()))
        logits = slim.fully_connected(net, num_outputs=num_classes,
                                      activation_fn=None, scope="fc")
    """
    ""Loss
    """
    losses = tf.nn.softmax_cross_entropy_with_logits_v2(logits=logits, labels=labels)
    return logits, tf.reduce_mean(losses)


def smaller_resnet_v2_50(inputs: Any, units_per_block: Sequence[int], is_training: Any) -> tuple[Any, Any]:
    """slim's `resnet_v2_50` with `units_per_block` units in blocks 1-4 (it has 3 4 6 3): the same
    builder (`resnet_v2`), block depths, strides, scope and variable names, fewer units."""
    blocks = [nets.resnet_v2.resnet_v2_block(scope, base_depth=depth, num_units=units, stride=stride)
              for (scope, depth, stride), units in zip(
                  (("block1", 64, 2), ("block2", 128, 2), ("block3", 256, 2), ("block4", 512, 1)), units_per_block)]
    return nets.resnet_v2.resnet_v2(inputs, blocks, None, is_training, True, None, include_root_block=True,
                                    scope="resnet_v2_50")


def _dropout_noise(tower_logits_scope: str) -> Any:
    """The uniform [0, 1) noise tensor inside this tower's slim.dropout (`<Logits scope>/scope/dropout/`)."""
    prefix = tower_logits_scope + "/scope/dropout/"
    ops = [op for op in tf.get_default_graph().get_operations()
           if op.type == "RandomUniform" and op.name.startswith(prefix)]
    if len(ops) != 1:
        raise RuntimeError(f"expected one RandomUniform op under {prefix}, found {[op.name for op in ops]}")
    return ops[0].outputs[0]


def tower_split(g: types.SimpleNamespace, rows: int, split: Optional[str] = None,
                static_batch_size: Optional[int] = None) -> towers.TowerSplit:
    """The `towers.TowerSplit` of a batch of `rows` rows fed to graph `g` under `split` (default: g's)."""
    split = split or g.split
    allowed = {"fix": ("fix", "static"), "static": ("static",), "weighted": ("weighted",)}[g.split]
    if split not in allowed:
        raise towers.SplitError(f"a graph built with split={g.split!r} cannot be fed with split={split!r}")
    return towers.split_rows(rows, g.num_towers, split, static_batch_size or g.static_batch_size)


def make_feed(g: types.SimpleNamespace, batch_x: ArrayLike, batch_y: ArrayLike, training: bool, keep_prob: float,
              split: Optional[str] = None, static_batch_size: Optional[int] = None) -> tuple[dict[Any, Any], int]:
    """The feed_dict for one batch, as the original builds `train_dict` / `valid_dict`.

    split (default: the graph's): 'fix' feeds current_batch_size = rows // num_towers (the
    original's fix); 'static' feeds the constant static_batch_size (a graph built 'static' holds it
    already); 'weighted' feeds the per-tower starts, sizes and weights.  A 'fix' graph can be fed
    'fix' or 'static'.  Returns (feed_dict, dropped_rows), dropped_rows = rows no tower sees.
    """
    cut = tower_split(g, int(np.shape(batch_x)[0]), split, static_batch_size)
    feed = {g.inputs: batch_x, g.labels: batch_y, g.is_training: training, g.keep_prob: keep_prob}
    if g.split == "weighted":
        feed.update({g.tower_starts: cut.starts, g.tower_sizes: cut.sizes, g.tower_weights: cut.weights})
    elif g.split == "fix":
        # the original: c_batch_size = int(batch_x.shape[0] / 2); or the bug's constant under 'static'
        static = (split or g.split) == "static"
        feed[g.current_batch_size] = (static_batch_size or g.static_batch_size) if static else cut.sizes[0]
    return feed, cut.dropped


"""
" Restore resnet50
"""


def restore_pretrained(sess: Any, saver_restore: Any, path: Optional[str], variables_to_restore: Sequence[Any],
                       explicit: bool = True) -> bool:
    """Restore `variables_to_restore` (all model variables but Logits) from the checkpoint at `path`.

    Port: the names and shapes are checked first (`tf.train.list_variables`), and a mismatch is a
    `UsageError` listing the variables, not a restore traceback.  A missing checkpoint is an error
    when `explicit`, else (the original's default path) a log line and training from scratch.
    Returns True when restored.
    """
    if path and os.path.isdir(path):
        path = tf.train.latest_checkpoint(path) or path
    if not path or not (os.path.exists(path) or os.path.exists(path + ".index")):
        if explicit:
            raise UsageError(f"pretrained checkpoint {path} not found")
        log(f"pretrained checkpoint {path or resnet_model_path} is unavailable: training from scratch "
            f"(the original restored the slim resnet_v2_50.ckpt here)")
        return False
    try:
        listed = dict(tf.train.list_variables(path))
    except (tf.errors.OpError, ValueError) as error:
        raise UsageError(f"pretrained checkpoint {path} cannot be read: {str(error).splitlines()[0]}") from None
    missing = [v.op.name for v in variables_to_restore if v.op.name not in listed]
    mismatched = [f"{v.op.name} (graph {v.shape.as_list()}, checkpoint {listed[v.op.name]})"
                  for v in variables_to_restore
                  if v.op.name in listed and v.shape.as_list() != list(listed[v.op.name])]
    if missing or mismatched:
        parts = []
        if missing:
            parts.append(f"{len(missing)} variables missing from it: {_some(missing)}")
        if mismatched:
            parts.append(f"{len(mismatched)} with other shapes: {_some(mismatched)}")
        raise UsageError(f"pretrained checkpoint {path} does not fit the ResNet-v2-50 backbone "
                           f"(all model variables but {checkpoint_exclude_scopes}): {'; '.join(parts)}")
    with sess.graph.as_default():
        saver_restore.restore(sess, path)
    log(f"restored {len(variables_to_restore)} variables (all but {checkpoint_exclude_scopes}) from {path}")
    return True


def _some(names: Sequence[str], limit: int = 8) -> str:
    return ", ".join(names[:limit]) + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def log(message: str) -> None:
    print(message, flush=True)


"""
" Open Session: the training loop with validation
"""


def describe_split(step: int, cut: towers.TowerSplit, split: str, static_batch_size: Optional[int] = None,
                   what: str = "train") -> Optional[str]:
    """The log line for a batch the split does not hand out evenly, or None when it does."""
    prefix = f"step {step} ({what}): batch of {cut.rows} rows over {len(cut.sizes)} towers"
    if split == "weighted":
        if cut.padded:
            return (f"{prefix}: towers {cut.padded} have no row; each gets a weight-0 copy of row 0 "
                    f"(--split=weighted, nothing dropped)")
        return None
    if split == "fix" and cut.empty:
        return (f"{prefix}: fewer rows than towers, current_batch_size = {cut.rows} // {len(cut.sizes)} = 0, "
                f"every tower empty, all {cut.dropped} rows dropped. The original would run this step on "
                f"empty towers (NaN loss, NaN batch-norm statistics); the port skips it")
    if split == "static" and (cut.empty or cut.dropped or len(set(cut.sizes)) > 1):
        return (f"{prefix}: --split=static gives towers {cut.sizes} rows (constant current_batch_size "
                f"{static_batch_size}), {cut.dropped} dropped"
                + (f"; towers {cut.empty} EMPTY: the original's bug, expect loss NaN" if cut.empty else ""))
    if cut.dropped:
        return (f"{prefix}: current_batch_size = {cut.rows} // {len(cut.sizes)} = {cut.sizes[0]}, "
                f"{cut.dropped} row{'s' if cut.dropped > 1 else ''} dropped (the original's split)")
    return None


ONEDNN_NOTE = ("this CPU build's oneDNN Conv2D mishandles an empty batch (it returns its input's shape) and the "
               "next op raises InvalidArgumentError instead of producing NaN; on a GPU, or with "
               "TF_ENABLE_ONEDNN_OPTS=0, the loss is NaN")


def run_batch(sess: Any, fetches: Any, feed: dict[Any, Any], cut: towers.TowerSplit, step: int) -> Optional[Any]:
    """sess.run, except that the original's empty-tower failure under --split=static is reported, not raised.

    Returns the fetched values, or None when the step could not run because of an empty tower.
    """
    try:
        return sess.run(fetches, feed_dict=feed)
    except tf.errors.InvalidArgumentError as error:
        if not cut.empty:
            raise
        reason = next((line.strip() for line in str(error).splitlines()
                       if line.strip() and not line.strip().endswith("execution error:")), type(error).__name__)
        log(f"step {step}: towers {cut.empty} got no rows: {ONEDNN_NOTE} ({reason[:120]}). "
            f"Expected under --split=static; the step is skipped and training continues as the original did")
        return None


def check_finite(tower_losses: Sequence[float], step: int, split: str, cut: towers.TowerSplit) -> None:
    """Port: a NaN loss stops training (UsageError naming step and towers), except under --split=static."""
    bad = [i for i, value in enumerate(tower_losses) if not np.isfinite(value)]
    if not bad:
        return
    if split == "static":
        log(f"step {step}: loss NaN on towers {bad} (rows per tower {cut.sizes}): the expected NaN of the original's "
            f"bug (--split=static), reported, not an error; training continues as the original did")
        return
    raise UsageError(f"the loss turned {tower_losses[bad[0]]} at step {step} on tower{'s' if len(bad) > 1 else ''} "
                       f"{', '.join(map(str, bad))} (rows per tower {cut.sizes}, split {split}); training stopped. "
                       f"Try a lower learning rate (--values) or check the input data")


def validate(sess: Any, g: types.SimpleNamespace, val_iterator: Any, val_image_batch: Any, val_label_batch: Any,
             valid_writer: Any, step: int, split: str) -> tuple[float, float]:
    """The original's validation pass: mean over batches of tower-0 accuracy and last-tower loss."""
    sess.run(val_iterator.initializer)
    acc_reg = []
    loss_reg = []
    dropped = 0
    while True:
        try:
            batch_x, batch_y = sess.run([val_image_batch, val_label_batch])
            valid_dict, _ = make_feed(g, batch_x, batch_y, False, 1., split)
            cut = tower_split(g, len(batch_x), split)
            dropped += cut.dropped
            if split == "fix" and cut.empty:
                continue  # every tower empty: nothing to evaluate
            out = run_batch(sess, [g.loss, g.accuracy, g.summary_op], valid_dict, cut, step)
            if out is None:
                continue
            loss_v, acc_v, summary_str = out
            valid_writer.add_summary(summary_str, step)
            acc_reg.append(acc_v)
            loss_reg.append(loss_v)
        except tf.errors.OutOfRangeError:
            break
    if dropped:
        log(f"step {step} (valid): the split dropped {dropped} validation rows")
    return float(np.mean(np.array(acc_reg))), float(np.mean(np.array(loss_reg)))


def resolve_data(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Which TFRecords to read, and the profile (embedded or original) filling unset flags."""
    train, test, embedded = cifar10.resolve_files(args.data_dir, args.train_tfrecords, args.test_tfrecords,
                                                  EMBEDDED_DATA_DIR)
    name = "the embedded default profile" if embedded else "the original's"
    differ = cifar10.fill_profile(args, EMBEDDED_PROFILE if embedded else ORIGINAL_PROFILE, ORIGINAL_PROFILE)
    log(f"data: train {train}, valid {test}; settings: {name}"
        + (f"; differs from the original in: {', '.join(differ)}, so that the small embedded set trains "
           f"in minutes" if differ else ""))
    return train, test


def session_config(num_towers: int, grappler: str = "auto", devices: Optional[Sequence[str]] = None) -> Any:
    """`towers.session_config` (the original's allow_soft_placement, plus virtual CPUs for the towers).

    Port: with grappler "auto" the graph optimizer (grappler) is switched off when the towers are on
    CPUs.  On this two-tower ResNet-v2-50 its pass over the graph before the first step, and again
    before the first validation (a new set of fetches), is long and buys no step time on CPU; it
    changes no semantics.  With GPU towers it stays on (its layout optimizer matters there), as in
    the original.
    """
    config = towers.session_config(num_towers)
    devices = devices or towers.tower_devices(num_towers)
    on = grappler == "on" or (grappler == "auto" and devices[0].startswith("/gpu"))
    config.graph_options.rewrite_options.disable_meta_optimizer = not on
    return config


def check_inputs(args: argparse.Namespace) -> tuple[list[str], list[str], int]:
    """What can be refused before the graph is built: the data files (counted), the step count
    and the output folders.  Returns (train files, valid files, total steps)."""
    train_tfrecords, test_tfrecords = resolve_data(args)
    counts = cifar10.check_tfrecord_files(train_tfrecords + test_tfrecords)
    num_train = sum(counts[:len(train_tfrecords)])
    total_steps = -(-num_train // args.batch_size) * args.epochs  # the iterator's batches
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)
    log(f"records: {num_train} train, {sum(counts[len(train_tfrecords):])} valid; {total_steps} steps "
        f"({args.epochs} epochs of {-(-num_train // args.batch_size)} batches of up to {args.batch_size})")
    if args.split == "static" and args.batch_size < args.num_towers:
        raise UsageError(f"--split=static with batch_size {args.batch_size} < {args.num_towers} towers: the "
                           f"constant per-tower size batch_size // towers would be 0")
    logs_train_dir = os.path.join(args.log_dir, "train")
    logs_valid_dir = os.path.join(args.log_dir, "valid")
    check_writable(args.model_dir, "--model_dir")
    for dir_name in [args.log_dir, logs_train_dir, logs_valid_dir]:
        check_writable(dir_name, "--log_dir")
    return train_tfrecords, test_tfrecords, total_steps


def validate_and_keep_best(sess: Any, g: types.SimpleNamespace, saver: Any, models_path: str,
                           valid: tuple[Any, Any, Any, Any], step: int, split: str,
                           best: tuple[float, Optional[int], Optional[str]]
                           ) -> tuple[float, Optional[int], Optional[str]]:
    """The original's validation block: the whole validation set, its three lines, and the model
    saved when it beats the best so far.  valid: (val_iterator, images, labels, writer);
    best: (accuracy, step, path), returned updated."""
    avg_acc, avg_loss = validate(sess, g, *valid, step, split)
    print('------------------------------------------------------')
    print('Valid-----> ,Valid_Acc: {:.4f}, Valid_Loss: {:.7f}'.format(avg_acc, avg_loss))
    print('------------------------------------------------------')
    """
    " Save the best model
    """
    if avg_acc > best[0]:
        best = (avg_acc, step, saver.save(sess=sess, save_path=models_path, global_step=step))
        print("Model saved successfully")  # 模型保存成功
        print("Save the best model with val_acc %0.4f" % avg_acc)
    else:
        print("Val_acc stay with val_acc %0.4f" % best[0], flush=True)
    return best


def train(args: argparse.Namespace) -> int:
    train_tfrecords, test_tfrecords, total_steps = check_inputs(args)
    models_path = os.path.join(args.model_dir, "train-model.ckpt")  # saver path
    logs_train_dir = os.path.join(args.log_dir, "train")
    logs_valid_dir = os.path.join(args.log_dir, "valid")
    with tf.Graph().as_default():
        iterator, image_batch, label_batch, val_iterator, val_image_batch, val_label_batch = make_datasets(
            train_tfrecords, test_tfrecords, args.batch_size, args.valid_batch_size, args.shuffle_buffer,
            args.epochs)
        devices = towers.tower_devices(args.num_towers)
        log(towers.placement_message(devices))
        t0 = time.time()
        g = build_graph(args.num_towers, args.split, args.batch_size // args.num_towers, args.boundaries,
                        args.values, devices=devices, units_per_block=args.units_per_block)
        units = (f", resnet_v2 with {' '.join(map(str, args.units_per_block))} units per block (the original's "
                 f"resnet_v2_50: 3 4 6 3)" if args.units_per_block else "")
        log(f"graph built in {time.time() - t0:.1f} s: {args.num_towers} towers, split {args.split}{units}, "
            f"{len(g.variables_to_restore)} restorable variables (excluding {g.exclusions})")
        saver_restore = tf.train.Saver(var_list=g.variables_to_restore)
        saver = tf.train.Saver()

        init = tf.global_variables_initializer()
        config = session_config(args.num_towers, args.grappler, devices)
        grappler_off = config.graph_options.rewrite_options.disable_meta_optimizer
        log(f"graph optimizer (grappler): {'off' if grappler_off else 'on'}")
        with tf.Session(config=config) as sess:
            sess.run(init)
            restore_pretrained(sess, saver_restore, args.pretrained or resnet_model_path, g.variables_to_restore,
                               explicit=args.pretrained is not None)

            train_writer = tf.summary.FileWriter(logs_train_dir, sess.graph)  # training log
            valid_writer = tf.summary.FileWriter(logs_valid_dir, sess.graph)  # validation log
            # initialise the training iterator
            sess.run(iterator.initializer)
            step = 0
            best_acc, best_step, best_path = 0.0, None, None
            valid = (val_iterator, val_image_batch, val_label_batch, valid_writer)
            dropped_total = trained_rows = interval_rows = skipped_rows = 0
            train_time = interval_time = 0.0
            start_time = time.time()
            while args.max_steps is None or step < args.max_steps:
                try:
                    t_step = time.time()
                    batch_x, batch_y = sess.run([image_batch, label_batch])
                except tf.errors.OutOfRangeError:
                    break
                step += 1
                train_dict, dropped = make_feed(g, batch_x, batch_y, True, args.keep_prob)
                cut = tower_split(g, len(batch_x))
                dropped_total += dropped
                note = describe_split(step, cut, args.split, g.static_batch_size)
                if note:
                    log(note)
                if args.split == "fix" and cut.empty:
                    continue
                out = run_batch(sess, [g.summary_op, g.train_step, g.loss, g.accuracy, g.tower_losses],
                                train_dict, cut, step)
                if out is None:  # the step failed on an empty tower: its other rows did not train either
                    skipped_rows += cut.rows - cut.dropped
                    continue
                summary_str, _, loss_t, acc_t, tower_losses = out
                check_finite(tower_losses, step, args.split, cut)
                seconds = time.time() - t_step
                train_time += seconds
                interval_time += seconds
                trained_rows += cut.rows - cut.dropped
                interval_rows += cut.rows - cut.dropped
                if step % args.log_every == 0:
                    # Quirk kept: Loss is the last tower's, Train_Acc tower 0's.
                    print('Step: {},Train_Acc: {:.4f},Loss: {:.8f}'.format(step, acc_t, loss_t)
                          + f",Examples/sec: {interval_rows / max(interval_time, 1e-9):.1f}"
                          + progress(step, total_steps, time.time() - start_time, step), flush=True)
                    train_writer.add_summary(summary_str, step)
                    interval_rows, interval_time = 0, 0.0
                if step % args.valid_every == 0:  # validation accuracy
                    best_acc, best_step, best_path = validate_and_keep_best(
                        sess, g, saver, models_path, valid, step, args.split, (best_acc, best_step, best_path))
            train_writer.close()
            valid_writer.close()
            # Port: saved under the number of steps run (the original's counter was one ahead here).
            saved_path = saver.save(sess=sess, save_path=models_path, global_step=step)
        end_time = time.time()
        print("Total time:", end_time - start_time)  # 总共用时
        print('Ended......')
        log(f"summary: {step} steps in {end_time - start_time:.1f} s wall "
            f"({trained_rows / max(train_time, 1e-9):.1f} examples/sec in training steps); "
            + (f"best Valid_Acc {best_acc:.4f} at step {best_step}, saved as {best_path}; " if best_path else
               "no validation improved on 0 (no best model saved); ")
            + f"final model {saved_path}; rows dropped by the split: {dropped_total}"
            + (f", rows of failed steps (not trained): {skipped_rows}" if skipped_rows else "") + "; "
            f"event files in {args.log_dir}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.tf1_behavior:
        tf.disable_v2_behavior()  # before any graph is built: the whole process runs TF1's runtime
    warnings.filterwarnings("ignore", message="`layer.apply` is deprecated", category=UserWarning)  # slim's layers
    tf.get_logger().setLevel("ERROR")                          # tf.compat.v1 deprecation notices
    return run_main(train, args, also=(cifar10.CifarDataError, towers.SplitError))


if __name__ == "__main__":
    sys.exit(main())
