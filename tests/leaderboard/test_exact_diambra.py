"""The DIAMBRA board on real evaluations: agent scripts written as DIAMBRA's documentation writes
them, on diambra-arena's engine mock, each submission at the game and difficulty its submitter
chose, evaluated as a worker evaluates them. Every figure is derived here from episodes.jsonl by
the difficulty-weighted formula (docs/formats/diambra.md), every rank counted per game and every
achievement checked against its conditions here, never by server/leaderboard/."""

from __future__ import annotations

import math
import sys
import textwrap

import pytest
from real_results import (
    Scored,
    Submission,
    assert_no_debug,
    assert_rows,
    assert_unranked,
    competition_file,
    episodes,
    evaluate,
    expected_rows,
    preset_leaderboard,
    summary,
)

pytest.importorskip("diambra.arena")

from arbiter.server.core.competition import load_competition  # noqa: E402
from arbiter.server.leaderboard.board import build_board  # noqa: E402

NAME = "diambra-cup"
COLUMNS = {"score": "higher", "reward": "higher"}  # the preset's
# docs/formats/diambra.md: the Easy / Medium / Hard levels of the games played here.
LEVELS = {"doapp": {"easy": 2, "medium": 3, "hard": 4}, "sfiii3n": {"easy": 4, "medium": 6, "hard": 8}}
HEAD = """
format = "diambra"
scoring = "diambra"
seed = 1001
game = "doapp"
difficulty = "easy"
episodes = 1
frame_shape = [64, 64, 1]  # small frames: a small evaluation
step_ratio = 6
continue_game = 0.0
show_final = false

[budgets]
planning_s = 30
step_s = 5
overall_s = 300
idle_s = 30
max_successive_timeouts = 10
"""

# DIAMBRA's agent loop (reset on terminated or truncated, leave on env_done) pressing a fixed
# sequence of moves and attacks: the same buttons every run, so the same fight.
BUTTONS_AGENT = """
import sys

from arbiter.client.remote_env import RemoteEnv

stride = int(sys.argv[1])
env = RemoteEnv()
observation, info = env.reset()
step = 0
while True:
    move, attack = (step * stride) % 9, (step // stride) % 8 if stride else 0
    observation, reward, terminated, truncated, info = env.step([move, attack])
    step += 1
    if terminated or truncated:
        observation, info = env.reset()
        if info["env_done"]:
            break
"""


@pytest.fixture(scope="module")
def cup(tmp_path_factory, redis_server):
    """Eight submissions to two games: ann three times (doapp at Easy and at Hard, sfiii3n),
    ben, cat, dan, eve (an agent whose dependency is missing) and a debug run of ben's."""
    base = tmp_path_factory.mktemp("diambra")
    script = base / "agent.py"
    script.write_text(textwrap.dedent(BUTTONS_AGENT))
    broken = base / "broken_agent.py"
    broken.write_text("import a_package_the_image_lacks\n")

    def buttons(stride: int) -> list[str]:
        return [sys.executable, str(script), str(stride)]

    def at(game: str, difficulty: str) -> list[str]:
        return [f"game={game}", f"difficulty={difficulty}"]

    competition = competition_file(base / f"{NAME}.toml", HEAD, preset_leaderboard("diambra"))
    submissions = [
        Submission("ann-easy", "ann", 1, buttons(1), at("doapp", "easy")),
        Submission("ann-hard", "ann", 2, buttons(1), at("doapp", "hard")),
        Submission("ben", "ben", 3, buttons(0), at("doapp", "hard")),
        Submission("cat", "cat", 4, buttons(3), at("doapp", "easy")),
        Submission("ann-sf", "ann", 5, buttons(1), at("sfiii3n", "medium")),
        Submission("dan", "dan", 6, buttons(2), at("sfiii3n", "medium")),
        Submission("eve", "eve", 7, [sys.executable, str(broken)], at("doapp", "easy")),
        Submission("ben-debug", "ben", 8, buttons(1), at("doapp", "easy"), debug=True),
    ]
    root = base / "results"
    for submission in submissions:
        evaluate(competition, submission, root=root, tests=None, redis_url=redis_server.url)
    return load_competition(competition), root, {s.label: s for s in submissions}


def game_of(submission: Submission) -> str:
    return submission.settings[0].split("=", 1)[1]


def difficulty_of(submission: Submission) -> str:
    return submission.settings[1].split("=", 1)[1]


