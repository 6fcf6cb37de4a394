"""TF1 layers on TensorFlow 2.21 beside Keras 3: tf-slim 1.1.0 and `tf.compat.v1.layers`.

Import this module before `tf_slim`, or before the first `tf.compat.v1.layers` call::

    from legacy import slim_compat  # noqa: F401
    import tf_slim as slim

It fixes three things, each by pointing an old name at the object TensorFlow or tf-keras ships
today.  Nothing is copied, wrapped or edited: the code that runs is TensorFlow's and tf-keras' own.

1. `tf_keras.legacy_tf_layers`.  TensorFlow's TF1 layers (`tensorflow/python/layers/*.py`, which
   slim's `batch_norm`, `conv2d`, `fully_connected`, ... build) lazily import that package, but
   tf-keras 2.16+ ships it only as `tf_keras.src.legacy_tf_layers`.  The real package is
   registered under the old name in `sys.modules`.

2. TensorFlow-private names that tf-slim's own code uses and that TensorFlow moved (`MOVED`).
   tf-slim 1.1.0 imports modules such as `tensorflow.python.framework.ops` and reads names off
   them that later releases moved to modules of their own; each is put back where tf-slim looks,
   one line per name, with the release that removed it.  The list is every such name in tf-slim's
   code, not in its tests (`tests/test_slim_compat.py` scans tf-slim's sources to keep it so).

3. `tf.compat.v1.layers`.  With Keras 3 as `tf.keras`, TensorFlow's lazy loader answers
   `tf.compat.v1.layers.conv2d` with "`conv2d` is not available with Keras 3".  TensorFlow's own
   switch, `TF_USE_LEGACY_KERAS=1`, turns `tf.keras` into Keras 2 for the whole process.  Here only
   `tf.compat.v1.layers` is routed to tf-keras' legacy layers (Keras 2, the layers TF1 ran, the
   same package as in 1), so a TF1 program and a Keras 3 model can run in one process.

Every fix is idempotent and does nothing where the old name still resolves.
"""
from __future__ import annotations

import importlib
import os
import sys
import types
from typing import Optional

OLD = "tf_keras.legacy_tf_layers"
NEW = "tf_keras.src.legacy_tf_layers"
SUBMODULES = ("base", "convolutional", "core", "normalization", "pooling", "variable_scope_shim")

# (module tf-slim reads the name from, name, module that holds it now, TF release without the old
# name, where tf-slim uses it)
MOVED = (
    ("tensorflow.python.framework.ops", "Tensor", "tensorflow.python.framework.tensor", "2.15",
     "layers/utils.py constant_value (every batch_norm with updates_collections=None or "
     "zero_debias_moving_mean=True), layers/optimizers.py, learning.py, layers/rev_block_lib.py"),
    ("tensorflow.python.framework.ops", "IndexedSlices", "tensorflow.python.framework.indexed_slices",
     "2.13", "layers/optimizers.py, learning.py, training/training.py (sparse gradients)"),
    ("tensorflow.python.ops.variable_scope", "variable", "tensorflow.python.ops.variable_v1", "2.14",
     "ops/variables.py local_variable, global_variable"),
    ("tensorflow.python.ops.array_ops", "stack", "tensorflow.python.ops.array_ops_stack", "2.13",
     "layers/layers.py, data/tfexample_decoder.py, metrics/metric_ops.py"),
    ("tensorflow.python.ops.array_ops", "unstack", "tensorflow.python.ops.array_ops_stack", "2.13",
     "layers/layers.py"),
    ("tensorflow.python.ops.control_flow_ops", "Assert", "tensorflow.python.ops.control_flow_assert",
     "2.14", "metrics/histogram_ops.py"),
    ("tensorflow.python.ops.control_flow_ops", "case", "tensorflow.python.ops.control_flow_case",
     "2.14", "data/tfexample_decoder.py"),
    ("tensorflow.python.ops.control_flow_ops", "cond", "tensorflow.python.ops.cond", "2.14",
     "layers/utils.py, data/tfexample_decoder.py, metrics/metric_ops.py"),
    ("tensorflow.python.ops.control_flow_ops", "while_loop", "tensorflow.python.ops.while_loop",
     "2.14", "losses/metric_learning.py"),
)
# `variable_scope.variable` was `VariableV1` itself, not a function named `variable`.
RENAMED = {("tensorflow.python.ops.variable_scope", "variable"): "VariableV1"}

V1_LAYERS = "tf_keras.api._v1.keras.__internal__.legacy.layers"
# Every module object TensorFlow builds for `tf.compat.v1` (the public path, the generated API
# package, and the `compat.v1` inside each `compat` namespace).
V1_MODULES = ("tensorflow.compat.v1", "tensorflow._api.v2.compat.v1",
              "tensorflow._api.v2.compat.v1.compat.v1", "tensorflow._api.v2.compat.v2.compat.v1")


def install_legacy_tf_layers() -> types.ModuleType:
    """Alias `tf_keras.legacy_tf_layers[.*]` to `tf_keras.src.legacy_tf_layers[.*]`.

    Returns the module now registered under the old name.
    """
    try:
        return importlib.import_module(OLD)
    except ModuleNotFoundError:
        pass
    package = importlib.import_module(NEW)
    sys.modules[OLD] = package
    for name in SUBMODULES:
        sys.modules[f"{OLD}.{name}"] = importlib.import_module(f"{NEW}.{name}")
    return package


def restore_moved_names() -> list[str]:
    """Put each name of `MOVED` back on the module tf-slim reads it from.

    Returns the `module.name` strings it restored (empty where TensorFlow still has them all).
    """
    restored = []
    for module_name, name, home, _release, _users in MOVED:
        module = importlib.import_module(module_name)
        if hasattr(module, name):
            continue
        setattr(module, name, getattr(importlib.import_module(home),
                                      RENAMED.get((module_name, name), name)))
        restored.append(f"{module_name}.{name}")
    return restored


def route_v1_layers() -> Optional[types.ModuleType]:
    """Point `tf.compat.v1.layers` at tf-keras' legacy layers, unless Keras 2 already serves it.

    Returns the module `tf.compat.v1.layers` now is, or None where nothing was changed.
    """
    if os.environ.get("TF_USE_LEGACY_KERAS", "") in ("true", "True", "1"):
        return None  # TensorFlow routes tf.compat.v1.layers to tf-keras itself.
    import keras
    if not keras.__version__.startswith("3."):
        return None  # Keras 2 as tf.keras still has the TF1 layers.
    import tensorflow.compat.v1  # noqa: F401  (builds the modules named in V1_MODULES)
    layers = importlib.import_module(V1_LAYERS)
    for name in V1_MODULES:
        if name in sys.modules:
            sys.modules[name].layers = layers  # type: ignore[attr-defined]  # a module attribute, set at run time
    # `import tensorflow.compat.v1.layers` and `from tensorflow.compat.v1.layers import dense`.
    sys.modules["tensorflow.compat.v1.layers"] = layers
    sys.modules["tensorflow._api.v2.compat.v1.layers"] = layers
    return layers


def install() -> types.ModuleType:
    """Apply all three fixes.  Idempotent; returns the `tf_keras.legacy_tf_layers` package."""
    package = install_legacy_tf_layers()
    restore_moved_names()
    route_v1_layers()
    return package


install()
