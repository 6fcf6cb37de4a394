"""Parity beyond one machine: N workers x 1 replica against 1 worker x N replicas (`modern/mnist_multi_gpu.py`).

    python -m compare.multiworker                  # 2 workers, 6 steps, an uneven batch among them
    python -m compare.multiworker --workers 3 --steps 8
    python -m compare.multiworker --defect repeat_rows   # the planted defect: must FAIL

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

Check `multiworker_steps`: every worker's losses and weights against the reference's, rel_l2
within TOLERANCES['mlp_steps'] (a NaN anywhere is never agreement: report.tensor_error).
Planted defect `repeat_rows`: the workers' dataset is not sharded (auto-shard OFF), so each worker
trains on the replica batches of the whole global batch, rows repeated across workers.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

if __package__ in (None, ""):  # `python compare/multiworker.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from compare.report import TensorError, judge, tensor_error  # noqa: E402

MODEL = "mnist"
BATCH = 8           # rows per replica
DEFECTS = ("repeat_rows",)


def short_steps(batch, num_replicas):
    """{step: rows} for the steps whose global batch is cut short: uneven, and one replica empty."""
    return {2: batch * num_replicas - 1, 4: 1}


# ----------------------------------------------------------------------------------------------
# One process of either layout.
# ----------------------------------------------------------------------------------------------
def train_and_record(out_dir, num_replicas, steps, seed, defect=None):
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
    train_step = mnist.make_train_step(model, optimizer, strategy, ema, element_spec=dist.element_spec)
    losses = [float(train_step(batch)) for batch in dist]
    weights = {mnist.legacy_name(v): v.numpy() for v in model.trainable_variables}
    index = 0 if worker is None else worker.index
    np.savez(os.path.join(out_dir, f"worker{index}.npz"), losses=np.array(losses), **weights)


# ----------------------------------------------------------------------------------------------
# The check.
# ----------------------------------------------------------------------------------------------
def _worker_command(out_dir, steps, seed, defect):
    command = ["-m", "compare.multiworker", "--_worker", out_dir, "--steps", str(steps), "--seed", str(seed)]
    return command + (["--defect", defect] if defect else [])


def run(workers=2, steps=6, seed=0, tmp_dir=None, log=print, defect=None, timeout=300):
    """[Result]: `workers` workers x 1 replica against 1 worker x `workers` replicas, K = steps.

    Runs 1 + `workers` TensorFlow processes (sequentially: the reference, then the cluster).
    defect: None, or 'repeat_rows' (the check must then FAIL).
    """
    from modern.launch import launch
    if defect not in (None,) + DEFECTS:
        raise ValueError(f"defect must be one of {DEFECTS}, got {defect!r}")
    with tempfile.TemporaryDirectory(dir=tmp_dir) as root:
        ref_dir, cluster_dir = os.path.join(root, "reference"), os.path.join(root, "cluster")
        os.makedirs(ref_dir)
        os.makedirs(cluster_dir)
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        log(f"multiworker: 1 worker x {workers} replicas, {steps} steps")
        done = subprocess.run([sys.executable, *_worker_command(ref_dir, steps, seed, defect),
                               "--num_replicas", str(workers)], env=env, capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"the 1-worker reference failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        log(f"multiworker: {workers} workers x 1 replica" + (f", defect {defect}" if defect else ""))
        lines = []
        code = launch(_worker_command(cluster_dir, steps, seed, defect), workers, 1, grace=5.0,
                      log=lines.append, timeout=timeout, output=lines.append)
        if code != 0:
            raise RuntimeError(f"the {workers}-worker cluster failed ({code}):\n" + "".join(lines)[-4000:])
        reference = dict(np.load(os.path.join(ref_dir, "worker0.npz")))
        results = [np.load(os.path.join(cluster_dir, f"worker{i}.npz")) for i in range(workers)]
    errors = []
    for i, result in enumerate(results):
        for name, ref in reference.items():
            if result[name].shape != ref.shape:  # e.g. more steps: rows repeated across workers
                errors.append(TensorError(f"worker {i} {name} (shape {result[name].shape}, reference "
                                          f"{ref.shape})", math.inf, math.inf, math.inf))
            else:
                errors.append(tensor_error(f"worker {i} {name}", result[name], ref))
    cut = short_steps(BATCH, workers)
    note = (f"{workers} workers x 1 replica vs 1 x {workers}, {steps} steps of {BATCH * workers} rows "
            f"(steps {sorted(cut)} cut to {[cut[s] for s in sorted(cut)]} rows), losses and weights")
    return [judge("multiworker_steps", MODEL, errors, "mlp_steps", note=note,
                  extra={"workers": workers, "steps": steps, "defect": defect,
                         "losses": {"reference": reference["losses"].tolist(),
                                    "workers": [r["losses"].tolist() for r in results]}})]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--defect", choices=DEFECTS, default=None, help="plant a defect: the check must FAIL")
    p.add_argument("--_worker", default=None, help=argparse.SUPPRESS)  # out_dir: run one process
    p.add_argument("--num_replicas", type=int, default=1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.workers < 2 or args.steps < 5:
        p.error("--workers must be at least 2 and --steps at least 5 (steps 2 and 4 are the short ones)")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args._worker:
        train_and_record(args._worker, args.num_replicas, args.steps, args.seed, args.defect)
        return 0
    from compare import report
    results = run(args.workers, args.steps, args.seed, defect=args.defect)
    print(report.format_table(results, 0.0))
    worst = results[0].worst
    print(json.dumps({"status": results[0].status, "worst": worst.as_dict() if worst else None}))
    return 1 if any(r.status == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
