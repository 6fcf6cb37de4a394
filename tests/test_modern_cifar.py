"""The modern CIFAR trainer (`modern/cifar_resnet.py`): loss scaling over replicas, short batches,
the optimizer against TF1's, and end-to-end runs (checkpoints, summaries, resume, determinism).

In-process checks use a 2-replica MirroredStrategy over virtual CPUs and a ResNet-v2 with one unit
per block (the same code as ResNet-v2-50, a fraction of the build time); keep_prob 1 so that the
replicas' outputs can be recomputed outside the strategy.
"""
import glob
import os
import re
from concurrent.futures import ThreadPoolExecutor

from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from modern import cifar_resnet, keras_adapter
from modern.checkpoints import save_tf1_checkpoint
from modern.resnet_v2 import RESNET_V2_50_BLOCKS, resnet_v2_50
from modern.runtime import DeviceSetupError, configure_devices, make_strategy
from records import cifar10
from conftest import run_program

# Logical devices must be configured before TensorFlow's runtime starts: do it at import (pytest
# imports every test module before running any test).  A failure is reported by the fixture.
try:
    configure_devices(2)
    _DEVICE_ERROR = None
except DeviceSetupError as e:
    _DEVICE_ERROR = str(e)

TINY_BLOCKS = tuple(spec._replace(num_units=1) for spec in RESNET_V2_50_BLOCKS)
TINY_FLAGS = ["--units_per_block", "1", "1", "1", "1"]


@pytest.fixture(scope="module")
def strategy():
    if _DEVICE_ERROR:
        pytest.fail(_DEVICE_ERROR)
    return make_strategy(2, log=None)


@pytest.fixture(scope="module")
def model(strategy):
    with strategy.scope():
        return resnet_v2_50(num_classes=10, keep_prob=1.0, blocks=TINY_BLOCKS)


def _batch(rows, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.uniform(-1, 1, (rows, 32, 32, 3)).astype(np.float32)
    y = np.eye(10, dtype=np.float32)[rng.randint(0, 10, rows)]
    return x, y


def _distribute(strategy, x, y):
    """One global batch through the trainer's path: spread_short_batch, then the strategy's split."""
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x))
    dataset = dataset.map(lambda a, b: cifar_resnet.spread_short_batch(a, b, strategy.num_replicas_in_sync))
    return next(iter(strategy.experimental_distribute_dataset(dataset)))


def _local(strategy, value):
    return [t.numpy() for t in strategy.experimental_local_results(value)]


def _weights(model):
    return [v.numpy() for v in model.trainable_variables]


def _summed_gradients(strategy, model, dist, global_rows):
    @tf.function
    def grads_fn(batch):
        loss, grads = strategy.run(
            lambda a, b, w: cifar_resnet.replica_gradients(model, a, b, global_rows, w)[:2], args=batch)
        total = lambda t: strategy.reduce(tf.distribute.ReduceOp.SUM, t, axis=None)  # noqa: E731
        return total(loss), [total(g) for g in grads]

    return grads_fn(dist)


def _one_device(model, x, y, slices, global_rows):
    """The same arithmetic without the strategy: each slice through the model on its own (batch
    norm uses that slice's statistics), every row weighted 1/global_rows."""
    loss, grads = 0.0, None
    for rows in slices:
        with tf.GradientTape() as tape:
            ce = tf.nn.softmax_cross_entropy_with_logits(y[rows], model(x[rows], training=True))
            part = tf.reduce_sum(ce) / global_rows
        g = tape.gradient(part, model.trainable_variables)
        loss += float(part)
        grads = g if grads is None else [a + b for a, b in zip(grads, g)]
    return loss, grads


def _relative_l2_error(grads, expected):
    """||a - b|| / ||b|| over all gradients at once (per-tensor maxima are dominated by round-off in
    tensors whose true gradient is ~0, e.g. conv biases just before a batch norm)."""
    diff = sum(float(tf.reduce_sum(tf.square(a - b))) for a, b in zip(grads, expected))
    norm = sum(float(tf.reduce_sum(tf.square(b))) for b in expected)
    return (diff / norm) ** 0.5


