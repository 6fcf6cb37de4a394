"""Faithful TF1 tower trainers, running under `tf.compat.v1` on TensorFlow 2.21.

Importing the package installs `legacy/slim_compat.py` (tf-slim and `tf.compat.v1.layers` on TF 2.21),
so `import tf_slim` works in every module below.
"""
from legacy import slim_compat  # noqa: F401
