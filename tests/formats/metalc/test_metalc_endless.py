"""A MetaLC dataset that never ends: an agent that suggests ``delta_t = 0`` forever never spends its
time budget. The default step limit ends such a dataset, and the evaluator keeps only the steps
that change the scored curve, so its memory stays flat however long the agent steps.

The evaluator runs as its own process (``arbiter serve``) so its resident memory is its own; the
agent is a client on the raw wire in this process, stepping as fast as the wire allows.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from typing import Any

import paths
import pytest
from harness import read_episodes, read_summary

from arbiter.client.wire import Wire
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL, extension
from arbiter.server.formats.metalc.data import load_meta_dataset
from arbiter.server.formats.metalc.env import DatasetEpisode
from arbiter.server.formats.metalc.generate import GeneratorSettings, write_meta_dataset
from arbiter.server.formats.metalc.options import DEFAULT_MAX_STEPS, MetaLCOptions
from arbiter.server.formats.metalc.scoring import dataset_figures

REPO = str(paths.REPO)
SMALL = GeneratorSettings(datasets=6, algorithms=4, seed=5)
# What the evaluator still spends on a dataset of the limit's 10,000 steps: its timing figures, 24
# bytes a step (0.23 MiB), and at the dataset's end the think-time statistics sorting a copy of
# them as Python floats (32 bytes a step, 0.3 MiB, freed but kept by the process for reuse):
# about 0.55 MiB, 0.65 MiB measured. 1.5 MiB leaves room for the allocator's granularity. Keeping
# every step in the episode and its record grew the evaluator by 4.6 MiB over the same steps.
RSS_GROWTH_BOUND_KIB = 1536


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("metalc-endless") / "data"
    write_meta_dataset(str(folder), SMALL)
    return str(folder)


def resident_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def test_the_default_step_limit_is_the_presets_and_far_above_an_honest_schedule():
    from arbiter.server.core.competition import load_competition

    assert MetaLCOptions().max_steps == DEFAULT_MAX_STEPS
    assert load_competition("metalc-wcci2022", []).options.max_steps == DEFAULT_MAX_STEPS
    # round 1's finest sample schedule: half-second slices of its longest budget
    assert DEFAULT_MAX_STEPS >= 4 * (1200 / 0.5)


def test_a_record_keeps_the_steps_that_change_the_curve_and_scores_as_if_it_kept_them_all(small_dir):
    meta = load_meta_dataset(small_dir)
    rng = random.Random(7)
    for phase in ("dev", "final"):
        for dataset in meta.datasets:
            episode = DatasetEpisode(meta, dataset, phase)
            every_step = []
            while not episode.done:  # small slices, often none at all: many steps change nothing
                delta_t = rng.choice([0.0, 0.0, 0.5, episode.time_budget / 40])
                episode.step((rng.choice(meta.algorithms + (None,)), rng.choice(meta.algorithms), delta_t))
                every_step.append(episode.last_step)
            record = episode.record()
            full = dataset_figures([s.time for s in every_step], [s.score for s in every_step], episode.time_budget,
                                   phase, finished=True)  # fmt: skip
            assert (record["alc"], record["final_score"], record["zero_because"]) == full
            assert record["steps"] == len(every_step) > len(record["times"])
            kept = [every_step[n - 1] for n in record["step_numbers"]]
            assert [(s.time, s.score, s.a_star, s.credited_time) for s in kept] == list(
                zip(record["times"], record["scores"], record["a_star"], record["credited_times"], strict=True)
            )
            assert record["step_numbers"][-1] == len(every_step)  # the last step: the final score


def test_an_endless_dataset_ends_at_the_step_limit_with_the_evaluators_memory_flat(
    small_dir, redis_url, service_id, tmp_path
):
    if not os.path.exists(f"/proc/{os.getpid()}/status"):
        pytest.skip("resident memory is read from /proc")
    results = str(tmp_path / "r")
    evaluator = subprocess.Popen(
        [sys.executable, "-m", "arbiter.server.cli", "serve", "--competition", "metalc-wcci2022", "--tests", small_dir,
         "--redis-url", redis_url, "--service-id", service_id, "--results", results, "--quiet",
         "--set", "dataset_s=100", "--set", "budgets.idle_s=20"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wire = Wire(redis_url, service_id, reply_timeout_s=20)
        wire.handshake("test")

        def step(action: list[Any]) -> dict[str, Any]:
            return wire.request(FLATLAND_RL.ENV_STEP, {"action": action, EXTENSION_KEY: {"reply": True}})["payload"]

        def step_until_the_dataset_ends() -> int:
            """Steps taken until the dataset ended, or far past the limit if it never does."""
            steps = 0
            while steps < 3 * DEFAULT_MAX_STEPS:
                steps += 1
                if step(["0", "0", 0.0])["done"]:
                    break
            return steps

        def spend_the_budget(created: dict[str, Any]) -> None:
            assert step([None, "0", float(created["info"]["dataset_meta_features"]["time_budget"])])["done"]

        # The first dataset, played in one step, warms the evaluator up (its first record, the
        # results files, the running score); the second, endless, is measured from its ENV_CREATE
        # to its last step.
        spend_the_budget(wire.request(FLATLAND_RL.ENV_CREATE, {})["payload"])
        wire.request(FLATLAND_RL.ENV_CREATE, {})
        before_kib = resident_kib(evaluator.pid)
        steps = step_until_the_dataset_ends()
        growth_kib = resident_kib(evaluator.pid) - before_kib
        assert steps == DEFAULT_MAX_STEPS, f"the dataset did not end at the step limit ({steps} steps)"
        assert growth_kib < RSS_GROWTH_BOUND_KIB, f"the evaluator grew by {growth_kib} KiB over {steps} steps"

        created = wire.request(FLATLAND_RL.ENV_CREATE, {})["payload"]
        while not extension(created).get("finished"):  # the other datasets: one step each
            spend_the_budget(created)
            created = wire.request(FLATLAND_RL.ENV_CREATE, {})["payload"]
        wire.request(FLATLAND_RL.ENV_SUBMIT, {})
        wire.close()
        assert evaluator.wait(timeout=30) == 0, evaluator.stderr.read()[-3000:]
    finally:
        if evaluator.poll() is None:
            evaluator.kill()
            evaluator.wait()
    records = read_episodes(results)
    endless = records[1]
    assert (endless["steps"], endless["ended"], endless["alc"]) == (DEFAULT_MAX_STEPS, "step_limit", 0.0)
    assert endless["step_numbers"] == [DEFAULT_MAX_STEPS]  # the scored curve never changed: the last step alone
    assert endless["zero_because"] == "not finished" and not endless["timed_out"]  # its own limit, no budget
    assert [r["steps"] for r in records] == [1, DEFAULT_MAX_STEPS, 1, 1, 1, 1]
    assert read_summary(results)["state"] == "SUCCESS"
