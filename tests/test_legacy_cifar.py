"""legacy/cifar_resnet.py: the original's two-tower graph, its batch splits, restore, and a short run.

The slow graphs (ResNet-v2-50, two towers, slow to build) are built once for the module.  Tests of
the splits and the training loop, whose point is not the network, build it with one unit per block
(the program's --units_per_block 1 1 1 1: slim's resnet_v2 builder, the same scopes and names);
the README's main job (tests/test_readme.py) runs it at ResNet-v2-50's.
"""
import glob
import os
import re

import numpy as np
import pytest

import legacy  # noqa: F401  (tf-slim alias)
import tensorflow.compat.v1 as tf
import tf_slim as slim
from tf_slim import nets
from conftest import run_program
from legacy import cifar_resnet, towers
from records import cifar10



SMALL = (1, 1, 1, 1)  # units per block
SMALL_ARGV = ["--units_per_block", *map(str, SMALL)]


def _batch(rows, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.uniform(-1, 1, size=(rows, 32, 32, 3)).astype(np.float32)
    y = np.eye(10, dtype=np.int32)[rng.randint(0, 10, size=rows)]
    return x, y


class Built:
    """A graph, its namespace from build_graph and an initialised session.

    The graph is seeded, so `reset()` (re-running the initialisers) gives every test the same
    starting weights whatever ran before it: each test passes alone and in any order.
    """

    def __init__(self, **kwargs):
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.set_random_seed(0)
            self.g = cifar_resnet.build_graph(**kwargs)
            self.init = tf.global_variables_initializer()
            self.trainable = [v.op.name for v in tf.trainable_variables()]
            self.model_variables = [v.op.name for v in slim.get_model_variables()]
            self.global_variables = [v.op.name for v in tf.global_variables()]
            self.saver = tf.train.Saver()
            self.saver_restore = tf.train.Saver(var_list=self.g.variables_to_restore)
        config = cifar_resnet.session_config(kwargs.get("num_towers", 2))  # grappler off on CPU: fast first run
        self.sess = tf.Session(graph=self.graph, config=config)
        self.reset()

    def reset(self):
        self.sess.run(self.init)
        return self

    def run(self, fetches, feed):
        return self.sess.run(fetches, feed_dict=feed)


@pytest.fixture(scope="module")
def fix2_graph():
    built = Built(num_towers=2, split="fix")
    yield built
    built.sess.close()


@pytest.fixture
def fix2(fix2_graph):
    """The module's two-tower 'fix' graph, its variables re-initialised for each test."""
    return fix2_graph.reset()


@pytest.fixture(scope="module")
def weighted2():
    built = Built(num_towers=2, split="weighted", units_per_block=SMALL)
    yield built
    built.sess.close()


@pytest.fixture(scope="module")
def one_network():
    """The variables of ONE ResNet-v2-50 with the original's Logits head, built without towers."""
    with tf.Graph().as_default():
        x = tf.placeholder(tf.float32, [None, 32, 32, 3])
        with slim.arg_scope(nets.resnet_v2.resnet_arg_scope()):
            net, _ = nets.resnet_v2.resnet_v2_50(x, num_classes=None, is_training=True)
        with tf.variable_scope("Logits"):
            slim.fully_connected(tf.squeeze(net, axis=[1, 2]), num_outputs=10, activation_fn=None, scope="fc")
        return ([v.op.name for v in tf.trainable_variables()], [v.op.name for v in slim.get_model_variables()])


# ------------------------------------------------------------------------------------------------
# The original's structure
# ------------------------------------------------------------------------------------------------

def test_graph_has_one_tower_per_device_with_the_original_names(fix2):
    g = fix2.g
    assert len(g.tower_logits) == len(g.tower_losses) == len(g.tower_grads) == 2
    assert [t.device.lower()[-5:] for t in g.tower_logits] == ["cpu:0", "cpu:1"]
    assert g.current_batch_size.op.type == "Placeholder"
    assert g.labels.dtype == tf.int32 and g.labels.shape.as_list() == [None, 10]
    assert g.loss is g.tower_losses[-1]  # the original logs the LAST tower's loss
    assert g.tower_logits[0].op.name.startswith("Logits/fc/")
    assert g.tower_logits[1].op.name.startswith("Logits_1/fc/")


def test_towers_share_one_set_of_weights_whatever_their_number(one_network, fix2):
    trainable, model_variables = one_network
    assert fix2.trainable == trainable and fix2.model_variables == model_variables
    assert len(trainable) == 174  # ResNet-v2-50 (172) + Logits/fc weights and biases
    # Beyond the network: global_step, Adam's two beta powers and two slots per trainable variable.
    assert len(fix2.global_variables) == len(model_variables) + 1 + 2 + 2 * len(trainable)
    # Each tower differentiates the same variables.
    assert [v.op.name for _, v in fix2.g.tower_grads[0]] == [v.op.name for _, v in fix2.g.tower_grads[1]]


def test_exclusion_list_leaves_out_exactly_the_logits_scope(fix2):
    restored = {v.op.name for v in fix2.g.variables_to_restore}
    left_out = set(fix2.model_variables) - restored
    assert left_out == {"Logits/fc/weights", "Logits/fc/biases"}
    assert all(name.startswith("resnet_v2_50/") for name in restored)
    assert len(restored) == 270  # weights, biases and batch-norm beta/gamma/moving statistics


def test_batch_norm_updates_of_both_towers_hit_the_same_moving_variables(fix2):
    updates = fix2.g.update_ops
    moving = {v for v in fix2.global_variables if "moving_" in v}
    assert len(moving) == 98 and len(updates) == 2 * 98


# ------------------------------------------------------------------------------------------------
# Batch splits: the fix, the static bug, the weighted deviation
# ------------------------------------------------------------------------------------------------

def test_split_rows_counts_what_each_split_drops():
    fix = towers.split_rows(9, 2, "fix")
    assert (fix.sizes, fix.starts, fix.dropped, fix.empty) == ([4, 4], [0, 4], 1, [])
    tiny = towers.split_rows(1, 2, "fix")
    assert (tiny.sizes, tiny.dropped, tiny.empty) == ([0, 0], 1, [0, 1])
    static = towers.split_rows(3, 2, "static", static_batch_size=4)
    assert (static.sizes, static.dropped, static.empty) == ([3, 0], 0, [1])
    weighted = towers.split_rows(5, 2, "weighted")
    assert (weighted.sizes, weighted.starts, weighted.weights, weighted.dropped) == ([3, 2], [0, 3], [0.6, 0.4], 0)
    padded = towers.split_rows(1, 3, "weighted")
    assert (padded.sizes, padded.weights, padded.dropped, padded.padded) == ([1, 1, 1], [1.0, 0.0, 0.0], 0, [1, 2])


def test_embedded_profile_ends_each_epoch_on_a_batch_that_shows_both_split_stories():
    """997 rows in batches of 16 end on 5: the fix drops one row, the static split empties tower 1.

    The original's own numbers (50000 rows, batch 256) end on 80 rows: the fix loses nothing
    there, and the static split gives towers [80, 0].
    """
    batch = cifar10.EMBEDDED_PROFILE["batch_size"]
    last = cifar10.SYNTHETIC_TRAIN % batch
    assert last == 5 and -(-cifar10.SYNTHETIC_TRAIN // batch) * cifar10.EMBEDDED_PROFILE["epochs"] == 504
    fix = towers.split_rows(last, 2, "fix")
    assert (fix.sizes, fix.dropped, fix.empty) == ([2, 2], 1, [])
    static = towers.split_rows(last, 2, "static", static_batch_size=batch // 2)
    assert (static.sizes, static.dropped, static.empty) == ([5, 0], 0, [1])
    original = towers.split_rows(50000 % 256, 2, "static", static_batch_size=256 // 2)
    assert (original.sizes, original.empty) == ([80, 0], [1])


def test_fix_split_with_fewer_rows_than_towers_is_logged_and_skipped():
    note = cifar_resnet.describe_split(9, towers.split_rows(1, 2, "fix"), "fix")
    assert note == ("step 9 (train): batch of 1 rows over 2 towers: fewer rows than towers, current_batch_size "
                    "= 1 // 2 = 0, every tower empty, all 1 rows dropped. The original would run this step on "
                    "empty towers (NaN loss, NaN batch-norm statistics); the port skips it")


def test_static_split_with_fewer_rows_than_towers_is_a_clear_error():
    with pytest.raises(towers.SplitError, match="smaller than the 2 towers"):
        towers.split_rows(1, 2, "static", static_batch_size=4)


def test_fix_feeds_rows_over_towers_and_counts_the_dropped_row(fix2):
    x, y = _batch(7)
    feed, dropped = cifar_resnet.make_feed(fix2.g, x, y, True, 0.6)
    assert feed[fix2.g.current_batch_size] == 3 and dropped == 1
    feed, dropped = cifar_resnet.make_feed(fix2.g, x, y, True, 0.6, split="static", static_batch_size=4)
    assert feed[fix2.g.current_batch_size] == 4 and dropped == 0


def test_short_last_batch_stays_finite_with_the_fix(fix2):
    x, y = _batch(5)  # a short, odd last batch: 2 rows per tower, 1 dropped
    feed, dropped = cifar_resnet.make_feed(fix2.g, x, y, True, 0.6)
    _, losses, acc = fix2.run([fix2.g.train_step, fix2.g.tower_losses, fix2.g.accuracy], feed)
    assert dropped == 1
    assert np.all(np.isfinite(losses)) and acc in (0.0, 0.5, 1.0)


def test_short_last_batch_empties_the_last_tower_under_static(fix2):
    x, y = _batch(3)  # constant current_batch_size 4: tower 0 gets rows 0..2, tower 1 gets nothing
    feed, dropped = cifar_resnet.make_feed(fix2.g, x, y, True, 1.0, split="static", static_batch_size=4)
    assert dropped == 0
    assert np.isfinite(fix2.run(fix2.g.tower_losses[0], feed))
    # The empty tower: NaN (mean over 0 rows) on GPUs and Eigen CPU kernels; this CPU build's oneDNN
    # Conv2D returns a wrongly shaped empty tensor instead and the next op raises.  Either way: broken.
    try:
        value = fix2.run(fix2.g.tower_losses[1], feed)
    except tf.errors.InvalidArgumentError as error:
        assert "resnet_v2_50_1/" in str(error)  # fails inside tower 1's network
    else:
        assert np.isnan(value)


def test_weighted_split_loses_no_row_and_gives_the_full_batch_gradient(weighted2):
    g = weighted2.g
    x, y = _batch(5)
    feed, dropped = cifar_resnet.make_feed(g, x, y, False, 1.0)
    assert dropped == 0 and feed[g.tower_sizes] == [3, 2] and feed[g.tower_weights] == [0.6, 0.4]
    grads = [gr for gr, _ in g.grads]
    split_grads, split_loss = weighted2.run([grads, g.total_loss], feed)
    # The same graph with tower 0 on all 5 rows (weight 1) and tower 1 ignored (weight 0):
    # the full-batch, single-tower gradient.  Inference-mode batch norm (is_training False), so
    # both computations normalise with the same statistics.
    full = dict(feed)
    full.update({g.tower_starts: [0, 0], g.tower_sizes: [5, 5], g.tower_weights: [1.0, 0.0]})
    full_grads, full_loss = weighted2.run([grads, g.total_loss], full)
    np.testing.assert_allclose(split_loss, full_loss, rtol=1e-5)
    worst = max(np.abs(a - b).max() / (np.abs(b).max() + 1e-12) for a, b in zip(split_grads, full_grads))
    assert worst < 1e-4, worst
    # ... whereas the original's unweighted mean over towers of 3 and 2 rows is not that gradient.
    plain = [0.5 * (a + b) for a, b in zip(*weighted2.run([[gr for gr, _ in t] for t in g.tower_grads], feed))]
    fc = [i for i, (_, v) in enumerate(g.grads) if v.op.name == "Logits/fc/weights"][0]
    assert np.abs(plain[fc] - full_grads[fc]).max() > 1e-3 * np.abs(full_grads[fc]).max()


def test_dropout_noise_can_be_fed_to_impose_a_mask(fix2):
    g = fix2.g
    x, y = _batch(4)
    feed, _ = cifar_resnet.make_feed(g, x, y, False, 0.5)
    noise = np.tile((np.arange(2048) % 2).astype(np.float32), (2, 1))  # keep odd units (noise 1 >= 0.5)
    feed[g.dropout_noise[0]] = noise
    features, logits = fix2.run([g.pre_dropout[0], g.tower_logits[0]], feed)
    w, b = _value(fix2, "Logits/fc/weights"), _value(fix2, "Logits/fc/biases")
    np.testing.assert_allclose(logits, (features * noise / 0.5) @ w + b, rtol=1e-4, atol=1e-4)


def test_nan_loss_stops_training_naming_step_and_tower_except_under_static():
    cut = towers.split_rows(8, 2, "fix")
    with pytest.raises(cifar_resnet.UsageError, match=r"step 7 on tower 1"):
        cifar_resnet.check_finite([0.5, float("nan")], 7, "fix", cut)
    cifar_resnet.check_finite([0.5, float("nan")], 7, "static", cut)  # reported, not raised


# ------------------------------------------------------------------------------------------------
# Restore all but Logits
# ------------------------------------------------------------------------------------------------

def _value(built, name):
    with built.graph.as_default():
        variable = [v for v in tf.global_variables() if v.op.name == name][0]
    return built.sess.run(variable)


def test_restore_excludes_logits(fix2, tmp_path):
    with fix2.graph.as_default():
        path = fix2.saver.save(fix2.sess, str(tmp_path / "pretrained.ckpt"))
    saved_conv, saved_fc = _value(fix2, "resnet_v2_50/conv1/weights"), _value(fix2, "Logits/fc/weights")
    fix2.sess.run(fix2.init)  # fresh random weights everywhere
    fresh_fc = _value(fix2, "Logits/fc/weights")
    assert cifar_resnet.restore_pretrained(fix2.sess, fix2.saver_restore, path, fix2.g.variables_to_restore)
    np.testing.assert_array_equal(_value(fix2, "resnet_v2_50/conv1/weights"), saved_conv)
    np.testing.assert_array_equal(_value(fix2, "Logits/fc/weights"), fresh_fc)
    assert not np.array_equal(fresh_fc, saved_fc)


def test_restore_from_a_mismatched_checkpoint_names_the_variables(fix2, tmp_path):
    with tf.Graph().as_default(), tf.Session() as sess:
        tf.Variable(tf.zeros([3, 3, 3, 64]), name="resnet_v2_50/conv1/weights")
        sess.run(tf.global_variables_initializer())
        path = tf.train.Saver().save(sess, str(tmp_path / "wrong.ckpt"))
    with pytest.raises(cifar_resnet.UsageError) as error:
        cifar_resnet.restore_pretrained(fix2.sess, fix2.saver_restore, path, fix2.g.variables_to_restore)
    message = str(error.value)
    assert "resnet_v2_50/conv1/weights (graph [7, 7, 3, 64], checkpoint [3, 3, 3, 64])" in message
    assert "269 variables missing from it: " in message and "... (261 more)" in message


def test_missing_default_checkpoint_means_training_from_scratch(fix2, capsys):
    assert not cifar_resnet.restore_pretrained(fix2.sess, fix2.saver_restore, "/nonexistent/resnet_v2_50.ckpt",
                                               fix2.g.variables_to_restore, explicit=False)
    assert "training from scratch" in capsys.readouterr().out
    with pytest.raises(cifar_resnet.UsageError, match="not found"):
        cifar_resnet.restore_pretrained(fix2.sess, fix2.saver_restore, "/nonexistent/resnet_v2_50.ckpt",
                                        fix2.g.variables_to_restore, explicit=True)


# ------------------------------------------------------------------------------------------------
# The program end to end
# ------------------------------------------------------------------------------------------------

@pytest.fixture
def small_embedded_set(tmp_path, monkeypatch):
    """The embedded default, made by the same generator but smaller: 21 = 16 + 5 training rows
    (every epoch ends on the embedded set's 5-row batch at step 2) and 51 = 50 + 1 validation rows."""
    monkeypatch.setattr(cifar10, "SYNTHETIC_TRAIN", 21)
    monkeypatch.setattr(cifar10, "SYNTHETIC_VALID", 51)
    monkeypatch.setattr(cifar_resnet, "EMBEDDED_DATA_DIR", str(tmp_path / "embedded"))
    return ["--model_dir", str(tmp_path / "models"), "--log_dir", str(tmp_path / "logs")]


EMBEDDED_LOG = ("settings: the embedded default profile; differs from the original in: batch_size 16 (original "
                "256), valid_batch_size 50 (original 256), epochs 8 (original 200)")


def test_embedded_run_drops_one_row_of_the_short_last_batch_and_saves_the_best_model(small_embedded_set,
                                                                                     tmp_path, capsys):
    """`python legacy/cifar_resnet.py`: the README's default demo, on a smaller embedded set, in-process."""
    code = cifar_resnet.main(["--max_steps", "2", "--valid_every", "1", "--log_every", "1", *SMALL_ARGV,
                              *small_embedded_set])
    out, err = capsys.readouterr()
    assert code == 0, out[-2000:] + err[-2000:]
    assert EMBEDDED_LOG in out and "records: 21 train, 51 valid" in out
    assert "Step: 1,Train_Acc:" in out and "Examples/sec:" in out
    assert re.search(r"Step: 2,Train_Acc: [\d.]+,Loss: [\d.]+,Examples/sec: [\d.]+ \[step 2/2, ETA 0s\]", out)
    # The README: "the fix ... drops the remainder of a batch whose rows are not a multiple of the
    # tower count ... the log counts the dropped rows".
    assert "step 2 (train): batch of 5 rows over 2 towers: current_batch_size = 5 // 2 = 2, 1 row dropped" in out
    assert "rows dropped by the split: 1" in out
    # A validation batch of 1 row (fewer than towers) leaves every tower empty: skipped, counted.
    assert out.count("(valid): the split dropped 1 validation rows") == 2
    # Best-model saving: a checkpoint exactly at each validation that beat the best so far.
    best, saved = 0.0, []
    for step, acc in enumerate(map(float, re.findall(r"Valid_Acc: ([\d.]+),", out)), start=1):
        if acc > best:
            best, saved = acc, saved + [step]
    assert out.count("Model saved successfully") == len(saved)
    assert out.count("Val_acc stay with val_acc") == 2 - len(saved)
    ckpts = sorted(os.path.basename(p)[:-len(".index")] for p in glob.glob(str(tmp_path / "models" / "*.index")))
    assert ckpts == sorted({f"train-model.ckpt-{step}" for step in saved + [2]})
    # The tags the modern program writes too (tests/test_modern_cifar.py), so TensorBoard overlays the runs.
    for sub, steps in (("train", {1, 2}), ("valid", {1, 2})):
        events = glob.glob(str(tmp_path / "logs" / sub / "events.out.tfevents.*"))
        tags = {(e.step, v.tag) for path in events for e in tf.train.summary_iterator(path) for v in e.summary.value}
        assert tags == {(step, tag) for step in steps for tag in ("lr", "accuracy", "loss")}, (sub, tags)


def test_embedded_static_split_empties_tower_1_on_the_short_last_batch(small_embedded_set, capsys):
    """`python legacy/cifar_resnet.py --split=static`: the README's demo of the original's bug, in-process.

    Tower 1 gets no row of the 5-row batch; on this CPU build oneDNN raises instead of the original's
    NaN (both are reported, the step is not applied, and training goes on); on GPUs it is NaN.
    """
    code = cifar_resnet.main(["--split", "static", "--max_steps", "2", "--valid_every", "100",
                              "--log_every", "1", *SMALL_ARGV, *small_embedded_set])
    out, err = capsys.readouterr()
    assert code == 0, out[-2000:] + err[-2000:]
    assert EMBEDDED_LOG in out
    assert ("step 2 (train): batch of 5 rows over 2 towers: --split=static gives towers [5, 0] rows (constant "
            "current_batch_size 8), 0 dropped; towers [1] EMPTY: the original's bug, expect loss NaN") in out
    onednn = "step 2: towers [1] got no rows: this CPU build's oneDNN Conv2D mishandles an empty batch" in out
    nan = "step 2: loss NaN on towers [1]" in out and "Loss: nan" in out
    assert onednn != nan, out[-2000:]
    assert "Ended......" in out


def test_data_dir_means_the_originals_defaults(tmp_path, capsys):
    args = cifar_resnet.parse_args(["--data_dir", str(tmp_path)])
    train, test = cifar_resnet.resolve_data(args)
    assert (args.batch_size, args.valid_batch_size, args.epochs) == (256, 256, 200)
    assert (args.split, args.num_towers, args.keep_prob, args.boundaries) == ("fix", 2, 0.6, [10000, 25000])
    assert train == [str(tmp_path / "train.tfrecords")] and test == [str(tmp_path / "test.tfrecords")]
    out = capsys.readouterr().out
    assert "settings: the original's" in out and "differs" not in out


def test_static_split_run_reports_the_expected_nan(tmp_path, monkeypatch):
    # Eigen kernels (oneDNN off) behave as the original's GPUs: the empty tower's loss is NaN.
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    cifar10.make_synthetic(str(tmp_path / "data"), num_train=11, num_valid=4, seed=6)
    result = run_program(["legacy/cifar_resnet.py", "--data_dir", tmp_path / "data", "--split", "static",
                          "--batch_size", 8, "--valid_batch_size", 4, "--max_steps", 3, "--valid_every", 100,
                          "--log_every", 1, "--model_dir", tmp_path / "models", "--log_dir", tmp_path / "logs",
                          *SMALL_ARGV])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stdout
    # 11 rows in batches of 8: the second has 3 rows; constant current_batch_size 4 gives towers [3, 0].
    assert "--split=static gives towers [3, 0] rows (constant current_batch_size 4)" in out
    assert "step 2: loss NaN on towers [1]" in out and "the expected NaN" in out
    assert "Step: 2,Train_Acc: " in out and "Loss: nan" in out
    # What the NaN leaves behind (the README's words): the empty tower's gradient is a sum over no rows,
    # 0, so the weights stay finite and step 3 trains normally; but its batch norms average over no
    # rows and write NaN into every moving mean and variance, which validation normalises with.
    assert re.search(r"Step: 3,Train_Acc: [\d.]+,Loss: \d", out) and "step 3: loss NaN" not in out
    values = tf.train.load_checkpoint(str(tmp_path / "models" / "train-model.ckpt-3"))
    names = [name for name, _ in tf.train.list_variables(str(tmp_path / "models" / "train-model.ckpt-3"))]
    moving = [n for n in names if "moving_" in n]
    weights = [n for n in names if n.endswith("/weights")]
    # One unit per block: 13 batch norms (26 moving statistics), 18 weight tensors.
    assert len(moving) == 26 and all(np.isnan(values.get_tensor(n)).all() for n in moving)
    assert len(weights) == 18 and all(np.isfinite(values.get_tensor(n)).all() for n in weights)


def test_bad_input_is_a_one_paragraph_error_before_any_graph(tmp_path, capsys):
    data = tmp_path / "data"
    cifar10.make_synthetic(str(data), num_train=4, num_valid=4, seed=7)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert cifar_resnet.main(["--data_dir", str(data), "--model_dir", str(blocker / "models")]) == 2
    assert f"the folder {blocker / 'models'} is not writable" in capsys.readouterr().err
    (data / "test.tfrecords").write_bytes(b"garbage" * 10)
    assert cifar_resnet.main(["--data_dir", str(data), "--model_dir", str(tmp_path / "m")]) == 2
    assert f"TFRecord file {data / 'test.tfrecords'} is truncated or corrupt" in capsys.readouterr().err
    assert cifar_resnet.main(["--data_dir", str(tmp_path / "nowhere")]) == 2
    assert "TFRecord file not found: " + str(tmp_path / "nowhere" / "train.tfrecords") in capsys.readouterr().err
