"""The MetaLC boards on real evaluations: the starting kit's agents (examples/metalc_agent) through
the runner on a small synthetic meta-dataset, evaluated as a worker evaluates them, in the
development phase and in the final one. Every figure is derived here from the learning curves in
episodes.jsonl by the challenge's formulas (docs/formats/metalc.md), every rank counted here, never
by server/leaderboard/. The development board is public; the final one is written only when the
organiser reveals it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
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

from arbiter.protocol.errors import ConfigError
from arbiter.server.cli.main import main
from arbiter.server.core.competition import load_competition
from arbiter.server.formats.metalc.generate import GeneratorSettings, write_meta_dataset
from arbiter.server.leaderboard.board import build_board

NAME = "metalc-cup"
COLUMNS = {"alc": "higher", "final_score": "higher"}  # the preset's
T0_S = 60.0  # the challenge's time scale of the log-normalized time
HEAD = """
format = "metalc"
scoring = "alc"
seed = 208
phase = "dev"
meta_train_s = 30
dataset_s = 30
max_steps = 10000

[budgets]
planning_s = 30
step_s = 10
overall_s = 300
idle_s = 30
max_successive_timeouts = 10
"""
FINAL = ["phase=final"]


def kit_agent(module: str) -> list[str]:
    return [sys.executable, "-m", "arbiter.client.metalc", str(paths.EXAMPLES / "metalc_agent"),
            "--agent-module", module]  # fmt: skip


@pytest.fixture(scope="module")
def cup(tmp_path_factory, redis_server):
    """Development: mia twice (her better agent first), noa, oli, pia (whose agent's dependency is
    missing: it fails once connected, and the datasets it never played score 0), quin (whose
    module is misnamed: the runner fails before connecting, and nothing is scored) and a debug
    run of noa's; final: mia, noa and oli once each."""
    base = tmp_path_factory.mktemp("metalc")
    data = base / "data"
    write_meta_dataset(str(data), GeneratorSettings(datasets=6, algorithms=4, seed=5))
    broken = base / "broken"
    broken.mkdir()
    (broken / "agent.py").write_text("import a_package_the_image_lacks\n")
    competition = competition_file(base / f"{NAME}.toml", HEAD, preset_leaderboard("metalc-wcci2022"))
    submissions = [
        Submission("mia", "mia", 1, kit_agent("agent")),
        Submission("noa", "noa", 2, kit_agent("schedule_agent")),
        Submission("oli", "oli", 3, kit_agent("random_agent")),
        Submission("mia-random", "mia", 4, kit_agent("random_agent")),
        Submission("pia", "pia", 5, [sys.executable, "-m", "arbiter.client.metalc", str(broken)]),
        Submission("quin", "quin", 6, kit_agent("my_agent")),
        Submission("noa-debug", "noa", 7, kit_agent("agent"), debug=True),
        Submission("mia-final", "mia", 8, kit_agent("agent"), FINAL),
        Submission("noa-final", "noa", 9, kit_agent("schedule_agent"), FINAL),
        Submission("oli-final", "oli", 10, kit_agent("random_agent"), FINAL),
    ]
    root = base / "results"
    for submission in submissions:
        evaluate(competition, submission, root=root, tests=str(data), redis_url=redis_server.url)
    return load_competition(competition), root, {s.label: s for s in submissions}, competition


def alc(times: list[float], scores: list[float], budget: float) -> float:
    """The area under the best-so-far curve on log-normalized time, as the challenge's scorer
    sums it (numpy's log; left to right)."""
    area = best = previous = 0.0
    for time, score in zip(times, scores, strict=True):
        best = max(best, score)
        area += (best - previous) * (1 - float(np.log(1 + time / T0_S) / np.log(1 + budget / T0_S)))
        previous = best
    return area


def round2(value: float) -> float:
    return float(np.around(np.float64(value), decimals=2))  # the challenge rounds numpy floats


def left_mean(values: list[float]) -> float:
    total = 0.0
    for value in values:  # the challenge's Python summed left to right, uncompensated
        total += value
    return total / len(values)


