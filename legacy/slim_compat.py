"""Make tf-slim 1.1.0 build on TensorFlow >= 2.16.  Import this module before `tf_slim`.

The problem, in one line: `tensorflow/python/layers/normalization.py` (which slim's `batch_norm`
uses for the fused layer) lazily imports `tf_keras.legacy_tf_layers.normalization`, but tf-keras
2.16+ ships that package only as `tf_keras.src.legacy_tf_layers`.  The first `slim.batch_norm`
then dies with `ModuleNotFoundError: No module named 'tf_keras.legacy_tf_layers'`.

The fix: register the real package under the old name in `sys.modules`, once, before anything
asks for it.  Nothing is copied or patched; the TF1 batch-norm layer that runs is tf-keras' own
(Keras 2), with its `UPDATE_OPS` moving-average updates intact.  Keras 3 (`tf.keras` on TF 2.21)
is not involved on the legacy side.

Usage (the legacy package does this in `legacy/__init__.py`)::

    from legacy import slim_compat  # noqa: F401  (before tf_slim)
    import tf_slim as slim
"""
import importlib
import sys

OLD = "tf_keras.legacy_tf_layers"
NEW = "tf_keras.src.legacy_tf_layers"
SUBMODULES = ("base", "convolutional", "core", "normalization", "pooling", "variable_scope_shim")


def install():
    """Alias `tf_keras.legacy_tf_layers[.*]` to `tf_keras.src.legacy_tf_layers[.*]`.

    Idempotent, and a no-op on a tf-keras that still has the old name.
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


install()
