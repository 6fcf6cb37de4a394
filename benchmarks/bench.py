"""Side-by-side speed of the legacy TF1 tower programs and their modern TF2 twins.

Run it (from the repository root):

    python benchmarks/bench.py                                   # CIFAR and MNIST, 1 and 2 towers, several batches
    python benchmarks/bench.py --model cifar --replicas 2 --batch 64 --repeats 3 --json reports/bench.json
    python benchmarks/bench.py --tiny --json /tmp/bench.json     # seconds: the configuration the tests run
    python benchmarks/bench.py --model cifar --replicas 2 --batch 64 --variants modern --trace /tmp/trace

One run measures, on the same machine, model, global batch and tower / replica count:

  cifar  legacy-feed        legacy/cifar_resnet.py as the original runs it: each batch fetched to
                            numpy (`sess.run([image_batch, label_batch])`) and fed back through the
                            placeholders, with the original's fetches (summary, train op, loss, accuracy)
         legacy-iterator    the same graph with its `inputs`, `labels` and `current_batch_size`
                            placeholders defaulting to the iterator's tensors: the best a TF1 user could do
         modern             modern/cifar_resnet.py's step as it ships (MirroredStrategy, fused Adam,
                            gradients summed by ReductionToOneDevice on virtual CPUs, each global
                            batch cut into replica slices by `modern.cluster.distribute`)
         modern-strategy-iterator  the same fed by `strategy.experimental_distribute_dataset`
         modern-collective  the same as modern with MirroredStrategy's default collective all-reduce
         modern-keras-adam  collective all-reduce, Keras' own Adam, op by op (`make_optimizer(fused=False)`),
                            and the strategy's iterator: all three changes undone
  mnist  legacy             legacy/mnist_multi_gpu.py as the original runs it: one batch for every tower
         legacy-per-tower   its --per_tower_batches: each tower its own batch
         modern             modern/mnist_multi_gpu.py's step as it ships (each replica its own batch)
         modern-strategy-iterator  the same fed by `strategy.experimental_distribute_dataset`
         modern-collective  the same as modern with the collective all-reduce

Each configuration runs in its own process (`--worker`), so no run inherits another's threads,
caches or memory; the repeats are interleaved (all configurations once, then all again), so a
machine that slows down during the run slows every configuration alike.  A worker mirrors its
program's loop and times what the program's progress line times: the next batch and the training
step with its host reads; the every-N-steps summaries and validation are left out on both sides.

Per configuration (the JSON has one record each, with these names):
  examples_per_sec_median / _min / _max   over every timed step of every repeat (after --warmup
                             steps); each example counted once: MNIST's original feeds ONE batch of
                             `batch` rows to every tower, so it trains `batch` distinct rows a step,
                             where the modern program and --per_tower_batches train `batch * replicas`
  step_ms_median             median step time
  first_step_s               from the process's launch to the end of its first training step
                             (imports, data, graph or model, tracing, the step): median over repeats
  peak_rss_mb                the worker's peak resident memory (max over repeats)
  forward_flops_per_example  the TF profiler's float operations of one example's inference pass
                             (`tf.compat.v1.profiler`, on each side's own graph)
  achieved_gflops            examples/sec (median) x 3 x forward FLOPs: training counted as forward
                             plus a backward pass of twice its cost
  share_of_matmul_peak       achieved_gflops / the matmul peak measured in this run (the best of 20
                             2048x2048 float32 matmuls; --tiny uses 512x512)
  cpu_busy                   the worker's CPU time over the timed steps / (their wall time x cores)
  vs_legacy                  examples/sec (median) over that of the first legacy configuration
                             with the same model, replicas and batch (the program as the original runs it)
Devices: GPUs when there are enough for the towers, virtual CPU devices otherwise (as the programs).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Optional, Sequence

from records.usage import ArgumentParser, at_least

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {
    "cifar": ("legacy-feed", "legacy-iterator", "modern", "modern-strategy-iterator", "modern-collective",
              "modern-keras-adam"),
    "mnist": ("legacy", "legacy-per-tower", "modern", "modern-strategy-iterator", "modern-collective"),
}
# The modern variants: (fused Adam?, how gradients are summed: modern.runtime.cross_device_ops,
# input: "slices" = modern.cluster.distribute, "strategy" = strategy.experimental_distribute_dataset).
MODERN_SETTINGS = {"modern": (True, "auto", "slices"), "modern-strategy-iterator": (True, "auto", "strategy"),
                   "modern-collective": (True, "collective", "slices"),
                   "modern-keras-adam": (False, "collective", "strategy")}
# The configuration the tests run: MNIST only (seconds per process), one process per variant (the
# interleaving of repeats is tested with `spawn` replaced, tests/test_bench.py).
TINY = dict(model="mnist", replicas=[2], batch=[8], warmup=2, steps=3, repeats=1, matmul_size=512)
RESULT_TAG = "BENCH_RESULT "
CIFAR_KEEP_PROB = 0.6   # the programs' training keep_prob
CIFAR_EPOCHS = 1000     # the embedded set (997 rows) repeated: enough batches for any run here
FIELDS = ("model", "variant", "replicas", "batch", "examples_per_sec_median", "examples_per_sec_min",
          "examples_per_sec_max", "step_ms_median", "first_step_s", "peak_rss_mb",
          "forward_flops_per_example", "achieved_gflops", "share_of_matmul_peak", "vs_legacy",
          "cpu_busy", "timed_steps", "repeats", "devices")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("cifar", "mnist", "all"), default="all", help="which programs")
    p.add_argument("--replicas", type=at_least(1), nargs="+", default=[1, 2], help="towers = replicas")
    p.add_argument("--batch", type=at_least(1), nargs="+", default=None,
                   help="CIFAR: the global batch (default: 16 64); MNIST: the programs' per-tower "
                        "BATCH_SIZE (default: 100)")
    p.add_argument("--variants", nargs="+", default=None,
                   help=f"a subset of the variants ({', '.join(v for vs in VARIANTS.values() for v in vs)}) "
                        f"(default: all)")
    p.add_argument("--warmup", type=at_least(1), default=10, help="steps run before timing (the first included)")
    p.add_argument("--steps", type=at_least(1), default=30, help="timed steps per process")
    p.add_argument("--repeats", type=at_least(1), default=2, help="processes per configuration, interleaved")
    p.add_argument("--matmul_size", type=at_least(1), default=2048,
                   help="side of the float32 matmul whose speed is the peak the table compares with")
    p.add_argument("--tiny", action="store_true", help="the tests' configuration: " + ", ".join(
        f"{k} {v}" for k, v in TINY.items()))
    p.add_argument("--json", default=None, help="write the results here (default: none)")
    p.add_argument("--trace", default=None,
                   help="write a tf.profiler trace of the last 3 timed steps of each process into this "
                        "folder (default: none)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tiny:
        for key, value in TINY.items():
            setattr(args, key, value)
    known = {v for vs in VARIANTS.values() for v in vs}
    if args.variants and not set(args.variants) <= known:
        p.error(f"unknown variants {sorted(set(args.variants) - known)}; known: {sorted(known)}")
    return args


# ----------------------------------------------------------------------------------------------
# Workers: one configuration in this process.  Each returns its timings as a dict.
# ----------------------------------------------------------------------------------------------
def _timed_loop(step_fn, spec, launched):
    """Run step_fn() warmup + steps times; returns the worker's timings.

    step_fn returns the rows it trained (each example counted once).  Also measured: the process's
    CPU time over the timed steps as a share of their wall time and of the cores (`cpu_busy`: 1.0
    = every core busy all the time).  With spec['trace'], the last 3 steps run under the TF
    profiler (and are still timed).
    """
    import tensorflow as tf
    total, trace = spec["warmup"] + spec["steps"], spec.get("trace")
    seconds, rows = [], []
    first_step_s = cpu_start = None
    for i in range(total):
        if i == spec["warmup"]:
            cpu_start = (time.process_time(), time.time())
        if trace and i == total - 3:
            tf.profiler.experimental.start(trace)
        t = time.time()
        rows.append(step_fn())
        seconds.append(time.time() - t)
        if first_step_s is None:
            first_step_s = time.time() - launched
    cpu_end = (time.process_time(), time.time())
    if trace:
        tf.profiler.experimental.stop()
    cpu_seconds = cpu_end[0] - cpu_start[0]  # all threads, user + system; os.times() ticks 10 ms
    cpu_busy = cpu_seconds / (cpu_end[1] - cpu_start[1]) / len(os.sched_getaffinity(0))
    return dict(seconds=seconds, rows=rows, first_step_s=first_step_s, cpu_busy=cpu_busy)


class _IteratorInputs:
    """`tensorflow.compat.v1` as legacy/cifar_resnet.py sees it, except that its `inputs`, `labels`
    and `current_batch_size` placeholders default to the iterator's tensors (`placeholder_with_default`).

    The graph is otherwise the program's own; a step feeds only keep_prob and is_training.
    """

    def __init__(self, tf1: Any, defaults: dict[str, Any]) -> None:
        self._tf1, self._defaults = tf1, defaults

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tf1, name)

    def placeholder(self, dtype: Any, shape: Any = None, name: Optional[str] = None) -> Any:
        if name not in self._defaults:
            return self._tf1.placeholder(dtype, shape, name=name)
        default = self._tf1.cast(self._defaults[name], dtype)
        return self._tf1.placeholder_with_default(default, default.shape if shape is None else shape, name=name)


def cifar_legacy_worker(spec: dict[str, Any], launched: float) -> dict[str, Any]:
    import numpy as np
    import tensorflow.compat.v1 as tf1
    from legacy import cifar_resnet as program, towers
    from records import cifar10

    n, batch = spec["replicas"], spec["batch"]
    train_files, valid_files = cifar10.ensure_default_data(program.EMBEDDED_DATA_DIR)
    with tf1.Graph().as_default():
        iterator, image_batch, label_batch, *_ = program.make_datasets(
            train_files, valid_files, batch, 50, program.shuffle_buffer, CIFAR_EPOCHS)
        devices = towers.tower_devices(n)
        feed_numpy = spec["variant"] == "legacy-feed"
        if feed_numpy:
            g = program.build_graph(n, "fix", batch // n, program.boundaries, program.values, devices=devices)
        else:
            defaults = {"inputs": image_batch, "labels": label_batch,
                        "current_batch_size": tf1.shape(image_batch)[0] // n}
            program.tf = _IteratorInputs(tf1, defaults)
            try:
                g = program.build_graph(n, "fix", batch // n, program.boundaries, program.values, devices=devices)
            finally:
                program.tf = tf1
        init = tf1.global_variables_initializer()
        fetches = [g.summary_op, g.train_step, g.loss, g.accuracy, g.tower_losses]
        with tf1.Session(config=program.session_config(n, "auto", devices)) as sess:
            sess.run(init)
            sess.run(iterator.initializer)

            def step():
                if feed_numpy:  # the original's loop: fetch the batch, feed it back
                    batch_x, batch_y = sess.run([image_batch, label_batch])
                    feed, _ = program.make_feed(g, batch_x, batch_y, True, CIFAR_KEEP_PROB)
                    cut = program.tower_split(g, len(batch_x))
                    out = sess.run(fetches, feed)
                    rows = cut.rows - cut.dropped
                else:
                    feed = {g.is_training: True, g.keep_prob: CIFAR_KEEP_PROB}
                    *out, per_tower = sess.run(fetches + [g.current_batch_size], feed)
                    rows = int(per_tower) * n
                if not np.all(np.isfinite(out[-1])):
                    raise RuntimeError(f"loss not finite: {out[-1]}")
                return rows

            return dict(_timed_loop(step, spec, launched), devices=devices)


def distribute(strategy: Any, dataset: Any, inputs: str) -> Any:
    """The modern programs' input path (`modern.cluster.distribute`, as their `train`), or with
    inputs="strategy" the strategy's own distributed iterator."""
    from modern import cluster
    if inputs == "strategy":
        return strategy.experimental_distribute_dataset(dataset)
    return cluster.distribute(strategy, None, dataset)


