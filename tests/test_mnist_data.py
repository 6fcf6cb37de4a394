"""records/mnist.py: the original's TFRecord format, the IDX converter, the synthetic default."""
import gzip

import numpy as np
import pytest
import tensorflow as tf

from records import mnist


def write_idx(path, magic, dims, payload, compress=False):
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims)
    data = header + bytes(payload)
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


@pytest.fixture
def small_mnist():
    rng = np.random.RandomState(0)
    return rng.randint(0, 256, (5, 28, 28)).astype(np.uint8), rng.randint(0, 10, 5).astype(np.uint8)


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_idx_converter_round_trips_images_and_labels(tmp_path, small_mnist, compress):
    images, labels = small_mnist
    img = write_idx(tmp_path / "img", 2051, images.shape, images.tobytes(), compress)
    lab = write_idx(tmp_path / "lab", 2049, labels.shape, labels.tobytes(), compress)
    out = tmp_path / "out" / "train.tfrecords"

    assert mnist.convert_idx(img, lab, out) == 5
    back_images, back_labels = mnist.load_tfrecords(out)
    np.testing.assert_array_equal(back_images, images.reshape(5, 784))
    np.testing.assert_array_equal(back_labels, labels)
    assert [p.name for p in out.parent.iterdir()] == ["train.tfrecords"]  # no temporary file left


def test_parser_gives_unscaled_float_pixels_and_int32_labels(tmp_path, small_mnist):
    images, labels = small_mnist
    path = tmp_path / "x.tfrecords"
    mnist.write_tfrecords(path, images, labels)
    image, label = next(iter(tf.data.TFRecordDataset([str(path)]).map(mnist.parser)))
    assert image.dtype == tf.float32 and image.shape == (784,)
    assert label.dtype == tf.int32 and int(label) == labels[0]
    # The original does not scale: pixel 255 stays 255.0.
    np.testing.assert_array_equal(image.numpy(), images[0].reshape(784).astype(np.float32))
    assert image.numpy().max() > 1.0


def test_parser_works_in_tf1_graph_mode(tmp_path, small_mnist):
    images, labels = small_mnist
    path = tmp_path / "x.tfrecords"
    mnist.write_tfrecords(path, images, labels)
    with tf.Graph().as_default():
        ds = tf.data.TFRecordDataset([str(path)]).map(mnist.parser).batch(5)
        x, y = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        with tf.compat.v1.Session() as sess:
            xv, yv = sess.run([x, y])
    np.testing.assert_array_equal(xv, images.reshape(5, 784))
    np.testing.assert_array_equal(yv, labels)


def test_idx_reader_rejects_wrong_magic_and_names_the_file(tmp_path, small_mnist):
    images, labels = small_mnist
    lab = write_idx(tmp_path / "lab", 2049, labels.shape, labels.tobytes())
    with pytest.raises(mnist.MnistDataError, match=r"lab has magic number 2049, not 2051.*labels file"):
        mnist.read_idx_images(lab)
    bad = write_idx(tmp_path / "bad", 1234, (5,), labels.tobytes())
    with pytest.raises(mnist.MnistDataError, match="magic number 1234, not 2049"):
        mnist.read_idx_labels(bad)


def test_idx_reader_rejects_truncated_files(tmp_path, small_mnist):
    images, labels = small_mnist
    img = write_idx(tmp_path / "img", 2051, images.shape, images.tobytes()[:-10], compress=True)
    with pytest.raises(mnist.MnistDataError, match="promises 3936: the file is truncated"):
        mnist.read_idx_images(img)
    broken_gz = tmp_path / "broken.gz"
    broken_gz.write_bytes(gzip.compress(b"x" * 100)[:20])
    with pytest.raises(mnist.MnistDataError, match="does not decompress"):
        mnist.read_idx_labels(broken_gz)
    with pytest.raises(mnist.MnistDataError, match="does not exist"):
        mnist.read_idx_labels(tmp_path / "missing")


def test_converter_rejects_mismatched_counts_and_leaves_nothing(tmp_path, small_mnist):
    images, labels = small_mnist
    img = write_idx(tmp_path / "img", 2051, images.shape, images.tobytes())
    lab = write_idx(tmp_path / "lab", 2049, (4,), labels[:4].tobytes())
    out = tmp_path / "out" / "train.tfrecords"
    with pytest.raises(mnist.MnistDataError, match="5 images but .*lab holds 4 labels"):
        mnist.convert_idx(img, lab, out)
    assert not out.exists()


def test_converter_command_line_reports_errors_with_exit_code_2(tmp_path, small_mnist, capsys):
    images, labels = small_mnist
    img = write_idx(tmp_path / "img", 2051, images.shape, images.tobytes())
    lab = write_idx(tmp_path / "lab", 2049, labels.shape, labels.tobytes())
    assert mnist.main(["--images", str(lab), "--labels", str(lab), "--out", str(tmp_path / "o")]) == 2
    assert "magic number 2049" in capsys.readouterr().err
    assert mnist.main(["--images", str(img), "--labels", str(lab), "--out", str(tmp_path / "o")]) == 0
    assert "wrote 5 examples" in capsys.readouterr().out


def test_load_tfrecords_rejects_a_truncated_file(tmp_path, small_mnist):
    path = tmp_path / "x.tfrecords"
    mnist.write_tfrecords(path, *small_mnist)
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(mnist.MnistDataError, match="truncated or corrupt"):
        mnist.load_tfrecords(path)


def test_synthetic_data_is_deterministic_mnist_shaped_and_balanced(tmp_path):
    a_images, a_labels = mnist.synthetic_arrays(500, seed=3)
    b_images, b_labels = mnist.synthetic_arrays(500, seed=3)
    np.testing.assert_array_equal(a_images, b_images)
    assert a_images.shape == (500, 784) and a_images.dtype == np.uint8
    assert a_images.max() > 200 and np.median(a_images) == 0  # bright strokes on a dark ground
    assert set(a_labels) == set(range(10))
    # Learnable: the class means differ clearly (nearest-mean classifier beats chance by far).
    means = np.stack([a_images[a_labels == k].mean(0) for k in range(10)])
    nearest = np.argmin(((b_images[:, None, :] - means[None]) ** 2).sum(-1), 1)
    assert (nearest == b_labels).mean() > 0.5

    path = tmp_path / "s.tfrecords"
    assert mnist.make_synthetic(path, 50, seed=1) == 50
    assert mnist.load_tfrecords(path)[0].shape == (50, 784)
