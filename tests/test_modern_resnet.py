"""The Keras ResNet-v2-50 (modern/resnet_v2.py) is slim's resnet_v2_50 + Logits head, number for number.

Reference: the legacy network exactly as the original builds it (resnet_arg_scope, resnet_v2_50 with
num_classes=None, then Logits: squeeze, slim.dropout, slim.fully_connected), in a TF1 graph with
randomised variables (batch-norm moving statistics included), saved by a TF1 Saver and loaded into
the Keras model with modern/checkpoints.py.

Tolerances. Both sides compute in float32 with different kernels and summation orders (oneDNN
graph kernels vs eager Keras), so they agree to round-off, not bit for bit. In inference mode the
network is a fixed composition of ~50 linear layers and relus: the relative L2 error of the
logits is ~1e-6 (float32 unit round-off 6e-8, grown through sums of up to 4608 terms per layer);
we assert < 1e-5. In training mode every batch norm re-normalises with statistics of a small
batch (block4 sees 1x1 maps, so n = 4 values per channel), which amplifies round-off to ~1e-3;
there the test measures float32's own error against a float64 run of the same network and
requires the TF1/Keras gap to be no larger.
"""
import collections

import numpy as np
import pytest

import legacy  # noqa: F401  (installs the tf-slim alias before tf_slim)
import tensorflow as tf
import tf_slim as slim
from tf_slim.nets import resnet_v2

import keras
from modern import checkpoints
from modern.resnet_v2 import ResNetV2_50, SlimBatchNorm, fixed_padding, resnet_v2_50

tf1 = tf.compat.v1
BATCH, SIZE, NUM_CLASSES = 4, 32, 10
INFERENCE_RTOL = 1e-5

SlimReference = collections.namedtuple(
    "SlimReference", "graph sess saver path images is_training keep_prob features logits "
                     "update_ops pool1 moving")


def relative_error(actual, expected):
    """Relative L2 error ||actual - expected|| / ||expected||."""
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def build_slim_reference(checkpoint_path, with_optimizer=False, seed=0):
    """The original's network in a TF1 graph, randomised and saved at `checkpoint_path`.

    With `with_optimizer`, also the original's training bookkeeping: an unnamed global step
    (`Variable`) and Adam (slots `<var>/Adam`, `<var>/Adam_1`, `beta1_power`, `beta2_power`).
    """
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(seed)
        images = tf1.placeholder(tf.float32, [None, SIZE, SIZE, 3])
        is_training = tf1.placeholder(tf.bool, [])
        keep_prob = tf1.placeholder(tf.float32, [])
        with slim.arg_scope(resnet_v2.resnet_arg_scope()):
            net, _ = resnet_v2.resnet_v2_50(images, num_classes=None, is_training=is_training)
        with tf1.variable_scope("Logits"):
            features = tf.squeeze(net, axis=[1, 2])
            net = slim.dropout(features, keep_prob=keep_prob, scope="scope")
            logits = slim.fully_connected(net, num_outputs=NUM_CLASSES, activation_fn=None,
                                          scope="fc")
        update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
        if with_optimizer:
            # The original's `global_step = tf.Variable(0, trainable=False)` and Adam's variables.
            # apply_gradients with zero gradients creates exactly the slots minimize() would,
            # without the (slow to build) backward graph.
            global_step = tf.Variable(0, trainable=False)
            tf1.train.AdamOptimizer(1e-3).apply_gradients(
                [(tf.zeros_like(v), v) for v in tf1.trainable_variables()], global_step)
        # Non-trivial values everywhere, so that a swapped gamma/beta or mean/variance shows.
        rng = np.random.RandomState(seed)
        randomise = []
        for variable in slim.get_model_variables():
            name, shape = variable.op.name, variable.shape.as_list()
            if name.endswith(("gamma", "moving_variance")):
                value = rng.uniform(0.5, 1.5, shape)
            elif name.endswith(("beta", "moving_mean", "biases")):
                value = rng.normal(0.0, 0.1, shape)
            else:
                continue  # weights keep slim's random initialisers
            randomise.append(variable.assign(value.astype(np.float32)))
        moving = {v.op.name: v for v in tf1.global_variables() if "moving_" in v.op.name}
        saver = tf1.train.Saver()
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
        sess.run(randomise)
        path = saver.save(sess, str(checkpoint_path), write_meta_graph=False)
        pool1 = graph.get_tensor_by_name("resnet_v2_50/pool1/MaxPool:0")
    return SlimReference(graph, sess, saver, path, images, is_training, keep_prob, features,
                         logits, update_ops, pool1, moving)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    ref = build_slim_reference(tmp_path_factory.mktemp("slim") / "model.ckpt")
    yield ref
    ref.sess.close()


@pytest.fixture(scope="module")
def images():
    return np.random.RandomState(1).uniform(-1.0, 1.0, (BATCH, SIZE, SIZE, 3)).astype(np.float32)


