"""MNIST as the original program reads it: one TFRecord of `image_raw`/`pixels`/`label` examples.

The format is the one the original (the book's MNIST multi-GPU example) parses, written by its
book's chapter-7 converter: per example

    image_raw  bytes  784 uint8 pixels, row-major 28x28 (`ndarray.tobytes()`)
    pixels     int64  784
    label      int64  0..9

This module is shared by `legacy/` and `modern/`.  It holds:

- `parser(record)`: the original's parser, op for op (TF1 graph mode and TF2 eager alike: `tf.io`).
  Note it casts the pixels to float32 *without* scaling them to [0, 1]: the network sees 0..255.
- `write_tfrecords` / `load_tfrecords`: numpy <-> the TFRecord file, through `records.tfrecord`'s
  atomic writer and checked reader (shared with `records.cifar10`).
- `read_idx_images` / `read_idx_labels` / `convert_idx`: the standard MNIST IDX files
  (`train-images-idx3-ubyte[.gz]`, `train-labels-idx1-ubyte[.gz]`) to the TFRecord.  Command line:

      python -m records.mnist --images train-images-idx3-ubyte.gz \\
          --labels train-labels-idx1-ubyte.gz --out data/mnist/train.tfrecords

- `make_synthetic` / `ensure_default_data`: the embedded default, a small learnable MNIST-shaped
  set (seven-segment digits, jittered and noisy), so the programs run with no download.
"""
from __future__ import annotations

import gzip
import os
import sys
import zlib
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
from numpy.typing import ArrayLike

from records import tfrecord
from records.usage import ArgumentParser

IMAGE_ROWS = IMAGE_COLS = 28
IMAGE_PIXELS = IMAGE_ROWS * IMAGE_COLS  # 784
NUM_CLASSES = 10

IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dimensions
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dimension

DEFAULT_DATA_DIR = tfrecord.data_dir("mnist")
DEFAULT_TRAIN_EXAMPLES = 24000  # 240 batches of 100 per epoch: repeat(10) outlasts 1000 steps + summaries
DEFAULT_EVAL_EXAMPLES = 2000


class MnistDataError(tfrecord.DataError):
    """A data file is missing, malformed or inconsistent; the message names the file and the problem."""


# --------------------------------------------------------------------------------------------
# The TFRecord format
# --------------------------------------------------------------------------------------------
# The original's record features (its `parser`'s dict).
FEATURES = {
    'image_raw': tf.io.FixedLenFeature([], tf.string),
    'pixels': tf.io.FixedLenFeature([], tf.int64),
    'label': tf.io.FixedLenFeature([], tf.int64),
}


def parser(record: Any) -> tuple[Any, Any]:
    """The original's `parser`: one serialized example -> (784 float32 pixels in 0..255, int32 label)."""
    features = tf.io.parse_single_example(record, features=FEATURES)
    decoded_image = tf.io.decode_raw(features['image_raw'], tf.uint8)
    reshaped_image = tf.reshape(decoded_image, [IMAGE_PIXELS])
    retyped_image = tf.cast(reshaped_image, tf.float32)  # no /255: the original feeds raw pixel values
    label = tf.cast(features['label'], tf.int32)
    return retyped_image, label


def parse_batch(records: Any) -> tuple[Any, Any]:
    """`parser` over a batch of serialized examples at once: (float32 [B, 784], int32 [B]), the same
    values row for row.  One ParseExample and one DecodeRaw for the batch, where
    `tf.vectorized_map(parser, records)` falls back to a while loop for DecodeRaw."""
    features = tf.io.parse_example(records, features=FEATURES)
    images = tf.reshape(tf.io.decode_raw(features['image_raw'], tf.uint8), [-1, IMAGE_PIXELS])
    return tf.cast(images, tf.float32), tf.cast(features['label'], tf.int32)


def write_tfrecords(path: Union[str, os.PathLike[str]], images: ArrayLike, labels: ArrayLike) -> int:
    """Write `images` (N x 784 or N x 28 x 28, values 0..255) and `labels` (N, 0..9) in the original's format.

    The file appears under `path` only once fully written.  Returns the number of examples.
    """
    images = np.asarray(images)
    labels = np.asarray(labels)
    if images.ndim not in (2, 3) or images[0].size != IMAGE_PIXELS:
        raise MnistDataError(f"{path}: images must be N x 784 or N x 28 x 28, got shape {images.shape}")
    if labels.shape != (len(images),):
        raise MnistDataError(f"{path}: {len(images)} images but labels of shape {labels.shape}")
    if images.size and (images.min() < 0 or images.max() > 255):
        raise MnistDataError(f"{path}: pixel values must lie in 0..255")
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise MnistDataError(f"{path}: labels must lie in 0..9")
    images = images.reshape(len(images), IMAGE_PIXELS).astype(np.uint8)
    return tfrecord.write_records(path, map(_example, images, labels), MnistDataError)


def _example(image: np.ndarray, label: int) -> bytes:
    return tf.train.Example(features=tf.train.Features(feature={
        'image_raw': tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        'pixels': tf.train.Feature(int64_list=tf.train.Int64List(value=[IMAGE_PIXELS])),
        'label': tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    })).SerializeToString()


