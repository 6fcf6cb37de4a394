"""The parity harness on the CIFAR pair: it passes on the real programs and FAILS, in the right check,
on planted defects.

Both pairings are built once for the module (the slow part): the original's split and
--split=weighted (whose legacy graph shares the modern model), each program at one unit per block
(tests/small_cifar.py: both programs' --units_per_block 1 1 1 1, slim's resnet_v2 builder and the
port's ResNetV2_50 with the same blocks, scopes and names, fewer units; `compare/run.py` judges them
at ResNet-v2-50's).  Each defect is planted in the code a program runs (a layer attribute, a module
function, the optimizer), on either side, for the length of one test, and the test asserts which
check fails and which still pass.  Every check sets the state it starts from, so the tests pass
alone and in any order.
"""
import copy
import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf


from compare import diagnosis, harness, optimizers, sides as sides_module
from compare.checks import basics, forward, splits, steps, trained
from compare.checks.forward import grad_errors
from compare.interface import StepResult
from small_cifar import PAIR
from compare.report import tensor_error
from legacy import cifar_resnet as legacy_cifar
from modern import cifar_resnet as modern_cifar
from modern import keras_adapter, resnet_v2

SETTINGS = harness.Settings(towers=2, steps=2, free_steps=4)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("cifar_harness"))
    files = harness.write_files(PAIR, SETTINGS, tmp)
    pairings = harness.build_pairings(PAIR, SETTINGS, files, tmp, log=lambda *_: None)
    yield pairings
    for sides, _ in pairings:
        sides.close()


@pytest.fixture
def sides(built):
    return built[0][0]


def by_check(results):
    return {r.check: r for r in results}


def failed(results):
    return sorted(r.check for r in results if r.status == "FAIL")


def retraced(sides):
    """The pairing with the modern train step traced again (after a planted change it must see)."""
    build = sides.modern.build
    step = modern_cifar.make_train_step(build.model, build.optimizer, build.strategy, return_metrics=True,
                                        element_spec=build.spec)
    modern = copy.copy(sides.modern)
    modern.build = dataclasses.replace(build, train_step=lambda element: StepResult(step(element)[0]))
    modern._draw = None
    return dataclasses.replace(sides, modern=modern)


def test_harness_passes_on_the_real_programs(built):
    """Every group but the flags check (each flag a ResNet built again: `compare/run.py` runs it; the
    MNIST, tutorial and tiny pairs' tests run it here), the trained state as --quick runs it."""
    results = []
    for sides, groups in built:
        results += harness.run_groups(sides, [g for g in groups if g not in ("flags", "trained")], SETTINGS,
                                      log=lambda *_: None)
    results += trained.check_trained(built[0][0], dataclasses.replace(SETTINGS, quick=True), 0)
    results += PAIR.extra_checks(built[0][0], SETTINGS, lambda *_: None)
    checks = by_check(results)
    assert failed(results) == []
    assert {name for name, r in checks.items() if r.status == "EXPECTED"} == {
        "validation (validate)", "split: remainder dropped", "split: fewer rows than towers",
        "split: --split=static (the original's bug)", "bn moving statistics", "bn moving statistics (trained state)",
        "legacy on TF1's runtime: bn moving statistics"}
    assert {name for name, r in checks.items() if r.status == "NOT APPLICABLE"} == {
        "moving averages", "evaluation (one checkpoint)"}
    assert checks["legacy on TF1's runtime: loss and gradients"].status == "PASS"
    # Not vacuous: every trainable variable's gradient compared, the steps crossed both default
    # boundaries, and each side's Adam update and v were checked for every variable at every step.
    # One unit per block: conv1 (weights, biases), per unit 3 convs with a batch norm before each
    # (beta, gamma) and a shortcut in each block's first unit, the final norm, the head: 54 trainable
    # variables, 80 with the moving statistics (ResNet-v2-50: 174 and 272).
    assert len(built[0][0].legacy.trainable) == 54 and len(built[0][0].legacy.model) == 80
    assert len(checks["gradients (read out of the train step)"].errors) == 54
    assert len(checks["checkpoint round trip"].errors) == 80
    assert [e.name for e in checks["2 training steps: loss and gradients"].errors[:2]] == [
        "loss at step 10000", "loss at step 25001"]
    assert len(checks["2 training steps: optimizer on each side"].errors) == 2 * 54 * 3  # legacy w, m, v
    assert checks["--split=weighted: split: uneven batch"].status == "PASS"
    assert checks["--split=weighted: split: legacy towers fed the replicas' rows (uneven batch)"].status == "PASS"
    free = checks["4 free-running steps (chaos floor)"].extra["losses"]
    assert len(set(np.round(free["legacy"], 5))) == 4
    assert checks["shuffled pipelines (two epochs)"].status == "PASS"
    assert checks["gradients (read out of the train step) (trained state)"].status == "PASS"
    # The derived model tolerance: from the logits' 1-ulp input sensitivity (ResNet-v2-50: ~1.6e-6).
    model = built[0][0].tol.model
    assert 1e-5 < model.rel_l2 < 1e-3 and "1-ulp input sensitivity" in model.derivation