def cifar_modern_worker(spec: dict[str, Any], launched: float) -> dict[str, Any]:
    import tensorflow as tf
    from modern import cifar_resnet as program
    from modern.runtime import make_strategy
    from records import cifar10

    n, batch = spec["replicas"], spec["batch"]
    fused, reduction, inputs = MODERN_SETTINGS[spec["variant"]]
    strategy = make_strategy(n, log=None, reduction=reduction)  # first: may split the CPU
    train_files, valid_files = cifar10.ensure_default_data(program.EMBEDDED_DATA_DIR)
    with strategy.scope():  # as program.build
        model = program.resnet_v2_50(num_classes=program.num_classes, keep_prob=CIFAR_KEEP_PROB)
        optimizer = program.make_optimizer(program.boundaries, program.values, fused=fused)
        optimizer.build(model.trainable_variables)
    train_ds, _ = program.make_datasets(train_files, valid_files, batch, 50, program.shuffle_buffer,
                                        CIFAR_EPOCHS, n)
    dist_train_ds = distribute(strategy, train_ds, inputs)
    iterator = iter(dist_train_ds)
    train_step = program.make_train_step(model, optimizer, strategy, return_metrics=True,
                                         element_spec=dist_train_ds.element_spec)

    def step():  # the program's loop body, without its every-N-steps logging
        loss, metrics = train_step(next(iterator))
        float(loss), float(metrics["accuracy"]), float(metrics["learning_rate"])
        if not tf.math.is_finite(loss):
            raise RuntimeError(f"loss not finite: {float(loss)}")
        return int(metrics["rows"])

    return dict(_timed_loop(step, spec, launched), devices=list(strategy.extended.worker_devices))


