"""A step that ends a dataset and asks for the next one (``{"arbiter": {"next": true}}``) brings
that dataset's ENV_CREATE reply with it, opened as an ENV_CREATE would open it, its budgets
running from that reply: the runner's fold process spares a round trip per dataset within its
fold, and nothing else changes."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import paths
import pytest
from harness import finish, read_episodes, running_service, wait_for

from arbiter.client import metalc as runner
from arbiter.client.wire import Wire
from arbiter.protocol import keys
from arbiter.protocol.errors import TimeoutException
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL, extension
from arbiter.server.core.competition import load_competition
from arbiter.server.formats.metalc.generate import GeneratorSettings, write_meta_dataset

AGENTS_DIR = os.path.join(str(paths.REPO), "examples", "metalc_agent")
ROOMY = ["budgets.idle_s=10", "budgets.overall_s=300"]
DATASETS = 6  # one per fold


@pytest.fixture(scope="module")
def six_datasets(tmp_path_factory):
    folder = tmp_path_factory.mktemp("metalc-next") / "data"
    write_meta_dataset(str(folder), GeneratorSettings(seed=3, datasets=DATASETS, algorithms=4))
    return str(folder)


def budget_of(created: dict[str, Any]) -> float:
    return float(created["info"]["dataset_meta_features"]["time_budget"])


def test_the_ending_step_brings_the_next_dataset_and_its_planning_budget_runs_from_there(
    six_datasets, redis_url, redis_conn, service_id, tmp_path
):
    # every dataset is its fold's first here: its planning budget has the meta-training time on top
    competition = load_competition("metalc-wcci2022", ["budgets.planning_s=0.2", "meta_train_s=0.2", *ROOMY])
    results = str(tmp_path / "r")
    with running_service(
        competition, tests=six_datasets, results=results, redis_url=redis_url, service_id=service_id
    ) as (service, outcome):
        wire = Wire(redis_url, service_id, reply_timeout_s=10)
        wire.handshake("test")

        def step(action: list[Any], **asks: Any) -> dict[str, Any]:
            return wire.request(FLATLAND_RL.ENV_STEP, {"action": action, EXTENSION_KEY: {"reply": True, **asks}})[
                "payload"
            ]

        first = wire.request(FLATLAND_RL.ENV_CREATE, {})["payload"]
        assert extension(first)["item"] == 0
        # a step that does not end its dataset brings nothing, asked or not
        assert "next" not in extension(step([None, "0", 0.0], next=True))
        ending = step([None, "0", budget_of(first)], next=True)
        assert ending["done"]
        second = extension(ending)["next"]
        assert extension(second)["item"] == 1 and "finished" not in extension(second)
        assert second["observation"] is None and "dataset_meta_features" in second["info"]
        # it is open: its planning budget runs out without another request
        wait_for(lambda: redis_conn.llen(keys.errors_key(service_id)) == 1, what="the planning timeout")
        assert service.evaluation.counters["planning_timeouts"] == 1
        # a dataset ended without asking brings nothing; the next ENV_CREATE tells the timeout first
        with pytest.raises(TimeoutException):
            wire.request(FLATLAND_RL.ENV_CREATE, {})
        third = wire.request(FLATLAND_RL.ENV_CREATE, {})["payload"]
        assert extension(third)["item"] == 2
        assert "next" not in extension(step([None, "1", budget_of(third)]))
        created = wire.request(FLATLAND_RL.ENV_CREATE, {})["payload"]
        while not extension(created).get("finished"):
            created = extension(step([None, "2", budget_of(created)], next=True))["next"]
        assert extension(created) == {"finished": True}  # the last dataset's ending step says so
        wire.request(FLATLAND_RL.ENV_SUBMIT, {})
        wire.close()
        summary = finish(outcome)
    records = read_episodes(results)
    assert [r["index"] for r in records] == list(range(DATASETS))
    assert [r["timeout"] for r in records] == [None, "planning", None, None, None, None]
    assert [r["dataset"] for r in records[1:3]] == [
        second["info"]["dataset_meta_features"]["name"],
        third["info"]["dataset_meta_features"]["name"],
    ]
    assert summary["state"] == "SUCCESS"


class CountingWire(Wire):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sent: list[str] = []

    def request(self, type_: str, payload: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.sent.append(type_)
        return super().request(type_, payload, *args, **kwargs)


@pytest.fixture(scope="module")
def two_per_fold(tmp_path_factory):
    folder = tmp_path_factory.mktemp("metalc-next-two") / "data"
    write_meta_dataset(str(folder), GeneratorSettings(seed=4, datasets=12, algorithms=4))
    return str(folder)


def runner_evaluation(competition, tests: str, results: str, redis_url: str, service_id: str):
    """The example agent played by the runner against an evaluator serving in this process, the
    evaluation checked a success scored as the runner was told: the runner, its wire, the summary."""
    with running_service(competition, tests=tests, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        wire = CountingWire(redis_url, service_id, reply_timeout_s=10)
        played = runner.Runner(wire, runner.Submission.checked(AGENTS_DIR))
        scores = played.play()
        wire.close()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS" and scores["score"] == summary["score"]["primary"]
    return played, wire, summary


def test_the_folds_process_plays_on_the_runners_session_asking_for_the_next_dataset_within_its_fold(
    two_per_fold, redis_url, service_id, tmp_path
):
    competition = load_competition("metalc-wcci2022", ROOMY)
    results = str(tmp_path / "r")
    played, wire, summary = runner_evaluation(competition, two_per_fold, results, redis_url, service_id)
    records = read_episodes(results)
    assert [r["index"] for r in records] == list(range(12)) and played.datasets == 12
    # Every step went out from a fold's process: the runner asks for each fold's first dataset (with
    # its meta-training data) and for the end, nothing else; the evaluator saw one client throughout.
    assert wire.sent == [FLATLAND_RL.PING, *[FLATLAND_RL.ENV_CREATE] * 7, FLATLAND_RL.ENV_SUBMIT]
    counters = summary["counters"]
    assert not any(counters.get(name) for name in ("foreign_requests", "stale_requests", "lost_requests"))
    # Within a fold, the step ending its first dataset brought its second; a fold's last brought nothing.
    trips = played.round_trips
    assert trips["closing"]["count"] == 6 and trips["last"]["count"] == 6 and trips["first"]["count"] == 6
    assert trips["fold_create"]["count"] == 6 and trips["create"]["count"] == 0
    steps = sum(trips[kind]["count"] for kind in ("step", "first", "closing", "last"))
    assert steps == sum(r["steps"] for r in records)
    assert all(len(row["samples"]) == row["count"] for row in trips.values())


def test_a_plan_cut_short_mid_fold_ends_the_folds_play_with_the_evaluation(
    two_per_fold, redis_url, service_id, tmp_path
):
    # The first 3 datasets only (as a debug run cuts the plan): the third is fold 1's first, not its
    # last, so its ending step asks for the next one and hears that the evaluation has none.
    competition = dataclasses.replace(load_competition("metalc-wcci2022", ROOMY), max_episodes=3)
    results = str(tmp_path / "r")
    played, _, _ = runner_evaluation(competition, two_per_fold, results, redis_url, service_id)
    assert [r["index"] for r in read_episodes(results)] == [0, 1, 2] and played.datasets == 3
    assert played.round_trips["last"]["count"] == 2  # fold 0's second dataset, and the evaluation's last