def test_a_free_bias_is_judged_against_its_layers_weight_gradient():
    """Round-off in a zero-gradient bias, larger than its own norm and than its even share of the
    network's, but small against its layer's weight gradient, passes; without that weight gradient
    beside it the same difference fails, and so does a real difference of the weight gradient's scale."""
    rng = np.random.default_rng(0)
    unit = lambda *shape: (lambda t: t / np.linalg.norm(t))(rng.normal(size=shape)).astype(np.float32)  # noqa: E731
    # As measured at 3 towers: a whole-network gradient spread over many weights, conv1's weight
    # gradient ~3.5e9, its free bias ~1e2 per element on each side and ~1e3 apart in norm.
    rest, weights = 1e8 * unit(4_000_000), 3.5e9 * unit(7, 7, 3, 64)
    bias, noise = 800 * unit(64), 1e3 * unit(64)
    name, tol = "resnet_v2_50/conv1/biases", 8e-5

    def error(legacy_bias, with_weights=True):
        modern = {name: bias, "resnet_v2_50/block4/unit_3/bottleneck_v2/conv3/weights": rest,
                  **({"resnet_v2_50/conv1/weights": weights} if with_weights else {})}
        legacy = dict(modern, **{name: legacy_bias})
        return {e.name: e.rel_l2 for e in grad_errors(legacy, modern)}[name]

    assert error(bias + noise) < tol
    assert error(bias + noise, with_weights=False) > tol
    assert error(bias + 1e-3 * np.linalg.norm(weights) / 8) > tol


def test_nan_on_both_sides_is_not_agreement():
    assert tensor_error("x", [np.nan, 1.0], [np.nan, 1.0]).rel_l2 == np.inf
    assert tensor_error("x", [1.0, 2.0], [1.0, 2.0]).rel_l2 == 0.0


def test_dropout_given_the_keep_probability_as_its_rate_fails_the_dropout_check(sides, monkeypatch):
    # The classic port mistake: keras Dropout(keep_prob) where slim.dropout took keep_prob.
    monkeypatch.setattr(sides.modern.dropouts[0], "rate", sides.legacy.flags.keep_prob)
    result = forward.check_dropout(sides)
    assert result.status == "FAIL"
    kept = {e.name.split(" (")[0]: e.max_abs for e in result.errors}
    assert kept["modern dropout 0 kept fraction"] > 0.15 and kept["legacy dropout 0 kept fraction"] < 1e-3
    assert basics.check_config(sides).status == "FAIL"  # the rate the model was built with, too


def test_keras_dropout_with_one_mask_for_all_replicas_fails_the_dropout_check(sides, monkeypatch):
    # Keras 3's own Dropout under MirroredStrategy: every replica draws the same mask.
    monkeypatch.setattr(resnet_v2.ReplicaDropout, "call", keras.layers.Dropout.call)
    result = forward.check_dropout(sides)
    assert result.status == "FAIL"
    agreement = [e for e in result.errors if e.name.startswith("modern dropout 0 mask agreement")]
    assert agreement and agreement[0].max_abs > 0.4  # identical masks agree everywhere, not on 52%


