"""The ``flatland3`` preset against flatland-rl 4.3.0's own evaluator: its budgets are the
service's defaults, read from flatland's module with none of its variables set."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from arbiter.server.core.competition import load_competition

READ_DEFAULTS = """
import json
from flatland.evaluators import service
print(json.dumps({
    "planning_s": service.INTIAL_PLANNING_TIMEOUT,
    "step_s": service.PER_STEP_TIMEOUT,
    "overall_s": service.OVERALL_TIMEOUT,
    "idle_s": service.DEFAULT_COMMAND_TIMEOUT,
    "max_successive_timeouts": service.MAX_SUCCESSIVE_TIMEOUTS,
    "seed": service.RANDOM_SEED,
}))
"""


def flatland_service_defaults() -> dict:
    """flatland's service reads its settings from the environment at import: a clean one here."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLATLAND_", "AICROWD_", "TEST_"))}
    out = subprocess.run([sys.executable, "-c", READ_DEFAULTS], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_flatland3_preset_has_the_services_default_budgets_and_seed():
    defaults = flatland_service_defaults()
    spec = load_competition("flatland3")
    budgets = spec.budgets
    assert {
        "planning_s": budgets.planning_s,
        "step_s": budgets.step_s,
        "overall_s": budgets.overall_s,
        "idle_s": budgets.idle_s,
        "max_successive_timeouts": budgets.max_successive_timeouts,
        "seed": spec.seed,
    } == defaults
    assert defaults["planning_s"] == 600 and defaults["step_s"] == 10 and defaults["overall_s"] == 7200
