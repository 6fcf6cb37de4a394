"""The third pair (examples/cifar10_tutorial/), written in another style than the two pairs, is
judged by the generic checks through its adapter, and planted mistakes in its TF2 port fail the right
check; its two programs train and evaluate on the embedded data; its binary CIFAR-10 reader reads
the real format.
"""
import dataclasses
import os

import keras
import numpy as np
import pytest
import tensorflow as tf


from compare import harness
from conftest import run_program
from examples.cifar10_tutorial import adapter, cifar10_input, modern_train

SETTINGS = harness.Settings(towers=2, steps=2, free_steps=4, quick=True)


def judged(tmp_path, settings=SETTINGS):
    return {r.check: r for r in harness.judge_pair(adapter.PAIR, settings, str(tmp_path), log=lambda *_: None)}


def failed(results):
    return sorted(n for n, r in results.items() if r.status == "FAIL")


def test_the_tutorial_pair_passes_the_generic_checks(tmp_path):
    results = judged(tmp_path)
    assert failed(results) == []
    passed = {n for n, r in results.items() if r.status == "PASS"}
    assert {"configuration (flags and what they build)", "variables", "checkpoint round trip", "input pipelines",
            "forward (inference)", "forward (training, same dropout masks)", "gradients (read out of the train step)",
            "lr schedule", "2 training steps: loss and gradients", "2 training steps: optimizer on each side",
            "step counters", "4 free-running steps (chaos floor)", "evaluation (one checkpoint)"} <= passed
    # The variables' moving average is grouped with the update, unordered, as in the tutorial.
    assert results["moving average (unordered)"].status == "EXPECTED"
    # What the program cannot receive or does not have is NOT APPLICABLE, with the reason.
    assert results["split: uneven batch"].status == "NOT APPLICABLE"
    assert "full batches of 8 rows only" in results["split: uneven batch"].note
    assert results["dropout (training mode)"].status == "NOT APPLICABLE"
    # The staircase schedule's boundary was found from the graph (50000 / 8 x 350 steps).
    assert "changes after steps [2187499]" in results["lr schedule"].note
    assert len(results["gradients (read out of the train step)"].errors) == 10


def test_a_continuous_decay_where_the_tutorial_steps_fails_only_the_rate_checks(tmp_path, monkeypatch):
    """Keras' ExponentialDecay defaults to staircase=False; the tutorial decays in steps.  The port's
    optimizer, given the legacy gradient, then steps at another rate: side by side fails too."""
    def continuous(batch_size, num_examples_per_epoch=cifar10_input.NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN):
        decay_steps = int(num_examples_per_epoch / batch_size * modern_train.NUM_EPOCHS_PER_DECAY)
        return keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(
            modern_train.INITIAL_LEARNING_RATE, decay_steps, modern_train.LEARNING_RATE_DECAY_FACTOR))

    monkeypatch.setattr(modern_train, "make_optimizer", continuous)
    results = judged(tmp_path)
    assert failed(results) == ["1 training step: optimizers side by side (trained state)",
                               "2 training steps: optimizers side by side", "lr schedule",
                               "lr schedule (trained state)"]
    assert results["lr schedule"].diagnosis.cause.startswith("likely cause [staircase]: the port's schedule with "
                                                             "staircase=True"), results["lr schedule"].diagnosis


def test_a_moving_average_decay_of_its_own_fails_the_averages_and_is_named(tmp_path, monkeypatch):
    """ExponentialMovingAverage(0.99) where the tutorial averages at 0.9999: in the warm-up both take
    (1 + n)/(10 + n); past it the port's shadows move a hundred times faster."""
    real = modern_train.make_moving_average
    monkeypatch.setattr(modern_train, "make_moving_average", lambda model, optimizer: real(model, optimizer, 0.99))
    results = judged(tmp_path, dataclasses.replace(SETTINGS, only=("averages",)))
    averages = results["moving average (unordered)"]
    assert averages.status == "FAIL"
    assert averages.diagnosis.cause.startswith("likely cause [ema_decay]: the port averages with decay 0.99 where "
                                               "the original's is 0.9999"), averages.diagnosis.cause


