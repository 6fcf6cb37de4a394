"""Start a multi-worker cluster of a modern trainer on this host, one process per worker.

    python -m modern.launch --workers 2 -- modern/mnist_multi_gpu.py --training_steps 200
    python -m modern.launch --workers 2 --replicas_per_worker 4 -- modern/cifar_resnet.py   # a GPU host

Each worker is `python <program> <args> --towers <replicas_per_worker>` with its own
TF_CONFIG (the standard cluster spec + task, see `modern/cluster.py`), every address on a free
127.0.0.1 port.  Each worker's output lines are printed prefixed `[worker i] `.  Ctrl-C (SIGINT)
and SIGTERM are passed on to every worker (SIGTERM: the workers save a preemption checkpoint and
exit 42); when a worker exits with an error, the others are stopped (SIGTERM, then SIGKILL after
--grace seconds) and the launcher exits 1 naming it.  No worker outlives the launcher.

On separate machines there is no launcher: run the same trainer on each host with its own
TF_CONFIG (README, "Beyond one machine").
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any, Callable, Optional, Sequence

from records.usage import ArgumentParser, at_least

PREEMPTED_EXIT_CODE = 42  # modern.cluster.PREEMPTED_EXIT_CODE (not imported: that imports TensorFlow)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n\n")[0],
                       usage="python -m modern.launch [options] -- PROGRAM [ARGS ...]")
    p.add_argument("--workers", type=at_least(1), default=2, help="worker processes")
    p.add_argument("--replicas_per_worker", type=at_least(1), default=1,
                   help="passed as the program's --towers: GPUs per worker (CPU-only workers: 1)")
    p.add_argument("--grace", type=at_least(0.0, float), default=10.0,
                   help="seconds a stopped worker gets to exit before SIGKILL")
    p.add_argument("--timeout", type=at_least(0.0, float), default=None,
                   help="stop every worker after this many seconds, e.g. when one never reaches the "
                        "others (default: no limit)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- PROGRAM [ARGS ...]")
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("give the program after --, e.g. -- modern/mnist_multi_gpu.py")
    given = [flag for flag in ("--towers", "--num_replicas") if flag in args.command]
    if given:
        p.error(f"{given[0]} is set by --replicas_per_worker; leave it out of the program's arguments")
    return args


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1 (held together while chosen, then released)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_config(addresses: Sequence[str], index: int) -> str:
    return json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})


def _print(line: str) -> None:
    sys.stdout.write(line)
    sys.stdout.flush()


def _relay(index: int, stream: IO[str], lock: threading.Lock, output: Callable[[str], Any]) -> None:
    for line in iter(stream.readline, ""):
        with lock:
            output(f"[worker {index}] {line}")
    stream.close()


def _describe(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def launch(command: Sequence[str], workers: int, replicas_per_worker: int = 1, grace: float = 10.0,
           log: Callable[[str], Any] = print, output: Callable[[str], Any] = _print,
           timeout: Optional[float] = None) -> int:
    """Run the cluster to its end; return the launcher's exit code (0, 1, 42, or 130 on Ctrl-C).

    command: [program.py or -m module, args...]; output(line) gets each worker's prefixed lines;
    timeout: seconds after which every worker is stopped and the launcher returns 1.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    addresses = [f"127.0.0.1:{port}" for port in free_ports(workers)]
    program = [sys.executable, *command]  # a file (modern/mnist_multi_gpu.py) or -m module
    lock = threading.Lock()
    procs: list[subprocess.Popen[str]] = []
    relays: list[threading.Thread] = []
    received = []  # signals the launcher got (Ctrl-C, SIGTERM)

    def forward(signum, frame):
        received.append(signum)
        for p in procs:
            if p.poll() is None:
                _kill_group(p, signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for i in range(workers):
            env = dict(os.environ, TF_CONFIG=tf_config(addresses, i), PYTHONUNBUFFERED="1")
            p = subprocess.Popen([*program, "--towers", str(replicas_per_worker)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)  # its own group: signals go where we send them
            procs.append(p)
            t = threading.Thread(target=_relay, args=(i, p.stdout, lock, output), daemon=True)
            t.start()
            relays.append(t)
            log(f"[launch] worker {i}: pid {p.pid}, {addresses[i]}")
        failed = None
        while [p.poll() for p in procs].count(None):  # poll every worker: it sets returncode
            failed = next(((i, p.returncode) for i, p in enumerate(procs)
                           if p.returncode not in (None, 0, PREEMPTED_EXIT_CODE)), None)
            if failed and not received:
                break
            if deadline is not None and time.monotonic() > deadline:
                log(f"[launch] the workers did not finish within {timeout} s; stopping them")
                _stop(procs, grace)
                return 1
            time.sleep(0.1)
        if failed and not received:
            i, code = failed
            log(f"[launch] worker {i} {_describe(code)}; stopping the other workers")
            _stop(procs, grace)
            return 1
        _stop(procs, grace)  # after a forwarded signal: whoever still runs after the grace
        codes = [p.returncode for p in procs]
        if signal.SIGINT in received:
            log("[launch] interrupted (Ctrl-C): every worker stopped")
            return 130
        if all(c == PREEMPTED_EXIT_CODE for c in codes):
            log(f"[launch] preempted: every worker saved a checkpoint and exited {PREEMPTED_EXIT_CODE}; "
                f"run the same command again to resume")
            return PREEMPTED_EXIT_CODE
        bad = [f"worker {i} {_describe(c)}" for i, c in enumerate(codes) if c != 0]
        if bad:
            log(f"[launch] {'; '.join(bad)}")
            return 1
        log(f"[launch] all {workers} workers finished")
        return 0
    finally:
        _stop(procs, 0)  # nothing left behind, whatever happened above
        for t in relays:
            t.join(timeout=5)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop(procs: Sequence[subprocess.Popen[str]], grace: float) -> None:
    """SIGTERM every running worker's process group, wait up to `grace` s, then SIGKILL the rest."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        _kill_group(p, signal.SIGTERM if grace > 0 else signal.SIGKILL)
    deadline = time.monotonic() + grace
    for p in running:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.poll() is None:
            _kill_group(p, signal.SIGKILL)
            p.wait(timeout=30)


def _kill_group(p: subprocess.Popen[str], signum: int) -> None:
    try:
        os.killpg(p.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    return launch(args.command, args.workers, args.replicas_per_worker, args.grace, timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())
