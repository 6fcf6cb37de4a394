"""examples/estimator_towers: a tf.estimator program judged as it runs, in its three multi-GPU forms.

The TF1 program trains through Estimator.train (MirroredStrategy replicas, replicate_model_fn towers,
towers by hand inside the model_fn); the judge stops it inside the Estimator's session, finds the
replicas or towers, their rows and how their gradients join, takes its model_fn in EVAL mode as its
inference graph, and evaluates a checkpoint with the program's own Estimator.evaluate.  The correct
port is green at a tolerance with power; three port mistakes planted in its own code FAIL and are named.
"""
import json
import os
import subprocess
import sys

from compare import harness, tolerances
from conftest import ROOT
from examples.estimator_towers import adapter, modern_train
from modern.resnet_v2 import SlimBatchNorm

SETTINGS = harness.Settings(towers=2, steps=2, free_steps=4, quick=True)


def judged(tmp_path, **settings):
    settings = {**SETTINGS.__dict__, **settings}
    return {r.check: r for r in harness.judge_pair(adapter.PAIR, harness.Settings(**settings), str(tmp_path),
                                                   log=lambda *_: None)}


def failed(results):
    return sorted(name for name, r in results.items() if r.status in ("FAIL", "ERROR"))


def test_the_correct_port_passes_every_form_at_a_tolerance_with_power(tmp_path):
    results = judged(tmp_path)
    assert failed(results) == []
    for form in ("mirrored", "replicate", "towers"):
        passed = {name.split(": ", 1)[1] for name, r in results.items()
                  if name.startswith(f"{form}: ") and r.status == "PASS"}
        assert {"structure (regularised, averaged, trained)", "input pipelines", "forward (inference)",
                "forward (training, same dropout masks)", "gradients (read out of the train step)", "lr schedule",
                "2 training steps: optimizers side by side", "evaluation (one checkpoint)",
                "4 free-running steps (chaos floor)"} <= passed, form
        model = results[f"{form}: forward (training, same dropout masks)"].tolerance.rel_l2
        assert model <= tolerances.POWER_BOUND.rel_l2 / 100, (form, model)
    # A MirroredStrategy's replica-local batch-norm statistics: predicted as the copies' mean, on both sides.
    assert results["mirrored: bn moving statistics"].status == "PASS"
    assert "replica-local statistics" in results["mirrored: bn moving statistics"].note
    # replicate_model_fn's towers share one set of statistics, each moving it: the known difference.
    assert results["replicate: bn moving statistics"].status == "EXPECTED"
    # The evaluation is the program's own: replicate_model_fn's EVAL loss is its towers' sum.
    assert "loss legacy" in results["replicate: evaluation (one checkpoint)"].note


def test_the_mirrored_replicas_run_on_virtual_cpu_devices_and_the_towers_join_as_the_program_joins_them(tmp_path):
    files = adapter.Data().write(str(tmp_path / "data"), 2, 0)
    files["scratch"] = str(tmp_path / "scratch")
    os.makedirs(files["scratch"])
    legacy = adapter.PAIR.legacy
    for form, weights in (("mirrored", 1.0), ("replicate", 1.0), ("towers", 0.5)):
        flags = legacy.parse_args([*adapter.PAIR.harness_argv(2), "--multi_gpu", form])
        built = legacy.build(flags, 2, files)
        graph = built.graph
        devices = {op.device for op in graph.get_operations() if op.type == "Conv2D" and "gradients" not in op.name}
        assert {d.rsplit("/", 1)[-1] for d in devices} == {"device:CPU:0", "device:CPU:1"}, (form, devices)
        assert flags._towers == 2  # what the program's own evaluation is run with
        feed = built.feed(adapter.Data().batch(16, 0), True)
        assert [list(r) for r in feed.rows] == [list(range(8)), list(range(8, 16))], form
        assert feed.weights == [weights, weights], form  # a MirroredStrategy's losses carry their 1/N in the graph
    assert built.inference is not None and len(built.inference.tower_logits) == 2  # the EVAL graph's towers


def test_a_mean_where_the_original_sums_its_towers_losses_fails_and_is_named(tmp_path, monkeypatch):
    """replicate_model_fn's default SUM adds the towers' means: a port that averages them steps half as far."""
    real = modern_train.loss_scale
    monkeypatch.setattr(modern_train, "loss_scale", lambda args, replicas: 1.0 / replicas
                        if args.multi_gpu == "replicate" else real(args, replicas))
    results = judged(tmp_path, only=("training",))
    assert failed(results) == ["replicate: forward (training, same dropout masks)",
                               "replicate: gradients (read out of the train step)"]
    for check in failed(results):
        cause = results[check].diagnosis.cause
        assert cause.startswith("likely cause [loss_scale]") and "1/2 of the original's" in cause, cause


