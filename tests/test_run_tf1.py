"""legacy/run_tf1/: a user's TF1 tower program, unmodified, on TensorFlow 2.21.

Two programs run under the command in processes of their own: the book's MNIST multi-GPU example
as printed (`tf1_programs/book_mnist/`) and a classic queue-runner tower program written for these
tests (`tf1_programs/classic_towers/`, tf.contrib.slim, prefetch_queue, tf.app.flags).  Each runs
from a copy in a temporary folder, whose files are hashed before and after.  The rest runs in this
process: the report, bad input, the environment entered twice and left.
"""
import hashlib
import math
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, run_program

PROGRAMS = Path(__file__).resolve().parent / "tf1_programs"
RUNNER = ("-m", "legacy.run_tf1")  # the documented command, from the program's folder
DEVICE_LINE = ("run_tf1: no GPU for the towers the program places on /gpu:0../gpu:1: "
               "they run on virtual CPU devices /cpu:0../cpu:1")
STEP = re.compile(r"step (\d+), loss = (\S+) \(")


def folder_hashes(folder):
    """{relative path: sha256} of every file under `folder`."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def step_losses(stdout):
    """[(step, loss)] of the programs' 'step N, loss = X (' lines."""
    return [(int(step), float(loss)) for step, loss in STEP.findall(stdout)]


def classic_data(folder, records=200):
    """Two train_*.bin files of the classic program's format: 1 label byte (0..3), 8x8 image bytes,
    each class a bright quarter of the image over noise (learnable in a few steps)."""
    folder.mkdir()
    rng = np.random.RandomState(0)
    for f in range(2):
        labels = rng.randint(0, 4, records).astype(np.uint8)
        images = rng.randint(0, 60, (records, 64)).astype(np.uint8)
        for k in range(4):
            images[labels == k, k * 16:(k + 1) * 16] += 150
        (folder / f"train_{f}.bin").write_bytes(np.concatenate([labels[:, None], images], 1).tobytes())
    return folder


@pytest.fixture(scope="module")
def classic(tmp_path_factory):
    """A copy of the classic program and its data: (program path, data folder)."""
    root = tmp_path_factory.mktemp("classic")
    shutil.copytree(PROGRAMS / "classic_towers", root / "program")
    return root / "program" / "classic_train.py", classic_data(root / "data")


# ---------------------------------------------------------------------------------------------
# The two programs, unmodified, under the command
# ---------------------------------------------------------------------------------------------
def test_book_mnist_program_trains_unmodified_on_two_virtual_cpu_towers(tmp_path):
    from records import mnist
    shutil.copy(PROGRAMS / "book_mnist" / "mnist_multi_gpu_train.py", tmp_path)
    shutil.copy(ROOT / "legacy" / "mnist_inference.py", tmp_path)
    # 1000 steps + 99 summary runs each read a batch of 100; repeat(10) needs >= 10990 rows.
    images, labels = mnist.synthetic_arrays(11000, seed=0)
    mnist.write_tfrecords(tmp_path / "output.tfrecords", images, labels)
    before = folder_hashes(tmp_path)

    result = run_program([*RUNNER, "mnist_multi_gpu_train.py"], cwd=tmp_path)

    assert result.returncode == 0, result.stderr[-3000:]
    assert DEVICE_LINE in result.stderr.splitlines()
    losses = step_losses(result.stdout)
    assert [s for s, _ in losses] == list(range(10, 1000, 10))
    assert all(math.isfinite(loss) for _, loss in losses)
    first, last = np.mean([v for _, v in losses[:5]]), np.mean([v for _, v in losses[-20:]])
    assert last < first / 2, (first, last)
    assert (tmp_path / "logs_and_models" / "model.ckpt-999.index").is_file()
    after = folder_hashes(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("logs_and_models/")} == before


def test_classic_program_runs_its_towers_on_two_cpu_devices(classic, tmp_path):
    program, data = classic
    before = folder_hashes(program.parent)

    result = run_program([*RUNNER, program, "--num_gpus", "2", "--max_steps", "5", "--batch_size", "16",
                          "--data_dir", data, "--train_dir", tmp_path / "train", "--log_device_placement"])

    assert result.returncode == 0, result.stderr[-3000:]
    assert DEVICE_LINE in result.stderr.splitlines()
    losses = step_losses(result.stdout)
    assert [s for s, _ in losses] == [0, 1, 2, 3, 4] and all(math.isfinite(v) for _, v in losses)
    assert (tmp_path / "train" / "model.ckpt-5.index").is_file()
    # log_device_placement: where each op really ran ("name: (Type): /job:.../device:CPU:k")
    placed = re.findall(r"^(tower_\d)/\S+: \(\w+\): /job:localhost/replica:0/task:0/device:(CPU:\d)$",
                        result.stdout, re.M)
    conv = {t: d for t, d in re.findall(r"^(tower_\d)/conv1/Conv2D: \(Conv2D\): \S+/device:(CPU:\d)$",
                                        result.stdout, re.M)}
    assert conv == {"tower_0": "CPU:0", "tower_1": "CPU:1"}
    for tower, device in (("tower_0", "CPU:0"), ("tower_1", "CPU:1")):
        on_it = sum(1 for t, d in placed if t == tower and d == device)
        assert on_it > 0.9 * sum(1 for t, _ in placed if t == tower), tower  # (the queue's dequeue stays on CPU:0)
    assert folder_hashes(program.parent) == before


# ---------------------------------------------------------------------------------------------
# --report
# ---------------------------------------------------------------------------------------------
def test_report_lists_the_classic_programs_rewrites_contrib_homes_and_devices(classic):
    program, _ = classic
    result = run_program(["-m", "legacy.run_tf1", "--report", program])

    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    out = result.stdout
    assert "files: classic_train.py, classic_model.py" in out
    for file, line in (("classic_train.py", 15), ("classic_model.py", 5)):
        assert f"{file}:{line}  import tensorflow as tf  ->  import tensorflow.compat.v1 as tf" in out
    assert re.search(r"mapped  tf\.contrib\.slim\.prefetch_queue\.prefetch_queue -> "
                     r"tf_slim\.data\.prefetch_queue\.prefetch_queue  \(classic_train\.py:\d+\)", out)
    assert "mapped  tf.contrib.layers.l2_regularizer -> tf_slim.layers.l2_regularizer" in out
    assert "mapped  tf.contrib.slim -> tf_slim  (classic_model.py:7)" in out
    assert re.search(r"mapped  tf\.app\.flags\.DEFINE_integer  \(classic_train\.py:\d+ \+\d\)", out)
    assert "mapped  tf.train.shuffle_batch  (classic_model.py:" in out
    assert "classic_train.py:51 '/gpu:%d'" in out
    assert "this machine has no GPU: a tower on /gpu:N runs on the virtual CPU device /cpu:N" in out
    assert re.search(r"summary: \d+ names mapped, 0 cannot", out)


def test_a_program_laid_out_as_a_package_is_reported_whole_and_runs_unmodified():
    """Run from the folder above it, the program imports its own folder by the package's name (through
    the working directory): the report reads every module the run imports, and the run trains."""
    cwd = PROGRAMS / "package_layout"
    report = run_program(["-m", "legacy.run_tf1", "--report", "towers_pkg/train.py"], cwd=cwd)
    assert report.returncode == 0, report.stdout + report.stderr[-2000:]
    assert "files: train.py, model.py, nets/__init__.py, nets/dense.py" in report.stdout
    assert ("mapped  tf.contrib.nn.deprecated_flipped_softmax_cross_entropy_with_logits -> "
            "legacy.run_tf1.deprecated_flipped_softmax_cross_entropy_with_logits  (model.py:12)") in report.stdout
    assert "mapped  tf.contrib.layers.l2_regularizer -> tf_slim.layers.l2_regularizer  (model.py:11)" in report.stdout
    assert "nets/dense.py:2  import tensorflow as tf  ->  import tensorflow.compat.v1 as tf" in report.stdout
    assert "train.py:27 '/gpu:%d'" in report.stdout and re.search(r"summary: \d+ names mapped, 0 cannot", report.stdout)
    run = run_program(["-m", "legacy.run_tf1", "towers_pkg/train.py", "--num_gpus", "2"], cwd=cwd)
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"^trained 3 steps on 2 towers, loss \d", run.stdout, re.M)