def test_batch_smaller_than_replica_count_is_copied_to_every_replica_at_weight_one_over_n(strategy):
    x, y = _batch(1)
    dist = _distribute(strategy, x, y)
    assert [a.shape[0] for a in _local(strategy, dist[0])] == [1, 1]  # not [1, 0]
    assert [w.tolist() for w in _local(strategy, dist[2])] == [[0.5], [0.5]]
    x, y = _batch(3)
    dist = _distribute(strategy, x, y)
    assert [a.shape[0] for a in _local(strategy, dist[0])] == [2, 1]
    assert [w.tolist() for w in _local(strategy, dist[2])] == [[1.0, 1.0], [1.0]]


def test_one_row_on_two_replicas_gives_that_rows_loss_and_gradient_once(strategy, model):
    x, y = _batch(1)
    loss, grads = _summed_gradients(strategy, model, _distribute(strategy, x, y), 1)
    expected_loss, expected_grads = _one_device(model, x, y, [slice(0, 1)], 1.0)
    assert np.isfinite(float(loss)) and float(loss) > 0
    np.testing.assert_allclose(float(loss), expected_loss, rtol=1e-6)
    assert all(np.all(np.isfinite(g.numpy())) for g in grads)
    assert _relative_l2_error(grads, expected_grads) < 1e-5


def test_one_row_train_step_is_finite_and_counts_the_row_once(strategy, model):
    x, y = _batch(1, seed=1)
    expected = float(tf.nn.softmax_cross_entropy_with_logits(y, model(x, training=True))[0])
    with strategy.scope():
        optimizer = cifar_resnet.make_optimizer()
        optimizer.build(model.trainable_variables)
    step = cifar_resnet.make_train_step(model, optimizer, strategy, return_metrics=True)
    loss, metrics = step(_distribute(strategy, x, y))
    assert int(metrics["rows"]) == 1
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    assert all(np.all(np.isfinite(w)) for w in _weights(model))
    moving = [v for v in model.non_trainable_variables if "moving" in v.path]
    assert moving and all(np.all(np.isfinite(c)) for v in moving for c in _local(strategy, v.value))
    assert int(optimizer.iterations.numpy()) == 1


def test_odd_batch_weighs_every_row_once_over_the_global_batch(strategy, model):
    """5 rows on 2 replicas (3 + 2): loss and summed gradients = sum over all 5 rows / 5."""
    x, y = _batch(5, seed=2)
    loss, grads = _summed_gradients(strategy, model, _distribute(strategy, x, y), 5)
    expected_loss, expected_grads = _one_device(model, x, y, [slice(0, 3), slice(3, 5)], 5.0)
    np.testing.assert_allclose(float(loss), expected_loss, rtol=1e-5)
    assert _relative_l2_error(grads, expected_grads) < 1e-4
    # The legacy weighting (tower means averaged: 1/6 per row of the 3, 1/4 per row of the 2) moves
    # the loss by exactly (mean of the 2 rows - mean of the 3) / 10.  On an untrained model every
    # row's loss is near ln 10, so that can be ~0 (the weights here are unseeded); the gradients,
    # one direction per row, are where the weighting measurably differs.
    head_loss, head_grads = _one_device(model, x, y, [slice(0, 3)], 6.0)
    tail_loss, tail_grads = _one_device(model, x, y, [slice(3, 5)], 4.0)
    predicted = (tail_loss * 4.0 / 2 - head_loss * 6.0 / 3) / 10
    np.testing.assert_allclose(head_loss + tail_loss - expected_loss, predicted, rtol=1e-3, atol=1e-6)
    legacy_grads = [a + b for a, b in zip(head_grads, tail_grads)]
    assert _relative_l2_error(grads, legacy_grads) > 1e-2


