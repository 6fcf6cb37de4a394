"""The MNIST parity harness passes on the real programs and FAILS, in the right check, on planted defects.

Each defect is planted on the modern side only (the legacy program is the reference), by swapping
one modern function for a broken twin for the length of one harness run.
"""
import numpy as np
import pytest
import tensorflow as tf
import keras

from modern import mnist as modern_mnist
from modern.runtime import DeviceSetupError, configure_devices

try:  # before TensorFlow's runtime starts: pytest imports every test module first
    configure_devices(2)
except DeviceSetupError:
    pass

from compare import mnist as compare_mnist  # noqa: E402

STEPS = 6


def run_harness(tmp_path, **overrides):
    cfg = compare_mnist.default_config(steps=STEPS)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    results = compare_mnist.run(2, STEPS, tmp_dir=str(tmp_path), cfg=cfg, log=lambda *_: None)
    return {r.check: r for r in results}


def failed(results):
    return sorted(name for name, r in results.items() if r.status == "FAIL")


def test_harness_passes_on_the_real_programs(tmp_path):
    results = run_harness(tmp_path)
    assert failed(results) == []
    assert {"variables", "forward (inference)", "forward (training)", "gradients", "lr schedule",
            f"{STEPS} training steps", "checkpoint round trip", "same batch: gradients"} <= set(results)
    # Not vacuous: every error-bounded check compared tensors, and the steps check saw the losses move.
    assert len(results["gradients"].errors) == 4
    losses = results[f"{STEPS} training steps"].extra["losses"]["legacy"]
    assert len(losses) == STEPS and len(set(np.round(losses, 6))) > 1


def test_l2_without_its_half_fails_forward_and_gradients(tmp_path, monkeypatch):
    real = modern_mnist.build_model
    # keras.regularizers.L2(rate) alone: twice the legacy scale * sum(w**2) / 2
    monkeypatch.setattr(modern_mnist, "build_model", lambda rate=0.0001: real(2 * rate))
    results = run_harness(tmp_path)
    assert {"forward (training)", "gradients"} <= set(failed(results))
    assert results["forward (inference)"].status == "PASS"  # logits do not see the regulariser


def test_moving_average_without_warm_up_fails_the_steps_check(tmp_path):
    def no_warm_up(model, optimizer, decay=0.99):
        ema = tf.train.ExponentialMovingAverage(decay)  # no num_updates: constant 0.99
        ema.apply([v.value for v in model.trainable_variables])
        return ema, {modern_mnist.legacy_name(v): ema.average(v.value) for v in model.trainable_variables}

    results = run_harness(tmp_path, make_moving_average=no_warm_up)
    assert failed(results) == [f"{STEPS} training steps"]
    worst = results[f"{STEPS} training steps"].worst
    assert "ExponentialMovingAverage" in worst.name


def test_gradients_scaled_by_1_001_fail_the_gradient_check(tmp_path, monkeypatch):
    real = modern_mnist.compute_replica_loss

    def scaled(*args, **kwargs):
        loss = real(*args, **kwargs)
        return loss + 0.001 * (loss - tf.stop_gradient(loss))  # same value, gradient x 1.001

    monkeypatch.setattr(modern_mnist, "compute_replica_loss", scaled)
    results = run_harness(tmp_path)
    assert "gradients" in failed(results)
    assert results["forward (training)"].status == "PASS"
    assert 5e-4 < results["gradients"].worst.rel_l2 < 2e-3


def test_learning_rate_decay_period_off_by_one_fails_the_lr_check(tmp_path):
    def off_by_one(base, decay_steps, decay):
        return modern_mnist.make_optimizer(base, decay_steps + 1, decay)

    results = run_harness(tmp_path, make_optimizer=off_by_one)
    assert "lr schedule" in failed(results)


def test_command_line_writes_table_report_and_plot(tmp_path):
    from conftest import run_program
    import json
    report, plot = tmp_path / "parity.json", tmp_path / "parity.png"
    done = run_program(["compare/run.py", "--model", "mnist", "--steps", "3",
                        "--report", report, "--plot", plot])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 FAIL" in done.stdout and "Tolerances" in done.stdout
    data = json.loads(report.read_text())
    assert {r["status"] for r in data["results"]} == {"PASS"} and len(data["results"]) == 9
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_command_line_rejects_a_missing_checkpoint(tmp_path):
    from conftest import run_program
    done = run_program(["compare/run.py", "--checkpoint", tmp_path / "nothing.ckpt"])
    assert done.returncode == 2
    assert "no TF1 checkpoint there" in done.stderr
