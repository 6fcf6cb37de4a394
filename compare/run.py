"""The parity harness: proves the legacy TF1 tower programs and the modern TF2 programs compute
the same losses, gradients and updates, tensor by tensor.

Run it (from the repository root):

    python compare/run.py                         # both models, 2 towers vs 2 replicas, 10 steps
    python compare/run.py --quick                 # the same checks, fewer rows and steps (< 90 s)
    python compare/run.py --model cifar --towers 4 --steps 12 --report reports/parity.json \\
        --plot reports/parity.png
    python compare/run.py --model cifar --checkpoint models/temporary/train-model.ckpt-100

For CIFAR ResNet-v2-50 (`compare/cifar.py`) and MNIST (`compare/mnist.py`) it checks: the
variables after name mapping; the inference forward pass; the training forward pass per tower
(keep_prob 1, and one dropout mask imposed on both sides); every gradient; K training steps (lr,
loss, weights, Adam slots, batch-norm moving statistics, moving-average shadows); the batch
splits (even, short last, remainder, fewer rows than towers, the seed's static bug; MNIST's same
batch on every tower); and a checkpoint round trip.  Each check ends PASS, FAIL, or EXPECTED (a
known TF1/TF2 difference whose predicted value held to tolerance: see README, "Parity").
The exit status is 0 only when every check is PASS or EXPECTED.

The legacy graph comes from `legacy/`, the modern model from `modern/`: no copies of either.
Tolerances are printed with the table; see `compare/report.py` for their derivation.
"""
import argparse
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
                   help="training steps compared (default 10, or 4 with --quick); the lr boundaries "
                        "are placed inside them")
    p.add_argument("--quick", action="store_true",
                   help="fewer rows per tower and steps; still the full ResNet-v2-50")
    p.add_argument("--checkpoint", default=None,
                   help="start CIFAR from this TF1 checkpoint (slim names) instead of fresh weights")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", default=None, help="write the JSON report here")
    p.add_argument("--plot", default=None, help="write a PNG chart here")
    args = p.parse_args(argv)
    if args.towers < 1:
        p.error("--towers must be at least 1")
    if args.steps is None:
        args.steps = 4 if args.quick else 10
    if args.steps < 3:
        p.error("--steps must be at least 3 (two learning-rate boundaries are placed inside them)")
    if args.checkpoint and os.path.isdir(args.checkpoint):  # a folder: its latest checkpoint
        import tensorflow as tf
        latest = tf.train.latest_checkpoint(args.checkpoint)
        if latest is None:
            p.error(f"--checkpoint {args.checkpoint}: a folder without a TF1 'checkpoint' file")
        args.checkpoint = latest
    if args.checkpoint and not os.path.exists(args.checkpoint + ".index"):
        p.error(f"--checkpoint {args.checkpoint}: no TF1 checkpoint there (expected {args.checkpoint}.index)")
    return args


def main(argv=None):
    args = parse_args(argv)
    start = time.time()

    def log(message):
        print(f"[{time.time() - start:6.1f}s] {message}", flush=True)

    from compare import common
    common.setup_devices(args.towers)  # before any TensorFlow op runs
    from compare import report

    results = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        if args.model in ("mnist", "all"):
            from compare import mnist
            results += mnist.run(args.towers, args.steps, args.seed, tmp_dir, log=log)
        if args.model in ("cifar", "all"):
            from compare import cifar
            cfg = cifar.default_config(args.towers, args.steps, args.seed, args.quick, args.checkpoint)
            results += cifar.run(cfg, tmp_dir, log=log)
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
