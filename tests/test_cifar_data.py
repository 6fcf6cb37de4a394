"""records/cifar10.py: the TFRecord format, the converter, the preprocessing and the embedded synthetic set."""
import os
import pickle

import numpy as np
import pytest
import tensorflow as tf

from records import cifar10, mnist, tfrecord


def _write_cifar_batch(path, images_hwc, labels):
    """Write one batch as the CIFAR-10 python distribution does: channel-major rows of 3072 bytes."""
    data = images_hwc.transpose(0, 3, 1, 2).reshape(len(images_hwc), -1)
    with open(path, "wb") as f:
        pickle.dump({b"batch_label": b"test", b"data": data, b"labels": list(map(int, labels))}, f)


def _read_records(path):
    images, labels = [], []
    for image, label in tf.data.TFRecordDataset([path]).map(cifar10.parser_tfrecords):
        images.append(image.numpy())
        labels.append(int(label))
    return np.array(images), np.array(labels)


@pytest.fixture
def cifar_src(tmp_path):
    """A miniature CIFAR-10 python distribution: 3 images per training batch, 4 test images."""
    rng = np.random.RandomState(0)
    src = tmp_path / "cifar-10-batches-py"
    src.mkdir()
    batches = {}
    for name, n in [(f"data_batch_{i}", 3) for i in range(1, 6)] + [("test_batch", 4)]:
        images = rng.randint(0, 256, size=(n, 32, 32, 3)).astype(np.uint8)
        labels = rng.randint(0, 10, size=n)
        _write_cifar_batch(src / name, images, labels)
        batches[name] = (images, labels)
    return src, batches


def test_converter_round_trips_a_cifar_pickle(cifar_src, tmp_path):
    src, batches = cifar_src
    train_path, test_path = cifar10.convert_cifar10(str(src), str(tmp_path / "out"))
    images, labels = _read_records(train_path)
    expected = [batches[f"data_batch_{i}"] for i in range(1, 6)]
    np.testing.assert_array_equal(images, np.concatenate([e[0] for e in expected]))
    np.testing.assert_array_equal(labels, np.concatenate([e[1] for e in expected]))
    images, labels = _read_records(test_path)
    np.testing.assert_array_equal(images, batches["test_batch"][0])
    np.testing.assert_array_equal(labels, batches["test_batch"][1])
    assert cifar10.check_tfrecord_files([train_path, test_path]) == [15, 4]


def test_converter_reads_rows_channel_major(tmp_path):
    # Pixel (row 1, column 2) of channel c is byte c*1024 + 1*32 + 2 of the CIFAR row.
    row = np.zeros(3072, np.uint8)
    row[0 * 1024 + 34], row[1 * 1024 + 34], row[2 * 1024 + 34] = 10, 20, 30
    path = tmp_path / "one_row_batch"
    path.write_bytes(pickle.dumps({b"data": row[None], b"labels": [7]}))
    images, labels = cifar10.load_cifar_batch(str(path))
    assert images.shape == (1, 32, 32, 3) and labels.tolist() == [7]
    assert images[0, 1, 2].tolist() == [10, 20, 30]
    assert images.sum() == 60


