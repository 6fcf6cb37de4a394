"""The parity harness's command line: judge a TF1 tower program against its TF2 port, tensor by tensor.

Run it (from the repository root):

    python compare/run.py                         # this repository's two pairs, 2 towers vs 2 replicas
    python compare/run.py --towers 3              # any tower count
    python compare/run.py --quick                 # fewer steps, no second CIFAR graph, no flags check, no TF1 runtime
    python compare/run.py --quick --profile       # and where the time went, phase by phase
    python compare/run.py --model cifar --only splits,steps --towers 4
    python compare/run.py --model cifar --checkpoint models/temporary --report reports/parity.json \\
        --plot reports/parity.png
    python compare/run.py --pair examples.cifar10_tutorial.adapter   # a pair written in another style
    python compare/run.py --pair my_package.my_adapter               # your own TF1 program and port
    python compare/run.py --program modern_cifar=my_package.my_trainer   # another module in a seed pair's role
    python compare/run.py --legacy train_tf1.py --modern train_tf2.py -- --data_dir data --batch_size 16
                                                  # two programs, no adapter: both captured as they run

A pair is judged through its adapter module (compare/interface.py; docs/judging-your-own-port.md):
the harness builds both programs with their own code, gives them the same start and the same rows,
and runs the generic checks of compare/checks/ (configuration and what it builds, variables,
checkpoint round trip, input pipelines and their shuffles over two epochs, every shared flag at
another value, inference, dropout, training forward pass and gradients, batch splits,
restart-per-step training across the learning-rate schedule with each side's optimizer against its
own rule, batch-norm moving statistics, moving averages, free-running trajectories against the
measured chaos floor, the training checks again from a trained state, evaluation, the legacy graph
on TF1's runtime) and the pair's own.  Each check ends PASS, FAIL, EXPECTED (a known TF1/TF2 difference whose predicted
value held) or NOT APPLICABLE (the pair has nothing it could judge; never a PASS).  The exit status
is 0 when no check FAILs, 1 otherwise, 2 on bad input (nothing is judged).  With several pairs, the
later ones run in processes of their own, beside the first, their results read back from JSON.
"""
import argparse
import dataclasses
import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Optional, Sequence


from compare import report
from compare.interface import GROUPS
from compare.report import Result
from records.usage import ArgumentParser, at_least