NO_HOME = """\
import tensorflow as tf
from tensorflow.contrib import learn

slim = tf.contrib.slim
rotated = tf.contrib.image.rotate
config = tf.estimator.RunConfig()
tf.scalar_summary('loss', 1.0)
"""


def test_report_names_what_cannot_be_mapped_and_exits_1(tmp_path, capsys):
    from legacy import run_tf1
    program = tmp_path / "no_home.py"
    program.write_text(NO_HOME)

    status = run_tf1.main(["--report", str(program)])

    out = capsys.readouterr().out
    assert status == 1
    assert ("  cannot  tf.contrib.learn  (no_home.py:2): tf.contrib.learn has no maintained home on TF 2.21: "
            "port this part to tf.estimator by hand, which runs here") in out
    assert "  cannot  tf.contrib.image  (no_home.py:5): tf.contrib.image has no maintained home on TF 2.21" in out
    assert "(TensorFlow's upgrader: `tf.contrib.image.rotate` has been migrated to `tfa.image.rotate`" in out
    assert "  mapped  tf.estimator.RunConfig  (no_home.py:6)" in out  # tensorflow-estimator 2.15.0
    assert ("  cannot  tf.scalar_summary  (no_home.py:7): TF 2.21's tf.compat.v1 has no tf.scalar_summary: "
            "replace it by hand") in out
    assert "  mapped  tf.contrib.slim -> tf_slim  (no_home.py:4)" in out
    assert "summary: 2 names mapped, 3 cannot" in out
    assert "the program names no /gpu: device" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["no_home.py"]


