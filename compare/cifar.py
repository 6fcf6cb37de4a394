"""Parity checks for the CIFAR program: `legacy/cifar_resnet.py` against `modern/cifar_resnet.py`.

Each side is built by the program's own functions from the program's own parsed command line:

  legacy: `parse_args`, `make_datasets`, `build_graph`, `make_feed`, `session_config`, `validate`
          (the graph is the one the trainer runs: control flow v2, its session config);
  modern: `parse_args`, `make_datasets`, `build` (model + optimizer), `make_train_step`,
          `make_eval_step`, `validate` (Adam's slots via `modern.keras_adapter`); the model's own `ReplicaDropout`.

Nothing is stood in for.  What the harness needs to see inside, it reads without changing the judged
graph or step: the legacy batch-norm statistics are outputs of the `cond` ops slim builds; the
modern gradients are read out of the train step itself, from the Adam slot it fills
(m_after = m_before + (g - m_before) * (1 - beta1)); the modern dropout masks are drawn by the
model's own dropout layer from the seed the step is about to use, and the same masks are fed to
the legacy towers' dropout noise.

Both start from the same weights (written by the legacy Saver, read by
`modern.checkpoints.load_tf1_checkpoint`) and see the same rows; every tensor is compared through the
TF1 names of `modern.checkpoints.tf1_variable_map`.  Known TF1/TF2 differences are EXPECTED checks,
each a prediction computed from the split arithmetic or a formula, which would FAIL if the modern
program behaved like the legacy one.
"""
import dataclasses
import itertools
import inspect
import os
import tempfile

import keras
import numpy as np
import tensorflow as tf
import tf_slim as slim
from tf_slim import nets

from compare import common
from compare import programs
from compare.report import EPS32, TOLERANCES, TensorError, judge, share_floors, tensor_error
from modern import checkpoints
from modern import cluster
from modern import keras_adapter
from records import cifar10

tf1 = tf.compat.v1
MODEL = "cifar"
NUM_CLASSES = cifar10.NUM_CLASSES
FEATURES = 2048  # the pooled ResNet-v2-50 features that the Logits dropout sees
# slim's resnet_arg_scope batch-norm decay and epsilon: the reference values the predictions use.
GROUPS = ("basics", "forward", "training", "splits", "steps", "free", "tf1")  # run_checks' groups
SLIM_BN = {k: inspect.signature(nets.resnet_v2.resnet_arg_scope).parameters[k].default
           for k in ("batch_norm_decay", "batch_norm_epsilon")}


@dataclasses.dataclass
class Config:
    """What the harness runs: tower count, rows, steps; the programs get their own defaults."""
    towers: int = 2
    steps: int = 6               # restart-per-step training steps (each from the legacy state)
    free_steps: int = 20         # free-running steps, legacy vs modern vs legacy perturbed by 1 ulp
    seed: int = 0
    quick: bool = False
    checkpoint: str = None
    tf1_runtime: bool = True     # also judge the legacy graph on TF1's runtime (a second process)
    weighted: bool = True        # the split checks that need the legacy graph built --split=weighted
    # 8 rows per tower: batch norm at block4's 1x1 maps normalises over a tower's rows only; with
    # 2 rows the training loss amplifies float32 round-off past 1e-1 on either program alone.
    rows_per_tower: int = 8


@dataclasses.dataclass
class Legacy:
    """The legacy program's graph (`build_graph`'s namespace `ns`) in its own session."""
    graph: object
    ns: object
    sess: object
    args: object
    saver: object                # all model variables (slim.get_model_variables)
    init: object
    model_variables: dict        # TF1 name -> variable
    trainable: set
    moving: dict                 # the batch-norm moving statistics
    slots: dict                  # TF1 name -> (m, v) slot variables
    beta_powers: tuple           # (beta1_power, beta2_power) variables
    bn_stats: dict               # (tower, scope) -> (batch mean, Bessel variance) tensors
    dropout_out: list            # per tower: the dropout's output (the fc's input)
    data: tuple                  # make_datasets' iterators and batches, on the harness TFRecords
    setters: dict = None         # variable name -> (placeholder, assign op): the state in one run
    start_path: str = ""


@dataclasses.dataclass
class Modern:
    """The modern program's model, optimizer and steps under its MirroredStrategy."""
    model: object
    optimizer: object
    strategy: object
    args: object
    names: dict                  # TF1 name -> modern variable
    train_step: object
    eval_step: object
    spec: object                 # the element_spec every step is traced for
    draw: object = None          # draw_masks' tf.function


@dataclasses.dataclass
class Harness:
    cfg: Config
    legacy: Legacy
    modern: Modern
    xs: np.ndarray
    ys: np.ndarray
    files: dict
    tmp_dir: str
    weighted: Legacy = None      # the legacy graph built --split=weighted (on first use)
    start: dict = None           # start_state's arrays, read once


def make_batches(steps, rows, seed):
    """Preprocessed-looking images in [-1, 1] and one-hot labels, deterministic."""
    rng = np.random.RandomState(seed)
    x = rng.uniform(-1, 1, size=(steps, rows, 32, 32, 3)).astype(np.float32)
    labels = rng.randint(0, NUM_CLASSES, size=(steps, rows))
    return x, np.eye(NUM_CLASSES, dtype=np.float32)[labels]


def pipeline(num_towers):
    """The harness's sizes on the programs' pipelines, for N towers: training batches of N + 2 rows
    over 3 (N + 2) + 1 rows, so that each epoch ends on ONE row (fewer than the towers, for N > 1);
    validation batches of N + 1 rows over 3 (N + 1) - 1 rows, so that the last has N."""
    n = num_towers
    return {"batch_size": n + 2, "valid_batch_size": n + 1, "epochs": 2, "shuffle_buffer": 1,
            "train_rows": 3 * (n + 2) + 1, "valid_rows": 3 * (n + 1) - 1}


