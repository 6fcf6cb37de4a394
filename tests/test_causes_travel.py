"""Causes that travel: on a pair written elsewhere than the seed pairs (tf1_programs/clip_smooth:
towers by tf.split, the averaged gradients clipped by their global norm, sparse labels one-hot and
smoothed, a weight decay in each tower's loss, Adam on a cosine decay with a floor; its Keras 3
port), each planted port mistake FAILs and its report names the cause with its value, found by
running the change on the original's graph (compare.counterfactuals) or by the schedule and
optimizer predictions (compare.causes); the correct port FAILs nothing at 1 to 3 towers.
"""
import json
import subprocess
import sys

import numpy as np
import pytest

from compare import harness
from compare.pairs.captured import program_pair
from conftest import ROOT

PAIR = ROOT / "tests" / "tf1_programs" / "clip_smooth"
LOOP = ("batch_size", "max_steps")
CHECKS = harness.Settings(towers=2, steps=2, free_steps=4, quick=False, only=("training", "steps"))
GRADIENTS = "gradients (read out of the train step)"
STEPS = "2 training steps: loss and gradients"

# name: (replacements in port.py, {check: (cause key, words its value is given in)})
PLANTS = {
    "regularisation x2": (
        [("L2(args.weight_decay / 2)", "L2(args.weight_decay)")],
        {GRADIENTS: ("regulariser_scale", "regularisation times 2 (the port's coefficients that many times"),
         STEPS: ("regulariser_scale", "regularisation times 2 (the port's coefficients that many times")}),
    "regularisation on every replica": (
        [("tf.nn.scale_regularization_loss(tf.add_n(model.losses))", "tf.add_n(model.losses)")],
        {GRADIENTS: ("regulariser_scale", "times 2 (its regularisation added once per replica, 2)"),
         STEPS: ("regulariser_scale", "times 2 (its regularisation added once per replica, 2)")}),
    "a per-replica mean": (
        [("tf.nn.compute_average_loss(per_row, global_batch_size=rows)", "tf.reduce_mean(per_row)")],
        {GRADIENTS: ("loss_scale", "data loss (its loss less its regularisation) 2 times the original's"),
         STEPS: ("loss_scale", "data loss (its loss less its regularisation) 2 times the original's")}),
    "smoothing 0": (
        [("label_smoothing=args.label_smoothing)", "label_smoothing=0.0)")],
        {GRADIENTS: ("label_smoothing", "its labels smoothed by 0 (its own 0.1)"),
         STEPS: ("label_smoothing", "its labels smoothed by 0 (its own 0.1)")}),
    "Keras' epsilon": (
        [("epsilon=1e-8)", "epsilon=1e-7)")],
        {"2 training steps: optimizers side by side": ("epsilon", "epsilon 1e-07 where the original's is 1e-08")}),
    "a decay without alpha": (
        [(", alpha=args.alpha)", ")")],
        {"lr schedule": ("cosine_alpha", "alpha=0.1, the original's floor")}),
    "the clip per replica": (
        [("return loss, tape.gradient(loss, variables)",
          "return loss, tf.clip_by_global_norm(tape.gradient(loss, variables), args.clip_norm)[0]"),
         ("clipped, _ = tf.clip_by_global_norm(total, args.clip_norm)", "clipped = total")],
        {GRADIENTS: ("clip_per_replica", "each of the 2 replicas' parts clipped by the original's own clip alone"),
         STEPS: ("clip_per_replica", "each of the 2 replicas' parts clipped by the original's own clip alone")}),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clip_smooth_data")
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, (96, 8, 8, 1)).astype(np.float32)
    labels = np.argmax(x.reshape(96, 64) @ rng.normal(size=(64, 10)), axis=1).astype(np.int32)
    np.savez(folder / "train.npz", images=x, labels=labels)
    return ["--data_dir", str(folder), "--batch_size", "16", "--max_steps", "3"]


def judged(modern, argv, tmp_path, settings):
    pair = program_pair(str(PAIR / "train_tf1.py"), str(modern), argv, loop=LOOP)
    return {r.check: r for r in harness.judge_pair(pair, settings, str(tmp_path / "judged"), log=lambda *_: None)}


def planted(tmp_path, replacements):
    text = (PAIR / "port.py").read_text()
    for old, new in replacements:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / "port.py"
    path.write_text(text)
    return path


def failing(results):
    return sorted(name for name, r in results.items() if r.status in ("FAIL", "ERROR"))