# --model names this repository's pairs by their adapters.
SEED_PAIRS = {"cifar": "compare.pairs.cifar_resnet", "mnist": "compare.pairs.mnist_multi_gpu"}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("cifar", "mnist", "all"), default=None,
                   help="this repository's pairs: cifar, mnist, or all (default: all without --pair, none with it)")
    p.add_argument("--pair", action="append", default=[], metavar="MODULE",
                   help="judge the pair of this adapter module (a dotted name, importable from the current "
                        "folder or installed; compare/interface.py); repeatable")
    p.add_argument("--towers", type=at_least(1), default=2, metavar="N", help="legacy towers = modern replicas")
    p.add_argument("--steps", type=at_least(1), default=None,
                   help="restart-per-step training steps across the learning-rate schedule (default: 6; 2 "
                        "with --quick)")
    p.add_argument("--free_steps", type=at_least(0), default=None,
                   help="free-running and moving-average steps (default: the pair's; CIFAR 20, MNIST 10; "
                        "with --quick 0 and 4)")
    p.add_argument("--quick", action="store_true",
                   help="fewer steps, no pairing marked slow (the CIFAR --split=weighted graph), no flags "
                        "check, no TF1-runtime process; still the full models")
    p.add_argument("--checkpoint", default=None,
                   help="start from this TF1 checkpoint of the legacy program (a file prefix or a folder) "
                        "(default: fresh weights); with --model all it applies to CIFAR")
    p.add_argument("--only", default=None,
                   help=f"check groups to run, comma-separated ({', '.join(GROUPS)}) (default: all)")
    p.add_argument("--tf1_repeats", type=at_least(1), default=1,
                   help="run the TF1-runtime step this many times from the same state (each run its own "
                        "interleaving of the towers' unlocked moving-statistics updates)")
    p.add_argument("--workers", type=at_least(1), default=1,
                   help="also check N workers x 1 replica against 1 x N and the legacy N towers "
                        "(compare/multiworker.py), N >= 2")
    p.add_argument("--seed", type=int, default=0, help="seed of the harness's rows and start weights")
    p.add_argument("--profile", action="store_true",
                   help="after the report, where this process's time went: each phase its progress lines name "
                        "(building each side, deriving the tolerances, each group of checks), in seconds, slowest "
                        "first (pairs judged in processes of their own: run them alone with --pair)")
    p.add_argument("--report", default=None, help="write the JSON report here (default: none)")
    p.add_argument("--plot", default=None, help="write a PNG chart here, with matplotlib (default: none)")
    p.add_argument("--program", action="append", default=[], metavar="ROLE=MODULE",
                   help="judge MODULE (a dotted name) in ROLE of this repository's pairs instead of the program "
                        "there (roles: legacy_cifar, modern_cifar, legacy_mnist, legacy_mnist_eval, "
                        "modern_mnist; compare/programs.py); repeatable")
    p.add_argument("--legacy", default=None, metavar="PROGRAM.py",
                   help="a TF1 program to judge against --modern with no adapter: both run unmodified to their "
                        "first training step and are captured there (compare/pairs/captured.py); the arguments "
                        "after -- go to both")
    p.add_argument("--modern", default=None, metavar="PROGRAM.py", help="the TF2 port of --legacy")
    p.add_argument("--tower_flag", default=None, metavar="NAME",
                   help="--legacy's flag for its tower count (default: the first it parses of "
                        "num_gpus, num_towers, num_replicas, num_clones, ...)")
    p.add_argument("--replica_flag", default=None, metavar="NAME",
                   help="--modern's flag for its replica count (default: found as --tower_flag is)")
    p.add_argument("--loop", action="append", default=[], metavar="FLAG",
                   help="with --legacy/--modern: a flag both accept that only their training loop reads (a step "
                        "limit, a log interval), which the flags check then reports instead of judging; repeatable")
    p.add_argument("--legacy_arg", action="append", default=[], metavar="ARG",
                   help="with --legacy/--modern: an argument for the TF1 program alone (--legacy_arg=--flag=value); "
                        "repeatable")
    p.add_argument("--modern_arg", action="append", default=[], metavar="ARG",
                   help="with --legacy/--modern: an argument for the port alone (--modern_arg=--flag=value); "
                        "repeatable")
    p.add_argument("--capture_seconds", type=at_least(1), default=600, metavar="S",
                   help="the seconds of each phase that runs a program: reading its flags, each run of it to its "
                        "first training step, its own evaluation, reading its input rows, the TF1-runtime process; "
                        "past them one line names the phase and the program, and the run exits with status 2 "
                        "(compare/limits.py) (default: 600)")
    argv = list(sys.argv[1:] if argv is None else argv)
    both = argv[argv.index("--") + 1:] if "--" in argv else []
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.both = both
    if (args.legacy is None) != (args.modern is None):
        p.error("--legacy and --modern go together: the TF1 program and its port")
    if args.legacy is not None:
        for program in (args.legacy, args.modern):
            if not (program.endswith(".py") and os.path.isfile(program)):
                p.error(f"{program}: not a Python file")
        if args.model or args.pair or args.program:
            p.error("--legacy/--modern judge two programs alone: no --model, --pair or --program beside them")
    elif both or args.tower_flag or args.replica_flag or args.loop or args.legacy_arg or args.modern_arg:
        p.error("arguments after --, --tower_flag, --replica_flag, --loop, --legacy_arg and --modern_arg go with "
                "--legacy/--modern")
    args.programs = {}
    for spec in args.program:
        role, _, module = spec.partition("=")
        if not module:
            p.error(f"--program {spec}: expected ROLE=MODULE, e.g. modern_cifar=my_package.my_trainer")
        args.programs[role] = module
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # now, not after the run
        p.error("--plot needs matplotlib: pip install matplotlib (or, in this repository, pip install -e '.[plot]')")
    if args.only is not None:
        args.only = tuple(g.strip() for g in args.only.split(","))
        unknown = [g for g in args.only if g not in GROUPS]
        if unknown:
            p.error(f"--only: unknown group(s) {', '.join(unknown)}; choose from {', '.join(GROUPS)}")
    if args.model is None and not args.pair and args.legacy is None:
        args.model = "all"
    args.pairs = ([SEED_PAIRS[m] for m in (("cifar", "mnist") if args.model == "all" else (args.model,))]
                  if args.model else []) + list(args.pair)
    if args.checkpoint:
        args.checkpoint = checkpoint_path(p, args.checkpoint)
    return args


