"""Flatland NeurIPS 2020 (docs/formats/flatland.md): flatland-rl's evaluator protocol, so existing
Flatland submissions run unchanged; the test folder's episodes, scored by normalized return.

Besides the plan, rules and report: ``generate`` writes test folders (``arbiter generate``, and
the debug set of an ``arbiter run`` given none), ``recording`` keeps the first episodes' actions
(``--record N``), ``replay`` plays them again into a GIF (``arbiter replay``), and ``rescore``
derives each episode's figures again from its raw fields (``arbiter rescore``).
"""

from __future__ import annotations

import os

from arbiter.server.formats.base import Format
from arbiter.server.formats.flatland.generate import debug_test_set, write_test_folder
from arbiter.server.formats.flatland.options import FlatlandOptions
from arbiter.server.formats.flatland.plan import FlatlandPlan
from arbiter.server.formats.flatland.recording import recording_plan
from arbiter.server.formats.flatland.replay import replay_episode
from arbiter.server.formats.flatland.report import report_sections
from arbiter.server.formats.flatland.rescore import rederived_records
from arbiter.server.formats.flatland.rules import Flatland3, NeurIPS2020

FORMAT = Format(
    name="flatland",
    rules={"neurips2020": NeurIPS2020, "flatland3": Flatland3},  # each made with the options
    options=FlatlandOptions,
    make_plan=FlatlandPlan,
    report_sections=report_sections,
    presets_dir=os.path.join(os.path.dirname(__file__), "presets"),
    clients="arbiter.client.RemoteClient or flatland-rl's FlatlandRemoteClient",
    tests_variable="AICROWD_TESTS_FOLDER",  # flatland-rl's evaluator reads it; existing setups set it
    tcp_clients=True,  # flatland-rl's client knows no unix socket
    requires_tests=True,
    generate=write_test_folder,
    default_tests=debug_test_set,
    replay=replay_episode,
    rescore=rederived_records,
    recorder=recording_plan,
)
