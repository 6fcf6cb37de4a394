"""Two programs judged with no adapter (compare/pairs/captured.py, compare/port_capture.py): the TF1
program and its port both run unmodified to their first training step and are captured there.

  * examples/split_towers (absl flags, queue runners, a custom loop with strategy.run in a tf.function):
    the same statuses as through its adapter, and a mistake planted in a copy of the port's file FAILs
    the same checks as the same mistake planted through the adapter;
  * tf1_programs/fed_towers (placeholders fed from numpy, argparse) against a port trained with
    model.fit (Keras' own step, the dataset fit was given) and one with a custom loop that cuts its
    rows itself: each captured and judged, a planted mistake in each FAILs;
  * each way a capture cannot be made is one line, exit status 2, before any check.
"""
import dataclasses
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from compare import harness
from compare.capture import CaptureError
from compare.pairs.captured import program_pair
from compare.port_capture import PortCaptureError, capture_port
from conftest import ROOT
from examples.split_towers import adapter

SETTINGS = harness.Settings(towers=2, steps=2, free_steps=4, quick=True)
SPLIT = ROOT / "examples" / "split_towers"
FED = ROOT / "tests" / "tf1_programs" / "fed_towers"


def statuses(results):
    return {r.check: r.status for r in results}


def failed(results):
    return sorted(r.check for r in results if r.status in ("FAIL", "ERROR"))


def split_argv(tmp_path):
    data = adapter.Data().write(str(tmp_path / "data"), 2, 0)
    return ["--data_dir", os.path.dirname(data["train"]), "--train_dir", str(tmp_path / "train"),
            "--batch_size", "16", "--num_preprocess_threads", "1", "--min_after_dequeue", "40"]


def judged(legacy, modern, argv, tmp_path, settings=SETTINGS):
    pair = program_pair(str(legacy), str(modern), argv)
    return harness.judge_pair(pair, settings, str(tmp_path / "judged"), log=lambda *_: None)


def planted(tmp_path, source, old, new):
    """A copy of the program `source` with `old` replaced by `new` (once, and it must be there)."""
    text = source.read_text()
    assert text.count(old) == 1, old
    path = tmp_path / source.name
    path.write_text(text.replace(old, new))
    return path


def test_split_towers_with_no_adapter_gives_its_adapters_statuses(tmp_path):
    through_adapter = statuses(harness.judge_pair(adapter.PAIR, SETTINGS, str(tmp_path / "adapter"),
                                                  log=lambda *_: None))
    captured = judged(SPLIT / "train_tf1.py", SPLIT / "modern_train.py", split_argv(tmp_path), tmp_path)
    assert statuses(captured) == through_adapter
    assert failed(captured) == []
    by_check = {r.check: r for r in captured}
    # The pipelines are both programs' own: the legacy queue read in the harness's session, the port's
    # dataset as it gave it to experimental_distribute_dataset.
    assert by_check["input pipelines"].status == "PASS"
    assert "queue runners started and stopped by the harness" in by_check["input pipelines"].note
    assert "as the optimizer's update received them" in by_check["gradients (read out of the train step)"].note


def test_a_mistake_planted_in_the_ports_file_fails_the_checks_it_fails_through_the_adapter(tmp_path):
    """The port's cross-entropy without its label smoothing (tests/test_capture.py plants the same
    mistake through the adapter, and the same two checks FAIL there)."""
    port = planted(tmp_path, SPLIT / "modern_train.py", "from_logits=True, label_smoothing=label_smoothing)",
                   "from_logits=True, label_smoothing=0.0)")
    results = judged(SPLIT / "train_tf1.py", port, split_argv(tmp_path), tmp_path,
                     dataclasses.replace(SETTINGS, only=("training",)))
    assert failed(results) == ["forward (training, same dropout masks)", "gradients (read out of the train step)"]


