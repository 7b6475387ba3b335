"""The Flatland board on real evaluations: starter-kit agents on a small generated test folder,
evaluated as a worker evaluates them, every figure derived here from episodes.jsonl by the
community's formulas (docs/formats/flatland.md) and every rank counted here, never by
server/leaderboard/. A changed rule ([leaderboard] scoring) rebuilds the board from the records."""

from __future__ import annotations

import json
import math
import sys
import textwrap

import paths
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

from arbiter.server.cli.main import main
from arbiter.server.core.competition import load_competition
from arbiter.server.leaderboard.board import build_board

NAME = "flatland-cup"  # the competition: its results are under RESULTS_ROOT/flatland-cup/
COLUMNS = {"normalized_return": "higher", "arrived_fraction": "higher"}  # the preset's
RESCORE_STATUS = 1  # `arbiter rescore` under another rule: its figures differ from the recorded ones
HEAD = """
format = "flatland"
scoring = "neurips2020"
seed = 1001
debug = false

[budgets]
planning_s = 30
step_s = 5
overall_s = 300
idle_s = 30
max_successive_timeouts = 10
"""

# The starter kit's loop with one action for every agent: 2 moves forward, 0 does nothing.
FIXED_ACTION_AGENT = """
import sys

from arbiter.client import RemoteClient

action = int(sys.argv[1])
client = RemoteClient()
while client.env_create()[0]:
    while not client.env_step({handle: action for handle in range(client.env.get_num_agents())})[2]["__all__"]:
        pass
client.submit()
"""


@pytest.fixture(scope="module")
def cup(tmp_path_factory, redis_server, tiny_tests):
    """Six submissions on the 3-episode test folder: alice twice (her better agent first), bob,
    carol (an agent whose dependency is missing), dave, and a debug run of alice's."""
    base = tmp_path_factory.mktemp("flatland")
    fixed = base / "fixed_action_agent.py"
    fixed.write_text(textwrap.dedent(FIXED_ACTION_AGENT))
    broken = base / "broken_agent.py"
    broken.write_text("import a_package_the_image_lacks\n")
    random_agent = [sys.executable, str(paths.EXAMPLES / "random_agent.py")]  # seeded: the same actions each run
    forward, idle = ([sys.executable, str(fixed), action] for action in ("2", "0"))
    competition = competition_file(base / f"{NAME}.toml", HEAD, preset_leaderboard("flatland-neurips2020"))
    submissions = [
        Submission("alice-random", "alice", 1, random_agent),
        Submission("bob", "bob", 2, forward),
        Submission("carol", "carol", 3, [sys.executable, str(broken)]),
        Submission("dave", "dave", 4, idle),
        Submission("alice-idle", "alice", 5, idle),
        Submission("alice-debug", "alice", 6, forward, debug=True),
    ]
    root = base / "results"
    for submission in submissions:
        evaluate(competition, submission, root=root, tests=tiny_tests, redis_url=redis_server.url)
    return load_competition(competition), root, {s.label: s for s in submissions}, base


def finished(record: dict) -> bool:
    return not (record["timed_out"] or record["abandoned"] or record["skipped"])


def neurips2020_figures(records: list[dict]) -> dict[str, float]:
    """Per episode: normalized return = reward / (max_episode_steps × agents), −1 when it did not
    finish; arrived fraction = arrived / agents. Over the episodes: the means, and round 2's sum
    of (normalized return + 1). Sums are math.fsum: correctly rounded, in any order."""
    returns = [r["reward"] / (r["max_episode_steps"] * r["num_agents"]) if finished(r) else -1.0 for r in records]
    arrived = [r["arrived"] / r["num_agents"] for r in records]
    return {
        "normalized_return": math.fsum(returns) / len(returns),
        "arrived_fraction": math.fsum(arrived) / len(arrived),
        "round2_score": math.fsum(value + 1.0 for value in returns),
    }


def flatland3_figures(records: list[dict]) -> dict[str, float]:
    """flatland-rl's own rule on the same records: a finished episode scores its normalized
    reward + 1, an unfinished one 0 (its arrived fraction too); the sum, then the mean arrived."""
    returns = [r["reward"] / (r["max_episode_steps"] * r["num_agents"]) + 1.0 if finished(r) else 0.0 for r in records]
    arrived = [r["arrived"] / r["num_agents"] if finished(r) else 0.0 for r in records]
    return {"normalized_return": math.fsum(returns), "arrived_fraction": math.fsum(arrived) / len(arrived)}


def scored(cup, figures=neurips2020_figures) -> list[Scored]:
    spec, root, subs, _ = cup
    return [Scored(s, figures(episodes(root, NAME, s))) for s in subs.values() if not s.debug and s.label != "carol"]


def variant(cup, folder: str, leaderboard: str) -> str:
    """The competition file with another [leaderboard] table: the same name (so the same results
    folders), in a folder of its own."""
    _, _, _, base = cup
    (base / folder).mkdir(exist_ok=True)
    return competition_file(base / folder / f"{NAME}.toml", HEAD, leaderboard)


