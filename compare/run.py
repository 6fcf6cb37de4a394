"""The parity harness: proves the legacy TF1 tower programs and the modern TF2 programs compute
the same losses, gradients and updates, tensor by tensor.

Run it (from the repository root):

    python compare/run.py                         # both models, 2 towers vs 2 replicas
    python compare/run.py --towers 3              # any tower count
    python compare/run.py --quick                 # fewer steps, no TF1-runtime process
    python compare/run.py --model cifar --only splits,steps --towers 4
    python compare/run.py --model cifar --checkpoint models/temporary --report reports/parity.json \\
        --plot reports/parity.png
    python compare/run.py --program modern_cifar=my_package.my_trainer   # judge another program

Every check drives the programs' own functions (`compare/cifar.py`, `compare/mnist.py`, through
the interface of `compare/programs.py`, so any module that implements it can be judged): parsed
defaults and input pipelines, inference and evaluation, dropout, the training forward pass and the
gradients the modern train step applies, batch splits, restart-per-step training across every
learning-rate boundary (Adam checked on each side), free-running trajectories against a measured
chaos floor, the legacy graph on TF1's own runtime, and checkpoint round trips.  Each check ends
PASS, FAIL, or EXPECTED (a known TF1/TF2 difference whose predicted value held: compare/README.md).
The exit status is 0 only when every check is PASS or EXPECTED, 1 otherwise.  With both models
(the default), the MNIST checks run in a second process (`--model mnist`, its results read back
from its JSON report) while the CIFAR graphs are built: `--quick` took 84.9 s wall against
99.6 s run one after the other, measured back to back on 2 cores.
"""
import argparse
import importlib.util
import os
import sys
import tempfile
import time

