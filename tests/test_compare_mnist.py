"""The MNIST parity harness passes on the real programs and FAILS, in the right check, on planted defects.

Each defect is planted on the modern side only (the legacy program is the reference), by swapping
one modern function for a broken twin for the length of one harness run.
"""
import numpy as np
import tensorflow as tf

from modern import mnist_multi_gpu as modern_mnist
from modern.runtime import DeviceSetupError, configure_devices

try:  # before TensorFlow's runtime starts: pytest imports every test module first
    configure_devices(2)
except DeviceSetupError:
    pass

from compare import mnist as compare_mnist  # noqa: E402

STEPS = 6


def run_harness(tmp_path):
    results = compare_mnist.run(2, STEPS, tmp_dir=str(tmp_path), log=lambda *_: None)
    return {r.check: r for r in results}


def failed(results):
    return sorted(name for name, r in results.items() if r.status == "FAIL")


def test_harness_passes_on_the_real_programs(tmp_path):
    results = run_harness(tmp_path)
    assert failed(results) == []
    assert {name for name, r in results.items() if r.status == "EXPECTED"} == {"original: moving average (unordered)"}
    assert {"configuration (parsed defaults)", "input pipelines (get_input)", "variables", "lr schedule",
            "checkpoint round trip", "original: gradients of every step", f"original: {STEPS} free-running steps",
            "deviation: gradients of every step", f"deviation: {STEPS} free-running steps",
            "deviation: moving averages", "evaluation (mnist_eval vs evaluate_averaged)"} <= set(results)
    # Not vacuous: 4 gradients a step, the losses moved, and the unordered average was seen.
    assert len(results["deviation: gradients of every step"].errors) == 4 * STEPS
    losses = results[f"deviation: {STEPS} free-running steps"].extra["losses"]["legacy"]
    assert len(losses) == STEPS and len(set(np.round(losses, 6))) > 1


def test_l2_without_its_half_fails_the_gradients(tmp_path, monkeypatch):
    real = modern_mnist.build_model
    # keras.regularizers.L2(rate) alone: twice the legacy scale * sum(w**2) / 2
    monkeypatch.setattr(modern_mnist, "build_model", lambda rate=0.0001: real(2 * rate))
    results = run_harness(tmp_path)
    assert "deviation: gradients of every step" in failed(results)
    assert results["lr schedule"].status == "PASS"


def test_legacy_l2_rate_doubled_fails_the_free_running_checks(tmp_path, monkeypatch):
    """The regulariser-scale trap on the TF1 side: the legacy program's own `build_train_graph`
    building its l2 regulariser from twice the rate (planted in `mnist_inference.l2_regularizer`,
    which it calls).  The losses hold the l2 term itself: both pairings' free-running checks fail
    (measured: 6.3e-4 and 7.2e-4 against 1.2e-4); the lr schedule and the inputs still pass."""
    from legacy import mnist_inference
    real = mnist_inference.l2_regularizer
    monkeypatch.setattr(mnist_inference, "l2_regularizer", lambda scale: real(2 * scale))
    results = run_harness(tmp_path)
    assert {f"original: {STEPS} free-running steps", f"deviation: {STEPS} free-running steps"} <= set(failed(results))
    assert results["lr schedule"].status == "PASS"
    assert results["input pipelines (get_input)"].status == "PASS"


def test_moving_average_without_warm_up_fails_the_moving_average_checks(tmp_path, monkeypatch):
    def no_warm_up(model, optimizer, decay=0.99):
        ema = tf.train.ExponentialMovingAverage(decay)  # no num_updates: constant 0.99
        ema.apply([v.value for v in model.trainable_variables])
        return ema, {modern_mnist.legacy_name(v): ema.average(v.value) for v in model.trainable_variables}

    monkeypatch.setattr(modern_mnist, "make_moving_average", no_warm_up)
    results = run_harness(tmp_path)
    assert failed(results) == ["deviation: moving averages", "original: moving average (unordered)"]


