"""The CIFAR parity harness passes on the real programs and FAILS, in the right check, on planted defects.

One legacy graph and one modern model are built for the module (the slow part).  Each defect is
planted in the code the program runs (a layer attribute, a module function, the optimizer), on
either side, for the length of one test, and the test asserts which check fails and which still pass.
Every check sets the state it starts from, so the tests pass alone and in any order.
"""
import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from modern.runtime import DeviceSetupError, configure_devices

try:  # before TensorFlow's runtime starts: pytest imports every test module first
    configure_devices(2)
except DeviceSetupError:
    pass

from compare import cifar as compare_cifar  # noqa: E402
from compare.report import tensor_error  # noqa: E402
from legacy import cifar_resnet as legacy_cifar  # noqa: E402
from modern import cifar_resnet as modern_cifar  # noqa: E402
from modern import resnet_v2  # noqa: E402


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    cfg = compare_cifar.default_config(2, quick=True)
    cfg.weighted = True  # the split checks against the legacy --split=weighted graph too
    cfg.free_steps = 4   # and a short free-running run (the default runs 20)
    h = compare_cifar.setup(cfg, str(tmp_path_factory.mktemp("cifar_harness")), log=lambda *_: None)
    yield h
    compare_cifar.close(h)


def by_check(results):
    return {r.check: r for r in results}


def with_train_step(h):
    """The harness with the modern train step traced again (after a planted change it must see)."""
    m = h.modern
    step = modern_cifar.make_train_step(m.model, m.optimizer, m.strategy, return_metrics=True, element_spec=m.spec)
    return dataclasses.replace(h, modern=dataclasses.replace(m, train_step=step, draw=None))


def test_harness_passes_on_the_real_programs(harness):
    results = by_check(compare_cifar.run_checks(harness, log=lambda *_: None))
    assert [name for name, r in results.items() if r.status == "FAIL"] == []
    assert {name for name, r in results.items() if r.status == "EXPECTED"} == {
        "validation (validate)", "split: remainder dropped", "split: fewer rows than towers",
        "split: --split=static (seed bug)", "bn moving statistics"}
    # Not vacuous: every trainable variable's gradient compared, the steps crossed both default
    # boundaries, and each side's Adam update was checked for every variable at every step.
    assert len(results["gradients (read out of the train step)"].errors) == 174
    assert len(results["checkpoint round trip"].errors) == 272
    steps = results["2 training steps: loss and gradients"]
    assert [e.name for e in steps.errors[:2]] == ["loss at step 10000", "loss at step 25001"]
    assert len(results["2 training steps: Adam on each side"].errors) == 2 * 2 * 2 * 174
    assert results["split: --split=weighted (uneven)"].status == "PASS"
    free = results["4 free-running steps (chaos floor)"].extra["losses"]
    assert len(set(np.round(free["legacy"], 5))) == 4


def test_a_free_conv_bias_is_judged_against_its_layers_weight_gradient():
    """Round-off in a zero-gradient bias, larger than its own norm and than its even share of the
    network's, but small against its layer's weight gradient, passes; without that weight gradient
    beside it the same difference fails, and so does a real difference of the weight gradient's scale."""
    rng = np.random.default_rng(0)
    unit = lambda *shape: (lambda t: t / np.linalg.norm(t))(rng.normal(size=shape)).astype(np.float32)  # noqa: E731
    # As measured at 3 towers: a whole-network gradient spread over many weights, conv1's weight
    # gradient ~1e8, its free bias ~1e2 per element on each side and ~1e3 apart in norm.
    rest, weights = 1e8 * unit(4_000_000), 1e8 * unit(7, 7, 3, 64)
    bias, noise = 800 * unit(64), 1e3 * unit(64)
    name, tol = "resnet_v2_50/conv1/biases", compare_cifar.TOLERANCES["resnet"][0]

    def error(legacy_bias, with_weights=True):
        modern = {name: bias, "resnet_v2_50/block4/unit_3/bottleneck_v2/conv3/weights": rest,
                  **({"resnet_v2_50/conv1/weights": weights} if with_weights else {})}
        legacy = dict(modern, **{name: legacy_bias})
        return {e.name: e.rel_l2 for e in compare_cifar.grad_errors(legacy, modern)}[name]

    assert error(bias + noise) < tol
    assert error(bias + noise, with_weights=False) > tol
    assert error(bias + 1e-3 * np.linalg.norm(weights) / 8) > tol


def test_nan_on_both_sides_is_not_agreement():
    assert tensor_error("x", [np.nan, 1.0], [np.nan, 1.0]).rel_l2 == np.inf
    assert tensor_error("x", [1.0, 2.0], [1.0, 2.0]).rel_l2 == 0.0


