"""The two-phase RL format (docs/formats/two-phase.md): mean return, then training convergence, on a
Gymnasium env the server owns."""

from __future__ import annotations

import os

from arbiter.server.formats.base import Format
from arbiter.server.formats.two_phase.options import TwoPhaseOptions
from arbiter.server.formats.two_phase.plan import TwoPhasePlan
from arbiter.server.formats.two_phase.report import report_headline, report_sections
from arbiter.server.formats.two_phase.scoring import TwoPhaseRule

FORMAT = Format(
    name="two-phase",
    rules={"two-phase": TwoPhaseRule},
    make_plan=TwoPhasePlan,
    options=TwoPhaseOptions,
    report_sections=report_sections,
    report_headline=report_headline,
    presets_dir=os.path.join(os.path.dirname(__file__), "presets"),
    clients="`python -m arbiter.client.reinforcelab SUBMISSION_DIR` or arbiter.client.RemoteEnv",
    secret_seed=True,
    plays_whole_plan=True,  # its phases and runs are scored together: a debug run plays them all
    item_nouns=("episode or training run", "episodes and training runs"),
)
