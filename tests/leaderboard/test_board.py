"""The board's rankings, policies, ties, intervals, baselines and achievements, on results folders
written by hand, each rank recomputed here by counting, independently of the ranking code."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path

import pytest
from board_folders import TWO_PHASE_FIGURES, competition_file, write_folder

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.competition import load_competition
from arbiter.server.leaderboard.board import build_board

COLUMNS = ("phase1", "convergence", "eval")


def better(a: float, b: float, column: str) -> bool:
    return a < b if TWO_PHASE_FIGURES[column] == "lower" else a > b


def expected_order(subs: list[dict], ranking: str) -> list[dict]:
    """The ranking, by counting: how many entries beat each one in each column."""
    n = len(subs)

    def column_rank(s: dict, column: str, shared: str) -> Fraction:
        beaten_by = sum(1 for o in subs if better(o["figures"][column], s["figures"][column], column))
        equal = sum(1 for o in subs if o["figures"][column] == s["figures"][column])  # itself included
        return Fraction(2 * beaten_by + 1 + equal, 2) if shared == "mean" else Fraction(beaten_by + 1)

    def key(s: dict) -> tuple:
        if ranking == "lexicographic":
            return tuple(-s["figures"][c] if TWO_PHASE_FIGURES[c] == "higher" else s["figures"][c] for c in COLUMNS)
        if ranking == "average-rank":
            return (sum(column_rank(s, c, "mean") for c in COLUMNS) / len(COLUMNS),)
        return (-sum(n - column_rank(s, c, "best") for c in COLUMNS),)

    return sorted(subs, key=lambda s: (key(s), s["minutes"]))


def expected_board(subs: list[dict], ranking: str, policy: str) -> list[str]:
    if policy == "latest":
        chosen = {}
        for s in sorted(subs, key=lambda s: s["minutes"]):
            chosen[s["participant"]] = s
    else:
        chosen = {}
        for s in expected_order(subs, ranking):
            chosen.setdefault(s["participant"], s)
    return [s["submission"] for s in expected_order(list(chosen.values()), ranking)]


@pytest.fixture
def many(tmp_path: Path) -> tuple[Path, list[dict]]:
    """Twelve participants, one to three submissions each, figures from small sets (ties happen)."""
    rng = random.Random(7)
    subs = []
    minutes = 0
    for p in range(12):
        for k in range(rng.randint(1, 3)):
            minutes += rng.randint(1, 30)
            figures = {
                "phase1": float(rng.choice([100, 200, 300, 500])),
                "convergence": float(rng.choice([1000, 5000, 9000])),
                "eval": float(rng.choice([200, 400, 500])),
            }
            sub = {"participant": f"p{p:02d}", "submission": f"sub-{p:02d}-{k}", "figures": figures, "minutes": minutes}
            write_folder(tmp_path, "cup", sub["submission"], sub["participant"], figures, minutes=minutes)
            subs.append(sub)
    return tmp_path, subs


@pytest.mark.parametrize("policy", ["best", "latest"])
@pytest.mark.parametrize("ranking", ["lexicographic", "average-rank", "borda"])
def test_every_ranking_and_policy_orders_as_counted(many, tmp_path, ranking, policy):
    root, subs = many
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", f"[leaderboard]\ncolumns = {list(COLUMNS)}")))
    board = build_board(spec, str(root), ranking=ranking, policy=policy)
    assert [row["submission"] for row in board["rows"]] == expected_board(subs, ranking, policy)
    assert [row["rank"] for row in board["rows"]] == list(range(1, 13))
    assert {row["participant"] for row in board["rows"]} == {f"p{p:02d}" for p in range(12)}
    counts = {s["participant"]: sum(1 for o in subs if o["participant"] == s["participant"]) for s in subs}
    assert all(row["submissions"] == counts[row["participant"]] for row in board["rows"])


def test_average_rank_shares_the_mean_place_and_borda_the_best(tmp_path):
    spec = load_competition(
        str(competition_file(tmp_path / "cup.toml", '[leaderboard]\ncolumns = ["phase1", "convergence"]'))
    )
    # a and b tie on phase1 (places 1-2), c last; convergence (lower better): c, a, b.
    for name, phase1, convergence, minutes in (("a", 500, 2000, 1), ("b", 500, 3000, 2), ("c", 100, 1000, 3)):
        figures = {"phase1": phase1, "convergence": convergence}
        write_folder(tmp_path, "cup", f"sub-{name}", name, figures, minutes=minutes)
    average = build_board(spec, str(tmp_path), ranking="average-rank")
    assert [(r["participant"], r["rank_score"]) for r in average["rows"]] == [("a", 1.75), ("c", 2.0), ("b", 2.25)]
    borda = build_board(spec, str(tmp_path), ranking="borda")
    # points: a = (3-1) + (3-2) = 3; b = 2 + 0 = 2; c = 0 + 2 = 2; b and c tie: b submitted first.
    assert [(r["participant"], r["rank_score"]) for r in borda["rows"]] == [("a", 3), ("b", 2), ("c", 2)]
    assert [r["tie_broken_by_time"] for r in borda["rows"]] == [False, True, True]
    assert borda["rows"][1]["tied_with"] == ["c"]


def test_a_tie_on_every_column_is_placed_by_the_earlier_submission_and_said(tmp_path):
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", '[leaderboard]\ncolumns = ["phase1"]')))
    write_folder(tmp_path, "cup", "sub-late", "late", {"phase1": 300.0}, minutes=50)
    write_folder(tmp_path, "cup", "sub-early", "early", {"phase1": 300.0}, minutes=10)
    write_folder(tmp_path, "cup", "sub-best", "best", {"phase1": 400.0}, minutes=90)
    rows = build_board(spec, str(tmp_path))["rows"]
    assert [(r["participant"], r["tie_broken_by_time"], r["tied_with"]) for r in rows] == [
        ("best", False, []),
        ("early", True, ["late"]),
        ("late", True, ["early"]),
    ]


def test_neighbours_whose_intervals_overlap_are_not_separable(tmp_path):
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", '[leaderboard]\ncolumns = ["phase1"]')))
    intervals = {"a": [480, 520], "b": [470, 490], "c": [300, 350], "d": [100, 120]}
    values = {"a": 500.0, "b": 480.0, "c": 320.0, "d": 110.0}
    for minutes, name in enumerate("abcd"):
        write_folder(tmp_path, "cup", f"sub-{name}", name, {"phase1": values[name]}, minutes=minutes,
                     intervals={"phase1": intervals[name]})  # fmt: skip
    write_folder(tmp_path, "cup", "sub-e", "e", {"phase1": 50.0}, minutes=9)  # no interval: never marked
    rows = {r["participant"]: r["not_separable_from"] for r in build_board(spec, str(tmp_path))["rows"]}
    assert rows == {"a": ["b"], "b": ["a"], "c": [], "d": [], "e": []}


def test_failed_and_unscored_are_listed_apart_and_debug_never_appears(tmp_path):
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", '[leaderboard]\ncolumns = ["phase1", "eval"]')))
    write_folder(tmp_path, "cup", "sub-ok", "ok", {"phase1": 300.0, "eval": 400.0}, minutes=1)
    write_folder(tmp_path, "cup", "sub-failed", "failed", {}, minutes=2, state="INTERRUPTED")
    write_folder(tmp_path, "cup", "sub-half", "half", {"phase1": 500.0, "eval": None}, minutes=3)
    write_folder(tmp_path, "cup", "sub-running", "runner", {}, minutes=5, state="RUNNING")
    write_folder(tmp_path, "cup", "sub-debug", "debugger", {"phase1": 999.0, "eval": 999.0}, minutes=4, debug=True)
    (tmp_path / "cup" / "not-results").mkdir()  # a folder without summary.json is not a submission
    board = build_board(spec, str(tmp_path))
    assert [r["participant"] for r in board["rows"]] == ["ok"]
    unranked = {u["participant"]: u for u in board["unranked"]}
    assert set(unranked) == {"failed", "half", "runner"}
    assert unranked["runner"]["cause"] == "the evaluation has not ended yet"
    assert unranked["failed"]["state"] == "INTERRUPTED" and "handshake" in unranked["failed"]["cause"]
    assert "no eval figure" in unranked["half"]["cause"]
    assert board["counts"] == {
        "folders": 5,
        "ranked": 1,
        "unranked": 3,
        "debug_left_out": 1,
        "other_phases": 0,
        "baselines": 0,
    }
    assert "debugger" not in str(board["rows"]) + str(board["unranked"])


def test_baselines_are_placed_where_they_would_rank_without_a_rank(tmp_path):
    baselines = tmp_path / "baselines"
    write_folder(baselines, "refs", "random", "random agent", {"phase1": 250.0}, minutes=0)
    write_folder(baselines, "refs", "oracle", "oracle", {"phase1": 900.0}, minutes=0)
    write_folder(baselines, "refs", "nothing", "nothing", {"phase1": 0.0}, minutes=0)
    table = (
        '[leaderboard]\ncolumns = ["phase1"]\nbaselines = ['
        f'{{ name = "random", results = "{baselines / "refs" / "random"}" }}, '
        '{ name = "oracle", results = "../baselines/refs/oracle" }, '
        f'{{ name = "nothing", results = "{baselines / "refs" / "nothing"}" }}]'
    )
    results = tmp_path / "results"
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", table)))
    for minutes, (name, value) in enumerate((("a", 400.0), ("b", 300.0), ("c", 200.0))):
        write_folder(results, "cup", f"sub-{name}", name, {"phase1": value}, minutes=minutes)
    board = build_board(spec, str(results))
    placed = {b["name"]: b["shown_before_rank"] for b in board["baselines"]}
    assert placed == {"random": 3, "oracle": 1, "nothing": None}
    assert [r["rank"] for r in board["rows"]] == [1, 2, 3]


def test_achievements_name_the_earliest_submission_that_unlocked_each(tmp_path):
    table = """[leaderboard]
