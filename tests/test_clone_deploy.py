"""examples/clone_deploy: a program in TF-Slim's model_deploy style, judged as it runs, with the traits that
once blinded the judge: clones' losses divided by the clone count and summed (tower weights 1, read from
the graph), the regularisation on the first clone only, a dropout that is on in every run (the network
built with is_training=True: no inference mode), a prefetch queue with a static batch, and
slim.learning.train, whose Supervisor finalizes the graph.

The correct port is judged at a tolerance with power (the dropout's masks imposed alike wherever logits
are compared); the realistic port mistakes planted in its own code each FAIL, and are named.
"""
import dataclasses
import json
import os
import subprocess
import sys

import keras
import tensorflow as tf

from compare import harness, sides as sides_module, tolerances
from conftest import ROOT
from examples.clone_deploy import adapter, modern_train

SETTINGS = harness.Settings(towers=2, steps=2, free_steps=4, quick=True)


def judged(tmp_path, settings=SETTINGS):
    return {r.check: r for r in harness.judge_pair(adapter.PAIR, settings, str(tmp_path), log=lambda *_: None)}


def failed(results):
    return sorted(name for name, r in results.items() if r.status in ("FAIL", "ERROR"))


def model_tolerance(results):
    """The model tolerance every check judged at that tolerance carries."""
    return results["forward (training, same dropout masks)"].tolerance.rel_l2


def test_the_correct_port_passes_at_a_tolerance_with_power_and_says_what_it_cannot_judge(tmp_path):
    results = judged(tmp_path)
    assert failed(results) == []
    assert "tolerances with power" not in results
    assert model_tolerance(results) <= tolerances.POWER_BOUND.rel_l2 / 10
    passed = {name for name, r in results.items() if r.status == "PASS"}
    assert {"structure (regularised, averaged, trained)", "input pipelines", "dropout (training mode)",
            "forward (training, same dropout masks)", "gradients (read out of the train step)", "lr schedule",
            "2 training steps: optimizers side by side", "4 free-running steps (chaos floor)"} <= passed
    # No inference mode in the training graph: that check judges nothing, and says so.
    inference = results["forward (inference)"]
    assert inference.status == "NOT APPLICABLE"
    assert "no inference mode" in inference.note and "clone_0/CifarNet/dropout3" in inference.note
    # The prefetch queue's static batch: a split it cannot take is NOT APPLICABLE, never fed.
    assert "static batch size" in results["split: short last batch"].note


def test_without_the_masks_imposed_in_inference_mode_the_pair_cannot_be_judged(tmp_path, monkeypatch):
    """The judge as it was: the always-on dropout's noise left to the program, two runs on one feed
    disagree and the derived tolerance (~15) could pass anything; the run says it cannot judge."""
    monkeypatch.setattr(sides_module.Sides, "always_on", property(lambda self: []))
    results = judged(tmp_path, dataclasses.replace(SETTINGS, only=("basics",)))
    power = results["tolerances with power"]
    assert power.status == "FAIL" and power.worst.rel_l2 > 100 * tolerances.POWER_BOUND.rel_l2
    assert "clone_0/CifarNet/dropout3/dropout/random_uniform" in power.note


def test_the_regularisation_added_on_every_replica_fails_the_gradients_and_is_named(tmp_path, monkeypatch):
    """A port that adds model.losses in every replica's loss (model_deploy adds it once, to the first
    clone): the regularised weights' gradients move by about 1e-3 relative, a hundred times the
    tolerance, and the cause is named."""
    def replica_loss(model, x, y, global_batch, label_smoothing):
        logits = model(x, training=True)
        per_row = keras.losses.categorical_crossentropy(tf.one_hot(y, modern_train.NUM_CLASSES), logits,
                                                        from_logits=True, label_smoothing=label_smoothing)
        return tf.nn.compute_average_loss(per_row, global_batch_size=global_batch) + tf.add_n(model.losses)

    monkeypatch.setattr(modern_train, "replica_loss", replica_loss)
    results = judged(tmp_path, dataclasses.replace(SETTINGS, only=("training",)))
    assert failed(results) == ["forward (training, same dropout masks)", "gradients (read out of the train step)"]
    gradients = results["gradients (read out of the train step)"]
    assert 1e-4 < gradients.worst.rel_l2 < 1e-2, gradients.worst
    assert gradients.worst.rel_l2 > 100 * model_tolerance(results)
    assert gradients.diagnosis.cause.startswith("likely cause [regulariser_scale]"), gradients.diagnosis.cause
    assert "once per replica (2)" in gradients.diagnosis.cause


def test_keras_dropout_draws_one_mask_for_every_replica_and_fails_the_dropout_check(tmp_path, monkeypatch):
    """keras.layers.Dropout under MirroredStrategy: every replica drops the same units (each TF1 clone
    draws its own mask).  The training checks impose the port's masks on the clones and cannot see it;
    the dropout check's mask agreement does, and names the cause."""
    monkeypatch.setattr(modern_train, "ReplicaDropout", keras.layers.Dropout)
    results = judged(tmp_path, dataclasses.replace(SETTINGS, only=("forward",)))
    dropout = results["dropout (training mode)"]
    assert dropout.status == "FAIL" and "mask agreement" in dropout.worst.name
    assert dropout.diagnosis.cause.startswith("likely cause [replica_masks]"), dropout.diagnosis.cause