def test_piecewise_constant_matches_tf1_at_each_boundary():
    boundaries, values = [10000, 25000], [0.001, 0.0001, 0.00001]
    optimizer = cifar_resnet.make_optimizer(boundaries, values)

    def keras_rate(step):  # public API only: the rate the optimizer uses after `step` updates
        optimizer.iterations.assign(step)
        return float(optimizer.learning_rate)

    for b in boundaries:
        for step in (b - 1, b, b + 1):
            tf1 = tf.compat.v1.train.piecewise_constant(tf.constant(step, tf.int64), boundaries, values)
            tf1 = tf1() if callable(tf1) else tf1
            assert keras_rate(step) == float(tf1), step
    assert np.float32(keras_rate(10000)) == np.float32(0.001)
    assert np.float32(keras_rate(10001)) == np.float32(0.0001)


def test_optimizer_reads_the_rate_at_the_step_before_its_update():
    """Update k uses schedule(k) (k counted from 0), as the legacy reads global_step before apply."""
    optimizer = cifar_resnet.make_optimizer([2], [1.0, 0.5])
    assert optimizer.epsilon == 1e-8
    w = tf.Variable([0.0])
    used = []
    for _ in range(4):
        used.append(float(optimizer.learning_rate))
        optimizer.apply_gradients([(tf.constant([1.0]), w)])
    assert used == [1.0, 1.0, 1.0, 0.5]  # steps 0, 1, 2 (<= boundary 2), then 3


def _build_args(tmp_path, pretrained):
    return SimpleNamespace(units_per_block=[1, 1, 1, 1], keep_prob=1.0, boundaries=[10000, 25000],
                           values=[0.001, 0.0001, 0.00001], model_dir=str(tmp_path / "models"),
                           pretrained=pretrained)


def test_pretrained_tf1_checkpoint_restores_all_but_logits(strategy, model, tmp_path):
    prefix = save_tf1_checkpoint(model, str(tmp_path / "tf1" / "resnet_v2_50.ckpt"))
    fresh, _, _, _, _, origin = cifar_resnet.build(strategy, _build_args(tmp_path, prefix))
    assert origin.startswith("Restored") and "Logits" in origin
    for new, old in zip(fresh.trainable_variables, model.trainable_variables):
        if new.path.startswith("resnet_v2_50/Logits_fc"):
            if new.path.endswith("kernel"):  # the head keeps its fresh initialisation
                assert not np.array_equal(new.numpy(), old.numpy())
        else:
            assert np.array_equal(new.numpy(), old.numpy()), new.path
    with pytest.raises(cifar_resnet.UsageError, match="not found"):
        cifar_resnet.build(strategy, _build_args(tmp_path, str(tmp_path / "missing.ckpt")))


def _tf1_adam(start, grads):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        w = tf.compat.v1.Variable(start)
        g = tf.compat.v1.placeholder(tf.float32, start.shape)
        step = tf.compat.v1.Variable(0, trainable=False)
        lr = tf.compat.v1.train.piecewise_constant(step, [2], [0.1, 0.01])
        train = tf.compat.v1.train.AdamOptimizer(lr).apply_gradients([(g, w)], step)
        sess.run(tf.compat.v1.global_variables_initializer())
        for grad in grads:
            sess.run(train, {g: grad})
        return sess.run(w)


def _keras_adam(optimizer, start, grads):
    v = tf.Variable(start)
    for grad in grads:
        optimizer.apply_gradients([(tf.constant(grad), v)])
    return v.numpy()


def test_adam_matches_tf1_adam_optimizer_over_steps():
    """Same update rule, boundary crossed at step 2; gradients of 1e-7 so that epsilon matters."""
    rng = np.random.RandomState(3)
    start = np.linspace(-1, 1, 6).astype(np.float32)
    grads = (rng.normal(size=(5, 6)) * np.array([1, 1, 1, 1e-7, 1e-7, 1e-7])).astype(np.float32)
    legacy = _tf1_adam(start, grads)
    modern = _keras_adam(cifar_resnet.make_optimizer([2], [0.1, 0.01]), start, grads)
    np.testing.assert_allclose(modern, legacy, rtol=2e-6, atol=0)
    assert np.min(np.abs(modern - start)) > 1e-3  # every weight moved
    # Keras' default epsilon (1e-7) is far off where the gradients are small:
    keras_default = _keras_adam(cifar_resnet.make_optimizer([2], [0.1, 0.01], epsilon=1e-7), start, grads)
    assert np.max(np.abs(keras_default - legacy)) > 1e-3


