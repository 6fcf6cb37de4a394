"""The modern MNIST trainer (`modern/mnist_multi_gpu.py`): the legacy loss, schedule and moving average under a
2-replica MirroredStrategy, short batches, and end-to-end runs (checkpoints, summaries, resume,
determinism)."""
import glob
import os
import re
from concurrent.futures import ThreadPoolExecutor

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import run_program
from modern import mnist_multi_gpu as mnist
from modern.runtime import DeviceSetupError, configure_devices, make_strategy
from records import mnist as mnist_records

# Logical devices must be configured before TensorFlow's runtime starts: do it at import (pytest
# imports every test module before running any test).  A failure is reported by the fixture.
try:
    configure_devices(2)
    _DEVICE_ERROR = None
except DeviceSetupError as e:
    _DEVICE_ERROR = str(e)

SCALE = 0.0001


@pytest.fixture(scope="module")
def strategy():
    if _DEVICE_ERROR:
        pytest.fail(_DEVICE_ERROR)
    return make_strategy(2, log=None)


def _trainer(strategy, seed=0):
    """A fresh model, optimizer, moving average and train step (returning the summed gradients), its
    weights drawn from `seed` (Keras 3's initialisers draw from keras' own generator, which
    tf.random.set_seed does not seed: without this, each test's weights depend on what ran before it)."""
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = mnist.build_model(SCALE)
        optimizer = mnist.make_optimizer()
        optimizer.build(model.trainable_variables)
        ema, shadows = mnist.make_moving_average(model, optimizer)
    step = mnist.make_train_step(model, optimizer, strategy, ema=ema, return_grads=True)
    return model, optimizer, shadows, step


def _batch(rows, seed=0):
    rng = np.random.RandomState(seed)
    return rng.randint(0, 256, (rows, 784)).astype(np.float32), rng.randint(0, 10, rows).astype(np.int32)


def _distribute(strategy, x, y):
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x))
    return next(iter(strategy.experimental_distribute_dataset(dataset)))


def _legacy_tower(weights, x, y):
    """One legacy tower on the given weights: loss = mean cross-entropy + scale * sum(w**2) / 2
    over the two weight matrices, and its gradients (layer1/weights, biases, layer2/...)."""
    variables = [tf.Variable(w) for w in weights]
    with tf.GradientTape() as tape:
        w1, b1, w2, b2 = variables
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
        ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        loss = ce + SCALE * (tf.nn.l2_loss(w1) + tf.nn.l2_loss(w2))
    return float(loss), [g.numpy() for g in tape.gradient(loss, variables)]


def _assert_close(got, expected):
    """float32 agreement: 1e-4 relative, plus round-off on the tensor's own scale (inputs are 0..255)."""
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6 * np.max(np.abs(expected)))


def _values(model):
    return [v.numpy() for v in model.trainable_variables]


def test_model_has_the_legacy_layers_initialisers_and_half_scale_l2(strategy):
    model, _, shadows, _ = _trainer(strategy)
    assert [mnist.legacy_name(v) for v in model.trainable_variables] == \
        ["layer1/weights", "layer1/biases", "layer2/weights", "layer2/biases"]
    assert [tuple(v.shape) for v in model.trainable_variables] == [(784, 500), (500,), (500, 10), (10,)]
    w1, b1, w2, b2 = _values(model)
    assert np.all(b1 == 0) and np.all(b2 == 0)
    assert np.max(np.abs(w1)) <= 0.2 and abs(np.std(w1) - 0.088) < 0.005  # truncated at 2 sigma
    expected = SCALE * (np.sum(w1.astype(np.float64) ** 2) + np.sum(w2.astype(np.float64) ** 2)) / 2
    np.testing.assert_allclose(float(tf.add_n(model.losses)), expected, rtol=1e-5)
    assert sorted(shadows) == sorted(mnist.legacy_name(v) for v in model.trainable_variables)


def test_replicas_sum_to_the_legacy_average_of_towers(strategy):
    """Each replica its own 4 rows: summed loss and gradient = the mean over towers of
    (mean cross-entropy + regulariser), the regulariser counted once."""
    model, _, _, step = _trainer(strategy)
    weights = _values(model)
    x, y = _batch(8)
    loss, grads = step(_distribute(strategy, x, y))
    towers = [_legacy_tower(weights, x[i:i + 4], y[i:i + 4]) for i in (0, 4)]
    np.testing.assert_allclose(float(loss), np.mean([t[0] for t in towers]), rtol=1e-5)
    for got, *tower_grads in zip(grads, *[t[1] for t in towers]):
        _assert_close(got.numpy(), np.mean(tower_grads, axis=0))
    # The regulariser counted N times (each replica adding it whole) would be visible:
    reg = SCALE * np.sum(weights[0].astype(np.float64) ** 2) / 2
    assert reg > 1e-3 and abs(float(loss) + reg - np.mean([t[0] for t in towers])) > 1e-4