def test_batch_norm_epsilon_of_keras_fails_config_and_inference(sides, monkeypatch):
    for bn in sides.modern.batch_norms:  # found by type, as the harness finds them
        monkeypatch.setattr(bn, "epsilon", 1e-3)  # Keras' default
    assert basics.check_config(sides).status == "FAIL"
    result = forward.check_inference(sides)
    assert result.status == "FAIL" and result.worst.rel_l2 > 1e-3


def test_one_replica_slice_shifted_by_a_row_fails_the_training_forward_pass(sides, monkeypatch):
    real = modern_cifar.spread_short_batch

    def shifted(x, y, num_replicas):
        half = tf.shape(x)[0] // 2  # the second replica's rows start one row late
        x = tf.concat([x[:half], x[half + 1:], x[half:half + 1]], 0)
        return real(x, y, num_replicas)

    monkeypatch.setattr(modern_cifar, "spread_short_batch", shifted)
    results = by_check(forward.check_training(sides))
    assert results["forward (training, same dropout masks)"].status == "FAIL"
    assert results["gradients (read out of the train step)"].status == "FAIL"


def test_legacy_average_gradients_that_sums_fails_the_gradient_check(sides, monkeypatch, tmp_path):
    # The legacy side is judged too: an average_gradients that forgets to divide by the towers.
    def summed(tower_grads):
        return [(tf.add_n([g for g, _ in pairs]), pairs[0][1]) for pairs in zip(*tower_grads)]

    monkeypatch.setattr(legacy_cifar, "average_gradients", summed)
    with basics.shuffle_off():
        planted = sides_module.build(sides.pair, sides.pairing, 2, sides.files, str(tmp_path),
                                     start_path=sides.start_path,
                                     modern=sides.modern, log=lambda *_: None)
    planted.tolerances = sides.tolerances
    try:
        results = by_check(forward.check_training(planted))
    finally:
        planted.close()
    assert results["forward (training, same dropout masks)"].status == "PASS"
    gradients = results["gradients (read out of the train step)"]
    assert gradients.status == "FAIL" and gradients.worst.rel_l2 > 0.5  # legacy = 2 x modern


def test_a_gradient_scaled_by_1_001_inside_the_train_step_fails_the_gradient_check(sides, monkeypatch):
    real = modern_cifar.replica_gradients
    fc_kernel = sides.modern.names["Logits/fc/weights"]
    index = [id(v) for v in sides.modern.model.trainable_variables].index(id(fc_kernel))

    def scaled(*args, **kwargs):
        loss, grads, logits = real(*args, **kwargs)
        return loss, [g * 1.001 if i == index else g for i, g in enumerate(grads)], logits

    monkeypatch.setattr(modern_cifar, "replica_gradients", scaled)
    results = by_check(forward.check_training(retraced(sides)))
    assert results["forward (training, same dropout masks)"].status == "PASS"
    gradients = results["gradients (read out of the train step)"]
    assert gradients.status == "FAIL" and gradients.worst.name == "Logits/fc/weights"
    # Localised to the layer nearest the loss, and no catalogue entry claims a made-up mistake.
    assert gradients.diagnosis.where.startswith("first at layer Logits_fc (Logits/fc/weights), from the loss backwards")
    assert gradients.diagnosis.cause.startswith("no known cause explains it")


def test_loss_averaged_over_each_replicas_own_rows_fails_the_gradient_check(sides, monkeypatch):
    """The classic migration mistake: each replica's loss is the mean over ITS rows (Keras'
    `compute_average_loss` without the global batch), so the SUM over 2 replicas doubles the loss
    and every gradient.  Planted where the program counts the step's rows; caught by the loss the
    train step returns and by the gradients."""
    def local_rows(rows, weights):
        return tf.cast(rows, tf.int32) if weights is None else tf.cast(tf.round(tf.reduce_sum(weights)), tf.int32)

    monkeypatch.setattr(modern_cifar, "_global_rows", local_rows)
    results = by_check(forward.check_training(retraced(sides)))
    forward_pass = results["forward (training, same dropout masks)"]
    gradients = results["gradients (read out of the train step)"]
    assert forward_pass.status == "FAIL" and forward_pass.worst.max_rel == pytest.approx(0.5, abs=1e-3)
    assert gradients.status == "FAIL" and gradients.worst.max_rel > 0.4
    # Named on the original's graph: its towers' losses, which add no regulariser, fed twice their value.
    for result in (forward_pass, gradients):
        assert result.diagnosis.cause.startswith("likely cause [loss_scale]: the port's whole loss 2 times the "
                                                 "original's: the original run with each tower's whole loss times 2"), \
            result.diagnosis.cause