def test_the_tutorial_with_its_random_crops_is_judged_on_the_legacy_pipelines_rows(tmp_path):
    """examples/cifar10_tutorial as a user runs it, distortions on (random crops, flips, colour): the
    pipelines cannot be compared row for row, and say why; every other check judges the rows the TF1
    program's own pipeline gave, and passes."""
    from examples.cifar10_tutorial import cifar10_input
    folder = tmp_path / "cifar"
    folder.mkdir()
    rng = np.random.RandomState(0)
    for name in [*cifar10_input.TRAIN_FILES, cifar10_input.TEST_FILE]:
        cifar10_input.write_binary(str(folder / name), rng.randint(0, 256, (20, 32, 32, 3)).astype(np.uint8),
                                   rng.randint(0, 10, 20))
    tutorial = ROOT / "examples" / "cifar10_tutorial"
    results = judged(tutorial / "cifar10_multi_gpu_train.py", tutorial / "modern_train.py",
                     ["--data_dir", str(folder), "--batch_size", "8", "--train_dir", str(tmp_path / "train")], tmp_path)
    assert failed(results) == []
    by_check = {r.check: r for r in results}
    pipelines = by_check["input pipelines"]
    assert pipelines.status == "NOT APPLICABLE"
    assert "the legacy's input pipeline draws random numbers (RandomUniform, RandomUniformInt)" in pipelines.note
    assert by_check["moving average (unordered)"].status == "EXPECTED"
    assert by_check["gradients (read out of the train step)"].status == "PASS"


@pytest.fixture(scope="module")
def fed_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fed_data")
    rng = np.random.RandomState(0)
    np.savez(folder / "train.npz", images=rng.uniform(-1, 1, (96, 8, 8, 1)).astype(np.float32),
             labels=rng.randint(0, 10, 96).astype(np.int32))
    return ["--data_dir", str(folder), "--batch_size", "16", "--max_steps", "3"]


def test_a_port_trained_with_model_fit_is_captured_and_judged(tmp_path, fed_data):
    results = judged(FED / "train_tf1.py", FED / "fit_port.py", [*fed_data, "--train_dir", str(tmp_path)], tmp_path)
    assert failed(results) == []
    passed = {r.check for r in results if r.status == "PASS"}
    assert {"forward (inference)", "forward (training, same dropout masks)", "gradients (read out of the train step)",
            "split: short last batch", "2 training steps: loss and gradients",
            "2 training steps: optimizers side by side", "4 free-running steps (chaos floor)"} <= passed
    # The rows came from the TF1 program's own feed: its first step's 16 rows, 8 a tower.
    note = {r.check: r.note for r in results}["forward (training, same dropout masks)"]
    assert "rows per replica [8, 8]" in note


def test_a_mistake_planted_in_a_model_fit_port_fails(tmp_path, fed_data):
    port = planted(tmp_path, FED / "fit_port.py", 'activation="relu"', 'activation="tanh"')
    results = judged(FED / "train_tf1.py", port, [*fed_data, "--train_dir", str(tmp_path)], tmp_path,
                     dataclasses.replace(SETTINGS, only=("basics", "forward", "training")))
    assert {"forward (inference)", "forward (training, same dropout masks)",
            "gradients (read out of the train step)"} <= set(failed(results))


SEED = [ROOT / "legacy" / "cifar_resnet.py", ROOT / "modern" / "cifar_resnet.py"]


def seed_argv(tmp_path):
    """The seed pair at one unit per block, on the embedded data, writing nothing outside tmp_path."""
    return ["--batch_size", "8", "--units_per_block", "1", "1", "1", "1", "--model_dir", str(tmp_path / "models"),
            "--log_dir", str(tmp_path / "logs")]


