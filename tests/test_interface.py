"""The harness as a library: any pair that implements compare/interface.py is judged by the generic
checks; a pair that does not is refused with one line naming what is wrong, exit 2, before any check.

The pair here is tests/tiny_pair.py (softmax regression, momentum SGD: TF1 and Keras keep momentum's
slot in different parameterisations, which the harness converts and judges against each rule).
"""
import dataclasses
import threading

import numpy as np
import pytest
import tensorflow as tf


import tiny_pair
from compare import harness, optimizers, run
from compare.interface import AdapterError, validate
from compare.sides import HarnessError

SETTINGS = harness.Settings(towers=2, steps=2, free_steps=3)


def judge(pair, tmp_path):
    return {r.check: r for r in harness.judge_pair(pair, SETTINGS, str(tmp_path), log=lambda *_: None)}


def test_a_pair_with_momentum_is_judged_by_every_generic_check(tmp_path):
    results = judge(tiny_pair.PAIR, tmp_path)
    assert [n for n, r in results.items() if r.status == "FAIL"] == []
    passed = {n for n, r in results.items() if r.status == "PASS"}
    assert {"configuration (flags and what they build)", "variables", "forward (inference)",
            "gradients (read out of the train step)", "lr schedule", "2 training steps: optimizer on each side",
            "3 free-running steps (chaos floor)", "step counters", "split: short last batch"} <= passed
    assert "momentum 0.9" in results["2 training steps: optimizer on each side"].note
    # What the pair has nothing for is NOT APPLICABLE with its reason, never a PASS.
    absent = {n: r.note for n, r in results.items() if r.status == "NOT APPLICABLE"}
    assert {"checkpoint round trip", "input pipelines", "dropout (training mode)", "moving averages",
            "evaluation (one checkpoint)"} <= set(absent)
    assert all(absent.values())


def test_the_ports_step_traced_beside_the_legacy_start_is_the_trace_every_check_runs(tmp_path, monkeypatch):
    """ModernBuild.trace: the harness traces the port's step in a thread of its own while the legacy
    side starts, and every check runs that trace: the step is traced once in the whole judge (the
    uneven splits and the empty replica included), and the verdicts are those without it."""
    seen = {}

    def trace(self, step):
        seen.setdefault("step", step)  # the judged pairing's, built first (the flags check builds again)

        def traced():
            seen["thread"] = threading.current_thread().name
            return step.get_concrete_function()
        return traced
    monkeypatch.setattr(tiny_pair.Modern, "trace", trace)
    results = judge(tiny_pair.PAIR, tmp_path)
    assert [n for n, r in results.items() if r.status in ("FAIL", "ERROR")] == []
    assert seen["thread"] == "modern-trace"
    assert seen["step"].experimental_get_tracing_count() == 1
    monkeypatch.setattr(tiny_pair.Modern, "trace", None)
    assert {n: r.status for n, r in judge(tiny_pair.PAIR, tmp_path / "untraced").items()} == {
        n: r.status for n, r in results.items()}


def test_a_trace_that_raises_is_the_error_of_the_first_check_that_runs_the_step(tmp_path, monkeypatch):
    """What the trace raised in its thread is raised where the port's step first runs, as a step
    traced at its first call raises there: one ERROR naming it; the other checks still run."""
    def trace(self, step):
        def broken():
            raise ValueError("planted: the port's step cannot be traced")
        return broken
    monkeypatch.setattr(tiny_pair.Modern, "trace", trace)
    results = judge(tiny_pair.PAIR, tmp_path)
    errors = [r for r in results.values() if r.status == "ERROR"]
    assert len(errors) == 1, [(r.check, r.note) for r in errors]
    assert "ValueError: planted: the port's step cannot be traced" in errors[0].note
    assert sum(r.status == "PASS" for r in results.values()) > 10


def test_keras_nesterov_momentum_where_tf1_has_plain_momentum_fails_configuration_and_trajectory(tmp_path, monkeypatch):
    """Each side's update is judged against its own rule (so that passes); the rules differ (the
    configuration check says so) and so do the trajectories (the free-running check)."""
    monkeypatch.setattr(tiny_pair.Modern, "nesterov", True)
    results = judge(tiny_pair.PAIR, tmp_path)
    assert results["configuration (flags and what they build)"].status == "FAIL"
    assert "modern momentum 0.9 (Nesterov)" in results["configuration (flags and what they build)"].worst.name
    assert results["2 training steps: optimizer on each side"].status == "PASS"
    assert results["3 free-running steps (chaos floor)"].status == "FAIL"
    # Nesterov's look-ahead parts from the first step, and no entry of the catalogue explains it (it is
    # a configuration the port chose, which the configuration check names).
    free = results["3 free-running steps (chaos floor)"].diagnosis
    assert free.where.startswith("first at free-running step 0"), free.where
    assert free.cause.startswith("no known cause explains it"), free.cause