def mnist_legacy_worker(spec: dict[str, Any], launched: float) -> dict[str, Any]:
    import tensorflow.compat.v1 as tf1
    from legacy import mnist_multi_gpu as program
    from legacy.towers import session_config, tower_devices

    n, batch = spec["replicas"], spec["batch"]
    per_tower = spec["variant"] == "legacy-per-tower"
    data_path, _ = program.resolve_data_path(None)
    devices = tower_devices(n)
    with tf1.Graph().as_default(), tf1.device("/cpu:0"):
        if per_tower:
            tower_inputs = program.get_input(data_path, batch, num_batches=n)
        else:
            tower_inputs = program.get_input(data_path, batch) * n  # the original: one batch, every tower
        g = program.build_train_graph(tower_inputs, decay_steps=60000 / batch, devices=devices)
        init = tf1.global_variables_initializer()
        with tf1.Session(config=session_config(n)) as sess:
            sess.run(init)

            def step():
                sess.run([g.train_op, g.cur_loss])
                return batch * n if per_tower else batch  # distinct examples

            return dict(_timed_loop(step, spec, launched), devices=devices)


def mnist_modern_worker(spec: dict[str, Any], launched: float) -> dict[str, Any]:
    from modern import mnist_multi_gpu as program
    from modern.runtime import make_strategy

    n, batch = spec["replicas"], spec["batch"]
    _, reduction, inputs = MODERN_SETTINGS[spec["variant"]]
    strategy = make_strategy(n, log=None, reduction=reduction)
    data_path, _, _, _ = program.check_data(None, None)
    with strategy.scope():  # as program.train
        model = program.build_model()
        optimizer = program.make_optimizer(0.001, 60000 / batch, 0.99)
        optimizer.build(model.trainable_variables)
        ema, _ = program.make_moving_average(model, optimizer)
    dist_dataset = distribute(strategy, program.get_input(data_path, batch, n), inputs)
    iterator = iter(dist_dataset)
    train_step = program.make_train_step(model, optimizer, strategy, ema, return_grads=True,
                                         element_spec=dist_dataset.element_spec)

    def step():
        loss, _ = train_step(next(iterator))
        float(loss)
        return batch * n

    return dict(_timed_loop(step, spec, launched), devices=list(strategy.extended.worker_devices))