def test_the_seeds_towers_sliced_by_a_fed_size_and_its_inference_feed_are_found(tmp_path):
    """The original's towers take inputs[i * current_batch_size:(i + 1) * current_batch_size], the size
    fed rows // towers; its validation feeds is_training False and keep_prob 1.  All of it is read
    from the graph and the first step's feed."""
    from compare.capture import CapturedLegacy
    from compare.interface import Batch, NotFed
    from compare.pairs.captured import first_tower_rows
    side = CapturedLegacy(str(SEED[0]), lambda towers, files: seed_argv(tmp_path), "--towers")
    built = side.build(side.parse_args([]), 2, {})
    assert [t.op.name for t in side.first_feed.sizes] == ["current_batch_size"]
    assert side.first_feed.notes == ["is_training False (True in training; the predicate of 494 tf.cond switches)",
                                   "keep_prob 1 (0.6 in training; 2 dropouts' rates 0)"]
    assert first_tower_rows(side, built) == 4
    rng = np.random.RandomState(0)
    batch = Batch(rng.uniform(-1, 1, (8, 32, 32, 3)).astype(np.float32), np.eye(10, dtype=np.int32)[:8])
    by_name = {}
    for training in (True, False):
        fed = built.feed(batch, training)
        assert [r.tolist() for r in fed.rows] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        by_name[training] = {t.op.name: v for t, v in fed.feed_dict.items() if np.ndim(v) == 0}
    assert by_name[True] == {"is_training": True, "keep_prob": 0.6, "current_batch_size": 4}
    assert by_name[False] == {"is_training": False, "keep_prob": 1.0, "current_batch_size": 4}
    assert [r.tolist() for r in built.feed(batch.take(slice(0, 6)), True).rows] == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(NotFed, match=r"cut by current_batch_size, which the program fed rows // towers"):
        built.feed(batch.take(slice(0, 7)), True)
    # --split=weighted feeds each tower's start and size: a rule the harness does not guess.
    weighted = CapturedLegacy(str(SEED[0]), lambda towers, files: [*seed_argv(tmp_path), "--split", "weighted"],
                              "--towers")
    with pytest.raises(CaptureError, match=r"cut by tower_starts, fed \[0, 4\] at the first step \(8 rows on 2 "
                                           r"towers\): the harness feeds a size rows // towers"):
        weighted.build(weighted.parse_args([]), 2, {})


def test_a_keras_epsilon_planted_in_the_seed_ports_file_fails_what_it_fails_through_the_adapter(tmp_path):
    """The seed pair with no adapter: the port's make_optimizer at Keras' default epsilon 1e-7 (TF1's
    Adam: 1e-8) FAILs the configuration and the optimizers side by side, naming the epsilon, as the
    same mistake does through the seed pair's adapter; every other check of those groups PASSes."""
    port = planted(tmp_path, SEED[1], "epsilon: float = 1e-8, fused", "epsilon: float = 1e-7, fused")
    results = judged(SEED[0], port, seed_argv(tmp_path), tmp_path, dataclasses.replace(SETTINGS,
                                                                                     only=("basics", "steps")))
    assert failed(results) == ["2 training steps: optimizers side by side",
                               "configuration (flags and what they build)"]
    by_check = {r.check: r for r in results}
    assert by_check["configuration (flags and what they build)"].worst.name == "optimizer epsilon"
    assert by_check["2 training steps: optimizers side by side"].diagnosis.cause.startswith(
        "likely cause [epsilon]: the port's update is the original's rule with epsilon 1e-07")


def test_a_custom_loop_port_dividing_by_a_fixed_global_batch_fails_the_short_last_batch(tmp_path, fed_data):
    """The port's own custom loop (strategy.run in a tf.function, rows it distributes itself) passes; the
    classic mistake of dividing the loss by the configured global batch, not the step's rows, FAILs
    exactly the short last batch."""
    argv = [*fed_data, "--train_dir", str(tmp_path)]
    correct = judged(FED / "train_tf1.py", FED / "loop_port.py", argv, tmp_path,
                     dataclasses.replace(SETTINGS, only=("forward", "training", "splits")))
    assert failed(correct) == []
    assert {r.check: r.status for r in correct}["split: short last batch"] == "PASS"
    fixed = planted(tmp_path, FED / "loop_port.py", "global_batch_size=rows)", "global_batch_size=args.batch_size)")
    results = judged(FED / "train_tf1.py", fixed, argv, tmp_path / "planted",
                     dataclasses.replace(SETTINGS, only=("forward", "training", "splits")))
    assert failed(results) == ["split: short last batch"]


