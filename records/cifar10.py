"""CIFAR-10 as TFRecords: the format, the preprocessing, a converter, and the embedded synthetic set.

Shared by `legacy/cifar_resnet.py` (TF1 graph, `tf.compat.v1`) and `modern/cifar_resnet.py` (TF2 eager
and `tf.function`), so everything here uses `tf.io` / `tf.image` ops that work in both.

The record format is the one the original's `utils.parse_functions.parser_tfrecords` reads (the original
imports it without showing it)::

    'image_raw': bytes, the uint8 image in HWC order (32 x 32 x 3 = 3072 bytes)
    'label':     int64, the class index 0..9

Commands::

    python -m records.cifar10 --src cifar-10-batches-py --out data/cifar10   # real CIFAR-10
    python -m records.cifar10 --synthetic --out data/cifar10_synthetic       # the embedded default

The converter reads the standard "CIFAR-10 python version" (`data_batch_1` .. `data_batch_5`,
`test_batch`: pickled dicts with b'data', N x 3072 uint8 in channel-major order, and b'labels') and
writes `train.tfrecords` (50000) and `test.tfrecords` (10000).
"""
from __future__ import annotations

import argparse
import os
import pickle
import sys
from typing import Any, Mapping, Optional, Sequence, cast

import numpy as np
import tensorflow as tf
from numpy.typing import ArrayLike

from records import tfrecord
from records.usage import ArgumentParser, at_least

IMAGE_SIZE = 32
CHANNELS = 3
NUM_CLASSES = 10
IMAGE_BYTES = IMAGE_SIZE * IMAGE_SIZE * CHANNELS
TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_BATCH = "test_batch"
TRAIN_FILE = "train.tfrecords"
TEST_FILE = "test.tfrecords"

# The embedded default data set (see `make_synthetic`) and the run sized for it, used by both
# trainers when no data is given.  997 = 62 * 16 + 5: with batch 16 every epoch ends on a short
# batch of 5 rows, which shows both stories of the original on 2 towers, as its own 50000 rows and batch
# 256 do (a last batch of 80: towers [40, 40] with the fix, [80, 0] under the bug):
#   the fix, current_batch_size = 5 // 2 = 2: towers [2, 2], one row dropped (an odd remainder);
#   --split=static, a constant 16 // 2 = 8: towers [5, 0], tower 1 EMPTY (a remainder below 8).
# 8 epochs = 504 steps: minutes of training on 2 CPU cores for the two-tower ResNet-v2-50, and
# enough batch-norm moving-average updates (decay 0.997) for validation to climb well above chance.
SYNTHETIC_TRAIN = 997
SYNTHETIC_VALID = 250
SYNTHETIC_SEED = 0
DEFAULT_DATA_DIR = tfrecord.data_dir("cifar10_synthetic")
EMBEDDED_PROFILE = {"batch_size": 16, "valid_batch_size": 50, "epochs": 8}


class CifarDataError(tfrecord.DataError):
    """A data file is missing, corrupt or not in the expected format (the message names it)."""


# ---------------------------------------------------------------------------------------------
# The record format
# ---------------------------------------------------------------------------------------------

FEATURES = {
    "image_raw": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
}


def parser_tfrecords(record: Any) -> tuple[Any, Any]:
    """Parse one serialized example into (image uint8 [32, 32, 3], label int64 []).

    The original's `utils.parse_functions.parser_tfrecords`, which it maps over a `TFRecordDataset`.
    """
    features = tf.io.parse_single_example(record, FEATURES)
    image = tf.io.decode_raw(features["image_raw"], tf.uint8)
    image = tf.reshape(image, [IMAGE_SIZE, IMAGE_SIZE, CHANNELS])
    return image, features["label"]


def _example(image: np.ndarray, label: int) -> bytes:
    image = np.ascontiguousarray(image, dtype=np.uint8)
    return tf.train.Example(features=tf.train.Features(feature={
        "image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
    })).SerializeToString()


def write_tfrecords(path: str, images: ArrayLike, labels: ArrayLike) -> str:
    """Write uint8 images [N, 32, 32, 3] (HWC) and integer labels [N] to `path` (atomically:
    `records.tfrecord.write_records`).  Returns `path`."""
    images = np.asarray(images)
    labels = np.asarray(labels)
    if images.dtype != np.uint8 or images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE, CHANNELS):
        raise CifarDataError(f"{path}: images must be uint8 [N, 32, 32, 3], got {images.dtype} {images.shape}")
    if labels.shape != (images.shape[0],) or (labels.size and not 0 <= labels.min() <= labels.max() < NUM_CLASSES):
        raise CifarDataError(f"{path}: labels must be {images.shape[0]} integers in 0..9, got shape {labels.shape}")
    tfrecord.write_records(path, map(_example, images, labels), CifarDataError)
    return path


