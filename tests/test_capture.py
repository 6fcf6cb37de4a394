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

from compare import harness
from compare.interface import Batch
from compare.capture import CapturedLegacy, CaptureError, capture, find, parse_flags
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


def test_a_cross_entropy_without_label_smoothing_fails_the_loss_and_gradients(tmp_path, monkeypatch):
    real = modern_train.replica_loss
    monkeypatch.setattr(modern_train, "replica_loss",
                        lambda model, x, y, global_batch, label_smoothing: real(model, x, y, global_batch, 0.0))
    results = judged(tmp_path, dataclasses.replace(SETTINGS, only=("training",)))
    assert failed(results) == ["forward (training, same dropout masks)", "gradients (read out of the train step)"]


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


def test_names_takes_every_field_it_documents_and_refuses_one_it_does_not(tmp_path):
    with pytest.raises(CaptureError, match=r"names= has no field 'losss': it takes feed, tower_logits, "):
        CapturedLegacy(SESSIONS, lambda towers, files: [], "--num_gpus", names={"losss": lambda graph, found: None})
    side = CapturedLegacy(SESSIONS, lambda towers, files: ["--session", "supervisor", "--train_dir",
                                                            str(tmp_path / "train")], "--num_gpus",
                          names={"loss": lambda graph, found: graph.get_tensor_by_name("total_loss:0")})
    built = side.build(side.parse_args([]), 2, {})
    assert built.loss.name == "total_loss:0"
    assert tf.executing_eagerly()


@pytest.mark.parametrize("average, weights", [(False, [1.0, 1.0]), (True, [0.5, 0.5])])
def test_the_towers_weights_and_the_combined_loss_are_read_from_the_graph(tmp_path, average, weights):
    """model_deploy divides each clone's loss by the clone count and sums the clones' gradients (weights
    1); the classic tutorial averages whole tower losses' gradients (1/N).  The combined loss the
    harness judges is then the program's own total loss, to the last bit's worth."""
    argv = ["--session", "supervisor", "--train_dir", str(tmp_path / "train")] + (["--average"] if average else [])
    side = CapturedLegacy(SESSIONS, lambda towers, files: argv, "--num_gpus")
    built = side.build(side.parse_args([]), 2, {})
    assert built.feed(dataclasses.replace(Batch(np.zeros((16, 6), np.float32), np.zeros(16, np.int32))),
                      True).weights == weights
    with built.graph.as_default():
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=built.graph, config=side.captured.config) as sess:
        sess.run(init)
        combined, total = sess.run([built.loss, built.graph.get_tensor_by_name("total_loss:0")])
    assert abs(combined - total) <= 1e-6 * abs(total), (combined, total)
    assert tf.executing_eagerly()