def test_moving_average_decay_of_the_wrong_flag_fails_past_the_warm_up(tmp_path, monkeypatch):
    # The decay itself (0.99) only shows past the warm-up min(d, (1 + n) / (10 + n)).
    real = modern_mnist.make_moving_average
    monkeypatch.setattr(modern_mnist, "make_moving_average",
                        lambda model, optimizer, decay=0.99: real(model, optimizer, 0.999))
    results = run_harness(tmp_path)
    assert "deviation: moving averages" in failed(results)
    tolerance = results["deviation: moving averages"].as_dict()["tolerance_rel_l2"]
    step_errors = {}
    for e in results["deviation: moving averages"].errors:
        if e.name.startswith("step ") and "modern" in e.name:
            k = int(e.name.split(":")[0].split()[1])
            step_errors[k] = max(step_errors.get(k, 0.0), e.rel_l2)
    assert all(step_errors[k] <= tolerance for k in range(STEPS // 2))   # warm-up: the decay is masked
    assert any(step_errors[k] > tolerance for k in range(STEPS // 2, STEPS))  # from step 5000 on it shows


def test_gradients_scaled_by_1_001_fail_the_gradient_check(tmp_path, monkeypatch):
    real = modern_mnist.compute_replica_loss

    def scaled(*args, **kwargs):
        loss = real(*args, **kwargs)
        return loss + 0.001 * (loss - tf.stop_gradient(loss))  # same value, gradient x 1.001

    monkeypatch.setattr(modern_mnist, "compute_replica_loss", scaled)
    results = run_harness(tmp_path)
    assert "deviation: gradients of every step" in failed(results)
    first = max(e.rel_l2 for e in results["deviation: gradients of every step"].errors if e.name.startswith("step 0:"))
    assert 5e-4 < first < 2e-3  # from the same weights: the 1.001 itself


def test_learning_rate_decay_period_off_by_one_fails_the_lr_check(tmp_path, monkeypatch):
    real = modern_mnist.make_optimizer
    monkeypatch.setattr(modern_mnist, "make_optimizer",
                        lambda base, decay_steps, decay: real(base, decay_steps + 1, decay))
    results = run_harness(tmp_path)
    assert "lr schedule" in failed(results)


def test_command_line_writes_table_report_and_plot(tmp_path):
    from conftest import run_program
    import json
    report, plot = tmp_path / "parity.json", tmp_path / "parity.png"
    done = run_program(["compare/run.py", "--model", "mnist", "--towers", "3", "--steps", "4",
                        "--report", report, "--plot", plot])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 FAIL" in done.stdout and "Tolerances" in done.stdout
    data = json.loads(report.read_text())
    assert {r["status"] for r in data["results"]} == {"PASS", "EXPECTED"} and len(data["results"]) == 12
    from compare import report as report_module  # what `run.py --model all` reads back from its MNIST process
    back = report_module.read_json(report)
    assert [(r.check, r.status, len(r.errors)) for r in back] == [
        (r["check"], r["status"], r["num_tensors"]) for r in data["results"]]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_model_process_that_dies_is_a_fail_not_a_pass(tmp_path, capsys):
    import sys
    from compare import run
    child = run.spawn("mnist", [sys.executable, "-c", "print('[   0.1s] mnist: starting'); raise SystemExit(3)"],
                      str(tmp_path / "never_written.json"))
    results = run.finish_model_process(*child)
    assert [(r.model, r.status) for r in results] == [("mnist", "FAIL")]
    assert "exited 3 without a report" in results[0].note
    assert "[   0.1s] mnist: starting" in capsys.readouterr().out


def test_command_line_rejects_a_missing_checkpoint(tmp_path):
    from conftest import run_program
    done = run_program(["compare/run.py", "--checkpoint", tmp_path / "nothing.ckpt"])
    assert done.returncode == 2
    assert "no TF1 checkpoint there" in done.stderr


def test_command_line_exits_1_on_a_planted_defect(monkeypatch, capsys):
    from compare import run
    real = modern_mnist.make_optimizer
    monkeypatch.setattr(modern_mnist, "make_optimizer",
                        lambda base, decay_steps, decay: real(base * 1.01, decay_steps, decay))
    assert run.main(["--model", "mnist", "--steps", "2"]) == 1
    assert "lr schedule" in capsys.readouterr().out
