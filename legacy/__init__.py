"""Faithful TF1 tower trainers, running under `tf.compat.v1` on TensorFlow 2.21.

Importing the package installs `legacy/slim_compat.py` (tf-slim and `tf.compat.v1.layers` on TF 2.21),
so `import tf_slim` works in every module below.  It also quiets TensorFlow's C++ log below warnings
(TF_CPP_MIN_LOG_LEVEL 2, unless the caller set it) before TensorFlow loads, when a program starts through
the package (`python -m legacy...`, the console scripts, the tests).
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from legacy import slim_compat  # noqa: E402, F401  (after the log level: it imports TensorFlow)