def restart(sides, at=(10000,)):
    """The restart-per-step checks at the first default boundary, with the train step traced again."""
    return by_check(steps.check_training_steps(retraced(sides), len(at), steps_at=list(at)))


def test_schedule_one_step_ahead_fails_only_the_rate_checks(sides, monkeypatch):
    # A step counter off by one: the modern schedule reads iterations + 1.  The port's optimizer, given
    # the legacy gradient at the boundary, then steps at the other rate: side by side fails there too.
    real = keras.optimizers.schedules.PiecewiseConstantDecay.__call__
    monkeypatch.setattr(keras.optimizers.schedules.PiecewiseConstantDecay, "__call__",
                        lambda self, step: real(self, step + 1))
    results = restart(sides)
    assert [name for name, r in results.items() if r.status == "FAIL"] == [
        "lr schedule", "1 training step: optimizers side by side"]
    assert results["lr schedule"].diagnosis.cause.startswith("likely cause [schedule_offset]: the port's schedule "
                                                             "runs one step ahead"), results["lr schedule"].diagnosis
    assert "likely cause [schedule_offset]" in results["1 training step: optimizers side by side"].diagnosis.cause
    wrong = {e.name for e in results["lr schedule"].errors if e.max_abs > 0}
    assert "lr at step 10000" in wrong and "lr at step 25000 (probed)" in wrong  # the boundaries, one step early


def test_adam_with_keras_default_epsilon_fails_only_the_optimizer_check(sides, monkeypatch):
    monkeypatch.setattr(sides.modern.optimizer, "epsilon", 1e-7)
    results = restart(sides)
    assert [name for name, r in results.items() if r.status == "FAIL"] == [
        "1 training step: optimizer on each side", "1 training step: optimizers side by side"]
    assert results["1 training step: optimizer on each side"].worst.name.startswith("modern")
    # Where and why: the first step and variable group that part, and the epsilon entry.
    side_by_side = results["1 training step: optimizers side by side"].diagnosis
    assert side_by_side.where.startswith("first at step 10000: weights"), side_by_side.where
    assert side_by_side.cause.startswith("likely cause [epsilon]: the port's update is the original's rule with "
                                         "epsilon 1e-07 where the original's is 1e-08"), side_by_side.cause
    # Run on the original's graph: its own update ops, their epsilon fed 1e-7, make the port's update.
    assert "the original's step run with its update ops' epsilon fed 1e-07: the difference then vanishes" \
        in side_by_side.cause


def test_the_ports_adam_at_keras_default_epsilon_fails_the_configuration_check(sides, monkeypatch):
    """The port's make_optimizer defaulting to Keras' epsilon 1e-7 (TF1's is 1e-8).  Its Adam then
    updates by its own formula, so the optimizer checks, which judge each side against its own
    configuration, still pass; the configuration check compares the two and names the epsilon."""
    defaults = modern_cifar.make_optimizer.__defaults__  # (boundaries, values, epsilon, fused)
    monkeypatch.setattr(modern_cifar.make_optimizer, "__defaults__", (*defaults[:2], 1e-7, *defaults[3:]))
    flags = sides.modern.flags
    planted = modern_cifar.make_optimizer(flags.boundaries, flags.values)  # as modern_cifar.build calls it
    monkeypatch.setattr(sides.modern, "rule", optimizers.modern_rule(planted))
    result = basics.check_config(sides)
    assert result.status == "FAIL" and result.worst.name == "optimizer epsilon"
    assert 8 < result.worst.rel_l2 < 10  # |1e-7 - 1e-8| / 1e-8 = 9