# ---------------------------------------------------------------------------------------------
# Bad input: one line, the right exit status, nothing written
# ---------------------------------------------------------------------------------------------
PROGRAM_FAILURES = {
    "raises_in_main.py": ("import tensorflow as tf\n\ndef main(argv):\n    raise ValueError('bad value')\n\n"
                          "if __name__ == '__main__':\n    tf.app.run()\n"),
    "imports_broken.py": "import helper\n",
    "helper.py": "import tensorflow as tf\nx = 1 / 0\n",
    "imports_missing.py": "import no_such_module_xyz\n",
    "no_home_import.py": "from tensorflow.contrib import learn\n",
    "exits_3.py": "import sys\nsys.exit(3)\n",
    "app_run_ok.py": ("import tensorflow as tf\n\ndef main(argv):\n    print('argv', argv[1:])\n\n"
                      "if __name__ == '__main__':\n    tf.app.run()\n"),
}


@pytest.fixture
def failures(tmp_path):
    for name, text in PROGRAM_FAILURES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "syntax.py").write_text("def f(:\n")
    (tmp_path / "notes.txt").write_text("x\n")
    return tmp_path


@pytest.mark.parametrize("path, message", [
    ("missing.py", "run_tf1: {folder}/missing.py: no such file"),
    ("", "run_tf1: {folder} is a folder: give the program's .py file"),
    ("notes.txt", "run_tf1: {folder}/notes.txt is not a Python file (.py)"),
    ("syntax.py", "run_tf1: {folder}/syntax.py is not valid Python: invalid syntax (line 1)"),
])
def test_a_path_that_is_not_a_program_is_one_line_and_status_2(failures, capsys, path, message):
    from legacy import run_tf1
    before = folder_hashes(failures)
    status = run_tf1.main([str(failures / path) if path else str(failures)])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.err.splitlines() == [message.format(folder=failures)] and captured.out == ""
    assert folder_hashes(failures) == before


