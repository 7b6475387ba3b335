"""`arbiter leaderboard` as an organiser runs it: three files written, the table printed, who moved
since an earlier board, and one clear line with exit status 2 for bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from board_folders import competition_file, write_folder

from arbiter.server.cli.main import main

TABLE = '[leaderboard]\ncolumns = ["phase1", "convergence"]\nranking = "lexicographic"'


def board_folders(root: Path) -> None:
    write_folder(root, "cup", "sub-a", "alice", {"phase1": 400.0, "convergence": 3000.0}, minutes=1)
    write_folder(root, "cup", "sub-b", "bob", {"phase1": 300.0, "convergence": 1000.0}, minutes=2)
    write_folder(root, "cup", "sub-x", "xavier", {}, minutes=3, state="INTERRUPTED")


def test_the_command_writes_three_files_and_prints_the_table(tmp_path, capsys):
    board_folders(tmp_path / "results")
    cup = competition_file(tmp_path / "cup.toml", TABLE)
    out = tmp_path / "board"
    assert main(["leaderboard", "--results-root", str(tmp_path / "results"), "--competition", str(cup),
                 "--out", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert lines[0].startswith("cup: lexicographic ranking, each participant's best submission")
    assert "phase1 ↑" in lines[1] and "convergence ↓" in lines[1]
    assert lines[2].split()[:4] == ["1", "alice", "400.000", "3000.000"]
    assert lines[3].split()[:4] == ["2", "bob", "300.000", "1000.000"]
    assert "not ranked: xavier sub-x: the evaluation ended INTERRUPTED" in printed
    board = json.loads((out / "leaderboard.json").read_text())
    assert [r["participant"] for r in board["rows"]] == ["alice", "bob"]
    rows = list(csv.DictReader((out / "leaderboard.csv").open()))
    assert [(r["kind"], r["rank"], r["participant"], r["phase1"]) for r in rows] == [
        ("ranked", "1", "alice", "400.0"),
        ("ranked", "2", "bob", "300.0"),
        ("unranked", "", "xavier", ""),
    ]
    assert (out / "leaderboard.html").read_text().lstrip().lower().startswith("<!doctype html>")


def test_a_changed_ranking_rebuilds_the_board_and_diff_says_who_moved(tmp_path, capsys):
    results = tmp_path / "results"
    board_folders(results)
    cup = competition_file(tmp_path / "cup.toml", TABLE)
    args = ["leaderboard", "--results-root", str(results), "--competition", str(cup), "--json"]
    assert main(args) == 0
    old = tmp_path / "old.json"
    old.write_text(capsys.readouterr().out)
    # Convergence first: bob's faster training now ranks him first; a newcomer arrives.
    write_folder(results, "cup", "sub-c", "carol", {"phase1": 100.0, "convergence": 20000.0}, minutes=4)
    cup.write_text(cup.read_text().replace('["phase1", "convergence"]', '["convergence", "phase1"]'))
    assert main(["leaderboard", "--results-root", str(results), "--competition", str(cup), "--diff", str(old)]) == 0
    printed = capsys.readouterr().out
    assert f"since {old}:" in printed
    assert "bob: 2 → 1 (up 1)" in printed and "alice: 1 → 2 (down 1)" in printed and "carol: new at 3" in printed
    default_out = results / "leaderboards" / "cup" / "leaderboard.json"
    assert [r["participant"] for r in json.loads(default_out.read_text())["rows"]] == ["bob", "alice", "carol"]
    assert main(["leaderboard", "--results-root", str(results), "--competition", str(cup), "--diff",
                 str(default_out)]) == 0  # fmt: skip
    assert "nobody moved" in capsys.readouterr().out


def test_bad_input_gets_one_line_and_exit_status_2(tmp_path, capsys):
    cup = competition_file(tmp_path / "cup.toml", TABLE)
    cases = [
        (["--results-root", str(tmp_path), "--competition", "no-such-cup"], "unknown competition 'no-such-cup'"),
        (["--results-root", str(tmp_path / "missing"), "--competition", str(cup)], "it does not exist"),
        (["--results-root", str(tmp_path), "--competition", str(cup), "--diff", str(cup)], "not a leaderboard.json"),
        (
            ["--results-root", str(tmp_path), "--competition", str(cup), "--diff", str(tmp_path / "none.json")],
            "no such file (a board's first build has no earlier one to compare with: leave --diff out)",
        ),
    ]
    for args, message in cases:
        assert main(["leaderboard", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("arbiter: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "leaderboards").exists()


def test_report_on_a_folder_of_submissions_points_to_the_leaderboard(tmp_path, capsys):
    board_folders(tmp_path / "results")
    assert main(["report", str(tmp_path / "results" / "cup")]) == 2
    err = capsys.readouterr().err
    assert "holds 3" in err and f"arbiter leaderboard --results-root {tmp_path / 'results'} --competition cup" in err


def test_report_on_a_folder_of_local_runs_points_to_one_of_them(tmp_path, capsys):
    """arbiter run's results land in arbiter-results/run-...: no competition of that name to rank."""
    runs = tmp_path / "arbiter-results"
    runs.mkdir()
    for minutes, name in enumerate(("run-20261129-060000", "run-20261129-070000")):
        folder = write_folder(tmp_path, "two-phase-cartpole", name, "me", {"phase1": 1.0}, minutes=minutes)
        folder.rename(runs / name)  # the summary names its competition, not the folder's
    assert main(["report", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "holds 2: a report covers one evaluation, such as `arbiter report" in err
    assert str(runs / "run-20261129-070000") in err and "leaderboard" not in err


def test_a_damaged_summary_is_not_ranked_and_the_others_still_are(tmp_path, capsys):
    """Hand-edited or damaged summaries (a NaN figure, text where a number belongs, JSON nested past
    the parser's depth) are listed as not ranked, each with its cause; the board is written."""
    results = tmp_path / "results"
    board_folders(results)
    write_folder(results, "cup", "sub-n", "nora", {"phase1": float("nan"), "convergence": 1.0}, minutes=4)
    write_folder(results, "cup", "sub-t", "tom", {"phase1": "abc", "convergence": 1.0}, minutes=5)  # type: ignore[dict-item]
    deep = results / "cup" / "sub-d"
    deep.mkdir()
    (deep / "summary.json").write_text("[" * 100_000)
    cup = competition_file(tmp_path / "cup.toml", TABLE)
    out = tmp_path / "board"
    assert main(["leaderboard", "--results-root", str(results), "--competition", str(cup), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (
        "not ranked: nora sub-n: cannot be scored under 'two-phase': figure 'phase1' is 'nan', not a finite" in printed
    )
    assert "not ranked: tom sub-t: cannot be scored under 'two-phase': figure 'phase1' is 'abc'" in printed
    assert "not ranked: sub-d sub-d: " in printed and "nested too deeply" in printed
    board = json.loads((out / "leaderboard.json").read_text())
    assert [r["participant"] for r in board["rows"]] == ["alice", "bob"]
    assert {u["participant"] for u in board["unranked"]} == {"xavier", "nora", "tom", "sub-d"}


def test_a_phase_board_ranks_by_the_columns_that_phase_computes(tmp_path, capsys):
    """Phase-1 evaluations of a two-phase competition compute no convergence: their board ranks by
    phase1 and says which columns it left out; a phase no result holds is an error naming those
    that exist."""
    results = tmp_path / "results"
    write_folder(results, "cup", "sub-a", "alice", {"phase1": 400.0}, minutes=1, phase="1")
    write_folder(results, "cup", "sub-b", "bob", {"phase1": 450.0}, minutes=2, phase="1")
    write_folder(results, "cup", "sub-c", "carol", {"phase1": 300.0, "convergence": 900.0}, minutes=3, phase="2")
    cup = competition_file(tmp_path / "cup.toml", TABLE)
    argv = ["leaderboard", "--results-root", str(results), "--competition", str(cup)]
    assert main([*argv, "--phase", "1", "--json"]) == 0
    board = json.loads(capsys.readouterr().out)
    assert [(r["rank"], r["participant"]) for r in board["rows"]] == [(1, "bob"), (2, "alice")]
    assert [c["name"] for c in board["columns"]] == ["phase1"] and board["columns_left_out"] == ["convergence"]
    assert board["unranked"] == []
    assert board["counts"]["other_phases"] == 1
    assert main([*argv, "--phase", "1"]) == 0
    printed = capsys.readouterr().out
    assert "columns with no figure in phase 1, left out: convergence" in printed
    assert "3 results folders: 2 ranked, 0 not ranked, 0 debug left out, 1 of other phases" in printed
    # Phase 2 computes both: both are its columns.
    assert main([*argv, "--phase", "2", "--json"]) == 0
    assert [c["name"] for c in json.loads(capsys.readouterr().out)["columns"]] == ["phase1", "convergence"]
    assert main([*argv, "--phase", "3"]) == 2
    assert "no results of phase '3' for cup: its results hold the phases 1, 2" in capsys.readouterr().err


def test_results_of_one_phase_make_it_the_board_s_when_none_is_named(tmp_path, capsys):
    """A competition whose submissions were all made to phase 1 (arbiter submit --phase 1) ranks
    them by phase1 without --phase, as that phase's board, no phase-1 evaluation left out for
    lacking convergence."""
    results = tmp_path / "results"
    write_folder(results, "cup", "sub-a", "alice", {"phase1": 400.0}, minutes=1, phase="1")
    write_folder(results, "cup", "sub-b", "bob", {"phase1": 450.0}, minutes=2, phase="1")
    cup = competition_file(tmp_path / "cup.toml", TABLE)
    argv = ["leaderboard", "--results-root", str(results), "--competition", str(cup)]
    assert main([*argv, "--json"]) == 0
    board = json.loads(capsys.readouterr().out)
    assert [(r["rank"], r["participant"]) for r in board["rows"]] == [(1, "bob"), (2, "alice")]
    assert [c["name"] for c in board["columns"]] == ["phase1"] and board["columns_left_out"] == ["convergence"]
    assert board["phase"] == "1" and board["unranked"] == []
    assert (results / "leaderboards" / "cup-1" / "leaderboard.json").is_file()


def test_whole_evaluations_keep_the_board_when_one_participant_tries_a_phase_alone(tmp_path, capsys):
    """Two-phase submissions evaluated whole and one made to phase 1 alone: the board that names
    no phase ranks the whole evaluations by both columns, and counts the phase-1 try apart."""
    results = tmp_path / "results"
    write_folder(results, "cup", "sub-a", "alice", {"phase1": 400.0, "convergence": 700.0}, minutes=1)
    write_folder(results, "cup", "sub-b", "bob", {"phase1": 450.0, "convergence": 900.0}, minutes=2)
    write_folder(results, "cup", "sub-d", "dave", {"phase1": 480.0}, minutes=3, phase="1")
    cup = competition_file(tmp_path / "cup.toml", TABLE)
    argv = ["leaderboard", "--results-root", str(results), "--competition", str(cup)]
    assert main([*argv, "--json"]) == 0
    board = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in board["columns"]] == ["phase1", "convergence"] and not board["columns_left_out"]
    assert {r["participant"] for r in board["rows"]} == {"alice", "bob"}
    assert board["phase"] is None and board["counts"]["other_phases"] == 1
    assert main([*argv, "--phase", "1", "--json"]) == 0
    assert [r["participant"] for r in json.loads(capsys.readouterr().out)["rows"]] == ["dave"]


def test_a_board_with_nothing_ranked_yet_directs_its_columns_as_the_rule_does(tmp_path, capsys):
    """No figure to read a column's direction from (every submission failed): the rule says it,
    so the convergence step is lower-is-better before anyone converged, as after."""
    results = tmp_path / "results"
    write_folder(results, "cup", "sub-y", "yvonne", {}, minutes=1, state="INTERRUPTED")
    cup = competition_file(tmp_path / "cup.toml", TABLE)
    assert main(["leaderboard", "--results-root", str(results), "--competition", str(cup), "--json"]) == 0
    board = json.loads(capsys.readouterr().out)
    assert board["rows"] == []
    assert [(c["name"], c["title"], c["direction"]) for c in board["columns"]] == [
        ("phase1", "phase 1 mean return", "higher"), ("convergence", "mean convergence step", "lower")
    ]  # fmt: skip
    board_folders(results)
    assert main(["leaderboard", "--results-root", str(results), "--competition", str(cup), "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)
    directions = [(c["name"], c["direction"]) for c in board["columns"]]
    assert ranked["rows"] and [(c["name"], c["direction"]) for c in ranked["columns"]] == directions


def test_diff_compares_boards_of_one_competition_and_phase_and_json_stays_json(tmp_path, capsys):
    results = tmp_path / "results"
    board_folders(results)
    cup = competition_file(tmp_path / "cup.toml", TABLE)
    args = ["leaderboard", "--results-root", str(results), "--competition", str(cup), "--json"]
    assert main(args) == 0
    old = json.loads(capsys.readouterr().out)
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert main([*args, "--diff", str(tmp_path / "old.json")]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["competition"] == "cup"  # the JSON alone on stdout
    assert "nobody moved" in printed.err
    for key, value, said in (("competition", "other-cup", "a board of competition 'other-cup'"),
                             ("phase", "final", "a board of phase 'final'")):  # fmt: skip
        (tmp_path / "other.json").write_text(json.dumps({**old, key: value}))
        assert main([*args, "--out", str(tmp_path / "new"), "--diff", str(tmp_path / "other.json")]) == 2
        assert said in capsys.readouterr().err and not (tmp_path / "new").exists()
    (tmp_path / "rowless.json").write_text(json.dumps({**old, "rows": [{"x": 1}]}))
    assert main([*args, "--out", str(tmp_path / "new"), "--diff", str(tmp_path / "rowless.json")]) == 2
    assert "a row without its participant and rank" in capsys.readouterr().err and not (tmp_path / "new").exists()


def test_a_board_that_cannot_be_written_is_still_shown_and_says_where_to_write(tmp_path, capsys):
    results = tmp_path / "results"
    board_folders(results)
    cup = competition_file(tmp_path / "cup.toml", TABLE)
    taken = tmp_path / "a-file"
    taken.write_text("")
    assert main(["leaderboard", "--results-root", str(results), "--competition", str(cup), "--out", str(taken)]) == 2
    printed = capsys.readouterr()
    assert printed.out.splitlines()[2].split()[:2] == ["1", "alice"]  # the table, all the same
    assert f"cannot write the board's files into {taken}" in printed.err and "--out DIR" in printed.err
    assert main(["leaderboard", "--results-root", str(taken), "--competition", str(cup)]) == 2
    assert "it is a file, not a folder" in capsys.readouterr().err


def test_the_csv_never_hands_a_spreadsheet_a_formula(tmp_path):
    results = tmp_path / "results"
    write_folder(
        results, "cup", "sub-a", '=HYPERLINK("http://x","click")', {"phase1": 1.0, "convergence": 2.0}, minutes=1
    )
    cup = competition_file(tmp_path / "cup.toml", TABLE)
    assert (
        main(["leaderboard", "--results-root", str(results), "--competition", str(cup), "--out", str(tmp_path / "b")])
        == 0
    )
    [row] = list(csv.DictReader((tmp_path / "b" / "leaderboard.csv").open()))
    assert row["participant"] == '\'=HYPERLINK("http://x","click")' and row["phase1"] == "1.0"
