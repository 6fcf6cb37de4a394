"""Parity beyond one machine: N workers x 1 replica against 1 worker x N replicas (`modern/mnist_multi_gpu.py`).

    python -m compare.multiworker                  # 2 workers, 6 steps, an uneven batch among them
    python -m compare.multiworker --workers 3 --steps 8
    python -m compare.multiworker --defect repeat_rows        # planted in the cluster: both FAIL
    python -m compare.multiworker --defect shift_tower_rows   # planted in the legacy towers: the second FAILs

Both layouts run `train_and_record` in fresh processes (a MultiWorkerMirroredStrategy can only be
made once, first thing in a process): the cluster through `modern.launch.launch` (each worker with
its own TF_CONFIG), the reference with TF_CONFIG unset, so `modern.cluster.make_strategy` picks the
one-host MirroredStrategy.  Each process builds the trainer from `modern/mnist_multi_gpu.py`'s own functions
(`build_model`, `make_optimizer`, `make_moving_average`, `get_input`, `make_train_step`) and the
cluster code's (`make_strategy`, `distribute`), starts from the same seeded weights, reads the same
global batches (one shuffle seed), and records the loss of every step and the weights after K
steps.  The global batch is the same in both layouts (batch_size rows per replica x N replicas),
except on the steps cut short: a batch of 2*b - 1 rows (b + (b - 1) over 2 replicas) and one of 1
row (one replica empty: the MNIST model takes an empty batch), so the strategy's split of a short
batch across *workers* is checked against its split across devices.

Check `multiworker_steps`: every worker's losses, gradients (the train step's all-reduced sum,
`make_train_step(..., return_grads=True)`) and weights of every step against the reference's,
rel_l2 within TOLERANCES['mlp_steps'] (a NaN anywhere is never agreement: report.tensor_error).

Check `multiworker_vs_legacy_towers`: the same steps through `legacy/mnist_multi_gpu.py
--per_tower_batches --ordered_ema` (each tower its own batch, the moving average after the
update), in a process of its own (a TF1 graph beside no strategy), built by the program's own
`parse_args` and `build_train_graph` and fed through placeholders: tower i gets the rows replica i
got in the reference (recorded there).  Every worker's loss, gradients and weights after each
compared step against the towers', rel_l2 within 'mlp_steps'.
Compared are the steps whose global batch splits evenly over the towers; the short steps are
skipped, because there the two programs *should* differ: a legacy tower's loss is the mean over
its own rows and `average_gradients` weighs every tower 1/N, so b + (b - 1) rows are not the
global batch's mean (the modern step weighs each row 1/B), and a 0-row tower is 0/0 (NaN).  After a
skipped step the towers restart from worker 0's weights (and global_step) before the next one, so
every even step after it is still compared, each from the workers' own state; free-running from the
same start weights holds up to the first short step.  (The legacy CIFAR fix split, `towers.split_rows
'fix'`, would instead drop rows % N rows: either way not the same rows.)

Planted defects: `repeat_rows` (cluster side): the workers' dataset is not sharded (auto-shard
OFF), so each worker trains on the replica batches of the whole global batch, rows repeated across
workers; both checks FAIL.  `shift_tower_rows` (legacy side): tower 1's images are shifted by one
row against their labels; `multiworker_vs_legacy_towers` FAILs, `multiworker_steps` still PASSes.
"""
import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
from typing import Callable, Optional, Sequence


import numpy as np

from compare import report
from compare.report import TensorError, judge, tensor_error
from compare.report import Result
from records.usage import ArgumentParser, at_least

MODEL = "mnist"
BATCH = 8           # rows per replica
CLUSTER_DEFECTS = ("repeat_rows",)
DEFECTS = CLUSTER_DEFECTS + ("shift_tower_rows",)


def short_steps(batch: int, num_replicas: int) -> dict[int, int]:
    """{step: rows} for the steps whose global batch is cut short: uneven, and one replica empty."""
    return {2: batch * num_replicas - 1, 4: 1}