def test_fused_adam_runs_tf1_kernel_arithmetic_and_keeps_keras_slots():
    """FusedAdam (the default) takes 1 - beta in float32 as TF1's ApplyAdam does, so after one step
    from zero slots m = (1 - 0.9f) * g exactly; Keras' own Adam gives 0.1 * g.  Both keep the
    slots where `adam_slots` finds them and agree to float32 round-off over several steps."""
    grad = np.array([1.0, -3.0, 1e-7], np.float32)
    slots = {}
    for fused in (True, False):
        optimizer = cifar_resnet.make_optimizer([2], [0.1, 0.01], fused=fused)
        w = tf.Variable(np.zeros(3, np.float32))
        optimizer.apply_gradients([(tf.constant(grad), w)])
        m, v = keras_adapter.adam_slots(optimizer, w)
        slots[fused] = m.numpy(), v.numpy()
    np.testing.assert_array_equal(slots[True][0], (np.float32(1) - np.float32(0.9)) * grad)
    np.testing.assert_array_equal(slots[False][0], np.float32(0.1) * grad)
    rng = np.random.RandomState(5)
    grads = rng.normal(size=(4, 6)).astype(np.float32)
    start = np.linspace(-1, 1, 6).astype(np.float32)
    fused = _keras_adam(cifar_resnet.make_optimizer([2], [0.1, 0.01], fused=True), start, grads)
    keras_adam = _keras_adam(cifar_resnet.make_optimizer([2], [0.1, 0.01], fused=False), start, grads)
    np.testing.assert_allclose(fused, keras_adam, rtol=1e-5, atol=0)


# ----------------------------------------------------------------------------------------------
# End to end: a few steps of the program on a small data set (one unit per block).
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cifar")
    # 25 rows in batches of 8: 8, 8, 8, then 1 row for 2 replicas at step 4.
    train, valid = cifar10.make_synthetic(str(folder), num_train=25, num_valid=12, seed=5)
    return train, valid


def _run(data, model_dir, log_dir, max_steps, *extra):
    train, valid = data
    return run_program(["modern/cifar_resnet.py", *TINY_FLAGS, "--train_tfrecords", train,
                        "--test_tfrecords", valid, "--batch_size", "8", "--valid_batch_size", "5",
                        "--max_steps", str(max_steps), "--log_every", "2", "--valid_every", "4",
                        "--model_dir", model_dir, "--log_dir", log_dir, "--deterministic", *extra])


def _tags(folder):
    tags = set()
    for path in glob.glob(os.path.join(folder, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update((event.step, v.tag) for v in event.summary.value)
    return tags


def _checkpoint_values(prefix):
    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def _step_lines(stdout):
    """The loss and accuracy lines, without their examples/sec (a timing)."""
    return [line.split(",Examples/sec")[0] for line in stdout.splitlines()
            if line.startswith(("Step:", "Valid----->"))]


@pytest.fixture(scope="module")
def two_runs(small_data, tmp_path_factory):
    """Two identical --deterministic runs of 4 steps, the 4th on a batch of one row.

    Run side by side: most of a short run is single-threaded tracing, so two fit on 2 cores.
    """
    roots = [tmp_path_factory.mktemp(f"run_{name}") for name in ("a", "b")]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda root: _run(small_data, str(root / "models"), str(root / "logs"), 4),
                                roots))
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return list(zip(roots, results))


