"""What the CIFAR-10 and MNIST record files share: where data lives, one atomic writer, one checked reader.

- `data_dir(name)`: the folder of a data set, `./data/<name>` relative to the working directory,
  like the originals' `./tfrecords/cifar10`, `./models/temporary` and `logs_and_models/` (so an
  installed copy of this package writes next to the user's runs, never into site-packages).
- `write_records(path, examples, error)`: serialized `tf.train.Example`s to `path`, written under a
  temporary name in the same folder and renamed when complete, so an interrupted write never leaves
  a truncated file under the real name.
- `read_examples(path, error)`: every record of `path` as a `tf.train.Example`, CRCs checked.  A
  missing, truncated, corrupt or empty file raises `error` (the caller's `DataError` subclass) with
  one sentence naming the file.  Pure Python, so it works the same in TF1 graph code and TF2 eager.
"""
from __future__ import annotations

import os
import tempfile
from typing import Any, Iterable, Iterator, Union

import tensorflow as tf

DATA_ROOT = "data"
# tf.compat.v1.io.tf_record_iterator is deprecated but is the one reader that works the same in TF1
# graph mode and TF2 eager; its one-off deprecation notice on TensorFlow's logger is dropped (that
# notice only: a filter on the logger, public API, where tensorflow.python.util.deprecation is not).
DEPRECATION_NOTICE = "tf_record_iterator (from tensorflow.python.lib.io.tf_record) is deprecated"
tf.get_logger().addFilter(lambda record: DEPRECATION_NOTICE not in record.getMessage())


class DataError(ValueError):
    """A data file is missing, malformed or inconsistent; the message names the file and the problem."""


def data_dir(name: str) -> str:
    """`./data/<name>`: where a data set lives, relative to the working directory."""
    return os.path.join(DATA_ROOT, name)


def write_records(path: Union[str, os.PathLike[str]], examples: Iterable[bytes],
                  error: type[Exception] = DataError) -> int:
    """Write `examples` (serialized tf.train.Example bytes) to `path` atomically; return the count."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    except OSError as e:
        raise error(f"cannot write {path}: {e.strerror or e}") from None
    os.close(fd)
    count = 0
    try:
        with tf.io.TFRecordWriter(tmp) as writer:
            for example in examples:
                writer.write(example)
                count += 1
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return count


def _raw_records(path: str) -> Iterator[bytes]:
    yield from tf.compat.v1.io.tf_record_iterator(str(path))


def read_examples(path: Union[str, os.PathLike[str]], error: type[Exception] = DataError) -> Iterator[Any]:
    """Yield each record of `path` as a tf.train.Example; raise `error` naming the file when it is
    missing, truncated or corrupt (CRC), holds something other than Examples, or holds no record."""
    path = str(path)
    if not os.path.isfile(path):
        raise error(f"TFRecord file not found: {path}")
    count = 0
    try:
        for raw in _raw_records(path):
            example = tf.train.Example.FromString(raw)
            count += 1
            yield example
    except tf.errors.OpError as e:
        raise error(f"TFRecord file {path} is truncated or corrupt: {e.message.splitlines()[0]}") from None
    except Exception as e:  # protobuf's DecodeError and friends
        if isinstance(e, DataError):
            raise
        raise error(f"TFRecord file {path}: record {count} is not a tf.train.Example "
                    f"({type(e).__name__}: {e})") from None
    if count == 0:
        raise error(f"TFRecord file {path} holds no records")