def test_each_replica_taking_its_own_mean_fails_the_averaging_forms_and_is_named(tmp_path, monkeypatch):
    """Each replica's loss not divided by the replica count where the v1 optimizer under a MirroredStrategy
    divides it, and the hand towers' gradients summed where the program averages them: the steps are N
    times the original's."""
    monkeypatch.setattr(modern_train, "loss_scale", lambda args, replicas: 1.0)
    monkeypatch.setattr(modern_train, "gradient_scale", lambda args, replicas: 1.0)
    results = judged(tmp_path, only=("training",))
    checks = ("forward (training, same dropout masks)", "gradients (read out of the train step)")
    assert failed(results) == sorted(f"{form}: {check}" for form in ("mirrored", "towers") for check in checks)
    for check in failed(results):
        cause = results[check].diagnosis.cause
        assert cause.startswith("likely cause [loss_scale]") and "2 times the original's" in cause, cause


def test_keras_batch_norm_momentum_fails_the_moving_statistics_and_is_named(tmp_path, monkeypatch):
    """Keras' default momentum 0.99 where the program's batch norms decay by 0.997."""
    class KerasMomentum(SlimBatchNorm):
        def __init__(self, momentum, epsilon, name):
            super().__init__(momentum=0.99, epsilon=epsilon, name=name)

    monkeypatch.setattr(modern_train, "SlimBatchNorm", KerasMomentum)
    results = judged(tmp_path, only=("basics", "steps"))
    moving = {name: r for name, r in results.items() if "bn moving statistics" in name and r.status == "FAIL"}
    assert sorted(moving) == ["mirrored: bn moving statistics", "replicate: bn moving statistics"]
    for r in moving.values():
        assert r.diagnosis.cause.startswith("likely cause [bn_momentum]: the port's update with momentum 0.99"), \
            r.diagnosis.cause
    assert results["mirrored: configuration (flags and what they build)"].status == "FAIL"


def test_the_one_line_form_judges_the_two_programs_alone(tmp_path):
    """`compare/run.py --legacy ... --modern ...`, no adapter: both captured, the rows the TF1 program's own
    input_fn gives its replicas."""
    data = os.path.dirname(adapter.Data().write(str(tmp_path / "data"), 2, 0)["train"])
    done = subprocess.run([sys.executable, "compare/run.py", "--legacy", "examples/estimator_towers/train_tf1.py",
                           "--modern", "examples/estimator_towers/modern_train.py", "--quick", "--", "--data_dir",
                           data, "--batch_size", "16", "--shuffle_buffer", "1", "--multi_gpu", "replicate"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert " 0 FAIL" in summary and int(summary.split(" PASS")[0]) >= 20, summary


PLANTED = '''"""The estimator pair as a user would judge a port of theirs: its replicas' losses averaged (1/N) where
the TF1 program's replicate_model_fn sums its towers' (loss_reduction SUM, contrib's default)."""
from examples.estimator_towers import modern_train
from examples.estimator_towers.adapter import PAIR  # noqa: F401

real = modern_train.loss_scale


def loss_scale(args, replicas):
    return 1.0 / replicas if args.multi_gpu == "replicate" else real(args, replicas)


modern_train.loss_scale = loss_scale
'''


def test_command_line_fails_a_mean_for_replicates_sum_in_the_training_checks_and_names_it(tmp_path):
    """`compare/run.py --pair MODULE`, the module a file of the user's beside no harness code, the mistake in
    the port's own loss_scale: exit 1, exactly the replicate pairing's training checks FAIL, the cause named,
    no traceback."""
    (tmp_path / "planted_estimator.py").write_text(PLANTED)
    report = tmp_path / "parity.json"
    done = subprocess.run([sys.executable, "compare/run.py", "--pair", "planted_estimator", "--quick", "--only",
                           "training", "--report", str(report)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    results = {r["check"]: r for r in json.loads(report.read_text())["results"]}
    assert sorted(n for n, r in results.items() if r["status"] == "FAIL") == [
        "replicate: forward (training, same dropout masks)", "replicate: gradients (read out of the train step)"]
    gradients = results["replicate: gradients (read out of the train step)"]
    assert gradients["worst"]["rel_l2"] > 100 * gradients["tolerance_rel_l2"]
    assert gradients["diagnosis"]["cause"].startswith("likely cause [loss_scale]")
    assert not [n for n, r in results.items() if r["status"] == "ERROR"]
    assert results["mirrored: gradients (read out of the train step)"]["status"] == "PASS"
