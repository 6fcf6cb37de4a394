"""Every verdict could have gone the other way: a derived tolerance above the power bound is a FAIL
line of its own (compare/tolerances.py `power`), naming the randomness the harness could not impose.

The pair is tests/tiny_pair.py; its noisy variant multiplies the inputs by 1 + 0.5 U(0, 1) in every
run, training and inference alike: two runs of the legacy program on one feed disagree, by far more
than any tolerance with power.
"""
import tiny_pair
from compare import harness, tolerances

SETTINGS = harness.Settings(towers=2, steps=1, free_steps=2, quick=True, only=("basics",))


def judged(pair, tmp_path):
    return harness.judge_pair(pair, SETTINGS, str(tmp_path), log=lambda *_: None)


def test_a_legacy_program_with_randomness_the_harness_cannot_impose_is_not_judged_at_its_spread(tmp_path):
    legacy = tiny_pair.Legacy()
    legacy.noise = 0.5
    results = judged(tiny_pair.make_pair(legacy=legacy), tmp_path)
    first = results[0]
    assert (first.check, first.status) == ("tolerances with power", "FAIL"), first
    assert first.worst.rel_l2 > 100 * tolerances.POWER_BOUND.rel_l2
    assert "cannot be judged" in first.note and "tower_0/random_uniform" in first.note


def test_the_tiny_pair_has_a_tolerance_with_power(tmp_path):
    results = judged(tiny_pair.PAIR, tmp_path)
    assert "tolerances with power" not in [r.check for r in results]
    assert results and all(r.status != "FAIL" for r in results)


def test_every_check_line_says_the_smallest_change_it_catches(tmp_path):
    """A judged check's `catches` is the largest tolerance any of its tensors is held to (a tensor with a
    tolerance of its own raises it); the table prints it last, the JSON keeps it; none for NOT APPLICABLE."""
    from compare.report import Result, TensorError, Tolerance, format_table, not_applicable
    model = Tolerance("model", 1e-5, "")
    gradients = Result("gradients", "tiny", "PASS", model, [TensorError("w", 0, 0, 1e-7),
                                                             TensorError("b", 0, 0, 1e-6, tolerance=4e-5)])
    skipped = not_applicable("evaluation", "tiny", "no evaluation")
    assert gradients.catches == 4e-5 and skipped.catches is None
    assert gradients.as_dict()["catches"] == 4e-5
    lines = format_table([gradients, skipped]).splitlines()
    assert lines[0].split()[-1] == "catches" and lines[2].split()[-1] == "4.00e-05"
    settings = harness.Settings(towers=2, steps=1, free_steps=2, quick=True, only=("training",))
    results = harness.judge_pair(tiny_pair.PAIR, settings, str(tmp_path), log=lambda *_: None)
    judged_at_model = [r for r in results if r.tolerance.name == "model" and r.status != "NOT APPLICABLE"]
    assert judged_at_model and all(r.catches <= tolerances.POWER_BOUND.rel_l2 for r in judged_at_model)


def test_a_flags_check_that_could_build_no_flag_is_not_applicable_never_a_pass(tmp_path, monkeypatch):
    """A program whose every shared flag builds something no batch of the harness's fits (a queue's
    static batch) has had nothing judged: NOT APPLICABLE with the reason."""
    from compare.checks import flags
    from compare.interface import NotFed

    def unfed(*args, **kwargs):
        raise NotFed("the queue gives 128 rows a step")
    monkeypatch.setattr(flags, "first_changes", unfed)
    settings = harness.Settings(towers=2, steps=1, free_steps=2, only=("flags",))
    results = {r.check: r for r in harness.judge_pair(tiny_pair.PAIR, settings, str(tmp_path), log=lambda *_: None)}
    result = results["flags through what they build"]
    assert result.status == "NOT APPLICABLE", result
    assert "no shared flag could be judged" in result.note and "128 rows" in result.note