def test_dropout_given_the_keep_probability_as_its_rate_fails_the_dropout_check(harness, monkeypatch):
    # The classic port mistake: keras Dropout(keep_prob) where slim.dropout took keep_prob.
    monkeypatch.setattr(harness.modern.model.dropout, "rate", harness.legacy.args.keep_prob)
    result = compare_cifar.check_dropout(dataclasses.replace(harness, modern=dataclasses.replace(
        harness.modern, draw=None)))
    assert result.status == "FAIL"
    kept = {e.name.split(" (")[0]: e.max_abs for e in result.errors}
    assert kept["modern kept fraction"] > 0.15 and kept["legacy kept fraction"] < 1e-3  # kept 0.4, not 0.6


def test_keras_dropout_with_one_mask_for_all_replicas_fails_the_dropout_check(harness, monkeypatch):
    # Keras 3's own Dropout under MirroredStrategy: every replica draws the same mask.
    monkeypatch.setattr(resnet_v2.ReplicaDropout, "call", keras.layers.Dropout.call)
    result = compare_cifar.check_dropout(dataclasses.replace(harness, modern=dataclasses.replace(
        harness.modern, draw=None)))
    assert result.status == "FAIL"
    agreement = [e for e in result.errors if e.name.startswith("modern mask agreement")]
    assert agreement and agreement[0].max_abs > 0.4  # identical masks agree everywhere, not on 52%


def test_batch_norm_epsilon_of_keras_fails_config_and_inference(harness, monkeypatch):
    bns = [harness.modern.model.postnorm] + [
        bn for units in harness.modern.model.blocks for u in units for bn in (u.preact, u.conv1_bn, u.conv2_bn)]
    for bn in bns:
        monkeypatch.setattr(bn, "epsilon", 1e-3)  # Keras' default
    x, y = harness.xs[-1], harness.ys[-1]
    assert compare_cifar.check_config(harness).status == "FAIL"
    result = compare_cifar.check_inference(harness, x, y)
    logits = next(e for e in result.errors if e.name == "logits")
    assert result.status == "FAIL" and logits.rel_l2 > 1e-3


def test_one_replica_slice_shifted_by_a_row_fails_the_training_forward_pass(harness, monkeypatch):
    real = modern_cifar.spread_short_batch

    def shifted(x, y, num_replicas):
        half = tf.shape(x)[0] // 2  # the second replica's rows start one row late
        x = tf.concat([x[:half], x[half + 1:], x[half:half + 1]], 0)
        return real(x, y, num_replicas)

    monkeypatch.setattr(modern_cifar, "spread_short_batch", shifted)
    results = by_check(compare_cifar.check_training(harness, harness.xs[-1], harness.ys[-1]))
    assert results["forward (training, same dropout masks)"].status == "FAIL"
    assert results["gradients (read out of the train step)"].status == "FAIL"


def test_legacy_average_gradients_that_sums_fails_the_gradient_check(harness, monkeypatch, tmp_path):
    # The legacy side is judged too: an average_gradients that forgets to divide by the towers.
    def summed(tower_grads):
        return [(tf.add_n([g for g, _ in pairs]), pairs[0][1]) for pairs in zip(*tower_grads)]

    monkeypatch.setattr(legacy_cifar, "average_gradients", summed)
    legacy = compare_cifar.build_legacy(harness.cfg, harness.files, str(tmp_path), start_path=harness.legacy.start_path)
    try:
        results = by_check(compare_cifar.check_training(dataclasses.replace(harness, legacy=legacy),
                                                        harness.xs[-1], harness.ys[-1]))
    finally:
        legacy.sess.close()
    assert results["forward (training, same dropout masks)"].status == "PASS"
    gradients = results["gradients (read out of the train step)"]
    assert gradients.status == "FAIL" and gradients.worst.rel_l2 > 0.5  # legacy = 2 x modern


def test_a_gradient_scaled_by_1_001_inside_the_train_step_fails_the_gradient_check(harness, monkeypatch):
    real = modern_cifar.replica_gradients
    fc_kernel = harness.modern.names["Logits/fc/weights"]
    index = [id(v) for v in harness.modern.model.trainable_variables].index(id(fc_kernel))

    def scaled(*args, **kwargs):
        loss, grads, logits = real(*args, **kwargs)
        return loss, [g * 1.001 if i == index else g for i, g in enumerate(grads)], logits

    monkeypatch.setattr(modern_cifar, "replica_gradients", scaled)
    results = by_check(compare_cifar.check_training(with_train_step(harness), harness.xs[-1], harness.ys[-1]))
    assert results["forward (training, same dropout masks)"].status == "PASS"
    gradients = results["gradients (read out of the train step)"]
    assert gradients.status == "FAIL" and gradients.worst.name == "Logits/fc/weights"


