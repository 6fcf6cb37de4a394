"""The progress suffix of the four programs' log lines: where a long run is and when it will end.

Shared by both sides, like the data code: each program keeps its original's line and appends

    [step 120/504, ETA 2m31s]

the ETA from the average wall time per step so far (validation and summaries included), so that it
counts what the rest of the run will cost.
"""
from __future__ import annotations

from typing import Optional


def progress(step: int, total: Optional[int], elapsed: float, steps_done: int) -> str:
    """' [step k/N, ETA ...]' after `steps_done` steps took `elapsed` seconds; '' before any."""
    if steps_done <= 0 or total is None:
        return ""
    left = max(total - step, 0) * elapsed / steps_done
    return f" [step {step}/{total}, ETA {duration(left)}]"


def duration(seconds: float) -> str:
    """1h02m, 2m31s or 45s."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
