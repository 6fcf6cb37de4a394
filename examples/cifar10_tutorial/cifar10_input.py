"""CIFAR-10 in its binary version, read with tf.data: the input code both example programs share.

The format (the "CIFAR-10 binary version", `cifar-10-batches-bin/`): files `data_batch_1.bin` ..
`data_batch_5.bin` (10000 records each) and `test_batch.bin`, each record 3073 bytes: the label (one
byte, 0..9), then the 32x32x3 image depth-major (1024 red, 1024 green, 1024 blue bytes, each row by
row).  The training images are cropped to 24x24 at random, flipped, and their brightness and
contrast distorted; the evaluation images are cropped to their central 24x24; both are standardised
per image (`tf.image.per_image_standardization`), as the classic tutorial's `cifar10_input.py` does.

The functions use only tf.data and tf.image ops, so the TF1 graph program and its TF2 port call the
same code (as `records/` is shared by this repository's two other pairs).  With no data given, a
small synthetic set in the same binary format is made under `data/cifar10_tutorial_synthetic/`.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import tensorflow as tf
from numpy.typing import ArrayLike

from records import cifar10 as cifar10_records
from records import tfrecord

IMAGE_SIZE = 24                      # the crop the network sees
NUM_CLASSES = 10
NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN = 50000
NUM_EXAMPLES_PER_EPOCH_FOR_EVAL = 10000
HEIGHT = WIDTH = 32
DEPTH = 3
LABEL_BYTES = 1
IMAGE_BYTES = HEIGHT * WIDTH * DEPTH
RECORD_BYTES = LABEL_BYTES + IMAGE_BYTES
TRAIN_FILES = [f"data_batch_{i}.bin" for i in range(1, 6)]
TEST_FILE = "test_batch.bin"
# The tutorial keeps 40% of an epoch in its shuffling queue (min_fraction_of_examples_in_queue).
MIN_FRACTION_OF_EXAMPLES_IN_QUEUE = 0.4

DEFAULT_DATA_DIR = tfrecord.data_dir("cifar10_tutorial_synthetic")
SYNTHETIC_TRAIN, SYNTHETIC_EVAL = 1000, 200


class Cifar10BinaryError(tfrecord.DataError):
    """A binary CIFAR-10 file is missing or not in the format (the message names it)."""


def read_cifar10(record: Any) -> tuple[Any, Any]:
    """One 3073-byte record -> (uint8 image [32, 32, 3] HWC, int32 label)."""
    raw = tf.io.decode_raw(record, tf.uint8)
    label = tf.cast(raw[0], tf.int32)
    depth_major = tf.reshape(raw[LABEL_BYTES:RECORD_BYTES], [DEPTH, HEIGHT, WIDTH])
    return tf.transpose(depth_major, [1, 2, 0]), label


def distort(image: Any) -> Any:
    """The training distortions: a random 24x24 crop, a random flip, random brightness and contrast."""
    image = tf.image.random_crop(tf.cast(image, tf.float32), [IMAGE_SIZE, IMAGE_SIZE, DEPTH])
    image = tf.image.random_flip_left_right(image)
    image = tf.image.random_brightness(image, max_delta=63)
    image = tf.image.random_contrast(image, lower=0.2, upper=1.8)
    return tf.image.per_image_standardization(image)


def central(image: Any) -> Any:
    """The evaluation crop: the central 24x24, standardised."""
    image = tf.image.resize_with_crop_or_pad(tf.cast(image, tf.float32), IMAGE_SIZE, IMAGE_SIZE)
    return tf.image.per_image_standardization(image)


def train_dataset(filenames: Sequence[str], batch_size: int, distorted: bool = True,
                  shuffle_buffer: Optional[int] = None) -> Any:
    """The training stream: records shuffled (a buffer of 40% of an epoch, as the tutorial's queue),
    repeated forever, in full batches only (the tutorial's `shuffle_batch` never yields a short one)."""
    buffer = shuffle_buffer or int(NUM_EXAMPLES_PER_EPOCH_FOR_TRAIN * MIN_FRACTION_OF_EXAMPLES_IN_QUEUE)
    dataset = tf.data.FixedLengthRecordDataset(filenames, RECORD_BYTES).map(read_cifar10)
    dataset = dataset.map(lambda image, label: (distort(image) if distorted else central(image), label))
    return dataset.shuffle(buffer).repeat().batch(batch_size, drop_remainder=True)


def eval_dataset(filenames: Sequence[str], batch_size: int, num_examples: int) -> tuple[Any, int]:
    """The evaluation stream, as the tutorial's eval loop reads it: ceil(examples / batch) full batches
    of centrally cropped images, wrapping around the file (its queue repeats)."""
    num_iter = -(-num_examples // batch_size)
    dataset = tf.data.FixedLengthRecordDataset(filenames, RECORD_BYTES).map(read_cifar10)
    dataset = dataset.map(lambda image, label: (central(image), label))
    return dataset.repeat().batch(batch_size, drop_remainder=True).take(num_iter), num_iter


def count_records(filenames: Iterable[str]) -> int:
    """The records in `filenames`, each checked to exist and to hold whole 3073-byte records."""
    total = 0
    for name in filenames:
        if not os.path.isfile(name):
            raise Cifar10BinaryError(f"{name}: no such file (CIFAR-10 binary version: data_batch_1.bin ... "
                                     f"test_batch.bin)")
        size = os.path.getsize(name)
        if size == 0 or size % RECORD_BYTES:
            raise Cifar10BinaryError(f"{name}: {size} bytes, not a whole number of {RECORD_BYTES}-byte CIFAR-10 "
                                     f"records")
        total += size // RECORD_BYTES
    return total


def write_binary(path: str, images: ArrayLike, labels: ArrayLike) -> str:
    """Write uint8 images [n, 32, 32, 3] and labels [n] as one CIFAR-10 binary file (atomically)."""
    images, labels = np.asarray(images, np.uint8), np.asarray(labels, np.uint8)
    records = np.concatenate([labels[:, None], images.transpose(0, 3, 1, 2).reshape(len(images), -1)], axis=1)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(records.tobytes())
    os.replace(tmp, path)
    return path


def ensure_default_data(data_dir: str = DEFAULT_DATA_DIR) -> tuple[list[str], list[str]]:
    """The embedded synthetic set (records.cifar10's learnable images) in the binary format:
    ([train file], [eval file]), made on first use."""
    train, test = os.path.join(data_dir, TRAIN_FILES[0]), os.path.join(data_dir, TEST_FILE)
    try:
        current = count_records([train]) == SYNTHETIC_TRAIN and count_records([test]) == SYNTHETIC_EVAL
    except Cifar10BinaryError:
        current = False
    if not current:
        write_binary(train, *cifar10_records.synthetic_images(SYNTHETIC_TRAIN, 0))
        write_binary(test, *cifar10_records.synthetic_images(SYNTHETIC_EVAL, 1))
    return [train], [test]


def resolve(data_dir: Optional[str]) -> tuple[list[str], list[str], bool]:
    """(train files, eval files, embedded?): the files of --data_dir (the folder holding the .bin files,
    or its cifar-10-batches-bin/), or the embedded synthetic set."""
    if data_dir is None:
        return (*ensure_default_data(), True)
    folder = os.path.join(data_dir, "cifar-10-batches-bin")
    folder = folder if os.path.isdir(folder) else data_dir
    return [os.path.join(folder, f) for f in TRAIN_FILES], [os.path.join(folder, TEST_FILE)], False
