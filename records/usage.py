"""Bad input, the same on both sides: the error class, the command-line parser, and checks.

    UsageError       a one-paragraph problem the user can fix (data, folders, devices, checkpoints,
                     flags): each side's `main` wrapper prints it on stderr and exits 2, no traceback
    check_writable   make a folder and prove a file can be written there
    ArgumentParser   argparse with every default in --help and one-line errors (exit 2)
    at_least, fraction   argparse types that refuse out-of-range numbers

Shared by the legacy and modern programs like the data code; each side re-exports both from its
runtime module (`legacy/runtime.py`, `modern/runtime.py`), whose `main` wrapper is its own.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any, Callable, NoReturn, Optional, Union


class UsageError(Exception):
    """A one-paragraph problem the user can fix: printed by the `main` wrapper, exit code 2."""


def check_writable(folder: Union[str, os.PathLike[str]], flag: str) -> None:
    """Make `folder` and prove a file can be written there, or raise UsageError naming `flag`."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UsageError(f"the folder {folder} is not writable ({e.strerror or e}); "
                         f"pass {flag} with a folder you can write to") from None


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` with every default: '(default: X)' after each flag's help, except where the help
    says it itself (a default of None, which each such flag's help explains, and on/off flags)."""

    def _get_help_string(self, action: argparse.Action) -> Optional[str]:
        if action.default is None or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return action.help or ""
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """The programs' parser: every default in `--help` (HelpFormatter), and a refused flag is one
    line on stderr and exit code 2 (argparse's own prints the usage block first)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def at_least(minimum: float, kind: Union[type[int], type[float]] = int) -> Callable[[str], float]:
    """argparse type: a number >= minimum."""
    def parse(text: str) -> float:
        value = kind(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in "invalid int value"
    return parse


def fraction(low_open: bool = False) -> Callable[[str], float]:
    """argparse type: a float in [0, 1], or in (0, 1] with low_open."""
    def parse(text: str) -> float:
        value = float(text)
        if not (0.0 < value <= 1.0 if low_open else 0.0 <= value <= 1.0):
            raise argparse.ArgumentTypeError(f"must lie in {'(0' if low_open else '[0'}, 1], got {text}")
        return value
    parse.__name__ = "float"
    return parse
