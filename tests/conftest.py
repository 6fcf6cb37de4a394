"""Test-wide settings: quiet TensorFlow, CPU only, and a helper for running the programs.

Each test module owns its own fixtures; shared, slow graphs are built once per module
(`scope="module"`).  The README's command runs the modules on two processes
(`-n 2 --dist loadfile`: a module's tests stay together, so its fixtures are built once).
TensorFlow processes started by tests are small: a few steps, tiny batches.

Under `-n N`, each test process's TensorFlow (and every program it starts, which inherits the
environment) gets its share of the cores for its intra-op thread pool, not all of them: two pools
of two threads on two cores compete for them and cost more CPU and wall time than they save.
`TF_NUM_INTRAOP_THREADS` set by the caller wins.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # set by pytest-xdist in its workers
if _workers > 1:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(max(1, _cores // _workers)))

ROOT = Path(__file__).resolve().parents[1]

# Two devices for the towers and replicas of the in-process tests, before TensorFlow's runtime starts
# (pytest loads this file before any test module).  Tests that need more run the programs in processes
# of their own.
from modern.runtime import DeviceSetupError, configure_devices  # noqa: E402  (after the environment above)

try:
    configure_devices(2)
except DeviceSetupError:
    pass


@pytest.fixture(scope="session", autouse=True)
def _data_autotune_off():
    """tf.data's autotuning off in the test processes, as the harness has it
    (`compare.common.data_autotune_off`): re-making an autotuned iterator can wait out its model
    thread's sleep, seconds to a minute.  Programs the tests start in processes of their own run as
    users run them."""
    from compare import common
    with common.data_autotune_off():
        yield


@pytest.fixture(scope="session", autouse=True)
def _blas_on_one_thread():
    """numpy's BLAS on one thread in the test processes, as in the harness's
    (`compare.common.blas_on_one_thread`): two test processes' TensorFlow pools already fill the cores."""
    from compare import common
    common.blas_on_one_thread()


def run_program(args, cwd=None, timeout=600):
    """Run `python <args...>` from the repository root (or `cwd`) and return the CompletedProcess.

    No PYTHONPATH: a program run as a file puts the repository root on sys.path itself (its
    `if __package__ in (None, "")` preamble), and `-m package.module` finds the packages in the
    repository root, the working directory.  stdout and stderr are captured as text.
    """
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=timeout)


# The slowest modules, slowest first (`--durations=0` ranks them), are handed out first, so that
# the two processes end close together; xdist's own order (most tests first) would hand out the
# one-test compare/run.py module last.  Any other module follows, in file order.
SLOWEST_FIRST = ("test_compare_cifar",   # the in-process harness and its planted defects
                 "test_readme",          # every README command, one process each
                 "test_legacy_cifar",    # two two-tower graphs, three program runs
                 "test_multiworker",     # five 2-worker clusters
                 "test_compare_towers",  # compare/run.py at 1 and 3 towers
                 "test_compare_mnist",
                 "test_example_tutorial",
                 "test_slim_compat")     # a subset of tf-slim's own tests


def pytest_configure(config):
    if getattr(config.option, "dist", "no") == "loadfile":
        config.option.loadscopereorder = False  # keep the order pytest_collection_modifyitems gives


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: each module keeps its order