columns = ["phase1"]

[[leaderboard.achievements]]
name = "First steps"
first = true

[[leaderboard.achievements]]
name = "Five hundred"
when = ["phase1 >= 500"]

[[leaderboard.achievements]]
name = "Fast learner"
description = "converged within 2,000 steps on CartPole"
when = ["convergence < 2000", "env == 'CartPole-v1'"]
"""
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", table)))
    cartpole = {"env": "CartPole-v1"}
    write_folder(tmp_path, "cup", "a1", "a", {"phase1": 100.0, "convergence": 1500.0}, minutes=1, context=cartpole)
    write_folder(tmp_path, "cup", "a2", "a", {"phase1": 500.0, "convergence": 1000.0}, minutes=2, context=cartpole)
    write_folder(tmp_path, "cup", "a3", "a", {"phase1": 600.0, "convergence": 900.0}, minutes=3, context=cartpole)
    write_folder(tmp_path, "cup", "b0", "b", {}, minutes=0, state="INTERRUPTED")  # unscored: unlocks nothing
    write_folder(tmp_path, "cup", "b1", "b", {"phase1": 499.0, "convergence": 1000.0}, minutes=4)  # no env
    rows = {r["participant"]: r["achievements"] for r in build_board(spec, str(tmp_path))["rows"]}
    assert rows["a"] == [
        {"name": "First steps", "submission": "a1"},
        {"name": "Five hundred", "submission": "a2"},
        {"name": "Fast learner", "submission": "a1"},
    ]
    assert rows["b"] == [{"name": "First steps", "submission": "b1"}]


def test_a_hidden_phase_needs_reveal_and_mixed_phases_need_a_choice(tmp_path):
    table = '[leaderboard]\ncolumns = ["phase1"]\nhidden_phases = ["final"]'
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", table)))
    write_folder(tmp_path, "cup", "dev-a", "a", {"phase1": 100.0}, minutes=1, phase="dev")
    write_folder(tmp_path, "cup", "final-a", "a", {"phase1": 300.0}, minutes=2, phase="final")
    with pytest.raises(ConfigError, match="choose one with --phase"):
        build_board(spec, str(tmp_path))
    assert [r["submission"] for r in build_board(spec, str(tmp_path), phase="dev")["rows"]] == ["dev-a"]
    with pytest.raises(ConfigError, match="hidden until the organiser reveals it"):
        build_board(spec, str(tmp_path), phase="final")
    revealed = build_board(spec, str(tmp_path), phase="final", reveal=True)
    assert [r["submission"] for r in revealed["rows"]] == ["final-a"]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('[leaderboard]\ncolour = "red"', "unknown keys \\['colour'\\]"),
        ('[leaderboard]\nranking = "elo"', "ranking must be one of"),
        ('[leaderboard]\npolicy = "worst"', "policy must be one of"),
        ('[leaderboard]\ncolumns = ["phase1", "speed"]', "\\['speed'\\] are not figures of the scoring rule"),
        ('[leaderboard]\ncolumns = ["phase1", "phase1"]', "named twice"),
        ('[leaderboard]\nscoring = "elo"', "scoring 'elo' is not a rule of format"),
        ('[[leaderboard.achievements]]\nname = "x"\nwhen = ["phase1 ~ 3"]', "is not a condition"),
        ('[[leaderboard.achievements]]\nname = "x"\nwhen = ["phase1 >> 3"]', "'> 3' is not a number"),
        ('[[leaderboard.achievements]]\nname = "x"\nwhen = ["env > \'a\'"]', "compares numbers"),
        ('[[leaderboard.achievements]]\nname = "x"', "else everyone has it"),
        ('[leaderboard]\nbaselines = ["dir"]', "each baseline is"),
        ('[[leaderboard.achievements]]\nname = "x"\nwhen = ["phase2 > 3"]', "reads 'phase2', which rule"),
        ('[leaderboard]\nper = "gmae"', "per 'gmae' is not a context field of rule 'two-phase' \\(its fields: env\\)"),
    ],
)
def test_a_bad_leaderboard_table_is_refused_when_the_file_is_loaded(tmp_path, table, message):
    with pytest.raises(ConfigError, match=message):
        load_competition(str(competition_file(tmp_path / "cup.toml", table)))


def test_no_results_of_the_competition_is_a_clear_error(tmp_path):
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", '[leaderboard]\ncolumns = ["phase1"]')))
    (tmp_path / "other").mkdir()
    with pytest.raises(ConfigError, match="no results of competition 'cup' under .* \\(it holds other\\)"):
        build_board(spec, str(tmp_path))


def test_a_board_per_game_counts_a_failed_submission_to_that_game(tmp_path):
    table = '[leaderboard]\ncolumns = ["score"]\nper = "game"'
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", table, head='format = "diambra"')))
    doapp, sfiii = {"game": "doapp"}, {"game": "sfiii3n"}
    diambra = {"fmt": "diambra", "scoring": "diambra"}
    write_folder(tmp_path, "cup", "ben-1", "ben", {"score": 10.0}, minutes=1, context=doapp, options=doapp, **diambra)
    write_folder(
        tmp_path, "cup", "ben-2", "ben", {}, minutes=2, state="INTERRUPTED", options=doapp, **diambra
    )  # no context
    write_folder(tmp_path, "cup", "ben-3", "ben", {"score": 5.0}, minutes=3, context=sfiii, options=sfiii, **diambra)
    rows = build_board(spec, str(tmp_path))["rows"]
    assert [(r["group"], r["submissions"], r["last_submission_at"][11:16]) for r in rows] == [
        ("doapp", 2, "00:02"),
        ("sfiii3n", 1, "00:03"),
    ]


def test_a_tie_of_many_names_a_few_and_counts_the_rest(tmp_path):
    from arbiter.server.leaderboard.outputs import board_text

    spec = load_competition(str(competition_file(tmp_path / "cup.toml", '[leaderboard]\ncolumns = ["phase1"]')))
    for minutes, name in enumerate("abcdef"):
        write_folder(tmp_path, "cup", f"sub-{name}", name, {"phase1": 100.0}, minutes=minutes)
    board = build_board(spec, str(tmp_path))
    assert board["rows"][0]["tied_with"] == ["b", "c", "d", "e", "f"]  # the JSON keeps every name
    assert "tied with b, c, d and 2 others, placed by submission time" in board_text(board).splitlines()[2]


def test_the_one_phase_the_results_hold_is_hidden_too_when_the_board_names_none(tmp_path):
    table = '[leaderboard]\ncolumns = ["phase1"]\nhidden_phases = ["final"]'
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", table)))
    write_folder(tmp_path, "cup", "final-a", "a", {"phase1": 300.0}, minutes=1, phase="final")
    with pytest.raises(ConfigError, match="the 'final' board of cup is hidden until the organiser reveals it"):
        build_board(spec, str(tmp_path))
    assert [r["submission"] for r in build_board(spec, str(tmp_path), reveal=True)["rows"]] == ["final-a"]


@pytest.mark.parametrize(
    ("spread", "cause"),
    [
        ({"ci95": 5}, "has the interval 5, not [low, high]"),
        ({"ci95": [-3, "x"]}, "has the interval [-3, 'x'], not [low, high]"),
        ({"ci95": [2, 1]}, "has the interval [2, 1], not [low, high]"),
        ({"std": -1}, "has the standard deviation -1"),
        ({"n": "12"}, "has the count '12'"),
        ({"direction": "sideways"}, "is ranked 'sideways', neither 'higher' nor 'lower'"),
        ({"spec": "zz"}, "has the format spec 'zz', which formats no number"),
    ],
)
def test_a_summary_whose_figure_is_no_figure_leaves_only_its_folder_unranked(tmp_path, spread, cause):
    """Edited by hand or damaged: the folder is listed apart with the cause, the board of the
    others is written, and the columns are what the rule says, not what the bad folder says."""
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", '[leaderboard]\ncolumns = ["phase1"]')))
    write_folder(tmp_path, "cup", "sub-ok", "ok", {"phase1": 300.0}, minutes=2, intervals={"phase1": [290.0, 310.0]})
    bad = write_folder(tmp_path, "cup", "sub-bad", "bad", {"phase1": 900.0}, minutes=1)
    summary = json.loads((bad / "summary.json").read_text())
    figure = summary["leaderboard"]["figures"][0]
    for key, value in spread.items():
        (figure if key in ("direction", "spec") else figure["spread"])[key] = value
    (bad / "summary.json").write_text(json.dumps(summary))
    board = build_board(spec, str(tmp_path))
    assert [r["participant"] for r in board["rows"]] == ["ok"]
    assert board["columns"][0]["direction"] == "higher"
    [unranked] = board["unranked"]
    assert unranked["participant"] == "bad" and cause in unranked["cause"]


def test_equal_submissions_made_within_one_second_keep_their_order(tmp_path):
    """summary.json writes a submission's time to the millisecond: the tie is placed by it, not by
    the submission ids (random) that would decide between two times of the same second."""
    from arbiter.server.core.summary import iso_utc

    spec = load_competition(str(competition_file(tmp_path / "cup.toml", '[leaderboard]\ncolumns = ["phase1"]')))
    for participant, submission, at_s in (
        ("first", "sub-zzz", 1_800_000_000.25),
        ("second", "sub-aaa", 1_800_000_000.75),
    ):
        folder = write_folder(tmp_path, "cup", submission, participant, {"phase1": 100.0}, minutes=1)
        summary = json.loads((folder / "summary.json").read_text())
        summary["submission"]["submitted_at"] = iso_utc(at_s)
        (folder / "summary.json").write_text(json.dumps(summary))
    rows = build_board(spec, str(tmp_path))["rows"]
    assert [(r["participant"], r["rank"]) for r in rows] == [("first", 1), ("second", 2)]
    assert rows[0]["tie_broken_by_time"]


def test_an_evaluation_that_wrote_no_summary_yet_is_listed_as_running_and_a_debug_one_not_at_all(tmp_path):
    """A worker's evaluation in progress, or one whose evaluator was killed: its folder holds its
    events and no summary.json. The board says so, instead of counting one folder fewer."""
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", '[leaderboard]\ncolumns = ["phase1"]')))
    write_folder(tmp_path, "cup", "sub-ok", "ok", {"phase1": 300.0}, minutes=1)
    for name, debug in (("sub-running", False), ("sub-debug-running", True)):
        folder = tmp_path / "cup" / name
        folder.mkdir()
        started = {"event": "started", "time": "2026-11-01T00:05:00.000+00:00", "debug": debug}
        (folder / "events.jsonl").write_text(json.dumps(started) + "\n")
    board = build_board(spec, str(tmp_path))
    assert [r["participant"] for r in board["rows"]] == ["ok"]
    [running] = board["unranked"]
    assert running["submission"] == "sub-running" and running["state"] == "RUNNING"
    assert running["participant"] == "sub-running"  # its events name nobody: the folder's name
    assert running["cause"].startswith("no summary.json yet: the evaluation is running, or stopped before its end")
    assert board["counts"]["folders"] == 3 and board["counts"]["debug_left_out"] == 1


def test_an_evaluation_without_summary_is_listed_under_the_participant_its_events_name(tmp_path):
    """`arbiter run --participant` and a worker write whose evaluation it is into events.jsonl as
    it starts: a run killed before its summary is listed under its participant, not its folder."""
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", '[leaderboard]\ncolumns = ["phase1"]')))
    folder = tmp_path / "cup" / "sub-killed"
    folder.mkdir(parents=True)
    started = {"event": "started", "time": "2026-11-01T00:05:00.000+00:00", "debug": False}
    named = {"event": "submission", "time": "2026-11-01T00:05:00.002+00:00", "participant": "gina",
             "id": "sub-7", "submitted_at": "2026-11-01T00:04:00+00:00", "debug": False}  # fmt: skip
    (folder / "events.jsonl").write_text(json.dumps(started) + "\n" + json.dumps(named) + "\n")
    [killed] = build_board(spec, str(tmp_path))["unranked"]
    assert (killed["participant"], killed["submission"], killed["state"]) == ("gina", "sub-7", "RUNNING")
    assert killed["submitted_at"] == "2026-11-01T00:04:00+00:00" and killed["results"] == "cup/sub-killed"


def test_evaluations_under_other_conditions_are_listed_apart_with_what_differs(tmp_path):
    """A folder of another competition put under this one's, and a submission evaluated with a
    step budget set apart (`--set budgets.step_s=100`): neither is ranked beside the others."""
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", '[leaderboard]\ncolumns = ["phase1"]')))
    write_folder(tmp_path, "cup", "sub-ok", "ok", {"phase1": 300.0}, minutes=1)
    moved = write_folder(tmp_path, "cup", "sub-moved", "moved", {"phase1": 900.0}, minutes=2)
    slow = write_folder(tmp_path, "cup", "sub-slow", "slow", {"phase1": 800.0}, minutes=3)
    for folder, change in (
        (moved, {"competition": "other-cup"}),
        (slow, {"budgets": {**spec.budgets.as_dict(), "step_s": 100.0}}),
    ):
        summary = json.loads((folder / "summary.json").read_text())
        (folder / "summary.json").write_text(json.dumps({**summary, **change}))
    text = write_folder(tmp_path, "cup", "sub-text-debug", "text", {"phase1": 100.0}, minutes=4)
    summary = json.loads((text / "summary.json").read_text())
    summary["submission"]["debug"] = "false"  # a hand edit: only true makes a debug run
    (text / "summary.json").write_text(json.dumps(summary))
    board = build_board(spec, str(tmp_path))
    assert [r["participant"] for r in board["rows"]] == ["ok", "text"]
    causes = {u["participant"]: u["cause"] for u in board["unranked"]}
    assert (
        causes["moved"] == "evaluated under other conditions than the competition's: competition 'other-cup', not 'cup'"
    )
    assert causes["slow"].endswith(f"step_s 100.0 (the competition's: {spec.budgets.step_s!r})")


def test_a_run_of_another_env_or_other_format_keys_is_ranked_apart(tmp_path):
    """A local run with `--set env_id=...` or `--set phase2.max_steps=...` played another game than
    the competition's: its summary's options say so, key by key (its phase is its own choice)."""
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", '[leaderboard]\ncolumns = ["phase1"]')))
    options = spec.options_dict()
    write_folder(tmp_path, "cup", "sub-ok", "ok", {"phase1": 300.0}, minutes=1, options=options, phase="1")
    other_env = {**options, "env_id": "MountainCar-v0"}
    write_folder(tmp_path, "cup", "sub-env", "env", {"phase1": 900.0}, minutes=3, options=other_env, phase="1")
    short = {**options, "phase2": {**options["phase2"], "max_steps": 100}}
    write_folder(tmp_path, "cup", "sub-short", "short", {"phase1": 800.0}, minutes=4, options=short, phase="1")
    board = build_board(spec, str(tmp_path), phase="1")
    assert [r["participant"] for r in board["rows"]] == ["ok"]
    causes = {u["participant"]: u["cause"] for u in board["unranked"]}
    said = "evaluated under other conditions than the competition's: "
    assert causes == {
        "env": said + f"env_id 'MountainCar-v0' (the competition's: {options['env_id']!r})",
        "short": said + f"phase2.max_steps 100 (the competition's: {options['phase2']['max_steps']!r})",
    }


def test_a_hosted_submission_that_set_more_than_its_phase_or_what_it_plays_is_ranked_apart(tmp_path):
    """`arbiter submit --set`: a submission may choose its phase and what the rule reports beside
    its figures (two-phase's env is env_id's, so no); anything else it changed (a shorter test set,
    another seed) is evaluated under other conditions. A debug run is one by either flag."""
    spec = load_competition(str(competition_file(tmp_path / "cup.toml", '[leaderboard]\ncolumns = ["phase1"]')))
    for name, sets, minutes in (("fair", ["phase=1"], 1), ("short", ["max_episodes=1"], 2), ("seeded", ["seed=7"], 3)):
        folder = write_folder(tmp_path, "cup", f"sub-{name}", name, {"phase1": 100.0 * minutes}, minutes=minutes)
        summary = json.loads((folder / "summary.json").read_text())
        summary["submission"]["sets"] = sets
        (folder / "summary.json").write_text(json.dumps(summary))
    half = write_folder(tmp_path, "cup", "sub-half-debug", "half", {"phase1": 999.0}, minutes=4)
    summary = json.loads((half / "summary.json").read_text())
    (half / "summary.json").write_text(json.dumps({**summary, "debug": True}))  # the submission block says false
    board = build_board(spec, str(tmp_path))
    assert [r["participant"] for r in board["rows"]] == ["fair"]
    causes = {u["participant"]: u["cause"] for u in board["unranked"]}
    assert causes == {
        "short": "evaluated under other conditions than the competition's: --set max_episodes=1",
        "seeded": "evaluated under other conditions than the competition's: --set seed=7",
    }
    assert board["counts"]["debug_left_out"] == 1
