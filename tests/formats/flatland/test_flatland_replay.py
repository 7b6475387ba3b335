"""`--record N` and `arbiter replay`: recorded actions, replayed, checked and drawn as a GIF."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest
import redis
from harness import finish, play_episode, read_episodes, running_service, spec, time_out_episode
from PIL import Image

from arbiter.client import RemoteClient
from arbiter.protocol.errors import ConfigError
from arbiter.server.cli.parser import build_parser
from arbiter.server.cli.settings import resolve_spec
from arbiter.server.core.competition import spec_from_dict
from arbiter.server.formats.flatland.replay import load_replay, replay_to_gif

REPLAY = [sys.executable, "-m", "arbiter.server.cli", "replay"]


@pytest.fixture(scope="module")
def recorded(redis_server, tiny_tests, tmp_path_factory) -> str:
    """An evaluation recording its first 2 episodes: 0 played to the end, 1 timed out after 10
    steps, 2 played (not recorded)."""
    results = str(tmp_path_factory.mktemp("recorded") / "results")
    service_id = "t-" + uuid.uuid4().hex[:12]
    competition = dataclasses.replace(spec(step_s=0.3, planning_s=5), record_episodes=2)
    with running_service(
        competition, tests=tiny_tests, results=results, redis_url=redis_server.url, service_id=service_id
    ) as (_, outcome):
        client = RemoteClient(redis_url=redis_server.url, service_id=service_id, reply_timeout_s=10)
        client.env_create()
        play_episode(client, 0)
        client.env_create()
        with redis.Redis.from_url(redis_server.url, socket_timeout=5) as redis_conn:
            time_out_episode(client, redis_conn, episode=1, steps=10)
        client.env_create()
        play_episode(client, 2)
        client.submit()
        assert finish(outcome)["state"] == "SUCCESS"
    return results


def test_only_the_first_n_episodes_are_recorded(recorded):
    assert sorted(os.listdir(os.path.join(recorded, "replays"))) == ["episode-0.json", "episode-1.json"]
    records = read_episodes(recorded)
    for index in (0, 1):
        with open(os.path.join(recorded, "replays", f"episode-{index}.json"), encoding="utf-8") as handle:
            replay = json.load(handle)
        assert replay["env"] == records[index]["env"] and replay["seed"] == 1001
        assert replay["reward_model"] == "neurips2020"
        assert len(replay["actions"]) == replay["steps"] == records[index]["steps"]
    assert records[1]["timed_out"] and records[1]["steps"] == 10


def test_a_replay_matches_its_episode_and_makes_an_animated_gif(recorded, tmp_path):
    out = str(tmp_path / "episode-0.gif")
    outcome = replay_to_gif(recorded, 0, out=out, renderer="PIL", every=10)
    assert outcome.matches, outcome.mismatches
    record = read_episodes(recorded)[0]
    assert (outcome.steps, outcome.arrived, outcome.reward) == (record["steps"], record["arrived"], record["reward"])
    with Image.open(out) as gif:
        assert gif.format == "GIF" and gif.n_frames > 1
    assert outcome.frames == 1 + -(-record["steps"] // 10)  # the start, every 10th step, the last


def test_replay_command_with_the_default_renderer_checks_a_timed_out_episode(recorded, tmp_path):
    out = tmp_path / "episode-1.gif"
    done = subprocess.run([*REPLAY, recorded, "1", "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "the replay matches the recorded episode: 10 steps" in done.stdout
    assert "rendering [" in done.stderr and "step 10/10" in done.stderr  # the progress bar
    with Image.open(out) as gif:
        assert gif.format == "GIF"


def test_a_replay_that_does_not_match_its_record_says_so(recorded, tmp_path):
    copy = str(tmp_path / "results")
    shutil.copytree(recorded, copy)
    records = read_episodes(copy)
    records[0]["steps"] += 1
    records[0]["arrived"] = 99
    with open(os.path.join(copy, "episodes.jsonl"), "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(record) + "\n" for record in records)
    outcome = replay_to_gif(copy, 0, out=str(tmp_path / "x.gif"), renderer="PIL", every=1000)
    assert not outcome.matches
    assert any(m.startswith("steps: replayed") for m in outcome.mismatches)
    assert any(m.startswith("arrived: replayed") for m in outcome.mismatches)
    done = subprocess.run(
        [*REPLAY, copy, "0", "--out", str(tmp_path / "y.gif"), "--renderer", "PIL", "--every", "1000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "the replay does NOT match the recorded episode: steps: replayed" in done.stderr
    assert "rendered " in done.stdout and "matches" not in done.stdout


def test_the_replay_command_finds_the_format_of_a_killed_evaluation_in_its_events(recorded, tiny_tests, tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(recorded, copy)
    (copy / "summary.json").unlink()  # as a killed evaluation leaves it; events.jsonl says it is flatland's
    out = tmp_path / "episode-0.gif"
    done = subprocess.run(
        [*REPLAY, str(copy), "0", "--out", str(out), "--tests", tiny_tests, "--renderer", "PIL", "--every", "1000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "the replay matches the recorded episode" in done.stdout and out.is_file()


def test_replay_errors_are_clear(recorded, tmp_path):
    done = subprocess.run(
        [*REPLAY, recorded, "2", "--out", str(tmp_path / "x.gif")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "episode 2 was not recorded" in done.stderr and "recorded episodes: 0, 1" in done.stderr
    assert not (tmp_path / "x.gif").exists()
    with pytest.raises(ConfigError, match="does not exist"):
        replay_to_gif(str(tmp_path / "missing"), 0, out=str(tmp_path / "x.gif"))
    copy = str(tmp_path / "results")
    shutil.copytree(recorded, copy)
    os.remove(os.path.join(copy, "summary.json"))  # as a killed evaluation leaves it
    with pytest.raises(ConfigError, match="pass --tests DIR"):
        replay_to_gif(copy, 0, out=str(tmp_path / "x.gif"))
    with pytest.raises(ConfigError, match="not found"):
        replay_to_gif(copy, 0, out=str(tmp_path / "x.gif"), tests=str(tmp_path))


def test_replay_makes_the_missing_folders_of_out_as_report_does_and_names_a_file_in_the_way(recorded, tmp_path):
    out = tmp_path / "new" / "deeper" / "a.gif"
    done = subprocess.run(
        [*REPLAY, recorded, "0", "--out", str(out), "--renderer", "PIL", "--every", "1000"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert Image.open(out).format == "GIF"
    (tmp_path / "afile").write_text("kept", encoding="utf-8")
    in_the_way = subprocess.run(
        [*REPLAY, recorded, "0", "--out", str(tmp_path / "afile" / "a.gif")], capture_output=True, text=True, timeout=60
    )
    assert in_the_way.returncode == 2
    assert f"{str(tmp_path / 'afile')!r} is a file, not a folder" in in_the_way.stderr
    assert (tmp_path / "afile").read_text(encoding="utf-8") == "kept"
    # A refused replay leaves no folder behind.
    refused = subprocess.run([*REPLAY, recorded, "2", "--out", str(tmp_path / "not" / "x.gif")], capture_output=True)
    assert refused.returncode == 2 and not (tmp_path / "not").exists()


def test_record_episodes_in_the_competition_spec_and_on_the_command_line():
    assert spec_from_dict("c", {"record_episodes": 3}).record_episodes == 3
    for bad in (-1, True, "2"):
        with pytest.raises(ConfigError, match="record_episodes"):
            spec_from_dict("c", {"record_episodes": bad})
    assert resolve_spec(build_parser().parse_args(["serve", "--record", "5"])).record_episodes == 5
    assert resolve_spec(build_parser().parse_args(["serve"])).record_episodes == 0


def test_a_replay_of_another_formats_evaluation_says_replays_are_flatlands(tmp_path):
    (tmp_path / "summary.json").write_text('{"format": "two-phase", "state": "SUCCESS"}', encoding="utf-8")
    with pytest.raises(ConfigError, match="two-phase evaluation: replays exist for the flatland format only"):
        load_replay(str(tmp_path), 0)
