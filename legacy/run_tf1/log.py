"""How the runner speaks: the prefix of its own lines, and where they go."""
from __future__ import annotations

import sys
from collections.abc import Callable

Log = Callable[[str], None]
PREFIX = "run_tf1"


def stderr_log(line: str) -> None:
    """The command line's log: one line on stderr."""
    print(line, file=sys.stderr, flush=True)

