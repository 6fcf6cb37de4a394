"""Every command in the README's bash code blocks runs, as written, from a fresh folder.

The set-up block's two commands are the ones CI runs (`.ci/run`: the install, then the test
command, which is this suite); its trainer, like every trainer below, runs here with `--max_steps 2`
in place of any the README gives, so the main job and the legacy CIFAR smoke run are one run.  The
real-data commands get small files in the real formats, written where the README says they are.  A
README command this test does not know how to run fails the test, so a demo cannot go stale
unnoticed.
"""
import os
import re
import shlex

import numpy as np
import pytest

from conftest import ROOT, run_program
from records import mnist
from test_cifar_data import _write_cifar_batch
from test_mnist_data import write_idx

README = (ROOT / "README.md").read_text()
TRAINERS = ("legacy/cifar_resnet.py", "modern/cifar_resnet.py", "legacy/mnist_multi_gpu.py",
            "modern/mnist_multi_gpu.py")
PACKAGES = ("legacy", "modern", "compare", "records", "examples", "benchmarks")


def readme_commands():
    """The commands of the README's ```bash blocks, comments stripped, `a && b` split, in order."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                commands += [part.strip() for part in line.split("&&")]
    return commands


def ci_commands():
    return [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
            if line.strip().startswith("python")]


def write_real_format_files(folder):
    """What the real-data block expects in the folder: the CIFAR-10 python distribution and MNIST's
    gzipped IDX files, a few images each."""
    rng = np.random.RandomState(0)
    src = folder / "cifar-10-batches-py"
    src.mkdir()
    for name, n in [(f"data_batch_{i}", 4) for i in range(1, 6)] + [("test_batch", 6)]:
        _write_cifar_batch(src / name, rng.randint(0, 256, (n, 32, 32, 3)).astype(np.uint8), rng.randint(0, 10, n))
    n = 200
    images = rng.randint(0, 256, (n, 28, 28)).astype(np.uint8)
    labels = rng.randint(0, 10, n).astype(np.uint8)
    write_idx(folder / "train-images-idx3-ubyte.gz", mnist.IDX_IMAGES_MAGIC, (n, 28, 28), images, compress=True)
    write_idx(folder / "train-labels-idx1-ubyte.gz", mnist.IDX_LABELS_MAGIC, (n,), labels, compress=True)


def test_the_set_up_commands_are_the_ones_ci_runs():
    commands = readme_commands()
    assert commands[:3] == ["pip install -r requirements.txt", "python legacy/cifar_resnet.py",
                            "python -m pytest -q -n 2 --dist loadfile tests"]
    assert "python -m pip install -q -r requirements.txt" in ci_commands()
    assert "python -m pytest -q -n 2 --dist loadfile tests" in ci_commands()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every README command but the install and the test suite, in README order, in one fresh folder
    that holds the repository's packages (as a checkout's root does) and nothing else."""
    folder = tmp_path_factory.mktemp("readme")
    for package in PACKAGES:
        os.symlink(ROOT / package, folder / package)
    write_real_format_files(folder)
    done, seen = [], set()
    for command in readme_commands()[3:] + ["python legacy/cifar_resnet.py"]:
        argv = shlex.split(command)
        assert argv[0] == "python", f"the README test does not know how to run: {command}"
        if argv[1] in TRAINERS:  # 2 steps whatever the README gives: the main job is then the smoke run
            while "--max_steps" in argv:
                del argv[argv.index("--max_steps"):argv.index("--max_steps") + 2]
            argv += ["--max_steps", "2"]
        if tuple(argv) in seen:
            continue
        seen.add(tuple(argv))
        result = run_program(argv[1:], cwd=folder)
        done.append((command, result))
    return folder, done


def test_every_readme_command_succeeds(runs):
    _, done = runs
    failed = [(command, r.returncode, (r.stdout + r.stderr)[-1500:]) for command, r in done if r.returncode != 0]
    assert not failed
    assert len(done) >= 10


def test_the_smoke_runs_end_with_the_lines_the_readme_shows(runs):
    _, done = runs
    last = {command: result.stdout.strip().splitlines()[-1] for command, result in done if result.stdout.strip()}
    shown = re.search(r"Each ends with one line like these.*?```text\n(.*?)```", README, re.S).group(1).splitlines()
    # Each shown line up to its first ';' (the trainers here run 2 steps, so no validation yet),
    # any number standing for any number.
    patterns = [re.escape(re.sub(r"\d+(\.\d+)?", "@", line.split(";")[0])).replace("@", r"\d+(?:\.\d+)?")
                for line in shown]
    smoke = re.search(r"## One-minute smoke runs\n\n```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("  #")[0].strip() for line in smoke.splitlines() if line.strip()]
    assert len(commands) == len(patterns)
    for command, pattern in zip(commands, patterns):
        assert re.match(pattern, last[command]), (command, last[command])