def load_tfrecords(path: Union[str, os.PathLike[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Read a whole TFRecord file back into numpy: (uint8 images N x 784, int64 labels N).

    Pure Python (no graph, no eager tensors), so it works in either TF mode.  Checks every record:
    a truncated or corrupt file, or records not in the original's format, raise MnistDataError.
    """
    if not os.path.isfile(path):
        raise MnistDataError(f"TFRecord file not found: {path} (convert the MNIST IDX files with "
                             "`python -m records.mnist`, or omit --data_path for the embedded set)")
    images, labels = [], []
    for i, example in enumerate(tfrecord.read_examples(path, MnistDataError)):
        feature = example.features.feature
        image_raw = feature['image_raw'].bytes_list.value
        label = feature['label'].int64_list.value
        if len(image_raw) != 1 or len(image_raw[0]) != IMAGE_PIXELS or len(label) != 1:
            raise MnistDataError(f"TFRecord file {path}: record {i} is not an MNIST example in the original's "
                                 "format ('image_raw' of 784 bytes, 'pixels', 'label')")
        images.append(np.frombuffer(image_raw[0], np.uint8))
        labels.append(label[0])
    return np.stack(images), np.asarray(labels, np.int64)


# --------------------------------------------------------------------------------------------
# IDX files (http://yann.lecun.com/exdb/mnist/ format)
# --------------------------------------------------------------------------------------------
def _read_idx_bytes(path: Union[str, os.PathLike[str]]) -> bytes:
    """The file's bytes, gunzipped if it starts with the gzip magic (whatever its name)."""
    try:
        with open(path, 'rb') as f:
            data = f.read()
    except FileNotFoundError:
        raise MnistDataError(f"IDX file {path} does not exist") from None
    except OSError as e:
        raise MnistDataError(f"cannot read IDX file {path}: {e.strerror or e}") from None
    if data[:2] == b'\x1f\x8b':
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise MnistDataError(f"{path} starts like a gzip file but does not decompress ({e})") from None
    return data


def _header(path: Union[str, os.PathLike[str]], data: bytes, expected_magic: int, num_dims: int,
            kind: str) -> tuple[list[int], int]:
    size = 4 + 4 * num_dims
    magic = int.from_bytes(data[:4], 'big')
    if len(data) < 4 or magic != expected_magic:
        other = {IDX_IMAGES_MAGIC: "an images file", IDX_LABELS_MAGIC: "a labels file"}.get(magic)
        hint = f" (it looks like {other})" if other else ""
        raise MnistDataError(f"{path} has magic number {magic}, not {expected_magic} "
                             f"for an IDX {kind} file{hint}")
    if len(data) < size:
        raise MnistDataError(f"{path} is too short ({len(data)} bytes) for an IDX {kind} header")
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(num_dims)]
    expected = size + int(np.prod(dims))
    if len(data) != expected:
        raise MnistDataError(f"{path} has {len(data)} bytes but its header (dimensions {dims}) "
                             f"promises {expected}: the file is truncated or corrupt")
    return dims, size


def read_idx_images(path: Union[str, os.PathLike[str]]) -> np.ndarray:
    """An IDX3 images file (magic 2051), gzipped or not -> uint8 array N x rows x cols."""
    data = _read_idx_bytes(path)
    (n, rows, cols), offset = _header(path, data, IDX_IMAGES_MAGIC, 3, "images")
    return np.frombuffer(data, np.uint8, offset=offset).reshape(n, rows, cols)


def read_idx_labels(path: Union[str, os.PathLike[str]]) -> np.ndarray:
    """An IDX1 labels file (magic 2049), gzipped or not -> uint8 array N (values checked to be 0..9)."""
    data = _read_idx_bytes(path)
    (n,), offset = _header(path, data, IDX_LABELS_MAGIC, 1, "labels")
    labels = np.frombuffer(data, np.uint8, offset=offset)
    if labels.size and labels.max() >= NUM_CLASSES:
        raise MnistDataError(f"{path} holds label {labels.max()}: MNIST labels are 0..9")
    return labels


def convert_idx(images_path: Union[str, os.PathLike[str]], labels_path: Union[str, os.PathLike[str]],
                out_path: Union[str, os.PathLike[str]]) -> int:
    """Convert a pair of MNIST IDX files to the original's TFRecord.  Returns the number of examples."""
    images = read_idx_images(images_path)
    labels = read_idx_labels(labels_path)
    if images.shape[1:] != (IMAGE_ROWS, IMAGE_COLS):
        raise MnistDataError(f"{images_path} holds {images.shape[1]}x{images.shape[2]} images; "
                             "the original's format needs 28x28 (784 pixels)")
    if len(images) != len(labels):
        raise MnistDataError(f"{images_path} holds {len(images)} images but {labels_path} "
                             f"holds {len(labels)} labels")
    return write_tfrecords(out_path, images, labels)


# --------------------------------------------------------------------------------------------
# The embedded default: synthetic seven-segment digits
# --------------------------------------------------------------------------------------------
# Segments of a seven-segment display as (row0, col0, row1, col1) in a 20 x 12 box, and the
# segments lit for each digit (a top, b upper right, c lower right, d bottom, e lower left,
# f upper left, g middle).
_SEGMENTS = {'a': (0, 0, 0, 11), 'b': (0, 11, 9, 11), 'c': (9, 11, 19, 11), 'd': (19, 0, 19, 11),
             'e': (9, 0, 19, 0), 'f': (0, 0, 9, 0), 'g': (9, 0, 9, 11)}
_DIGITS = ['abcdef', 'bc', 'abged', 'abgcd', 'fgbc', 'afgcd', 'afgedc', 'abc', 'abcdefg', 'abcdfg']


def _segment_images(thickness: int, slant: float) -> np.ndarray:
    """The seven segments (7 x 28 x 28, 0/1), strokes `thickness` px wide, sheared by `slant`."""
    out = np.zeros((len(_SEGMENTS), IMAGE_ROWS, IMAGE_COLS), np.float32)
    for k, (r0, c0, r1, c1) in enumerate(_SEGMENTS.values()):
        for t in np.linspace(0.0, 1.0, 40):
            r = 4 + r0 + t * (r1 - r0)  # MNIST digits sit in a 20 x 20 box centred in 28 x 28
            c = 8 + c0 + t * (c1 - c0) + slant * (10 - r)
            top, left = int(round(r)) - thickness // 2, int(round(c)) - thickness // 2
            out[k, top:top + thickness, left:left + thickness] = 1.0
    return out


def synthetic_arrays(num_examples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`num_examples` MNIST-shaped images (uint8 N x 784, dark background, bright strokes) and labels.

    Each is a seven-segment digit with a random stroke width (2 or 3 px), slant, shift of up to
    3 px, brightness and pixel noise; one in ten has one segment toggled (a stroke missing or
    extra), which can make it ambiguous.  Learnable by the 784-500-10 network, but not to 100%.
    """
    rng = np.random.RandomState(seed)
    variants = [_segment_images(k, s) for k in (2, 3) for s in (-0.15, 0.0, 0.2)]
    lit_by_digit = np.array([[name in segs for name in _SEGMENTS] for segs in _DIGITS], np.float32)
    labels = rng.randint(0, NUM_CLASSES, num_examples)
    images = np.empty((num_examples, IMAGE_ROWS, IMAGE_COLS), np.float32)
    for i, label in enumerate(labels):
        lit = lit_by_digit[label].copy()
        if rng.rand() < 0.1:
            k = rng.randint(len(lit))
            lit[k] = 1.0 - lit[k]
        image = np.minimum(np.tensordot(lit, variants[rng.randint(len(variants))], 1), 1.0)
        images[i] = np.roll(image, (rng.randint(-3, 4), rng.randint(-3, 4)), axis=(0, 1))
    images *= rng.uniform(150, 255, (num_examples, 1, 1))
    noisy = rng.rand(*images.shape) < 0.15
    images[noisy] += rng.normal(0, 25, noisy.sum())
    images = np.clip(np.rint(images), 0, 255).astype(np.uint8)
    return images.reshape(num_examples, IMAGE_PIXELS), labels


def make_synthetic(path: Union[str, os.PathLike[str]], num_examples: int, seed: int) -> int:
    """Write `num_examples` synthetic digits (see `synthetic_arrays`) to `path` via `write_tfrecords`."""
    images, labels = synthetic_arrays(num_examples, seed)
    return write_tfrecords(path, images, labels)


class DefaultData(NamedTuple):
    train: str
    eval: str


def ensure_default_data(data_dir: Union[str, os.PathLike[str]] = DEFAULT_DATA_DIR) -> DefaultData:
    """The embedded default data set, made on first use: (train path, held-out eval path).

    Deterministic (fixed seeds), so every clone makes the same bytes; written atomically, so an
    interrupted first run leaves nothing that a second run would mistake for the real file.
    """
    data_dir = Path(data_dir)
    train = data_dir / "synthetic_train.tfrecords"
    held_out = data_dir / "synthetic_eval.tfrecords"
    if not train.exists():
        make_synthetic(train, DEFAULT_TRAIN_EXAMPLES, seed=0)
    if not held_out.exists():
        make_synthetic(held_out, DEFAULT_EVAL_EXAMPLES, seed=1)
    return DefaultData(str(train), str(held_out))


# --------------------------------------------------------------------------------------------
# Command line: the IDX converter
# --------------------------------------------------------------------------------------------
def main(argv: Optional[Sequence[str]] = None) -> int:
    p = ArgumentParser(
        prog="python -m records.mnist",
        description="Convert MNIST IDX files (gzipped or not) to the TFRecord format the MNIST programs read.")
    p.add_argument("--images", required=True, help="e.g. train-images-idx3-ubyte.gz")
    p.add_argument("--labels", required=True, help="e.g. train-labels-idx1-ubyte.gz")
    p.add_argument("--out", required=True, help="output TFRecord, e.g. data/mnist/train.tfrecords")
    args = p.parse_args(argv)
    try:
        n = convert_idx(args.images, args.labels, args.out)
    except MnistDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {n} examples to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
