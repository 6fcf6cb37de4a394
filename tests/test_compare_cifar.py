"""The CIFAR parity harness passes on the real programs and FAILS, in the right check, on planted defects.

One legacy graph and one modern model are built for the module (the slow part); each defect then
builds only what it changes (a model, an optimizer or a gradient function) and runs the checks
that must catch it.  Defects are planted on the modern side; the legacy program is the reference.
"""
import functools
from types import SimpleNamespace

import keras
import numpy as np
import pytest
import tensorflow as tf

from modern import cifar_resnet as modern_cifar
from modern.resnet_v2 import resnet_v2_50
from modern.runtime import DeviceSetupError, configure_devices

try:  # before TensorFlow's runtime starts: pytest imports every test module first
    configure_devices(2)
except DeviceSetupError:
    pass

from compare import cifar as compare_cifar  # noqa: E402
from test_modern_resnet import role_map  # noqa: E402

STEPS = 3


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    tf.compat.v1.disable_control_flow_v2()  # as compare/run.py: the batch norms' statistics are fetched
    cfg = compare_cifar.default_config(2, STEPS)
    tmp_dir = str(tmp_path_factory.mktemp("cifar_harness"))
    h = compare_cifar.setup(cfg, tmp_dir, log=lambda *_: None)
    h.cfg, h.tmp_dir = cfg, tmp_dir
    yield h
    compare_cifar.close(h)
    tf.compat.v1.enable_control_flow_v2()


@pytest.fixture(autouse=True)
def fresh_start(harness):
    """Every test starts both sides from the start checkpoint (the full run trains them K steps)."""
    compare_cifar.reset(harness)
    compare_cifar.checkpoints.load_tf1_checkpoint(harness.m.model, harness.g.start_path)


def variant(h, **changes):
    """A copy of the harness config with some fields changed."""
    cfg = SimpleNamespace(**vars(h.cfg))
    for key, value in changes.items():
        setattr(cfg, key, value)
    return cfg


def by_check(results):
    return {r.check: r for r in results}


def test_harness_passes_on_the_real_programs(harness):
    results = by_check(compare_cifar.run_checks(harness, harness.cfg, harness.tmp_dir, log=lambda *_: None))
    assert [name for name, r in results.items() if r.status == "FAIL"] == []
    expected = {name for name, r in results.items() if r.status == "EXPECTED"}
    assert expected == {"split: remainder dropped", "split: fewer rows than towers",
                        "split: --split=static (seed bug)", "bn moving statistics",
                        "free conv biases (zero gradient)"}
    # Not vacuous: every trainable variable's gradient was compared, and the steps moved the loss.
    assert len(results["gradients (keep_prob 1)"].errors) == 174
    assert len(results["checkpoint round trip"].errors) == 272
    losses = results[f"{STEPS} training steps"].extra["losses"]["legacy"]
    assert len(losses) == STEPS and len(set(np.round(losses, 5))) == STEPS


def test_batch_norm_epsilon_of_keras_fails_the_forward_pass(harness):
    cfg = variant(harness, model_fn=functools.partial(resnet_v2_50, bn_epsilon=1e-3))  # Keras' default
    m = compare_cifar.build_modern(cfg, harness.strategy, harness.g.start_path)
    x, y = harness.xs[-1], harness.ys[-1]
    assert compare_cifar.check_inference(harness.g, m, x, y).status == "FAIL"


def test_keras_applications_resnet50v2_fails_the_forward_pass(harness):
    app = keras.applications.ResNet50V2(weights=None, include_top=False, pooling="avg", input_shape=(32, 32, 3))
    ours = harness.m.model
    compare_cifar.checkpoints.load_tf1_checkpoint(ours, harness.g.start_path)
    for layer, theirs in role_map(ours, app):
        theirs.set_weights(layer.get_weights())
    swapped = SimpleNamespace(model=lambda x, training=False: ours.fc(app(x, training=training)))
    result = compare_cifar.check_inference(harness.g, swapped, harness.xs[-1], harness.ys[-1])
    assert result.status == "FAIL" and result.worst.rel_l2 > 1e-2


def test_one_tower_slice_shifted_by_a_row_fails_the_training_forward_pass(harness, monkeypatch):
    real = modern_cifar.spread_short_batch

    def shifted(x, y, num_replicas):
        half = tf.shape(x)[0] // 2  # the second replica's rows start one row late
        x = tf.concat([x[:half], x[half + 1:], x[half:half + 1]], 0)
        return real(x, y, num_replicas)

    monkeypatch.setattr(modern_cifar, "spread_short_batch", shifted)
    results = by_check(compare_cifar.check_training(harness.g, harness.m, harness.xs[-1], harness.ys[-1], 0.6))
    forward = results["forward (training, keep_prob 1)"]
    assert forward.status == "FAIL"
    errors = {e.name: e.rel_l2 for e in forward.errors}
    assert errors["tower_0/loss"] < 1e-6 < 1e-3 < errors["tower_1/loss"]


def test_one_layer_gradient_scaled_by_1_001_fails_the_gradient_check(harness, monkeypatch):
    real = modern_cifar.replica_gradients
    fc_kernel = harness.m.names["Logits/fc/weights"]
    index = [id(v) for v in harness.m.model.trainable_variables].index(id(fc_kernel))

    def scaled(*args, **kwargs):
        loss, grads = real(*args, **kwargs)
        return loss, [g * 1.001 if i == index else g for i, g in enumerate(grads)]

    monkeypatch.setattr(modern_cifar, "replica_gradients", scaled)
    m = SimpleNamespace(**vars(harness.m))
    m.gradients = compare_cifar.make_gradient_fn(m.model, harness.strategy)
    results = by_check(compare_cifar.check_training(harness.g, m, harness.xs[-1], harness.ys[-1], 0.6))
    assert results["forward (training, keep_prob 1)"].status == "PASS"
    assert results["gradients (keep_prob 1)"].status == "FAIL"
    assert results["gradients (keep_prob 1)"].worst.name == "Logits/fc/weights"


def steps_with(harness, cfg, model=None, steps=STEPS):
    compare_cifar.reset(harness)
    m = compare_cifar.build_modern(cfg, harness.strategy, harness.g.start_path, model=model)
    results = compare_cifar.check_training_steps(harness.g, m, harness.xs[:steps], harness.ys[:steps])
    return by_check(results)


def test_adam_with_keras_default_epsilon_fails_the_training_steps(harness):
    cfg = variant(harness, make_optimizer=lambda b, v: modern_cifar.make_optimizer(b, v, epsilon=1e-7))
    results = steps_with(harness, cfg, model=harness.m.model, steps=2)
    assert results["lr schedule"].status == "PASS"
    assert results["2 training steps"].status == "FAIL"


def test_learning_rate_boundary_off_by_one_fails_the_lr_check(harness):
    cfg = variant(harness, make_optimizer=lambda b, v: modern_cifar.make_optimizer([x + 1 for x in b], v))
    results = steps_with(harness, cfg, model=harness.m.model)
    assert results["lr schedule"].status == "FAIL"


def test_a_planted_difference_inside_an_expected_check_fails_it(harness):
    # Keras' default momentum 0.99 instead of slim's decay 0.997: the training forward pass and the
    # weights do not see it; only the moving statistics do, which is the EXPECTED check's domain.
    cfg = variant(harness, model_fn=functools.partial(resnet_v2_50, bn_momentum=0.99))
    results = steps_with(harness, cfg, steps=1)
    assert results["1 training steps"].status == "PASS"
    assert results["bn moving statistics"].status == "FAIL"
