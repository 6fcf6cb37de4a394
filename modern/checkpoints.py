"""Convert between TF1 (slim-named) checkpoints and the modern Keras ResNet-v2-50.

Commands (from the repository root)::

    # A TF1 checkpoint (the legacy trainer's, or slim's published resnet_v2_50.ckpt) -> a
    # tf.train.Checkpoint(model=...), saved by a CheckpointManager in a directory, that the modern
    # trainer can restore:
    python -m modern.checkpoints tf1-to-modern models/temporary/train-model.ckpt-100 models/modern
    python -m modern.checkpoints tf1-to-modern resnet_v2_50.ckpt models/pretrained \
        --exclude_scopes Logits --report

    # A modern checkpoint (file prefix, or a CheckpointManager directory) -> a TF1 checkpoint
    # with exactly slim's names, restorable by tf.compat.v1.train.Saver:
    python -m modern.checkpoints modern-to-tf1 models/modern models/tf1/model.ckpt

In Python (the model must be built, e.g. by `modern.resnet_v2.resnet_v2_50()`)::

    names = tf1_variable_map(model)                    # {'resnet_v2_50/conv1/weights': var, ...}
    report = load_tf1_checkpoint(model, "resnet_v2_50.ckpt", exclude_scopes=("Logits",))
    save_tf1_checkpoint(model, "models/tf1/model.ckpt")

Modern checkpoints hold the model under the key `model` (MODEL_KEY): tf.train.Checkpoint(model=m).

The name mapping (every modern variable, one-to-one, no transposes: Keras' Conv2D kernel is HWIO
like slim's `weights`, Dense's kernel is [in, out] like slim's fully_connected):

    conv1/kernel, conv1/bias               -> resnet_v2_50/conv1/weights, .../biases
    block1_unit_1/preact/{gamma,beta,...}  -> resnet_v2_50/block1/unit_1/bottleneck_v2/preact/...
    block1_unit_1/shortcut/{kernel,bias}   -> .../bottleneck_v2/shortcut/weights, .../biases
    block1_unit_1/conv1/kernel             -> .../bottleneck_v2/conv1/weights
    block1_unit_1/conv1_BatchNorm/gamma    -> .../bottleneck_v2/conv1/BatchNorm/gamma  (and conv2)
    block1_unit_1/conv3/{kernel,bias}      -> .../bottleneck_v2/conv3/weights, .../biases
    postnorm/{gamma,beta,moving_*}         -> resnet_v2_50/postnorm/...
    Logits_fc/{kernel,bias}                -> Logits/fc/weights, Logits/fc/biases

Loading checks every name and every shape. Entries of a TF1 checkpoint that are training
bookkeeping, not model weights, are skipped (and listed in the report): optimizer slots such as
`<var>/Adam`, `<var>/Adam_1`; the counters `global_step`, `Variable` (the original's unnamed
global step), `beta1_power`, `beta2_power`; and `resnet_v2_50/logits/*`, the 1x1-conv ImageNet
head of slim's published checkpoint that the original's `resnet_v2_50(num_classes=None)` never builds
(the legacy `Saver(var_list=...)` restore skips it the same way). Anything else that does not
match is an error listing the names.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Container, Iterable, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
from numpy.typing import ArrayLike

from records.usage import ArgumentParser, at_least

# Scalars a TF1 training run adds next to the model: the step counter (the original creates it as an
# unnamed `tf.Variable(0)`, hence 'Variable') and Adam's running powers of beta1/beta2.
TRAINING_COUNTERS = ("global_step", "Variable", "beta1_power", "beta2_power")
# The ImageNet classifier of slim's released resnet_v2_50.ckpt (slim's `logits` 1x1 conv).
SLIM_IMAGENET_HEAD = "resnet_v2_50/logits"
# The key under which the modern trainer keeps its model in tf.train.Checkpoint(model=...).
MODEL_KEY = "model"


class CheckpointMismatchError(ValueError):
    """A TF1 checkpoint and the modern model disagree on names or shapes."""


@dataclasses.dataclass
class LoadReport:
    """What `load_tf1_checkpoint` did with each checkpoint entry (names, sorted)."""
    loaded: list[str]
    excluded: list[str]     # model variables left untouched (exclude_scopes)
    ignored: list[str]      # checkpoint entries that are not model weights (slots, counters, ...)

    def summary(self) -> str:
        lines = [f"loaded {len(self.loaded)} variables",
                 f"left untouched (excluded scopes): {len(self.excluded)}"]
        lines += [f"  {name}" for name in self.excluded]
        lines.append(f"ignored checkpoint entries (optimizer slots, counters, ImageNet head): "
                     f"{len(self.ignored)}")
        lines += [f"  {name}" for name in self.ignored]
        return "\n".join(lines)


def _in_scope(name: str, scopes: Iterable[str]) -> bool:
    """slim's exclusion test in the original: `var.op.name.startswith(exclusion)`."""
    return any(name.startswith(scope) for scope in scopes)


