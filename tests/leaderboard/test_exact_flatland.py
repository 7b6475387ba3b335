"""The Flatland board on real evaluations: starter-kit agents on a small generated test folder,
evaluated as a worker evaluates them, every figure derived here from episodes.jsonl by the
community's formulas (docs/formats/flatland.md) and every rank counted here, never by
server/leaderboard/. A board rebuilt from the records (--from-records) ranks the same figures."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
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


def scored(cup) -> list[Scored]:
    spec, root, subs, _ = cup
    return [
        Scored(s, neurips2020_figures(episodes(root, NAME, s)))
        for s in subs.values()
        if not s.debug and s.label != "carol"
    ]


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


def test_a_board_from_the_records_ranks_as_counted_and_diff_says_who_moved(cup, capsys):
    """Every figure recomputed from episodes.jsonl (--from-records, an audit that trusts no
    summary.json), under a changed table: the rows are the ones counted here, each figure the one
    `arbiter rescore` recomputes, and --diff says who moved since the board built before."""
    spec, root, subs, base = cup
    old = base / "old-leaderboard.json"
    assert main(["leaderboard", "--results-root", str(root), "--competition", str(base / f"{NAME}.toml"),
                 "--out", str(base / "old"), "--json"]) == 0  # fmt: skip
    old.write_text(capsys.readouterr().out)
    columns = {"arrived_fraction": "higher", "normalized_return": "higher"}  # arrivals first now
    changed = variant(cup, "arrivals-first", '[leaderboard]\ncolumns = ["arrived_fraction", "normalized_return"]\n')
    board = build_board(load_competition(changed), str(root), from_records=True)
    assert board["scoring"] == "neurips2020" and all(r["rescored"] for r in board["rows"])
    expected = expected_rows(scored(cup), columns, "lexicographic", "best")
    assert_rows(board["rows"], expected, columns)
    for row in board["rows"]:  # the figures `arbiter rescore` recomputes
        assert main(["rescore", str(root / row["results"]), "--json"]) == 0
        recomputed = json.loads(capsys.readouterr().out)["recomputed"]
        assert row["figures"]["normalized_return"]["value"] == recomputed["primary"]
        assert row["figures"]["arrived_fraction"]["value"] == recomputed["secondary"]
    assert_unranked(board, [subs["carol"]])
    assert_no_debug(board, [subs["alice-debug"]])

    assert main(["leaderboard", "--results-root", str(root), "--competition", changed, "--from-records",
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


def test_a_rule_of_another_reward_model_ranks_none_and_says_why(cup):
    """flatland3 scores the rewards of flatland's own reward model; these evaluations earned theirs
    under NeurIPS 2020's, which say nothing of what the other model would have paid."""
    _, root, subs, _ = cup
    spec = load_competition(variant(cup, "flatland3", '[leaderboard]\nscoring = "flatland3"\n'))
    board = build_board(spec, str(root))
    assert board["rows"] == []
    causes = {u["participant"] + "/" + u["submission"]: u["cause"] for u in board["unranked"]}
    scored_ones = [s for s in subs.values() if not s.debug and s.label != "carol"]
    assert sorted(causes) == sorted(f"{s.participant}/{s.id}" for s in [*scored_ones, subs["carol"]])
    for submission in scored_ones:
        assert (
            "reward was earned under flatland's 'neurips2020' reward model"
            in causes[f"{submission.participant}/{submission.id}"]
        )


def test_a_summary_that_says_otherwise_than_the_rule_or_damaged_records_leave_only_their_folder_apart(cup, tmp_path):
    """bob's summary.json edited to rank normalized_return lower-is-better (a valid direction, not
    the rule's); dave's episodes.jsonl damaged in its middle; alice's first one cut by an item.
    The board ranks the rest as before, with the rule's columns; --from-records reads records
    and refuses the damaged and the cut ones."""
    spec, root, subs, _ = cup
    copy = tmp_path / "results"
    shutil.copytree(root, copy)
    folder = {label: copy / NAME / subs[label].id for label in ("bob", "dave", "alice-random")}
    summary_file = folder["bob"] / "summary.json"
    edited = json.loads(summary_file.read_text())
    edited["leaderboard"]["figures"][0]["direction"] = "lower"
    summary_file.write_text(json.dumps(edited))
    dave = (folder["dave"] / "episodes.jsonl").read_text().splitlines(keepends=True)
    (folder["dave"] / "episodes.jsonl").write_text(dave[0] + "{damaged\n" + "".join(dave[2:]))
    alice = (folder["alice-random"] / "episodes.jsonl").read_text().splitlines(keepends=True)
    (folder["alice-random"] / "episodes.jsonl").write_text("".join(alice[:-1]))  # its last item gone whole

    board = build_board(spec, str(copy))
    assert [(c["name"], c["direction"]) for c in board["columns"]] == list(COLUMNS.items())
    causes = {u["participant"]: u["cause"] for u in board["unranked"]}
    assert "its summary.json gives the figure 'normalized_return'" in causes["bob"]
    assert "'lower'" in causes["bob"] and "'higher'" in causes["bob"]
    assert {r["participant"] for r in board["rows"]} == {"alice", "dave"}  # their summaries are intact

    audited = build_board(spec, str(copy), from_records=True)
    causes = {u["submission"]: u["cause"] for u in audited["unranked"]}
    assert "episodes.jsonl is damaged after its 1 whole items" in causes[subs["dave"].id]
    assert "episodes.jsonl holds 2 whole items, its summary.json 3" in causes[subs["alice-random"].id]
    # bob's records are intact: from them, his figures are the rule's; alice ranks by her other one
    assert {r["participant"] for r in audited["rows"]} == {"bob", "alice"}