def replica_rows(rows, n):
    """The rows of each replica when `rows` are cut as the strategy cuts them (empty_replica)."""
    per = -(-rows // n)
    return [max(0, min(per, rows - i * per)) for i in range(n)]


def empty_replica(rows, n):
    """The strategy re-batches `rows` into replica batches of ceil(rows / n), in order: the last
    replica gets none when ceil(rows / n) * (n - 1) >= rows (measured: 5 rows on 4 replicas give
    2 + 2 + 1 + 0, 4 on 3 give 2 + 2 + 0).  The modern program must then copy the batch."""
    return replica_rows(rows, n)[-1] == 0


def write_records(tmp_dir, seed, num_towers):
    """Small TFRecord files in the real format (records.cifar10), for both programs' pipelines."""
    rng = np.random.RandomState(seed + 1)
    files, sizes = {}, pipeline(num_towers)
    for name in ("train", "valid"):
        rows = sizes[f"{name}_rows"]
        images = rng.randint(0, 256, size=(rows, 32, 32, 3)).astype(np.uint8)
        labels = rng.randint(0, NUM_CLASSES, size=rows)
        files[name] = os.path.join(tmp_dir, f"{name}.tfrecords")
        cifar10.write_tfrecords(files[name], images, labels)
    return files


def program_args(parse_args, towers_flag, cfg, tmp_dir, extra=()):
    """A program's own parsed defaults, with the tower count (and the harness's folders) set."""
    args = parse_args([towers_flag, str(cfg.towers), *extra])
    for key, value in pipeline(cfg.towers).items():
        if hasattr(args, key) and getattr(args, key) is None:
            setattr(args, key, value)
    args.model_dir = os.path.join(tmp_dir, "modern_model")
    return args


# ---------------------------------------------------------------------------------------------
# The legacy side

def build_legacy(cfg, files, tmp_dir, split="fix", start_path=None):
    """The legacy graph as the program builds it, started from fresh weights (batch-norm statistics
    randomised), from --checkpoint, or from `start_path`."""
    args = program_args(programs.legacy_cifar.parse_args, "--num_towers", cfg, tmp_dir)
    graph = tf1.Graph()
    with graph.as_default():
        tf1.set_random_seed(cfg.seed)
        sizes = pipeline(cfg.towers)
        data = programs.legacy_cifar.make_datasets(
            [files["train"]], [files["valid"]], sizes["batch_size"], sizes["valid_batch_size"],
            sizes["shuffle_buffer"], sizes["epochs"])
        ns = programs.legacy_cifar.build_graph(
            num_towers=cfg.towers, split=split, static_batch_size=cfg.rows_per_tower,
            boundaries=args.boundaries, values=args.values)
        model_variables = {v.op.name: v for v in slim.get_model_variables()}
        trainable = {v.op.name for v in tf1.trainable_variables()}
        slots = {n: (ns.optimizer.get_slot(v, "m"), ns.optimizer.get_slot(v, "v"))
                 for n, v in model_variables.items() if n in trainable}
        powers = {v.op.name: v for v in tf1.global_variables() if v.op.name in ("beta1_power", "beta2_power")}
        legacy = Legacy(
            graph=graph, ns=ns, sess=None, args=args, saver=tf1.train.Saver(var_list=model_variables),
            init=tf1.global_variables_initializer(), model_variables=model_variables, trainable=trainable,
            moving={n: v for n, v in model_variables.items() if "/moving_" in n}, slots=slots,
            beta_powers=(powers["beta1_power"], powers["beta2_power"]),
            bn_stats=legacy_bn_batch_stats(graph, cfg.towers, model_variables),
            dropout_out=[t.op.inputs[0].op.inputs[0] for t in ns.tower_logits], data=data)
        # Setting the state variable by variable (Variable.load) costs one new executor per
        # variable on this graph; one assign per variable, run together, costs one.
        state_vars = (list(model_variables.values()) + [s for pair in slots.values() for s in pair]
                      + list(legacy.beta_powers) + [ns.global_step])
        with tf1.name_scope("parity_setters/"):
            legacy.setters = {}
            for v in state_vars:
                ph = tf1.placeholder(v.dtype.base_dtype, v.shape)
                legacy.setters[v.op.name] = (ph, v.assign(ph))
    legacy.sess = tf1.Session(graph=graph, config=programs.legacy_cifar.session_config(cfg.towers))
    legacy.sess.run(legacy.init)
    with graph.as_default():
        if start_path or cfg.checkpoint:
            legacy.saver.restore(legacy.sess, start_path or cfg.checkpoint)
        else:
            # Fresh moving statistics are 0 and 1, which would hide a wrong batch-norm epsilon or
            # variance formula in inference mode: randomise them (mean ~ N(0, 0.1), var ~ U(0.5, 1.5)).
            rng = np.random.RandomState(cfg.seed)
            feed = {}
            for name, var in legacy.moving.items():
                shape = var.shape.as_list()
                value = rng.normal(0, 0.1, shape) if name.endswith("mean") else rng.uniform(0.5, 1.5, shape)
                feed[legacy.setters[name][0]] = value.astype(np.float32)
            legacy.sess.run([legacy.setters[n][1] for n in legacy.moving], feed)
        legacy.start_path = start_path or legacy.saver.save(
            legacy.sess, os.path.join(tmp_dir, "cifar_start.ckpt"), write_meta_graph=False)
    return legacy


def legacy_bn_batch_stats(graph, num_towers, moving):
    """{(tower, TF1 BN scope): (batch mean, Bessel-corrected batch variance)} tensors.

    slim's fused batch norm returns `outputs, mean, variance = smart_cond(is_training, training
    branch, inference branch)`: with is_training fed True, outputs 1 and 2 of that `cond` (an `If`
    op `<scope>/cond` under control flow v2) are the batch statistics its `assign_moving_average`
    uses.  Tower i > 0's ops live under the uniquified name scope `resnet_v2_50_<i>`.  Control
    flow v2 marks the `If` op unfetchable once gradients are taken through it, so each statistic
    is read through an `Identity` tap added beside the graph: nothing the program runs depends
    on a tap, and no op of the program's graph is changed.
    """
    stats = {}
    for op in graph.get_operations():
        if op.type != "If" or not op.name.endswith("/cond") or not op.name.startswith("resnet_v2_50"):
            continue
        head, rest = op.name.split("/", 1)
        scope = "resnet_v2_50/" + rest[:-len("/cond")]
        if scope + "/moving_mean" in moving:
            tower = int(head.rsplit("_", 1)[1]) if head != "resnet_v2_50" else 0
            with tf1.name_scope("parity_taps/"):
                stats[(tower, scope)] = (tf1.identity(op.outputs[1]), tf1.identity(op.outputs[2]))
    if len(stats) != 49 * num_towers:
        raise RuntimeError(f"found {len(stats)} batch-norm conds, expected {49 * num_towers}")
    return stats


def legacy_feed(legacy, x, y, masks=None, training=True, split=None, cut=None):
    """The program's `make_feed` (keep_prob from the program's defaults, 1 when not training), plus
    dropout masks fed as each tower's uniform noise (a unit is kept where noise >= 1 - keep_prob:
    1 keeps, 0 drops).  masks: one per tower, or one array of per-row masks, cut as the towers
    are; `cut` (starts, sizes, weights) overrides the weighted graph's split."""
    keep_prob = legacy.args.keep_prob if training else 1.0
    feed, dropped = programs.legacy_cifar.make_feed(legacy.ns, x, y, training, keep_prob, split=split)
    if cut is not None:
        feed.update({legacy.ns.tower_starts: cut[0], legacy.ns.tower_sizes: cut[1], legacy.ns.tower_weights: cut[2]})
    if isinstance(masks, np.ndarray):
        split_of = programs.legacy_cifar.tower_split(legacy.ns, len(x), split)
        masks = [masks[s:s + n] for s, n in zip(split_of.starts, split_of.sizes)]
    for i, mask in enumerate(masks or []):
        feed[legacy.ns.dropout_noise[i]] = mask
    return feed, dropped


def legacy_state(legacy):
    """Weights and moving statistics, Adam slots, beta powers and global_step, as numpy."""
    weights, slots, powers, step = legacy.sess.run(
        [legacy.model_variables, legacy.slots, legacy.beta_powers, legacy.ns.global_step])
    return {"weights": weights, "slots": slots, "powers": powers, "step": int(step)}


def set_legacy_state(legacy, state):
    values = dict(state["weights"])
    for name, (m, v) in state["slots"].items():
        values[legacy.slots[name][0].op.name], values[legacy.slots[name][1].op.name] = m, v
    values.update((var.op.name, p) for var, p in zip(legacy.beta_powers, state["powers"]))
    values[legacy.ns.global_step.op.name] = state["step"]
    legacy.sess.run([legacy.setters[n][1] for n in values], {legacy.setters[n][0]: x for n, x in values.items()})


def legacy_gradients(legacy, x, y, masks, **kw):
    """(total loss, {TF1 name: averaged gradient}, dropped rows): the program's `grads` tensors."""
    feed, dropped = legacy_feed(legacy, x, y, masks, **kw)
    total, grads = legacy.sess.run([legacy.ns.total_loss, [g for g, _ in legacy.ns.grads]], feed)
    return float(total), {v.op.name: g for g, (_, v) in zip(grads, legacy.ns.grads)}, dropped


# ---------------------------------------------------------------------------------------------
# The modern side

def build_modern(cfg, strategy, start_path, tmp_dir, extra_argv=()):
    """The modern program's `build` (model, optimizer) from its own parsed defaults, loaded with the
    legacy start weights; its train and eval steps traced once for every batch size."""
    args = program_args(programs.modern_cifar.parse_args, "--num_replicas", cfg, tmp_dir, extra_argv)
    args.pretrained = start_path
    model, optimizer, *_ = programs.modern_cifar.build(strategy, args)
    checkpoints.load_tf1_checkpoint(model, start_path)  # Logits too (build excludes them)
    spec = element_spec(strategy)
    return Modern(model=model, optimizer=optimizer, strategy=strategy, args=args,
                  names=checkpoints.tf1_variable_map(model),
                  train_step=programs.modern_cifar.make_train_step(model, optimizer, strategy,
                                                                   return_metrics=True, element_spec=spec),
                  eval_step=programs.modern_cifar.make_eval_step(model, strategy, element_spec=spec), spec=spec)


def replica_batches(strategy, x, y):
    """One global batch through the modern program's input path (`spread_short_batch` on a
    dataset of global batches, then `cluster.distribute`), as `make_datasets` and `train` feed
    the trainer."""
    n = strategy.num_replicas_in_sync
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x)).map(
        lambda a, b: programs.modern_cifar.spread_short_batch(a, b, n))
    return cluster.distribute(strategy, None, dataset)


def distribute(strategy, x, y):
    """(the distributed element of `replica_batches`, each replica's row count)."""
    element = next(iter(replica_batches(strategy, x, y)))
    rows = [int(t.shape[0]) for t in strategy.experimental_local_results(element[1])]
    return element, rows


def element_spec(strategy):
    """The distributed element_spec of `distribute` (no static row count: one trace for all)."""
    x, y = make_batches(1, 3, 0)
    return replica_batches(strategy, x[0], y[0]).element_spec


def set_modern_state(modern, state):
    """Weights and moving statistics, Adam slots and the step counter, assigned eagerly to every
    replica's copy of each variable (`values` of a mirrored variable): one host-to-tensor copy per
    value, no cross-replica machinery (a mirrored `assign` per variable costs a second or two per
    state, a traced assign-all five seconds to trace)."""
    pairs = [(modern.names[n], state["weights"][n]) for n in sorted(state["weights"])]
    for n in sorted(state["slots_for"]):
        pairs += zip(keras_adapter.adam_slots(modern.optimizer, modern.names[n]), state["slots"][n])
    pairs.append((modern.optimizer.iterations, np.int64(state["step"])))
    for target, value in pairs:
        variable = target.value if isinstance(target, keras.Variable) else target  # the tf.Variable
        copies = getattr(variable, "values", None) or (variable,)
        value = tf.constant(value) if len(copies) > 1 else value  # one host copy for all replicas
        for copy in copies:
            with tf.device(copy.device):
                copy.assign(value)


def modern_slots(modern, names):
    return {n: tuple(s.numpy() for s in keras_adapter.adam_slots(modern.optimizer, modern.names[n])) for n in names}


def modern_masks(modern, element):
    """The dropout masks the next training step will draw, one per replica (1 kept, 0 dropped).

    The model's own dropout layer is called on ones, with each replica's row count, from the seed
    the step is about to use; then the seed is put back, so the step draws the same masks."""
    state = modern.model.dropout.seed_generator.state
    before = state.numpy()
    masks = [(m != 0).astype(np.float32) for m in common.local(modern.strategy, draw_masks(modern, element))]
    state.assign(before)
    return masks


