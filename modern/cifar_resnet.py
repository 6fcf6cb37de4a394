"""The two-tower CIFAR-10 ResNet-v2-50 trainer in today's TensorFlow: Keras 3, MirroredStrategy, tf.function.

The modern twin of `legacy/cifar_resnet.py`, which reproduces the blog post's CIFAR-10 ResNet-v2-50 program
("tensorflow multi-GPU training gives loss nan").  Run it (from the repository root)::

    python modern/cifar_resnet.py                                  # embedded synthetic data, minutes on 2 CPUs
    python modern/cifar_resnet.py --data_dir data/cifar10          # real CIFAR-10, the original's settings
    python modern/cifar_resnet.py --data_dir data/cifar10 --pretrained resnet_v2_50.ckpt
    python modern/cifar_resnet.py --towers 4 --deterministic
    python -m modern.launch --workers 2 -- modern/cifar_resnet.py  # 2 worker processes (modern/cluster.py)

Run it again with the same --model_dir and it resumes from the latest checkpoint (model, optimizer,
step, best validation accuracy).

The same training as the legacy graph, written the TF2 way:
  towers sliced from a fed batch      ->  tf.data global batches cut into replica slices (cluster.distribute)
  slim resnet_v2_50 + Logits head     ->  modern.resnet_v2.resnet_v2_50 (slim-exact, same names)
  per-tower mean loss, average_gradients  ->  replica_gradients (scaled by the global batch),
                                          gradients SUM-all-reduced by the optimizer
  AdamOptimizer(piecewise_constant)   ->  make_optimizer: Adam(PiecewiseConstantDecay, epsilon=1e-8), each
                                          variable updated by TF1's fused ApplyAdam kernel (FusedAdam)
  UPDATE_OPS before apply_gradients   ->  batch norm updates its moving statistics in the forward pass
  Saver, best model by val accuracy   ->  tf.train.CheckpointManager (and resume)
  tf.summary.scalar lr/accuracy/loss  ->  the same tags, in <log_dir>/train and <log_dir>/valid
  saver_restore excluding 'Logits'    ->  modern.checkpoints.load_tf1_checkpoint(exclude_scopes='Logits')

Defaults are the original's constants, each a flag with the legacy program's name (`--towers`, alias
`--num_replicas`), including the legacy *embedded default profile*: with no data given, a small
synthetic CIFAR-shaped set (`records.cifar10`) and batch_size 16, valid_batch_size 50, 8 epochs,
unless set on the command line (`records.cifar10.EMBEDDED_PROFILE`, which the legacy program uses too).

Where it differs from the legacy program, on purpose:
  * no rows are ever lost: the short last batch (and one not divisible by the replica count) is
    split over the replicas whole and every row weighs 1/rows (the legacy fix `current_batch_size =
    rows // towers` drops the remainder); a batch that would leave a replica empty (fewer rows than
    replicas, or 5 rows on 4: 2 + 2 + 1 + 0) is copied to every
    replica at weight 1/N (`spread_short_batch`), never leaving one empty;
  * the logged loss and accuracy are the whole global batch's (the legacy logs the LAST tower's
    loss and tower 0's accuracy), and validation averages over rows, not over batches;
  * training images go through `preprocess_for_test` as in the original (quirk kept), unless
    --augment asks for `preprocess_for_train`;
  * batch norm moves its moving statistics once per step (by the replicas' mean), where the legacy
    towers move the shared variables once per tower: with decay 0.997 the modern statistics warm
    up about N times slower, which shows in the early validation accuracy.
  * the models and logs go to ./models/modern and ./logs/modern (the original's ./models/temporary
    and ./logs/temporary are the legacy program's), as object-based checkpoints
    (`python -m modern.checkpoints` converts to and from TF1's); validation writes one averaged
    summary per validation (the original one per validation batch, all at the same step);
  * a NaN loss stops training with an error; whole GPUs take memory as needed (the original's
    allow_growth); the original's CUDA_VISIBLE_DEVICES = "0, 1" is left to the user.
Additions: --deterministic, --seed, --connect_timeout (clusters) and --units_per_block (a smaller
ResNet, for quick tests only).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence


import keras
import tensorflow as tf

from modern import checkpoints as tf1_checkpoints
from modern.keras_adapter import adam_slots, resource_handle
from modern import cluster
from modern.resnet_v2 import RESNET_V2_50_BLOCKS, resnet_v2_50
from modern.runtime import (UsageError, add_seed_flags, check_writable, seed_program,
                            run_reporting_usage_errors, write_scalar)
from records import cifar10
from records.usage import ArgumentParser, at_least, fraction
from records.progress import progress

# ----------------------------------------------------------------------------------------------
# Parameters: the original's constants (as legacy/cifar_resnet.py names them), one flag each.
# ----------------------------------------------------------------------------------------------
num_replicas = 2
num_classes = cifar10.NUM_CLASSES
batch_size = 256
valid_batch_size = 256
shuffle_buffer = 50000
NUM_EPOCHS = 200
boundaries = [10000, 25000]
values = [0.001, 0.0001, 0.00001]
keep_prob_train = 0.6
log_every = 10
valid_every = 100
resnet_model_path = "./resnet_v2_50.ckpt"  # the original restores it; used here if present
models_dir = "./models/modern"             # the legacy program writes ./models/temporary
logs_dir = "./logs/modern"                 # the legacy program writes ./logs/temporary
checkpoint_exclude_scopes = "Logits"

# The embedded default profile, shared with legacy/cifar_resnet.py through the data code, so that
# both programs make the same few-minute default run (batch_size 16, valid_batch_size 50, 8 epochs).
EMBEDDED_DATA_DIR = cifar10.DEFAULT_DATA_DIR
EMBEDDED_PROFILE = cifar10.EMBEDDED_PROFILE
ORIGINAL_PROFILE = {"batch_size": batch_size, "valid_batch_size": valid_batch_size, "epochs": NUM_EPOCHS}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--towers", "--num_replicas", dest="num_replicas", type=at_least(1), default=num_replicas,
                   metavar="N",
                   help="replicas, the towers of the original (one per GPU; logical GPUs when there are "
                        "fewer GPUs, virtual CPU devices without any)")
    cifar10.add_profile_flags(p, ORIGINAL_PROFILE, "global batch, split across replicas")
    p.add_argument("--max_steps", type=at_least(1), default=None,
                   help="stop after this many steps in all, across resumes (default: no limit, the "
                        "epochs decide)")
    cifar10.add_schedule_flags(p, shuffle_buffer, boundaries, values)
    p.add_argument("--keep_prob", type=fraction(low_open=True), default=keep_prob_train,
                   help="dropout keep probability in training (Keras Dropout rate = 1 - keep_prob)")
    p.add_argument("--augment", action="store_true",
                   help="train on preprocess_for_train (the original trains on preprocess_for_test)")
    p.add_argument("--data_dir", help="folder with train.tfrecords and test.tfrecords (default: the "
                                      "embedded synthetic set)")
    p.add_argument("--train_tfrecords", nargs="+",
                   help="training TFRecord files, instead of --data_dir's (default: --data_dir's train.tfrecords)")
    p.add_argument("--test_tfrecords", nargs="+",
                   help="validation TFRecord files, instead of --data_dir's (default: --data_dir's test.tfrecords)")
    p.add_argument("--pretrained", default=None,
                   help=f"TF1 resnet_v2_50 checkpoint to restore all but Logits from (default: "
                        f"{resnet_model_path} if present, else training from scratch); ignored when resuming")
    p.add_argument("--model_dir", default=models_dir, help="checkpoints: the latest (to resume) and the best")
    p.add_argument("--log_dir", default=logs_dir, help="event files (train/ and valid/)")
    p.add_argument("--log_every", type=at_least(1), default=log_every, help="a training line every N steps")
    p.add_argument("--valid_every", type=at_least(1), default=valid_every, help="validate every N steps")
    cluster.add_flags(p)
    add_seed_flags(p)
    p.add_argument("--units_per_block", type=at_least(1), nargs=4, default=None, metavar="N",
                   help="for quick tests only: units in blocks 1-4 (default: ResNet-v2-50's 3 4 6 3)")
    args = p.parse_args(argv)
    cifar10.check_schedule_flags(p, args)
    return args


class ResolvedData(NamedTuple):
    """The data a run reads: whether it is the embedded set, the flags its profile filled in, the
    training and validation files and their rows."""
    embedded: bool
    changed: list[str]
    train_files: list[str]
    num_train: int
    valid_files: list[str]
    num_valid: int


def resolve_data(args: argparse.Namespace) -> ResolvedData:
    """The training and validation files and the run sizes: the embedded profile when no data is given."""
    try:
        train_files, valid_files, embedded = cifar10.resolve_files(
            args.data_dir, args.train_tfrecords, args.test_tfrecords, EMBEDDED_DATA_DIR)
        changed = cifar10.fill_profile(args, EMBEDDED_PROFILE if embedded else ORIGINAL_PROFILE, ORIGINAL_PROFILE)
        train_counts = cifar10.check_tfrecord_files(train_files)
        valid_counts = cifar10.check_tfrecord_files(valid_files)
    except cifar10.CifarDataError as e:
        raise UsageError(str(e)) from None
    return ResolvedData(embedded, changed, train_files, sum(train_counts), valid_files, sum(valid_counts))


# ----------------------------------------------------------------------------------------------
# Data: the original's pipelines, handed to the replicas by the strategy.
# ----------------------------------------------------------------------------------------------
def spread_short_batch(x: Any, y_onehot: Any, num_replicas: int) -> tuple[Any, Any, Any]:
    """A global batch -> (x, y_onehot, weights) that `cluster.distribute` can split
    without leaving a replica empty.

    `cluster.distribute` (like the strategy's own `experimental_distribute_dataset`) cuts B rows
    into replica batches of ceil(B/N) rows, in order, so the last replicas get what is left (7 rows
    on 2 replicas: 4 + 3), and that can be nothing: whenever ceil(B/N) * (N - 1) >= B.  That is every
    batch with fewer rows than replicas (1 row on 2: 1 + 0), and more (5 rows on 4: 2 + 2 + 1 + 0; 4
    rows on 3: 2 + 2 + 0).  A replica cannot run the ResNet on zero rows: Keras' Conv2D fails on an
    empty batch on CPU, batch norm over no rows is 0/0 = NaN, and a `tf.cond` around the forward
    pass is impossible because synchronised batch-norm statistics are a cross-replica call.  So such
    a batch is copied onto every replica, each copy weighing 1/num_replicas: the summed loss and
    gradient are those of the B rows once, and every replica's batch statistics are those of the B
    rows, as on one device.  Otherwise the weights are all 1.
    """
    rows = tf.shape(x)[0]
    copies = tf.where(leaves_a_replica_empty(rows, num_replicas), num_replicas, 1)
    weights = tf.fill([rows * copies], 1.0 / tf.cast(copies, tf.float32))
    return tf.tile(x, [copies, 1, 1, 1]), tf.tile(y_onehot, [copies, 1]), weights


def leaves_a_replica_empty(rows: Any, num_replicas: int) -> Any:
    """Whether the strategy's split of `rows` rows (replica batches of ceil(rows / N)) leaves the
    last replica with none.  Python ints or int32 tensors."""
    per_replica = -(-rows // num_replicas)
    return per_replica * (num_replicas - 1) >= rows


def make_datasets(train_files: Sequence[str], valid_files: Sequence[str], batch_size: int, valid_batch_size: int,
                  shuffle_buffer: int, num_epochs: int, num_replicas: int = 1, augment: bool = False,
                  skip_batches: int = 0, shuffle_seed: Optional[int] = None) -> tuple[Any, Any]:
    """The original's training and validation datasets of GLOBAL batches.

    Same order as the original: parse, preprocess, shuffle, batch, repeat (batch before repeat, so
    every epoch ends on a short batch).  Elements are (images, one-hot labels, weights) from
    `spread_short_batch`; `cluster.distribute` then splits each global batch over the
    replicas, the short one included (7 rows on 2 replicas: 4 + 3).  `skip_batches` skips what a
    resumed run has already trained on; `shuffle_seed` makes the shuffle the same in every worker of a
    cluster (`modern.cluster.shared_seed`, kept in the checkpoint).
    """
    preprocess = cifar10.preprocess_for_train if augment else cifar10.preprocess_for_test

    def one_hot(image, label):
        return image, tf.one_hot(tf.cast(label, tf.int32), depth=num_classes)

    def parse_and_preprocess(record):
        image, label = cifar10.parser_tfrecords(record)
        return preprocess(image), label

    dataset = tf.data.TFRecordDataset(train_files)
    if augment:
        dataset = dataset.map(parse_and_preprocess).shuffle(shuffle_buffer, seed=shuffle_seed).batch(batch_size)
    else:
        # Quirk kept: the original trains on preprocess_for_test.  Speed, the same batches: the
        # serialized records are shuffled and batched, then parsed and preprocessed a batch at a
        # time (`tf.vectorized_map`); parsing and preprocess_for_test have no randomness and the
        # shuffle's order does not depend on what it shuffles, so every batch is the original's.
        # (preprocess_for_train draws random crops per image, so --augment keeps per-image maps.)
        dataset = dataset.shuffle(shuffle_buffer, seed=shuffle_seed).batch(batch_size)
        dataset = dataset.map(lambda records: tf.vectorized_map(parse_and_preprocess, records))
    dataset = dataset.repeat(num_epochs)
    dataset = dataset.map(one_hot).skip(skip_batches)
    dataset = dataset.map(lambda x, y: spread_short_batch(x, y, num_replicas)).prefetch(2)

    val_dataset = tf.data.TFRecordDataset(valid_files)
    val_dataset = val_dataset.map(cifar10.parser_tfrecords)
    val_dataset = val_dataset.map(lambda image, label: (cifar10.preprocess_for_test(image), label))
    val_dataset = val_dataset.batch(valid_batch_size).map(one_hot)
    val_dataset = val_dataset.map(lambda x, y: spread_short_batch(x, y, num_replicas)).prefetch(2)
    return dataset, val_dataset


# ----------------------------------------------------------------------------------------------
# Loss and gradients of one replica.
# ----------------------------------------------------------------------------------------------
def replica_gradients(model: Any, x: Any, y_onehot: Any, global_batch_size: Any,
                      weights: Optional[Any] = None) -> tuple[Any, Any, Any]:
    """One replica's training forward and backward pass, before the all-reduce.

    Its loss is its share of the global batch's: the sum of its rows' cross-entropy divided by
    global_batch_size, so that the replicas' losses and gradients SUMMED are the mean over the
    global batch.  Legacy: each tower takes the MEAN over its b rows, then average_gradients the
    mean over N towers: weight 1/(N*b) per row; here 1/B per row, the same when B = N*b.  On an
    uneven batch (7 rows: 4 + 3) averaging tower means would weigh rows 1/8 and 1/6 (and the legacy
    fix drops the 7th row instead); here every row weighs exactly 1/7.
    No `model.losses`: the conv kernels carry slim's weight-decay regularisers, but the legacy
    program never adds tf.GraphKeys.REGULARIZATION_LOSSES to its loss, so neither do we.

    Args:
      model: the Keras ResNet (modern.resnet_v2), called in training mode.
      x: float32 [rows, 32, 32, 3], preprocessed; y_onehot: float32 [rows, num_classes]; the
        replica must hold at least one row (see spread_short_batch).
      global_batch_size: rows of the whole step over all replicas (int or int32 tensor), counted
        by weight (see spread_short_batch).
      weights: optional per-row weights [rows] (spread_short_batch's); None means all 1.
    Returns (loss, gradients aligned with model.trainable_variables, logits).
    """
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        per_example = tf.nn.softmax_cross_entropy_with_logits(labels=y_onehot, logits=logits)
        loss = tf.nn.compute_average_loss(per_example, sample_weight=weights, global_batch_size=global_batch_size)
    return loss, tape.gradient(loss, model.trainable_variables), logits


def _global_rows(rows: Any, weights: Optional[Any]) -> Any:
    """Rows of the whole step, each counted by its weight (copies of spread_short_batch count once)."""
    local = tf.cast(rows, tf.float32) if weights is None else tf.reduce_sum(weights)
    total = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local)
    return tf.cast(tf.round(total), tf.int32)


# ----------------------------------------------------------------------------------------------
# Learning rate and optimizer.
# ----------------------------------------------------------------------------------------------
def make_optimizer(boundaries: Sequence[int] = boundaries, values: Sequence[float] = values,
                   epsilon: float = 1e-8, fused: bool = True) -> Any:
    """Adam on the legacy `piecewise_constant(global_step, boundaries, values)` schedule.

    Schedule: both give values[0] while step <= boundaries[0], values[1] while step <=
    boundaries[1], ...  Keras evaluates it at `optimizer.iterations` BEFORE incrementing it, and the
    legacy graph reads `global_step` before `apply_gradients` increments it, so update k (k = 0, 1,
    ...) uses the same rate on both sides, boundary steps included.

    Adam: TF1's AdamOptimizer defaults to epsilon 1e-8, Keras' Adam to 1e-7, hence epsilon=1e-8.
    The update rules are otherwise algebraically identical (TF1 `ApplyAdam` kernel, keras
    `adam.py: update_step`), with t = step + 1:
        m <- m + (g - m) * (1 - beta1);   v <- v + (g^2 - v) * (1 - beta2)
        lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t);   w <- w - lr_t * m / (sqrt(v) + epsilon)
    (epsilon outside the sqrt and NOT bias-corrected in both; "epsilon hat" of the paper).  They
    differ in round-off only: TF1 keeps beta1^t, beta2^t as running products in variables
    (beta1_power, beta2_power), Keras computes pow(beta, t) afresh each step.

    fused (the default): the update of each variable is TF's fused `ResourceApplyAdam` kernel, the
    one TF1's AdamOptimizer runs (see FusedAdam); fused=False is Keras' own Adam, op by op.
    """
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay(list(boundaries), list(values))
    adam = FusedAdam if fused else keras.optimizers.Adam
    return adam(learning_rate=schedule, beta_1=0.9, beta_2=0.999, epsilon=epsilon)


class FusedAdam(keras.optimizers.Adam):
    """Keras' Adam with each variable's update done by TF's fused `ResourceApplyAdam` kernel.

    The kernel of TF1's `tf.train.AdamOptimizer` (`ApplyAdam`, training_ops.cc), one pass over
    the variable and its two slots where Keras' `update_step` runs about ten element-wise ops, each
    a pass over memory (ResNet-v2-50: 174 variables, 23.5M weights, updated on every replica's
    copy).  Same rule, in the kernel's float32 order:
        lr_t = lr * sqrt(1 - beta2_power) / (1 - beta1_power)
        m += (g - m) * (1 - beta1);  v += (g*g - v) * (1 - beta2);  w -= lr_t * m / (sqrt(v) + epsilon)
    with (1 - beta1) taken in float32 as TF1 does (Keras takes it in float64 and rounds: 0.1 vs
    0.100000024), so the update is TF1's own arithmetic.  The beta powers stay Keras'
    pow(beta, iterations + 1), and the rate is `learning_rate` read before `iterations` is
    incremented: the schedule, the slots (`keras_adapter.adam_slots`), the
    checkpoint layout and everything else are Keras' Adam's.
    """

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> Any:
        # Called by Keras once per variable; under a strategy once per replica's copy, inside
        # `extended.update`, where the slots' `.handle` resolves to that replica's copy too.
        dtype = variable.dtype
        local_step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.constant(self.beta_1, dtype), tf.constant(self.beta_2, dtype)
        m, v = adam_slots(self, variable)
        return tf.raw_ops.ResourceApplyAdam(
            var=resource_handle(variable), m=resource_handle(m), v=resource_handle(v),
            beta1_power=tf.pow(beta_1, local_step), beta2_power=tf.pow(beta_2, local_step),
            lr=tf.cast(learning_rate, dtype), beta1=beta_1, beta2=beta_2,
            epsilon=tf.constant(self.epsilon, dtype), grad=tf.cast(gradient, dtype), use_locking=False)


# ----------------------------------------------------------------------------------------------
# One training step, one validation step, over all replicas.
# ----------------------------------------------------------------------------------------------
def make_train_step(model: Any, optimizer: Any, strategy: Any, return_metrics: bool = False,
                    element_spec: Optional[Any] = None) -> Callable[[Any], Any]:
    """A tf.function(dist_batch) that trains one step and returns the loss (summed over replicas).

    dist_batch: an (images, one-hot labels[, weights]) element of `cluster.distribute`
    (weights from spread_short_batch; every replica must hold at least one row).
    Each replica computes its loss and gradients and calls `apply_gradients`, which SUM-all-reduces
    the replicas' gradients and applies them once to every copy of the weights (Adam steps once).
    Each step counts the rows actually in it (all replicas, copies counted once), so a short last
    batch is weighted by its true size.
    With return_metrics, returns (loss, {'accuracy', 'rows', 'learning_rate'}): the global batch's
    accuracy, its rows (copies counted once) and the learning rate this step used.
    element_spec: the distributed dataset's `element_spec`, to trace once for every batch size
    (without it the short last batch costs a second trace of the whole network).
    """
    variables = model.trainable_variables

    def replica_step(x, y_onehot, weights=None):
        global_rows = _global_rows(tf.shape(x)[0], weights)
        loss, grads, logits = replica_gradients(model, x, y_onehot, global_rows, weights)
        optimizer.apply_gradients(zip(grads, variables))  # all-reduce (SUM), then one Adam update
        hits = tf.cast(tf.equal(tf.argmax(logits, 1), tf.argmax(y_onehot, 1)), tf.float32)
        if weights is None:
            return loss, tf.reduce_sum(hits), tf.cast(tf.shape(x)[0], tf.float32)
        return loss, tf.reduce_sum(hits * weights), tf.reduce_sum(weights)

    @tf.function(input_signature=None if element_spec is None else [element_spec])
    def train_step(dist_batch):
        with strategy.scope():  # this strategy's cross-replica context, wherever we are called from
            learning_rate = optimizer.learning_rate  # schedule(iterations), read before the update
            loss, correct, rows = strategy.run(replica_step, args=dist_batch)
            total = lambda t: strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None)  # noqa: E731
            loss, correct, rows = total(loss), total(correct), total(rows)
        if not return_metrics:
            return loss
        rows = tf.cast(tf.round(rows), tf.int32)
        accuracy = correct / tf.cast(tf.maximum(rows, 1), tf.float32)
        return loss, {"accuracy": accuracy, "rows": rows, "learning_rate": learning_rate}

    return train_step


def make_eval_step(model: Any, strategy: Any, element_spec: Optional[Any] = None) -> Callable[[Any], Any]:
    """A tf.function(dist_batch) -> (summed cross-entropy, correct predictions, rows), inference mode.

    dist_batch and element_spec as for make_train_step; sums are weighted, so copied rows count once.
    """

    def replica_step(x, y_onehot, weights=None):
        if weights is None:
            weights = tf.ones([tf.shape(x)[0]])
        logits = model(x, training=False)
        cross_entropy = tf.nn.softmax_cross_entropy_with_logits(labels=y_onehot, logits=logits)
        hits = tf.cast(tf.equal(tf.argmax(logits, 1), tf.argmax(y_onehot, 1)), tf.float32)
        return tf.reduce_sum(cross_entropy * weights), tf.reduce_sum(hits * weights), tf.reduce_sum(weights)

    @tf.function(input_signature=None if element_spec is None else [element_spec])
    def eval_step(dist_batch):
        with strategy.scope():
            results = strategy.run(replica_step, args=dist_batch)
            return [strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None) for t in results]

    return eval_step


def validate(eval_step: Callable[[Any], Any], dist_val_dataset: Iterable[Any]) -> tuple[float, float]:
    """The whole validation set once: (accuracy, mean loss), both averaged over rows."""
    cross_entropy, correct, rows = 0.0, 0.0, 0.0
    for batch in dist_val_dataset:
        ce, c, r = eval_step(batch)
        cross_entropy, correct, rows = cross_entropy + float(ce), correct + float(c), rows + float(r)
    return round(correct) / round(rows), cross_entropy / rows


# ----------------------------------------------------------------------------------------------
# Model, optimizer and checkpoints.
# ----------------------------------------------------------------------------------------------
class Built(NamedTuple):
    """What `build` makes: the model and optimizer, their checkpoint and its manager, the best
    validation accuracy so far (a variable saved with them), and a line saying where the weights came from."""
    model: Any
    optimizer: Any
    checkpoint: Any
    manager: Any
    best_acc: Any
    origin: str


def build(strategy: Any, args: argparse.Namespace, worker: Optional[cluster.Worker] = None) -> Built:
    """Model, optimizer and checkpoint in the strategy's scope; resumed or pretrained as available.
    On a cluster (worker not None) `manager` writes only on the chief."""
    blocks = RESNET_V2_50_BLOCKS
    if args.units_per_block:
        blocks = tuple(spec._replace(num_units=n) for spec, n in zip(blocks, args.units_per_block))
    with strategy.scope():
        model = resnet_v2_50(num_classes=num_classes, keep_prob=args.keep_prob, blocks=blocks)
        optimizer = make_optimizer(args.boundaries, args.values)
        optimizer.build(model.trainable_variables)  # the slots now, so a checkpoint restores into them
        best_acc = tf.Variable(0.0, trainable=False, dtype=tf.float64, name="best_acc")  # exact python float
    # on a cluster the agreed shuffle seed is saved too: a resumed cluster keeps its batch order
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, best_acc=best_acc,
                                     **cluster.shared_seed(strategy, worker))
    reader, manager = cluster.checkpoint_managers(checkpoint, args.model_dir, worker, max_to_keep=5,
                                                  checkpoint_name="train-model.ckpt")
    if reader.latest_checkpoint:
        try:
            with strategy.scope():
                checkpoint.restore(reader.latest_checkpoint).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            raise UsageError(f"cannot resume from {reader.latest_checkpoint}: it does not match this "
                             f"model and optimizer ({str(e).splitlines()[0]}); use another --model_dir") from None
        return Built(model, optimizer, checkpoint, manager, best_acc,
                     f"Resuming from {reader.latest_checkpoint}: step {int(optimizer.iterations.numpy())}, "
                     f"best val_acc {float(best_acc.numpy()):.4f}")
    pretrained = args.pretrained or (resnet_model_path if tf.io.gfile.exists(resnet_model_path + ".index") else None)
    if pretrained is None:
        return Built(model, optimizer, checkpoint, manager, best_acc,
                     f"No pretrained checkpoint ({resnet_model_path} not found, no --pretrained): training from "
                     f"scratch")
    if not (tf.io.gfile.exists(pretrained + ".index") or tf.io.gfile.isdir(pretrained)):
        raise UsageError(f"pretrained checkpoint {pretrained} not found")
    try:
        with strategy.scope():
            report = tf1_checkpoints.load_tf1_checkpoint(model, pretrained, exclude_scopes=(checkpoint_exclude_scopes,))
    except (tf1_checkpoints.CheckpointMismatchError, tf.errors.OpError, ValueError) as e:
        raise UsageError(f"cannot restore the pretrained checkpoint {pretrained}: {e}") from None
    return Built(model, optimizer, checkpoint, manager, best_acc,
                 f"Restored {len(report.loaded)} variables from {pretrained} (excluded: {checkpoint_exclude_scopes})")


# ----------------------------------------------------------------------------------------------
# The session loop's counterpart.
# ----------------------------------------------------------------------------------------------
def check_inputs(args: argparse.Namespace, worker: Optional[cluster.Worker],
                 n: int) -> tuple[list[str], list[str], int]:
    """Set-up before any model: the data and folders checked (UsageError otherwise), and logged.
    Returns (train_files, valid_files, steps_per_epoch)."""
    embedded, changed, train_files, num_train, valid_files, num_valid = resolve_data(args)
    check_writable(args.model_dir, "--model_dir")
    for sub in ("train", "valid"):
        check_writable(os.path.join(args.log_dir, sub), "--log_dir")
    cluster.check_layout(args.model_dir, worker, args.num_replicas)
    print(f"data: {', '.join(train_files)} ({num_train} examples), valid {', '.join(valid_files)} "
          f"({num_valid} examples)")
    if embedded:
        print("No data given: the embedded synthetic set, with the embedded profile: "
              + (", ".join(changed) or "no sizes changed"))
    steps_per_epoch = -(-num_train // args.batch_size)
    last = num_train - (steps_per_epoch - 1) * args.batch_size
    print(f"global batch {args.batch_size} over {n} replicas; each epoch ends on a batch of {last} rows, "
          f"split over the replicas whole (no row dropped"
          + (f"; it would leave a replica empty: copied to each, weighted 1/{n})"
             if leaves_a_replica_empty(last, n) else ")"))
    return train_files, valid_files, steps_per_epoch


def validate_and_keep_best(eval_step: Callable[[Any], Any], dist_val_ds: Iterable[Any], valid_writer: Any, step: int,
                           lr: float, best_acc: Any, manager: Any) -> Optional[str]:
    """The legacy validation block: validate, write the summaries, print the original's lines, and
    save the model when it beats `best_acc` (which travels in the checkpoint, so a resumed run keeps
    it).  Returns the saved checkpoint's path, or None."""
    avg_acc, avg_loss = validate(eval_step, dist_val_ds)
    with valid_writer.as_default():
        write_scalar("lr", lr, step)
        write_scalar("accuracy", avg_acc, step)
        write_scalar("loss", avg_loss, step)
    print('------------------------------------------------------')
    print('Valid-----> ,Valid_Acc: {:.4f}, Valid_Loss: {:.7f}'.format(avg_acc, avg_loss))
    print('------------------------------------------------------')
    if avg_acc > float(best_acc.numpy()):
        best_acc.assign(avg_acc)
        saved = manager.save(checkpoint_number=step)
        print("Model saved successfully")
        print("Save the best model with val_acc %0.4f" % avg_acc)
        return saved
    print("Val_acc stay with val_acc %0.4f" % float(best_acc.numpy()), flush=True)
    return None


def train(args: argparse.Namespace) -> None:
    seed_program(args.seed, args.deterministic)
    # first: may split the CPU into virtual devices; MultiWorkerMirroredStrategy when TF_CONFIG names workers
    strategy, worker = cluster.make_strategy(args.num_replicas, connect_timeout=args.connect_timeout)
    n = strategy.num_replicas_in_sync
    train_files, valid_files, steps_per_epoch = check_inputs(args, worker, n)

    model, optimizer, checkpoint, manager, best_acc, origin = build(strategy, args, worker)
    run_step = cluster.step_runner(worker, checkpoint, args.model_dir, manager,
                                   lambda: int(optimizer.iterations.numpy()))
    print(origin)
    start = int(optimizer.iterations.numpy())
    total_steps = steps_per_epoch * args.epochs
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)
    train_ds, val_ds = make_datasets(train_files, valid_files, args.batch_size, args.valid_batch_size,
                                     args.shuffle_buffer, args.epochs, n, args.augment, skip_batches=start,
                                     shuffle_seed=cluster.shuffle_seed(checkpoint))
    dist_train_ds = cluster.distribute(strategy, worker, train_ds)
    dist_val_ds = cluster.distribute(strategy, worker, val_ds)
    iterator = iter(dist_train_ds)
    train_step = make_train_step(model, optimizer, strategy, return_metrics=True,
                                 element_spec=dist_train_ds.element_spec)
    eval_step = cluster.reporting_lost_peers(  # validation's all-reduces need every worker too
        worker, args.model_dir, make_eval_step(model, strategy, element_spec=dist_val_ds.element_spec))
    log_dir = worker.folder(args.log_dir) if worker else args.log_dir  # event files: the chief's only
    train_writer = tf.summary.create_file_writer(os.path.join(log_dir, "train"))
    valid_writer = tf.summary.create_file_writer(os.path.join(log_dir, "valid"))

    step, loss_t = start, float("nan")
    best_step, best_path = None, None
    trained_rows = interval_rows = 0
    train_time = interval_time = 0.0
    start_time = time.time()
    while step < total_steps:
        t_step = time.time()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        loss, metrics = run_step(train_step, batch)  # on a cluster, saves and exits on SIGTERM
        step += 1  # = optimizer.iterations: the legacy `step` after its `step += 1`
        loss_t, acc_t, lr = float(loss), float(metrics["accuracy"]), float(metrics["learning_rate"])
        if not tf.math.is_finite(loss):
            raise UsageError(f"the loss is {loss_t} at step {step}: training stopped")
        seconds = time.time() - t_step
        rows = int(metrics["rows"])
        trained_rows, interval_rows = trained_rows + rows, interval_rows + rows
        train_time, interval_time = train_time + seconds, interval_time + seconds
        if step % args.log_every == 0:
            # The legacy line; here Loss and Train_Acc are the whole global batch's.
            print('Step: {},Train_Acc: {:.4f},Loss: {:.8f}'.format(step, acc_t, loss_t)
                  + f",Examples/sec: {interval_rows / max(interval_time, 1e-9):.1f}"
                  + progress(step, total_steps, time.time() - start_time, step - start), flush=True)
            interval_rows, interval_time = 0, 0.0
            with train_writer.as_default():
                write_scalar("lr", lr, step)
                write_scalar("accuracy", acc_t, step)
                write_scalar("loss", loss_t, step)
        if step % args.valid_every == 0:  # validation accuracy; the best model saved
            saved = validate_and_keep_best(eval_step, dist_val_ds, valid_writer, step, lr, best_acc, manager)
            if saved:
                best_step, best_path = step, saved
    train_writer.close()
    valid_writer.close()
    if step > start and best_step != step:
        final = manager.save(checkpoint_number=step)
    else:  # nothing trained, or the best model was just saved at this very step
        final = manager.latest_checkpoint
    end_time = time.time()
    print("Total time:", end_time - start_time)
    print('Ended......')
    print(f"summary: {step - start} steps this run (step {start} -> {step} of {total_steps}) in "
          f"{end_time - start_time:.1f} s wall ({trained_rows / max(train_time, 1e-9):.1f} examples/sec in "
          f"training steps); "
          + (f"best Valid_Acc {float(best_acc.numpy()):.4f} at step {best_step}, saved as {best_path}; "
             if best_path else f"no better Valid_Acc this run (best so far {float(best_acc.numpy()):.4f}); ")
          + f"final model {final}; rows dropped: 0 of {trained_rows}; event files in {args.log_dir}")
    cluster.finish(worker)  # on a cluster: every worker leaves together, quietly


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_reporting_usage_errors(train, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