def own_figures(records: list[dict], phase: str) -> dict[str, float]:
    """Each dataset's ALC and final score from its curve (0 and 0 for a dataset that timed out,
    did not finish or credited a time its curve lacks); each run's averages over the datasets in
    name order; development: its one run, unrounded; final: each figure rounded to 2 decimals and
    the run with the lowest average ALC reported (the first of equals)."""
    runs = []
    for run in sorted({r["run"] for r in records}):
        per_dataset = {}
        for record in sorted((r for r in records if r["run"] == run), key=lambda r: r["dataset"]):
            scored = record["finished"] and not record["timed_out"] and record["times"]
            if scored and None not in record["scores"]:
                figures = alc(record["times"], record["scores"], record["time_budget"]), record["scores"][-1]
            else:
                figures = 0.0, 0.0
            per_dataset[record["dataset"]] = [round2(f) for f in figures] if phase == "final" else list(figures)
        averages = [left_mean([v[i] for v in per_dataset.values()]) for i in (0, 1)]
        runs.append([round2(a) for a in averages] if phase == "final" else averages)
    reported = min(runs, key=lambda averages: averages[0])  # min keeps the first of equals
    return {"alc": reported[0], "final_score": reported[1]}


def scored(cup, phase: str) -> list[Scored]:
    _, root, subs, _ = cup
    return [
        Scored(s, own_figures(episodes(root, NAME, s), phase))
        for s in subs.values()
        if not s.debug and s.label != "quin" and (s.settings == FINAL) == (phase == "final")
    ]


def test_every_figure_is_the_one_derived_from_the_curves(cup):
    spec, root, subs, _ = cup
    assert spec.leaderboard == load_competition("metalc-wcci2022").leaderboard  # the preset's table
    for phase in ("dev", "final"):
        entries = scored(cup, phase)
        for entry in entries:
            recorded = summary(root, NAME, entry.submission)["leaderboard"]
            assert {f["name"]: f["value"] for f in recorded["figures"]} == entry.figures
            assert recorded["context"] == {"phase": phase}
        assert len({e.figures["alc"] for e in entries}) == 3 + (phase == "dev")  # mia's second agent is oli's
    assert summary(root, NAME, subs["pia"])["state"] == "SUCCESS"
    assert next(e for e in scored(cup, "dev") if e.participant == "pia").figures == {"alc": 0.0, "final_score": 0.0}


@pytest.mark.parametrize("policy", ["best", "latest"])
@pytest.mark.parametrize("ranking", ["lexicographic", "average-rank", "borda"])
def test_the_development_board_is_public_and_ranks_as_counted(cup, ranking, policy):
    spec, root, subs, _ = cup
    board = build_board(spec, str(root), ranking=ranking, policy=policy)  # the preset's phase: dev
    assert board["phase"] == "dev"
    assert_rows(board["rows"], expected_rows(scored(cup, "dev"), COLUMNS, ranking, policy), COLUMNS)
    assert all(row["context"] == {"phase": "dev"} for row in board["rows"])
    assert {r["participant"]: r["submissions"] for r in board["rows"]} == {"mia": 2, "noa": 1, "oli": 1, "pia": 1}
    assert_unranked(board, [subs["quin"]])
    assert_no_debug(board, [subs["noa-debug"]])


def test_the_final_board_is_refused_until_revealed_then_ranks_as_counted(cup, tmp_path, capsys):
    spec, root, subs, competition = cup
    with pytest.raises(ConfigError, match="hidden until the organiser reveals it: add --reveal"):
        build_board(spec, str(root), phase="final")
    command = ["leaderboard", "--results-root", str(root), "--competition", competition, "--phase", "final",
               "--out", str(tmp_path / "final")]  # fmt: skip
    assert main(command) == 2
    assert "--reveal" in capsys.readouterr().err and not (tmp_path / "final").exists()

    board = build_board(spec, str(root), phase="final", reveal=True)
    assert board["phase"] == "final" and board["ranking"] == "lexicographic"
    expected = expected_rows(scored(cup, "final"), COLUMNS, "lexicographic", "best")
    assert_rows(board["rows"], expected, COLUMNS)
    assert all(row["context"] == {"phase": "final"} for row in board["rows"])
    assert board["unranked"] == [] and subs["noa-debug"].id not in json.dumps(board)
    assert main([*command, "--reveal"]) == 0
    written = json.loads((tmp_path / "final" / "leaderboard.json").read_text())
    assert [(r["participant"], r["submission"]) for r in written["rows"]] == [
        (e.entry.participant, e.entry.submission.id) for e in expected
    ]
    assert {p.name for p in Path(tmp_path / "final").iterdir()} == {
        "leaderboard.json",
        "leaderboard.csv",
        "leaderboard.html",
    }