def calibrate_worker(spec: dict[str, Any], launched: float) -> dict[str, Any]:
    """The matmul peak (GFLOP/s) and each side's forward FLOPs per example."""
    import tensorflow as tf
    size = spec["matmul_size"]
    a, b = tf.random.normal([size, size]), tf.random.normal([size, size])
    matmul = tf.function(tf.matmul)
    matmul(a, b).numpy()
    best = float("inf")
    for _ in range(20):
        t = time.perf_counter()
        matmul(a, b).numpy()
        best = min(best, time.perf_counter() - t)
    flops = {}
    for model in spec["models"]:
        flops[model] = {"legacy": _forward_flops(*_legacy_forward(model)),
                        "modern": _forward_flops(*_modern_forward(model))}
    return dict(matmul_gflops=2 * size ** 3 / best / 1e9, matmul_size=size, flops=flops)


def _forward_flops(graph: Any, output: Any) -> int:
    """The profiler's float ops of the part of `graph` that computes `output` (not the initialisers)."""
    import tensorflow as tf
    graph_def = tf.compat.v1.graph_util.extract_sub_graph(graph.as_graph_def(add_shapes=True), [output.op.name])
    forward = tf.Graph()
    with forward.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    return tf.compat.v1.profiler.profile(graph=forward, options=options).total_float_ops