def test_same_batch_per_replica_gives_one_towers_gradient(strategy, tmp_path):
    x, y = _batch(6, seed=1)
    path = str(tmp_path / "six.tfrecords")
    mnist_records.write_tfrecords(path, x.astype(np.uint8), y)
    dataset = mnist.get_input(path, 6, 2, same_batch_per_replica=True)
    batch = next(iter(strategy.experimental_distribute_dataset(dataset)))
    rows = [t.numpy() for t in strategy.experimental_local_results(batch[0])]
    assert rows[0].shape == (6, 784) and np.array_equal(rows[0], rows[1])
    model, _, _, step = _trainer(strategy)
    weights = _values(model)
    loss, grads = step(batch)
    tower_loss, tower_grads = _legacy_tower(weights, rows[0], strategy.experimental_local_results(batch[1])[0])
    np.testing.assert_allclose(float(loss), tower_loss, rtol=1e-5)
    for got, expected in zip(grads, tower_grads):
        _assert_close(got.numpy(), expected)


def test_short_batches_stay_finite_and_weigh_every_row_once(strategy):
    for rows, split in ((1, [1, 0]), (3, [2, 1])):
        model, _, _, step = _trainer(strategy)
        weights = _values(model)
        x, y = _batch(rows, seed=rows)
        dist = _distribute(strategy, x, y)
        assert [t.shape[0] for t in strategy.experimental_local_results(dist[0])] == split
        loss, grads = step(dist)
        expected_loss, expected_grads = _legacy_tower(weights, x, y)  # one device, all rows
        np.testing.assert_allclose(float(loss), expected_loss, rtol=1e-5)
        for got, expected in zip(grads, expected_grads):
            _assert_close(got.numpy(), expected)
        assert all(np.all(np.isfinite(w)) for w in _values(model))


def test_learning_rate_equals_tf1_exponential_decay():
    optimizer = mnist.make_optimizer(0.001, 60000 / 100, 0.99)
    for step in (0, 1, 599, 600, 601, 1000, 12345):
        optimizer.iterations.assign(step)  # public API only: the rate used after `step` updates
        rate = float(optimizer.learning_rate)
        tf1 = tf.compat.v1.train.exponential_decay(0.001, tf.constant(step), 60000 / 100, 0.99)
        tf1 = tf1() if callable(tf1) else tf1
        np.testing.assert_allclose(rate, float(tf1), rtol=1e-6)
        np.testing.assert_allclose(rate, 0.001 * 0.99 ** (step / 600), rtol=1e-6)


def test_moving_average_follows_the_legacy_warm_up(strategy):
    """shadow <- shadow - (1 - d_n) (shadow - w), d_n = min(0.99, (1 + n) / (10 + n)), n = steps done."""
    model, optimizer, shadows, step = _trainer(strategy)
    expected = {mnist.legacy_name(v): v.numpy().astype(np.float64) for v in model.trainable_variables}
    no_warm_up = dict(expected)
    for k in range(3):
        step(_distribute(strategy, *_batch(4, seed=10 + k)))
        n = int(optimizer.iterations.numpy())
        decay = min(0.99, (1 + n) / (10 + n))
        for v in model.trainable_variables:
            name = mnist.legacy_name(v)
            expected[name] = expected[name] - (1 - decay) * (expected[name] - v.numpy())
            no_warm_up[name] = no_warm_up[name] - 0.01 * (no_warm_up[name] - v.numpy())
    assert n == 3
    for name, shadow in shadows.items():
        for copy in strategy.experimental_local_results(shadow):
            np.testing.assert_allclose(copy.numpy(), expected[name], rtol=1e-5, atol=1e-7)
    # A moving average without the warm-up (decay 0.99 from step 1) would be far off:
    assert np.max(np.abs(shadows["layer1/weights"].numpy() - no_warm_up["layer1/weights"])) > 1e-3


# ----------------------------------------------------------------------------------------------
# End to end: the program on a small data set.
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mnist")
    train, held_out = str(folder / "train.tfrecords"), str(folder / "eval.tfrecords")
    mnist_records.make_synthetic(train, 1000, seed=3)
    mnist_records.make_synthetic(held_out, 200, seed=4)
    return train, held_out


