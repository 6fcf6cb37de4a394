"""How long the parity harness takes: `compare/run.py` from one or more checkouts, side by side.

Run it (from the repository root):

    python benchmarks/harness.py -- --quick                        # this checkout, 3 runs
    python benchmarks/harness.py --checkout . --checkout /tmp/main -- --quick     # beside another
    python benchmarks/harness.py --checkout . --checkout /tmp/main --repeats 1 --  # the default run

The arguments after `--` go to every `compare/run.py`.  Each checkout runs its own `compare/run.py`
with its own root first on PYTHONPATH (an editable install of another checkout does not leak in);
the runs alternate between the checkouts (A B A B ...), so that a machine's slow minutes fall on
both.  Each run prints its wall time and the harness's own summary line (the statuses and its run
time); the table gives each checkout's median and every run.  A run that exits other than 0 or 1
(1: a check FAILed) is reported and left out of the median.  Each run also writes its JSON report
(unless the arguments name one), and the end lists every check whose status was not the same in
every run that made it: the judge on the same code and data must give the same verdicts.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv: Optional[Sequence[str]] = None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--checkout", action="append", default=[],
                   help="a checkout (a folder with compare/run.py) to time; repeatable (default: this one)")
    p.add_argument("--repeats", type=int, default=3, help="runs per checkout")
    args = p.parse_args(argv[:cut])
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    for folder in args.checkout:
        if not os.path.isfile(os.path.join(folder, "compare", "run.py")):
            p.error(f"--checkout {folder}: no compare/run.py there")
    return args, argv[cut + 1:]


def summary(output: str) -> str:
    """The harness's own summary line ("N PASS, ... FAIL; run time T s"), or its last line."""
    lines = [line for line in output.splitlines() if line.strip()]
    found = [line for line in lines if "PASS," in line and "run time" in line]
    return (found or lines or [""])[-1].strip()


def run_once(folder: str, run_argv: Sequence[str], report: Optional[str] = None) -> tuple[float, int, str]:
    """(wall seconds, exit code, summary line) of one `compare/run.py` in `folder`, writing its JSON
    report to `report` where given."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([folder, os.environ.get("PYTHONPATH", "")]))
    argv = [*run_argv, "--report", report] if report else list(run_argv)
    start = time.time()
    done = subprocess.run([sys.executable, os.path.join(folder, "compare", "run.py"), *argv], cwd=folder,
                          env=env, capture_output=True, text=True)
    return time.time() - start, done.returncode, summary(done.stdout + done.stderr)


def statuses(report: str) -> dict[str, str]:
    """{"model: check": status} of a run's JSON report ({} where it wrote none)."""
    try:
        with open(report) as f:
            return {f"{r['model']}: {r['check']}": r["status"] for r in json.load(f)["results"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def differing(runs: Sequence[tuple[str, dict[str, str]]]) -> list[str]:
    """A line per check whose status differs between the runs that made it: each status, in how many
    runs and which."""
    lines = []
    for check in dict.fromkeys(c for _, found in runs for c in found):
        by_status: dict[str, list[str]] = collections.defaultdict(list)
        for label, found in runs:
            if check in found:
                by_status[found[check]].append(label)
        if len(by_status) > 1:
            lines.append(f"  {check}: " + "; ".join(f"{status} in {len(labels)} ({', '.join(labels)})"
                                                     for status, labels in by_status.items()))
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, run_argv = parse_args(argv)
    folders = [os.path.abspath(f) for f in args.checkout] or [ROOT]
    walls: dict[str, list[float]] = {f: [] for f in folders}
    reports = None if "--report" in run_argv else tempfile.mkdtemp(prefix="harness_bench_")
    verdicts: list[tuple[str, dict[str, str]]] = []
    for k in range(args.repeats):
        for i, folder in (enumerate(folders) if k % 2 == 0 else reversed(list(enumerate(folders)))):
            report = os.path.join(reports, f"run{k + 1}_checkout{i + 1}.json") if reports else None
            wall, code, line = run_once(folder, run_argv, report)
            print(f"[run {k + 1}/{args.repeats}] {folder}: {wall:.1f} s, exit {code}: {line}", flush=True)
            if code in (0, 1):
                walls[folder].append(wall)
            if report:
                verdicts.append((f"{folder} run {k + 1}", statuses(report)))
    print(f"\ncompare/run.py {' '.join(run_argv) or '(its defaults)'}: wall seconds, median of {args.repeats} "
          f"(each run)")
    for folder, times in walls.items():
        median = f"{statistics.median(times):7.1f}" if times else "    n/a"
        print(f"  {median}  {folder}  ({', '.join(f'{t:.1f}' for t in times) or 'no run finished'})")
    if reports:
        lines = differing([v for v in verdicts if v[1]])
        print("\nstatuses that differed between runs:" if lines else
              f"\nevery check had the same status in every run (reports in {reports})")
        for line in lines:
            print(line)
        if lines:
            print(f"(reports in {reports})")
    return 0 if all(walls.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