@pytest.fixture(scope="module")
def built_model():
    return resnet_v2_50(num_classes=NUM_CLASSES, keep_prob=0.6)


@pytest.fixture
def model(built_model, reference):
    """The module's Keras model, freshly loaded from the reference checkpoint for each test."""
    checkpoints.load_tf1_checkpoint(built_model, reference.path)
    return built_model


def run_reference(reference, fetches, images, training):
    feed = {reference.images: images, reference.is_training: training, reference.keep_prob: 1.0}
    return reference.sess.run(fetches, feed)


def test_same_variables_and_parameter_count_as_slim(reference, built_model):
    with reference.graph.as_default():
        slim_vars = {v.op.name: v.shape.as_list() for v in slim.get_model_variables()}
    names = checkpoints.tf1_variable_map(built_model)
    assert len(slim_vars) == len(names) == 272
    assert {n: list(v.shape) for n, v in names.items()} == slim_vars
    assert sum(int(np.prod(s)) for s in slim_vars.values()) == built_model.count_params()


def test_inference_logits_match_tf1_graph_within_float32_roundoff(reference, model, images):
    expected = run_reference(reference, reference.logits, images, training=False)
    actual = model(images, training=False).numpy()
    error = relative_error(actual, expected)
    print(f"inference: relative L2 {error:.2e}, max abs {np.abs(actual - expected).max():.2e} "
          f"on logits of max magnitude {np.abs(expected).max():.1f}")
    assert error < INFERENCE_RTOL
    # The harness's path: backbone -> (its own dropout mask) -> fc gives the same numbers.
    features = model.backbone(images, training=False)
    assert relative_error(model.fc(features).numpy(), expected) < INFERENCE_RTOL


def test_training_mode_matches_tf1_as_closely_as_float32_allows(reference, model, images):
    """Batch statistics on both sides; the gap is judged against a float64 run of the network."""
    expected = run_reference(reference, reference.features, images, training=True)
    actual = model.backbone(images, training=True).numpy()
    keras.config.set_dtype_policy("float64")
    try:
        exact_model = resnet_v2_50(num_classes=NUM_CLASSES)
    finally:
        keras.config.set_dtype_policy("float32")
    checkpoints.load_tf1_checkpoint(exact_model, reference.path)
    exact = exact_model.backbone(images.astype(np.float64), training=True).numpy()
    gap, tf1_error, keras_error = (relative_error(actual, expected),
                                   relative_error(expected, exact), relative_error(actual, exact))
    print(f"training mode: TF1 vs Keras {gap:.2e}; vs float64: TF1 {tf1_error:.2e}, "
          f"Keras {keras_error:.2e}")
    # Both run the fused batch-norm kernel (SlimBatchNorm), so float32 gives the same numbers on
    # both sides (measured: gap 0); each is ~1e-3 from the float64 answer (4-row batch statistics at
    # block4's 1x1 maps; measured 1.47e-3 for both, bound 5e-3: a margin of 3.4).
    assert gap < 1e-6 and tf1_error < 5e-3 and keras_error < 5e-3


def test_moving_statistics_update_like_slim_after_one_training_step(reference, model, images):
    names = checkpoints.tf1_variable_map(model)
    before = reference.sess.run(reference.moving)
    try:
        reference.sess.run(reference.update_ops, {reference.images: images,
                                                  reference.is_training: True})
        after = reference.sess.run(reference.moving)
    finally:
        with reference.graph.as_default():
            reference.saver.restore(reference.sess, reference.path)
    model(images, training=True)
    # Compare the updates (after - before), which are (1 - decay) = 0.003 times smaller than the
    # statistics, so the check is sensitive: one float32 rounding of a statistic (6e-8 of it) is
    # ~2e-5 of its update.  Measured worst: 2.43e-05 (block2/unit_1 conv1 moving_variance), the
    # subtraction's round-off; the bound 1e-4 leaves a margin of 4.  A different formula (Keras'
    # biased variance, momentum 0.99) is off by more than 1e-1.
    errors = {n: relative_error(names[n].numpy() - before[n], after[n] - before[n]) for n in before}
    worst = max(errors, key=errors.get)
    print(f"moving-statistics updates: worst relative error {errors[worst]:.2e} ({worst})")
    assert errors[worst] < 1e-4