def _legacy_forward(model: str) -> tuple[Any, Any]:
    """(graph, logits): one example's legacy inference pass (slim's network, as the programs build it)."""
    import tensorflow.compat.v1 as tf1
    graph = tf1.Graph()
    with graph.as_default():
        if model == "cifar":
            import tf_slim as slim
            from tf_slim import nets
            from legacy import cifar_resnet as program
            x = tf1.placeholder(tf1.float32, [1, program.image_size, program.image_size, 3])
            with slim.arg_scope(nets.resnet_v2.resnet_arg_scope()):
                net, _ = nets.resnet_v2.resnet_v2_50(x, num_classes=None, is_training=False)
            with tf1.variable_scope("Logits"):
                logits = slim.fully_connected(tf1.squeeze(net, axis=[1, 2]), program.num_classes, activation_fn=None)
        else:
            from legacy import mnist_inference
            logits = mnist_inference.inference(tf1.placeholder(tf1.float32, [1, mnist_inference.INPUT_NODE]), None)
    return graph, logits


def _modern_forward(model):
    """(graph, logits): one example's modern inference pass (the Keras model under tf.function)."""
    import tensorflow as tf
    if model == "cifar":
        from modern import cifar_resnet as program
        net, shape = program.resnet_v2_50(num_classes=program.num_classes), [1, 32, 32, 3]
    else:
        from modern import mnist_multi_gpu as program
        net, shape = program.build_model(), [1, program.INPUT_NODE]
    concrete = tf.function(lambda x: net(x, training=False)).get_concrete_function(tf.TensorSpec(shape))
    return concrete.graph, concrete.outputs[0]


# Each variant runs in its side's worker: (legacy worker, modern worker) per model.
SIDES = {"cifar": (cifar_legacy_worker, cifar_modern_worker), "mnist": (mnist_legacy_worker, mnist_modern_worker)}
WORKERS: dict[tuple[str, Optional[str]], Callable[[dict[str, Any], float], dict[str, Any]]] = {
    (model, variant): SIDES[model][variant.startswith("modern")]
    for model, variants in VARIANTS.items() for variant in variants}
WORKERS[("calibrate", None)] = calibrate_worker


