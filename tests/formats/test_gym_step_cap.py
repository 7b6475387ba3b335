"""A format around a Gymnasium env whose own step cap ends an episode (``limit_reached``) before
the env does: the agent's plain Gymnasium loop, stopping on ``terminated or truncated``, sees each
episode end there and plays the whole plan (a real redis-server, the evaluator serving in this
process, the agent a process of its own). A step past that end is refused, naming the item that
ended and how."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import gymnasium
import pytest
from harness import finish, read_episodes, running_service

from arbiter.protocol.errors import OutOfOrder
from arbiter.server.core.competition import spec_from_dict
from arbiter.server.formats import register_format
from arbiter.server.formats.base import Column, Format, Item, Rule
from arbiter.server.formats.gym_episode import GymEpisode, GymPlan

CAP = 5  # CartPole, pushed the way its pole leans, stands far longer than this

AGENT = """
from arbiter.client import RemoteEnv

env = RemoteEnv()
while True:
    observation, info = env.reset()
    if env.finished:
        break
    terminated = truncated = False
    while not (terminated or truncated):
        observation, reward, terminated, truncated, info = env.step(int(observation[2] > 0))
env.submit()
"""


class CappedEpisode(GymEpisode):
    def step(self, action: Any) -> bool:
        if not super().step(action) and self.steps >= CAP:
            self.limit_reached = True
            self.over = True
        return self.over


class CappedPlan(GymPlan):
    columns = (Column("episode"), *GymPlan.columns)

    def make_env(self) -> Any:
        return gymnasium.make("CartPole-v1")

    def make_items(self) -> list[Item]:
        return [Item(index=i, unit=f"episode/{i}", fields={"episode": i}) for i in range(3)]

    def open(self, item: Item) -> CappedEpisode:
        return CappedEpisode(self.env, item, self.seed_of(item))


class Steps(Rule):
    name = "steps"

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        steps = sum(r["steps"] for r in records)
        return {"primary": steps, "secondary": None, "primary_name": "steps", "secondary_name": None, "spread": {}}


def test_an_episode_the_formats_cap_ends_is_truncated_for_the_agent(redis_url, service_id, tmp_path):
    register_format("capped-cartpole", Format(name="capped-cartpole", rules={"steps": Steps}, make_plan=CappedPlan))
    spec = spec_from_dict("capped", {"format": "capped-cartpole"})
    results = str(tmp_path / "results")
    env = {**os.environ, "ARBITER_REDIS_URL": redis_url, "AICROWD_SUBMISSION_ID": service_id}
    with running_service(spec, tests=None, results=results, redis_url=redis_url, service_id=service_id) as (_, outcome):
        agent = subprocess.run(
            [sys.executable, "-c", AGENT],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert agent.returncode == 0, agent.stderr[-2000:]
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS" and summary["items"]["ended"] == {"step_limit": 3}
    assert [(r["episode"], r["steps"]) for r in read_episodes(results)] == [(0, CAP), (1, CAP), (2, CAP)]


def test_a_step_past_the_end_of_an_episode_names_the_item_that_ended(redis_url, service_id, tmp_path, monkeypatch):
    register_format("capped-cartpole", Format(name="capped-cartpole", rules={"steps": Steps}, make_plan=CappedPlan))
    spec = spec_from_dict("capped", {"format": "capped-cartpole"})
    monkeypatch.setenv("ARBITER_REDIS_URL", redis_url)
    monkeypatch.setenv("AICROWD_SUBMISSION_ID", service_id)
    results = str(tmp_path / "results")
    with running_service(spec, tests=None, results=results, redis_url=redis_url, service_id=service_id):
        from arbiter.client import RemoteEnv

        env = RemoteEnv()
        try:
            env.reset()
            for _ in range(CAP):
                truncated = env.step(0)[3]
            assert truncated
            with pytest.raises(OutOfOrder, match=r"without a running episode; item 0 ended \(step_limit\): call"):
                env.step(0)  # an agent that reads neither terminated nor truncated
        finally:
            env.close()