def test_rows_a_port_cuts_its_own_way_are_given_it_only_in_batches_its_replicas_share_evenly(tmp_path, fed_data):
    """A port fed from its own experimental_distribute_dataset gets any batch, cut as the strategy cuts
    it; a port that cuts its rows itself gets only batches that divide evenly (its cut of the others
    is its own: NotFed, so those split checks say NOT APPLICABLE)."""
    from compare.interface import Batch, NotFed
    from compare.port_capture import CapturedPort
    rng = np.random.RandomState(0)
    batch = Batch(rng.uniform(-1, 1, (15, 8, 8, 1)).astype(np.float32), rng.randint(0, 10, 15).astype(np.int32))
    argv = [*fed_data, "--train_dir", str(tmp_path), "--num_gpus", "2"]
    fit = CapturedPort(str(FED / "fit_port.py"), "--num_gpus")
    element = fit.build(fit.parse_args(argv), None, {}).distribute(batch)
    assert [len(x) for x in fit.taken.strategy.experimental_local_results(element[0])] == [8, 7]
    loop = CapturedPort(str(FED / "loop_port.py"), "--num_gpus")
    built = loop.build(loop.parse_args(argv), None, {})
    with pytest.raises(NotFed, match=r"how it cuts 15 rows over 2 replicas is its own"):
        built.distribute(batch)
    even = built.distribute(batch.take(slice(0, 14)))
    assert [len(x) for x in loop.taken.strategy.experimental_local_results(even[0])] == [7, 7]


def test_the_parts_of_a_ports_element_are_told_apart_by_dtype_rank_and_the_models_outputs():
    import tensorflow as tf
    from compare.port_capture import parts_of
    spec = {"image": tf.TensorSpec([None, 32, 32, 3], tf.float32), "label": tf.TensorSpec([None], tf.int64)}
    assert [p.role for p in parts_of(spec, "step")] == ["x", "y"]
    flat_onehot = (tf.TensorSpec([None, 784], tf.float32), tf.TensorSpec([None, 10], tf.float32),
                   tf.TensorSpec([None], tf.float32))
    assert [p.role for p in parts_of(flat_onehot, "step", classes=10)] == ["x", "onehot", "weights"]
    with pytest.raises(PortCaptureError, match=r"2 parts of its element look like images"):
        parts_of(flat_onehot, "step")
    with pytest.raises(PortCaptureError, match=r"neither images, labels nor row weights"):
        parts_of((spec["image"], spec["label"], tf.TensorSpec([None, 4, 4], tf.int32)), "step")


