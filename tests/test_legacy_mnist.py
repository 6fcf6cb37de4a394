"""legacy/mnist_multi_gpu.py and legacy/mnist_eval.py: the faithful MNIST tower trainer and its evaluation.

The graph tests build `build_train_graph` on placeholders (two towers on virtual CPU devices) and
compare against numpy; the end-to-end test runs both programs for a few steps on tiny data.
"""
import re
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from conftest import run_program
from legacy import mnist_eval, mnist_multi_gpu
from legacy.towers import session_config
from records import mnist as mnist_records

BATCH = 8
SCALE = 0.0001


def feeds(seed):
    """A random batch with MNIST's scale (raw 0..255 pixels)."""
    rng = np.random.RandomState(seed)
    return rng.randint(0, 256, (BATCH, 784)).astype(np.float32), rng.randint(0, 10, BATCH).astype(np.int32)


def build(per_tower_batches, ordered_ema=False):
    """A two-tower graph on placeholders: one (x, y_) for both towers, or one each."""
    graph = tf.Graph()
    with graph.as_default(), tf.device('/cpu:0'):
        tf.set_random_seed(1)
        pairs = [(tf.placeholder(tf.float32, [None, 784]), tf.placeholder(tf.int32, [None]))
                 for _ in range(2 if per_tower_batches else 1)]
        tower_inputs = pairs if per_tower_batches else pairs * 2
        g = mnist_multi_gpu.build_train_graph(
            tower_inputs, regularization_rate=SCALE, learning_rate_base=0.001, learning_rate_decay=0.99,
            decay_steps=600.0, moving_average_decay=0.99, ordered_ema=ordered_ema)
        weights = [v for v in tf.trainable_variables() if v.op.name.endswith('weights')]
        init = tf.global_variables_initializer()
    sess = tf.Session(graph=graph, config=session_config(2))
    sess.run(init)
    return SimpleNamespace(g=g, graph=graph, sess=sess, pairs=pairs, weights=weights)


@pytest.fixture(scope="module")
def shared_batch():
    m = build(per_tower_batches=False)
    yield m
    m.sess.close()


@pytest.fixture(scope="module")
def own_batches():
    m = build(per_tower_batches=True, ordered_ema=True)
    yield m
    m.sess.close()


def feed_dict(m, *seeds):
    d = {}
    for (x, y_), seed in zip(m.pairs, seeds):
        d[x], d[y_] = feeds(seed)
    return d


def test_each_tower_loss_holds_its_own_regularisation_once(shared_batch):
    m = shared_batch
    # Each tower's inference adds its two l2 terms: 4 in the collection, 2 per tower scope.
    assert len(m.graph.get_collection('losses')) == 4
    assert [len(m.graph.get_collection('losses', 'GPU_%d/' % i)) for i in range(2)] == [2, 2]
    regs, ces, losses, weights = m.sess.run(
        [m.g.tower_regularization, m.g.tower_cross_entropy, m.g.tower_losses, m.weights], feed_dict(m, 0))
    expected = SCALE * sum((w.astype(np.float64) ** 2).sum() for w in weights) / 2  # contrib's l2: the 1/2
    np.testing.assert_allclose(regs, [expected, expected], rtol=1e-5)
    np.testing.assert_allclose(losses, np.add(ces, regs), rtol=1e-6)
    assert m.g.cur_loss is m.g.tower_losses[-1]


def test_learning_rate_decays_continuously_not_staircase(shared_batch):
    m = shared_batch
    with m.graph.as_default():
        step = tf.placeholder(tf.float32, [])
        set_step = tf.assign(m.g.global_step, step)
    try:
        for s in (0, 1, 300, 600, 1234):
            m.sess.run(set_step, {step: s})
            lr = m.sess.run(m.g.learning_rate)
            np.testing.assert_allclose(lr, 0.001 * 0.99 ** (s / 600.0), rtol=1e-6)
    finally:
        m.sess.run(set_step, {step: 0})