def test_momentum_slots_convert_between_the_two_parameterisations():
    """TF1: a = mom a + g, w -= lr a;  Keras: m = mom m - lr g, w += m.  From the same state (m = -lr a),
    one step of each rule lands on the same weights, and each slot reads back the same gradient."""
    rng = np.random.default_rng(0)
    (w, a, g), lr, mom = (rng.normal(size=5) for _ in range(3)), 0.05, 0.9
    tf1_rule, keras_rule = (optimizers.Rule("momentum", "tf1", momentum=mom),
                            optimizers.Rule("momentum", "keras", momentum=mom))
    m = optimizers.modern_slots_from_legacy(keras_rule, {"accum": a.astype(np.float32)}, lr)["momentum"]
    a1, m1 = mom * a + g, mom * m - lr * g
    assert np.allclose(w - lr * a1, w + m1, atol=1e-6)
    assert np.allclose(optimizers.gradients_from_slots(tf1_rule, {"accum": a}, {"accum": a1}, lr), g)
    assert np.allclose(optimizers.gradients_from_slots(keras_rule, {"momentum": m}, {"momentum": m1}, lr), g, atol=1e-5)


def test_an_adapter_without_the_interface_is_refused_by_name():
    class NoBuild:
        tower_flag = "--num_gpus"

        def parse_args(self, argv):
            return None

        def session_config(self, flags, towers):
            return None

    with pytest.raises(AdapterError, match="NoBuild does not implement LegacySide: it lacks build"):
        validate(tiny_pair.make_pair(legacy=NoBuild()))
    with pytest.raises(AdapterError, match="unknown capabilities teleport"):
        validate(tiny_pair.make_pair(capabilities=frozenset({"teleport"})))