# ----------------------------------------------------------------------------------------------
# One process of either layout.
# ----------------------------------------------------------------------------------------------
def train_and_record(out_dir: str, num_replicas: int, steps: int, seed: int, defect: Optional[str] = None) -> None:
    """Train `steps` steps of modern/mnist_multi_gpu.py's trainer; write losses and weights to out_dir."""
    from modern import cluster
    strategy, worker = cluster.make_strategy(num_replicas, log=None)  # first: may start the cluster
    import tensorflow as tf
    from modern import mnist_multi_gpu as mnist
    from modern.runtime import enable_determinism
    enable_determinism(seed)
    n = strategy.num_replicas_in_sync
    data_path, _, _, _ = mnist.check_data(None, None)
    with strategy.scope():
        model = mnist.build_model()
        optimizer = mnist.make_optimizer(decay_steps=60000 / BATCH)
        optimizer.build(model.trainable_variables)
        ema, _ = mnist.make_moving_average(model, optimizer)
    rng = np.random.RandomState(seed)  # the same start on every process, whatever the seeding
    for v in model.trainable_variables:
        v.assign(rng.normal(0.0, 0.1, v.shape).astype(np.float32))
    dataset = mnist.get_input(data_path, BATCH, n, shuffle_seed=seed)
    cut = short_steps(BATCH, n)
    sizes = tf.constant([cut.get(i, BATCH * n) for i in range(steps)])
    dataset = dataset.take(steps).enumerate().map(lambda i, b: (b[0][:sizes[i]], b[1][:sizes[i]]))
    if defect == "repeat_rows" and worker is not None:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        dist = strategy.experimental_distribute_dataset(dataset.with_options(options))
    else:
        dist = cluster.distribute(strategy, worker, dataset)
    train_step = mnist.make_train_step(model, optimizer, strategy, ema, return_grads=True,
                                       element_spec=dist.element_spec)
    names = [mnist.legacy_name(v) for v in model.trainable_variables]
    record = {"start/" + n: v.numpy() for n, v in zip(names, model.trainable_variables)}
    losses = []
    for k, batch in enumerate(dist):
        if worker is None:  # the reference: the rows each replica got (legacy tower i gets replica i's)
            for i, (x, y) in enumerate(zip(*(strategy.experimental_local_results(t) for t in batch))):
                record[f"rows/{k}/{i}/x"], record[f"rows/{k}/{i}/y"] = x.numpy(), y.numpy()
        loss, grads = train_step(batch)
        losses.append(float(loss))
        for n, v, g in zip(names, model.trainable_variables, grads):
            record[f"step{k}/grad/{n}"], record[f"step{k}/{n}"] = g.numpy(), v.numpy()
    weights = {n: v.numpy() for n, v in zip(names, model.trainable_variables)}
    index = 0 if worker is None else worker.index
    np.savez(os.path.join(out_dir, f"worker{index}.npz"), losses=np.array(losses), **weights)
    np.savez(os.path.join(out_dir, f"steps{index}.npz"), **record)


# ----------------------------------------------------------------------------------------------
# The legacy program's towers, in a process of their own (a TF1 graph).
# ----------------------------------------------------------------------------------------------
def even_steps(steps: int, batch: int, num_replicas: int) -> list[int]:
    """The steps whose global batch splits evenly over the towers (all but the short ones)."""
    cut = short_steps(batch, num_replicas)
    return [k for k in range(steps) if cut.get(k, batch * num_replicas) % num_replicas == 0]


def train_legacy_towers(ref_dir: str, cluster_dir: str, out_dir: str, num_towers: int, steps: int,
                        defect: Optional[str] = None) -> None:
    """`legacy/mnist_multi_gpu.py --per_tower_batches --ordered_ema` on the reference's replica rows.

    The program's own `parse_args` and `build_train_graph`, fed through placeholders (tower i gets
    the rows replica i got); free-running from the same start weights over the even steps, and
    restarted from worker 0's weights (and global_step = k) after each step it skips.
    defect 'shift_tower_rows': tower 1's images shifted by one row against its labels.
    """
    import tensorflow as tf
    from legacy import mnist_multi_gpu as legacy_mnist
    from legacy.towers import session_config
    tf1 = tf.compat.v1
    args = legacy_mnist.parse_args(["--towers", str(num_towers), "--batch_size", str(BATCH),
                                    "--per_tower_batches", "--ordered_ema"])
    reference = np.load(os.path.join(ref_dir, "steps0.npz"))
    worker0 = np.load(os.path.join(cluster_dir, "steps0.npz"))
    graph = tf1.Graph()
    with graph.as_default(), tf1.device("/cpu:0"):
        tower_inputs = [(tf1.placeholder(tf.float32, [None, 784], name=f"x{i}"),
                         tf1.placeholder(tf.int32, [None], name=f"y{i}")) for i in range(num_towers)]
        ns = legacy_mnist.build_train_graph(
            tower_inputs, regularization_rate=args.regularization_rate, learning_rate_base=args.learning_rate_base,
            learning_rate_decay=args.learning_rate_decay, decay_steps=60000 / args.batch_size,
            moving_average_decay=args.moving_average_decay, ordered_ema=args.ordered_ema)
        weights = {v.op.name: v for v in tf1.trainable_variables()}
        init = tf1.global_variables_initializer()
    sess = tf1.Session(graph=graph, config=session_config(num_towers))
    sess.run(init)
    record, losses, previous = {}, np.full(steps, np.nan), None
    for k in even_steps(steps, BATCH, num_towers):
        if previous != k - 1:  # the start, or the step after a skipped one: the workers' weights
            source = {n: reference["start/" + n] for n in weights} if k == 0 else \
                {n: worker0[f"step{k - 1}/{n}"] for n in weights}
            with graph.as_default():
                for n, v in weights.items():
                    v.load(source[n], sess)
                ns.global_step.load(k, sess)
        feed = {}
        for i, (x, y) in enumerate(tower_inputs):
            rows = reference[f"rows/{k}/{i}/x"]
            feed[x] = np.roll(rows, 1, axis=0) if defect == "shift_tower_rows" and i == 1 else rows
            feed[y] = reference[f"rows/{k}/{i}/y"]
        grads, tower_losses, _ = sess.run([[g for g, _ in ns.grads], ns.tower_losses, ns.train_op], feed)
        losses[k] = np.mean(tower_losses)  # the towers' losses weigh 1/N each, as their gradients
        after = sess.run(weights)
        for (_, v), g in zip(ns.grads, grads):
            record[f"step{k}/grad/{v.op.name}"], record[f"step{k}/{v.op.name}"] = g, after[v.op.name]
        previous = k
    sess.close()
    np.savez(os.path.join(out_dir, "legacy.npz"), losses=losses, **record)