def test_short_run_writes_checkpoints_and_legacy_summary_tags(two_runs):
    root, result = two_runs[0]
    assert "Step: 4,Train_Acc:" in result.stdout and "Valid----->" in result.stdout
    assert re.search(r"Step: 4,Train_Acc: [\d.]+,Loss: [\d.]+,Examples/sec: [\d.]+ \[step 4/4, ETA 0s\]", result.stdout)
    assert "each epoch ends on a batch of 1 rows" in result.stdout
    assert "summary: 4 steps this run (step 0 -> 4 of 4)" in result.stdout
    assert "rows dropped: 0 of 25" in result.stdout  # the 1-row batch counted once, nothing lost
    assert "Ended......" in result.stdout
    assert os.path.exists(root / "models" / "train-model.ckpt-4.index")  # (the resume test adds ckpt-6 here)
    for sub in ("train", "valid"):
        tags = _tags(str(root / "logs" / sub))
        assert {(4, "lr"), (4, "accuracy"), (4, "loss")} <= tags, (sub, tags)
    assert (2, "loss") in _tags(str(root / "logs" / "train"))


def test_deterministic_runs_are_bit_identical(two_runs):
    (root_a, run_a), (root_b, run_b) = two_runs
    assert _step_lines(run_a.stdout) == _step_lines(run_b.stdout) and _step_lines(run_a.stdout)
    a = _checkpoint_values(str(root_a / "models" / "train-model.ckpt-4"))
    b = _checkpoint_values(str(root_b / "models" / "train-model.ckpt-4"))
    assert a.keys() == b.keys() and len(a) > 100
    different = [name for name in a if not np.array_equal(a[name], b[name])]
    assert not different, different[:5]


def test_second_invocation_resumes_from_the_latest_checkpoint(small_data, two_runs):
    root, _ = two_runs[0]
    best = float(_checkpoint_values(str(root / "models" / "train-model.ckpt-4"))["best_acc/.ATTRIBUTES/VARIABLE_VALUE"])
    result = _run(small_data, str(root / "models"), str(root / "logs"), 6)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Resuming from" in result.stdout and f"train-model.ckpt-4: step 4, best val_acc {best:.4f}" in result.stdout
    # No validation in steps 5-6 (every 4): the run ends with the best accuracy it resumed with.
    assert f"no better Valid_Acc this run (best so far {best:.4f})" in result.stdout
    assert "Step: 6,Train_Acc:" in result.stdout and "Step: 2," not in result.stdout
    assert "[step 6/6, ETA 0s]" in result.stdout  # the resumed run's own 2 steps set the pace
    assert tf.train.latest_checkpoint(str(root / "models")).endswith("train-model.ckpt-6")
    values = _checkpoint_values(str(root / "models" / "train-model.ckpt-6"))
    iterations = [v for k, v in values.items() if k.startswith("optimizer/_iterations")]
    assert [int(v) for v in iterations] == [6]