def test_keras_batch_norm_momentum_fails_only_the_moving_statistics_check(sides, monkeypatch):
    # Keras' default momentum 0.99 instead of slim's decay 0.997, inside an EXPECTED check.
    for units in sides.modern.model.blocks:
        for unit in units:
            monkeypatch.setattr(unit.conv1_bn, "momentum", 0.99)
    results = restart(sides, at=(0,))
    assert [name for name, r in results.items() if r.status == "FAIL"] == ["bn moving statistics"]
    assert "conv1/BatchNorm/moving" in results["bn moving statistics"].worst.name
    cause = results["bn moving statistics"].diagnosis.cause
    assert cause.startswith("likely cause [bn_momentum]: the port's update with momentum 0.99 (its layers' "
                            "own):"), cause


def test_towers_and_replicas_cut_alike_only_when_they_see_the_same_rows():
    """What decides whether 'fewer rows than towers' compares legacy and modern directly: with batch
    norm each tower normalises over its own rows, so a direct comparison needs the same cut."""
    from compare.checks.splits import same_cut
    # 2 rows on 3: the weighted split gives the towers one row each (the third a weightless copy),
    # the modern program gives every replica both rows.
    assert not same_cut([[0], [1], [1]], [0.5, 0.5, 0.0], [([0, 1], 1 / 3)] * 3)
    # 1 row on 2: both towers and both replicas that row.
    assert same_cut([[0], [0]], [0.5, 0.5], [([0], 0.5), ([0], 0.5)])
    # The same slices in another order, a weightless tower ignored.
    assert same_cut([[2], [1, 0], [0]], [1 / 3, 2 / 3, 0.0], [([0, 1], 2 / 3), ([2], 1 / 3)])


def test_replica_slices_of_floor_size_fail_the_split_checks(sides, monkeypatch):
    """The input path the program runs (`modern.cluster.distribute`) cutting B rows into replica
    batches of floor(B/N) rows, a common hand-written split: the remainder rows are lost, as in the
    legacy fix, so the uneven-batch check, whose prediction is that the modern program keeps every
    row, fails; an even batch is cut the same either way, so the training checks still pass."""
    from modern import cluster

    def floor_split(self, batch):
        rows = int(batch[0].shape[0])

        def part(ctx):
            per_replica = rows // ctx.num_replicas_in_sync
            start = ctx.replica_id_in_sync_group * per_replica
            return tuple(t[start:start + per_replica] for t in batch)

        return self.strategy.experimental_distribute_values_from_function(part)

    monkeypatch.setattr(cluster.ReplicaBatches, "split", floor_split)
    assert "split: remainder dropped" in failed(splits.check_splits(sides))
    assert {r.status for r in forward.check_training(sides)} == {"PASS"}


def test_adam_that_forgets_its_first_moment_fails_only_from_a_trained_state(sides, monkeypatch):
    """A hand-written fused Adam that resets m before the kernel (m <- (1 - beta1) g): from zero slots,
    where every check starting at initialisation stands, m is the same either way; from the trained
    state (the legacy program's own Adam moments) the port's update departs from its own rule and from
    the legacy update (its gradients, taken where its update receives them, are still right)."""
    real = modern_cifar.FusedAdam.update_step

    def forgetful(self, gradient, variable, learning_rate):
        m, _ = keras_adapter.adam_slots(self, variable)
        m.assign(tf.zeros_like(m))
        return real(self, gradient, variable, learning_rate)

    monkeypatch.setattr(modern_cifar.FusedAdam, "update_step", forgetful)
    planted = retraced(sides)
    assert {r.status for r in forward.check_training(planted)} == {"PASS"}
    state = trained.trained_state(planted)
    results = by_check(steps.check_training_steps(planted, 1, steps_at=[state.step], start=state))
    assert results["1 training step: optimizer on each side"].status == "FAIL"
    assert results["1 training step: optimizers side by side"].status == "FAIL"
    assert results["1 training step: loss and gradients"].status == "PASS"