if __package__ in (None, ""):  # `python compare/run.py`: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", choices=("cifar", "mnist", "all"), default="all")
    p.add_argument("--towers", type=int, default=2, help="legacy towers = modern replicas")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps compared from a shared state (CIFAR default 6, MNIST 10; "
                        "4 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="fewer rows per tower and steps; still the full ResNet-v2-50")
    p.add_argument("--checkpoint", default=None,
                   help="start CIFAR from this TF1 checkpoint (slim names) instead of fresh weights")
    p.add_argument("--only", default=None,
                   help="CIFAR check groups to run, comma-separated (basics, forward, training, splits, steps, "
                        "free, tf1); default all")
    p.add_argument("--workers", type=int, default=1,
                   help="also check N workers x 1 replica against 1 x N and the legacy N towers "
                        "(compare/multiworker.py), N >= 2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", default=None, help="write the JSON report here")
    p.add_argument("--plot", default=None, help="write a PNG chart here")
    p.add_argument("--program", action="append", default=[], metavar="ROLE=MODULE",
                   help="judge MODULE (a dotted name) in ROLE instead of this repository's program "
                        "(roles: legacy_cifar, modern_cifar, legacy_mnist, legacy_mnist_eval, "
                        "modern_mnist; the interface: compare/programs.py); repeatable")
    args = p.parse_args(argv)
    args.programs = {}
    for spec in args.program:
        role, _, module = spec.partition("=")
        if not module:
            p.error(f"--program {spec}: expected ROLE=MODULE, e.g. modern_cifar=my_package.my_trainer")
        args.programs[role] = module
    if args.towers < 1:
        p.error("--towers must be at least 1")
    if args.steps is not None and args.steps < 1:
        p.error("--steps must be at least 1")
    groups = ("basics", "forward", "training", "splits", "steps", "free", "tf1")
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # now, not after the run
        p.error("--plot needs matplotlib: pip install 'tf1-towers[plot]' (or pip install matplotlib)")
    if args.only is not None:
        args.only = tuple(g.strip() for g in args.only.split(","))
        unknown = [g for g in args.only if g not in groups]
        if unknown:
            p.error(f"--only: unknown group(s) {', '.join(unknown)}; choose from {', '.join(groups)}")
    if args.checkpoint and os.path.isdir(args.checkpoint):  # a folder: its latest checkpoint
        import tensorflow as tf
        latest = tf.train.latest_checkpoint(args.checkpoint)
        if latest is None:
            p.error(f"--checkpoint {args.checkpoint}: a folder without a TF1 'checkpoint' file")
        args.checkpoint = latest
    if args.checkpoint and not os.path.exists(args.checkpoint + ".index"):
        p.error(f"--checkpoint {args.checkpoint}: no TF1 checkpoint there (expected {args.checkpoint}.index)")
    return args


def start_model_process(model, args, report_path, log=None):
    """`compare/run.py --model MODEL` with the same settings in a child process, its progress lines
    passed through as they come (and, with `log`, one when it exits); returns what
    `finish_model_process` needs."""
    argv = [sys.executable, os.path.abspath(__file__), "--model", model, "--towers", str(args.towers),
            "--seed", str(args.seed), "--report", report_path]
    argv += ["--quick"] if args.quick else []
    argv += ["--steps", str(args.steps)] if args.steps else []
    argv += [f"--program={spec}" for spec in args.program]
    return spawn(model, argv, report_path, log)


def spawn(model, argv, report_path, log=None):
    """Start `argv`, forwarding its progress lines ("[  t s] ...") to stdout as they come, and
    logging through `log` when its output ends (so a run says when the child was done)."""
    import subprocess
    import threading
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    output = []

    def forward():
        for line in child.stdout:
            output.append(line)
            if line.startswith("["):  # progress lines; the table comes back through the report
                print(line, end="", flush=True)
        if log is not None:
            log(f"{model}: child process done, exit code {child.wait()}")

    reader = threading.Thread(target=forward, daemon=True)
    reader.start()
    return model, child, reader, output, report_path


def finish_model_process(model, child, reader, output, report_path):
    """The child's results, read back from its JSON report; a crashed child is one FAIL naming it."""
    from compare import report
    code = child.wait()
    reader.join()
    if not os.path.exists(report_path):
        tail = "".join(output[-20:])
        print(tail, file=sys.stderr)
        return [report.judge(f"{model} checks (child process)", model, [], "exact", ok=False,
                             note=f"compare/run.py --model {model} exited {code} without a report")]
    return report.read_json(report_path)


def main(argv=None):
    args = parse_args(argv)
    start = time.time()

    def log(message):
        print(f"[{time.time() - start:6.1f}s] {message}", flush=True)

    from compare import common
    common.setup_devices(args.towers)  # before any TensorFlow op runs
    from compare import programs, report
    try:
        programs.use(**args.programs)
    except programs.InterfaceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for role, module in args.programs.items():
        log(f"judging {module} as {role}")

    results = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        mnist_child = None
        if args.model == "all":  # MNIST in a second process, on the core the CIFAR graph build leaves idle
            mnist_child = start_model_process("mnist", args, os.path.join(tmp_dir, "mnist.json"), log)
        elif args.model == "mnist":
            from compare import mnist
            steps = args.steps or (4 if args.quick else 10)
            results += mnist.run(args.towers, steps, args.seed, tmp_dir, log=log)
        try:
            if args.model in ("cifar", "all"):
                from compare import cifar
                cfg = cifar.default_config(args.towers, args.steps, args.seed, args.quick, args.checkpoint)
                results += cifar.run(cfg, tmp_dir, log=log, only=args.only or cifar.GROUPS)
                log("cifar: checks done")
        except BaseException:  # Ctrl-C or a crash: no MNIST process left behind
            if mnist_child is not None:
                mnist_child[1].kill()
            raise
        if mnist_child is not None:
            results = finish_model_process(*mnist_child) + results
        if args.workers > 1:
            from compare import multiworker
            results += multiworker.run(args.workers, seed=args.seed, tmp_dir=tmp_dir, log=log)
    seconds = time.time() - start
    print()
    print(report.format_table(results, seconds))
    meta = {"towers": args.towers, "steps": args.steps, "quick": args.quick, "seed": args.seed,
            "model": args.model, "checkpoint": args.checkpoint, "seconds": seconds}
    for path, write in ((args.report, report.write_json), (args.plot, report.write_plot)):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            write(path, results, meta) if write is report.write_json else write(path, results)
            print(f"wrote {path}")
    failed = [r for r in results if r.status == "FAIL"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
