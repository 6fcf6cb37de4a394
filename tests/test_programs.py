"""The modules this repository's pair adapters drive (compare/programs.py): the four programs fill
their roles, a module that does not is refused by name, and a third program written the same way is
judged by the same checks (`compare/run.py --program ROLE=MODULE`).
"""
import json
import os
import subprocess
import sys
import types

import pytest


from compare import harness, programs
from compare.pairs import mnist_multi_gpu as mnist_pair
from compare.programs import Programs
from conftest import ROOT, run_program
from legacy import mnist_multi_gpu as legacy_mnist
from modern import mnist_multi_gpu

SETTINGS = harness.Settings(towers=2, steps=2, free_steps=4, quick=True)


def judged(tmp_path, **roles):
    return harness.judge_pair(mnist_pair.make_pair(Programs.load(**roles)), SETTINGS, str(tmp_path),
                              log=lambda *_: None)


def test_this_repositorys_programs_implement_their_roles():
    defaults = Programs.load()
    for role, spec in programs.ROLES.items():
        assert getattr(defaults, role).__name__ == spec.default
        assert programs.missing(getattr(defaults, role), role) == []


def test_a_module_without_the_interface_is_refused_by_name_and_nothing_is_swapped():
    partial = types.ModuleType("partial_trainer")
    partial.parse_args = lambda argv=None: None
    defaults = Programs.load()
    with pytest.raises(programs.InterfaceError, match="partial_trainer cannot be judged as modern_mnist: "
                                                      "it does not define get_input, same_batch_on_every_replica"):
        defaults.replace(modern_mnist=partial)
    assert defaults.modern_mnist is mnist_multi_gpu
    with pytest.raises(programs.InterfaceError, match="unknown role 'modern_resnet'"):
        Programs.load(modern_resnet=mnist_multi_gpu)


def test_a_third_program_is_judged_by_the_same_checks(tmp_path):
    """A copy of the modern MNIST trainer's namespace whose learning-rate schedule decays one step
    late: judged in the modern_mnist role, the lr checks fail, and so do the optimizers side by side
    at step 100000 (each side at the rate it steps at: 7e-5 apart); at the trained state (step 1900)
    the rates are 1.3e-6 apart, below the side-by-side tolerance (1.9e-6), and that check passes.
    The other checks still pass."""
    third = types.ModuleType("third_mnist")
    third.__dict__.update({k: v for k, v in vars(mnist_multi_gpu).items() if not k.startswith("__")})
    real = mnist_multi_gpu.make_optimizer
    third.make_optimizer = lambda base, decay_steps, decay: real(base, decay_steps + 1, decay)
    results = judged(tmp_path, modern_mnist=third)
    assert sorted(r.check for r in results if r.status == "FAIL") == [
        f"{label}: {check}" for label in ("deviation", "original")
        for check in ("2 training steps: optimizers side by side", "lr schedule", "lr schedule (trained state)")]
    assert mnist_pair.PAIR.modern.programs.modern_mnist is mnist_multi_gpu


def test_a_third_legacy_program_is_judged_by_the_same_checks(tmp_path):
    """The legacy side too: a copy of the legacy MNIST trainer whose graph takes twice the l2 rate it
    is given (the regulariser scale, one of the migration's numeric traps, on the TF1 side): the
    checks that train fail; the configuration, schedule, input and variable checks still pass."""
    third = types.ModuleType("third_legacy_mnist")
    third.__dict__.update({k: v for k, v in vars(legacy_mnist).items() if not k.startswith("__")})
    real = legacy_mnist.build_train_graph
    third.build_train_graph = lambda inputs, regularization_rate, **kw: real(
        inputs, regularization_rate=2 * regularization_rate, **kw)
    results = {r.check: r for r in judged(tmp_path, legacy_mnist=third)}
    failed = {n for n, r in results.items() if r.status == "FAIL"}
    for label in ("original", "deviation"):
        assert {f"{label}: gradients (read out of the train step)",
                f"{label}: 4 free-running steps (chaos floor)"} <= failed
        for check in ("configuration (flags and what they build)", "lr schedule", "input pipelines", "variables",
                      "checkpoint round trip"):
            assert results[f"{label}: {check}"].status == "PASS", check
    assert mnist_pair.PAIR.legacy.programs.legacy_mnist is legacy_mnist


def test_command_line_refuses_a_program_it_cannot_judge():
    done = run_program(["compare/run.py", "--model", "mnist", "--program", "modern_mnist=no_such.trainer"])
    assert done.returncode == 2 and "cannot import it" in done.stderr, done.stderr[-2000:]
    done = run_program(["compare/run.py", "--model", "mnist", "--program", "modern_mnist"])
    assert done.returncode == 2 and "expected ROLE=MODULE" in done.stderr, done.stderr[-2000:]


PLANTED = '''"""The modern MNIST trainer, its decay made staircase (the original's is continuous)."""
import keras

from modern import mnist_multi_gpu

globals().update({k: v for k, v in vars(mnist_multi_gpu).items() if not k.startswith("__")})


def make_optimizer(learning_rate_base=0.001, decay_steps=60000 / 100, learning_rate_decay=0.99):
    schedule = keras.optimizers.schedules.ExponentialDecay(learning_rate_base, decay_steps, learning_rate_decay,
                                                           staircase=True)
    return keras.optimizers.SGD(learning_rate=schedule)
'''


def test_command_line_fails_a_program_with_a_staircase_decay_in_the_lr_checks_and_names_it(tmp_path):
    """As a user judges a port of their own: `compare/run.py --program modern_mnist=MODULE`, the module
    a file beside no harness code, its own make_optimizer staircase where the original decays
    continuously.  The rate checks FAIL and say why; the exit status is 1; no traceback."""
    (tmp_path / "staircase_mnist.py").write_text(PLANTED)
    report = tmp_path / "parity.json"
    done = subprocess.run([sys.executable, "compare/run.py", "--model", "mnist", "--quick", "--only", "steps",
                           "--program", "modern_mnist=staircase_mnist", "--report", str(report)],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    results = {r["check"]: r for r in json.loads(report.read_text())["results"]}
    failed = sorted(name for name, r in results.items() if r["status"] == "FAIL")
    assert "original: lr schedule" in failed and "deviation: lr schedule" in failed, failed
    assert not [name for name in failed if "lr schedule" not in name and "side by side" not in name], failed
    assert results["original: lr schedule"]["diagnosis"]["cause"].startswith("likely cause [staircase]")
