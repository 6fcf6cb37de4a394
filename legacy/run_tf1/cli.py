"""The command line: `python -m legacy.run_tf1` and `legacy-run-tf1` (run a program, or `--report` it)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from legacy.run_tf1.environment import run_program
from legacy.run_tf1.log import PREFIX, stderr_log
from legacy.run_tf1.scan import format_report, format_tree, report, report_tree
from legacy.run_tf1.upgrade import ProgramError, UpgradeError
from records.usage import ArgumentParser, at_least

DESCRIPTION = "Run a user's TF1 multi-GPU tower program, unmodified, on TensorFlow 2.21."
EPILOG = ("Before the program runs: TensorFlow's upgrader rewrites `import tensorflow as tf` to "
          "`tensorflow.compat.v1` in the program and the modules of its folder, in memory (nothing is written); "
          "TF1 behaviour is on; tf.contrib names get their maintained homes (tf-slim, tf.compat.v1.data, ...); "
          "a tower on /gpu:N without that GPU runs on the virtual CPU device /cpu:N. Exit status: the program's "
          "own (0 when it ends, n for sys.exit(n)), 1 when it raises, 2 when PROGRAM.py is not a Python file; "
          "--report: 0 when every name maps, 1 when some cannot. Guide: docs/running-your-own-tf1-program.md")


def parse_args(argv: Optional[Sequence[str]]) -> Any:
    """The runner's options, the program's path, and the program's own arguments."""
    p = ArgumentParser(prog="python -m legacy.run_tf1", description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("--report", action="store_true",
                   help="list what would be mapped and what cannot, without running the program; "
                        "exit status 1 when some name cannot")
    p.add_argument("--report-tree", action="store_true",
                   help="PROGRAM.py is a folder: --report every program under it (a file with a __main__ guard or "
                        "app.run()) and print one Markdown table of the tf.contrib names they use, how many programs "
                        "use each, and where each maps or why it cannot; exit status 1 when some cannot")
    p.add_argument("--gpus", type=at_least(0), default=None, metavar="N",
                   help="the GPUs to treat as present (default: the machine's): /gpu:K with K >= N runs on /cpu:K")
    p.add_argument("--virtual-gpus", type=at_least(0), default=0, metavar="N",
                   help="the GPUs the program's GPU queries report (device_lib.list_local_devices, "
                        "tf.test.is_gpu_available) and a MirroredStrategy without devices mirrors over: the "
                        "machine's, then virtual ones on the CPU devices of their indices (default 0: the machine's)")
    p.add_argument("program", metavar="PROGRAM.py", help="the TF1 program's .py file")
    p.add_argument("args", nargs="...", help="the program's own arguments")
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m legacy.run_tf1` and `legacy-run-tf1`: run or report; returns the exit status."""
    args = parse_args(argv)
    try:
        if args.report_tree:
            tree = report_tree(args.program, log=stderr_log)
            print("\n".join(format_tree(tree)), flush=True)
            return 1 if any(use.reason for use, _ in tree.contrib.values()) else 0
        if args.report:
            result = report(args.program, args.gpus)
            print("\n".join(format_report(result)), flush=True)
            return 1 if result.cannot else 0
        return run_program(args.program, args.args, log=stderr_log, gpus=args.gpus, virtual_gpus=args.virtual_gpus)
    except (ProgramError, UpgradeError) as error:
        stderr_log(f"{PREFIX}: {error}")
        return 2