def test_command_line_refuses_a_pair_it_cannot_import_or_judge(capsys, monkeypatch):
    assert run.main(["--pair", "no_such.adapter"]) == 2
    assert "cannot import it" in capsys.readouterr().err

    class Vectors(tiny_pair.Legacy):
        def build(self, flags, towers, files):
            graph = super().build(flags, towers, files)
            return dataclasses.replace(graph, tower_losses=[tf.reshape(t, [1]) for t in graph.tower_losses])

    monkeypatch.setattr(tiny_pair, "PAIR", tiny_pair.make_pair(legacy=Vectors()))
    assert run.main(["--pair", "tiny_pair"]) == 2
    err = capsys.readouterr().err
    assert "error: the legacy graph does not fit the interface" in err and "is not a scalar" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("mapping, message", [
    (lambda names: {k: v for k, v in names.items() if k != "softmax/biases"},
     "legacy variables with no modern variable: softmax/biases"),
    (lambda names: dict(names, **{"softmax/biases": names["softmax/weights"]}),
     "mapped to the same modern variable"),
])
def test_a_variable_mapped_to_none_or_to_two_is_refused_by_name(capsys, monkeypatch, mapping, message):
    class Mapped(tiny_pair.Modern):
        def build(self, flags, strategy, files):
            built = super().build(flags, strategy, files)
            kernel, bias = built.model.trainable_variables
            return dataclasses.replace(built, variables=mapping({"softmax/weights": kernel, "softmax/biases": bias}))

    monkeypatch.setattr(tiny_pair, "PAIR", tiny_pair.make_pair(modern=Mapped()))
    assert run.main(["--pair", "tiny_pair"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_the_default_variable_map_pairs_by_creation_order_and_shape(tmp_path):
    class Transposed(tiny_pair.Modern):
        def build(self, flags, strategy, files):
            built = super().build(flags, strategy, files)
            import keras
            model = keras.Sequential([keras.Input((tiny_pair.CLASSES,)), keras.layers.Dense(tiny_pair.FEATURES)])
            return dataclasses.replace(built, model=model)

    with pytest.raises(HarnessError, match=r"cannot pair the variables by creation order, shapes differ: "
                                           r"softmax/weights \[8, 4\] vs"):
        harness.judge_pair(tiny_pair.make_pair(modern=Transposed()), SETTINGS, str(tmp_path), log=lambda *_: None)


DECAYING = dataclasses.replace(tiny_pair.PAIR, harness_argv=lambda towers: ("--decay", "0.5"))


def test_a_port_with_its_own_optimizer_is_judged_against_the_legacy_one(tmp_path, monkeypatch):
    """TF1's momentum under a decaying rate, ported with an optimizer of its own (a keras.optimizers.Optimizer
    subclass the harness has no rule for): judged side by side with the legacy optimizer, its slot
    paired by value; no FAIL."""
    monkeypatch.setattr(tiny_pair.Modern, "tf1_momentum", True)
    results = judge(DECAYING, tmp_path)
    assert [n for n, r in results.items() if r.status in ("FAIL", "ERROR")] == []
    side_by_side = results["2 training steps: optimizers side by side"]
    assert side_by_side.status == "PASS" and "slots paired by value (accum = accum)" in side_by_side.note
    assert "TF1Momentum (a rule the harness does not know)" in side_by_side.note


def test_keras_sgd_momentum_under_a_decaying_rate_fails(tmp_path):
    """Keras' SGD(momentum) folds each step's rate into its velocity; TF1's momentum does not: under a
    rate that changes, the configuration says so and the trajectories part."""
    results = judge(DECAYING, tmp_path)
    config = results["configuration (flags and what they build)"]
    assert config.status == "FAIL" and "folds the rate into its velocity" in config.worst.name
    assert results["3 free-running steps (chaos floor)"].status == "FAIL"
    # The port's own trajectory is TF1's rule with Keras' momentum parameterisation, not TF1's rule:
    # the first step agrees (no velocity yet), the second parts.
    free = results["3 free-running steps (chaos floor)"].diagnosis
    assert free.where.startswith("first at free-running step 1"), free.where
    assert free.cause.startswith("likely cause [momentum_parameterisation]: the port's own updates over 3 free steps "
                                 "are the original's rule with Keras' SGD momentum rule"), free.cause
    # Far along the schedule the rate is 0 in float32: Keras' velocity (-lr a) cannot hold TF1's
    # accumulator there, so even one step from the same state parts.
    assert results["2 training steps: optimizers side by side"].status == "FAIL"


def test_a_staircase_schedule_where_the_original_decays_continuously_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(tiny_pair.Modern, "staircase", True)
    monkeypatch.setattr(tiny_pair.Modern, "tf1_momentum", True)  # the optimizer right: the rate alone is wrong
    results = judge(DECAYING, tmp_path)
    lr = results["lr schedule"]
    assert lr.status == "FAIL" and lr.diagnosis.where.startswith("the rates first part at global step 1"), lr.diagnosis
    assert lr.diagnosis.cause.startswith("likely cause [staircase]: the port's schedule with staircase=False"), \
        lr.diagnosis.cause
    free = results["3 free-running steps (chaos floor)"]
    assert free.status == "FAIL" and "likely cause [staircase]" in free.diagnosis.cause


def test_a_cosine_decay_without_the_originals_floor_is_named(tmp_path, monkeypatch):
    """tf.compat.v1.train.cosine_decay(alpha=0.1) ported as Keras' CosineDecay with its default alpha 0."""
    monkeypatch.setattr(tiny_pair.Modern, "tf1_momentum", True)  # the optimizer right: the rate alone is wrong
    monkeypatch.setattr(tiny_pair.Legacy, "cosine", (100, 0.1))
    monkeypatch.setattr(tiny_pair.Modern, "cosine", (100, 0.1))
    assert judge(tiny_pair.PAIR, tmp_path / "correct")["lr schedule"].status == "PASS"
    monkeypatch.setattr(tiny_pair.Modern, "cosine", (100, 0.0))
    lr = judge(tiny_pair.PAIR, tmp_path / "planted")["lr schedule"]
    assert lr.status == "FAIL"
    assert lr.diagnosis.cause.startswith("likely cause [cosine_alpha]: the port's cosine decay with alpha=0.1, the "
                                         "original's floor"), lr.diagnosis.cause


def test_a_check_that_raises_is_its_own_error_line_and_the_others_still_run(tmp_path, monkeypatch):
    class Fragile(tiny_pair.Data):
        def batch(self, rows, seed):
            if rows == 1:  # the 'fewer rows than towers' batch
                raise ValueError("no batch of one row here")
            return super().batch(rows, seed)

    results = judge(tiny_pair.make_pair(data=Fragile()), tmp_path)
    error = results["split: fewer rows than towers"]
    assert error.status == "ERROR" and "ValueError: no batch of one row here" in error.note
    assert "Fragile.batch" in error.note or "batch (" in error.note  # the adapter's frame
    assert results["split: short last batch"].status == "PASS"
    assert results["3 free-running steps (chaos floor)"].status == "PASS"
    assert len(results) > 20


def test_the_profile_gives_each_phase_until_the_next_progress_line_slowest_first():
    """`compare/run.py --profile`: what the progress lines mark, as durations (the start-up before
    the first line included), slowest first, each with its share of the run."""
    from compare.report import profile_table
    lines = profile_table([(2.0, "cifar: building the legacy graph (2 towers)"), (9.0, "cifar: training steps")], 10.0)
    assert lines == ["Where the time went (10.0 s in this process, slowest phase first):",
                     "      7.0 s   70.0%  cifar: building the legacy graph (2 towers)",
                     "      2.0 s   20.0%  start-up: imports, adapters, data files",
                     "      1.0 s   10.0%  cifar: training steps"]
