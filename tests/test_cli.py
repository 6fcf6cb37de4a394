"""The command lines: `--help` shows every default, one flag name for towers and steps on all four
trainers, and bad input is one line on stderr with exit code 2 and nothing written."""

import pytest

from conftest import ROOT, run_program
from records import usage

import legacy.cifar_resnet as legacy_cifar
import legacy.mnist_eval as legacy_mnist_eval
import legacy.mnist_multi_gpu as legacy_mnist
import modern.cifar_resnet as modern_cifar
import modern.mnist_eval as modern_mnist_eval
import modern.mnist_multi_gpu as modern_mnist

PROGRAMS = {"legacy/cifar_resnet.py": legacy_cifar, "modern/cifar_resnet.py": modern_cifar,
            "legacy/mnist_multi_gpu.py": legacy_mnist, "modern/mnist_multi_gpu.py": modern_mnist,
            "legacy/mnist_eval.py": legacy_mnist_eval, "modern/mnist_eval.py": modern_mnist_eval}
TRAINERS = {name: module for name, module in PROGRAMS.items() if "eval" not in name}


class Captured(Exception):
    pass


def parser_of(module, monkeypatch):
    """The ArgumentParser `module.parse_args` builds, caught before it parses."""
    def capture(self, *args, **kwargs):
        raise Captured(self)
    monkeypatch.setattr(usage.ArgumentParser, "parse_args", capture)
    with pytest.raises(Captured) as caught:
        module.parse_args([])
    return caught.value.args[0]


@pytest.mark.parametrize("name", PROGRAMS)
def test_help_shows_every_default(name, monkeypatch):
    parser = parser_of(PROGRAMS[name], monkeypatch)
    text = parser.format_help()
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag = action.option_strings[0]
        assert action.help, f"{name} {flag} has no help"
        if action.default is None:  # the help must say what happens without the flag
            assert "default:" in action.help, f"{name} {flag}: {action.help!r}"
        elif not isinstance(action.default, bool):
            shown = parser._get_formatter()._get_help_string(action) % {"default": action.default}
            assert f"(default: {action.default})" in shown, f"{name} {flag}"
    assert "(default: None)" not in text


OLD_NAMES = {"legacy/cifar_resnet.py": ["--num_gpus", "3", "--max_steps", "7"],
             "modern/cifar_resnet.py": ["--num_replicas", "3", "--max_steps", "7"],
             "legacy/mnist_multi_gpu.py": ["--num_gpus", "3", "--training_steps", "7"],
             "modern/mnist_multi_gpu.py": ["--num_replicas", "3", "--training_steps", "7"]}


@pytest.mark.parametrize("name", TRAINERS)
def test_towers_and_max_steps_are_one_name_on_every_trainer_the_originals_names_kept(name):
    module = TRAINERS[name]
    new = vars(module.parse_args(["--towers", "3", "--max_steps", "7"]))
    assert vars(module.parse_args(OLD_NAMES[name])) == new
    assert [new[k] for k in ("num_towers", "num_gpus", "num_replicas") if k in new] == [3]
    assert [new[k] for k in ("max_steps", "training_steps") if k in new] == [7]


BAD = [
    ("legacy/cifar_resnet.py", ["--batch_size", "0"], "argument --batch_size: must be at least 1, got 0"),
    ("modern/cifar_resnet.py", ["--batch_size", "0"], "argument --batch_size: must be at least 1, got 0"),
    ("legacy/cifar_resnet.py", ["--towers", "0"], "argument --towers/--num_towers/--num_gpus: must be at least 1"),
    ("legacy/cifar_resnet.py", ["--keep_prob", "0"], "argument --keep_prob: must lie in (0, 1], got 0"),
    ("legacy/cifar_resnet.py", ["--log_every", "0"], "argument --log_every: must be at least 1, got 0"),
    ("modern/cifar_resnet.py", ["--boundaries", "200", "100"], "--boundaries must increase, got 200 100"),
    ("modern/cifar_resnet.py", ["--values", "0.1"], "--values needs one more entry than --boundaries (3), got 1"),
    ("legacy/mnist_multi_gpu.py", ["--max_steps", "0"], "argument --max_steps/--training_steps: must be at least 1"),
    ("modern/mnist_multi_gpu.py", ["--moving_average_decay", "1.5"], "must lie in [0, 1], got 1.5"),
    ("modern/mnist_multi_gpu.py", ["--batch_size", "x"], "argument --batch_size: invalid int value: 'x'"),
    ("legacy/mnist_eval.py", ["--eval_interval_secs", "-1"], "must be at least 0.0, got -1"),
]


@pytest.mark.parametrize("name,argv,message", BAD, ids=[f"{n} {' '.join(a)}" for n, a, _ in BAD])
def test_bad_flag_is_one_line_exit_2_and_nothing_written(name, argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        PROGRAMS[name].main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert len(err.strip().splitlines()) == 1 and message in err and err.rstrip().endswith("(see --help)"), err
    assert list(tmp_path.iterdir()) == []


def test_bad_flag_from_the_shell_is_the_last_line_and_no_traceback(tmp_path):
    done = run_program([ROOT / "legacy" / "cifar_resnet.py", "--batch_size", "0"], cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "cifar_resnet.py: error: argument --batch_size: must be at least 1, got 0 (see --help)")
    assert done.stdout == "" and list(tmp_path.iterdir()) == []
