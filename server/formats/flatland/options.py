"""Flatland's own competition key (docs/formats/flatland.md#competition-keys), checked at load.

``min_test_completion``: under ``flatland3``, the mean fraction of agents arrived a Test's
finished episodes must reach for the next Test to be played (flatland-rl 4.3.0's evaluator's
``TEST_MIN_PERCENTAGE_COMPLETE_MEAN``, 0.25 by default; 0 never stops). ``neurips2020`` reads none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from arbiter.protocol.errors import ConfigError

# flatland-rl 4.3.0's service: its TEST_MIN_PERCENTAGE_COMPLETE_MEAN's default.
TEST_MIN_PERCENTAGE_COMPLETE_MEAN = 0.25


@dataclass(frozen=True)
class FlatlandOptions:
    min_test_completion: float = TEST_MIN_PERCENTAGE_COMPLETE_MEAN

    def __post_init__(self) -> None:
        value = self.min_test_completion
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"min_test_completion must be a finite number, got {value!r}")
