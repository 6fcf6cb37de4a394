"""The harness as a library: any pair that implements compare/interface.py is judged by the generic
checks; a pair that does not is refused with one line naming what is wrong, exit 2, before any check.

The pair here is tests/tiny_pair.py (softmax regression, momentum SGD: TF1 and Keras keep momentum's
slot in different parameterisations, which the harness converts and judges against each rule).
"""
import dataclasses

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


def test_keras_nesterov_momentum_where_tf1_has_plain_momentum_fails_configuration_and_trajectory(tmp_path, monkeypatch):
    """Each side's update is judged against its own rule (so that passes); the rules differ (the
    configuration check says so) and so do the trajectories (the free-running check)."""
    monkeypatch.setattr(tiny_pair.Modern, "nesterov", True)
    results = judge(tiny_pair.PAIR, tmp_path)
    assert results["configuration (flags and what they build)"].status == "FAIL"
    assert "modern momentum 0.9 (Nesterov)" in results["configuration (flags and what they build)"].worst.name
    assert results["2 training steps: optimizer on each side"].status == "PASS"
    assert results["3 free-running steps (chaos floor)"].status == "FAIL"


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
