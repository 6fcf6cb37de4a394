"""benchmarks/harness.py, the harness's side-by-side timer, on two stand-in checkouts whose
`compare/run.py` only prints a summary line and exits: each checkout runs its own file with its own
root on PYTHONPATH, the order alternates, a crashed run is left out of the median.  No timing is
asserted (a shared machine gives any speed)."""
import re

import pytest

from conftest import run_program

STAND_IN = '''import json, os, sys
import marker  # from this checkout's root, through PYTHONPATH
print("noise")
print(f"{marker.NAME}: 3 PASS, 0 EXPECTED, 0 NOT APPLICABLE, {marker.FAILS} FAIL; run time 0.1 s", sys.argv[1:])
count = os.path.join(os.path.dirname(marker.__file__), "runs")
runs = int(open(count).read()) + 1 if os.path.exists(count) else 1
open(count, "w").write(str(runs))
if "--report" in sys.argv:  # the status of "flaky" is the next of marker.FLAKY at each run
    flaky = marker.FLAKY[(runs - 1) % len(marker.FLAKY)]
    with open(sys.argv[sys.argv.index("--report") + 1], "w") as f:
        json.dump({"results": [{"model": "m", "check": "steady", "status": "PASS"},
                               {"model": "m", "check": "flaky", "status": flaky}]}, f)
sys.exit(marker.CODE)
'''


def _checkout(root, name, code, fails=0, flaky=("PASS",)):
    (root / "compare").mkdir(parents=True)
    (root / "compare" / "run.py").write_text(STAND_IN)
    (root / "marker.py").write_text(f"NAME = {name!r}\nCODE = {code}\nFAILS = {fails}\nFLAKY = {flaky!r}\n")
    return root


def test_two_checkouts_alternate_and_each_runs_its_own_code(tmp_path):
    a = _checkout(tmp_path / "a", "A", 0)
    b = _checkout(tmp_path / "b", "B", 1, fails=1)
    proc = run_program(["benchmarks/harness.py", "--checkout", a, "--checkout", b, "--repeats", "2", "--",
                        "--quick"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = re.findall(r"\[run (\d)/2\] (\S+): [\d.]+ s, exit (\d): (\w):", proc.stdout)
    assert [folder for _, folder, _, _ in runs] == [str(a), str(b), str(b), str(a)], runs  # A B, then B A
    assert {(folder, code, name) for _, folder, code, name in runs} == {(str(a), "0", "A"), (str(b), "1", "B")}
    assert "['--quick', '--report'" in proc.stdout  # the arguments, then a report of the benchmark's own
    table = proc.stdout.split("median of 2")[1]
    assert str(a) in table and str(b) in table and "n/a" not in table  # a FAIL (exit 1) is still a run
    assert "every check had the same status in every run" in proc.stdout


def test_a_check_whose_status_changes_between_runs_is_named_with_the_runs(tmp_path):
    """The same code on the same data must give the same verdicts: a status that differs between runs
    is listed, each status with the runs that gave it."""
    a = _checkout(tmp_path / "a", "A", 0, flaky=("PASS", "NOT APPLICABLE"))
    proc = run_program(["benchmarks/harness.py", "--checkout", a, "--repeats", "3", "--", "--quick"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = proc.stdout.split("statuses that differed between runs:")[1].strip().splitlines()
    assert listed[0] == f"m: flaky: PASS in 2 ({a} run 1, {a} run 3); NOT APPLICABLE in 1 ({a} run 2)", listed
    assert "steady" not in proc.stdout.split("statuses that differed")[1]


def test_a_crashed_run_is_left_out_and_the_exit_code_says_so(tmp_path):
    crashed = _checkout(tmp_path / "c", "C", 2)
    proc = run_program(["benchmarks/harness.py", "--checkout", crashed, "--repeats", "1"], timeout=120)
    assert proc.returncode == 1
    assert "exit 2" in proc.stdout and "no run finished" in proc.stdout


@pytest.mark.parametrize("argv, message", [(["--repeats", "0"], "at least 1"),
                                           (["--checkout", "/nonexistent"], "no compare/run.py")])
def test_bad_arguments_are_refused(argv, message):
    proc = run_program(["benchmarks/harness.py", *argv], timeout=60)
    assert proc.returncode == 2 and message in proc.stderr