def test_an_evaluation_that_cannot_tell_the_predictions_apart_is_not_applicable(tmp_path, monkeypatch):
    """A metric that does not move when every prediction moves to the next class (here an evaluation
    blind to its checkpoint; in practice a model at chance level) judges nothing: NOT APPLICABLE, never
    a PASS of 0.1 against 0.1.  The tutorial's own evaluation can tell (its note gives the probe's)."""
    results = judged(tmp_path / "own", dataclasses.replace(SETTINGS, only=("evaluation",)))
    assert results["evaluation (one checkpoint)"].status == "PASS"
    assert "a checkpoint predicting every row's next class gives precision@1" in results[
        "evaluation (one checkpoint)"].note
    monkeypatch.setattr(adapter.Legacy, "evaluate", lambda self, flags, path, files: {"precision@1": 0.1})
    blind = judged(tmp_path / "blind", dataclasses.replace(SETTINGS, only=("evaluation",)))
    result = blind["evaluation (one checkpoint)"]
    assert result.status == "NOT APPLICABLE", result
    assert "precision@1 0.1 for both" in result.note and "chance level" in result.note


def test_local_response_normalisation_without_its_divide_by_nine_fails_the_forward_checks(tmp_path, monkeypatch):
    """alpha = 0.001 where the tutorial has 0.001 / 9 (a port from the layer's description)."""
    monkeypatch.setattr(modern_train.LocalResponseNorm, "call", lambda self, inputs: tf.nn.local_response_normalization(
        inputs, self.depth_radius, self.bias, 0.001, self.beta))
    results = judged(tmp_path, dataclasses.replace(SETTINGS, only=("basics", "forward", "training", "steps")))
    assert {"forward (inference)", "forward (training, same dropout masks)",
            "gradients (read out of the train step)"} <= set(failed(results))
    assert results["lr schedule"].status == "PASS" and results["input pipelines"].status == "PASS"


@pytest.mark.parametrize("program", ["cifar10_multi_gpu_train.py", "modern_train.py"])
def test_each_program_trains_and_evaluates_on_the_embedded_data(tmp_path, program):
    from conftest import ROOT
    script = ROOT / "examples" / "cifar10_tutorial" / program
    common = ["--batch_size", "8", "--num_gpus", "2", "--train_dir", tmp_path / "train"]
    done = run_program([script, *common, "--max_steps", "3"], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "step 0, loss =" in done.stdout and "embedded synthetic set" in done.stdout
    evaluated = run_program([script, *common, "--eval"], cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    assert "precision @ 1 =" in evaluated.stdout


def test_missing_data_is_one_line_and_exit_2(tmp_path):
    from conftest import ROOT
    done = run_program([ROOT / "examples/cifar10_tutorial/cifar10_multi_gpu_train.py", "--data_dir", tmp_path / "none"],
                       cwd=tmp_path)
    assert done.returncode == 2 and "no such file" in done.stderr and "Traceback" not in done.stderr


def test_the_binary_format_round_trips_and_a_truncated_file_is_named(tmp_path):
    rng = np.random.RandomState(0)
    images, labels = rng.randint(0, 256, size=(5, 32, 32, 3)).astype(np.uint8), np.arange(5) % 10
    path = cifar10_input.write_binary(str(tmp_path / "data_batch_1.bin"), images, labels)
    assert os.path.getsize(path) == 5 * 3073 and cifar10_input.count_records([path]) == 5
    # depth-major on disk: the first pixel's red, green, blue bytes are 1024 apart
    raw = np.fromfile(path, np.uint8)
    assert raw[0] == labels[0] and raw[1] == images[0, 0, 0, 0] and raw[1 + 1024] == images[0, 0, 0, 1]
    read = [(np.asarray(x), int(y)) for x, y in tf.data.FixedLengthRecordDataset([path], 3073).map(
        cifar10_input.read_cifar10)]
    assert all(np.array_equal(x, images[i]) and y == labels[i] for i, (x, y) in enumerate(read))
    with open(path, "ab") as f:
        f.write(b"\0" * 10)
    with pytest.raises(cifar10_input.Cifar10BinaryError, match="not a whole number of 3073-byte"):
        cifar10_input.count_records([path])
