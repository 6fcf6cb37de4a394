"""What the harness's process sets up around the checks.

compare.common.data_autotune_off: every iterator made in it reads a dataset with autotuning off,
nested or not, and nothing after it does (the test processes run inside it: conftest.py).
compare.common.blas_on_one_thread: numpy's BLAS on one thread in every process of the harness.
compare.legacy_run.started_beside: the legacy session's first run in a thread beside the modern build."""
import threading

import pytest
import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops

from compare import common
from compare.legacy_run import started_beside

tf1 = tf.compat.v1


def _autotuned(dataset):
    """Whether an iterator made now of `dataset` would autotune (the options it is made with)."""
    return dataset._apply_debug_options().options().autotune.enabled is not False  # None: the default, on


def test_iterators_made_inside_do_not_autotune_and_outside_do(monkeypatch):
    dataset = tf.data.Dataset.range(4).map(lambda x: x + 1)
    assert not _autotuned(dataset), "the test processes run in it"
    cls = dataset_ops.DatasetV2
    monkeypatch.setattr(cls, "_apply_debug_options", cls._apply_debug_options.original)  # as outside it
    assert _autotuned(dataset)
    with common.data_autotune_off():
        assert not _autotuned(dataset)
        with common.data_autotune_off():
            assert not _autotuned(dataset)
        assert not _autotuned(dataset), "the inner context leaves the outer one in force"
        assert list(dataset.as_numpy_iterator()) == [1, 2, 3, 4]
        graph = tf.Graph()
        with graph.as_default():
            iterator = tf1.data.make_initializable_iterator(tf.data.Dataset.range(3))
        assert "OptionsDataset" in {op.type for op in graph.get_operations()}
        with tf1.Session(graph=graph) as sess:
            sess.run(iterator.initializer)
            assert sess.run(iterator.get_next()) == 0
    assert _autotuned(dataset)


class _Legacy:
    """A stand-in LegacyRun: start() records its thread, waits for the block, and may raise."""

    def __init__(self, fails=False):
        self.fails, self.thread, self.block_ran = fails, None, threading.Event()

    def start(self):
        self.thread = threading.current_thread().name
        assert self.block_ran.wait(10), "the block runs while start() does"
        if self.fails:
            raise RuntimeError("initializer failed")


def test_the_legacy_start_runs_beside_the_block_and_its_error_comes_after_it():
    legacy = _Legacy()
    with started_beside(legacy):
        legacy.block_ran.set()
    assert legacy.thread == "legacy-start"
    failing = _Legacy(fails=True)
    with pytest.raises(RuntimeError, match="initializer failed"):
        with started_beside(failing):
            failing.block_ran.set()


def test_every_harness_process_runs_numpys_blas_on_one_thread():
    """In a process of its own (the test processes already run on one): the installed numpy's BLAS is
    one threadpoolctl finds (else the limit would do nothing) and it runs on one thread after the call;
    each of the harness's entry points makes the call."""
    import ast
    import inspect
    from conftest import run_program
    from compare import flags_process, run, tf1_runtime
    done = run_program(["-c", "import threadpoolctl; from compare import common; common.blas_on_one_thread(); "
                              "print([i['num_threads'] for i in threadpoolctl.threadpool_info() "
                              "if i['user_api'] == 'blas'])"])
    assert done.returncode == 0, done.stderr
    threads = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert threads and set(threads) == {1}, threads
    for module in (run, flags_process, tf1_runtime):
        assert "common.blas_on_one_thread()" in inspect.getsource(module.main), module.__name__