@pytest.mark.parametrize("program, status, traceback_end, runner_line", [
    ("raises_in_main.py", 1, "ValueError: bad value", "run_tf1: the program raised while running main (ValueError)"),
    ("imports_broken.py", 1, "ZeroDivisionError: division by zero",
     "run_tf1: the program raised while importing helper (ZeroDivisionError)"),
    ("imports_missing.py", 1, "ModuleNotFoundError: No module named 'no_such_module_xyz'",
     "run_tf1: the program raised while importing no_such_module_xyz (ModuleNotFoundError)"),
    ("no_home_import.py", 1, "legacy.run_tf1.ContribImportError: tf.contrib.learn has no maintained home on TF 2.21: "
     "port this part to tf.estimator by hand, which runs here (tensorflow-estimator 2.15.0): Experiment and "
     "learn_runner are tf.estimator.train_and_evaluate with a TrainSpec and an EvalSpec, contrib.learn's RunConfig "
     "and Estimators tf.estimator's",
     "run_tf1: the program raised while importing tensorflow.contrib.learn (ContribImportError)"),
    ("exits_3.py", 3, None, None),
])
def test_a_failing_program_gives_its_traceback_the_step_and_its_status(failures, capsys, program, status,
                                                                       traceback_end, runner_line):
    from legacy import run_tf1
    before = folder_hashes(failures)
    assert run_tf1.main([str(failures / program)]) == status
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith(("WARNING:", "W0", "Instructions", "non-res"))]
    if traceback_end:
        start = lines.index("Traceback (most recent call last):")
        assert lines[start + 1].startswith(f'  File "{failures / program}", line ')
        assert lines[-2:] == [traceback_end, runner_line]
        assert "run_tf1.py" not in err and "importlib._bootstrap" not in err  # the user's frames only
        assert "legacy/run_tf1/" not in err  # no frame of the runner's package
    else:
        assert lines == []
    assert folder_hashes(failures) == before