def test_the_command_line_fails_a_mistake_planted_in_the_ports_own_file(tmp_path, fed_data):
    """`compare/run.py --legacy --modern` as a user types it, on a port whose hidden layer lost its relu:
    exit 1, the forward checks FAIL with the tensor named, no traceback."""
    port_file = planted(tmp_path, FED / "fit_port.py", 'activation="relu"', 'activation="tanh"')
    done = subprocess.run([sys.executable, str(ROOT / "compare" / "run.py"), "--legacy", str(FED / "train_tf1.py"),
                           "--modern", str(port_file), "--quick", "--only", "basics,forward,training", "--",
                           *fed_data, "--train_dir", str(tmp_path / "train")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-2000:]
    failing = [line for line in done.stdout.splitlines() if " FAIL " in line]
    assert any(line.startswith("forward (inference)") and "logits" in line for line in failing), failing
    assert any(line.startswith("forward (training, same dropout masks)") for line in failing), failing
    assert not any(line.startswith(("configuration", "variables")) for line in failing), failing


def port(tmp_path, body, name="port.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_a_ports_absl_flags_are_read_run_after_run(tmp_path):
    """absl flags, defined in the port and in a module of its folder: each run defines them afresh."""
    (tmp_path / "port_flags.py").write_text("from absl import flags\n"
                                            "flags.DEFINE_float('learning_rate', 0.1, 'rate')\n")
    path = port(tmp_path, """\
        from absl import app, flags
        import port_flags

        flags.DEFINE_integer("num_gpus", 1, "replicas")

        def main(argv):
            raise SystemExit(0)

        app.run(main)
        """)
    from compare.capture import parse_flags
    from compare.port_capture import port_environment
    for replicas in (3, 4):
        flags = parse_flags(path, ["--num_gpus", str(replicas), "--learning_rate", "0.5"], environment=port_environment)
        assert (flags.num_gpus, flags.learning_rate) == (replicas, 0.5)


def test_a_port_that_raises_before_its_first_step_is_one_line_quoting_its_last_frame(tmp_path):
    path = port(tmp_path, """\
        def main():
            raise ValueError("no train-*.tfrecord file in /nowhere")

        main()
        """)
    with pytest.raises(PortCaptureError) as raised:
        capture_port(path, [])
    message = str(raised.value)
    assert "\n" not in message
    assert "it raised ValueError at port.py:2 in main: raise ValueError(" in message
    assert "(no train-*.tfrecord file in /nowhere)" in message


def test_a_port_that_never_trains_or_runs_past_the_time_limit_is_one_line(tmp_path):
    ends = port(tmp_path, "print('nothing to train')\n", "ends.py")
    with pytest.raises(PortCaptureError, match=r"it ended with exit status 0 without calling strategy.run"):
        capture_port(ends, [])
    waits = port(tmp_path, "import time\nwhile True:\n    time.sleep(0.05)\n", "waits.py")
    with pytest.raises(PortCaptureError, match=r"it ran 1 s without calling strategy.run inside a tf.function"):
        capture_port(waits, [], seconds=1)


def test_a_step_that_takes_an_iterator_cannot_be_driven_and_says_so(tmp_path):
    path = port(tmp_path, """\
        import keras
        import tensorflow as tf

        strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
        with strategy.scope():
            model = keras.Sequential([keras.Input((4, 4)), keras.layers.Flatten(), keras.layers.Dense(3)])
            optimizer = keras.optimizers.SGD(0.1)
        dataset = tf.data.Dataset.from_tensors((tf.ones([2, 4, 4]), tf.zeros([2], tf.int32))).repeat()
        iterator = iter(strategy.experimental_distribute_dataset(dataset))

        @tf.function
        def train_step(iterator):
            def replica(x, y):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x)))
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                return loss
            return strategy.run(replica, args=next(iterator))

        train_step(iterator)
        """)
    from compare.port_capture import CapturedPort
    side = CapturedPort(path, "--num_gpus")
    with pytest.raises(PortCaptureError, match=r"takes an iterator, not an element"):
        side.build(side.parse_args([]), None, {})


def test_a_tf1_program_that_raises_before_its_first_step_quotes_its_last_frame(tmp_path):
    from compare.capture import capture
    path = port(tmp_path, """\
        import tensorflow as tf

        def build():
            return tf.placeholder(tf.float32, [None, 3]) + tf.constant([1.0, 2.0])

        build()
        """, "train_tf1.py")
    with pytest.raises(CaptureError) as raised:
        capture(path, [])
    assert "at train_tf1.py:4 in build: return tf.placeholder(" in str(raised.value)


def test_the_command_line_refuses_a_port_it_cannot_capture_with_exit_2_and_one_line(tmp_path):
    broken = port(tmp_path, """\
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("--num_gpus", type=int, default=1)
        p.add_argument("--data_dir")
        args = p.parse_args()
        raise FileNotFoundError(args.data_dir)
        """)
    rng = np.random.RandomState(0)
    np.savez(tmp_path / "train.npz", images=rng.uniform(-1, 1, (32, 8, 8, 1)).astype(np.float32),
             labels=rng.randint(0, 10, 32).astype(np.int32))
    done = subprocess.run([sys.executable, str(ROOT / "compare" / "run.py"), "--legacy", str(FED / "train_tf1.py"),
                           "--modern", broken, "--quick", "--", "--data_dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "it raised FileNotFoundError at port.py:6 in <module>" in errors[0], errors[0]
    assert " PASS" not in done.stdout