def tf1_variable_map(model: Any) -> dict[str, Any]:
    """Map each TF1 checkpoint name to the modern model's variable: dict[str, keras.Variable].

    `model` is a built `modern.resnet_v2.ResNetV2_50`. Raises if a model variable is left unnamed
    (the mapping must be one-to-one; the dropout layer's RNG state is not a weight and is skipped).
    """
    if not model.built:
        raise CheckpointMismatchError("build the model first, e.g. model(tf.zeros([1, 32, 32, 3]))")
    names = {}

    def conv(layer, scope):
        names[f"{scope}/weights"] = layer.kernel
        if layer.use_bias:
            names[f"{scope}/biases"] = layer.bias

    def batch_norm(layer, scope):
        for attr in ("gamma", "beta", "moving_mean", "moving_variance"):
            names[f"{scope}/{attr}"] = getattr(layer, attr)

    root = model.scope
    conv(model.conv1, f"{root}/conv1")
    for spec, units in zip(model.block_specs, model.blocks):
        for i, unit in enumerate(units):
            scope = f"{root}/{spec.scope}/unit_{i + 1}/bottleneck_v2"
            batch_norm(unit.preact, f"{scope}/preact")
            if unit.shortcut is not None:
                conv(unit.shortcut, f"{scope}/shortcut")
            conv(unit.conv1, f"{scope}/conv1")
            batch_norm(unit.conv1_bn, f"{scope}/conv1/BatchNorm")
            conv(unit.conv2, f"{scope}/conv2")
            batch_norm(unit.conv2_bn, f"{scope}/conv2/BatchNorm")
            conv(unit.conv3, f"{scope}/conv3")
    batch_norm(model.postnorm, f"{root}/postnorm")
    names["Logits/fc/weights"] = model.fc.kernel
    names["Logits/fc/biases"] = model.fc.bias

    mapped = {id(v) for v in names.values()}
    weights = [v for v in model.variables if "seed_generator" not in v.path]
    unmapped = [v.path for v in weights if id(v) not in mapped]
    if unmapped or len(mapped) != len(names) or len(weights) != len(names):
        raise CheckpointMismatchError(f"the TF1 name map is not one-to-one; unmapped: {unmapped}")
    return names


def _checkpoint_prefix(path: str) -> str:
    """A checkpoint prefix as given, or the latest one named by a directory's `checkpoint` file."""
    if not os.path.isdir(path):
        return path
    latest = tf.train.latest_checkpoint(path)
    if latest is None:
        raise CheckpointMismatchError(f"no checkpoint in directory {path} (no 'checkpoint' file)")
    return latest


def _is_bookkeeping(name: str, weight_names: Container[str]) -> bool:
    """Optimizer slots (`<weight>/<slot>`), training counters, slim's ImageNet head."""
    if name in TRAINING_COUNTERS or _in_scope(name, [SLIM_IMAGENET_HEAD + "/"]):
        return True
    parent = name
    while "/" in parent:
        parent = parent.rsplit("/", 1)[0]
        if parent in weight_names:
            return True
    return False


def load_tf1_checkpoint(model: Any, path: str, exclude_scopes: Union[str, Sequence[str]] = ()) -> LoadReport:
    """Copy a TF1 checkpoint's values into the built modern `model`, checking names and shapes.

    Args:
      model: a built `ResNetV2_50`.
      path: TF1 checkpoint prefix (`.../model.ckpt-100`) or a directory with a `checkpoint` file.
      exclude_scopes: name prefixes left untouched on both sides, like the original's
        `checkpoint_exclude_scopes` ('Logits' keeps the freshly initialised head).

    Returns:
      A `LoadReport`.

    Raises:
      CheckpointMismatchError: listing missing, unexpected and wrong-shaped names, before any
        variable is changed.
    """
    if isinstance(exclude_scopes, str):
        exclude_scopes = (exclude_scopes,)
    path = _checkpoint_prefix(path)
    reader = tf.train.load_checkpoint(path)
    shapes = reader.get_variable_to_shape_map()
    names = tf1_variable_map(model)

    wanted = {n: v for n, v in names.items() if not _in_scope(n, exclude_scopes)}
    missing = sorted(n for n in wanted if n not in shapes)
    mismatched = sorted(f"{n}: checkpoint {list(shapes[n])} vs model {list(v.shape)}"
                        for n, v in wanted.items()
                        if n in shapes and tuple(shapes[n]) != tuple(v.shape))
    ignored: list[str] = []
    unexpected: list[str] = []
    for name in sorted(shapes):
        if name in names or _in_scope(name, exclude_scopes):
            continue
        (ignored if _is_bookkeeping(name, names) else unexpected).append(name)
    if missing or unexpected or mismatched:
        parts = [f"TF1 checkpoint {path} does not match the modern ResNet-v2-50"]
        for title, items in (("missing from the checkpoint", missing),
                             ("unexpected in the checkpoint", unexpected),
                             ("wrong shape", mismatched)):
            if items:
                parts.append(f"{title} ({len(items)}): " + ", ".join(items))
        raise CheckpointMismatchError(";\n".join(parts))

    for name, variable in wanted.items():
        variable.assign(reader.get_tensor(name))
    return LoadReport(loaded=sorted(wanted), ignored=ignored,
                      excluded=sorted(n for n in names if n not in wanted))