def test_converter_names_the_missing_batch_and_writes_nothing(cifar_src, tmp_path):
    src, _ = cifar_src
    (src / "data_batch_3").unlink()
    with pytest.raises(cifar10.CifarDataError, match="data_batch_3"):
        cifar10.convert_cifar10(str(src), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_converter_names_a_corrupt_batch(cifar_src, tmp_path):
    src, _ = cifar_src
    (src / "test_batch").write_bytes(b"not a pickle at all")
    with pytest.raises(cifar10.CifarDataError, match="test_batch"):
        cifar10.convert_cifar10(str(src), str(tmp_path / "out"))
    assert not (tmp_path / "out" / "train.tfrecords").exists()


def test_interrupted_write_leaves_no_file(tmp_path, monkeypatch):
    images = np.zeros((5, 32, 32, 3), np.uint8)
    calls = []

    def failing_example(image, label):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("interrupted")
        return original(image, label)

    original = cifar10._example
    monkeypatch.setattr(cifar10, "_example", failing_example)
    with pytest.raises(RuntimeError, match="interrupted"):
        cifar10.write_tfrecords(str(tmp_path / "train.tfrecords"), images, np.zeros(5, int))
    assert os.listdir(tmp_path) == []


def test_check_tfrecord_files_names_missing_and_corrupt_files(tmp_path):
    good = cifar10.write_tfrecords(str(tmp_path / "good.tfrecords"),
                                   np.zeros((4, 32, 32, 3), np.uint8), np.arange(4))
    with pytest.raises(cifar10.CifarDataError, match="nowhere.tfrecords"):
        cifar10.check_tfrecord_files([good, str(tmp_path / "nowhere.tfrecords")])
    truncated = tmp_path / "truncated.tfrecords"
    truncated.write_bytes(open(good, "rb").read()[:-100])
    with pytest.raises(cifar10.CifarDataError, match="truncated.tfrecords"):
        cifar10.check_tfrecord_files([good, str(truncated)])
    assert cifar10.check_tfrecord_files([good]) == [4]


def test_check_tfrecord_files_rejects_records_of_another_format(tmp_path):
    other = tmp_path / "mnist.tfrecords"
    mnist.write_tfrecords(other, np.zeros((2, 784), np.uint8), np.arange(2))
    with pytest.raises(cifar10.CifarDataError, match="record 0 is not in the CIFAR-10 record format"):
        cifar10.check_tfrecord_files([str(other)])
    empty = tmp_path / "empty.tfrecords"
    tfrecord.write_records(empty, [])
    with pytest.raises(cifar10.CifarDataError, match="holds no records"):
        cifar10.check_tfrecord_files([str(empty)])


def test_check_tfrecord_files_works_inside_a_tf1_graph(tmp_path):
    good = cifar10.write_tfrecords(str(tmp_path / "good.tfrecords"),
                                   np.zeros((3, 32, 32, 3), np.uint8), np.arange(3))
    with tf.Graph().as_default() as graph:
        assert cifar10.check_tfrecord_files([good]) == [3]
        assert graph.get_operations() == []  # the caller's graph is left alone


def test_preprocess_for_test_maps_uint8_onto_minus_one_one():
    image = tf.constant(np.array([0, 127, 255] * 1024, np.uint8).reshape(32, 32, 3))
    out = cifar10.preprocess_for_test(image).numpy()
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[0, 0], [-1.0, 127 / 127.5 - 1, 1.0], atol=1e-7)


def test_preprocess_for_train_is_a_flipped_crop_of_the_padded_image():
    rng = np.random.RandomState(1)
    image = rng.randint(0, 256, size=(32, 32, 3)).astype(np.uint8)
    padded = np.pad(cifar10.preprocess_for_test(image).numpy(), [(4, 4), (4, 4), (0, 0)], constant_values=-1.0)
    tf.random.set_seed(3)
    for _ in range(4):
        out = cifar10.preprocess_for_train(tf.constant(image)).numpy()
        assert out.shape == (32, 32, 3) and out.min() >= -1 and out.max() <= 1
        windows = [padded[dy:dy + 32, dx:dx + 32] for dy in range(9) for dx in range(9)]
        assert any(np.array_equal(out, w) or np.array_equal(out, w[:, ::-1]) for w in windows)


