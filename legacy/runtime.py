"""What the three legacy entry points share around the originals' code, one of each:

    UsageError         bad input the user can fix (data, folders, checkpoints, flags)
    check_writable     make a folder and prove a file can be written there
    run_main           run the program; a UsageError is one line on stderr and exit code 2

The modern programs have the same three in `modern/runtime.py`.
"""
import os
import sys
import tempfile


class UsageError(Exception):
    """A one-paragraph problem the user can fix: printed by `run_main`, exit code 2, no traceback."""


def check_writable(folder, flag):
    """Make `folder` and prove a file can be written there, or raise UsageError naming `flag`."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UsageError(f"the folder {folder} is not writable ({e.strerror or e}); "
                         f"pass {flag} with a folder you can write to") from None


def run_main(program, args, also=()):
    """`program(args)` -> exit code 0; UsageError (and the exception types in `also`, the data
    modules' own) -> one line on stderr, exit code 2."""
    try:
        program(args)
    except (UsageError, *also) as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    return 0