def ref_updates(rng, towers=2, statistics=8, size=64, decay=0.997, lost=(), wrong_decay=None):
    """What the TF1-runtime process writes back for one step, made up: each statistic updated by its
    towers atomically in a random order, except those in `lost`, where tower 0's write is lost in half
    of the elements (a race); `wrong_decay` updates everything with another decay."""
    from compare.checks import tf1
    out, updates = {"repeats": 1}, []
    for s in range(statistics):
        var = f"bn{s}/moving_mean"
        v = rng.normal(size=size).astype(np.float32)
        a = [rng.normal(size=size).astype(np.float32) for _ in range(towers)]
        c = 1 - (wrong_decay or decay)
        order = [(i, k) for i in rng.permutation(towers) for k in "Rrw"]  # one tower after the other
        after = tf1.outcome(order, v.astype(np.float64), [x.astype(np.float64) for x in a], c)
        if s in lost:
            racy = [(0, "R"), (1, "R"), (0, "r"), (1, "r"), (0, "w"), (1, "w")]  # tower 0's write overwritten
            half = np.arange(size) < size // 2
            after = np.where(half, tf1.outcome(racy, v.astype(np.float64), [x.astype(np.float64) for x in a], c), after)
        out[f"before:{var}"], out[f"after:0:{var}"] = v, after.astype(np.float32)
        for t in range(towers):
            out[f"stat:0:{len(updates)}"] = a[t]
            updates.append((var, t))
    return out, updates, {f"bn{s}/moving_mean": decay for s in range(statistics)}


@pytest.mark.parametrize("planted, status", [
    ({}, "EXPECTED"),
    ({"lost": (3,)}, "EXPECTED"),                          # a race lost some of tower 0's writes: allowed
    ({"wrong_decay": 0.99}, "FAIL"),                       # Keras' default momentum: no outcome fits
    ({"lost": tuple(range(8))}, "FAIL"),                   # a tower's update missing in every statistic
])
def test_ref_variable_updates_are_predicted_with_their_races_and_not_beyond(planted, status):
    from compare.checks import tf1
    from compare.report import Tolerance
    out, updates, decays = ref_updates(np.random.default_rng(0), **planted)
    result = tf1.ref_variable_result(out, updates, decays, Tolerance("model", 8e-5, ""), "bn", "cifar")
    assert result.status == status, result.note


# ---------------------------------------------------------------------------------------------
# Where and why: a FAIL localised (compare.diagnosis) and its known cause named (compare.causes)

def test_correct_code_localises_no_layer(sides):
    """Every layer of the port, fed the legacy program's input to it, meets its own tolerance on correct
    code, in inference and in training mode: a FAIL elsewhere is never blamed on a layer.  (Measured at
    one unit per block: the worst layer at 3.0e-7 against its 1.5e-5, a margin of 50; at ResNet-v2-50's
    units ~3e-7 against 8.4e-5.)"""
    for training, compared in ((False, 9), (True, 8)):  # training mode: the dropout is not compared
        sides.set_both(sides.start)
        found = diagnosis.localise_layers(sides, sides.batch(seed=2), training=training)
        parts = [p for p in found.parts if not np.isnan(p.tolerance)]
        assert len(parts) == compared, [p.name for p in found.parts]
        assert max(p.error / p.tolerance for p in parts) < 0.05, max(parts, key=lambda p: p.error / p.tolerance)
        assert found.where.startswith(f"every one of {compared} paired layers agrees")


def test_pool1_with_valid_padding_is_localised_to_pool1_and_named(sides, monkeypatch):
    """keras.applications' ResNet pools 'valid' after a zero pad; slim pools 'SAME' (modern/resnet_v2.py)."""
    monkeypatch.setattr(sides.modern.model.pool1, "padding", "valid")
    sides.set_both(sides.start)
    result = forward.check_inference(sides)
    assert result.status == "FAIL"
    assert result.diagnosis.where.startswith("first at layer pool1 (resnet_v2_50/pool1), inference mode"), \
        result.diagnosis.where
    assert "the 1 layer(s) before it agree" in result.diagnosis.where
    assert result.diagnosis.cause.startswith("likely cause [padding]: pool1 with padding='same' (the port has "
                                             "'valid')"), result.diagnosis.cause


