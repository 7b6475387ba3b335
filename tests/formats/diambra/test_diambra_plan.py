"""The DIAMBRA format's plan and rule, driven item by item as the evaluator drives them
(open → create_payload → sanitize / step / step_reply → records), on diambra-arena's engine mock.

The recompute tests score every episode again from its JSON record alone, with this file's own
arithmetic (docs/formats/diambra.md), never with the format's scoring code.
"""

from __future__ import annotations

import json
import math
import os
import tomllib

import pytest

pytest.importorskip("diambra.arena")

from diambra_items import SMALL, button, make_plan, make_spec, own_score, play_item  # noqa: E402

from arbiter.protocol import codec  # noqa: E402
from arbiter.protocol.errors import ConfigError, EvaluationError, OutOfOrder  # noqa: E402
from arbiter.protocol.messages import EXTENSION_KEY  # noqa: E402
from arbiter.protocol.spaces import space_from_wire  # noqa: E402
from arbiter.server.formats import get_format  # noqa: E402
from arbiter.server.formats.base import options_from_dict  # noqa: E402
from arbiter.server.formats.diambra import FORMAT  # noqa: E402
from arbiter.server.formats.diambra.env import episode_seed  # noqa: E402
from arbiter.server.formats.diambra.local import LocalEvaluation  # noqa: E402
from arbiter.server.formats.diambra.plan import TRACE_POINTS, RewardTrace  # noqa: E402
from arbiter.server.formats.diambra.settings import DiambraSettings  # noqa: E402

# -- the format as the registry knows it ---------------------------------------------------------


def test_the_registry_finds_the_format_and_the_preset_loads():
    assert get_format("diambra") is FORMAT
    assert FORMAT.default_rule == "diambra" and FORMAT.options is DiambraSettings
    with open(os.path.join(FORMAT.presets_dir, "diambra.toml"), "rb") as handle:
        preset = tomllib.load(handle)
    assert preset["format"] == "diambra" and preset["scoring"] in FORMAT.rules
    core = {
        "format",
        "scoring",
        "tests",
        "seed",
        "debug",
        "max_episodes",
        "record_episodes",
        "accept_pickle",
        "budgets",
        "leaderboard",
    }
    own = {k: v for k, v in preset.items() if k not in core}
    options = options_from_dict(DiambraSettings, own, "diambra.toml")
    assert (options.game, options.difficulty, options.episodes) == ("doapp", "easy", 1)
    # what `--set game=sfiii3n --set difficulty=hard` gives
    options = options_from_dict(DiambraSettings, {**own, "game": "sfiii3n", "difficulty": "hard"}, "--set")
    assert options.level == 8
    with pytest.raises(ConfigError, match="difficulty"):
        options_from_dict(DiambraSettings, {**own, "difficulty": "nightmare"}, "--set")
    with pytest.raises(ConfigError, match="unknown keys"):
        options_from_dict(DiambraSettings, {**own, "frameshape": [64, 64, 1]}, "--set")


# -- the plan played item by item ----------------------------------------------------------------


def test_two_episodes_with_seeds_engine_mock_and_env_done_on_the_last_step():
    spec = make_spec(seed=77, game="doapp", difficulty="hard", episodes=2)
    plan = make_plan(spec)
    try:
        assert [item.unit for item in plan.items] == ["episode/0", "episode/1"]
        assert "engine: mock" in plan.source and "doapp" in plan.source and "level 4" in plan.source
        shake = plan.handshake()
        assert shake["engine"] == "mock" and shake["level"] == 4 and shake["episodes"] == 2
        assert shake["bounds"] == [-1872.0, 3328.0] and shake["bounds_source"] == "env"
        observation_space = space_from_wire(
            codec.decode(codec.encode(shake["spaces"]["observation"]), codec.REPLY_LIMITS)
        )
        action_space = space_from_wire(codec.decode(codec.encode(shake["spaces"]["action"]), codec.REPLY_LIMITS))
        assert observation_space == plan.env.observation_space and action_space == plan.env.action_space
        records = []
        for item in plan.items:
            opened, payload, replies = play_item(plan, item)
            ext = payload[EXTENSION_KEY]
            assert ext["engine"] == "mock" and ext["episode"] == item.index
            assert "seed" not in ext and "random_seed" not in payload  # secret while the episode runs
            assert payload["info"]["env_done"] is False
            assert observation_space.contains(payload["observation"])
            last = replies[-1]
            assert last["done"] and last[EXTENSION_KEY]["stage_over"] and last["step"] == len(replies)
            assert last[EXTENSION_KEY]["seed"] == episode_seed(77, item.index)  # named once it has ended
            assert not any("seed" in r[EXTENSION_KEY] for r in replies[:-1])
            assert last["info"]["env_done"] is (item.index == 1)
            assert not any(r["info"]["env_done"] for r in replies[:-1])
            # a step reply crosses the wire whole: DIAMBRA's own observation dict, frame and RAM states
            wired = codec.decode(codec.encode(last), codec.REPLY_LIMITS)
            assert observation_space.contains(wired["observation"])
            assert (wired["observation"]["frame"] == last["observation"]["frame"]).all()
            records += opened.records(finished=True, timeout=None, abandoned=False)
            opened.close()
    finally:
        plan.close()
    assert [r["episode"] for r in records] == [0, 1]
    assert all(r["engine"] == "mock" and r["finished"] and r["ended"] == "finished" for r in records)
    assert all(r["game"] == "doapp" and r["difficulty"] == "hard" and r["level"] == 4 for r in records)
    assert all(r["settings"]["frame_shape"] == SMALL and r["drawn"]["characters"] for r in records)
    # the trace ends at the episode's R, after its last step
    assert all(r["reward_trace"][-1] == [r["steps"], r["reward"]] for r in records)