# ----------------------------------------------------------------------------------------------
# The check.
# ----------------------------------------------------------------------------------------------
def _worker_command(out_dir: str, steps: int, seed: int, defect: Optional[str]) -> list[str]:
    command = ["-m", "compare.multiworker", "--_worker", out_dir, "--steps", str(steps), "--seed", str(seed)]
    return command + (["--defect", defect] if defect in CLUSTER_DEFECTS else [])


def _errors(label: str, result: dict[str, np.ndarray], expected: dict[str, np.ndarray],
            names: list[str]) -> list[TensorError]:
    """tensor_error of result[n] against expected[n] for each name; a shape that differs is infinite."""
    errors = []
    for name in names:
        if name not in result or result[name].shape != expected[name].shape:  # e.g. rows repeated: more steps
            shape = result[name].shape if name in result else "missing"
            errors.append(TensorError(f"{label} {name} (shape {shape}, expected {expected[name].shape})",
                                      math.inf, math.inf, math.inf))
        else:
            errors.append(tensor_error(f"{label} {name}", result[name], expected[name]))
    return errors


def check_legacy_towers(root: str, workers: int, steps: int, seed: int = 0, defect: Optional[str] = None,
                        timeout: int = 300) -> Result:
    """Result `multiworker_vs_legacy_towers`: run the legacy towers' process on the reference's
    rows in `root` (made by `run`) and compare the workers with it, on the even steps."""
    done = subprocess.run([sys.executable, "-m", "compare.multiworker", "--_legacy", root, "--workers",
                           str(workers), "--steps", str(steps), "--seed", str(seed)]
                          + (["--defect", defect] if defect else []),
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the legacy towers failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    legacy = dict(np.load(os.path.join(root, "legacy.npz")))
    compared = even_steps(steps, BATCH, workers)
    names = sorted(n for n in legacy if n != "losses")
    errors = []
    for i in range(workers):
        result = dict(np.load(os.path.join(root, "cluster", f"steps{i}.npz")))
        losses = np.load(os.path.join(root, "cluster", f"worker{i}.npz"))["losses"]
        errors += [tensor_error(f"worker {i} loss step {k}", losses[k] if k < len(losses) else np.nan,
                                legacy["losses"][k]) for k in compared]
        errors += _errors(f"worker {i}", result, legacy, names)
    skipped = [k for k in range(steps) if k not in compared]
    note = (f"{workers} workers x 1 replica vs legacy --per_tower_batches --ordered_ema, {workers} towers "
            f"(tower i on replica i's rows): losses, gradients and weights after each of steps {compared}; "
            f"steps {skipped} skipped (uneven: legacy towers weigh 1/N each whatever their rows, a "
            f"0-row tower is 0/0), the towers restart from worker 0's weights after each")
    return judge("multiworker_vs_legacy_towers", MODEL, errors, "mlp_steps", note=note,
                 extra={"workers": workers, "steps": steps, "defect": defect, "compared_steps": compared,
                        "losses": {"legacy": legacy["losses"].tolist()}})


def run(workers: int = 2, steps: int = 6, seed: int = 0, tmp_dir: Optional[str] = None,
        log: Callable[[str], None] = print, defect: Optional[str] = None, timeout: int = 300, legacy: bool = True,
        work_dir: Optional[str] = None) -> list[Result]:
    """[Result]: `workers` workers x 1 replica against 1 worker x `workers` replicas, K = steps, and
    (legacy=True) against the legacy program's `workers` towers.

    Runs 1 + `workers` TensorFlow processes (sequentially: the reference, then the cluster), then
    the legacy towers' process.  defect: None, 'repeat_rows' (cluster side: the first check must
    FAIL) or 'shift_tower_rows' (legacy side: the second must FAIL, the first PASS).
    work_dir: keep the recorded steps there (default: a temporary folder in tmp_dir, removed).
    """
    from modern.launch import launch
    if defect not in (None,) + DEFECTS:
        raise ValueError(f"defect must be one of {DEFECTS}, got {defect!r}")
    with contextlib.ExitStack() as stack:
        root = str(work_dir) if work_dir else stack.enter_context(tempfile.TemporaryDirectory(dir=tmp_dir))
        ref_dir, cluster_dir = os.path.join(root, "reference"), os.path.join(root, "cluster")
        os.makedirs(ref_dir)
        os.makedirs(cluster_dir)
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        log(f"multiworker: 1 worker x {workers} replicas, {steps} steps")
        done = subprocess.run([sys.executable, *_worker_command(ref_dir, steps, seed, defect),
                               "--towers", str(workers)], env=env, capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"the 1-worker reference failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        log(f"multiworker: {workers} workers x 1 replica" + (f", defect {defect}" if defect else ""))
        lines: list[str] = []
        code = launch(_worker_command(cluster_dir, steps, seed, defect), workers, 1, grace=5.0,
                      log=lines.append, timeout=timeout, output=lines.append)
        if code != 0:
            raise RuntimeError(f"the {workers}-worker cluster failed ({code}):\n" + "".join(lines)[-4000:])
        reference = dict(np.load(os.path.join(ref_dir, "worker0.npz")))
        reference.update((n, t) for n, t in np.load(os.path.join(ref_dir, "steps0.npz")).items()
                         if n.startswith("step"))
        errors = []
        for i in range(workers):
            result = dict(np.load(os.path.join(cluster_dir, f"worker{i}.npz")))
            result.update(np.load(os.path.join(cluster_dir, f"steps{i}.npz")))
            errors += _errors(f"worker {i}", result, reference, sorted(reference))
        cut = short_steps(BATCH, workers)
        note = (f"{workers} workers x 1 replica vs 1 x {workers}, {steps} steps of {BATCH * workers} rows "
                f"(steps {sorted(cut)} cut to {[cut[s] for s in sorted(cut)]} rows): losses, gradients and "
                f"weights of every step")
        results = [judge("multiworker_steps", MODEL, errors, "mlp_steps", note=note,
                         extra={"workers": workers, "steps": steps, "defect": defect,
                                "losses": {"reference": reference["losses"].tolist(),
                                           "workers": [np.load(os.path.join(cluster_dir, f"worker{i}.npz"))
                                                       ["losses"].tolist() for i in range(workers)]}})]
        if legacy:
            log(f"multiworker: legacy --per_tower_batches --ordered_ema, {workers} towers")
            results.append(check_legacy_towers(root, workers, steps, seed, defect, timeout))
    return results


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m compare.multiworker", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=at_least(2), default=2, help="workers of the cluster (1 replica each)")
    p.add_argument("--steps", type=at_least(5), default=6,
                   help="training steps compared (at least 5: steps 2 and 4 are the short ones)")
    p.add_argument("--seed", type=int, default=0, help="seed of the rows and start weights")
    p.add_argument("--defect", choices=DEFECTS, default=None,
                   help="plant a defect: the check must FAIL (default: none)")
    p.add_argument("--_worker", default=None, help=argparse.SUPPRESS)  # out_dir: run one process
    p.add_argument("--_legacy", default=None, help=argparse.SUPPRESS)  # root: run the legacy towers
    p.add_argument("--towers", dest="num_replicas", type=int, default=1, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args._worker:
        train_and_record(args._worker, args.num_replicas, args.steps, args.seed, args.defect)
        return 0
    if args._legacy:
        train_legacy_towers(os.path.join(args._legacy, "reference"), os.path.join(args._legacy, "cluster"),
                            args._legacy, args.workers, args.steps, args.defect)
        return 0
    results = run(args.workers, args.steps, args.seed, defect=args.defect)
    print(report.format_table(results, 0.0))
    for result in results:
        worst = result.worst
        print(json.dumps({"check": result.check, "status": result.status,
                          "worst": worst.as_dict() if worst else None}))
    return 1 if any(r.status == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