def draw_masks(modern, element):
    """The model's dropout layer in training mode on ones [rows, 2048], on every replica (rows: the
    replica's rows of `element`); advances the layer's seed as a training step does."""
    if modern.draw is None:
        @tf.function(reduce_retracing=True)
        def draw(dist):
            with modern.strategy.scope():
                return modern.strategy.run(
                    lambda x, *_: modern.model.dropout(tf.ones([tf.shape(x)[0], FEATURES]), training=True),
                    args=dist)
        modern.draw = draw
    return modern.draw(element)


def modern_train(modern, x, y, state):
    """One training step of the program's own train step from `state`: (loss, metrics, masks, rows)."""
    set_modern_state(modern, state)
    element, rows = distribute(modern.strategy, x, y)
    masks = modern_masks(modern, element)
    loss, metrics = modern.train_step(element)
    return float(loss), {k: v.numpy() for k, v in metrics.items()}, masks, rows


def one_minus(beta):
    """1 - beta as TF1's ApplyAdam kernel takes it: in float32 (1 - 0.999f = 0.00099998713, 1.3e-5
    below 0.001; Keras' own Adam rounds 1 - beta taken in float64: a real, tiny TF1/Keras difference)."""
    return float(np.float32(1) - np.float32(beta))


def gradients_from_slots(before, after, beta_1):
    """The gradient an Adam step applied:  m_after = m_before + (g - m_before) * (1 - beta1)."""
    def gradient(n):
        return before[n][0].astype(np.float64) + (after[n][0].astype(np.float64) - before[n][0]) / one_minus(beta_1)
    return dict(zip(after, common.parallel_map(gradient, list(after))))


def modern_gradients(h, x, y):
    """(loss, {TF1 name: gradient read out of the train step}, masks, rows) from the start state
    with zero Adam slots, so that the step's m slot holds (1 - beta1) * g."""
    state = start_state(h)
    loss, metrics, masks, rows = modern_train(h.modern, x, y, state)
    grads = gradients_from_slots(state["slots"], modern_slots(h.modern, state["slots_for"]),
                                 h.modern.optimizer.beta_1)
    return loss, grads, masks, rows


def row_masks(masks):
    """Per-replica masks -> one mask per row of the global batch (replica i holds the next rows)."""
    return np.concatenate(masks)


def start_state(h):
    """The common start: the start checkpoint's weights, zero Adam slots, step 0 (a fresh dict each
    call; the arrays, read once, are shared and never written in place)."""
    if h.start is None:
        reader = tf.train.load_checkpoint(h.legacy.start_path)
        weights = {n: reader.get_tensor(n) for n in h.legacy.model_variables}
        zero = {n: (np.zeros_like(weights[n]), np.zeros_like(weights[n])) for n in h.legacy.trainable}
        h.start = {"weights": weights, "slots": zero}
    beta_1, beta_2 = h.modern.optimizer.beta_1, h.modern.optimizer.beta_2
    return {"weights": dict(h.start["weights"]), "slots": dict(h.start["slots"]),
            "slots_for": sorted(h.legacy.trainable), "step": 0,
            "powers": (np.float32(beta_1), np.float32(beta_2))}  # TF1's beta powers start at beta


# ---------------------------------------------------------------------------------------------
# Checks

def grad_errors(legacy, modern, names=None):
    """Per-variable errors, each relative to max(its own norm, its even share of the total norm).

    A free conv bias (`is_free_bias`: its true gradient is 0) holds only the round-off of the sum
    over every position of its layer's output gradients, the same terms whose products with the
    inputs make its layer's weight gradient; it is judged relative to that weight gradient's norm
    too.  Measured (3 towers, 2 rows copied to every tower: gradients of norm ~5e9): conv1/biases
    ~1e2 on each side and 1-16 apart, against 3.5e9 for conv1/weights; relative to its own or its
    even share's norm that round-off measured 7e-6 to 4.7e-4 on the same code and data, varying
    from run to run, over the 2.4e-4 tolerance once among 8 values.
    """
    names = sorted(names or legacy)
    floors = share_floors({n: modern[n] for n in names})
    for n in filter(is_free_bias, names):
        weights = n[:-len("biases")] + "weights"
        if weights in modern:
            floors[n] = max(floors[n], float(np.linalg.norm(np.asarray(modern[weights], np.float64))))
    return common.parallel_map(lambda n: tensor_error(n, legacy[n], modern[n], floors[n]), names)


def check_config(h):
    """Both programs parse the same defaults (and the same non-default command line) to the same
    settings, and build what those settings say: dropout rate, batch-norm decay and epsilon."""
    errors, differ = [], []
    extra = ["--boundaries", "3", "7", "--values", "0.002", "0.0005", "0.0001", "--keep_prob", "0.5",
             "--batch_size", "24", "--epochs", "3", "--valid_every", "7"]
    for argv in ([], extra):
        la = programs.legacy_cifar.parse_args(["--num_towers", "3", *argv])
        ma = programs.modern_cifar.parse_args(["--num_replicas", "3", *argv])
        for key in ("batch_size", "valid_batch_size", "epochs", "shuffle_buffer", "boundaries", "values",
                    "keep_prob", "log_every", "valid_every", "max_steps"):
            if getattr(la, key) != getattr(ma, key):
                differ.append(f"{key}: legacy {getattr(la, key)} vs modern {getattr(ma, key)}")
        if la.num_towers != ma.num_replicas:
            differ.append("tower count")
    for key in ("EMBEDDED_PROFILE", "ORIGINAL_PROFILE"):
        if getattr(programs.legacy_cifar, key) != getattr(programs.modern_cifar, key):
            differ.append(key)
    model = h.modern.model
    built = {"dropout rate": (1 - h.legacy.args.keep_prob, model.dropout.rate)}
    bns = [model.postnorm] + [bn for units in model.blocks for u in units for bn in (u.preact, u.conv1_bn, u.conv2_bn)]
    built["bn decay"] = (SLIM_BN["batch_norm_decay"], max(abs(b.momentum - SLIM_BN["batch_norm_decay"]) for b in bns)
                         + SLIM_BN["batch_norm_decay"])
    built["bn epsilon"] = (SLIM_BN["batch_norm_epsilon"], max(abs(b.epsilon - SLIM_BN["batch_norm_epsilon"]) for b in bns)
                           + SLIM_BN["batch_norm_epsilon"])
    eps_l = {node.attr["epsilon"].f for fn in h.legacy.graph.as_graph_def().library.function
             for node in fn.node_def if node.op == "FusedBatchNormV3"}  # inside the conds' branches
    built["legacy bn epsilon in graph"] = (SLIM_BN["batch_norm_epsilon"], max(eps_l))
    errors = [tensor_error(k, np.float32(b), np.float32(a)) for k, (a, b) in built.items()]
    return judge("configuration (parsed defaults)", MODEL, errors, "exact", ok=not differ and all(
        e.max_abs == 0 for e in errors), note=(f"legacy and modern parse_args agree on defaults and on {len(extra)} "
                                               f"non-default arguments; dropout, {len(bns)} batch norms as slim's"
                                               if not differ else "differ: " + "; ".join(differ[:5])))


def check_variables(h):
    """Same variables after name mapping: names, shapes, trainable; tower 2+ created nothing."""
    legacy, modern = h.legacy, h.modern
    all_names = [v.op.name for v in legacy.graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)]
    ours = {n: (tuple(v.shape.as_list()), n in legacy.trainable) for n, v in legacy.model_variables.items()}
    trainable_m = {id(v) for v in modern.model.trainable_variables}
    theirs = {n: (tuple(v.shape), id(v) in trainable_m) for n, v in modern.names.items()}
    duplicated = [n for n in all_names if n.startswith("resnet_v2_50_") or n.startswith("Logits_")]
    differ = sorted(set(ours.items()) ^ set(theirs.items()))
    rng_state = sum("seed_generator" in v.path for v in modern.model.variables)
    ok = not differ and not duplicated and len(ours) == len(modern.model.variables) - rng_state
    note = (f"{len(ours)} variables ({sum(t for _, t in ours.values())} trainable), one set for "
            f"{len(legacy.ns.tower_losses)} towers" if ok else f"differ: {differ[:6]} duplicated: {duplicated[:6]}")
    return judge("variables", MODEL, [], "exact", ok=ok, note=note)


def check_inference(h, x, y):
    """Inference (is_training False, keep_prob 1 as the program's validation feeds): the legacy
    towers' logits against the model's, and the modern `make_eval_step` sums against the legacy
    tower losses and argmax."""
    legacy, modern = h.legacy, h.modern
    state = start_state(h)
    set_modern_state(modern, state)
    set_legacy_state(legacy, state)
    feed, _ = legacy_feed(legacy, x, y, training=False)
    logits, losses = legacy.sess.run([legacy.ns.tower_logits, legacy.ns.tower_losses], feed)
    logits = np.concatenate(logits)
    b = len(x) // h.cfg.towers
    ce_sum_l = sum(float(loss) * b for loss in losses)
    correct_l = float(np.sum(np.argmax(logits, 1) == np.argmax(y[:len(logits)], 1)))
    element, _ = distribute(modern.strategy, x, y)
    ce_sum_m, correct_m, rows_m = (float(t) for t in modern.eval_step(element))
    errors = [tensor_error("logits", logits, modern.model(x, training=False).numpy()),
              tensor_error("eval_step: summed cross-entropy", ce_sum_l, ce_sum_m),
              tensor_error("eval_step: correct", correct_l, correct_m),
              tensor_error("eval_step: rows", len(x), rows_m)]
    return judge("forward (inference) and eval step", MODEL, errors, "resnet")