def test_resume_restores_every_saved_value_moving_statistics_and_adam_slots_included(strategy, two_runs,
                                                                                     tmp_path):
    """In-process: build() on run b's folder restores step 4; written again, it is the same checkpoint."""
    root, _ = two_runs[1]
    prefix = str(root / "models" / "train-model.ckpt-4")
    saved = _checkpoint_values(prefix)
    args = _build_args(tmp_path, None)
    args.model_dir = str(root / "models")
    model, optimizer, checkpoint, _, best_acc, origin = cifar_resnet.build(strategy, args)
    assert origin.startswith(f"Resuming from {prefix}: step 4")
    assert float(best_acc.numpy()) == float(saved["best_acc/.ATTRIBUTES/VARIABLE_VALUE"])
    restored = _checkpoint_values(checkpoint.write(str(tmp_path / "again" / "ckpt")))
    names = [n for n in saved if n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    assert sorted(names) == sorted(n for n in restored if n != "_CHECKPOINTABLE_OBJECT_GRAPH")
    different = [n for n in names if not np.array_equal(saved[n], restored[n])]
    assert not different, different[:5]
    # What the comparison covered: the batch-norm moving statistics, moved away from their
    # initial values by 4 steps, and Adam's two slots per trainable variable, non-zero.
    moving = [v for v in model.non_trainable_variables if "moving" in v.path]
    assert len(moving) == 2 * (4 * 3 + 1)  # mean and variance of 3 batch norms per unit, 4 units, + postnorm
    assert all(not np.array_equal(v.numpy(), np.zeros(v.shape) if "mean" in v.path else np.ones(v.shape))
               for v in moving)
    slots = [v for v in optimizer.variables if tuple(v.shape) != ()]
    assert len(slots) == 2 * len(model.trainable_variables)
    assert sum(bool(np.any(v.numpy() != 0)) for v in slots) == len(slots)
    assert len(names) >= len(moving) + len(slots) + len(model.trainable_variables)


def test_missing_data_file_is_one_paragraph_and_exit_code_2(strategy, tmp_path, capsys):
    code = cifar_resnet.main(["--data_dir", str(tmp_path), "--train_tfrecords", str(tmp_path / "nope.tfrecords"),
                              "--model_dir", str(tmp_path / "m"), "--log_dir", str(tmp_path / "l")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and "nope.tfrecords" in err and len(err.strip().splitlines()) == 1


def test_a_batch_the_strategy_would_leave_a_replica_empty_is_recognised():
    # MirroredStrategy's re-batching: ceil(B / N) rows per replica, in order.
    empty = {(1, 2): True, (3, 2): False, (4, 3): True, (5, 3): False, (5, 4): True, (6, 4): True,
             (7, 4): False, (9, 4): True, (16, 2): False, (1, 1): False}
    assert {k: bool(cifar_resnet.leaves_a_replica_empty(*k)) for k in empty} == empty


def test_no_data_means_the_embedded_profile_and_says_what_differs(tmp_path, monkeypatch, capsys):
    """`python modern/cifar_resnet.py`: the README's modern demo, up to the model (the same embedded
    set and profile as the legacy program's, made here by the same generator, smaller)."""
    monkeypatch.setattr(cifar10, "SYNTHETIC_TRAIN", 21)
    monkeypatch.setattr(cifar10, "SYNTHETIC_VALID", 51)
    monkeypatch.setattr(cifar_resnet, "EMBEDDED_DATA_DIR", str(tmp_path / "embedded"))
    args = cifar_resnet.parse_args(["--model_dir", str(tmp_path / "m"), "--log_dir", str(tmp_path / "l")])
    train, valid, steps_per_epoch = cifar_resnet.check_inputs(args, None, 2)
    assert (args.batch_size, args.valid_batch_size, args.epochs) == (16, 50, 8)
    assert train == [str(tmp_path / "embedded" / cifar10.TRAIN_FILE)] and steps_per_epoch == 2
    out = capsys.readouterr().out
    assert ("No data given: the embedded synthetic set, with the embedded profile: batch_size 16 (original 256), "
            "valid_batch_size 50 (original 256), epochs 8 (original 200)") in out
    # 21 = 16 + 5 rows: the short last batch goes to the replicas whole (3 + 2), no row dropped.
    assert "global batch 16 over 2 replicas; each epoch ends on a batch of 5 rows" in out and "(no row dropped)" in out


def test_data_dir_means_the_originals_defaults(tmp_path, capsys):
    cifar10.make_synthetic(str(tmp_path), num_train=4, num_valid=4, seed=7)
    args = cifar_resnet.parse_args(["--data_dir", str(tmp_path), "--model_dir", str(tmp_path / "m"),
                                    "--log_dir", str(tmp_path / "l")])
    train, valid, _ = cifar_resnet.check_inputs(args, None, 2)
    assert (args.batch_size, args.valid_batch_size, args.epochs) == (256, 256, 200)
    assert (args.num_replicas, args.keep_prob, args.boundaries) == (2, 0.6, [10000, 25000])
    assert train == [str(tmp_path / cifar10.TRAIN_FILE)] and valid == [str(tmp_path / cifar10.TEST_FILE)]
    assert "embedded" not in capsys.readouterr().out
