"""The TF2 ports of the legacy programs: Keras 3, tf.distribute, tf.function.

Importing the package quiets TensorFlow's C++ log below warnings (TF_CPP_MIN_LOG_LEVEL 2, unless the
caller set it) before TensorFlow loads, when a program starts through the package (`python -m modern...`,
the console scripts, the tests).
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
