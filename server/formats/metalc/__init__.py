"""The MetaLC format: meta-learning from learning curves, round 1 (WCCI 2022), scored by the area
under the agent's learning curve (docs/formats/metalc.md).

- ``data``: the meta-dataset folder, loaded exactly as the challenge loads it;
- ``env``: phases, runs and seeds, folds, meta-training data, one dataset's episode;
- ``scoring``: ALC, final scores, run averages and the final phase's worst run, from records;
- ``generate``: synthetic meta-datasets in the same layout;
- ``local``: a whole phase played in process with agent objects.
- ``options``, ``plan``, ``report``: the format as arbiter's evaluator plays it (``FORMAT``).
"""

from __future__ import annotations

import os

from arbiter.server.formats.base import Format
from arbiter.server.formats.metalc.generate import write_generated
from arbiter.server.formats.metalc.options import MetaLCOptions
from arbiter.server.formats.metalc.plan import MetaLCPlan
from arbiter.server.formats.metalc.report import report_sections
from arbiter.server.formats.metalc.scoring import AlcRule

FORMAT = Format(
    name="metalc",
    rules={"alc": AlcRule},
    make_plan=MetaLCPlan,
    reads_tests=True,  # the meta-dataset; its plan says what to do when there is none
    options=MetaLCOptions,
    report_sections=report_sections,
    presets_dir=os.path.join(os.path.dirname(__file__), "presets"),
    clients="`python -m arbiter.client.metalc SUBMISSION_DIR` or arbiter.client.RemoteEnv",
    item_nouns=("dataset", "datasets"),
    generate=write_generated,
)