def check_dropout(h, rows=4096):
    """The two dropout layers in training mode on a large input of ones: each tower's kept fraction
    is keep_prob within 5 sigma of binomial noise, the kept units are scaled by exactly
    1 / keep_prob, and different towers draw different masks (independent masks agree on a
    fraction kp^2 + (1 - kp)^2 of the units; identical ones on all)."""
    legacy, modern = h.legacy, h.modern
    kp = legacy.args.keep_prob
    feed = {t: np.ones([rows, FEATURES], np.float32) for t in legacy.ns.pre_dropout}
    feed[legacy.ns.keep_prob] = kp
    out_l = legacy.sess.run(legacy.dropout_out, feed)
    dist, _ = distribute(modern.strategy, np.zeros([rows * h.cfg.towers, 1, 1, 1], np.float32),
                         np.zeros([rows * h.cfg.towers, NUM_CLASSES], np.float32))
    out_m = common.local(modern.strategy, draw_masks(modern, dist))
    n = rows * FEATURES
    sigma = np.sqrt(kp * (1 - kp) / n)
    agree_sigma = np.sqrt(0.25 / n)
    errors, notes = [], []
    for side, outs in (("legacy", out_l), ("modern", out_m)):
        kept = [float(np.mean(o != 0)) for o in outs]
        scale = {float(v) for o in outs for v in np.unique(o[o != 0])}
        errors.append(tensor_error(f"{side} kept fraction (5 sigma = {5 * sigma:.1e})",
                                   np.array(kept), np.full(len(kept), kp)))
        errors.append(tensor_error(f"{side} kept value 1/keep_prob", max(scale), np.float32(1 / kp)))
        errors.append(tensor_error(f"{side} kept value 1/keep_prob (min)", min(scale), np.float32(1 / kp)))
        agree = [float(np.mean((outs[i] != 0) == (outs[j] != 0))) for i, j in itertools.combinations(range(len(outs)), 2)]
        if agree:
            errors.append(tensor_error(f"{side} mask agreement between towers (5 sigma = {5 * agree_sigma:.1e})",
                                       np.array(agree), np.full(len(agree), kp * kp + (1 - kp) ** 2)))
        notes.append(f"{side} kept {np.round(kept, 4).tolist()}")
    ok = all(e.max_abs <= 5 * sigma for e in errors if "kept fraction" in e.name) and all(
        e.max_abs <= 5 * agree_sigma for e in errors if "agreement" in e.name) and all(
        e.max_rel <= 2 * EPS32 for e in errors if "kept value" in e.name)
    return judge("dropout (training mode)", MODEL, errors, "resnet", ok=ok,
                 note=f"keep_prob {kp}, {rows}x{FEATURES} units per tower: " + "; ".join(notes))


def check_training(h, x, y):
    """Training mode on one batch: the legacy total loss and averaged gradients (the program's
    `total_loss` and `grads` tensors) against the modern train step's loss and the gradients read
    out of its Adam slots, with the masks the modern dropout draws fed to the legacy towers."""
    set_legacy_state(h.legacy, start_state(h))
    loss_m, grads_m, masks, rows = modern_gradients(h, x, y)
    loss_l, grads_l, _ = legacy_gradients(h.legacy, x, y, masks)
    free = free_biases(h.legacy)
    return [judge("forward (training, same dropout masks)", MODEL, [tensor_error("loss", loss_l, loss_m)],
                  "resnet", note=f"rows per replica {rows}"),
            judge("gradients (read out of the train step)", MODEL, grad_errors(grads_l, grads_m), "resnet",
                  note=f"{len(grads_l)} variables ({len(free)} free conv biases: round-off only), legacy "
                       f"average_gradients vs the step's Adam m / (1 - beta1)")]


def check_checkpoint_round_trip(h):
    """The legacy Saver's checkpoint -> modern model -> TF1 checkpoint: every tensor bit-exact."""
    checkpoints.load_tf1_checkpoint(h.modern.model, h.legacy.start_path)
    back = checkpoints.save_tf1_checkpoint(h.modern.model, os.path.join(h.tmp_dir, "cifar_back.ckpt"))
    src, dst = tf.train.load_checkpoint(h.legacy.start_path), tf.train.load_checkpoint(back)
    names = sorted(src.get_variable_to_shape_map())
    same = sorted(dst.get_variable_to_shape_map()) == names
    errors = [tensor_error(n, dst.get_tensor(n), src.get_tensor(n)) for n in names] if same else []
    exact = same and len(names) == len(h.legacy.model_variables) and all(
        np.array_equal(dst.get_tensor(n), src.get_tensor(n)) for n in names)
    return judge("checkpoint round trip", MODEL, errors, "exact", ok=exact,
                 note=f"{len(names)} tensors TF1 -> modern -> TF1, compared bit for bit")


def check_pipelines(h):
    """Both programs' own `make_datasets` on the same TFRecords (shuffle_buffer 1: the file order):
    every batch of both epochs, the short last batch and validation included, bit for bit; the
    modern weights as `spread_short_batch` predicts them from the row counts."""
    legacy, n = h.legacy, h.cfg.towers
    iterator, images, labels, val_iterator, val_images, val_labels = legacy.data
    legacy.sess.run([iterator.initializer, val_iterator.initializer])
    out_l = {"train": [], "valid": []}
    for key, fetch in (("train", (images, labels)), ("valid", (val_images, val_labels))):
        while True:
            try:
                out_l[key].append(legacy.sess.run(fetch))
            except tf.errors.OutOfRangeError:
                break
    plan = pipeline(n)
    train_ds, val_ds = programs.modern_cifar.make_datasets(
        [h.files["train"]], [h.files["valid"]], plan["batch_size"], plan["valid_batch_size"],
        plan["shuffle_buffer"], plan["epochs"], num_replicas=n)
    errors, problems = [], []
    for key, dataset in (("train", train_ds), ("valid", val_ds)):
        batches_m = [tuple(t.numpy() for t in element) for element in dataset]
        if len(batches_m) != len(out_l[key]):
            problems.append(f"{key}: {len(out_l[key])} legacy batches vs {len(batches_m)} modern")
            continue
        for k, ((xl, yl), (xm, ym, wm)) in enumerate(zip(out_l[key], batches_m)):
            copies = n if empty_replica(len(xl), n) else 1  # spread_short_batch's, from the row count
            errors += [tensor_error(f"{key} batch {k} images", np.tile(xl, [copies, 1, 1, 1]), xm),
                       tensor_error(f"{key} batch {k} labels", np.tile(yl, [copies, 1]), ym),
                       tensor_error(f"{key} batch {k} weights",
                                    np.full(len(xl) * copies, np.float32(1) / np.float32(copies)), wm)]
    sizes = [len(b[0]) for b in out_l["train"]]
    return judge("input pipelines (make_datasets)", MODEL, errors, "exact",
                 ok=not problems and bool(errors) and all(e.max_abs == 0 for e in errors),
                 note="; ".join(problems) or f"train batches {sizes}, valid {[len(b[0]) for b in out_l['valid']]}, "
                                             f"shuffle_buffer 1, {plan['epochs']} epochs")


