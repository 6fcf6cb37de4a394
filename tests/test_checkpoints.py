"""TF1 checkpoint <-> modern model conversion (modern/checkpoints.py): names, shapes, exactness.

The TF1 checkpoint is written by the original's graph *with its training bookkeeping* (Adam slots, the
unnamed global step `Variable`, beta1_power/beta2_power), as the legacy trainer's Saver writes it.
"""
import numpy as np
import pytest
import tensorflow as tf

from conftest import run_program
from modern import checkpoints
from modern.resnet_v2 import resnet_v2_50
from test_modern_resnet import build_slim_reference

NUM_MODEL_VARIABLES = 272


@pytest.fixture(scope="module")
def tf1_checkpoint(tmp_path_factory):
    reference = build_slim_reference(tmp_path_factory.mktemp("legacy") / "train-model.ckpt-7",
                                     with_optimizer=True)
    reference.sess.close()
    return reference.path


@pytest.fixture(scope="module")
def tf1_values(tf1_checkpoint):
    reader = tf.train.load_checkpoint(tf1_checkpoint)
    values = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    assert len(values) == NUM_MODEL_VARIABLES + 2 * 174 + 3  # + Adam's slots, step, beta powers
    return values


@pytest.fixture(scope="module")
def model():
    return resnet_v2_50(num_classes=10)


def model_values(model):
    return {name: v.numpy() for name, v in checkpoints.tf1_variable_map(model).items()}


def test_names_are_slims(model, tf1_values):
    names = checkpoints.tf1_variable_map(model)
    assert len(names) == NUM_MODEL_VARIABLES
    for name in ("resnet_v2_50/conv1/weights", "resnet_v2_50/conv1/biases",
                 "resnet_v2_50/block1/unit_1/bottleneck_v2/preact/gamma",
                 "resnet_v2_50/block1/unit_1/bottleneck_v2/shortcut/biases",
                 "resnet_v2_50/block1/unit_1/bottleneck_v2/conv1/BatchNorm/moving_variance",
                 "resnet_v2_50/block4/unit_3/bottleneck_v2/conv3/weights",
                 "resnet_v2_50/postnorm/moving_mean", "Logits/fc/weights", "Logits/fc/biases"):
        assert tuple(names[name].shape) == tf1_values[name].shape
    # Biases exactly where slim has them: root conv1, shortcut and conv3, never before a BN.
    assert "resnet_v2_50/block1/unit_1/bottleneck_v2/conv1/biases" not in names
    assert "resnet_v2_50/block1/unit_2/bottleneck_v2/shortcut/weights" not in names


def test_load_copies_every_weight_and_reports_training_bookkeeping(model, tf1_checkpoint,
                                                                   tf1_values):
    report = checkpoints.load_tf1_checkpoint(model, tf1_checkpoint)
    assert len(report.loaded) == NUM_MODEL_VARIABLES and report.excluded == []
    for name, value in model_values(model).items():
        assert np.array_equal(value, tf1_values[name]), name
    # Adam's two slots per trainable variable (174 of them) + step counter and Adam's powers.
    assert len(report.ignored) == 2 * 174 + 3
    assert {"Variable", "beta1_power", "beta2_power",
            "resnet_v2_50/conv1/weights/Adam", "Logits/fc/biases/Adam_1"} <= set(report.ignored)


def test_round_trip_tf1_to_modern_to_tf1_is_bit_exact(model, tf1_checkpoint, tf1_values, tmp_path):
    checkpoints.load_tf1_checkpoint(model, tf1_checkpoint)
    written = checkpoints.save_tf1_checkpoint(model, str(tmp_path / "tf1" / "model.ckpt"))
    reader = tf.train.load_checkpoint(written)
    names = {name for name, _ in tf.train.list_variables(written)}
    assert len(names) == NUM_MODEL_VARIABLES and names == set(checkpoints.tf1_variable_map(model))
    for name in names:
        assert np.array_equal(reader.get_tensor(name), tf1_values[name]), name


def test_saved_checkpoint_restores_with_a_tf1_saver(model, tmp_path):
    path = checkpoints.save_tf1_checkpoint(model, str(tmp_path / "model.ckpt"))
    expected = model.conv1.kernel.numpy()
    graph = tf.Graph()
    with graph.as_default():
        kernel = tf.compat.v1.get_variable("resnet_v2_50/conv1/weights", expected.shape)
        saver = tf.compat.v1.train.Saver([kernel])
        with tf.compat.v1.Session(graph=graph) as sess:
            saver.restore(sess, path)
            assert np.array_equal(sess.run(kernel), expected)


