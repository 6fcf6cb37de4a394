"""The flags check in a process of its own (compare/checks/flags.py: launch, collect;
compare/flags_process.py), as the harness runs it for a pair whose builds take seconds (ResNet-v2-50),
here forced on the MNIST pair (its builds take a fraction of a second; its flags reach every level,
the training step's included): the same verdict as in the harness's process, a mistake planted in
a program given by module name (`--program`) FAILs there too, and a process that fails leaves the
check to the harness's process, with a progress line that says so."""
import dataclasses
import textwrap

import pytest

from compare import harness
from compare.checks import flags
from compare.programs import Programs

SETTINGS = harness.Settings(towers=2, quick=False, only=("flags",))


def built(pair, tmp_path):
    files = harness.write_files(pair, SETTINGS, str(tmp_path))
    return harness.build_pairings(pair, SETTINGS, files, str(tmp_path), log=lambda *_: None)


def apart(sides, monkeypatch):
    """The check as the harness runs it where it runs apart: launched, then collected; and its log."""
    monkeypatch.setattr(flags, "APART_OPERATIONS", 0)
    lines = []
    begun = flags.launch(sides)
    assert isinstance(begun, flags.Apart)
    return flags.collect(sides, begun, lines.append), lines


def view(result):
    """The verdict, flag by flag: which flags were judged and whether each agreed (rel_l2 0) or not.
    (How many entries a flag changes at the step level can differ from run to run on MNIST: the
    original's towers update its moving averages unordered.)"""
    return result.status, [(e.name.split(":")[0], e.rel_l2) for e in result.errors]


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
    pairings = built(harness.load_adapter("compare.pairs.mnist_multi_gpu"), tmp_path_factory.mktemp("mnist"))
    yield pairings[0][0]
    harness.close(pairings)


def test_in_its_own_process_the_check_gives_the_verdict_it_gives_here(mnist, monkeypatch):
    here = flags.check_flags(mnist)
    there, lines = apart(mnist, monkeypatch)
    assert lines == [] and view(there) == view(here) and here.status == "PASS" and len(here.errors) == 5
    assert "regularization_rate (step/step)" in there.note  # the training step ran in that process too


def constant_decay_port(tmp_path, monkeypatch):
    """The port parses --moving_average_decay but averages with the constant 0.99: a module for the
    modern role, importable by name (in the checks' own processes too)."""
    (tmp_path / "constant_decay_port.py").write_text(textwrap.dedent('''
        from modern.mnist_multi_gpu import *  # noqa: F401,F403 - the port, one function changed
        from modern import mnist_multi_gpu as _port


        def make_moving_average(model, optimizer, decay=0.99):
            return _port.make_moving_average(model, optimizer)
        '''))
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_mistake_in_a_program_given_by_module_name_fails_in_the_checks_own_process(tmp_path, monkeypatch):
    """The process loads the pair with the module given in the modern role (Pair.programs), not the
    default port."""
    constant_decay_port(tmp_path, monkeypatch)
    pair = harness.load_adapter("compare.pairs.mnist_multi_gpu", Programs.load(modern_mnist="constant_decay_port"))
    assert pair.programs["modern_mnist"] == "constant_decay_port"
    pairings = built(pair, tmp_path / "run")
    try:
        result, lines = apart(pairings[0][0], monkeypatch)
    finally:
        harness.close(pairings)
    assert lines == [] and result.status == "FAIL"
    assert result.worst.name == "--moving_average_decay 0.9: changes nothing the modern program builds or steps"


def test_a_process_that_fails_leaves_the_check_to_this_one(mnist, monkeypatch):
    monkeypatch.setattr(mnist, "pair", dataclasses.replace(mnist.pair, module="no_such_adapter"))
    result, lines = apart(mnist, monkeypatch)
    assert result.status == "PASS" and len(lines) == 1
    assert "the flags check's own process ended with exit code 1" in lines[0] and "runs here" in lines[0]
    assert "no_such_adapter" in lines[0]


def test_the_command_line_fails_the_flags_check_run_in_its_own_process(tmp_path, monkeypatch, capsys):
    """`compare/run.py --model mnist --program modern_mnist=constant_decay_port --only flags`, each
    pairing's flags check in its own process: exit 1, exactly the two flags checks FAIL."""
    from compare import report, run
    constant_decay_port(tmp_path, monkeypatch)
    monkeypatch.setattr(flags, "APART_OPERATIONS", 0)
    path = tmp_path / "parity.json"
    assert run.main(["--model", "mnist", "--program", "modern_mnist=constant_decay_port", "--only", "flags",
                     "--report", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.count("(in its own process, started before the first check)") == 2 and "runs here" not in out
    results = {r.check: r for r in report.read_json(str(path))}
    assert sorted(n for n, r in results.items() if r.status == "FAIL") == [
        "deviation: flags through what they build", "original: flags through what they build"]
    assert results["original: flags through what they build"].worst.name == \
        "--moving_average_decay 0.9: changes nothing the modern program builds or steps"
