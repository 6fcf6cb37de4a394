"""A TF1 program judged by running it (compare/capture.py): examples/split_towers, a program as found
(absl flags, queue runners, tf.split towers, RMSProp, clipping after averaging, label smoothing, one
monolithic train()), against its Keras 3 port with an optimizer of its own.

The correct port passes every check the pair can give; three realistic port mistakes, planted in the
port's own code, each FAIL the check that judges what they change.  After a capture TensorFlow is back
in TF2 behaviour (eager, Keras 3), whatever the program switched.
"""
import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from compare import capture as capture_module
from compare import harness
from compare.interface import Batch, Pair
from compare.capture import CapturedLegacy, CaptureError, capture, find, parse_flags
from compare.legacy_run import LegacyRun
from conftest import ROOT
from examples.split_towers import adapter, modern_train

SETTINGS = harness.Settings(towers=2, steps=2, free_steps=4, quick=True)


def judged(tmp_path, settings=SETTINGS, pair=adapter.PAIR):
    return {r.check: r for r in harness.judge_pair(pair, settings, str(tmp_path), log=lambda *_: None)}


def failed(results):
    return sorted(name for name, r in results.items() if r.status in ("FAIL", "ERROR"))


def test_the_captured_program_and_its_port_pass_every_check(tmp_path):
    results = judged(tmp_path)
    assert failed(results) == []
    passed = {name for name, r in results.items() if r.status == "PASS"}
    assert {"configuration (flags and what they build)", "structure (regularised, averaged, trained)",
            "input pipelines", "forward (inference)", "gradients (read out of the train step)", "lr schedule",
            "2 training steps: optimizers side by side", "4 free-running steps (chaos floor)"} <= passed
    # Found in the graph, not named by the adapter: both towers, the queue the rows come from, RMSProp.
    assert "of 2 towers" in results["forward (inference)"].note
    assert "queue runners started and stopped by the harness" in results["input pipelines"].note
    side_by_side = results["2 training steps: optimizers side by side"].note
    assert "legacy rmsprop (rho 0.9, momentum 0.9, epsilon 1)" in side_by_side
    # The port's own optimizer: judged against the legacy one, its slots paired by value (ms, mom).
    assert "slots paired by value" in side_by_side
    structure = results["structure (regularised, averaged, trained)"].note
    assert "regularised: legacy 4 (4 of them in its loss), modern 4 variables" in structure
    # TF2 behaviour back after the captures: eager execution and Keras 3.
    assert tf.executing_eagerly()
    assert keras.layers.Dense(2)(tf.ones([1, 3])).shape == (1, 2)


def test_rmsprop_with_its_epsilon_outside_the_root_fails_the_optimizers_side_by_side(tmp_path, monkeypatch):
    """Keras 2's RMSprop took lr g / (sqrt(ms) + eps) where TF1's kernel takes lr g / sqrt(ms + eps)."""
    def update_step(self, gradient, variable, learning_rate):
        index = self._get_variable_index(variable)
        ms, mom = self._ms[index], self._mom[index]
        lr = tf.cast(learning_rate, variable.dtype)
        self.assign(ms, ms + (tf.square(gradient) - ms) * (1 - self.rho))
        self.assign(mom, self.momentum * mom + lr * gradient / (tf.sqrt(ms) + self.epsilon))
        self.assign_sub(variable, mom)

    monkeypatch.setattr(modern_train.TF1RMSProp, "update_step", update_step)
    results = judged(tmp_path, dataclasses.replace(SETTINGS, only=("training", "steps")))
    assert failed(results) == ["2 training steps: optimizers side by side"]
    assert results["2 training steps: loss and gradients"].status == "PASS"
    cause = results["2 training steps: optimizers side by side"].diagnosis.cause
    assert cause.startswith("likely cause [epsilon_placement]: the port's update is the original's rule with epsilon "
                            "outside the square root"), cause