@pytest.mark.parametrize("towers", [1, 3])
def test_the_correct_port_fails_nothing_at_one_and_three_towers(tmp_path, data, towers):
    argv = [*data[:-3], str(8 * towers), *data[-2:]]
    settings = harness.Settings(towers=towers, steps=2, free_steps=4, quick=True)
    results = judged(PAIR / "port.py", argv, tmp_path, settings)
    assert failing(results) == [], [(n, results[n].note) for n in failing(results)]
    assert results[GRADIENTS].status == "PASS"


def test_the_correct_port_fails_no_check_at_two_towers(tmp_path, data):
    results = judged(PAIR / "port.py", data, tmp_path, harness.Settings(towers=2, steps=2, free_steps=4))
    assert failing(results) == [], [(n, results[n].note) for n in failing(results)]


@pytest.mark.parametrize("plant", list(PLANTS))
def test_each_planted_mistake_fails_naming_its_cause_and_value(tmp_path, data, plant):
    replacements, expected = PLANTS[plant]
    results = judged(planted(tmp_path, replacements), data, tmp_path, CHECKS)
    for check, (key, words) in expected.items():
        result = results[check]
        assert result.status == "FAIL", (check, result.status)
        cause = result.diagnosis.cause
        assert cause.startswith(f"likely cause [{key}]") or f": likely cause [{key}]" in cause, (check, cause)
        assert words in cause, (check, cause)


def test_a_mistake_no_entry_makes_says_what_each_entry_left(tmp_path, data):
    """The port scales what it applies after its clip: no change of the original's loss, labels or clip
    makes that (the clip takes any scale of the loss back out), and the report says what each tried."""
    port = planted(tmp_path, [("optimizer.apply_gradients(zip(clipped, variables))",
                               "optimizer.apply_gradients(zip([1.5 * g for g in clipped], variables))")])
    results = judged(port, data, tmp_path, harness.Settings(towers=2, steps=2, free_steps=4, only=("training",)))
    cause = results[GRADIENTS].diagnosis.cause
    assert cause.startswith("no known cause explains it (tried on the original's graph: "), cause
    for key in ("regulariser_scale at ", "loss_scale at ", "label_smoothing at ", "clip_per_replica ("):
        assert key in cause, cause
    assert "x its tolerance" in cause


def test_command_line_fails_the_ports_doubled_regulariser_and_names_it_on_the_originals_graph(tmp_path, data):
    """`compare/run.py --legacy ... --modern ...` on the port with its own L2 at twice the original's:
    exit 1, the training and step checks FAIL with the cause and its value, no traceback."""
    port = planted(tmp_path, PLANTS["regularisation x2"][0])
    report = tmp_path / "parity.json"
    done = subprocess.run([sys.executable, "compare/run.py", "--legacy", str(PAIR / "train_tf1.py"), "--modern",
                           str(port), "--quick", "--only", "training,steps", "--loop", "batch_size", "--loop",
                           "max_steps", "--report", str(report), "--", *data], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    results = {r["check"]: r for r in json.loads(report.read_text())["results"]}
    assert not [n for n, r in results.items() if r["status"] == "ERROR"]
    for check in (GRADIENTS, STEPS):
        result = results[check]
        assert result["status"] == "FAIL" and result["worst"]["rel_l2"] > 100 * result["tolerance_rel_l2"], check
        assert result["diagnosis"]["cause"].startswith("likely cause [regulariser_scale]"), result["diagnosis"]
        assert "regularisation times 2 (the port's coefficients that many times" in result["diagnosis"]["cause"]


def test_at_one_tower_the_counterfactuals_run_through_the_programs_own_clip(tmp_path, data):
    """One tower: its gradients are fed where they leave the backward pass, so the program's own clip
    makes what its update receives, and the doubled regularisation is named with its value on the
    original's graph (without that entry point the tower's gradient, unclipped, does not make the
    update, the graph's entries are refused and only the closed form on the port's values names it)."""
    argv = [*data[:-3], "8", *data[-2:]]
    settings = harness.Settings(towers=1, steps=2, free_steps=4, quick=False, only=("training",))
    results = judged(planted(tmp_path, PLANTS["regularisation x2"][0]), argv, tmp_path, settings)
    cause = results[GRADIENTS].diagnosis.cause
    assert results[GRADIENTS].status == "FAIL" and cause.startswith("likely cause [regulariser_scale]"), cause
    assert "regularisation times 2 (the port's coefficients that many times" in cause, cause
