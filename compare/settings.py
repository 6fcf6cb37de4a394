"""What one run of the harness runs: the tower count, the steps, the start, which check groups."""
from __future__ import annotations

import dataclasses
from typing import Optional

from compare.interface import GROUPS, Pair


@dataclasses.dataclass
class Settings:
    """What the harness runs: the tower count, the steps, the start, which groups."""
    towers: int = 2
    steps: Optional[int] = None        # restart-per-step training steps (default 6, --quick 2)
    free_steps: Optional[int] = None   # free-running and moving-average steps (default: the pair's)
    seed: int = 0
    quick: bool = False
    checkpoint: Optional[str] = None   # start from this TF1 checkpoint of the legacy program
    only: tuple[str, ...] = GROUPS
    tf1_repeats: int = 1               # the TF1-runtime step run this many times from the same state

    def restart_steps(self) -> int:
        return self.steps or (2 if self.quick else 6)

    def free_steps_for(self, pair: Pair) -> int:
        if self.free_steps is not None:
            return self.free_steps
        return pair.quick_free_steps if self.quick else pair.free_steps
