"""compare/checks/registry: work a group begins before the pairing's first check (the TF1-runtime
process), and how its failures reach the report."""
import types

from compare.checks import registry, tf1
from compare.settings import Settings

SIDES = types.SimpleNamespace(pair=types.SimpleNamespace(name="m", capabilities=frozenset({"tf1_runtime"})),
                              label="")


def run(groups, settings=None):
    return registry.run_groups(registry.Context(SIDES, settings or Settings(), lambda *_: None), groups)


def raise_(error):
    raise error


def test_a_process_that_cannot_start_is_its_checks_error_and_the_run_goes_on(monkeypatch):
    monkeypatch.setattr(tf1, "launch", lambda sides, settings: raise_(OSError("no interpreter")))
    results = run(["tf1"])
    assert [(r.check, r.status) for r in results] == [("legacy on TF1's runtime", "ERROR")]
    assert "OSError: no interpreter" in results[0].note


class Begun:
    stopped = False

    def stop(self):
        self.stopped = True


def test_a_process_its_check_never_collects_is_stopped_at_the_end(monkeypatch):
    begun = Begun()
    monkeypatch.setattr(tf1, "launch", lambda sides, settings: begun)
    monkeypatch.setattr(tf1, "check_tf1_runtime", lambda sides, launched: raise_(RuntimeError("crashed")))
    results = run(["tf1"])
    assert [r.status for r in results] == ["ERROR"] and "crashed" in results[0].note
    assert begun.stopped


def test_no_process_is_begun_for_a_group_that_does_not_run(monkeypatch):
    calls = []
    monkeypatch.setattr(tf1, "launch", lambda sides, settings: calls.append(settings))
    assert run(["tf1"], Settings(quick=True)) == [] and run([]) == []  # --quick runs no TF1-runtime process
    assert calls == []


def test_a_group_that_began_work_is_collected_after_the_others_and_reported_in_its_place(monkeypatch):
    from compare.checks import flags, forward, shuffle
    from compare.report import not_applicable
    calls = []

    def check(name):
        def run(*args):
            calls.append(name)
            return not_applicable(name, "m", "stand-in")
        return run
    monkeypatch.setattr(flags, "launch", lambda sides: "begun")
    monkeypatch.setattr(flags, "collect", lambda sides, begun, log: check(f"flags ({begun})")())
    monkeypatch.setattr(shuffle, "check_shuffle", check("shuffle"))
    monkeypatch.setattr(forward, "check_inference", check("inference"))
    monkeypatch.setattr(forward, "check_dropout", check("dropout"))
    results = run(["shuffle", "flags", "forward"])
    assert calls == ["shuffle", "inference", "dropout", "flags (begun)"]  # flags' process ran beside the others
    assert [r.check for r in results] == ["shuffle", "flags (begun)", "inference", "dropout"]  # GROUPS order
