"""The linter: `ruff check` with the configuration in pyproject.toml passes on the whole checkout."""
import subprocess
import sys

from conftest import ROOT


def test_ruff_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]
