"""Programs as they are, judged without a false verdict (tf1_programs/step_flags, tf1_programs/fed_towers):

  * a port that applies its weight decay and label smoothing in its train step's loss, not in its
    model, with an unseeded dropout: the flags check sees both flags move both programs' steps (loss
    and gradients from the same state, rows and dropout masks) and PASSes them, the structure check
    leaves the step's regulariser to the step, and no check FAILs; the same port planted to ignore
    both flags in its step FAILs the flags check naming them, with the steps' numbers;
  * a tower that takes its rows with tf.gather is refused in one line naming the op;
  * a model_deploy-style program (each tower's loss divided by the towers, weight 1, gradients
    summed) is judged by the towers' shares of the step, not their weights as row fractions.
"""
import numpy as np
import pytest

from compare import harness
from compare.capture import CaptureError
from compare.pairs.captured import program_pair
from conftest import ROOT

STEP_FLAGS = ROOT / "tests" / "tf1_programs" / "step_flags"
FED = ROOT / "tests" / "tf1_programs" / "fed_towers"
LOOP = ("batch_size", "max_steps")  # the harness feeds its own rows: the batch size moves neither program
FULL = harness.Settings(towers=2, steps=2, free_steps=4, quick=False)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("step_flags_data")
    rng = np.random.RandomState(0)
    np.savez(folder / "train.npz", images=rng.uniform(-1, 1, (96, 8, 8, 1)).astype(np.float32),
             labels=rng.randint(0, 10, 96).astype(np.int32))
    return ["--data_dir", str(folder), "--batch_size", "16", "--max_steps", "3"]


def judged(legacy, modern, argv, tmp_path, settings, loop=()):
    pair = program_pair(str(legacy), str(modern), argv, loop=loop)
    return {r.check: r for r in harness.judge_pair(pair, settings, str(tmp_path / "judged"), log=lambda *_: None)}


def planted(tmp_path, source, *replacements):
    text = source.read_text()
    for old, new in replacements:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / source.name
    path.write_text(text)
    return path


def test_flags_a_port_reads_only_in_its_step_pass_through_the_step_and_nothing_fails(tmp_path, data):
    results = judged(STEP_FLAGS / "train_tf1.py", STEP_FLAGS / "port.py", data, tmp_path, FULL, LOOP)
    failing = sorted(name for name, r in results.items() if r.status in ("FAIL", "ERROR"))
    assert failing == [], [(n, results[n].note) for n in failing]
    flags = results["flags through what they build"]
    assert flags.status == "PASS"
    assert "label_smoothing (step/step)" in flags.note and "weight_decay (step/step)" in flags.note, flags.note
    assert "a flag only the training loop reads" not in flags.note
    structure = results["structure (regularised, averaged, trained)"]
    assert structure.status == "PASS" and "the port's model holds no regulariser" in structure.note


def test_a_port_that_ignores_its_step_flags_fails_the_flags_check_naming_them(tmp_path, data):
    port = planted(tmp_path, STEP_FLAGS / "port.py",
                   ("label_smoothing=args.label_smoothing)", "label_smoothing=0.1)"),
                   ("decay = args.weight_decay * ", "decay = 0.001 * "))
    settings = harness.Settings(towers=2, steps=2, free_steps=4, quick=False, only=("flags",))
    flags = judged(STEP_FLAGS / "train_tf1.py", port, data, tmp_path, settings, LOOP)["flags through what they build"]
    assert flags.status == "FAIL"
    assert "failing: --label_smoothing 0.05, --weight_decay 0.0005;" in flags.note, flags.note
    rows = {e.name.split()[0]: e for e in flags.errors}
    for flag in ("--label_smoothing", "--weight_decay"):
        assert "moves the legacy program's step (loss " in rows[flag].name, rows[flag].name
        assert "nothing of the modern program, its step included (" in rows[flag].name
        assert "gradients moved by 0 (relative L2)" in rows[flag].name
    assert "label_smoothing (step/-)" in flags.note and "weight_decay (step/-)" in flags.note
    assert "a flag only the training loop reads" not in flags.note  # never offered for a flag that moves a step


def test_a_tower_that_gathers_its_rows_is_refused_in_one_line_naming_the_op(tmp_path, data):
    legacy = planted(tmp_path, STEP_FLAGS / "train_tf1.py", (
        "  for i, (x, y) in enumerate(zip(tf.split(images, args.num_gpus), tf.split(labels, args.num_gpus))):",
        "  share = args.batch_size // args.num_gpus\n"
        "  rows = [tf.range(i * share, (i + 1) * share) for i in range(args.num_gpus)]\n"
        "  for i, (x, y) in enumerate((tf.gather(images, r), tf.gather(labels, r)) for r in rows):"))
    with pytest.raises(CaptureError) as raised:
        judged(legacy, STEP_FLAGS / "port.py", data, tmp_path, harness.Settings(towers=2, steps=2, quick=True))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("tower 0's labels reach its cross-entropy through GatherV2 "), message
    assert "names={'inputs': ...}" in message


def test_a_model_deploy_towers_weights_are_read_as_their_shares(tmp_path, data):
    """Each tower's loss divided by the towers and the towers' gradients summed (weights 1, as
    model_deploy's clones): the same step as a mean over the towers.  Read as row fractions, the
    weights predicted twice the step (split: short last batch, towers weighted equally: FAIL)."""
    legacy = planted(tmp_path, FED / "train_tf1.py", (
        "logits=tower_logits(x, args.hidden)))",
        "logits=tower_logits(x, args.hidden))) / args.num_gpus"), (
        "grads = [(tf.reduce_mean(tf.stack([g for g, _ in pairs]), 0), pairs[0][1]) for pairs in zip(*tower_grads)]",
        "grads = [(tf.add_n([g for g, _ in pairs]), pairs[0][1]) for pairs in zip(*tower_grads)]"))
    settings = harness.Settings(towers=2, steps=2, free_steps=4, quick=True, only=("splits",))
    results = judged(legacy, FED / "fit_port.py", data, tmp_path, settings)
    short = results["split: short last batch"]
    assert short.status == "PASS", short.note
    assert "(weights [1.0, 1.0], shares [0.5, 0.5])" in short.note