def checkpoint_path(parser: argparse.ArgumentParser, path: str) -> str:
    """A TF1 checkpoint's prefix, from a prefix or a folder; a parser error when it is none."""
    import tensorflow as tf
    if os.path.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            parser.error(f"--checkpoint {path}: a folder without a TF1 'checkpoint' file")
        path = latest
    if not os.path.exists(path + ".index"):
        parser.error(f"--checkpoint {path}: no TF1 checkpoint there (expected {path}.index)")
    try:
        tf.train.list_variables(path)
    except (tf.errors.OpError, ValueError) as e:
        parser.error(f"--checkpoint {path}: not a readable TF1 checkpoint ({str(e).strip().splitlines()[0][:120]})")
    return path


def child_argv(module: str, args: argparse.Namespace, report_path: str) -> list[str]:
    """`compare/run.py --pair MODULE` with the same settings, for a pair judged in its own process."""
    argv = [sys.executable, os.path.abspath(__file__), "--pair", module, "--towers", str(args.towers),
            "--seed", str(args.seed), "--report", report_path]
    argv += ["--quick"] if args.quick else []
    argv += ["--steps", str(args.steps)] if args.steps else []
    argv += ["--free_steps", str(args.free_steps)] if args.free_steps is not None else []
    argv += ["--only", ",".join(args.only)] if args.only else []
    argv += ["--tf1_repeats", str(args.tf1_repeats), "--capture_seconds", str(args.capture_seconds)]
    argv += [f"--program={spec}" for spec in args.program]
    return argv


@dataclasses.dataclass
class Child:
    """A pair judged in a process of its own: its output so far, and where its report will be."""
    name: str
    process: subprocess.Popen
    reader: threading.Thread
    output: list[str]
    report_path: str


# A pair judged in a process of its own, where the first pair's checks start no process of their
# own, runs this much nicer than the first pair's: it takes the cores the first pair's work leaves
# idle (its Python holds one core at a time, most of its run) rather than slowing that work down.
# Where they do (the flags and TF1-runtime checks), the machine is full, and a pair at a lower
# priority only takes longer: it keeps its priority.
CHILD_NICENESS = 19
OWN_PROCESSES = frozenset({"flags", "tf1"})  # the check groups that may start processes of their own


def spawn(name: str, argv: list[str], report_path: str, log: Optional[Callable[[str], None]] = None,
          nicer: int = 0) -> Child:
    """Start `argv`, `nicer` than this process, forwarding its progress lines ("[  t s] ...") to
    stdout as they come, and logging through `log` when its output ends (so a run says when the
    child was done)."""
    from compare import limits
    process = limits.started(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                              bufsize=1))
    if nicer and hasattr(os, "setpriority"):  # before the new interpreter starts a thread (threads inherit it)
        os.setpriority(os.PRIO_PROCESS, process.pid, os.getpriority(os.PRIO_PROCESS, 0) + nicer)
    output: list[str] = []

    def forward() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            if line.startswith("["):  # progress lines; the table comes back through the report
                print(line, end="", flush=True)
        if log is not None:
            log(f"{name}: child process done, exit code {process.wait()}")

    reader = threading.Thread(target=forward, daemon=True)
    reader.start()
    return Child(name, process, reader, output, report_path)