def test_a_program_that_fails_while_building_its_towers_still_says_where_they_would_run(tmp_path, capsys):
    """No session opened yet: the device line comes with the failure, before the runner's step line."""
    from legacy import run_tf1
    program = tmp_path / "fails_in_tower.py"
    program.write_text("import tensorflow as tf\nfor i in range(2):\n    with tf.device('/gpu:%d' % i):\n"
                       "        x = tf.constant(1.0)\nraise ValueError('the loss is undefined')\n")
    assert run_tf1.main(["--gpus", "0", str(program)]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[-3:] == ["ValueError: the loss is undefined",
                          "run_tf1: no GPU for the towers the program places on /gpu:0../gpu:1: they run on virtual "
                          "CPU devices /cpu:0../cpu:1",
                          "run_tf1: the program raised while running the program's top level (ValueError)"]


def test_tf_app_run_passes_the_programs_argv_and_exits_0(failures, capsys):
    from legacy import run_tf1
    assert run_tf1.main([str(failures / "app_run_ok.py"), "--foo", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "argv ['--foo', '1']"


# ---------------------------------------------------------------------------------------------
# The library: the environment entered several times in one process, then left
# ---------------------------------------------------------------------------------------------
def test_environment_twice_in_one_process_then_eager_and_keras_3_work(classic, tmp_path):
    import keras
    import tensorflow as tf
    from absl import flags
    from tensorflow.python.client import session
    from tensorflow.python.framework import ops

    from legacy import run_tf1
    program, data = classic
    originals = (ops.Graph.device, session.BaseSession.__init__, list(sys.meta_path), list(sys.path), sys.argv)
    argv = ["--num_gpus", "2", "--max_steps", "2", "--batch_size", "8", "--data_dir", str(data),
            "--train_dir", str(tmp_path / "train")]
    for _ in range(2):
        lines = []
        with run_tf1.tf1_environment(program, log=lines.append) as env:
            assert env.run_program(argv) == 0 and env.run_program(argv) == 0  # twice in one environment too
            assert lines == [DEVICE_LINE] and env.device_line == DEVICE_LINE and env.cpu_devices == 2
            assert tower_devices(env.graphs[-1]) == {"tower_0": {"/device:CPU:0"}, "tower_1": {"/device:CPU:1"}}
            assert env.loaded == ["classic_model"] and "classic_model" in sys.modules

    assert tf.executing_eagerly() and float(tf.reduce_sum(tf.ones([3]))) == 3.0
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    assert math.isfinite(model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0).history["loss"][0])
    assert not [m for m in sys.modules if m.startswith("tensorflow.contrib") or m == "classic_model"]
    assert not hasattr(tf.compat.v1, "contrib") and not hasattr(tf, "contrib")
    assert type(tf.compat.v1.nn.__dict__["rnn_cell"]).__name__ == "KerasLazyLoader"  # TensorFlow's own again
    assert (ops.Graph.device, session.BaseSession.__init__, sys.meta_path, sys.path, sys.argv) == originals
    assert "num_gpus" not in flags.FLAGS and "data_dir" not in flags.FLAGS


def test_environment_inside_a_graph_of_the_callers_gives_it_back_and_tf2_behaviour(classic, tmp_path):
    """As the parity harness enters it: inside a graph of its own, in a process where TF's implicit
    global graph exists already (any `tf.compat.v1.get_default_graph()` outside a graph makes it).
    Leaving keeps the caller's graph and turns TF2 behaviour back on, every time."""
    import tensorflow as tf

    from legacy import run_tf1
    program, data = classic
    argv = ["--num_gpus", "2", "--max_steps", "2", "--batch_size", "8", "--data_dir", str(data),
            "--train_dir", str(tmp_path / "train")]
    tf.compat.v1.get_default_graph()
    for _ in range(2):
        outer = tf.Graph()
        with outer.as_default():
            with run_tf1.tf1_environment(program, log=lambda _: None) as env:
                assert env.run_program(argv) == 0
            assert tf.compat.v1.get_default_graph() is outer
        assert tf.executing_eagerly()
    assert float(tf.reduce_sum(tf.ones([3]))) == 3.0

def tower_devices(graph):
    """{tower: the devices its ops asked for}."""
    devices = {}
    for op in graph.get_operations():
        if op.name.startswith("tower_") and "fifo_queue_Dequeue" not in op.name:
            devices.setdefault(op.name.split("/")[0], set()).add(op.device)
    return devices


CONTRIB_IMPORTS = """\
import tensorflow as tf
import tensorflow.contrib.slim as slim
from tensorflow.contrib import slim as slim_too, layers
from tensorflow.contrib.slim.nets import resnet_v2
from tensorflow.contrib.rnn import LSTMCell
import tf_slim

assert slim.arg_scope is slim_too.arg_scope is tf.contrib.framework.arg_scope is tf_slim.arg_scope
assert resnet_v2.resnet_v2_50 is tf_slim.nets.resnet_v2.resnet_v2_50
assert layers.l2_regularizer is tf_slim.l2_regularizer
assert tf.contrib.losses.softmax_cross_entropy is tf_slim.losses.softmax_cross_entropy  # logits first, as contrib
assert tf.contrib.data.TFRecordDataset is tf.data.TFRecordDataset  # tf.compat.v1's: make_one_shot_iterator
assert tf.contrib.rnn.LSTMCell is tf.nn.rnn_cell.LSTMCell and LSTMCell.__module__.startswith('tf_keras')
with tf.device('/cpu:0'):
    with tf.device('/device:GPU:3'):
        nested = tf.constant(1.0, name='nested')
    with tf.device(tf.DeviceSpec(device_type='GPU', device_index=2)):
        spec = tf.constant(1.0, name='spec')
    with tf.device(lambda op: '/gpu:1'):
        function = tf.constant(1.0, name='function')
print(nested.device, spec.device, function.device)
with tf.Session(config=tf.ConfigProto(allow_soft_placement=True)) as sess:
    print(sess._config.device_count['CPU'], sess._config.allow_soft_placement, sess.run(nested + spec + function))
try:
    tf.contrib.training.HParams
except AttributeError as error:
    print(error)
"""


@pytest.mark.parametrize("gpus, devices, cpus, log", [
    (None, "/device:CPU:3 /device:CPU:2 /device:CPU:1", 4,
     ["run_tf1: no GPU for the towers the program places on /gpu:1../gpu:3: "
      "they run on virtual CPU devices /cpu:1../cpu:3"]),
    # GPUs treated as present stay (soft placement runs them on the CPU); the ConfigProto is the program's own
    (4, "/device:GPU:3 /device:GPU:2 /device:GPU:1", 0, []),
])
def test_contrib_homes_import_forms_and_device_scopes(tmp_path, capsys, gpus, devices, cpus, log):
    from legacy import run_tf1
    program = tmp_path / "contrib_imports.py"
    program.write_text(CONTRIB_IMPORTS)
    lines = []
    with run_tf1.tf1_environment(program, log=lines.append, gpus=gpus) as env:
        assert env.run_program() == 0, capsys.readouterr().err[-2000:]
    out = capsys.readouterr().out.splitlines()
    assert out[-3:] == [
        devices,
        f"{cpus} True 3.0",
        "tf.contrib.training.HParams has no maintained home on TF 2.21: tf.contrib.training maps to "
        "tf_slim.training.training / tf_slim.training.evaluation, which lack it; replace it by hand"]
    assert lines == log


CONTRIB_EQUIVALENTS = """\
import numpy as np
import tensorflow as tf
from tensorflow.contrib.slim.python.slim.nets import resnet_v2
from tensorflow.contrib.slim.python.slim.data import tfexample_decoder
from tensorflow.contrib.layers.python import layers as tf_layers
import tf_slim

z = np.array([[2.0, 1.0, 0.1], [0.5, 2.5, 0.3]], np.float32)
y = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], np.float32)
logits, onehot = tf.constant(z), tf.constant(y)
flipped = tf.contrib.nn.deprecated_flipped_softmax_cross_entropy_with_logits(logits, onehot)
flipped_sparse = tf.contrib.nn.deprecated_flipped_sparse_softmax_cross_entropy_with_logits(logits, tf.constant([0, 2]))
flipped_sigmoid = tf.contrib.nn.deprecated_flipped_sigmoid_cross_entropy_with_logits(logits, onehot)
table = tf.contrib.lookup.HashTable(tf.contrib.lookup.KeyValueTensorInitializer(
    tf.constant(['a', 'b']), tf.constant([7, 9], tf.int64)), -1)
found = table.lookup(tf.constant(['b', 'a', 'z']))
names = tf.contrib.lookup.index_to_string_table_from_tensor(tf.constant(['x', 'y'])).lookup(
    tf.constant([1, 0, 5], tf.int64))
with tf.contrib.compiler.jit.experimental_jit_scope():
    doubled = logits * 2.0
with tf.Session() as sess:
    sess.run(tf.tables_initializer())
    xent, sparse, sigmoid, ids, words, twice = sess.run([flipped, flipped_sparse, flipped_sigmoid, found, names,
                                                         doubled])
log_p = z - np.log(np.exp(z).sum(1, keepdims=True))
np.testing.assert_allclose(xent, -(y * log_p).sum(1), rtol=1e-6)
np.testing.assert_allclose(sparse, -log_p[[0, 1], [0, 2]], rtol=1e-6)
np.testing.assert_allclose(sigmoid, np.maximum(z, 0) - z * y + np.log1p(np.exp(-abs(z))), rtol=1e-6)
assert ids.tolist() == [9, 7, -1] and words.tolist() == [b'y', b'x', b'UNK'] and twice.tolist() == (2 * z).tolist()
assert tf.contrib.util.constant_value(tf.constant(3)) == 3
assert tf.contrib.util.make_tensor_proto(np.ones(2)).tensor_shape.dim[0].size == 2
assert resnet_v2.resnet_v2_50 is tf_slim.nets.resnet_v2.resnet_v2_50
assert tfexample_decoder.TFExampleDecoder is tf_slim.tfexample_decoder.TFExampleDecoder
assert tf_layers.conv2d is tf_slim.layers.conv2d
from tensorflow.contrib.framework.python.ops import variables
from tensorflow.contrib.framework.python.framework import checkpoint_utils
from tensorflow.contrib.tpu.python.tpu import tpu_optimizer
assert variables.get_or_create_global_step is tf_slim.get_or_create_global_step
assert checkpoint_utils.load_variable is tf.train.load_variable
assert tf.contrib.tpu.CrossShardOptimizer is tf.tpu.CrossShardOptimizer is tpu_optimizer.CrossShardOptimizer
resolver = tf.contrib.cluster_resolver.python.training.TPUClusterResolver
assert resolver is tf.distribute.cluster_resolver.TPUClusterResolver
print('contrib equivalents agree')
try:
    tf.contrib.nn.alpha_dropout
except AttributeError as error:
    print(error)
"""


def test_contrib_names_with_an_exact_equivalent_map_and_return_its_values(tmp_path, capsys):
    """The tf.contrib names a tree of public TF1 programs uses that have an exact equivalent on TF 2.21:
    each run through its home and its values checked against a formula; a contrib.nn name without one
    is still one line."""
    from legacy import run_tf1
    program = tmp_path / "contrib_equivalents.py"
    program.write_text(CONTRIB_EQUIVALENTS)
    with run_tf1.tf1_environment(program, log=lambda _: None) as env:
        assert env.run_program() == 0, capsys.readouterr().err[-3000:]
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "contrib equivalents agree",
        "tf.contrib.nn.alpha_dropout has no maintained home on TF 2.21: tf.contrib.nn maps to legacy.run_tf1, "
        "which lacks it; replace it by hand"]


def test_device_map_keeps_present_gpus_and_maps_the_rest():
    from legacy.run_tf1 import DeviceMap, span, with_cpu_devices
    from tensorflow.core.protobuf import config_pb2
    devices = DeviceMap(gpus=1)
    assert devices.map("/gpu:0") == "/gpu:0" and devices.map("/cpu:0") == "/cpu:0" and devices.map(None) is None
    assert devices.map("/job:worker/task:1/device:GPU:1") == "/job:worker/task:1/device:CPU:1"
    assert devices.line() == ("run_tf1: only 1 GPU for the towers the program places on /gpu:1: "
                              "it runs on virtual CPU device /cpu:1")
    assert span("/gpu:", [0, 1, 2]) == "/gpu:0../gpu:2" and span("/gpu:", [0, 2]) == "/gpu:0, /gpu:2"
    config = config_pb2.ConfigProto(allow_soft_placement=True, log_device_placement=True)
    merged = with_cpu_devices(config, 3)
    assert merged.device_count["CPU"] == 3 and merged.allow_soft_placement and merged.log_device_placement
    assert "CPU" not in config.device_count  # the program's own ConfigProto is left as it was
    assert with_cpu_devices(config, 1) is config


def test_upgrader_rewrites_imports_in_memory_and_keeps_the_line_numbers():
    from legacy.run_tf1 import Rewrite, upgrade_source
    text = ("import tensorflow as tf\nfrom tensorflow.python.client import device_lib\n"
            "import tensorflow.contrib.slim as slim\nfrom tensorflow.keras import layers\n"
            "from tensorflow import flags\nx = tf.contrib.layers\n")
    upgrade = upgrade_source(text, "prog.py")
    lines = text.splitlines()
    assert upgrade.text.splitlines() == ["import tensorflow.compat.v1 as tf", *lines[1:4],
                                         "from tensorflow.compat.v1 import flags", lines[5]]
    assert [r.line for r in upgrade.rewrites] == [1, 5]
    assert upgrade.rewrites[0] == Rewrite(1, "import tensorflow as tf", "import tensorflow.compat.v1 as tf")
    book = (PROGRAMS / "book_mnist" / "mnist_multi_gpu_train.py").read_text(encoding="utf-8")
    assert upgrade_source(book, "book.py").text.count("\n") == book.count("\n")