def test_slim_batch_norm_moving_variance_uses_bessel_correction():
    """slim's fused batch norm feeds the unbiased batch variance to the moving average."""
    x = np.random.RandomState(2).normal(1.0, 2.0, (4, 1, 1, 8)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        inputs = tf1.placeholder(tf.float32, [None, 1, 1, 8])
        with slim.arg_scope(resnet_v2.resnet_arg_scope()):
            outputs = slim.batch_norm(inputs, is_training=True, scope="bn")
        update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
        moving_variance, = [v for v in tf1.global_variables() if "moving_variance" in v.op.name]
        init = tf1.global_variables_initializer()
        with tf1.Session(graph=graph) as sess:
            sess.run(init)
            expected, _ = sess.run([outputs, update_ops], {inputs: x})
            expected_variance = sess.run(moving_variance)
            sess.run(init)
            sess.run(update_ops, {inputs: x[:1]})  # n = 1: slim divides by max(n - 1, 1)
            single_variance = sess.run(moving_variance)
    layer = SlimBatchNorm(momentum=0.997, epsilon=1e-5)
    actual = layer(x, training=True).numpy()
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer.moving_variance.numpy(), expected_variance, rtol=1e-6)
    # Keras' own layer uses the biased variance: visibly different with n = 4.
    stock = keras.layers.BatchNormalization(momentum=0.997, epsilon=1e-5)
    stock(x, training=True)
    assert not np.allclose(stock.moving_variance.numpy(), expected_variance, rtol=1e-4)
    single = SlimBatchNorm(momentum=0.997, epsilon=1e-5)
    single(x[:1], training=True)
    np.testing.assert_allclose(single.moving_variance.numpy(), single_variance, rtol=1e-6)


def test_conv_regularisation_losses_equal_slims_collection(reference, model):
    with reference.graph.as_default():
        slim_losses = tf1.get_collection(tf1.GraphKeys.REGULARIZATION_LOSSES)
        slim_total = reference.sess.run(tf.add_n(slim_losses))
    keras_total = float(sum(model.losses))
    assert len(model.losses) == len(slim_losses) == 53  # 53 conv kernels, fc unregularised
    assert keras_total == pytest.approx(slim_total, rel=1e-5)


def test_fixed_padding_is_symmetric_like_conv2d_same():
    padded = fixed_padding(np.ones((1, 4, 4, 1), np.float32), 3).numpy()[0, :, :, 0]
    assert padded.shape == (6, 6)
    assert padded[0].sum() == padded[-1].sum() == padded[:, 0].sum() == padded[:, -1].sum() == 0


def role_map(model, app):
    """Our layers -> keras.applications.ResNet50V2's layers, by role (conv2..conv5 = block1..4)."""
    pairs = [(model.conv1, "conv1_conv"), (model.postnorm, "post_bn")]
    for b, units in enumerate(model.blocks):
        for u, unit in enumerate(units):
            prefix = f"conv{b + 2}_block{u + 1}"
            pairs += [(unit.preact, f"{prefix}_preact_bn"), (unit.conv1, f"{prefix}_1_conv"),
                      (unit.conv1_bn, f"{prefix}_1_bn"), (unit.conv2, f"{prefix}_2_conv"),
                      (unit.conv2_bn, f"{prefix}_2_bn"), (unit.conv3, f"{prefix}_3_conv")]
            if unit.shortcut is not None:
                pairs.append((unit.shortcut, f"{prefix}_0_conv"))
    return [(ours, app.get_layer(name)) for ours, name in pairs]


def test_keras_applications_resnet50v2_is_a_different_network(reference, model, images):
    app = keras.applications.ResNet50V2(weights=None, include_top=False, pooling="avg",
                                        input_shape=(SIZE, SIZE, 3))
    pairs = role_map(model, app)
    assert len(pairs) == 2 + 16 * 6 + 4  # conv1, post_bn, 16 units x 6 layers, 4 shortcuts
    assert sum(len(theirs.weights) for _, theirs in pairs) == len(app.weights)
    for ours, theirs in pairs:
        theirs.set_weights(ours.get_weights())

    expected = run_reference(reference, reference.features, images, training=False)
    ours = model.backbone(images, training=False).numpy()
    theirs = app(images, training=False).numpy()
    ours_error, theirs_error = relative_error(ours, expected), relative_error(theirs, expected)
    print(f"same weights, pooled features vs TF1: slim-exact {ours_error:.2e}, "
          f"ResNet50V2 {theirs_error:.2e}")
    assert ours_error < INFERENCE_RTOL
    assert theirs_error > 1e3 * INFERENCE_RTOL

    # Where: the stem's max-pool (zero pad + VALID vs slim's SAME) ...
    stem = keras.Model(app.input, app.get_layer("pool1_pool").output)
    slim_pool1 = run_reference(reference, reference.pool1, images, training=False)
    np.testing.assert_allclose(model.pool1(model.conv1(fixed_padding(images, 7))).numpy(),
                               slim_pool1, rtol=1e-5, atol=1e-5)
    assert not np.allclose(stem(images).numpy(), slim_pool1, rtol=1e-3, atol=1e-3)
    # ... and every batch norm's epsilon (and momentum).
    app_bns = [l for l in app.layers if isinstance(l, keras.layers.BatchNormalization)]
    assert len(app_bns) == 49
    assert {(l.epsilon, l.momentum) for l in app_bns} == {(1.001e-5, 0.99)}
    assert {(l.epsilon, l.momentum) for l, _ in pairs if isinstance(l, SlimBatchNorm)} == \
        {(1e-5, 0.997)}


def test_dropout_rate_is_one_minus_keep_prob():
    assert ResNetV2_50(keep_prob=0.6).dropout.rate == pytest.approx(0.4)