def test_an_audit_lists_apart_the_folders_whose_records_and_summary_disagree(cup, tmp_path):
    """bob's summary.json edited to a better normalized return, dave's first record to a better
    reward. The board trusts each summary; --from-records recomputes both from their records and,
    since each disagrees with its own summary under the same rule, ranks neither: which of the
    two files is true the folder cannot say. alice, intact, ranks."""
    spec, root, subs, _ = cup
    copy = tmp_path / "results"
    shutil.copytree(root, copy)
    bob = copy / NAME / subs["bob"].id / "summary.json"
    edited = json.loads(bob.read_text())
    recorded = edited["leaderboard"]["figures"][0]["value"]
    edited["leaderboard"]["figures"][0]["value"] = 0.5
    bob.write_text(json.dumps(edited))
    dave = copy / NAME / subs["dave"].id / "episodes.jsonl"
    lines = dave.read_text().splitlines(keepends=True)
    first = json.loads(lines[0])
    first["reward"] = 0.0
    dave.write_text(json.dumps(first) + "\n" + "".join(lines[1:]))

    assert build_board(spec, str(copy))["rows"][0]["participant"] == "bob"  # his summary, as it says
    audited = build_board(spec, str(copy), from_records=True)
    assert [r["participant"] for r in audited["rows"]] == ["alice"]
    causes = {u["submission"]: u["cause"] for u in audited["unranked"]}
    assert "its episodes.jsonl and its summary.json disagree" in causes[subs["bob"].id]
    assert f"normalized_return {recorded!r} from the records, 0.5 in the summary" in causes[subs["bob"].id]
    assert "its episodes.jsonl and its summary.json disagree: normalized_return" in causes[subs["dave"].id]
    assert "arrived_fraction" not in causes[subs["dave"].id]  # the figures that agree are not named


def test_an_evaluation_under_another_seed_is_listed_apart(cup, tmp_path, redis_server, tiny_tests):
    """erin's local run chose its own seed (`arbiter run --seed 5`): its malfunctions and resets
    are not the ones everyone else played, so its figures do not compare; the board says so."""
    spec, root, subs, base = cup
    copy = tmp_path / "results"
    shutil.copytree(root, copy)
    erin = Submission("erin", "erin", 7, [sys.executable, str(paths.EXAMPLES / "random_agent.py")], ["seed=5"])
    evaluate(str(base / f"{NAME}.toml"), erin, root=copy, tests=tiny_tests, redis_url=redis_server.url)
    board = build_board(spec, str(copy))
    assert "erin" not in {r["participant"] for r in board["rows"]}
    [listed] = [u for u in board["unranked"] if u["submission"] == erin.id]
    assert (
        listed["cause"] == "evaluated under other conditions than the competition's: seed 5 (the competition's: 1001)"
    )
    assert board["rows"] == build_board(spec, str(root))["rows"]  # the others' board as before


def test_evaluations_on_another_test_set_are_listed_apart(cup, tmp_path, redis_server, tiny_tests):
    """frank's local run played a test folder of his own (generated with another seed): his
    figures do not compare. With no test folder in the competition file, the set most
    evaluations played is the board's; with one, the competition's is."""
    from arbiter.server.core.folder_digest import folder_digest, short
    from arbiter.server.formats.flatland.generate import generate_test_set

    spec, root, subs, base = cup
    copy = tmp_path / "results"
    shutil.copytree(root, copy)
    his = tmp_path / "his-tests"
    generate_test_set(his, preset="tiny", seed=2)
    theirs, own = folder_digest(tiny_tests), folder_digest(str(his))
    assert theirs != own
    frank = Submission("frank", "frank", 8, [sys.executable, str(paths.EXAMPLES / "random_agent.py")])
    evaluate(str(base / f"{NAME}.toml"), frank, root=copy, tests=str(his), redis_url=redis_server.url)
    assert json.loads((copy / NAME / frank.id / "summary.json").read_text())["tests_digest"] == own

    board = build_board(spec, str(copy))
    assert "frank" not in {r["participant"] for r in board["rows"]}
    [listed] = [u for u in board["unranked"] if u["submission"] == frank.id]
    assert listed["cause"] == (
        f"played another test set ({short(own)}) than most evaluations here ({short(theirs)}); "
        "the competition file's tests key names the competition's"
    )
    assert board["rows"] == build_board(spec, str(root))["rows"]

    # The competition names its test folder: that set is the board's, however many played another.
    named = dataclasses.replace(spec, tests=str(his))
    board = build_board(named, str(copy))
    assert [r["participant"] for r in board["rows"]] == ["frank"]
    [alice] = [u for u in board["unranked"] if u["submission"] == subs["alice-random"].id]
    assert alice["cause"] == (
        "evaluated under other conditions than the competition's: "
        f"test set {short(theirs)} (the competition's tests: {short(own)})"
    )