def check_tfrecord_files(files: Sequence[str]) -> list[int]:
    """Read every record of every file once; raise `CifarDataError` naming the first bad file.

    Catches what would otherwise surface mid-training as a `DataLossError` traceback: a missing
    file, a truncated or corrupt record, or records that are not in this module's format.
    Returns the number of records per file.  Pure Python: works in TF2 eager and TF1 graph code.
    """
    counts = []
    for path in files:
        count = 0
        for example in tfrecord.read_examples(path, CifarDataError):
            feature = example.features.feature
            image_raw, label = feature["image_raw"].bytes_list.value, feature["label"].int64_list.value
            if len(image_raw) != 1 or len(image_raw[0]) != IMAGE_BYTES or len(label) != 1:
                raise CifarDataError(f"TFRecord file {path}: record {count} is not in the CIFAR-10 record "
                                     f"format ('image_raw' uint8 32x32x3 bytes, 'label' int64)")
            count += 1
        counts.append(count)
    return counts


# ---------------------------------------------------------------------------------------------
# Preprocessing (the original imports these from utils.preprocess without showing them)
# ---------------------------------------------------------------------------------------------

def preprocess_for_test(image: Any) -> Any:
    """uint8 [32, 32, 3] -> float32 in [-1, 1]: x / 127.5 - 1.

    [-1, 1] is the input range of the slim `resnet_v2_*` checkpoints ("inception" preprocessing),
    so a restored `resnet_v2_50.ckpt` sees what it was trained on.  No resizing: the network runs
    at CIFAR's 32 x 32.
    """
    return tf.cast(image, tf.float32) / 127.5 - 1.0


def preprocess_for_train(image: Any) -> Any:
    """The standard CIFAR augmentation, then `preprocess_for_test`'s scaling.

    Zero-pad to 40 x 40, take a random 32 x 32 crop, flip left-right with probability 1/2.
    (The original defines it but trains with `preprocess_for_test`; the legacy port keeps that.)
    """
    image = tf.image.resize_with_crop_or_pad(image, IMAGE_SIZE + 8, IMAGE_SIZE + 8)
    image = tf.image.random_crop(image, [IMAGE_SIZE, IMAGE_SIZE, CHANNELS])
    image = tf.image.random_flip_left_right(image)
    return preprocess_for_test(image)


# ---------------------------------------------------------------------------------------------
# Converter from the standard CIFAR-10 python distribution
# ---------------------------------------------------------------------------------------------