def test_keras_rmsprop_starting_its_mean_square_at_0_fails_the_configuration_and_is_named(tmp_path, monkeypatch):
    """keras.optimizers.RMSprop is TF1's rule (epsilon inside the root, momentum on the scaled step) but
    starts its mean square at 0 where TF1's starts at 1: from the same state every step agrees, the
    start does not (the configuration check compares each side's own initial slots)."""
    def make_optimizer(args):
        decay_steps = int(args.num_examples_per_epoch / args.batch_size * args.num_epochs_per_decay)
        schedule = keras.optimizers.schedules.ExponentialDecay(args.initial_learning_rate, decay_steps,
                                                               args.learning_rate_decay_factor)
        return keras.optimizers.RMSprop(schedule, rho=args.rmsprop_decay, momentum=args.rmsprop_momentum,
                                        epsilon=args.rmsprop_epsilon)

    monkeypatch.setattr(modern_train, "make_optimizer", make_optimizer)
    results = judged(tmp_path, dataclasses.replace(SETTINGS, only=("basics",)))
    config = results["configuration (flags and what they build)"]
    assert config.status == "FAIL" and config.worst.name.endswith("ms at the start"), config.worst
    assert "ms legacy 1, modern 0" in config.diagnosis.where, config.diagnosis.where
    assert config.diagnosis.cause.startswith("likely cause [slot_init]"), config.diagnosis.cause


def test_clipping_each_replicas_gradients_before_the_all_reduce_fails_the_gradients(tmp_path, monkeypatch):
    """Keras' own global_clipnorm, applied inside the replicas: each replica's part of the gradient is
    clipped before they are summed (the TF1 program clips the averaged gradient)."""
    def make_train_step(model, optimizer, strategy, args):
        variables = model.trainable_variables
        optimizer.global_clipnorm = args.clip_norm

        def replica(x, y):
            global_batch = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.shape(y)[0])
            with tf.GradientTape() as tape:
                loss = modern_train.replica_loss(model, x, y, global_batch, args.label_smoothing)
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables))
            return loss

        @tf.function
        def train_step(element):
            loss = strategy.run(replica, args=element)
            return strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None), None
        return train_step

    monkeypatch.setattr(modern_train, "make_train_step", make_train_step)
    results = judged(tmp_path, dataclasses.replace(SETTINGS, only=("training",)))
    assert failed(results) == ["gradients (read out of the train step)"]
    assert results["forward (training, same dropout masks)"].status == "PASS"
    assert "as the optimizer's update received them" in results["gradients (read out of the train step)"].note
    cause = results["gradients (read out of the train step)"].diagnosis.cause
    assert cause.startswith("likely cause [clip_per_replica]: each of the 2 replicas' parts clipped"), cause


def test_a_cross_entropy_without_label_smoothing_fails_the_loss_and_gradients(tmp_path, monkeypatch):
    real = modern_train.replica_loss
    monkeypatch.setattr(modern_train, "replica_loss",
                        lambda model, x, y, global_batch, label_smoothing: real(model, x, y, global_batch, 0.0))
    results = judged(tmp_path, dataclasses.replace(SETTINGS, only=("training",)))
    assert failed(results) == ["forward (training, same dropout masks)", "gradients (read out of the train step)"]
    for check in failed(results):
        cause = results[check].diagnosis.cause
        assert cause.startswith("likely cause [label_smoothing]: the port's label smoothing -0.1 from the "
                                "original's"), cause


def test_flags_are_the_programs_own_absl_flags_and_remember_their_argv():
    flags = parse_flags(adapter.PROGRAM, ["--num_gpus", "3", "--clip_norm", "0.5"])
    assert (flags.num_gpus, flags.clip_norm, flags.rmsprop_epsilon, flags._argv) == (
        3, 0.5, 1.0, ("--num_gpus", "3", "--clip_norm", "0.5"))
    assert "logtostderr" not in vars(flags)  # absl's own flags are not the program's
    assert tf.executing_eagerly()


def test_a_program_that_never_trains_is_one_line(tmp_path):
    program = tmp_path / "no_training.py"
    program.write_text("import tensorflow as tf\nprint(tf.constant(1.0))\n")
    with pytest.raises(CaptureError, match=r"no training Session.run to capture: it ended with exit status 0"):
        capture(str(program), [])
    assert tf.executing_eagerly()


