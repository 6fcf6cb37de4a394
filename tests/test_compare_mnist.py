"""The parity harness on the MNIST pair passes on the real programs and FAILS, in the right check, on
planted defects, and its command line behaves as documented.

Each defect is planted in a program's own code (a module function the adapter calls), for the length
of one harness run (both pairings, 4 free-running and moving-average steps: a few seconds).
"""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from modern import mnist_multi_gpu as modern_mnist


from compare import harness
from compare.pairs import mnist_multi_gpu as mnist_pair
from records import mnist as mnist_records

STEPS = 4
SETTINGS = harness.Settings(towers=2, steps=2, free_steps=STEPS, quick=True)


def run_harness(tmp_path, settings=SETTINGS):
    results = harness.judge_pair(mnist_pair.PAIR, settings, str(tmp_path), log=lambda *_: None)
    return {r.check: r for r in results}


def failed(results):
    return sorted(name for name, r in results.items() if r.status == "FAIL")


def test_harness_passes_on_the_real_programs(tmp_path):
    results = run_harness(tmp_path)
    assert failed(results) == []
    assert {name for name, r in results.items() if r.status == "EXPECTED"} == {
        "original: moving average (unordered)", "deviation: split: short last batch, towers weighted equally",
        "deviation: split: uneven batch, towers weighted equally", "deviation: split: fewer rows than towers"}
    for label in ("original", "deviation"):
        assert {f"{label}: configuration (flags and what they build)", f"{label}: input pipelines",
                f"{label}: variables", f"{label}: lr schedule", f"{label}: checkpoint round trip",
                f"{label}: gradients (read out of the train step)", f"{label}: 2 training steps: loss and gradients",
                f"{label}: {STEPS} free-running steps (chaos floor)",
                f"{label}: evaluation (one checkpoint)"} <= set(results)
    assert results["deviation: moving averages"].status == "PASS"
    # Not vacuous: 4 gradients, both regimes of the moving average, the losses moved.
    assert len(results["deviation: gradients (read out of the train step)"].errors) == 4
    assert "step 900" in results["deviation: moving averages"].note  # past the warm-up, found from the graph
    losses = results[f"deviation: {STEPS} free-running steps (chaos floor)"].extra["losses"]["legacy"]
    assert len(losses) == STEPS and len(set(np.round(losses, 6))) > 1
    # MNIST is not chaotic: its free-running losses are judged too.
    assert "not chaotic" in results[f"deviation: {STEPS} free-running steps (chaos floor)"].note


def test_l2_without_its_half_fails_the_gradients(tmp_path, monkeypatch):
    real = modern_mnist.build_model
    # keras.regularizers.L2(rate) alone: twice the legacy scale * sum(w**2) / 2
    monkeypatch.setattr(modern_mnist, "build_model", lambda rate=0.0001: real(2 * rate))
    results = run_harness(tmp_path, dataclasses.replace(SETTINGS, only=("training", "steps")))
    assert "deviation: gradients (read out of the train step)" in failed(results)
    assert results["deviation: lr schedule"].status == "PASS"
    # Where and why: the first layer whose gradient parts (from the loss backwards), and the entry.
    found = results["deviation: gradients (read out of the train step)"].diagnosis
    assert found.where.startswith("first at layer layer1 (layer1/weights), from the loss backwards"), found.where
    assert found.cause.startswith("likely cause [regulariser_scale]: the port's L2 coefficients 0.0001 against "
                                  "5e-05"), found.cause
    loss = results["deviation: forward (training, same dropout masks)"].diagnosis
    assert loss.where.startswith("every one of 2 paired layers agrees") and "[regulariser_scale]" in loss.cause


