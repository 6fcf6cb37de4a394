"""Test-wide settings: quiet TensorFlow, CPU only, and a helper for running the programs.

Each test module owns its own fixtures; shared, slow graphs are built once per module
(`scope="module"`).  The README's command runs the modules on two processes
(`-n 2 --dist loadfile`: a module's tests stay together, so its fixtures are built once).
TensorFlow processes started by tests are small: a few steps, tiny batches.
"""
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

ROOT = Path(__file__).resolve().parents[1]


def run_program(args, cwd=None, timeout=600):
    """Run `python <args...>` from the repository root (or `cwd`) and return the CompletedProcess.

    No PYTHONPATH: a program run as a file puts the repository root on sys.path itself (its
    `if __package__ in (None, "")` preamble), and `-m package.module` finds the packages in the
    repository root, the working directory.  stdout and stderr are captured as text.
    """
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout)