def test_every_figure_is_the_one_derived_from_the_episodes(cup):
    spec, root, subs, _ = cup
    assert spec.leaderboard == load_competition("flatland-neurips2020").leaderboard  # the preset's table
    found = {s.submission.label: s.figures for s in scored(cup)}
    for label, figures in found.items():
        recorded = summary(root, NAME, subs[label])["leaderboard"]["figures"]
        assert {f["name"]: f["value"] for f in recorded} == figures
    assert len({f["normalized_return"] for f in found.values()}) == 3  # three agents, three scores
    assert found["dave"] == found["alice-idle"]  # the same agent on the same episodes


def test_the_presets_board_ranks_lexicographically_as_counted(cup):
    spec, root, subs, _ = cup
    board = build_board(spec, str(root))
    assert (board["ranking"], board["policy"], board["scoring"]) == ("lexicographic", "best", "neurips2020")
    assert [(c["name"], c["direction"]) for c in board["columns"]] == list(COLUMNS.items())
    assert_rows(board["rows"], expected_rows(scored(cup), COLUMNS, "lexicographic", "best"), COLUMNS)
    assert {r["participant"]: r["submissions"] for r in board["rows"]} == {"alice": 2, "bob": 1, "dave": 1}
    assert all(r["not_separable_from"] == [] for r in board["rows"])  # 3 episodes: too few for an interval
    assert_unranked(board, [subs["carol"]])
    assert_no_debug(board, [subs["alice-debug"]])


@pytest.mark.parametrize("policy", ["best", "latest"])
@pytest.mark.parametrize("ranking", ["lexicographic", "average-rank", "borda"])
def test_every_ranking_and_policy_orders_as_counted(cup, ranking, policy):
    spec, root, subs, _ = cup
    board = build_board(spec, str(root), ranking=ranking, policy=policy)
    assert_rows(board["rows"], expected_rows(scored(cup), COLUMNS, ranking, policy), COLUMNS)
    assert_unranked(board, [subs["carol"]])
    assert_no_debug(board, [subs["alice-debug"]])


def test_round_twos_sum_is_a_column_a_competition_can_rank_by(cup):
    _, root, subs, _ = cup
    spec = load_competition(variant(cup, "round2", '[leaderboard]\ncolumns = ["round2_score", "arrived_fraction"]\n'))
    columns = {"round2_score": "higher", "arrived_fraction": "higher"}
    board = build_board(spec, str(root))
    assert [c["name"] for c in board["columns"]] == list(columns)
    assert_rows(board["rows"], expected_rows(scored(cup), columns, "lexicographic", "best"), columns)
    for row in board["rows"]:  # the sum of n episodes' (return + 1) is n × (mean + 1), but for rounding
        assert row["figures"]["round2_score"]["value"] == pytest.approx(
            3 * (row["figures"]["normalized_return"]["value"] + 1), abs=1e-12
        )
    assert_no_debug(board, [subs["alice-debug"]])


def test_another_rule_rebuilds_the_board_from_the_records_and_diff_says_who_moved(cup, capsys):
    spec, root, subs, base = cup
    old = base / "old-leaderboard.json"
    assert main(["leaderboard", "--results-root", str(root), "--competition", str(base / f"{NAME}.toml"),
                 "--out", str(base / "old"), "--json"]) == 0  # fmt: skip
    old.write_text(capsys.readouterr().out)
    rescored_file = variant(cup, "flatland3", '[leaderboard]\ncolumns = ["normalized_return", "arrived_fraction"]\n'
                            'scoring = "flatland3"\n')  # fmt: skip
    board = build_board(load_competition(rescored_file), str(root))
    assert board["scoring"] == "flatland3" and all(r["rescored"] for r in board["rows"])
    expected = expected_rows(scored(cup, flatland3_figures), COLUMNS, "lexicographic", "best")
    assert_rows(board["rows"], expected, COLUMNS)
    for row in board["rows"]:  # the figures `arbiter rescore --scoring flatland3` recomputes
        assert main(["rescore", str(root / row["results"]), "--scoring", "flatland3", "--json"]) == RESCORE_STATUS
        recomputed = json.loads(capsys.readouterr().out)["recomputed"]
        assert row["figures"]["normalized_return"]["value"] == recomputed["primary"]
        assert row["figures"]["arrived_fraction"]["value"] == recomputed["secondary"]
    assert_unranked(board, [subs["carol"]])
    assert_no_debug(board, [subs["alice-debug"]])

    assert main(["leaderboard", "--results-root", str(root), "--competition", rescored_file,
                 "--out", str(base / "new"), "--diff", str(old)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    was = {r.entry.participant: r.rank for r in expected_rows(scored(cup), COLUMNS, "lexicographic", "best")}
    assert was == {r["participant"]: r["rank"] for r in json.loads(old.read_text())["rows"]}
    moved = []
    for row in expected:
        before = was[row.entry.participant]
        if before != row.rank:
            way = "up" if row.rank < before else "down"
            moved.append(f"  {row.entry.participant}: {before} → {row.rank} ({way} {abs(before - row.rank)})")
    tail = printed.split(f"since {old}:", 1)[1].splitlines()
    assert tail == ([""] + moved if moved else [" nobody moved"])