def test_exclude_logits_leaves_the_head_fresh(tf1_checkpoint, tf1_values):
    fresh = resnet_v2_50(num_classes=10)
    head = [fresh.fc.kernel.numpy(), fresh.fc.bias.numpy()]
    report = checkpoints.load_tf1_checkpoint(fresh, tf1_checkpoint, exclude_scopes=("Logits",))
    assert report.excluded == ["Logits/fc/biases", "Logits/fc/weights"]
    assert len(report.loaded) == NUM_MODEL_VARIABLES - 2
    assert np.array_equal(fresh.fc.kernel.numpy(), head[0])
    assert np.array_equal(fresh.fc.bias.numpy(), head[1])
    assert not np.array_equal(head[0], tf1_values["Logits/fc/weights"])
    assert np.array_equal(fresh.conv1.kernel.numpy(), tf1_values["resnet_v2_50/conv1/weights"])


def test_slims_published_layout_loads_with_its_imagenet_head_ignored(model, tf1_values, tmp_path):
    """Like resnet_v2_50.ckpt: a 1001-way `resnet_v2_50/logits` conv, `global_step`, no Logits/fc."""
    values = {n: v for n, v in tf1_values.items()
              if n.startswith("resnet_v2_50/") and "/Adam" not in n}
    values["resnet_v2_50/logits/weights"] = np.zeros([1, 1, 2048, 1001], np.float32)
    values["resnet_v2_50/logits/biases"] = np.zeros([1001], np.float32)
    values["global_step"] = np.int64(0)
    path = checkpoints.write_tf1_checkpoint(values, str(tmp_path / "resnet_v2_50.ckpt"))
    report = checkpoints.load_tf1_checkpoint(model, path, exclude_scopes=("Logits",))
    assert report.ignored == ["global_step", "resnet_v2_50/logits/biases",
                              "resnet_v2_50/logits/weights"]
    assert len(report.loaded) == NUM_MODEL_VARIABLES - 2


def test_mismatched_checkpoint_is_an_error_listing_the_names(model, tf1_values, tmp_path):
    values = {n: v for n, v in tf1_values.items() if "/Adam" not in n}
    renamed = "resnet_v2_50/block2/unit_3/bottleneck_v2/conv2/weights"
    values[renamed.replace("conv2", "conv_2")] = values.pop(renamed)
    reshaped = "resnet_v2_50/postnorm/gamma"
    values[reshaped] = np.ones([1024], np.float32)
    path = checkpoints.write_tf1_checkpoint(values, str(tmp_path / "bad.ckpt"))
    before = model_values(model)
    with pytest.raises(checkpoints.CheckpointMismatchError) as error:
        checkpoints.load_tf1_checkpoint(model, path)
    message = str(error.value)
    assert f"missing from the checkpoint (1): {renamed}" in message
    assert "unexpected in the checkpoint (1): " + renamed.replace("conv2", "conv_2") in message
    assert f"wrong shape (1): {reshaped}: checkpoint [1024] vs model [2048]" in message
    # Nothing was half-loaded.
    for name, value in model_values(model).items():
        assert np.array_equal(value, before[name]), name


def test_command_line_round_trip_through_a_modern_checkpoint(tf1_checkpoint, tf1_values, tmp_path,
                                                             capsys):
    modern = str(tmp_path / "modern")
    assert checkpoints.main(["tf1-to-modern", tf1_checkpoint, modern, "--report"]) == 0
    assert "ignored checkpoint entries (optimizer slots, counters, ImageNet head): 351" in \
        capsys.readouterr().out
    # Every weight is in the modern checkpoint (Keras 3 list attributes would not be).
    entries = [n for n, _ in tf.train.list_variables(modern)
               if n.startswith("model/") and n.endswith("VARIABLE_VALUE")]
    assert len(entries) == NUM_MODEL_VARIABLES
    back = str(tmp_path / "back" / "model.ckpt")
    assert checkpoints.main(["modern-to-tf1", modern, back]) == 0
    reader = tf.train.load_checkpoint(back)
    names = [name for name, _ in tf.train.list_variables(back)]
    assert len(names) == NUM_MODEL_VARIABLES  # an empty or partial checkpoint fails here
    for name in names:
        assert np.array_equal(reader.get_tensor(name), tf1_values[name]), name


def test_command_line_mismatch_exits_2_with_one_message(tmp_path):
    path = checkpoints.write_tf1_checkpoint({"foo/weights": np.zeros([3], np.float32)},
                                            str(tmp_path / "foo.ckpt"))
    result = run_program(["-m", "modern.checkpoints", "tf1-to-modern", path, tmp_path / "out"])
    assert result.returncode == 2
    assert "unexpected in the checkpoint (1): foo/weights" in result.stderr
    assert "missing from the checkpoint (272)" in result.stderr
    assert "Traceback" not in result.stderr
