"""The DIAMBRA Arena format (docs/formats/diambra.md): a fighting-game agent plays N episodes of a game at
the difficulty its submitter chose, scored by the difficulty-weighted rule.

- ``games``: what arbiter knows of each game (difficulty levels, reward-bound parameters, characters);
- ``settings``: the competition keys (``DiambraSettings``), checked at load;
- ``scoring``: bounds, k(R), episode records and the rule, pure functions over records;
- ``engine`` and ``env``: diambra-arena's real env on a DIAMBRA engine or on its engine mock;
- ``local``: an evaluation played in process (an agent script's env, its records and score).

``games``, ``settings`` and ``scoring`` import nothing from diambra-arena, so results rescore
and settings validate without the ``diambra`` extra; ``engine``, ``env`` and ``local`` need it.
``plan`` (the evaluator's items over one env) and ``report`` (the report's sections) complete
the format the registry knows as ``diambra``.
"""

from __future__ import annotations

import os

from arbiter.server.formats.base import Format
from arbiter.server.formats.diambra.plan import DiambraPlan
from arbiter.server.formats.diambra.report import report_sections
from arbiter.server.formats.diambra.scoring import DiambraRule
from arbiter.server.formats.diambra.settings import DiambraSettings

FORMAT = Format(
    name="diambra",
    rules={"diambra": DiambraRule},
    make_plan=DiambraPlan,
    options=DiambraSettings,
    report_sections=report_sections,
    presets_dir=os.path.join(os.path.dirname(__file__), "presets"),
    clients="arbiter.client.diambra.make or arbiter.client.RemoteEnv",
    secret_seed=True,
)
