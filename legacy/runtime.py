"""What the three legacy entry points share around the originals' code, one of each:

    UsageError         bad input the user can fix (data, folders, checkpoints, flags)
    check_writable     make a folder and prove a file can be written there
    run_main           run the program; a UsageError is one line on stderr and exit code 2

UsageError and check_writable are `records/usage.py`'s, the modern programs' too; the modern
`main` wrapper is in `modern/runtime.py`.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from records.usage import UsageError, check_writable  # noqa: F401 (re-exported: the legacy programs import them here)


def run_main(program: Callable[[argparse.Namespace], Any], args: argparse.Namespace,
             also: tuple[type[Exception], ...] = ()) -> int:
    """`program(args)` -> exit code 0; UsageError (and the exception types in `also`, the data
    modules' own) -> one line on stderr, exit code 2."""
    try:
        program(args)
    except (UsageError, *also) as error:  # type: ignore[misc]  # mypy rejects a starred except tuple; valid Python
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    return 0