def load_cifar_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Read one pickled CIFAR-10 batch; return images uint8 [N, 32, 32, 3] (HWC) and labels int64 [N]."""
    if not os.path.isfile(path):
        raise CifarDataError(f"CIFAR-10 batch file not found: {path}")
    try:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[b"labels"], dtype=np.int64)
    except Exception as error:  # unpickling garbage raises almost anything
        raise CifarDataError(f"{path} is not a CIFAR-10 python batch (a pickled dict with b'data' and "
                             f"b'labels'): {type(error).__name__}: {error}") from None
    if data.ndim != 2 or data.shape[1] != IMAGE_BYTES or labels.shape != (data.shape[0],):
        raise CifarDataError(f"{path}: expected b'data' N x {IMAGE_BYTES} and N labels, got "
                             f"{data.shape} and {labels.shape}")
    if labels.size and not 0 <= labels.min() <= labels.max() < NUM_CLASSES:
        raise CifarDataError(f"{path}: labels outside 0..9")
    # Rows are channel-major (1024 R, 1024 G, 1024 B); the records are HWC.
    images = data.reshape(-1, CHANNELS, IMAGE_SIZE, IMAGE_SIZE).transpose(0, 2, 3, 1)
    return images, labels


def convert_cifar10(src_dir: str, out_dir: str) -> tuple[str, str]:
    """Convert `src_dir`'s data_batch_1..5 and test_batch into `out_dir`/train.tfrecords, test.tfrecords.

    Every input is read and checked before anything is written.  Returns (train_path, test_path).
    """
    missing = [name for name in TRAIN_BATCHES + [TEST_BATCH] if not os.path.isfile(os.path.join(src_dir, name))]
    if missing:
        raise CifarDataError(f"{src_dir} is not the CIFAR-10 python distribution: missing "
                             f"{', '.join(missing)} (expected data_batch_1..5 and test_batch)")
    train = [load_cifar_batch(os.path.join(src_dir, name)) for name in TRAIN_BATCHES]
    test = load_cifar_batch(os.path.join(src_dir, TEST_BATCH))
    train_path = write_tfrecords(os.path.join(out_dir, TRAIN_FILE),
                                 np.concatenate([t[0] for t in train]), np.concatenate([t[1] for t in train]))
    test_path = write_tfrecords(os.path.join(out_dir, TEST_FILE), *test)
    return train_path, test_path


# ---------------------------------------------------------------------------------------------
# The embedded default: a small, learnable, CIFAR-shaped synthetic set
# ---------------------------------------------------------------------------------------------

def synthetic_images(num: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`num` images of 10 classes: a class template (colour + oriented stripes) at a random
    phase, times a random contrast, plus heavy pixel noise.  Learnable, but not from one pixel."""
    rng = np.random.RandomState(seed)
    template_rng = np.random.RandomState(1234)  # the classes are the same for every seed
    colours = template_rng.uniform(-1, 1, size=(NUM_CLASSES, CHANNELS))
    angles = np.arange(NUM_CLASSES) * np.pi / NUM_CLASSES
    freqs = template_rng.uniform(0.25, 0.6, size=NUM_CLASSES)
    yy, xx = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE].astype(np.float64)
    labels = rng.randint(0, NUM_CLASSES, size=num)
    phases = rng.uniform(0, 2 * np.pi, size=num)
    contrast = rng.uniform(0.5, 1.0, size=(num, 1, 1, 1))
    a, f = angles[labels][:, None, None], freqs[labels][:, None, None]
    stripes = np.sin(f * (np.cos(a) * xx + np.sin(a) * yy) + phases[:, None, None])
    pattern = 0.5 * colours[labels][:, None, None, :] + 0.5 * stripes[..., None]
    images = 128 + 80 * contrast * pattern + rng.normal(0, 40, size=(num, IMAGE_SIZE, IMAGE_SIZE, CHANNELS))
    return np.clip(np.round(images), 0, 255).astype(np.uint8), labels.astype(np.int64)


def make_synthetic(out_dir: str, num_train: int = SYNTHETIC_TRAIN, num_valid: int = SYNTHETIC_VALID,
                   seed: int = SYNTHETIC_SEED) -> tuple[str, str]:
    """Write the synthetic set as `out_dir`/train.tfrecords and test.tfrecords; return their paths."""
    train_path = write_tfrecords(os.path.join(out_dir, TRAIN_FILE), *synthetic_images(num_train, seed))
    test_path = write_tfrecords(os.path.join(out_dir, TEST_FILE), *synthetic_images(num_valid, seed + 1))
    return train_path, test_path


def ensure_default_data(data_dir: str = DEFAULT_DATA_DIR) -> tuple[list[str], list[str]]:
    """The embedded default data set in `data_dir`: ([train file], [valid file]).

    Made on first use, and made again when the files there do not hold SYNTHETIC_TRAIN and
    SYNTHETIC_VALID records (a set of other sizes, or a damaged one).  Deterministic
    (fixed seeds), so every clone makes the same bytes.
    """
    train_path, test_path = os.path.join(data_dir, TRAIN_FILE), os.path.join(data_dir, TEST_FILE)
    try:
        current = check_tfrecord_files([train_path, test_path]) == [SYNTHETIC_TRAIN, SYNTHETIC_VALID]
    except CifarDataError:
        current = False
    if not current:
        make_synthetic(data_dir, SYNTHETIC_TRAIN, SYNTHETIC_VALID)
    return [train_path], [test_path]


