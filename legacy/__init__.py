"""Faithful TF1 tower trainers, running under `tf.compat.v1` on TensorFlow 2.21.

Importing the package installs the tf-slim compatibility alias (see `legacy/slim_compat.py`),
so `import tf_slim` works in every module below.
"""
from legacy import slim_compat  # noqa: F401
