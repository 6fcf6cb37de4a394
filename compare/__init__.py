"""The parity harness: judges a TF1 tower program against its TF2 port, tensor by tensor (compare/run.py).

Importing the package quiets TensorFlow's C++ log below warnings (TF_CPP_MIN_LOG_LEVEL 2, unless the
caller set it) before TensorFlow loads, when a program starts through the package (`python -m compare...`,
the console scripts, the tests).
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