def resolve_files(data_dir: Optional[str], train_files: Optional[list[str]], test_files: Optional[list[str]],
                  embedded_dir: str) -> tuple[list[str], list[str], bool]:
    """(train files, test files, embedded?): what both CIFAR trainers read.

    No --data_dir, --train_tfrecords or --test_tfrecords: the embedded set in `embedded_dir` (made if
    missing).  Otherwise `data_dir`'s train.tfrecords and test.tfrecords, either one replaced by its
    explicit list; a list for one side alone needs `data_dir` for the other (CifarDataError).
    """
    if not (data_dir or train_files or test_files):
        return (*ensure_default_data(embedded_dir), True)
    if not data_dir and not (train_files and test_files):
        raise CifarDataError("give --data_dir, or both --train_tfrecords and --test_tfrecords")
    # cast: data_dir is set wherever a list is missing (checked above), which mypy cannot follow.
    return (train_files or [os.path.join(cast(str, data_dir), TRAIN_FILE)],
            test_files or [os.path.join(cast(str, data_dir), TEST_FILE)], False)


def add_profile_flags(parser: argparse.ArgumentParser, original: Mapping[str, int], batch_help: str) -> None:
    """Both CIFAR trainers' --batch_size, --valid_batch_size and --epochs, left None when not given:
    `fill_profile` then sets them from the embedded profile or from `original`, the original's."""
    parser.add_argument("--batch_size", type=at_least(1), default=None,
                        help=f"{batch_help} (default: the original's {original['batch_size']}; "
                             f"{EMBEDDED_PROFILE['batch_size']} on the embedded data)")
    parser.add_argument("--valid_batch_size", type=at_least(1), default=None,
                        help=f"rows per validation step (default: the original's {original['valid_batch_size']}; "
                             f"{EMBEDDED_PROFILE['valid_batch_size']} on the embedded data)")
    parser.add_argument("--epochs", type=at_least(1), default=None,
                        help=f"passes over the training set (default: the original's {original['epochs']}; "
                             f"{EMBEDDED_PROFILE['epochs']} on the embedded data)")


def add_schedule_flags(parser: argparse.ArgumentParser, shuffle_buffer: int, boundaries: Sequence[int],
                       values: Sequence[float]) -> None:
    """Both CIFAR trainers' --shuffle_buffer, --boundaries and --values, with the original's values
    (each program's own constants) as defaults."""
    parser.add_argument("--shuffle_buffer", type=at_least(1), default=shuffle_buffer,
                        help="rows in the shuffle buffer")
    parser.add_argument("--boundaries", type=at_least(1), nargs="+", default=boundaries,
                        help="steps where the piecewise-constant learning rate changes")
    parser.add_argument("--values", type=float, nargs="+", default=values,
                        help="learning rates, one more than --boundaries")


def check_schedule_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (parser.error: one line, exit 2) a schedule piecewise_constant cannot take."""
    if len(args.values) != len(args.boundaries) + 1:
        parser.error(f"--values needs one more entry than --boundaries ({len(args.boundaries) + 1}), "
                     f"got {len(args.values)}")
    if list(args.boundaries) != sorted(set(args.boundaries)):
        parser.error(f"--boundaries must increase, got {' '.join(map(str, args.boundaries))}")


def fill_profile(args: argparse.Namespace, profile: Mapping[str, int], original: Mapping[str, int]) -> list[str]:
    """Give each size flag of `profile` left unset (None) in `args` the profile's value; return
    "key value (original x)" for each value so set that differs from `original`."""
    differ = []
    for key, value in profile.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
            if value != original[key]:
                differ.append(f"{key} {value} (original {original[key]})")
    return differ


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = ArgumentParser(prog="python -m records.cifar10", description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", help="folder of the CIFAR-10 python distribution, cifar-10-batches-py "
                                      "(default: none; give it or --synthetic)")
    parser.add_argument("--out", required=True, help="folder to write train.tfrecords and test.tfrecords into")
    parser.add_argument("--synthetic", action="store_true", help="write the embedded synthetic set instead")
    parser.add_argument("--num_train", type=at_least(1), default=SYNTHETIC_TRAIN, help="synthetic training images")
    parser.add_argument("--num_valid", type=at_least(1), default=SYNTHETIC_VALID, help="synthetic validation images")
    parser.add_argument("--seed", type=int, default=SYNTHETIC_SEED, help="seed of the synthetic set")
    args = parser.parse_args(argv)
    try:
        if args.synthetic:
            paths = make_synthetic(args.out, args.num_train, args.num_valid, args.seed)
        elif args.src:
            paths = convert_cifar10(args.src, args.out)
        else:
            parser.error("give --src DIR (real CIFAR-10) or --synthetic")
        counts = check_tfrecord_files(paths)
    except (CifarDataError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for path, count in zip(paths, counts):
        print(f"wrote {path}: {count} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
