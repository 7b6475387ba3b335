"""Play agent objects in this process through a whole MetaLC phase, the way the challenge's
ingestion program does: per run, seed the process; per fold, a fresh ``Agent(number_of_algorithms)``
meta-trained on the other folds; per meta-test dataset, ``reset`` then ``suggest`` until done.

``seeding="fold"`` seeds the process again at every fold, as ``arbiter.client.metalc`` seeds
each fold's process of its own: the figures an agent scores through the runner.

Used to check arbiter's domain against the challenge's figures and to exercise generated
meta-datasets at scale; a hosted evaluation drives the same episodes from the wire instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from arbiter.server.formats.metalc.data import MetaDataset
from arbiter.server.formats.metalc.env import DatasetEpisode, folds, meta_training_data, run_seeds


def play_phase(
    meta: MetaDataset,
    make_agent: Callable[[int], Any],
    phase: str,
    *,
    max_steps_per_dataset: int | None = None,
    seed_process: bool = True,
    seeding: Literal["run", "fold"] = "run",
) -> list[dict[str, Any]]:
    """Every dataset's record for every run of ``phase``. ``make_agent(number_of_algorithms)``
    builds an agent; a dataset that needs more than ``max_steps_per_dataset`` steps is cut off
    and recorded as timed out (an agent whose delta_t never spends the budget never ends).
    ``seeding``: the run's seeds applied at each run's start (the challenge's) or at each fold's
    (the runner's)."""
    if seeding not in ("run", "fold"):
        raise ValueError(f"seeding is 'run' or 'fold', got {seeding!r}")
    records = []
    for run_seed in run_seeds(phase):
        for fold in folds(meta.datasets):
            if seed_process and (seeding == "fold" or fold.index == 0):
                run_seed.apply()
            agent = make_agent(len(meta.algorithms))
            agent.meta_train(*meta_training_data(meta, fold).as_args())
            for dataset in fold.meta_test:
                episode = DatasetEpisode(meta, dataset, phase, run=run_seed.run, fold=fold.index)
                agent.reset(*episode.reset())
                observation = None
                timed_out = False
                while not episode.done:
                    if max_steps_per_dataset is not None and episode.step_count >= max_steps_per_dataset:
                        timed_out = True
                        break
                    observation, _ = episode.step(agent.suggest(observation))
                records.append({**episode.record(cut_short=timed_out), "timed_out": timed_out})
    return records