def test_the_server_plays_the_seeds_an_in_process_evaluation_plays():
    spec = make_spec(seed=5, game="umk3", difficulty="medium", episodes=2)
    plan = make_plan(spec)
    try:
        served = []
        for item in plan.items:
            opened, _, _ = play_item(plan, item)
            served += opened.records(finished=True, timeout=None, abandoned=False)
    finally:
        plan.close()
    local = LocalEvaluation(spec.options, seed=5)
    try:
        local.reset()
        step = 0
        while True:
            _, _, terminated, truncated, _ = local.step(button(step))
            step += 1
            if terminated or truncated:
                step = 0
                _, info = local.reset()
                if info["env_done"]:
                    break
    finally:
        local.close()
    keys = ("seed", "reward", "steps", "drawn", "score", "k")
    assert [{k: r[k] for k in keys} for r in served] == [{k: r[k] for k in keys} for r in local.records]


def test_max_episodes_caps_the_plan():
    plan = make_plan(make_spec(episodes=5, max_episodes=2))
    try:
        assert len(plan.items) == 2 and plan.handshake()["episodes"] == 2
    finally:
        plan.close()


# -- scores recomputed from the records alone ----------------------------------------------------


@pytest.mark.parametrize("game,difficulty", [("doapp", "hard"), ("sfiii3n", "medium"), ("kof98umh", "easy")])
def test_scores_recompute_from_the_records_alone(game, difficulty):
    spec = make_spec(seed=3, game=game, difficulty=difficulty, episodes=3)
    plan = make_plan(spec)
    rule = FORMAT.rules["diambra"](spec.options)
    try:
        records = []
        for i, item in enumerate(plan.items):
            if i == 1:  # the middle episode times out after 7 steps
                opened, _, _ = play_item(plan, item, stop_after=7)
                records += opened.records(finished=False, timeout="step", abandoned=False)
            else:
                opened, _, _ = play_item(plan, item)
                records += opened.records(finished=True, timeout=None, abandoned=False)
    finally:
        plan.close()
    offline = [json.loads(line) for line in "\n".join(json.dumps(r) for r in records).splitlines()]
    scores = [own_score(r)[1] for r in offline]
    rewards = [r["reward"] for r in offline]
    summary = rule.aggregate(offline)
    assert summary["primary"] == pytest.approx(math.fsum(scores) / 3, abs=1e-9)
    assert summary["secondary"] == pytest.approx(math.fsum(rewards) / 3, abs=1e-9)
    assert rule.primary(offline) == pytest.approx(summary["primary"], abs=1e-9)
    assert [e["score"] for e in summary["per_episode"]] == pytest.approx(scores, abs=1e-9)
    assert [e["k"] for e in summary["per_episode"]] == pytest.approx([own_score(r)[0] for r in offline], abs=1e-12)
    assert summary["engine"] == "mock" and "DiambraEngineMock" in summary["engine_note"]
    assert summary["spread"]["primary"]["n"] == 3
    timed_out = offline[1]
    assert timed_out["reward"] == timed_out["bounds"][0] and timed_out["ended"] == "step_timeout"
    assert own_score(timed_out) == (1.0, timed_out["bounds"][0])


def test_the_worked_example_recomputes_with_this_files_arithmetic():
    """docs/formats/diambra.md: doapp, R = 1000, bounds [−1872, 3328]: Hard 1552.3, Medium 1276.2, Easy 1000."""
    base = {"game": "doapp", "reward": 1000.0, "bounds": [-1872.0, 3328.0]}
    assert round(own_score({**base, "difficulty": "hard"})[1], 1) == 1552.3
    assert round(own_score({**base, "difficulty": "medium"})[1], 1) == 1276.2
    assert own_score({**base, "difficulty": "easy"}) == (1.0, 1000.0)
    rule = FORMAT.rules["diambra"](None)
    for difficulty, level, expected in (("hard", 4, 1552.3), ("medium", 3, 1276.2)):
        record = {**base, "difficulty": difficulty, "level": level, "easy_level": 2, "engine": "mock"}
        assert round(rule.aggregate([record])["primary"], 1) == expected