def test_loss_averaged_over_each_replicas_own_rows_fails_the_gradient_check(harness, monkeypatch):
    """The classic migration mistake: each replica's loss is the mean over ITS rows (Keras'
    `compute_average_loss` without the global batch), so the SUM over 2 replicas doubles the loss
    and every gradient.  Planted where the program counts the step's rows; caught by the loss the
    train step returns and by the gradients."""
    def local_rows(rows, weights):
        return tf.cast(rows, tf.int32) if weights is None else tf.cast(tf.round(tf.reduce_sum(weights)), tf.int32)

    monkeypatch.setattr(modern_cifar, "_global_rows", local_rows)
    results = by_check(compare_cifar.check_training(with_train_step(harness), harness.xs[-1], harness.ys[-1]))
    forward, gradients = results["forward (training, same dropout masks)"], results["gradients (read out of the train step)"]
    assert forward.status == "FAIL" and forward.worst.max_rel == pytest.approx(0.5, abs=1e-3)  # legacy = modern / 2
    assert gradients.status == "FAIL" and gradients.worst.max_rel > 0.4


def restart_steps(h, steps=(10000,)):
    """The restart-per-step checks at the first default boundary, with the train step traced again."""
    h = with_train_step(h)
    return by_check(compare_cifar.check_training_steps(h, h.xs, h.ys, list(steps)))


def test_schedule_one_step_ahead_fails_only_the_lr_check(harness, monkeypatch):
    # A step counter off by one: the modern schedule reads iterations + 1.
    real = keras.optimizers.schedules.PiecewiseConstantDecay.__call__
    monkeypatch.setattr(keras.optimizers.schedules.PiecewiseConstantDecay, "__call__",
                        lambda self, step: real(self, step + 1))
    results = restart_steps(harness)
    assert [name for name, r in results.items() if r.status == "FAIL"] == ["lr schedule (default boundaries)"]
    assert results["lr schedule (default boundaries)"].worst.name == "lr at step 10000"


def test_adam_with_keras_default_epsilon_fails_only_the_adam_check(harness, monkeypatch):
    monkeypatch.setattr(harness.modern.optimizer, "epsilon", 1e-7)
    results = restart_steps(harness)
    assert [name for name, r in results.items() if r.status == "FAIL"] == ["1 training step: Adam on each side"]
    assert results["1 training step: Adam on each side"].worst.name.startswith("modern")


def test_keras_batch_norm_momentum_fails_only_the_moving_statistics_check(harness, monkeypatch):
    # Keras' default momentum 0.99 instead of slim's decay 0.997, inside an EXPECTED check.
    for units in harness.modern.model.blocks:
        for unit in units:
            monkeypatch.setattr(unit.conv1_bn, "momentum", 0.99)
    results = restart_steps(harness, steps=(0,))
    assert [name for name, r in results.items() if r.status == "FAIL"] == ["bn moving statistics"]
    assert "conv1/BatchNorm/moving" in results["bn moving statistics"].worst.name


def test_replica_slices_of_floor_size_fail_the_split_checks(harness, monkeypatch):
    """The input path the program runs (`modern.cluster.distribute`) cutting B rows into replica
    batches of floor(B/N) rows, a common hand-written split: the remainder rows are lost, as in the
    legacy fix, so the uneven-batch check whose prediction is "the modern program keeps every row"
    fails; an even batch is cut the same either way, so the training checks still pass."""
    from modern import cluster

    def floor_split(self, batch):
        rows = int(batch[0].shape[0])

        def part(ctx):
            per_replica = rows // ctx.num_replicas_in_sync
            start = ctx.replica_id_in_sync_group * per_replica
            return tuple(t[start:start + per_replica] for t in batch)

        return self.strategy.experimental_distribute_values_from_function(part)

    monkeypatch.setattr(cluster.ReplicaBatches, "split", floor_split)
    splits = compare_cifar.check_splits(harness, harness.xs[-1], harness.ys[-1])
    failed = [r.check for r in splits if r.status == "FAIL"]
    assert "split: remainder dropped" in failed, failed
    training = by_check(compare_cifar.check_training(harness, harness.xs[-1], harness.ys[-1]))
    assert {r.status for r in training.values()} == {"PASS"}