def own_figures(records: list[dict]) -> dict[str, float]:
    """Per episode, R × k(R) with k = 1 + (L_D / L_Easy − 1)(R − R_min)/(R_max − R_min), clipped to
    [1, L_D / L_Easy], the levels the docs give for the game and R's bounds as the env reported
    them; then the means of the scores and of R (fsum / n)."""
    scores, rewards = [], []
    for record in records:
        levels = LEVELS[record["game"]]
        ratio = levels[record["difficulty"]] / levels["easy"]
        low, high = record["bounds"]
        k = min(max(1 + (ratio - 1) * (record["reward"] - low) / (high - low), 1.0), ratio)
        scores.append(record["reward"] * k)
        rewards.append(record["reward"])
    return {"score": math.fsum(scores) / len(scores), "reward": math.fsum(rewards) / len(rewards)}


def scored(cup) -> dict[str, list[Scored]]:
    """The scored submissions, per game."""
    _, root, subs = cup
    found: dict[str, list[Scored]] = {}
    for s in subs.values():
        if not s.debug and s.label != "eve":
            found.setdefault(game_of(s), []).append(Scored(s, own_figures(episodes(root, NAME, s))))
    return found


def test_every_figure_is_the_one_derived_from_the_episodes_and_the_fight_said_how(cup):
    spec, root, subs = cup
    assert spec.leaderboard == load_competition("diambra").leaderboard  # the preset's table
    for entries in scored(cup).values():
        for entry in entries:
            recorded = summary(root, NAME, entry.submission)["leaderboard"]
            assert {f["name"]: f["value"] for f in recorded["figures"]} == entry.figures
            assert recorded["context"]["game"] == game_of(entry.submission)
            assert recorded["context"]["difficulty"] == difficulty_of(entry.submission)
            assert recorded["context"]["engine"] == "mock"
    doapp = [e.figures["score"] for e in scored(cup)["doapp"]]
    assert len(set(doapp)) == len(doapp)  # four fights, four scores


@pytest.mark.parametrize("policy", ["best", "latest"])
@pytest.mark.parametrize("ranking", ["lexicographic", "average-rank", "borda"])
def test_each_game_is_ranked_apart_as_counted(cup, ranking, policy):
    spec, root, subs = cup
    board = build_board(spec, str(root), ranking=ranking, policy=policy)
    assert board["per"] == "game"
    games = scored(cup)
    participants = {game: {e.participant for e in entries} for game, entries in games.items()}
    assert [r["group"] for r in board["rows"]] == [game for game in sorted(games) for _ in participants[game]]
    for game, entries in games.items():
        rows = [r for r in board["rows"] if r["group"] == game]
        assert_rows(rows, expected_rows(entries, COLUMNS, ranking, policy), COLUMNS)
        for row in rows:  # the difficulty the chosen submission played at, beside its figures
            chosen = next(e.submission for e in entries if e.submission.id == row["submission"])
            assert (row["context"]["game"], row["context"]["difficulty"]) == (game, difficulty_of(chosen))
            assert row["submissions"] == sum(1 for e in entries if e.participant == row["participant"])
    assert_unranked(board, [subs["eve"]])
    assert_no_debug(board, [subs["ben-debug"]])


def test_achievements_name_the_submission_that_first_met_their_conditions(cup):
    spec, root, subs = cup
    board = build_board(spec, str(root))
    assert [a["name"] for a in board["achievements"]] == ["First fight", "Ahead at Hard", "Thousand"]
    conditions = {
        "First fight": lambda entry, number: number == 0,  # the participant's first scored submission
        "Ahead at Hard": lambda entry, number: (
            difficulty_of(entry.submission) == "hard" and entry.figures["reward"] > 0
        ),
        "Thousand": lambda entry, number: entry.figures["score"] >= 1000,
    }
    unlocked_somewhere = set()
    for game, entries in scored(cup).items():
        for row in (r for r in board["rows"] if r["group"] == game):
            own = sorted((e for e in entries if e.participant == row["participant"]), key=lambda e: e.order)
            expected = []
            for name, holds in conditions.items():
                first = next((e for number, e in enumerate(own) if holds(e, number)), None)
                if first is not None:
                    expected.append({"name": name, "submission": first.submission.id})
                    unlocked_somewhere.add(name)
            assert row["achievements"] == expected, (game, row["participant"])
    # The fights here unlock each of them somewhere, so each condition was put to the test.
    assert unlocked_somewhere == set(conditions)