def test_keras_batch_norm_epsilon_in_one_unit_is_localised_to_it_and_named(sides, monkeypatch):
    unit = sides.modern.model.blocks[1][0]
    for norm in (unit.preact, unit.conv1_bn, unit.conv2_bn):
        monkeypatch.setattr(norm, "epsilon", 1e-3)
    sides.set_both(sides.start)
    result = forward.check_inference(sides)
    assert result.status == "FAIL"
    assert result.diagnosis.where.startswith("first at layer block2_unit_1 "), result.diagnosis.where
    assert result.diagnosis.cause.startswith("likely cause [bn_epsilon]: its batch norm's epsilon 1e-05 (the port "
                                             "has 0.001)"), result.diagnosis.cause


def test_dropout_given_the_keep_probability_as_its_rate_is_named(sides, monkeypatch):
    monkeypatch.setattr(sides.modern.model.dropout, "rate", 0.6)  # Dropout(keep_prob): keeps 0.4
    result = forward.check_dropout(sides)
    assert result.status == "FAIL"
    assert result.diagnosis.cause.startswith("likely cause [keep_prob]: the port's Dropout given the keep "
                                             "probability as its rate"), result.diagnosis.cause


def fused_batch_norm_moving(monkeypatch, change):
    """The port's fused batch norm, its batch statistics (what the moving averages move toward) changed."""
    real = tf.compat.v1.nn.fused_batch_norm

    def planted(x, scale, offset, **kwargs):
        out, mean, variance = real(x, scale, offset, **kwargs)
        if not kwargs.get("is_training", True):
            return out, mean, variance
        return (out, *change(x, mean, variance))
    monkeypatch.setattr(tf.compat.v1.nn, "fused_batch_norm", planted)


def test_moving_variance_by_the_biased_batch_variance_is_named(sides, monkeypatch):
    """Keras 3's own BatchNormalization moves its variance toward the biased batch variance."""
    def biased(x, mean, variance):
        n = tf.cast(tf.size(x) // tf.shape(x)[-1], variance.dtype)
        return mean, variance * (n - 1) / n
    fused_batch_norm_moving(monkeypatch, biased)
    results = restart(sides, at=(0,))
    assert [name for name, r in results.items() if r.status == "FAIL"] == ["bn moving statistics"]
    cause = results["bn moving statistics"].diagnosis.cause
    assert cause.startswith("likely cause [bessel]: the port's update with the biased batch variance:"), cause


def test_moving_statistics_of_replica_0_only_are_named(sides, monkeypatch):
    """The effect of Keras 3's per-replica moving statistics (aggregation NONE, replica 0's copy read):
    every copy moved toward replica 0's batch statistics."""
    def replica_zero(x, mean, variance):
        context = tf.distribute.get_replica_context()
        first = tf.cast(tf.equal(context.replica_id_in_sync_group, 0), mean.dtype)
        total = lambda t: context.all_reduce(tf.distribute.ReduceOp.SUM, t * first)  # noqa: E731
        return total(mean), total(variance)
    fused_batch_norm_moving(monkeypatch, replica_zero)
    results = restart(sides, at=(0,))
    assert "bn moving statistics" in [name for name, r in results.items() if r.status == "FAIL"]
    cause = results["bn moving statistics"].diagnosis.cause
    assert cause.startswith("likely cause [replica_statistics]: the port's update with replica 0's statistics "
                            "only:"), cause


def test_adam_with_another_beta2_fails_the_optimizer_checks_and_is_named(sides, monkeypatch):
    """The port's Adam with beta_2 0.99 (the original's 0.999): the search over each beta finds beta2 at
    0.99, and beta1 fits at no value (the step's epsilon and bias correction tell a beta from a scale)."""
    monkeypatch.setattr(sides.modern.optimizer, "beta_2", 0.99)
    results = restart(sides)
    assert [name for name, r in results.items() if r.status == "FAIL"] == [
        "1 training step: optimizer on each side", "1 training step: optimizers side by side"]
    cause = results["1 training step: optimizers side by side"].diagnosis.cause
    assert cause.startswith("likely cause [adam_beta]: the port's update is the original's Adam with beta2 0.99 "
                            "where the original's is 0.999 (step 10000, every variable, beta2 found by a search)"), \
        cause
    assert "fits as well" not in cause
    assert "the original's step run with its update ops' beta2 fed 0.99: the difference then vanishes" in cause