def check_validation(h):
    """EXPECTED: both programs' `validate` on the same weights and TFRecords.

    Predictions from the per-row inference results (legacy logits, checked equal to the modern ones
    by the inference check), for B rows per batch and N towers:
      legacy (quirk kept): mean over batches of the accuracy of tower 0's B // N rows, and of the
        LAST tower's mean loss;
      modern: correct rows / all rows, summed cross-entropy / all rows.
    """
    legacy, modern, n = h.legacy, h.modern, h.cfg.towers
    state = start_state(h)
    set_modern_state(modern, state)
    set_legacy_state(legacy, state)
    _, _, _, val_iterator, val_images, val_labels = legacy.data
    with tempfile.TemporaryDirectory() as events, legacy.graph.as_default():
        writer = tf1.summary.FileWriter(events)
        acc_l, loss_l = programs.legacy_cifar.validate(legacy.sess, legacy.ns, val_iterator, val_images,
                                                       val_labels, writer, 0, "fix")
        writer.close()
    sizes = pipeline(n)
    _, val_ds = programs.modern_cifar.make_datasets(
        [h.files["train"]], [h.files["valid"]], sizes["batch_size"], sizes["valid_batch_size"],
        sizes["shuffle_buffer"], 1, num_replicas=n)
    acc_m, loss_m = programs.modern_cifar.validate(modern.eval_step, cluster.distribute(modern.strategy, None, val_ds))
    legacy.sess.run(val_iterator.initializer)
    per_batch, hits, ces = [], [], []
    while True:
        try:
            x, y = legacy.sess.run([val_images, val_labels])
        except tf.errors.OutOfRangeError:
            break
        full = modern.model(x, training=False).numpy()
        b = len(x) // n
        if b > 0:  # else every legacy tower is empty: the program skips the batch
            feed, _ = legacy_feed(legacy, x, y, training=False)
            logits = np.concatenate(legacy.sess.run(legacy.ns.tower_logits, feed))
            right = np.argmax(logits, 1) == np.argmax(y[:len(logits)], 1)
            ce = tf.nn.softmax_cross_entropy_with_logits(labels=y[:len(logits)], logits=logits).numpy()
            per_batch.append((np.mean(right[:b]), np.mean(ce[-b:])))
        hits += list(np.argmax(full, 1) == np.argmax(y, 1))
        ces += list(tf.nn.softmax_cross_entropy_with_logits(labels=y, logits=full).numpy())
    pred_l = np.mean(per_batch, axis=0)
    errors = [tensor_error("legacy Valid_Acc", acc_l, pred_l[0]), tensor_error("legacy Valid_Loss", loss_l, pred_l[1]),
              tensor_error("modern accuracy", acc_m, np.mean(hits)), tensor_error("modern loss", loss_m, np.mean(ces))]
    differs = abs(pred_l[0] - np.mean(hits)) > 0 or abs(pred_l[1] - np.mean(ces)) > 1e-4
    ok = differs and all(e.rel_l2 <= TOLERANCES["resnet"][0] for e in errors)
    return judge("validation (validate)", MODEL, errors, "resnet", expected=True, ok=ok,
                 note=f"legacy {acc_l:.4f} / {loss_l:.4f} (mean of per-batch tower-0 accuracy, last-tower loss), "
                      f"modern {acc_m:.4f} / {loss_m:.4f} (over all {len(hits)} rows)")


def is_free_bias(name):
    """A backbone conv bias: it feeds a batch norm (directly or through the residual stream and
    max-pool), so in training mode the loss does not depend on it: its gradient is 0 up to
    round-off, which Adam turns into +-lr steps of arbitrary sign on both sides."""
    return name.startswith("resnet_v2_50/") and name.endswith("/biases")


def free_biases(legacy):
    """The legacy graph's free conv biases (`is_free_bias`)."""
    return {n for n in legacy.trainable if is_free_bias(n)}


def adam_update(m, v, lr, beta1_power, beta2_power, epsilon):
    """TF1's ApplyAdam (and Keras' Adam) step of the weights, in float64, from the slots AFTER it:
        lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t);   w <- w - lr_t * m / (sqrt(v) + epsilon)"""
    lr_t = lr * np.sqrt(1 - beta2_power) / (1 - beta1_power)
    denominator = np.sqrt(v, dtype=np.float64)
    denominator += epsilon
    update = np.multiply(m, -lr_t, dtype=np.float64)
    update /= denominator
    return update


def adam_errors(label, before, after, n, eps, beta_1, beta_2):
    """[update error, v error] of variable `n` against the Adam formula on one side's own slots.

    before: the state the step started from; after: that side's (new weights, new slots,
    gradients read out of m, learning rate, beta powers)."""
    w_after, slots, grads, lr, powers = after
    w0, g, m0, v0 = before["weights"][n], grads[n], before["slots"][n][0], before["slots"][n][1]
    m1, v1 = slots[n]
    pred_update = adam_update(m1, v1, lr, powers[0], powers[1], eps)
    pred_v = np.square(g)
    pred_v -= v0
    pred_v *= one_minus(beta_2)
    pred_v += v0
    # g is read back from m in float32: (m_after - m_before) / (1 - beta1) carries the two slots'
    # ulps times 10.  The floors are norms of ulps: float32 is precise enough for them.
    dg = np.spacing(np.abs(m1, dtype=np.float32))
    dg += np.spacing(np.abs(m0, dtype=np.float32))
    dg *= np.float32(2 * one_minus(beta_2) / one_minus(beta_1))
    dg *= np.abs(g, dtype=np.float32)
    v_floor = np.linalg.norm(dg) + 4 * np.linalg.norm(np.spacing(np.abs(pred_v, dtype=np.float32)))
    # Stored in float32: the new weight to within an ulp of w, the update's own float32 arithmetic
    # to a few ulps of itself; the update is the yardstick.
    floor = np.linalg.norm(np.spacing(np.abs(w0, dtype=np.float32))) + 8 * EPS32 * np.linalg.norm(pred_update)
    update = np.subtract(w_after[n], w0, dtype=np.float64)
    return [tensor_error(f"{label} update", update, pred_update, floor / TOLERANCES["adam"][0]),
            tensor_error(f"{label} v", v1, pred_v, v_floor / TOLERANCES["adam"][0])]


def check_training_steps(h, xs, ys, steps_at):
    """Adam steps with the programs' default configuration, each from one shared state at global
    step `steps_at[k]` (spanning every learning-rate boundary and far past the last).

    Before every step the modern model and optimizer are set to the legacy program's state
    (weights, moving statistics, Adam m and v, step counter; the legacy beta powers to beta^step,
    what that many steps leave), both take one step with the same dropout masks, and then:
      lr:    the legacy `learning_rate` against the rate the modern step reports using;
      loss;  gradients: both read out of the Adam slots, legacy against modern;
      Adam:  each side's new weights and v against the Adam formula on its own slots
             (`adam_update`; epsilon 1e-8, the beta powers each side uses);
      counters: global_step and iterations both advanced by one; beta powers.
    Legacy and modern updates are not compared directly: Adam divides each element's gradient by
    its own size, so where a true gradient is ~0 (the free conv biases) or merely tiny, a
    round-off difference in g becomes a full +-lr difference in the step (with 3 towers the
    legacy 1/3 of average_gradients and the modern 1/B scaling round differently).  Gradients
    within tolerance, and both sides applying the same formula, is the parity Adam allows.
    """
    legacy, modern = h.legacy, h.modern
    beta_1, beta_2, eps = modern.optimizer.beta_1, modern.optimizer.beta_2, 1e-8
    names = sorted(legacy.trainable)
    free = free_biases(legacy)
    base = start_state(h)  # then each step from where the legacy program's previous step left it
    losses_l, losses_m, lr_errors, grad_err, adam_err, count_err, bn = [], [], [], [], [], [], []
    for k, step in enumerate(steps_at):
        state = legacy_state(legacy) if k else base
        # TF1's beta powers hold beta^(s + 1) at global step s (they start at beta, then x beta).
        state.update(step=step, powers=(np.float32(beta_1) ** (step + 1), np.float32(beta_2) ** (step + 1)))
        set_legacy_state(legacy, state)
        state["slots_for"] = names
        loss_m, metrics, masks, rows = modern_train(modern, xs[k], ys[k], state)
        feed, _ = legacy_feed(legacy, xs[k], ys[k], masks)
        loss_l, lr_l, stats, _ = legacy.sess.run([legacy.ns.total_loss, legacy.ns.learning_rate, legacy.bn_stats,
                                                  legacy.ns.train_step], feed)
        after_l = legacy_state(legacy)
        after_m = {n: v.numpy() for n, v in modern.names.items()}
        slots_m = modern_slots(modern, names)
        losses_l.append(float(loss_l))
        losses_m.append(loss_m)
        lr_errors.append(tensor_error(f"lr at step {step}", lr_l, metrics["learning_rate"]))
        g_l = gradients_from_slots(state["slots"], after_l["slots"], beta_1)
        g_m = gradients_from_slots(state["slots"], slots_m, beta_1)
        grad_err += [dataclasses.replace(e, name=f"step {step}: {e.name} gradient") for e in grad_errors(g_l, g_m)]
        powers_l = [float(p) for p in state["powers"]]
        t = int(modern.optimizer.iterations.numpy())
        sides = (("legacy", after_l["weights"], after_l["slots"], g_l, float(lr_l), powers_l),
                 ("modern", after_m, slots_m, g_m, float(metrics["learning_rate"]),  # each its own rate
                  [float(np.float32(beta_1) ** np.float32(t)), float(np.float32(beta_2) ** np.float32(t))]))

        def check_adam(job, step=step, state=state):
            (side, *after), n = job
            return adam_errors(f"{side} step {step}: {n}", state, after, n, eps, beta_1, beta_2)

        for errors in common.parallel_map(check_adam, [(side, n) for side in sides for n in names]):
            adam_err += errors
        count_err += [tensor_error(f"step {step}: legacy global_step", after_l["step"], step + 1),
                      tensor_error(f"step {step}: modern iterations", t, step + 1),
                      tensor_error(f"step {step}: legacy beta powers", np.array(after_l["powers"], np.float64),
                                   np.float32([beta_1, beta_2]) ** np.float64(step + 2))]
        bn.append(({n: state["weights"][n] for n in legacy.moving}, {n: after_l["weights"][n] for n in legacy.moving},
                   {n: after_m[n] for n in legacy.moving}, stats))
    loss_err = [tensor_error(f"loss at step {s}", a, b) for s, a, b in zip(steps_at, losses_l, losses_m)]
    counters_ok = all(e.max_abs == 0 for e in count_err if "beta" not in e.name) and all(
        e.max_rel <= 64 * EPS32 for e in count_err if "beta" in e.name)
    plural = "s" if len(steps_at) != 1 else ""
    return [
        judge("lr schedule (default boundaries)", MODEL, lr_errors, "exact", ok=all(e.max_abs == 0 for e in lr_errors),
              note=f"rate used by each step at global steps {steps_at}; boundaries {legacy.args.boundaries}"),
        judge(f"{len(steps_at)} training step{plural}: loss and gradients", MODEL, loss_err + grad_err, "resnet",
              note="each step from the legacy state, gradients read out of both steps' Adam slots",
              extra={"losses": {"legacy": losses_l, "modern": losses_m}}),
        judge(f"{len(steps_at)} training step{plural}: Adam on each side", MODEL, adam_err, "adam",
              note=f"every weight's update and v, all {len(names)} variables ({len(free)} free conv biases "
                   f"included), against the formula with epsilon {eps}"),
        judge("step counters and beta powers", MODEL, count_err, "exact", ok=counters_ok,
              note="legacy global_step and modern iterations +1 per step; TF1's running beta powers = beta^t"),
        check_bn_moving_stats(bn, h.cfg.towers, SLIM_BN["batch_norm_decay"]),
    ]