def test_each_replica_averaging_its_own_rows_fails_the_loss_and_gradients_and_is_named(tmp_path, monkeypatch):
    """Each replica's loss the mean over its own rows (tf.reduce_mean where the port needs
    tf.nn.compute_average_loss): the replicas' summed gradients are N times the clones' (each clone's
    mean is divided by the clone count)."""
    def replica_loss(model, x, y, global_batch, label_smoothing):
        logits = model(x, training=True)
        per_row = keras.losses.categorical_crossentropy(tf.one_hot(y, modern_train.NUM_CLASSES), logits,
                                                        from_logits=True, label_smoothing=label_smoothing)
        return tf.reduce_mean(per_row) + tf.nn.scale_regularization_loss(tf.add_n(model.losses))

    monkeypatch.setattr(modern_train, "replica_loss", replica_loss)
    results = judged(tmp_path, dataclasses.replace(SETTINGS, only=("training",)))
    assert failed(results) == ["forward (training, same dropout masks)", "gradients (read out of the train step)"]
    for check in failed(results):
        cause = results[check].diagnosis.cause
        assert cause.startswith("likely cause [loss_scale]") and "2 times the original's" in cause, cause


def test_every_build_trains_in_a_folder_no_earlier_build_wrote(tmp_path):
    """slim.learning.train's Supervisor restores the newest checkpoint of its train_dir: a build that
    reused the folder of an earlier build (another flag's graph) would restore that graph's variables,
    and fails where their shapes differ (TF-Slim's --labels_offset 1 in the flags check)."""
    files = adapter.Data().write(str(tmp_path / "data"), 1, 0)
    files["scratch"] = str(tmp_path / "scratch")
    os.makedirs(files["scratch"])
    legacy = adapter.PAIR.legacy
    flags = legacy.parse_args([*adapter.PAIR.harness_argv(1), "--num_clones", "1"])
    for _ in range(2):
        legacy.build(flags, 1, files)
    folders = sorted(os.listdir(files["scratch"]))
    assert len(folders) == 2, folders
    assert all(any(f.startswith("model.ckpt") for f in os.listdir(os.path.join(files["scratch"], d))) for d in folders)


def test_label_smoothing_the_original_does_not_have_fails_the_loss_and_gradients_and_is_named(tmp_path, monkeypatch):
    """The port smooths its labels by 0.1 (the original's default is 0): near the start the network's
    predictions are near uniform and the loss hardly moves (2e-4), the logits' gradient does (0.1)."""
    real = modern_train.replica_loss
    monkeypatch.setattr(modern_train, "replica_loss", lambda model, x, y, global_batch, label_smoothing: real(
        model, x, y, global_batch, 0.1))
    results = judged(tmp_path, dataclasses.replace(SETTINGS, only=("training",)))
    assert failed(results) == ["forward (training, same dropout masks)", "gradients (read out of the train step)"]
    for check in failed(results):
        cause = results[check].diagnosis.cause
        assert cause.startswith("likely cause [label_smoothing]: the port's label smoothing +0.1 from the "
                                "original's"), cause


PLANTED = '''"""The clone_deploy pair as a user would judge a port of theirs: its replica_loss adds the
regularisation in every replica (model_deploy adds it once, to the first clone)."""
import keras
import tensorflow as tf

from examples.clone_deploy import modern_train
from examples.clone_deploy.adapter import PAIR  # noqa: F401


def replica_loss(model, x, y, global_batch, label_smoothing):
    logits = model(x, training=True)
    per_row = keras.losses.categorical_crossentropy(tf.one_hot(y, modern_train.NUM_CLASSES), logits,
                                                    from_logits=True, label_smoothing=label_smoothing)
    return tf.nn.compute_average_loss(per_row, global_batch_size=global_batch) + tf.add_n(model.losses)


modern_train.replica_loss = replica_loss
'''


def test_command_line_fails_the_regularisation_on_every_replica_in_the_gradients_and_names_it(tmp_path):
    """`compare/run.py --pair MODULE`, the module a file of the user's beside no harness code: exit 1,
    the gradients FAIL a hundred times over their tolerance with the cause named, no traceback."""
    (tmp_path / "planted_clone_deploy.py").write_text(PLANTED)
    report = tmp_path / "parity.json"
    done = subprocess.run([sys.executable, "compare/run.py", "--pair", "planted_clone_deploy", "--quick", "--only",
                           "training", "--report", str(report)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    results = {r["check"]: r for r in json.loads(report.read_text())["results"]}
    assert sorted(n for n, r in results.items() if r["status"] == "FAIL") == [
        "forward (training, same dropout masks)", "gradients (read out of the train step)"]
    gradients = results["gradients (read out of the train step)"]
    assert gradients["worst"]["rel_l2"] > 100 * gradients["tolerance_rel_l2"]
    assert gradients["diagnosis"]["cause"].startswith("likely cause [regulariser_scale]")