def _run(data, model_dir, steps):
    train, held_out = data
    return run_program(["modern/mnist_multi_gpu.py", "--data_path", train, "--eval_data_path", held_out,
                        "--max_steps", str(steps), "--model_save_path", model_dir, "--deterministic"])


def _checkpoint_values(prefix):
    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.fixture(scope="module")
def two_runs(small_data, tmp_path_factory):
    """Two identical --deterministic runs of 15 steps, side by side."""
    folders = [str(tmp_path_factory.mktemp(f"mnist_run_{name}")) for name in ("a", "b")]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda folder: _run(small_data, folder, 15), folders))
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return list(zip(folders, results))


def test_short_run_writes_checkpoints_summaries_and_evaluates_the_average(two_runs):
    folder, result = two_runs[0]
    assert re.search(r": step 10, loss = [\d.]+ \([\d.]+ examples/sec; [\d.]+ sec/batch\) "
                     r"\[step 11/15, ETA \d", result.stdout)
    assert "After 15 training step(s), validation accuracy using average model is" in result.stdout
    assert tf.train.latest_checkpoint(folder).endswith("model.ckpt-14")
    assert os.path.exists(os.path.join(folder, "model.ckpt-0.index"))
    values = _checkpoint_values(os.path.join(folder, "model.ckpt-14"))
    assert any(name.startswith("moving_averages/layer1") for name in values), sorted(values)[:10]
    tags = set()
    for path in glob.glob(os.path.join(folder, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update((event.step, v.tag) for v in event.summary.value)
    assert {(10, "layer1/weights"), (10, "gradients_on_average/layer2/biases"), (10, "loss")} <= tags


def test_eval_program_gives_the_trainers_accuracy_from_the_checkpoint_alone(small_data, two_runs, tmp_path):
    """`python modern/mnist_eval.py`, beside legacy/mnist_eval.py: the shadows restored from the
    checkpoint give exactly the accuracy the trainer printed at its end."""
    folder, result = two_runs[0]
    trained = re.search(r"After 15 training step\(s\), validation accuracy using average model is ([\d.]+)",
                        result.stdout).group(1)
    done = run_program(["modern/mnist_eval.py", "--model_save_path", folder, "--data_path", small_data[1]])
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"After 15 training step(s), validation accuracy = {trained} (200 examples of" in done.stdout
    empty = run_program(["modern/mnist_eval.py", "--model_save_path", tmp_path, "--data_path", small_data[1]])
    assert empty.returncode == 2 and "no checkpoint found in" in empty.stderr


def test_deterministic_runs_are_bit_identical(two_runs):
    (folder_a, run_a), (folder_b, run_b) = two_runs
    last = [line.split(" in ")[0] + line.split(";")[-1] for line in (run_a.stdout, run_b.stdout)
            for line in line.splitlines() if line.startswith("Ended:")]
    assert len(last) == 2 and last[0] == last[1]
    a = _checkpoint_values(os.path.join(folder_a, "model.ckpt-14"))
    b = _checkpoint_values(os.path.join(folder_b, "model.ckpt-14"))
    assert a.keys() == b.keys() and len(a) >= 10
    assert [name for name in a if not np.array_equal(a[name], b[name])] == []


def test_second_invocation_resumes_from_the_latest_checkpoint(small_data, two_runs):
    folder, _ = two_runs[0]
    result = _run(small_data, folder, 25)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Resuming from" in result.stdout and "model.ckpt-14: step 15" in result.stdout
    assert ": step 20, loss = " in result.stdout and ": step 10, loss" not in result.stdout
    assert "After 25 training step(s)" in result.stdout
    assert tf.train.latest_checkpoint(folder).endswith("model.ckpt-24")
    # Once more: nothing left to train is said, and no loss is made up for the steps not run.
    again = _run(small_data, folder, 25)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Nothing to train: the checkpoint is at step 25, --max_steps is 25." in again.stdout
    ended = [line for line in again.stdout.splitlines() if line.startswith("Ended:")]
    assert ended and ended[0].startswith("Ended: 0 steps") and "loss" not in ended[0], ended


def test_missing_data_file_is_one_paragraph_and_exit_code_2(strategy, tmp_path, capsys):
    code = mnist.main(["--data_path", str(tmp_path / "nope.tfrecords"), "--model_save_path", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and "nope.tfrecords" in err and len(err.strip().splitlines()) == 1