def finish_child(child: Child) -> list[Result]:
    """The child's results, read back from its JSON report; a crashed child is one FAIL naming it; a
    child a phase of whose ran out of time ends this run the same way (compare.limits)."""
    from compare import limits
    code = child.process.wait()
    child.reader.join()
    out_of_time = [line[len("error: "):].strip() for line in child.output
                   if line.startswith("error: ") and "still running after" in line]
    if code == limits.EXIT_STATUS and out_of_time:
        limits.out_of_time(f"{out_of_time[-1]} (the pair {child.name}, in a process of its own)")
    if not os.path.exists(child.report_path):
        tail = "".join(child.output[-20:])
        print(tail, file=sys.stderr)
        return [report.judge(f"{child.name} checks (child process)", child.name, [], "exact", ok=False,
                             note=f"compare/run.py --pair {child.name} exited {code} without a report")]
    return report.read_json(child.report_path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    from compare import common
    common.setup_devices(args.towers)  # before any TensorFlow op runs
    from compare import limits
    common.blas_on_one_thread()
    with limits.configured(args.capture_seconds, enforce=True), common.data_autotune_off():  # captures included
        return judge(args)


def judge(args: argparse.Namespace) -> int:
    """Every pair the arguments name, judged; the table, the profile and the report written; the exit code."""
    start = time.time()
    marks: list[tuple[float, str]] = []  # (seconds since start, progress line) of this process's own lines

    def log(message: str) -> None:
        now = time.time() - start
        if "child process done" not in message:  # a child's end is no phase of this process
            marks.append((now, message))
        print(f"[{now:6.1f}s] {message}", flush=True)

    from compare import harness, limits
    from compare.programs import InterfaceError, Programs
    from legacy.run_tf1.upgrade import ProgramError
    try:
        chosen = Programs.load(**args.programs) if args.programs else None
        pairs = [harness.load_adapter(module, chosen) for module in args.pairs]
        if args.legacy is not None:
            from compare.pairs.captured import program_pair
            log(f"reading the flags of {args.legacy} and {args.modern}")
            pairs.append(program_pair(args.legacy, args.modern, args.both, args.tower_flag, args.replica_flag,
                                      args.loop, args.capture_seconds, args.legacy_arg, args.modern_arg, log=log))
    except (InterfaceError, harness.AdapterError, harness.HarnessError, ProgramError, limits.OutOfTime) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for role, module in args.programs.items():
        log(f"judging {module} as {role}")
    settings = harness.Settings(towers=args.towers, steps=args.steps, free_steps=args.free_steps, seed=args.seed,
                                quick=args.quick, only=args.only or harness.GROUPS, tf1_repeats=args.tf1_repeats)
    results = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        own = set(settings.only) & OWN_PROCESSES if not settings.quick else set()
        children = [spawn(module, child_argv(module, args, os.path.join(tmp_dir, f"pair{i}.json")),
                          os.path.join(tmp_dir, f"pair{i}.json"), log, nicer=0 if own else CHILD_NICENESS)
                    for i, module in enumerate(args.pairs[1:])]
        try:
            first = pairs[0]
            log(f"{first.name}: {first.description or first.module}")
            checkpoint = args.checkpoint if (args.model != "all" or first.name == "cifar") else None
            results += harness.judge_pair(first, dataclasses.replace(settings, checkpoint=checkpoint),
                                          tmp_dir, log=log)
            log(f"{first.name}: checks done")
        except (harness.AdapterError, harness.HarnessError, limits.OutOfTime) as e:
            for child in children:
                child.process.kill()
            print(f"error: {e}", file=sys.stderr)
            return 2
        except BaseException:  # Ctrl-C or a crash: no child process left behind
            for child in children:
                child.process.kill()
            raise
        for child in children:
            results += finish_child(child)
        if args.workers > 1:
            from compare import multiworker
            results += multiworker.run(args.workers, seed=args.seed, tmp_dir=tmp_dir, log=log)
    seconds = time.time() - start
    print()
    print(report.format_table(results, seconds))
    if args.profile:
        print()
        print("\n".join(report.profile_table(marks, seconds)))
    meta = {"towers": args.towers, "steps": args.steps, "free_steps": args.free_steps, "quick": args.quick,
            "seed": args.seed, "pairs": args.pairs, "checkpoint": args.checkpoint, "seconds": seconds}
    for path, write in ((args.report, lambda p: report.write_json(p, results, meta)),
                        (args.plot, lambda p: report.write_plot(p, results))):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            write(path)
            print(f"wrote {path}")
    return 1 if any(r.status in report.FAILING for r in results) else 0


if __name__ == "__main__":
    status = main()
    # The verdict is printed and every file written: end the process without Python's teardown of the
    # graphs, sessions and models of the run (seconds on the CIFAR pair).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
