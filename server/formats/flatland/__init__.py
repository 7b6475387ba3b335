"""Flatland NeurIPS 2020 (SCORING.md §1): flatland-rl's evaluator protocol, so existing Flatland
submissions run unchanged; the test folder's episodes, scored by normalized return."""

from __future__ import annotations

import os

from arbiter.server.formats.base import Format
from arbiter.server.formats.flatland.plan import FlatlandPlan
from arbiter.server.formats.flatland.report import report_sections
from arbiter.server.formats.flatland.rules import Flatland3, NeurIPS2020

FORMAT = Format(
    name="flatland",
    description="Flatland (flatland-rl's protocol): a test folder's episodes, scored by normalized return",
    rules={"neurips2020": lambda options: NeurIPS2020(), "flatland3": lambda options: Flatland3()},
    make_plan=FlatlandPlan,
    report_sections=report_sections,
    presets_dir=os.path.join(os.path.dirname(__file__), "presets"),
    clients="arbiter.client.RemoteClient or flatland-rl's FlatlandRemoteClient",
    requires_tests=True,
)
