"""Every phase of the harness that runs a user's program, under one time limit.

    python compare/run.py ... --capture_seconds S          (default 600)

The phases, each with S seconds of its own: reading a program's flags (`compare.capture.parse_flags`),
each run of a program to its first training step (every build of it: each pairing's, the flags
check's, the TF1-runtime process's), an Estimator program's own evaluation, reading the TF1
program's input rows through its pipeline, waiting for the TF1-runtime process, and, in the flags
check's own process and in a pair judged in a process of its own, the same phases there.

Past its seconds, a phase ends the run: under compare/run.py (`configure(S, enforce=True)`) one line
on stderr names the phase and the program, every process the harness started is stopped, and the
process exits with status 2 at once (`os._exit`): a program that waits in TensorFlow's C++ (a queue
no runner feeds, inside its first Session.run) or in a thread of its own is not waited for, and
nothing of it is left running.  Elsewhere (a test, a library call) `OutOfTime` is raised in the main
thread, as soon as the program's Python runs again.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any, Iterator, Optional

SECONDS = 600.0  # a program that has not reached its first training step by then never will, for the harness
EXIT_STATUS = 2  # bad input: nothing is judged

_settings = {"seconds": SECONDS, "enforce": False}
_processes: list[Any] = []  # subprocess.Popen of every process the harness started, stopped when time is up


class OutOfTime(Exception):
    """A phase ran past its seconds (the message names the phase and the program, in one line): the
    run ends (compare/run.py: status 2); no check takes it as its own result."""


class TimedOut(BaseException):
    """Raised inside a program when its phase's seconds are up (`time_limit`): a BaseException, so that
    the program's own `except Exception` does not take it."""


def configure(seconds: float, enforce: bool = False) -> None:
    """Every phase's seconds from now on; enforce: past them, the process exits (see the module
    docstring) instead of raising OutOfTime."""
    _settings.update(seconds=float(seconds), enforce=bool(enforce))


@contextlib.contextmanager
def configured(seconds: float, enforce: bool = False) -> Iterator[None]:
    """`configure(seconds, enforce)` for the block, the settings before it put back after it (a run
    of compare/run.py's main in a process that goes on, a test's, leaves no limit behind)."""
    before = dict(_settings)
    configure(seconds, enforce)
    try:
        yield
    finally:
        _settings.update(before)


def seconds() -> float:
    return float(_settings["seconds"])


def enforced() -> bool:
    return bool(_settings["enforce"])


def started(process: Any) -> Any:
    """`process` (a subprocess.Popen) stopped along with this one when a phase runs out of time."""
    _processes.append(process)
    return process


def message(what: str, limit: float) -> str:
    return f"{what}: still running after {limit:g} s (--capture_seconds {limit:g}), stopped"


def out_of_time(line: str) -> None:
    """A phase is out of time: exit (enforced) or raise OutOfTime."""
    if enforced():
        stop_now(line)
    raise OutOfTime(line)


def stop_now(line: str) -> None:
    """One line on stderr, every process the harness started stopped, exit status 2, now."""
    try:
        print(f"error: {line}", file=sys.stderr, flush=True)
        for process in _processes:
            if process.poll() is None:
                process.kill()
        sys.stdout.flush()
    finally:
        os._exit(EXIT_STATUS)


@contextlib.contextmanager
def phase(what: str, limit: Optional[float] = None) -> Iterator[None]:
    """`what` (the phase and its program, e.g. "reading the flags of train.py") given `limit` seconds
    (default: `seconds()`); past them, `out_of_time`.  Enforced, a timer thread ends the process
    wherever the program waits; otherwise TimedOut is raised in the main thread (`time_limit`) and
    becomes OutOfTime here (off the main thread, no limit)."""
    limit = seconds() if limit is None else float(limit)
    line = message(what, limit)
    if enforced():
        timer = threading.Timer(limit, stop_now, args=(line,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
        return
    try:
        with time_limit(limit):
            yield
    except TimedOut:
        raise OutOfTime(line) from None


@contextlib.contextmanager
def time_limit(limit: float) -> Iterator[None]:
    """TimedOut raised in the main thread after `limit` seconds (no limit off the main thread); a limit
    inside another leaves the outer one running."""
    if threading.current_thread() is not threading.main_thread() or limit <= 0:
        yield
        return

    def expire(*_: Any) -> None:
        raise TimedOut()

    before = signal.signal(signal.SIGALRM, expire)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, limit)
    begun = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        if outer > 0:  # a phase around this one: its own timer goes on, less the time spent here
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - begun), 1e-3))


def wait(process: Any, what: str, log_path: Optional[str] = None) -> int:
    """The exit status of `process` (a subprocess.Popen the harness started), given `seconds()` from
    now as the phase `what`; a process that ran out of time of its own (its last line says so, as
    `stop_now` writes it) ends this one the same way."""
    import subprocess
    try:
        code = process.wait(timeout=seconds())
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        out_of_time(message(what, seconds()))
        raise  # out_of_time raised or exited; for the type checker
    if code == EXIT_STATUS and log_path:
        line = own_line(log_path)
        if line:
            out_of_time(line)
    return code


def own_line(log_path: str) -> Optional[str]:
    """The out-of-time line a process of the harness's wrote last in its log, if it wrote one."""
    try:
        with open(log_path) as log:
            lines = [line.strip() for line in log if line.startswith("error: ") and "still running after" in line]
    except OSError:
        return None
    return lines[-1][len("error: "):] if lines else None