def legacy_schedules(num_towers):
    """The distinct ways N unordered read-modify-write updates of one variable can interleave.

    Tower i reads v, computes delta_i = (v_read - a_i) * (1 - d), and atomically subtracts it
    (AssignSubVariableOp).  Which earlier subtractions tower i's read sees is a set S_i; a schedule
    is one consistent choice of S_0..S_N-1 over all orders of the 2N read/write events.  Returns a
    list of (order of reads, tuple of S_i) with duplicates removed.
    """
    events = [(i, kind) for i in range(num_towers) for kind in "rw"]
    seen = set()
    out = []
    for perm in itertools.permutations(range(2 * num_towers)):
        order = [events[p] for p in perm]
        if any(order.index((i, "r")) > order.index((i, "w")) for i in range(num_towers)):
            continue
        done, sets, reads = set(), {}, []
        for i, kind in order:
            if kind == "r":
                sets[i] = frozenset(done)
                reads.append(i)
            else:
                done.add(i)
        key = tuple(sets[i] for i in range(num_towers))
        if key not in seen:
            seen.add(key)
            out.append((tuple(reads), key))
    return out


_SCHEDULES = {}


def predictions_legacy(before, stats, decay):
    """Every value the N per-tower slim updates can leave in a shared moving variable after a step
    (one per schedule of `legacy_schedules`):  v_after = v - sum_i (v_read_i - a_i) * (1 - d)."""
    n = len(stats)
    if n not in _SCHEDULES:
        _SCHEDULES[n] = legacy_schedules(n)
    preds = []
    for reads, sets in _SCHEDULES[n]:
        delta = {}
        for i in reads:
            delta[i] = (before - sum(delta[j] for j in sets[i]) - stats[i]) * (1 - decay)
        preds.append(before - sum(delta.values()))
    return preds


def check_bn_moving_stats(per_step, num_towers, decay):
    """EXPECTED (N > 1): legacy moves each moving statistic N times a step; modern once, by the mean.

    Predictions, from the per-tower batch statistics a_i measured in the legacy step (the modern
    replicas' equal them: the training-forward check) and the value v before the step:
      legacy:  one of `predictions_legacy` (N unordered updates of one shared variable)
      modern:  v - (v - mean_i a_i) * (1 - d)   (SlimBatchNorm, aggregation MEAN)
    with slim's decay d, both with Bessel's n/(n-1) variance.  Compared as the update
    (after - before), relative to its own size, with a floor: each side stores v in float32
    after up to N + 1 roundings, so N + 1 ulps of v per element count as exactly the tolerance
    (a trained model's update is a small difference of near-equal numbers).  With N > 1 the
    modern update would FAIL the legacy prediction and vice versa (measured gap: see the note).
    """
    errors, schedules, gaps = [], {}, []
    tol = TOLERANCES["resnet"][0]
    for k, (before, after_l, after_m, stats) in enumerate(per_step):
        for name in sorted(before):
            scope, kind = name.rsplit("/", 1)
            idx = 0 if kind == "moving_mean" else 1
            a = [np.asarray(stats[(t, scope)][idx], np.float64) for t in range(num_towers)]
            v = np.asarray(before[name], np.float64)
            floor = (num_towers + 1) * np.linalg.norm(np.spacing(np.abs(before[name]))) / tol
            preds = predictions_legacy(v, a, decay)
            scored = [tensor_error("", after_l[name] - v, p - v, floor).rel_l2 for p in preds]
            best = int(np.argmin(scored))
            schedules[best] = schedules.get(best, 0) + 1
            errors.append(tensor_error(f"legacy {name} step {k} (schedule {best})", after_l[name] - v,
                                       preds[best] - v, floor))
            modern_pred = v - (v - np.mean(a, axis=0)) * (1 - decay)
            errors.append(tensor_error(f"modern {name} step {k}", after_m[name] - v, modern_pred - v, floor))
            if num_towers > 1:
                gaps.append(tensor_error("", modern_pred - v, preds[best] - v, floor).rel_l2)
    distinct = num_towers == 1 or min(gaps) > tol
    note = (f"legacy: {num_towers} unordered updates of one shared variable per step "
            f"({len(_SCHEDULES.get(num_towers, [0]))} possible schedules, {len(schedules)} seen); modern: one "
            f"update by the replicas' mean" + (f"; the two predictions differ by >= {min(gaps):.2g}" if gaps else ""))
    ok = distinct and all(e.rel_l2 <= tol for e in errors)
    return judge("bn moving statistics", MODEL, errors, "resnet", expected=num_towers > 1, ok=ok, note=note)


def check_free_biases(h, x, y):
    """The free conv biases: the training loss does not depend on them (modern train step with the
    start values and with those biases moved by 100 * lr of random sign gives the same loss)."""
    names = sorted(free_biases(h.legacy))
    state = start_state(h)
    rng = np.random.RandomState(h.cfg.seed)
    moved = dict(state["weights"])
    for n in names:
        moved[n] = moved[n] + 0.1 * np.sign(rng.randn(*moved[n].shape)).astype(np.float32)
    losses = []
    for weights in (state["weights"], moved):
        seed = h.modern.model.dropout.seed_generator.state.numpy()
        losses.append(modern_train(h.modern, x, y, dict(state, weights=weights))[0])
        h.modern.model.dropout.seed_generator.state.assign(seed)
    return judge("free conv biases (zero gradient)", MODEL, [tensor_error("loss", losses[1], losses[0])], "resnet",
                 note=f"{len(names)} backbone conv biases each moved by +-0.1: the training loss is the same "
                      f"(their Adam steps are checked in 'Adam on each side')")


def check_splits(h, x, y):
    """Batch splits, with each prediction from the split arithmetic (b = rows per tower, N towers):
    short last batch; uneven rows (the legacy fix drops odd % N of them, --split=weighted and the
    modern program none); fewer rows than towers; a replica the strategy would leave empty (N >= 3);
    the seed's static bug.  Dropout masks belong to rows: the legacy towers get the masks the modern
    step drew for the same rows."""
    set_legacy_state(h.legacy, start_state(h))
    results = check_short_batch(h, x, y)
    if h.cfg.towers == 1:
        return results
    uneven, rows_as_predicted = check_uneven_batch(h, x, y)
    results += uneven
    if not rows_as_predicted:
        return results  # a row lost or moved by the modern input path: nothing below can be fed
    results.append(check_fewer_rows(h, x, y))
    if h.cfg.towers >= 3:
        results.append(check_empty_replica(h, x, y))
    results.append(check_static_bug(h, x, y))
    return results


def split_errors(loss_l, grads_l, loss_m, grads_m):
    return [tensor_error("loss", loss_l, loss_m)] + grad_errors(grads_l, grads_m)


def finite_step(loss, grads):
    return bool(np.isfinite(loss)) and all(np.all(np.isfinite(g)) for g in grads.values())


def check_short_batch(h, x, y):
    """The short last batch of an epoch, still a multiple of the towers: N (b - 1) rows."""
    n = h.cfg.towers
    short = n * (h.cfg.rows_per_tower - 1)
    loss_m, grads_m, masks, rows = modern_gradients(h, x[:short], y[:short])
    loss_l, grads_l, _ = legacy_gradients(h.legacy, x[:short], y[:short], row_masks(masks))
    return [judge("split: short last batch", MODEL, split_errors(loss_l, grads_l, loss_m, grads_m), "resnet",
                  note=f"{short} rows: modern rows {rows}, legacy current_batch_size {short // n}")]


