"""The CIFAR parity harness, as a user runs it, at 1 and 3 towers: `compare/run.py` in subprocesses,
on the CIFAR pair at one unit per block (`--pair small_cifar`, tests/small_cifar.py: both programs'
own --units_per_block).

Its own module (not in tests/test_compare_cifar.py, whose graphs it does not use), so that
`pytest -n 2 --dist loadfile` can run it beside that module's in-process harness.
"""
import json
import os
import subprocess
import sys

from conftest import ROOT


def test_harness_passes_at_one_and_three_towers(tmp_path):
    """Any tower count: at 3 towers the uneven batch has 23 rows (not divisible by 3), and the
    legacy update schedules of 3 towers (19) are predicted; at 1 tower there is nothing to split
    and the moving statistics are a plain PASS.  The tower-count-sensitive groups only, both
    processes at once, to keep the suite short (`python compare/run.py --towers 3` runs them all)."""
    runs = {}
    for towers, groups in ((1, "training,steps"), (3, "splits,steps")):
        report = tmp_path / f"parity_{towers}.json"
        command = [sys.executable, "compare/run.py", "--pair", "small_cifar", "--quick", "--towers", str(towers),
                   "--only", groups, "--report", str(report)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
        runs[towers] = (report, subprocess.Popen(command, cwd=ROOT, env=env, text=True,
                                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for towers, (report, process) in runs.items():
        output, _ = process.communicate(timeout=900)
        assert process.returncode == 0, output[-4000:]
        results = {r["check"]: r for r in json.loads(report.read_text())["results"]}
        assert "FAIL" not in {r["status"] for r in results.values()}, [r["check"] for r in results.values()
                                                                       if r["status"] == "FAIL"]
        assert results["bn moving statistics"]["status"] == ("EXPECTED" if towers > 1 else "PASS")
        if towers == 3:
            assert "23 rows" in results["split: remainder dropped"]["note"]
            assert results["split: a replica the strategy leaves empty"]["status"] == "PASS"
            assert results["split: fewer rows than towers"]["status"] == "EXPECTED"


PLANTED = '''"""The CIFAR port at Keras' default Adam epsilon (1e-7; TF1's Adam has 1e-8), one unit per block."""
import functools

from modern import cifar_resnet

cifar_resnet.make_optimizer = functools.partial(cifar_resnet.make_optimizer, epsilon=1e-7)

from small_cifar import PAIR  # noqa: E402,F401  (the seed adapter, building the port planted above)
'''


def judged_planted(tmp_path, module, source, *argv, quick=True, output=None):
    """`compare/run.py --pair module [--quick] *argv` with the adapter module `source` written to
    tmp_path: it must exit 1 with no traceback; (its JSON report's results by check, the FAILed checks).
    `output`: a list the run's stdout is appended to."""
    (tmp_path / f"{module}.py").write_text(source)
    report = tmp_path / "parity.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT / "tests")]))
    command = [sys.executable, "compare/run.py", "--pair", module, *(["--quick"] if quick else []), *argv,
               "--report", str(report)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    if output is not None:
        output.append(done.stdout)
    results = {r["check"]: r for r in json.loads(report.read_text())["results"]}
    return results, sorted(n for n, r in results.items() if r["status"] == "FAIL")


def test_command_line_at_three_towers_fails_keras_adam_epsilon_in_the_configuration(tmp_path):
    """A mistake planted in the port's own code (`make_optimizer`, as its `build` calls it), judged
    from the command line at 3 towers: exit 1, the configuration FAILs on the optimizer's epsilon
    (|1e-7 - 1e-8| / 1e-8 = 9), no traceback."""
    results, failed = judged_planted(tmp_path, "planted_small_cifar", PLANTED, "--towers", "3", "--only", "basics")
    assert failed == ["configuration (flags and what they build)"]
    worst = results["configuration (flags and what they build)"]["worst"]
    assert worst["name"] == "optimizer epsilon" and 8 < worst["rel_l2"] < 10


PLANTED_ADAM_STEP = '''"""The CIFAR port's fused Adam with its bias correction one step behind (beta^t at
t = iterations, where TF1's kernel and Keras' Adam take t = iterations + 1), one unit per block."""
import tensorflow as tf

from modern import cifar_resnet


def update_step(self, gradient, variable, learning_rate):
    dtype = variable.dtype
    local_step = tf.cast(self.iterations, dtype)  # the mistake: iterations + 1
    beta_1, beta_2 = tf.constant(self.beta_1, dtype), tf.constant(self.beta_2, dtype)
    m, v = cifar_resnet.adam_slots(self, variable)
    return tf.raw_ops.ResourceApplyAdam(
        var=cifar_resnet.resource_handle(variable), m=cifar_resnet.resource_handle(m),
        v=cifar_resnet.resource_handle(v), beta1_power=tf.pow(beta_1, local_step),
        beta2_power=tf.pow(beta_2, local_step), lr=tf.cast(learning_rate, dtype), beta1=beta_1, beta2=beta_2,
        epsilon=tf.constant(self.epsilon, dtype), grad=tf.cast(gradient, dtype), use_locking=False)


cifar_resnet.FusedAdam.update_step = update_step

from small_cifar import PAIR  # noqa: E402,F401  (the seed adapter, building the port planted above)
'''


def test_command_line_fails_an_adam_bias_correction_one_step_behind_in_the_optimizer_checks_only(tmp_path):
    """A mistake planted in the port's own optimizer (`FusedAdam.update_step`, which its `make_optimizer`
    builds): the bias correction at t = iterations.  Step 0 divides by 1 - beta^0 = 0; far past it the
    two corrections agree within round-off, so the 6 restart steps (step 0 among them) are what sees
    it: exit 1, exactly the two optimizer checks FAIL at step 0's update, the gradients and the rate
    PASS (the mistake is in the update alone), no traceback.  The port's update is judged against its
    own rule at step 0, where side by side parts, and by implication at the five others."""
    results, failed = judged_planted(tmp_path, "planted_adam_step", PLANTED_ADAM_STEP, "--steps", "6",
                                     "--only", "steps")
    assert failed == ["6 training steps: optimizer on each side", "6 training steps: optimizers side by side"]
    for check in failed:
        worst = results[check]["worst"]
        assert worst["step"] == 0 and worst["name"].endswith("update") and worst["rel_l2"] == float("inf"), worst
    own = results["6 training steps: optimizer on each side"]
    assert "the port's by implication at the other steps than [0]:" in own["note"], own["note"]
    assert {e["name"].split(":")[0] for e in own["errors"] if e["name"].startswith("modern")} == {"modern step 0"}
    assert results["6 training steps: loss and gradients"]["status"] == "PASS"
    assert results["lr schedule"]["status"] == "PASS"


PLANTED_REGULARISED_LOSS = '''"""The CIFAR port adding its layers' weight-decay losses to its training loss
(the original builds slim's regularisers but never adds REGULARIZATION_LOSSES to its loss), one unit
per block."""
import tensorflow as tf

from modern import cifar_resnet


def replica_gradients(model, x, y_onehot, global_batch_size, weights=None):
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        per_example = tf.nn.softmax_cross_entropy_with_logits(labels=y_onehot, logits=logits)
        loss = tf.nn.compute_average_loss(per_example, sample_weight=weights, global_batch_size=global_batch_size)
        loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))  # the mistake
    return loss, tape.gradient(loss, model.trainable_variables), logits


cifar_resnet.replica_gradients = replica_gradients

from small_cifar import PAIR  # noqa: E402,F401  (the seed adapter, building the port planted above)
'''


def test_command_line_fails_a_regularised_loss_against_the_legacy_graph_on_tf1s_runtime(tmp_path):
    """A mistake planted in the port's own loss (`replica_gradients`, which its train step calls): the
    weight-decay losses added.  The TF1-runtime process, started before the first check and collected
    last, FAILs its loss and gradients against the port's step; its moving statistics (the legacy
    graph's alone) stay EXPECTED; exit 1, no traceback."""
    output = []
    results, failed = judged_planted(tmp_path, "planted_regularised", PLANTED_REGULARISED_LOSS, "--only", "tf1",
                                     quick=False, output=output)
    assert failed == ["legacy on TF1's runtime: loss and gradients"]
    assert results["legacy on TF1's runtime: bn moving statistics"]["status"] == "EXPECTED"
    assert "the legacy graph on TF1's runtime, in its own process (started before the first check)" in output[0]
    assert results["legacy on TF1's runtime: loss and gradients"]["worst"]["rel_l2"] > 1e-3


PLANTED_CONSTANT_KEEP_PROB = '''"""The CIFAR port parsing --keep_prob but building its dropout from the
module's constant, one unit per block; the flags check in a process of its own, as on ResNet-v2-50
(whose builds take seconds)."""
from compare.checks import flags
from modern import cifar_resnet

flags.APART_OPERATIONS = 0  # this module is imported again in the flags check's process: there too
real = cifar_resnet.resnet_v2_50


def resnet_v2_50(num_classes, keep_prob, blocks):
    return real(num_classes=num_classes, keep_prob=cifar_resnet.keep_prob_train, blocks=blocks)  # the mistake


cifar_resnet.resnet_v2_50 = resnet_v2_50

from small_cifar import PAIR  # noqa: E402,F401  (the seed adapter, building the port planted above)
'''


def test_command_line_fails_a_flag_the_port_parses_and_builds_from_a_constant_in_the_flags_process(tmp_path):
    """A mistake planted in the port's own model build (`resnet_v2_50`, as its `build` calls it): the
    parsed --keep_prob ignored for the module's constant.  The flags check, in its own process
    (compare/flags_process.py), FAILs that flag on the modern side alone; every other shared flag
    changes what both programs build; exit 1, no traceback."""
    output = []
    results, failed = judged_planted(tmp_path, "planted_constant_keep_prob", PLANTED_CONSTANT_KEEP_PROB,
                                     "--only", "flags", quick=False, output=output)
    assert failed == ["flags through what they build"]
    assert "through what each program builds (in its own process" in output[0]
    flag_rows = {e["name"].split(":")[0]: e for e in results["flags through what they build"]["errors"]}
    assert flag_rows["--keep_prob 0.5"]["name"].endswith("changes nothing the modern program builds or steps")
    assert [name for name, e in flag_rows.items() if e["rel_l2"] != 0] == ["--keep_prob 0.5"], flag_rows