# ---------------------------------------------------------------------------------------------
# Every session kind a TF1 program trains through, and a graph the program finalizes

SESSIONS = str(ROOT / "tests" / "tf1_programs" / "capture_sessions" / "train_sessions.py")


@pytest.mark.parametrize("session", ["plain", "monitored", "monitored_training", "supervisor", "slim"])
def test_a_program_is_captured_through_every_session_kind_and_its_finalize_is_held(tmp_path, session):
    """MonitoredSession, MonitoredTrainingSession, Supervisor and slim.learning.train finalize the
    graph before they train: the request is recorded, the graph stays open for the harness's own ops."""
    captured = capture(SESSIONS, ["--session", session, "--train_dir", str(tmp_path / "train")])
    assert captured.finalized == (session != "plain")
    assert not captured.graph.finalized
    found = find(captured.graph, captured.train_op)
    assert len(found.tower_losses) == 2 and len(found.inputs) == 2
    assert sorted(v.op.name for _, v in found.grads_and_vars) == ["model/biases", "model/weights"]
    with captured.graph.as_default():
        tf.compat.v1.identity(found.tower_losses[0], name="harness_tap")  # the harness adds its ops beside
    assert tf.executing_eagerly()


class SessionsData:
    """Rows as train_sessions.py's towers take them (6 features, 3 classes)."""

    def write(self, folder, towers, seed):
        return {}

    def batch(self, rows, seed):
        rng = np.random.RandomState(seed)
        return Batch(rng.normal(size=(rows, 6)).astype(np.float32), rng.randint(0, 3, rows).astype(np.int32))


@pytest.mark.parametrize("session", ["plain", "monitored", "monitored_training", "supervisor", "slim"])
def test_the_harness_builds_its_ops_and_trains_a_step_through_every_session_kind(tmp_path, session):
    """CapturedLegacy.build and compare.legacy_run's LegacyRun (its taps, setters, initializer, savers in
    the program's graph) on a program whose session finalizes the graph, then one legacy step: nothing
    raises 'Graph is finalized', the step is the program's own (its global step moves by one)."""
    side = CapturedLegacy(SESSIONS, lambda towers, files: ["--session", session, "--train_dir",
                                                            str(tmp_path / "train")], "--num_gpus")
    pair = Pair(name="sessions", legacy=side, modern=None, data=SessionsData(), rows_per_tower=8)
    legacy = LegacyRun(pair, side.parse_args([]), 2, {}, seed=0)
    try:
        assert side.captured.finalized == (session != "plain")
        before = legacy.state()
        outcome = legacy.step(SessionsData().batch(16, 1))
        assert np.isfinite(outcome.loss) and legacy.state().step == before.step + 1
        assert sorted(outcome.gradients) == ["model/biases", "model/weights"]
    finally:
        legacy.close()
    assert tf.executing_eagerly()


def test_names_takes_every_field_it_documents_and_refuses_one_it_does_not(tmp_path):
    with pytest.raises(CaptureError, match=r"names= has no field 'losss': it takes feed, tower_logits, "):
        CapturedLegacy(SESSIONS, lambda towers, files: [], "--num_gpus", names={"losss": lambda graph, found: None})
    side = CapturedLegacy(SESSIONS, lambda towers, files: ["--session", "supervisor", "--train_dir", "train"],
                          "--num_gpus", cwd=str(tmp_path),  # a folder as it is, or a function of the files
                          names={"loss": lambda graph, found: graph.get_tensor_by_name("total_loss:0")})
    built = side.build(side.parse_args([]), 2, {})
    assert built.loss.name == "total_loss:0"
    assert (tmp_path / "train").is_dir()  # the program's relative train_dir, in cwd
    assert tf.executing_eagerly()


