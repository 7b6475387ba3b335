"""The MetaLC format's competition keys, checked at load.

- ``phase``: ``"dev"`` (one run, validation curves credited, no rounding) or ``"final"`` (three
  runs seeded 1, 2, 3, test curves credited, figures rounded, the worst run reported);
- ``meta_train_s``: wall-clock seconds a fold's agent gets for ``meta_train``. They are added to
  the planning budget of the fold's first dataset, whose ENV_CREATE reply carries the
  meta-training data: meta-training, ``reset`` and the first ``suggest`` all happen before that
  dataset's first step;
- ``dataset_s``: wall-clock seconds one dataset may take from its ENV_CREATE to its last step
  (plus ``meta_train_s`` for a fold's first dataset). The env's time is simulated: an agent whose
  ``delta_t`` never spends the rest of the budget would step forever, so this bound (and the
  overall budget) is what ends it. 0 turns it off;
- ``max_steps``: steps one dataset may take (0: no limit); reaching it ends the dataset as
  timed out, like ``dataset_s``, but counted instead of clocked. The default lies far above what
  any honest schedule of round 1 makes (the README gives the figures), and bounds what an agent
  that never spends its time (a ``delta_t`` of 0, forever) costs the evaluator, whose own
  bookkeeping grows with every step.

The per-``suggest`` (step), per-dataset planning and overall budgets are the spec's ``[budgets]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from arbiter.protocol.errors import ConfigError
from arbiter.server.formats.metalc.env import check_phase

DEFAULT_MAX_STEPS = 10_000


@dataclass(frozen=True)
class MetaLCOptions:
    phase: str = "dev"
    meta_train_s: float = 600.0
    dataset_s: float = 600.0
    max_steps: int = DEFAULT_MAX_STEPS

    def __post_init__(self) -> None:
        check_phase(self.phase)
        for name in ("meta_train_s", "dataset_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"{name} must be a number of seconds, got {value!r}")
        if not self.meta_train_s >= 0:
            raise ConfigError(f"meta_train_s must be >= 0, got {self.meta_train_s!r}")
        if not self.dataset_s >= 0:
            raise ConfigError(f"dataset_s must be >= 0 (0: no per-dataset limit), got {self.dataset_s!r}")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps < 0:
            raise ConfigError(f"max_steps must be a whole number >= 0 (0: no limit), got {self.max_steps!r}")

    def stage_budget_s(self, first_of_fold: bool) -> float | None:
        """The wall-clock budget of one dataset, meta-training included for a fold's first."""
        if not self.dataset_s:
            return None
        return self.dataset_s + (self.meta_train_s if first_of_fold else 0.0)