def test_legacy_l2_rate_doubled_fails_the_training_checks(tmp_path, monkeypatch):
    """The regulariser-scale trap on the TF1 side: the legacy program's own `build_train_graph`
    building its l2 regulariser from twice the rate (planted in `mnist_inference.l2_regularizer`,
    which it calls).  Both pairings' gradient and free-running checks fail (the losses hold the l2
    term itself); the lr schedule and the inputs still pass."""
    from legacy import mnist_inference
    real = mnist_inference.l2_regularizer
    monkeypatch.setattr(mnist_inference, "l2_regularizer", lambda scale: real(2 * scale))
    results = run_harness(tmp_path, dataclasses.replace(SETTINGS, only=("basics", "training", "steps", "free")))
    for label in ("original", "deviation"):
        assert {f"{label}: {STEPS} free-running steps (chaos floor)",
                f"{label}: gradients (read out of the train step)"} <= set(failed(results))
        assert results[f"{label}: lr schedule"].status == "PASS"
        assert results[f"{label}: input pipelines"].status == "PASS"
        for check in ("gradients (read out of the train step)", f"{STEPS} free-running steps (chaos floor)"):
            cause = results[f"{label}: {check}"].diagnosis.cause
            assert cause.startswith("likely cause [regulariser_scale]: the port's L2 coefficients 5e-05 against "
                                    "0.0001"), cause
    # The free-running steps: the port's updates follow the original's rule, so their first step's
    # gradients are tried on the original's graph.
    assert "its first free step's loss and gradients, on the original's graph" in cause


def test_moving_average_without_warm_up_fails_the_moving_average_checks(tmp_path, monkeypatch):
    def no_warm_up(model, optimizer, decay=0.99):
        ema = tf.train.ExponentialMovingAverage(decay)  # no num_updates: constant 0.99
        ema.apply([v.value for v in model.trainable_variables])
        return ema, {modern_mnist.legacy_name(v): ema.average(v.value) for v in model.trainable_variables}

    monkeypatch.setattr(modern_mnist, "make_moving_average", no_warm_up)
    results = run_harness(tmp_path)
    assert failed(results) == ["deviation: moving averages", "original: moving average (unordered)"]
    for check in failed(results):
        assert results[check].diagnosis.cause.startswith("likely cause [ema_warmup]: the port averages at the final "
                                                         "decay from the first step"), results[check].diagnosis


