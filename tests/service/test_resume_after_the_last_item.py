"""An evaluation SIGKILLed after its last item was on record and before its summary (F11),
resumed: every item is played, so it ends as the uninterrupted evaluation whose agent went quiet
after its last item ends, SUCCESS with the same score, when no agent comes back within the idle
budget, or when one comes back and submits.

The kill point is chosen: the folder is the uninterrupted run's, less what that SIGKILL keeps
from being written (summary.json and the finished event).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from harness import finish, read_episodes, read_summary, running_service, spec

from arbiter.client import RemoteClient


def killed_before_its_summary(played: str, folder: Path) -> str:
    shutil.copytree(played, folder)
    (folder / "summary.json").unlink()
    events = (folder / "events.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (folder / "events.jsonl").write_text("".join(e for e in events if '"event":"finished"' not in e), "utf-8")
    return str(folder)


@pytest.mark.parametrize("agent", ["none comes back", "one comes back and submits"])
def test_a_resume_with_every_item_on_record_ends_as_the_uninterrupted_run(
    agent, redis_url, service_id, tiny_tests, tmp_path
):
    competition = spec(idle_s=0.5, step_s=0.5, planning_s=1.0)
    played = str(tmp_path / "played")
    with running_service(competition, tests=tiny_tests, results=played, redis_url=redis_url,
                         service_id=service_id + "-a") as (_, outcome):  # fmt: skip
        client = RemoteClient(redis_url=redis_url, service_id=service_id + "-a", reply_timeout_s=10)
        while client.env_create()[0]:
            while not client.env_step({h: 2 for h in client.env.get_agent_handles()})[2]["__all__"]:
                pass
        uninterrupted = finish(outcome)  # the agent went quiet after its last episode
    assert uninterrupted["state"] == "SUCCESS", uninterrupted["termination_cause"]
    assert "no ENV_SUBMIT within the idle budget" in uninterrupted["termination_cause"]

    results = killed_before_its_summary(played, tmp_path / "killed")
    with running_service(competition, tests=tiny_tests, results=results, redis_url=redis_url,
                         service_id=service_id, resume=True) as (_, outcome):  # fmt: skip
        if agent != "none comes back":
            client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
            assert client.env_create()[0] is False  # nothing left to play
            client.submit()
        summary = finish(outcome)
    assert summary["state"] == "SUCCESS", summary["termination_cause"]
    assert summary["score"] == uninterrupted["score"]
    assert summary["counters"]["resumed"] == 1
    assert read_summary(results)["score"] == uninterrupted["score"]
    assert read_episodes(results) == read_episodes(played)
