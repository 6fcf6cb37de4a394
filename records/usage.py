"""Bad input, the same on both sides: one error class and one writable-folder check.

    UsageError       a one-paragraph problem the user can fix (data, folders, devices, checkpoints,
                     flags): each side's `main` wrapper prints it on stderr and exits 2, no traceback
    check_writable   make a folder and prove a file can be written there

Shared by the legacy and modern programs like the data code; each side re-exports both from its
runtime module (`legacy/runtime.py`, `modern/runtime.py`), whose `main` wrapper is its own.
"""
import os
import tempfile


class UsageError(Exception):
    """A one-paragraph problem the user can fix: printed by the `main` wrapper, exit code 2."""


def check_writable(folder, flag):
    """Make `folder` and prove a file can be written there, or raise UsageError naming `flag`."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UsageError(f"the folder {folder} is not writable ({e.strerror or e}); "
                         f"pass {flag} with a folder you can write to") from None