def weights_and_losses(tmp_path, average):
    """(the towers' weights in the feed, the combined loss the harness judges, the program's own
    total_loss), the two losses of one batch."""
    argv = ["--session", "supervisor", "--train_dir", str(tmp_path / "train")] + (["--average"] if average else [])
    side = CapturedLegacy(SESSIONS, lambda towers, files: argv, "--num_gpus")
    built = side.build(side.parse_args([]), 2, {})
    weights = built.feed(Batch(np.zeros((16, 6), np.float32), np.zeros(16, np.int32)), True).weights
    with built.graph.as_default():
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=built.graph, config=side.captured.config) as sess:
        sess.run(init)
        combined, total = sess.run([built.loss, built.graph.get_tensor_by_name("total_loss:0")])
    assert tf.executing_eagerly()
    return weights, combined, total


@pytest.mark.parametrize("average, weights", [(False, [1.0, 1.0]), (True, [0.5, 0.5])])
def test_the_towers_weights_and_the_combined_loss_are_read_from_the_graph(tmp_path, average, weights):
    """model_deploy divides each clone's loss by the clone count and sums the clones' gradients (weights
    1); the classic tutorial averages whole tower losses' gradients (1/N).  The combined loss the
    harness judges is then the program's own total loss, to the last bit's worth."""
    found, combined, total = weights_and_losses(tmp_path, average)
    assert found == weights
    assert abs(combined - total) <= 1e-6 * abs(total), (combined, total)


def test_the_old_assumption_of_weights_1_over_n_misses_a_model_deploy_total_loss(tmp_path, monkeypatch):
    """Planted: the towers weighted 1/N whatever the graph says (the assumption this replaced).  On the
    summing program the combined loss is then half its own total loss, which the check above catches."""
    monkeypatch.setattr(capture_module, "tower_weights", lambda applied, starts: [1 / len(starts)] * len(starts))
    found, combined, total = weights_and_losses(tmp_path, average=False)
    assert found == [0.5, 0.5]
    assert not abs(combined - total) <= 1e-6 * abs(total)
    assert abs(combined - total / 2) <= 1e-6 * abs(total)


def joined_weights(join, towers=2):
    """The weights `tower_weights` reads from a graph of `towers` towers built here whose towers' gradients
    are joined by `join` (a function of the per-tower gradients of one variable -> the applied gradient)."""
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3])
        w = tf1.get_variable("w", [3, 2], initializer=tf1.ones_initializer())
        opt = tf1.train.GradientDescentOptimizer(0.1)
        per_tower = []
        for i, part in enumerate(tf.split(x, towers)):
            with tf1.name_scope("tower_%d" % i):
                per_tower.append(opt.compute_gradients(tf.reduce_mean(tf.matmul(part, w) ** 2), [w])[0][0])
        train_op = opt.apply_gradients([(join(per_tower), w)])
    return find(graph, train_op).tower_weights


@pytest.mark.parametrize("join, weights", [
    (lambda g: tf.add_n(g) / 2, [0.5, 0.5]),                                  # a sum divided by the count
    (lambda g: tf.add_n(g) * 0.25, [0.25, 0.25]),                             # ... multiplied by a constant
    (lambda g: tf.reduce_mean(tf.stack(g), 0), [0.5, 0.5]),                   # a mean over a stack
    (lambda g: tf.reduce_sum(tf.stack(g), 0), [1.0, 1.0]),                    # a sum over a stack
    (lambda g: tf.clip_by_global_norm([tf.add_n(g)], 0.1)[0][0], [1.0, 1.0]),  # a clip scale is no weight
    (lambda g: tf.maximum(g[0], g[1]), None),                                 # not a sum or a mean: refused
])
def test_the_ways_of_joining_the_towers_gradients_are_read(join, weights):
    assert joined_weights(join) == weights


def test_one_tower_has_weight_one_whatever_its_gradient_passes_through():
    """At one tower (the flags check builds each program so) nothing joins: the weight is 1, not a refusal,
    even where the gradient passes a constant scaling on its way (an l2 term's 2c w is no tower weight)."""
    assert joined_weights(lambda g: g[0] + 0.01 * g[0], towers=1) == [1.0]