def test_same_batch_on_every_tower_averages_to_one_towers_gradient(shared_batch):
    m = shared_batch
    averaged, tower0, tower1 = m.sess.run(
        [[g for g, _ in m.g.grads], [g for g, _ in m.g.tower_grads[0]], [g for g, _ in m.g.tower_grads[1]]],
        feed_dict(m, 1))
    assert len(averaged) == 4  # two weights, two biases
    for a, g0, g1 in zip(averaged, tower0, tower1):
        np.testing.assert_allclose(g0, g1, rtol=1e-6)
        np.testing.assert_allclose(a, g0, rtol=1e-6)


def test_per_tower_batches_average_to_the_mean_of_the_towers(own_batches):
    m = own_batches
    averaged, tower0, tower1 = m.sess.run(
        [[g for g, _ in m.g.grads], [g for g, _ in m.g.tower_grads[0]], [g for g, _ in m.g.tower_grads[1]]],
        feed_dict(m, 2, 3))
    assert not np.allclose(tower0[0], tower1[0])  # the towers really saw different batches
    for a, g0, g1 in zip(averaged, tower0, tower1):
        np.testing.assert_allclose(a, (g0 + g1) / 2, rtol=1e-5, atol=1e-7)


def test_ordered_ema_shadows_follow_the_warm_up_formula(own_batches):
    m = own_batches
    variables = m.graph.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES)
    shadows = [m.g.variable_averages.average(v) for v in variables]
    # Shadows start at the variables' initial values.
    shadow = [s.astype(np.float64) for s in m.sess.run(variables)]
    start = int(m.sess.run(m.g.global_step))
    for k in range(3):
        m.sess.run(m.g.train_op, feed_dict(m, 10 + k, 20 + k))
        n = m.sess.run(m.g.global_step)  # with --ordered_ema the average reads the incremented step
        assert n == start + k + 1
        decay = min(0.99, (1.0 + n) / (10.0 + n))
        values = m.sess.run(variables)
        shadow = [decay * s + (1 - decay) * v for s, v in zip(shadow, values)]
    for got, want in zip(m.sess.run(shadows), shadow):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_missing_data_and_unwritable_folder_exit_2_with_one_line(tmp_path, capsys):
    assert mnist_multi_gpu.main(["--data_path", str(tmp_path / "nope.tfrecords"),
                                 "--model_save_path", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "TFRecord file not found: " + str(tmp_path / "nope.tfrecords") in err and "Traceback" not in err

    data = tmp_path / "d.tfrecords"
    mnist_records.make_synthetic(data, 20, seed=0)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert mnist_multi_gpu.main(["--data_path", str(data), "--model_save_path", str(blocker / "m")]) == 2
    assert "is not writable" in capsys.readouterr().err

    corrupt = tmp_path / "c.tfrecords"
    corrupt.write_bytes(data.read_bytes()[:-50])
    assert mnist_multi_gpu.main(["--data_path", str(corrupt), "--model_save_path", str(tmp_path / "m")]) == 2
    assert "truncated or corrupt" in capsys.readouterr().err


def test_running_out_of_data_stops_cleanly_with_a_checkpoint(tmp_path, capsys):
    data = tmp_path / "d.tfrecords"
    mnist_records.make_synthetic(data, 20, seed=0)  # repeat 10 x 20 / batch 10 = 20 batches
    models = tmp_path / "m"
    assert mnist_multi_gpu.main(["--data_path", str(data), "--model_save_path", str(models),
                                 "--batch_size", "10", "--training_steps", "50"]) == 0
    out = capsys.readouterr().out
    # 19 training steps and 1 summary batch (at step 10) use the 20 batches.
    assert "The input ran out (repeat 10 of 20 examples) at step 19" in out
    assert tf.train.latest_checkpoint(str(models)).endswith("model.ckpt-18")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Train 20 steps with the program's defaults on a small synthetic set, in a subprocess."""
    tmp = tmp_path_factory.mktemp("mnist_e2e")
    train, held_out = tmp / "train.tfrecords", tmp / "eval.tfrecords"
    mnist_records.make_synthetic(train, 1000, seed=0)
    mnist_records.make_synthetic(held_out, 300, seed=1)
    models = tmp / "models"
    proc = run_program(["legacy/mnist_multi_gpu.py", "--training_steps", "20", "--data_path", train,
                        "--model_save_path", models, "--seed", "0"])
    return SimpleNamespace(proc=proc, models=models, held_out=held_out)


def test_short_run_logs_the_quirk_and_writes_checkpoints_and_events(trained):
    proc = trained.proc
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "all 2 towers train on the same batch of 100" in proc.stdout
    assert re.search(r": step 10, loss = [\d.]+ \([\d.]+ examples/sec; [\d.]+ sec/batch\) "
                     r"\[step 11/\d+, ETA \d", proc.stdout)
    names = {p.name for p in trained.models.iterdir()}
    assert {"checkpoint", "model.ckpt-0.index", "model.ckpt-19.index"} <= names
    assert any(n.startswith("events.out.tfevents.") for n in names)


def _accuracy(values, images, labels, suffix=""):
    """The network's accuracy in numpy with the checkpoint's `<name><suffix>` values (784-500-10, relu)."""
    w1, b1, w2, b2 = (values[f"layer{k}/{name}{suffix}"].astype(np.float64)
                      for k in (1, 2) for name in ("weights", "biases"))
    logits = np.maximum(images.astype(np.float64) @ w1 + b1, 0) @ w2 + b2
    return float((logits.argmax(1) == labels).mean())


def _checkpoint_values(path):
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.fixture(scope="module")
def planted(trained, tmp_path_factory):
    """The trained checkpoint with its raw weights zeroed and its moving-average shadows kept.

    Evaluating the raw weights gives every example class 0; evaluating the shadows gives what numpy
    computes from them, so an evaluation that restored the wrong set cannot pass.
    """
    values = _checkpoint_values(tf.train.latest_checkpoint(str(trained.models)))
    for name in ("layer1/weights", "layer1/biases", "layer2/weights", "layer2/biases"):
        values[name] = np.zeros_like(values[name])
    folder = tmp_path_factory.mktemp("planted")
    with tf.Graph().as_default(), tf.Session() as sess:
        variables = {name: tf.Variable(value, name=name) for name, value in values.items()}
        sess.run(tf.global_variables_initializer())
        tf.train.Saver(variables).save(sess, str(folder / "model.ckpt"), global_step=19)
    images, labels = mnist_records.load_tfrecords(trained.held_out)
    shadows = _accuracy(values, images, labels, "/ExponentialMovingAverage")
    raw = _accuracy(values, images, labels)
    assert raw == float((labels == 0).mean()) and abs(shadows - raw) > 0.05  # the test can tell them apart
    return SimpleNamespace(folder=folder, shadows=shadows, raw=raw, examples=len(labels))


def test_eval_program_prints_the_accuracy_of_the_moving_average_shadows(trained, planted):
    proc = run_program(["legacy/mnist_eval.py", "--model_save_path", planted.folder,
                        "--data_path", trained.held_out])
    assert proc.returncode == 0, proc.stderr[-2000:]
    match = re.search(r"After 19 training step\(s\), validation accuracy = ([\d.e-]+) \(300 examples", proc.stdout)
    assert match, proc.stdout
    assert abs(float(match.group(1)) - planted.shadows) <= 1 / planted.examples  # one near-tie may flip


def test_eval_restores_shadows_not_the_raw_weights(trained, planted):
    """In-process, on the trained checkpoint and on the planted one: the shadows' accuracy."""
    images, labels = mnist_records.load_tfrecords(trained.held_out)
    images = images.astype(np.float32)
    step, accuracy = mnist_eval.evaluate_checkpoint(images, labels, str(planted.folder))
    assert step == "19" and abs(accuracy - planted.shadows) <= 1 / planted.examples
    ckpt = tf.train.latest_checkpoint(str(trained.models))
    values = _checkpoint_values(ckpt)
    assert not np.allclose(values["layer1/weights"], values["layer1/weights/ExponentialMovingAverage"])
    step, accuracy = mnist_eval.evaluate_checkpoint(images, labels, str(trained.models))
    expected = _accuracy(values, images, labels, "/ExponentialMovingAverage")
    assert step == "19" and abs(accuracy - expected) <= 1 / len(labels)
