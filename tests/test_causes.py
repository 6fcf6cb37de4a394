"""The catalogue of known TF1/Keras differences (compare.causes) and the localisation's guard
(compare.diagnosis): every entry has a planted test in which its mistake is found and named, and a
localisation never costs a run without a FAIL nor loses the FAIL it explains."""
import pathlib

from compare import causes, diagnosis
from compare.report import Diagnosis, Part, Result, STATIC, TensorError, format_table, read_json, write_json

TESTS = pathlib.Path(__file__).parent


def test_every_catalogue_entry_has_a_planted_test_that_names_it():
    text = "".join(path.read_text() for path in TESTS.glob("test_*.py") if path.name != "test_causes.py")
    untested = [key for key in causes.CATALOGUE if f"likely cause [{key}]" not in text]
    assert untested == []


def result(status):
    return Result("gradients", "tiny", status, STATIC["optimizer"], [TensorError("w", 1.0, 1.0, 1.0)])


def test_a_localisation_runs_on_a_fail_only_and_an_error_in_it_keeps_the_fail():
    calls = []
    passed = diagnosis.guarded(result("PASS"), lambda: calls.append(1))
    assert passed.diagnosis is None and calls == []

    def broken():
        raise ValueError("no layer pairs")
    failed = diagnosis.guarded(result("FAIL"), broken)
    assert failed.status == "FAIL" and failed.diagnosis.where == "not localised: ValueError: no layer pairs"


def test_the_report_shows_where_and_why_under_the_fail_and_the_json_keeps_the_parts(tmp_path):
    found = diagnosis.guarded(result("FAIL"), lambda: Diagnosis(
        "first at layer pool1", "likely cause [padding]: pool1 with padding='same'",
        [Part("conv1", 0.0, 1e-5), Part("pool1", float("inf"), 1e-5, note="output shape (8, 7, 7, 64)")], "layers"))
    table = format_table([found])
    assert "where: first at layer pool1" in table and "cause: likely cause [padding]" in table
    write_json(str(tmp_path / "report.json"), [found], {})
    again = read_json(str(tmp_path / "report.json"))[0].diagnosis
    assert [p.name for p in again.parts] == ["conv1", "pool1"] and again.parts[1].parts and not again.parts[0].parts


def test_the_moving_statistics_entries_are_tried_fewest_changes_first():
    variants = causes.moving_variants(momenta_differ=True, towers=2)
    assert [len(v.keys()) for v in variants] == sorted(len(v.keys()) for v in variants)
    assert {k for v in variants for k in v.keys()} == {"bn_momentum", "bessel", "replica_statistics"}
    assert all(not v.replica_zero for v in causes.moving_variants(momenta_differ=False, towers=1))


def test_an_entry_that_explains_nothing_says_what_was_tried():
    assert causes.unexplained(["epsilon", "epsilon", "momentum_parameterisation"]) == (
        "no known cause explains it (tried: epsilon, momentum_parameterisation)")
    assert causes.unexplained([]) == "no known cause explains it (no catalogue entry applies here)"


def test_the_closed_forms_are_tried_in_turn_and_their_tried_lists_joined_by_no_caller():
    ran = []

    def entry(line):
        return lambda: ran.append(line) or line
    assert causes.first_cause([entry(causes.unexplained(["regulariser_scale", "loss_scale"])),
                               entry(causes.unexplained(["label_smoothing"]))]) == (
        "no known cause explains it (tried: regulariser_scale, loss_scale, label_smoothing)")
    ran.clear()
    found = "likely cause [loss_scale]: the port's data term 2 times the original's"
    assert causes.first_cause([entry(found), entry(causes.unexplained(["label_smoothing"]))]) == found
    assert ran == [found]  # the first that names a cause ends the turn
