"""A harness check's work in a Python process of its own, started beside the others.

    started = process.start("compare.tf1_runtime", [in_path, out_path], log_path)
    ...                                       # the harness's other checks
    started.wait(timeout=900)                 # its exit code; its output is in log_path
    started.wait_limited("the TF1-runtime process of train.py")   # the same, within the run's limit

The module runs with this repository, the current folder and this process's own path on its path
(it finds the adapter modules the harness loaded where the harness found them), its output to a file
(a pipe nobody reads until the end can fill and stall it).
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass
class Started:
    """A module running in a process of its own, and the file its output goes to."""
    process: subprocess.Popen
    log_path: str

    def wait(self, timeout: float) -> int:
        """Its exit code, once it ends; a process past `timeout` seconds is stopped, then raises."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise

    def wait_limited(self, what: str) -> int:
        """Its exit code, given the run's limit from now as the phase `what` (compare.limits): past it,
        or where the process itself ran out of time, the run ends as the limit says."""
        from compare import limits
        return limits.wait(self.process, what, self.log_path)

    def stop(self) -> None:
        """End the process if it still runs (a run that ends before collecting it)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def last_line(self) -> str:
        with open(self.log_path) as log:
            lines = log.read().strip().splitlines()
        return lines[-1] if lines else ""


def start(module: str, argv: Sequence[str], log_path: str) -> Started:
    """`python -m module *argv` in this repository's root."""
    path = [ROOT, os.getcwd(), *(p for p in sys.path if p), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys(path)))
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", module, *argv], cwd=ROOT, env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
    from compare import limits
    limits.started(process)
    return Started(process, log_path)
