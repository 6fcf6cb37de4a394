"""Every phase that runs a user's program under one time limit (compare/limits.py, --capture_seconds).

From the command line, a program that waits (at its top level, before its port's first step, inside
its first Session.run on a queue nothing feeds, in C++) ends the run past its seconds with one line
naming the phase and the program, exit status 2, and nothing of it left running; in-process, the
phase raises OutOfTime; a pair judged in a process of its own that ran out of time ends its parent
the same way.
"""
import subprocess
import sys
import textwrap
import time

import pytest

from compare import limits
from conftest import ROOT

STEP_FLAGS = ROOT / "tests" / "tf1_programs" / "step_flags"
FLAGS = textwrap.dedent("""\
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--num_gpus", type=int, default=1)
    p.add_argument("--data_dir")
    args = p.parse_args()
    """)
WAITS = {
    "top": ("import time\nwhile True:\n    time.sleep(1)\n", "reading the flags of {}"),
    "session": (FLAGS + textwrap.dedent("""\
        import tensorflow as tf
        queue = tf.FIFOQueue(4, tf.float32, shapes=[[]])
        with tf.Session() as sess:
            sess.run(queue.dequeue())
        """), "running {} to its first training Session.run"),
}


def write(tmp_path, name, body):
    path = tmp_path / f"{name}.py"
    path.write_text(body)
    return str(path)


def run_cli(legacy, modern, tmp_path):
    begun = time.time()
    done = subprocess.run([sys.executable, str(ROOT / "compare" / "run.py"), "--legacy", legacy, "--modern", modern,
                           "--quick", "--capture_seconds", "3", "--", "--data_dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    return done, time.time() - begun


def left_running(path):
    listed = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in listed.splitlines() if path in line and "ps -eo" not in line]


@pytest.mark.parametrize("which", sorted(WAITS))
def test_a_tf1_program_that_waits_ends_the_run_in_one_line_exit_2(tmp_path, which):
    body, phase = WAITS[which]
    legacy = write(tmp_path, f"waits_{which}", body)
    done, seconds = run_cli(legacy, str(STEP_FLAGS / "port.py"), tmp_path)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {phase.format(legacy)}: still running after 3 s (--capture_seconds 3), stopped"], \
        done.stderr[-2000:]
    assert "Traceback" not in done.stderr and seconds < 60
    assert left_running(legacy) == []


def test_a_port_that_waits_before_its_first_step_ends_the_run_in_one_line_exit_2(tmp_path):
    port = write(tmp_path, "port_waits", FLAGS + textwrap.dedent("""\
        import threading
        threading.Thread(target=threading.Event().wait).start()  # a thread of its own, never ending
        threading.Event().wait()
        """))
    import numpy as np
    rng = np.random.RandomState(0)
    np.savez(tmp_path / "train.npz", images=rng.uniform(-1, 1, (32, 8, 8, 1)).astype(np.float32),
             labels=rng.randint(0, 10, 32).astype(np.int32))
    done, seconds = run_cli(str(STEP_FLAGS / "train_tf1.py"), port, tmp_path)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: running the port {port} to its first training step: still running after 3 s "
                      f"(--capture_seconds 3), stopped"], done.stderr[-2000:]
    assert seconds < 60 and left_running(port) == []


def test_in_process_a_phase_past_its_seconds_raises_out_of_time(tmp_path):
    from compare.capture import parse_flags
    program = write(tmp_path, "waits", WAITS["top"][0])
    limits.configure(1)
    try:
        with pytest.raises(limits.OutOfTime, match=r"^reading the flags of .*waits\.py: still running after 1 s"):
            parse_flags(program, [])
    finally:
        limits.configure(limits.SECONDS)


def test_a_pair_in_a_process_of_its_own_that_ran_out_of_time_ends_its_parent(tmp_path):
    """compare/run.py's children (the pairs beside the first) run with the same limit; one that
    stopped past it (exit 2, its line) stops the parent with its line, naming the pair."""
    from compare import run
    line = "reading the flags of their.py: still running after 3 s (--capture_seconds 3), stopped"
    child = run.spawn("their.adapter", [sys.executable, "-c", f"import sys; print('error: {line}'); sys.exit(2)"],
                      str(tmp_path / "none.json"))
    with pytest.raises(limits.OutOfTime, match=r"still running after 3 s .*\(the pair their.adapter, in a process"):
        run.finish_child(child)


def test_a_phase_inside_another_leaves_the_outer_limit_running():
    """The inner phase ends in time; the outer one's seconds still run out (the inner one's cleanup
    does not cancel them)."""
    begun = time.monotonic()
    with pytest.raises(limits.OutOfTime, match="outer"):
        with limits.phase("outer", 0.6):
            with limits.phase("inner", 5):
                pass
            time.sleep(3)
    assert time.monotonic() - begun < 2


def test_run_main_leaves_no_limit_behind(monkeypatch):
    """compare/run.py's main in a process that goes on (a test's) puts the limit settings back: the
    process does not exit in a later phase."""
    from compare import run
    monkeypatch.setattr(run, "judge", lambda args: (limits.enforced(), limits.seconds()))
    assert run.main(["--quick", "--capture_seconds", "7"]) == (True, 7.0)
    assert (limits.enforced(), limits.seconds()) == (False, limits.SECONDS)