def check_uneven_batch(h, x, y):
    """N b - 1 rows: the modern program and legacy --split=weighted use all of them; the legacy fix
    drops the last odd % N, equals the modern program on the rows it keeps, and differs from the
    modern program on all of them (same per-row masks).  Returns (results, whether the modern
    input path cut the rows as predicted)."""
    n, legacy, tol = h.cfg.towers, h.legacy, TOLERANCES["resnet"][0]
    odd = n * h.cfg.rows_per_tower - 1
    kept = (odd // n) * n
    results = []
    loss_m, grads_all, masks, rows_all = modern_gradients(h, x[:odd], y[:odd])
    predicted = replica_rows(odd, n)
    if list(rows_all) != predicted:
        return [judge("split: remainder dropped", MODEL, [], "exact", expected=True, ok=False,
                      note=f"{odd} rows: the modern input path cut them into {list(rows_all)}, predicted "
                           f"{predicted} (ceil(rows / N) in order, every row kept)")], False
    if h.cfg.weighted:
        loss_w, grads_w, dropped_w = legacy_gradients(weighted_graph(h), x[:odd], y[:odd], row_masks(masks))
        results.append(judge("split: --split=weighted (uneven)", MODEL, split_errors(loss_w, grads_w, loss_m, grads_all),
                             "resnet", note=f"{odd} rows: modern rows {rows_all}, legacy weighted towers, "
                                            f"dropped {dropped_w}"))
    _, grads_fix_all, _ = legacy_gradients(legacy, x[:odd], y[:odd], row_masks(masks)[:kept])
    gap = max(tensor_error(k, grads_fix_all[k], grads_all[k]).rel_l2 for k in grads_all if not is_free_bias(k))
    loss_m, grads_m, masks, _ = modern_gradients(h, x[:kept], y[:kept])
    loss_l, grads_l, dropped = legacy_gradients(legacy, x[:odd], y[:odd], row_masks(masks))
    errors = split_errors(loss_l, grads_l, loss_m, grads_m)
    results.append(judge("split: remainder dropped", MODEL, errors, "resnet", expected=True,
                         ok=(dropped == odd - kept and gap > 10 * tol and all(e.rel_l2 <= tol for e in errors)),
                         note=f"{odd} rows: legacy fix drops {dropped} (predicted odd % N = {odd - kept}) and equals "
                              f"the modern step on its first {kept} rows; on all {odd} rows the modern step differs "
                              f"from it by {gap:.2g} (> 10 x tolerance)"))
    return results, True


def check_fewer_rows(h, x, y):
    """Fewer rows than towers: every legacy fix tower gets few // N = 0 rows and fails (NaN, or this
    CPU build's oneDNN error); the modern program copies the rows to every replica at weight 1/N,
    which the legacy weighted graph computes when each tower is fed all rows at weight 1/N."""
    n, tol = h.cfg.towers, TOLERANCES["resnet"][0]
    few = n - 1
    outcome = empty_tower_outcome(h.legacy, x[:few], y[:few])
    loss_m, grads_m, masks, rows = modern_gradients(h, x[:few], y[:few])
    errors = []
    if h.cfg.weighted:
        loss_w, grads_w, _ = legacy_gradients(weighted_graph(h), x[:few], y[:few], masks,
                                              cut=([0] * n, [few] * n, [1.0 / n] * n))
        errors = split_errors(loss_w, grads_w, loss_m, grads_m)
    return judge("split: fewer rows than towers", MODEL, errors, "resnet", expected=True,
                 ok=outcome["failed"] == list(range(n)) and finite_step(loss_m, grads_m)
                 and all(e.rel_l2 <= tol for e in errors),
                 note=f"{few} rows on {n} towers: legacy fix towers {outcome['failed']} failed "
                      f"({outcome['how']}), predicted all (rows // N = 0); modern rows {rows}, finite"
                      + (f", = each legacy tower given all {few} rows at weight 1/{n}" if errors else
                         " (--quick: not compared with the weighted graph)"))


def check_empty_replica(h, x, y):
    """At least N rows that the strategy's split would still leave a replica empty (N + 1 rows on
    N >= 3 replicas: ceil = 2, 2 (N - 1) >= N + 1): copied like the fewer-rows batch."""
    n, tol = h.cfg.towers, TOLERANCES["resnet"][0]
    more = n + 1
    try:
        loss_m, grads_m, masks, rows = modern_gradients(h, x[:more], y[:more])
    except tf.errors.InvalidArgumentError as error:  # an empty replica: the modern step fails
        loss_m, grads_m, masks, rows = np.nan, {}, [], f"failed ({str(error).strip().splitlines()[-1][:80]})"
    finite = finite_step(loss_m, grads_m)
    errors = []
    if h.cfg.weighted and finite:
        loss_w, grads_w, _ = legacy_gradients(weighted_graph(h), x[:more], y[:more], masks,
                                              cut=([0] * n, [more] * n, [1.0 / n] * n))
        errors = split_errors(loss_w, grads_w, loss_m, grads_m)
    return judge("split: a replica the strategy leaves empty", MODEL, errors, "resnet",
                 ok=empty_replica(more, n) and rows == [more] * n and finite and all(e.rel_l2 <= tol for e in errors),
                 note=f"{more} rows on {n} replicas: the strategy would give {replica_rows(more, n)}; "
                      f"modern rows {rows} (copied, weight 1/{n}), finite"
                      + (", = each legacy weighted tower given all rows at 1/N" if errors else ""))


def check_static_bug(h, x, y):
    """The seed's bug: a constant per-tower size b on a batch of b rows leaves towers 1..N-1 empty."""
    n, b = h.cfg.towers, h.cfg.rows_per_tower
    outcome = empty_tower_outcome(h.legacy, x[:b], y[:b], split="static")
    predicted = [i for i in range(n) if i * b >= b]
    loss_m, grads_m, _, rows = modern_gradients(h, x[:b], y[:b])
    return judge("split: --split=static (seed bug)", MODEL, [], "exact", expected=True,
                 ok=outcome["failed"] == predicted and finite_step(loss_m, grads_m),
                 note=f"{b} rows, constant {b} per tower: legacy towers {outcome['failed']} failed "
                      f"({outcome['how']}), predicted {predicted} (i * {b} >= {b}); modern rows {rows}, finite")


def empty_tower_outcome(legacy, x, y, split="fix"):
    """Run each legacy tower's loss on its own (the program's feed): which towers fail (NaN, or
    this CPU build's oneDNN Conv2D error on an empty batch, legacy/cifar_resnet.py ONEDNN_NOTE)."""
    feed, _ = legacy_feed(legacy, x, y, split=split)
    failed, how = [], set()
    for i, loss in enumerate(legacy.ns.tower_losses):
        try:
            if not np.isfinite(legacy.sess.run(loss, feed)):
                failed.append(i)
                how.add("NaN")
        except tf.errors.InvalidArgumentError:
            failed.append(i)
            how.add("oneDNN error")
    return {"failed": failed, "how": ", ".join(sorted(how)) or "none failed"}


def weighted_graph(h):
    """The legacy graph built with --split=weighted, same start (built on first use)."""
    if h.weighted is None:
        h.weighted = build_legacy(h.cfg, h.files, h.tmp_dir, split="weighted", start_path=h.legacy.start_path)
    return h.weighted


# ---------------------------------------------------------------------------------------------
# The legacy program on TF1's runtime

def check_tf1_runtime(h, x, y):
    """The legacy graph on TF1's runtime (`--tf1_behavior`: ref variables, v1 control flow), run in
    its own process by `compare/tf1_runtime.py` from the start checkpoint with the masks the modern
    step drew: its loss and gradients against the modern step's (PASS), and one step's moving
    statistics against `predictions_legacy` element by element (EXPECTED: with ref variables the
    N towers' assign_sub ops on one shared variable are unordered and unlocked, so each element
    may see its own schedule)."""
    import subprocess
    import sys
    loss_m, grads_m, masks, _ = modern_gradients(h, x, y)
    in_path, out_path = os.path.join(h.tmp_dir, "tf1_in.npz"), os.path.join(h.tmp_dir, "tf1_out.npz")
    np.savez(in_path, x=x, y=y, masks=np.stack(masks), towers=h.cfg.towers, start=h.legacy.start_path,
             keep_prob=h.legacy.args.keep_prob)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", "compare.tf1_runtime", in_path, out_path], cwd=root,
                          env=dict(os.environ, PYTHONPATH=root), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
        return [judge("legacy on TF1's runtime", MODEL, [], "resnet", ok=False,
                      note=f"compare/tf1_runtime.py failed: {tail}")]
    out = np.load(out_path)
    grads_l = {k[5:]: out[k] for k in out.files if k.startswith("grad:")}
    errors = [tensor_error("loss", out["loss"], loss_m)] + grad_errors(grads_l, grads_m)
    results = [judge("legacy on TF1's runtime: loss and gradients", MODEL, errors, "resnet",
                     note=f"{len(grads_l)} gradients, legacy --tf1_behavior ({out['variable_class']}) vs the "
                          f"modern train step")]
    decay, n = SLIM_BN["batch_norm_decay"], h.cfg.towers
    tol = TOLERANCES["resnet"][0]
    bn_errors, whole, gaps = [], 0, []
    for key in sorted(k for k in out.files if k.startswith("before:")):
        name = key[len("before:"):]
        scope, kind = name.rsplit("/", 1)
        which = "mean" if kind == "moving_mean" else "variance"
        v = out[key].astype(np.float64)
        a = [out[f"{which}:{t}:{scope}"].astype(np.float64) for t in range(n)]
        preds = np.stack(predictions_legacy(v, a, decay))
        after = out[f"after:{name}"]
        floor = (n + 1) * np.linalg.norm(np.spacing(np.abs(out[key]))) / tol
        # One schedule for the whole tensor where one fits; else each element its own (ref
        # variables: the unlocked read-modify-writes of the towers may interleave per element).
        scores = [tensor_error("", after - v, p - v, floor).rel_l2 for p in preds]
        if min(scores) <= tol:
            whole += 1
            best = preds[int(np.argmin(scores))]
        else:
            best = np.take_along_axis(preds, np.argmin(np.abs(preds - after), axis=0)[None], axis=0)[0]
        bn_errors.append(tensor_error(f"{name}", after - v, best - v, floor))
        gaps.append(tensor_error("", v - (v - np.mean(a, axis=0)) * (1 - decay) - v, best - v, floor).rel_l2)
    distinct = n == 1 or min(gaps) > tol  # the modern single mean update would not pass for this
    results.append(judge("legacy on TF1's runtime: bn moving statistics", MODEL, bn_errors, "resnet",
                         expected=n > 1, ok=distinct and all(e.rel_l2 <= tol for e in bn_errors),
                         note=f"{len(bn_errors)} moving statistics after one step: {whole} match one of the "
                              f"{len(_SCHEDULES.get(n, [0]))} schedules of {n} unordered ref-variable updates as a "
                              f"whole, {len(bn_errors) - whole} element by element"
                              + (f"; a single mean update is off by >= {min(gaps):.2g}" if n > 1 else "")))
    return results


# ---------------------------------------------------------------------------------------------
# Free-running trajectories against the system's own sensitivity

def check_free_running(h, xs, ys, factor=None):
    """Both programs train freely for K steps from the same start; the legacy program trains again
    from the start perturbed by one float32 ulp in every weight.  At every step the legacy-modern
    distance of the weights must stay within `factor` times the legacy-perturbed distance (the
    system's own sensitivity to round-off, measured in this run), or within float32 resolution.
    Distances are relative to how far the legacy weights have moved: ||w_l - w_x|| / ||w_l - w_0||.
    Catches what the restart check cannot: slow drift, optimizer state carried wrong from step to
    step, a schedule that goes wrong between the checked steps.
    """
    factor = factor or FREE_RUN_FACTOR
    legacy, modern = h.legacy, h.modern
    names = sorted(legacy.trainable)
    start = start_state(h)
    w0 = np.concatenate([start["weights"][n].ravel() for n in names]).astype(np.float64)
    perturbed = dict(start["weights"])
    for n in names:
        perturbed[n] = np.nextafter(perturbed[n], np.float32(np.inf))
    set_modern_state(modern, start)
    masks = []
    losses_m = []
    traj_m = []
    for k in range(len(xs)):
        element, _ = distribute(modern.strategy, xs[k], ys[k])
        masks.append(modern_masks(modern, element))
        loss, _ = modern.train_step(element)
        losses_m.append(float(loss))
        traj_m.append(np.concatenate([modern.names[n].numpy().ravel() for n in names]))
    runs = {}
    for label, weights in (("legacy", start["weights"]), ("perturbed", perturbed)):
        set_legacy_state(legacy, dict(start, weights=weights))
        runs[label] = ([], [])
        for k in range(len(xs)):
            feed, _ = legacy_feed(legacy, xs[k], ys[k], masks[k])
            loss, _ = legacy.sess.run([legacy.ns.total_loss, legacy.ns.train_step], feed)
            runs[label][0].append(float(loss))
            runs[label][1].append(np.concatenate([v.ravel() for v in legacy.sess.run(
                [legacy.model_variables[n] for n in names])]))
    errors, ratios, rows = [], [], []
    resolution = np.linalg.norm(np.spacing(np.abs(w0).astype(np.float32)))
    for k in range(len(xs)):
        wl, wp, wm = runs["legacy"][1][k], runs["perturbed"][1][k], traj_m[k]
        moved = np.linalg.norm(wl - w0)
        d_m = np.linalg.norm(wl - wm) / moved
        d_p = max(np.linalg.norm(wl - wp), resolution) / moved
        ratios.append(d_m / d_p)
        rows.append((k, d_m, d_p))
        # max_abs: the legacy-modern distance; max_rel: its ratio to the chaos floor; rel_l2: the
        # ratio over the allowed factor (the "chaos" tolerance is 1).
        errors.append(TensorError(f"step {k}: legacy-modern / legacy-perturbed distance", d_m, d_m / d_p,
                                  d_m / d_p / factor))
    ok = all(r <= factor for r in ratios) and all(np.isfinite(runs["legacy"][0] + losses_m))
    worst = int(np.argmax(ratios))
    return judge(f"{len(xs)} free-running steps (chaos floor)", MODEL, errors, "chaos", ok=ok,
                 note=f"worst step {worst}: legacy-modern {rows[worst][1]:.3g} vs legacy-perturbed "
                      f"{rows[worst][2]:.3g} (ratio {ratios[worst]:.2f}, allowed {factor}); last step ratio "
                      f"{ratios[-1]:.2f}",
                 extra={"losses": {"legacy": runs["legacy"][0], "modern": losses_m,
                                   "perturbed": runs["perturbed"][0]},
                        "distances": {"modern": [r[1] for r in rows], "perturbed": [r[2] for r in rows]}})


# Measured on correct code (2 CPU cores, 8 rows per tower): see compare/README.md.
FREE_RUN_FACTOR = 2.0


# ---------------------------------------------------------------------------------------------

def default_config(towers_n=2, steps=None, seed=0, quick=False, checkpoint=None):
    cfg = Config(towers=towers_n, seed=seed, quick=quick, checkpoint=checkpoint)
    if quick:  # no second legacy graph, no second process, 2 restart steps, no free-running steps
        cfg.steps, cfg.free_steps, cfg.tf1_runtime, cfg.weighted = 2, 0, False, False
    if steps is not None:
        cfg.steps = steps
    return cfg


def steps_spanning(boundaries, count):
    """`count` global steps for the restart check: each boundary b and b + 1 (the rate changes
    between them), far past the last boundary, and step 0; the crossings first when count is short."""
    far = 4 * boundaries[-1]
    # 2 steps: the first boundary b0 (a schedule read one step ahead shows there) and b_last + 1
    # (one step behind shows there); then b0 + 1, the far step, the other crossings, and step 0.
    wanted = [boundaries[0], boundaries[-1] + 1, boundaries[0] + 1, far] + [
        b + k for b in boundaries[1:-1] for k in (0, 1)] + [b for b in boundaries[1:]] + [
        b + 1 for b in boundaries[:-1]] + [0]
    wanted = list(dict.fromkeys(wanted))
    while len(wanted) < count:
        wanted.append(far + len(wanted))
    return sorted(wanted[:count])


def setup(cfg, tmp_dir, log=print):
    """The legacy graph and the modern model, from the same start; the batches of the checks."""
    strategy = common.make_strategy(cfg.towers)
    xs, ys = make_batches(max(cfg.steps, cfg.free_steps) + 1, cfg.towers * cfg.rows_per_tower, cfg.seed)
    files = write_records(tmp_dir, cfg.seed, cfg.towers)
    log(f"cifar: building the legacy graph ({cfg.towers} towers) and the modern model ({cfg.towers} replicas)")
    legacy = build_legacy(cfg, files, tmp_dir)
    log("cifar: legacy graph built; building the modern model")
    modern = build_modern(cfg, strategy, legacy.start_path, tmp_dir)
    return Harness(cfg=cfg, legacy=legacy, modern=modern, xs=xs, ys=ys, files=files, tmp_dir=tmp_dir)


def close(h):
    h.legacy.sess.close()
    if h.weighted is not None:
        h.weighted.sess.close()


def run(cfg, tmp_dir, log=print, only=GROUPS):
    """The CIFAR checks (all groups by default); returns a list of Results."""
    h = setup(cfg, tmp_dir, log)
    try:
        return run_checks(h, log, only)
    finally:
        close(h)


def run_checks(h, log=print, only=GROUPS):
    """The CIFAR checks, grouped (`only` picks groups: basics = configuration, variables, checkpoint,
    pipelines; forward = inference, validation, dropout; training = forward pass, gradients, free
    biases; splits; steps = lr, restart steps, Adam, counters, bn moving statistics; free =
    free-running; tf1 = the legacy graph on TF1's runtime)."""
    cfg = h.cfg
    x, y = h.xs[-1], h.ys[-1]
    results = []
    if "basics" in only:
        results += [check_config(h), check_variables(h), check_checkpoint_round_trip(h), check_pipelines(h)]
    if "forward" in only:
        log("cifar: inference, validation, dropout")
        results += [check_inference(h, x, y), check_validation(h), check_dropout(h)]
    if "training" in only:
        log("cifar: training forward pass and gradients")
        results += check_training(h, x, y)
        results.append(check_free_biases(h, x, y))
    if "splits" in only:
        log("cifar: batch splits")
        results += check_splits(h, x, y)
    if "steps" in only:
        steps_at = steps_spanning(h.legacy.args.boundaries, cfg.steps)
        log(f"cifar: {cfg.steps} training steps from the legacy state at global steps {steps_at}")
        results += check_training_steps(h, h.xs, h.ys, steps_at)
    if "free" in only and cfg.free_steps:
        log(f"cifar: {cfg.free_steps} free-running steps, and the legacy program again from weights 1 ulp away")
        results.append(check_free_running(h, h.xs[:cfg.free_steps], h.ys[:cfg.free_steps]))
    if "tf1" in only and cfg.tf1_runtime:
        log("cifar: the legacy graph on TF1's runtime (--tf1_behavior), in its own process")
        results += check_tf1_runtime(h, x, y)
    return results