def test_moving_average_decay_of_the_wrong_flag_fails_past_the_warm_up(tmp_path, monkeypatch):
    # The decay itself (0.99) only shows past the warm-up min(d, (1 + n) / (10 + n)).
    real = modern_mnist.make_moving_average
    monkeypatch.setattr(modern_mnist, "make_moving_average",
                        lambda model, optimizer, decay=0.99: real(model, optimizer, 0.999))
    results = run_harness(tmp_path, dataclasses.replace(SETTINGS, only=("averages",)))
    assert "deviation: moving averages" in failed(results)
    tolerance = results["deviation: moving averages"].tolerance.rel_l2
    step_errors = {}
    for e in results["deviation: moving averages"].errors:
        if "modern" in e.name:
            k = int(e.name.split(":")[0].split()[1])
            step_errors[k] = max(step_errors.get(k, 0.0), e.rel_l2)
    assert all(step_errors[k] <= tolerance for k in range(STEPS // 2))   # warm-up: the decay is masked
    assert any(step_errors[k] > tolerance for k in range(STEPS // 2, STEPS))  # from step 900 on it shows
    # Named on the original's graph: its decay tensor, warm-up and all, with its decay constant fed the
    # decay the port's last update took.  At those steps the port's own warm-up governs its 0.999: the
    # line gives the decay as a floor.
    cause = results["deviation: moving averages"].diagnosis.cause
    assert cause.startswith("likely cause [ema_decay]: the port averages with a decay of 0.99013") and \
        "or more (at step" in cause and "where the original's is 0.99: the original's decay tensor with its " \
        "constant ExponentialMovingAverage/decay fed 0.99013" in cause, cause


def test_gradients_scaled_by_1_001_fail_the_gradient_check(tmp_path, monkeypatch):
    real = modern_mnist.compute_replica_loss

    def scaled(*args, **kwargs):
        loss = real(*args, **kwargs)
        return loss + 0.001 * (loss - tf.stop_gradient(loss))  # same value, gradient x 1.001

    monkeypatch.setattr(modern_mnist, "compute_replica_loss", scaled)
    results = run_harness(tmp_path, dataclasses.replace(SETTINGS, only=("training",)))
    gradients = results["deviation: gradients (read out of the train step)"]
    assert gradients.status == "FAIL" and 5e-4 < gradients.worst.rel_l2 < 2e-3  # the 1.001 itself
    assert results["deviation: forward (training, same dropout masks)"].status == "PASS"


def test_learning_rate_decay_period_off_by_one_fails_the_lr_check(tmp_path, monkeypatch):
    real = modern_mnist.make_optimizer
    monkeypatch.setattr(modern_mnist, "make_optimizer",
                        lambda base, decay_steps, decay: real(base, decay_steps + 1, decay))
    results = run_harness(tmp_path, dataclasses.replace(SETTINGS, only=("steps",)))
    assert {"original: lr schedule", "deviation: lr schedule"} <= set(failed(results))
    # Named on the original's graph: its decay period's constant fed 3751, found by the search.
    for pairing in ("original", "deviation"):
        cause = results[f"{pairing}: lr schedule"].diagnosis.cause
        assert cause.startswith("likely cause [schedule_constant]: the original's schedule with its constant "
                                "ExponentialDecay/Cast/x (3750) at 3751 gives the port's rate"), cause


def test_a_stepped_decay_where_the_original_decays_continuously_fails_the_rate_checks_and_is_named(tmp_path,
                                                                                                    monkeypatch):
    real = modern_mnist.make_optimizer

    def stepped(base, decay_steps, decay):
        optimizer = real(base, decay_steps, decay)
        optimizer._learning_rate.staircase = True
        return optimizer
    monkeypatch.setattr(modern_mnist, "make_optimizer", stepped)
    results = run_harness(tmp_path, dataclasses.replace(SETTINGS, only=("steps",)))
    for pairing in ("original", "deviation"):
        result = results[f"{pairing}: lr schedule"]
        assert result.status == "FAIL" and result.diagnosis.cause.startswith(
            "likely cause [staircase]: the port's schedule with staircase=False"), result.diagnosis


def test_command_line_writes_table_report_and_plot(tmp_path):
    from conftest import run_program
    import json
    report, plot = tmp_path / "parity.json", tmp_path / "parity.png"
    done = run_program(["compare/run.py", "--model", "mnist", "--towers", "3", "--quick",
                        "--only", "basics,forward,splits", "--report", report, "--plot", plot])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 FAIL" in done.stdout and "Tolerances" in done.stdout and "derived" in done.stdout
    data = json.loads(report.read_text())
    statuses = {r["status"] for r in data["results"]}
    assert statuses == {"PASS", "EXPECTED", "NOT APPLICABLE"}
    assert all(r["status"] != "NOT APPLICABLE" or r["note"] for r in data["results"])  # a reason, always
    from compare import report as report_module  # what `run.py --model all` reads back from its MNIST process
    back = report_module.read_json(report)
    assert [(r.check, r.status, len(r.errors), r.tolerance.rel_l2) for r in back] == [
        (r["check"], r["status"], r["num_tensors"], r["tolerance_rel_l2"]) for r in data["results"]]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_pair_process_that_dies_is_a_fail_not_a_pass(tmp_path, capsys):
    import sys
    from compare import run
    child = run.spawn("mnist", [sys.executable, "-c", "print('[   0.1s] mnist: starting'); raise SystemExit(3)"],
                      str(tmp_path / "never_written.json"))
    results = run.finish_child(child)
    assert [(r.model, r.status) for r in results] == [("mnist", "FAIL")]
    assert "exited 3 without a report" in results[0].note
    assert "[   0.1s] mnist: starting" in capsys.readouterr().out


def test_a_pair_process_runs_at_the_lowest_priority_where_the_first_pair_starts_no_process(tmp_path, capsys,
                                                                                           monkeypatch):
    """A pair judged beside the first takes the cores the first leaves idle: with --quick (no flags
    or TF1-runtime process), its process runs CHILD_NICENESS nicer (its threads too, started after it
    is reniced); where those checks run, at this process's priority."""
    import os
    import sys
    from compare import harness, run
    read = ("import os, threading, time; time.sleep(0.5); out = []; "
            "t = threading.Thread(target=lambda: out.append(os.getpriority(os.PRIO_PROCESS, 0))); t.start(); t.join(); "
            "print('[   0.5s] priority', os.getpriority(os.PRIO_PROCESS, 0), out[0])")
    monkeypatch.setattr(run, "child_argv", lambda *_: [sys.executable, "-c", read])
    monkeypatch.setattr(harness, "judge_pair", lambda *_, **__: [])  # the first pair: nothing judged
    own = os.getpriority(os.PRIO_PROCESS, 0)
    for argv, expected in ((["--quick"], min(19, own + 19)), (["--only", "basics,shuffle"], min(19, own + 19)),
                           ([], own), (["--only", "basics,tf1"], own)):
        run.main(["--model", "all", *argv])
        assert f"[   0.5s] priority {expected} {expected}" in capsys.readouterr().out, argv


def test_command_line_rejects_what_is_not_a_checkpoint(tmp_path):
    from conftest import run_program
    done = run_program(["compare/run.py", "--checkpoint", tmp_path / "nothing.ckpt"])
    assert done.returncode == 2 and "no TF1 checkpoint there" in done.stderr
    (tmp_path / "bad.ckpt.index").write_bytes(b"not a checkpoint")
    done = run_program(["compare/run.py", "--model", "mnist", "--checkpoint", tmp_path / "bad.ckpt"])
    assert done.returncode == 2 and "not a readable TF1 checkpoint" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_command_line_exits_1_on_a_planted_defect(monkeypatch, capsys):
    from compare import run
    real = modern_mnist.make_optimizer
    monkeypatch.setattr(modern_mnist, "make_optimizer",
                        lambda base, decay_steps, decay: real(base * 1.01, decay_steps, decay))
    assert run.main(["--model", "mnist", "--quick", "--free_steps", "2", "--only", "steps"]) == 1
    out = capsys.readouterr().out
    assert "lr schedule" in out
    # The base rate's constant found at 1.01 times its value on the original's graph.
    assert ("likely cause [schedule_constant]: the original's schedule with its constant "
            "ExponentialDecay/initial_learning_rate (0.001) at 0.00101 gives the port's rate") in out
    assert "[schedule_offset]" not in out  # one step at 0 shows no offset


def test_command_line_fails_a_port_whose_replicas_average_their_own_rows(monkeypatch, tmp_path):
    """The port's loss divided by each replica's own rows, not the global batch's (the classic
    MirroredStrategy mistake: the strategy SUMS the replicas' gradients, so they come out N times
    too large).  Planted in the port's own `compute_replica_loss`, before the build: the step the
    harness traces ahead (ModernBuild.trace, in its own thread) is the planted one.  The loss and the
    gradients FAIL, at the start and after steps; the optimizer, given the same gradients, PASSes."""
    import json
    from compare import run
    own = modern_mnist.compute_replica_loss

    def local_rows(model, x, labels, global_batch_size, training=True):
        return own(model, x, labels, tf.shape(labels)[0], training)
    monkeypatch.setattr(modern_mnist, "compute_replica_loss", local_rows)
    path = tmp_path / "parity.json"
    assert run.main(["--model", "mnist", "--quick", "--only", "training,steps", "--report", str(path)]) == 1
    status = {r["check"]: r["status"] for r in json.loads(path.read_text())["results"]}
    for pairing in ("original", "deviation"):
        for check in ("forward (training, same dropout masks)", "gradients (read out of the train step)",
                      "2 training steps: loss and gradients"):
            assert status[f"{pairing}: {check}"] == "FAIL", check
        for check in ("2 training steps: optimizer on each side", "2 training steps: optimizers side by side"):
            assert status[f"{pairing}: {check}"] == "PASS", check


# ---------------------------------------------------------------------------------------------
# The blind spots of a harness that starts from initial values with shuffling off and flags at defaults

def shuffled_get_input(buffer_size=10000, reshuffle=True, after_batching=False):
    """modern/mnist_multi_gpu.get_input with one realistic shuffle mistake planted."""
    def get_input(data_path, batch_size, num_replicas, same_batch_per_replica=False, skip_batches=0,
                  shuffle_seed=None):
        dataset = tf.data.TFRecordDataset([data_path])
        if not after_batching:
            dataset = dataset.shuffle(buffer_size, seed=shuffle_seed, reshuffle_each_iteration=reshuffle)
        dataset = dataset.repeat(10)
        dataset = dataset.batch(batch_size if same_batch_per_replica else batch_size * num_replicas)
        if after_batching:
            dataset = dataset.shuffle(buffer_size // batch_size, seed=shuffle_seed)
        dataset = dataset.map(mnist_records.parse_batch)
        if same_batch_per_replica:
            dataset = dataset.map(lambda x, y: modern_mnist.same_batch_on_every_replica(x, y, num_replicas))
        return dataset.skip(skip_batches).prefetch(2)
    return get_input


@pytest.mark.parametrize("mistake, planted", [
    ("a buffer ten times smaller", dict(buffer_size=1000)),
    ("no reshuffle between epochs", dict(reshuffle=False)),
    ("the shuffle after batching", dict(after_batching=True)),
])
def test_a_shuffle_mistake_fails_the_shuffled_pipeline_check(tmp_path, monkeypatch, mistake, planted):
    monkeypatch.setattr(modern_mnist, "get_input", shuffled_get_input(**planted))
    results = run_harness(tmp_path, dataclasses.replace(SETTINGS, only=("shuffle",)))
    assert failed(results) == ["deviation: shuffled pipelines (two epochs)",
                               "original: shuffled pipelines (two epochs)"]
    # The same pipeline with the shuffle switched off is still row for row the legacy one.
    results = run_harness(tmp_path / "basics", dataclasses.replace(SETTINGS, only=("basics",)))
    assert results["deviation: input pipelines"].status == "PASS"


def test_a_flag_parsed_but_built_from_a_constant_fails_the_flags_check(tmp_path, monkeypatch):
    """The port parses --moving_average_decay but averages with the constant 0.99: at the default the
    two agree, so only a non-default value shows it."""
    real = modern_mnist.make_moving_average
    monkeypatch.setattr(modern_mnist, "make_moving_average",
                        lambda model, optimizer, decay=0.99: real(model, optimizer))
    results = run_harness(tmp_path, dataclasses.replace(SETTINGS, quick=False, only=("flags",)))
    assert failed(results) == ["deviation: flags through what they build", "original: flags through what they build"]
    worst = results["deviation: flags through what they build"].worst.name
    assert worst == "--moving_average_decay 0.9: changes nothing the modern program builds or steps"


def test_a_port_that_also_regularises_the_biases_fails_by_structure(tmp_path, monkeypatch):
    """1e-4 of a bias that is ~1e-2 moves every gradient by less than its tolerance, from the start and
    from a trained state alike; read off each side's structure, the extra regulariser is exact."""
    import keras
    real = modern_mnist.build_model

    def with_bias_decay(rate=0.0001):
        model = real(rate)
        for layer in model.layers:
            layer.bias.regularizer = keras.regularizers.L2(rate / 2)
        return model

    monkeypatch.setattr(modern_mnist, "build_model", with_bias_decay)
    results = run_harness(tmp_path, dataclasses.replace(SETTINGS, only=("structure", "training")))
    assert failed(results) == ["deviation: structure (regularised, averaged, trained)",
                               "original: structure (regularised, averaged, trained)"]
    structure = results["deviation: structure (regularised, averaged, trained)"]
    names = {e.name for e in structure.errors if e.rel_l2 > structure.tolerance.rel_l2}
    assert names == {"layer1/biases regularised by the port only", "layer2/biases regularised by the port only"}
    assert structure.diagnosis.cause.startswith(
        "likely cause [port_regulariser]: the port regularises 2 variables the original leaves alone (layer1/biases, "
        "layer2/biases): with those regularisers as the original has them: the difference then vanishes"), \
        structure.diagnosis.cause


def test_the_permutation_test_allows_the_towers_order_within_the_step_that_ends_the_epoch():
    """Legacy towers that dequeue one pipeline in one session run take its batches in an order TF1
    does not fix.  Where the epoch ends inside such a run (22000 rows, 3 towers of 100), a correct
    shuffle's first epoch is still a permutation to within that run; a shuffle after repeat (rows of
    the second epoch drawn long before the first has ended) is not."""
    from compare.checks.shuffle import statistics
    rows, run = 22000, 300
    rng = np.random.RandomState(0)
    index = {str(i).encode(): i for i in range(rows)}
    correct = np.concatenate([rng.permutation(rows), rng.permutation(rows), rng.permutation(rows)])
    swapped = correct.copy()  # the towers of the run holding the epoch's end, in another order
    end = rows - rows % run
    swapped[end:end + run] = np.roll(swapped[end:end + run], 200)
    stream = [str(i).encode() for i in swapped]
    assert not statistics(stream, index, rows).permutation  # row for row, it is not one
    assert statistics(stream, index, rows, unordered=run).permutation
    buffer, order = list(range(20000)), []  # tf.data's shuffle(20000) after repeat()
    upstream = iter(np.concatenate([np.arange(rows)] * 3)[20000:])
    while len(order) < 2 * rows:
        i = rng.randint(len(buffer))
        order.append(buffer[i])
        buffer[i] = next(upstream)
    assert not statistics([str(i).encode() for i in order], index, rows, unordered=run).permutation