def test_synthetic_set_is_sized_with_a_short_last_batch_and_learnable(tmp_path):
    train_path, test_path = cifar10.make_synthetic(str(tmp_path))
    assert cifar10.check_tfrecord_files([train_path, test_path]) == [997, 250]
    train_x, train_y = _read_records(train_path)
    test_x, test_y = _read_records(test_path)
    assert sorted(set(train_y.tolist())) == list(range(10))
    # Learnable: even a nearest-class-mean colour classifier is far above chance (10%) ...
    means = np.array([train_x[train_y == c].mean(axis=(0, 1, 2)) for c in range(10)])
    colour = test_x.mean(axis=(1, 2))
    predicted = np.argmin(((colour[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    accuracy = (predicted == test_y).mean()
    # ... but not trivially: one pixel is mostly noise.
    assert 0.3 < accuracy < 1.0
    assert train_x[:, 0, 0].std() > 30


def test_both_data_sets_live_under_data_relative_to_the_working_directory():
    assert cifar10.DEFAULT_DATA_DIR == os.path.join("data", "cifar10_synthetic")
    assert mnist.DEFAULT_DATA_DIR == os.path.join("data", "mnist")


def test_ensure_default_data_remakes_a_set_of_another_size(tmp_path):
    folder = str(tmp_path / "syn")
    cifar10.make_synthetic(folder, num_train=7, num_valid=3)  # a set of other sizes
    train, valid = cifar10.ensure_default_data(folder)
    assert cifar10.check_tfrecord_files(train + valid) == [cifar10.SYNTHETIC_TRAIN, cifar10.SYNTHETIC_VALID]


def test_ensure_default_data_makes_the_set_once(tmp_path):
    train, valid = cifar10.ensure_default_data(str(tmp_path / "syn"))
    stamp = os.path.getmtime(train[0])
    assert cifar10.ensure_default_data(str(tmp_path / "syn")) == (train, valid)
    assert os.path.getmtime(train[0]) == stamp


def test_both_trainers_resolve_data_folders_and_profiles_alike(tmp_path):
    """records.cifar10.resolve_files and fill_profile, through each trainer's resolve_data: the same
    flags give the same files and sizes on both sides, and the same one-line error."""
    from legacy import cifar_resnet as legacy_cifar
    from modern import cifar_resnet as modern_cifar
    data = tmp_path / "data"
    cifar10.make_synthetic(str(data), num_train=3, num_valid=2, seed=1)
    other = cifar10.write_tfrecords(str(tmp_path / "other.tfrecords"), *cifar10.synthetic_images(2, 5))
    for flags, train, test in (
            (["--data_dir", str(data)], [str(data / cifar10.TRAIN_FILE)], [str(data / cifar10.TEST_FILE)]),
            (["--data_dir", str(data), "--test_tfrecords", other], [str(data / cifar10.TRAIN_FILE)], [other]),
            (["--train_tfrecords", other, "--test_tfrecords", other, "--batch_size", "4"], [other], [other])):
        legacy_args, modern_args = legacy_cifar.parse_args(flags), modern_cifar.parse_args(flags)
        assert legacy_cifar.resolve_data(legacy_args) == (train, test)
        embedded, changed, *files = modern_cifar.resolve_data(modern_args)
        assert (embedded, changed, files[0], files[2]) == (False, [], train, test)
        sizes = [(a.batch_size, a.valid_batch_size, a.epochs) for a in (legacy_args, modern_args)]
        assert sizes[0] == sizes[1] == ((4 if "--batch_size" in flags else 256), 256, 200)
    # One list without --data_dir for the other side: both refuse, with the same words (the modern
    # trainer used to read ./test.tfrecords).
    message = "give --data_dir, or both --train_tfrecords and --test_tfrecords"
    with pytest.raises(cifar10.CifarDataError, match=message):
        legacy_cifar.resolve_data(legacy_cifar.parse_args(["--train_tfrecords", other]))
    with pytest.raises(modern_cifar.UsageError, match=message):
        modern_cifar.resolve_data(modern_cifar.parse_args(["--train_tfrecords", other]))


def test_the_reader_drops_only_its_own_deprecation_notice(tmp_path):
    """records.tfrecord reads with tf.compat.v1.io.tf_record_iterator (deprecated); the filter on
    TensorFlow's logger drops that one notice and lets every other message through (the logger's
    filters asked directly: its level depends on what ran before in this process)."""
    import logging

    def passes(message):
        return bool(tf.get_logger().filter(logging.LogRecord("tensorflow", logging.WARNING, "x.py", 1,
                                                             message, None, None)))

    notice = "From x.py:1: " + tfrecord.DEPRECATION_NOTICE + " and will be removed in a future version."
    assert not passes(notice)
    assert passes("From x.py:2: some_other_function (from tensorflow.python.foo) is deprecated")
    assert passes("any other warning")