# -- endings, invalid actions --------------------------------------------------------------------


@pytest.mark.parametrize(
    "ending,expected",
    [
        ({"timeout": "step", "abandoned": False}, "step_timeout"),
        ({"timeout": "planning", "abandoned": False}, "planning_timeout"),
        ({"timeout": None, "abandoned": True}, "abandoned"),
        # cut short with no timeout and not by the agent: the core has one word for it
        ({"timeout": None, "abandoned": False}, "abandoned"),
    ],
)
def test_an_unfinished_episode_scores_the_lowest_reward(ending, expected):
    plan = make_plan(make_spec(game="doapp", difficulty="hard"))
    try:
        # an agent that only attacks collects reward early; leaving must not lock it in
        opened, _, replies = play_item(plan, plan.items[0], actions=lambda s: [0, 1 + s % 7], stop_after=60)
        collected = sum(r["reward"] for r in replies)
        record = opened.records(finished=False, **ending)[0]
    finally:
        plan.close()
    assert record["reward"] == -1872.0 and record["k"] == 1.0 and record["score"] == -1872.0
    assert record["partial_reward"] == collected and record["steps"] == 60 and not record["finished"]
    assert record["ended"] == expected and record["abandoned"] is (ending["timeout"] is None)


def test_an_unplayed_episode_scores_the_lowest_reward_with_its_planned_seed():
    plan = make_plan(make_spec(seed=9, episodes=2))
    try:
        record = plan.unplayed(plan.items[1])[0]
        row = plan.csv_row(record)
    finally:
        plan.close()
    assert record["reward"] == record["bounds"][0] == record["score"] and not record["played"]
    assert record["seed"] == episode_seed(9, 1) and record["ended"] == "not_played"
    assert row["ended"] == "not_played" and row["engine"] == "mock" and set(row) == set(plan.csv_columns)


def test_invalid_actions_become_the_no_op_and_are_counted():
    plan = make_plan(make_spec())
    try:
        opened = plan.open(plan.items[0])
        no_op = plan.env.no_op_action()
        bad = ("uppercut", [99, 0], [0, -1], None, [1.5, 0], {"move": 1}, [0, 0, 0], float("nan"), 2**80)
        for action in bad:
            clean, invalid = opened.sanitize(action)
            assert (clean, invalid) == (no_op, 1)
            opened.step(clean)
            reply = opened.step_reply(invalid)
            assert reply["invalid_actions"] == 1 and reply["info"]["invalid_action"] is True
        clean, invalid = opened.sanitize([3, 2])
        assert (clean, invalid) == ([3, 2], 0)
        opened.step(clean)
        assert opened.step_reply(invalid)["info"]["invalid_action"] is False
        record = opened.records(finished=False, timeout="step", abandoned=False)[0]
    finally:
        plan.close()
    assert record["invalid_actions"] == len(bad)


def test_a_step_after_the_episode_ended_is_refused():
    plan = make_plan(make_spec())
    try:
        opened, _, _ = play_item(plan, plan.items[0])
        with pytest.raises(OutOfOrder):
            opened.step([0, 0])
    finally:
        plan.close()


def test_diambra_envs_names_a_real_engine_and_none_answering_is_an_error():
    spec = make_spec(engine_timeout_s=1)
    with pytest.raises(EvaluationError, match="no DIAMBRA engine answered at 127.0.0.1:9"):
        FORMAT.make_plan(spec, None, tests=None, environ={"DIAMBRA_ENVS": "127.0.0.1:9"})


def test_the_reward_trace_stays_small_and_ends_exact():
    trace = RewardTrace()
    total = 0.0
    for step in range(1, 100_001):
        reward = 1.0 if step % 3 else -2.0
        total += reward
        trace.add(step, total, reward, round_done=step % 5000 == 0)
    kept = trace.as_record(100_000, total)
    assert len(kept["reward_trace"]) < 2 * TRACE_POINTS + 1
    assert kept["reward_trace"][0] == [0, 0.0] and kept["reward_trace"][-1] == [100_000, total]
    steps = [s for s, _ in kept["reward_trace"]]
    # spread evenly: no gap much wider than the steps shared out over the points kept
    assert (
        steps == sorted(steps)
        and max(b - a for a, b in zip(steps, steps[1:], strict=False)) <= 4 * 100_000 / TRACE_POINTS
    )
    assert kept["round_ends"] == list(range(5000, 100_001, 5000))