def run_worker(spec_json: str) -> None:
    spec = json.loads(spec_json)
    worker = WORKERS[(spec["model"], spec.get("variant"))]
    result = worker(spec, spec["launched"])
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(RESULT_TAG + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------------------------
# The driver: configurations, interleaved processes, the table.
# ----------------------------------------------------------------------------------------------
def spawn(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one worker process; return its result dict (raise with its stderr tail if it fails)."""
    spec = dict(spec, launched=time.time())
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)],
                          cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(f"worker {spec['model']} {spec.get('variant')} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1][len(RESULT_TAG):])


def configurations(args: argparse.Namespace) -> list[dict[str, Any]]:
    models = ("cifar", "mnist") if args.model == "all" else (args.model,)
    configs = []
    for model in models:
        batches = args.batch or ([16, 64] if model == "cifar" else [100])
        for replicas in args.replicas:
            for batch in batches:
                for variant in VARIANTS[model]:
                    if args.variants is None or variant in args.variants:
                        configs.append(dict(model=model, variant=variant, replicas=replicas, batch=batch,
                                            warmup=args.warmup, steps=args.steps))
    return configs


def summarise(config: dict[str, Any], runs: Sequence[dict[str, Any]], calibration: dict[str, Any]) -> dict[str, Any]:
    """One JSON record from the runs (worker results) of one configuration."""
    timed = [(r, s) for run in runs for r, s in zip(run["rows"][config["warmup"]:], run["seconds"][config["warmup"]:])]
    rates = sorted(r / s for r, s in timed)
    median = statistics.median(rates)
    side = "legacy" if config["variant"].startswith("legacy") else "modern"
    flops = calibration["flops"][config["model"]][side]
    achieved = median * 3 * flops / 1e9
    return dict(config, examples_per_sec_median=median, examples_per_sec_min=rates[0],
                examples_per_sec_max=rates[-1],
                step_ms_median=1000 * statistics.median(s for _, s in timed),
                first_step_s=statistics.median(run["first_step_s"] for run in runs),
                peak_rss_mb=max(run["peak_rss_mb"] for run in runs),
                cpu_busy=statistics.median(run["cpu_busy"] for run in runs),
                forward_flops_per_example=flops, achieved_gflops=achieved,
                share_of_matmul_peak=achieved / calibration["matmul_gflops"],
                timed_steps=len(timed), repeats=len(runs), devices=runs[0]["devices"], vs_legacy=None)


def add_ratios(records: Sequence[dict[str, Any]]) -> None:
    """vs_legacy: each record's median examples/sec over its baseline's (the first legacy variant)."""
    for record in records:
        base = next((b for b in records if b["model"] == record["model"] and b["replicas"] == record["replicas"]
                     and b["batch"] == record["batch"] and b["variant"].startswith("legacy")), None)
        if base is not None:
            record["vs_legacy"] = record["examples_per_sec_median"] / base["examples_per_sec_median"]


def table(records: Sequence[dict[str, Any]], calibration: dict[str, Any]) -> str:
    header = (f"{'model':6} {'variant':24} {'rep':>3} {'batch':>5} {'ex/s med':>9} {'min':>7} {'max':>7} "
              f"{'x legacy':>8} {'step ms':>8} {'1st step s':>10} {'RSS MB':>7} {'MFLOP/ex':>9} "
              f"{'GFLOP/s':>8} {'% peak':>6} {'% CPU':>5}")
    lines = [f"matmul peak: {calibration['matmul_gflops']:.1f} GFLOP/s ({calibration['matmul_size']}^2 float32)",
             header, "-" * len(header)]
    for r in records:
        ratio = f"{r['vs_legacy']:.2f}" if r["vs_legacy"] is not None else "-"
        lines.append(
            f"{r['model']:6} {r['variant']:24} {r['replicas']:>3} {r['batch']:>5} "
            f"{r['examples_per_sec_median']:>9.1f} {r['examples_per_sec_min']:>7.1f} {r['examples_per_sec_max']:>7.1f} "
            f"{ratio:>8} {r['step_ms_median']:>8.1f} {r['first_step_s']:>10.1f} {r['peak_rss_mb']:>7.0f} "
            f"{r['forward_flops_per_example'] / 1e6:>9.2f} {r['achieved_gflops']:>8.2f} "
            f"{100 * r['share_of_matmul_peak']:>6.1f} {100 * r['cpu_busy']:>5.0f}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.worker:
        run_worker(args.worker)
        return 0
    configs = configurations(args)
    if not configs:
        print("no configuration matches --model / --variants", file=sys.stderr)
        return 2
    models = sorted({c["model"] for c in configs})
    begin = time.time()
    print(f"{len(configs)} configurations x {args.repeats} repeats, each in its own process "
          f"({args.warmup} warm-up + {args.steps} timed steps)", flush=True)
    calibration = spawn(dict(model="calibrate", matmul_size=args.matmul_size, models=models))
    print(f"calibration: matmul peak {calibration['matmul_gflops']:.1f} GFLOP/s; forward MFLOP/example "
          + ", ".join(f"{m} legacy {f['legacy'] / 1e6:.2f} modern {f['modern'] / 1e6:.2f}"
                      for m, f in calibration["flops"].items()), flush=True)
    runs: list[list[dict[str, Any]]] = [[] for _ in configs]
    for repeat in range(args.repeats):
        for i, config in enumerate(configs):
            spec = dict(config)
            if args.trace:
                spec["trace"] = os.path.join(args.trace, f"{config['model']}-{config['variant']}-r{config['replicas']}"
                                                         f"-b{config['batch']}-{repeat}")
            result = spawn(spec)
            runs[i].append(result)
            timed = [r / s for r, s in zip(result["rows"][args.warmup:], result["seconds"][args.warmup:])]
            print(f"[repeat {repeat + 1}/{args.repeats}, {i + 1}/{len(configs)}] {config['model']} "
                  f"{config['variant']} replicas {config['replicas']} batch {config['batch']}: "
                  f"{statistics.median(timed):.1f} examples/sec (median), first step after "
                  f"{result['first_step_s']:.1f} s, peak RSS {result['peak_rss_mb']:.0f} MB "
                  f"[{time.time() - begin:.0f} s]", flush=True)
    records = [summarise(config, r, calibration) for config, r in zip(configs, runs)]
    add_ratios(records)
    print(table(records, calibration))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"command": "python benchmarks/bench.py " + " ".join(sys.argv[1:] if argv is None else argv),
                       "calibration": calibration, "configurations": records}, f, indent=1)
        print(f"results in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