def save_tf1_checkpoint(model: Any, path: str) -> str:
    """Write the model's values as a TF1 checkpoint at prefix `path`, with exactly slim's names.

    `tf.train.list_variables` then shows `resnet_v2_50/conv1/weights`, ..., `Logits/fc/biases`,
    and the legacy program can `Saver.restore` it. Returns the prefix written.
    """
    values = {name: variable.numpy() for name, variable in tf1_variable_map(model).items()}
    return write_tf1_checkpoint(values, path)


def write_tf1_checkpoint(values: Mapping[str, ArrayLike], path: str) -> str:
    """Write {name: array} with a `tf.compat.v1.train.Saver` in a throw-away graph; returns path.

    The values are fed through placeholders, so the graph stays small; no meta graph is written.
    """
    graph = tf.Graph()
    with graph.as_default():
        placeholders, variables = {}, {}
        for name, value in values.items():
            value = np.asarray(value)
            placeholders[name] = tf.compat.v1.placeholder(value.dtype, value.shape)
            variables[name] = tf.compat.v1.Variable(placeholders[name], name=name)
        saver = tf.compat.v1.train.Saver(var_list=variables)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer(),
                     {placeholders[name]: value for name, value in values.items()})
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            return saver.save(sess, path, write_meta_graph=False)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def _model(num_classes: int) -> Any:
    from modern.resnet_v2 import resnet_v2_50
    return resnet_v2_50(num_classes=num_classes)


def tf1_to_modern(tf1_path: str, modern_dir: str, exclude_scopes: Union[str, Sequence[str]] = (),
                  num_classes: int = 10) -> tuple[str, LoadReport]:
    """TF1 checkpoint -> tf.train.Checkpoint(model=...) saved by a CheckpointManager in
    `modern_dir` (so the modern trainer's `manager.latest_checkpoint` finds it).

    Returns (prefix written, LoadReport).
    """
    model = _model(num_classes)
    report = load_tf1_checkpoint(model, tf1_path, exclude_scopes)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(**{MODEL_KEY: model}), modern_dir,
                                         max_to_keep=None)
    return manager.save(), report


def modern_to_tf1(modern_path: str, tf1_path: str, num_classes: int = 10) -> str:
    """tf.train.Checkpoint(model=...) (prefix or CheckpointManager directory) -> TF1 checkpoint."""
    modern_path = _checkpoint_prefix(modern_path)
    model = _model(num_classes)
    # expect_partial: a trainer's checkpoint also holds the optimizer and the step.
    tf.train.Checkpoint(**{MODEL_KEY: model}).read(modern_path).expect_partial()
    return save_tf1_checkpoint(model, tf1_path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = ArgumentParser(prog="python -m modern.checkpoints", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    to_modern = commands.add_parser("tf1-to-modern", help="TF1 checkpoint -> modern checkpoint")
    to_modern.add_argument("tf1_checkpoint", help="TF1 checkpoint prefix (the legacy trainer's, or slim-named)")
    to_modern.add_argument("modern_dir", help="directory for a CheckpointManager checkpoint")
    to_modern.add_argument("--exclude_scopes", default="",
                           help="comma-separated scopes left untouched, e.g. 'Logits' (as the original) "
                                "(default: none)")
    to_modern.add_argument("--report", action="store_true",
                           help="list excluded variables and ignored checkpoint entries")
    to_tf1 = commands.add_parser("modern-to-tf1", help="modern checkpoint -> TF1 checkpoint")
    to_tf1.add_argument("modern_checkpoint", help="checkpoint prefix or CheckpointManager directory")
    to_tf1.add_argument("tf1_checkpoint", help="prefix of the TF1 checkpoint to write")
    for sub in (to_modern, to_tf1):
        sub.add_argument("--num_classes", type=at_least(1), default=10, help="the original's num_classes")
    args = parser.parse_args(argv)
    try:
        if args.command == "tf1-to-modern":
            scopes = tuple(s.strip() for s in args.exclude_scopes.split(",") if s.strip())
            written, report = tf1_to_modern(args.tf1_checkpoint, args.modern_dir, scopes,
                                            args.num_classes)
            print(report.summary() if args.report else f"loaded {len(report.loaded)} variables")
        else:
            written = modern_to_tf1(args.modern_checkpoint, args.tf1_checkpoint, args.num_classes)
        print(f"wrote {written}")
    except (CheckpointMismatchError, tf.errors.NotFoundError, tf.errors.DataLossError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
