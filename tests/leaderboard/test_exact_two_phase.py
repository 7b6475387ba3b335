"""The two-phase board on real evaluations: ReinforceLab-style agents on CartPole, evaluated as a
worker evaluates them, every figure derived here from episodes.jsonl by the competition's own
definitions (docs/formats/two-phase.md) and every rank counted here, never by server/leaderboard/."""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

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

from arbiter.server.core.competition import load_competition
from arbiter.server.leaderboard.board import build_board

COLUMNS = {"phase1": "higher", "convergence": "lower", "eval": "higher"}  # the preset's, in order
MAX_STEPS, GOAL, WINDOW, PENALTY_FACTOR = 600, 90.0, 2, 1.5
HEAD = f"""
format = "two-phase"
scoring = "two-phase"
seed = 1001
env_id = "CartPole-v1"
env_kwargs = {{ max_episode_steps = 100 }}  # short episodes: a small evaluation
num_episodes = 3

[phase2]
max_steps = {MAX_STEPS}
goal_reward = {GOAL}
stability_window = {WINDOW}
num_runs = 2
penalty_factor = {PENALTY_FACTOR}
criterion = "streak"
run_budget_s = 60
step_s = 5
planning_s = 30

[budgets]
planning_s = 30
step_s = 5
overall_s = 300
idle_s = 30
max_successive_timeouts = 10
"""

# ReinforceLab's agent interface (Agent(env), act, train, load, save) with a fixed policy: its
# training plays that policy until the evaluator ends the run.
FIXED_POLICY_AGENT = """
class Agent:
    def __init__(self, env):
        self.env = env

    def act(self, observation):
        return {policy}

    def train(self):
        try:
            while True:
                observation, _ = self.env.reset()
                done = False
                while not done:
                    observation, _, terminated, truncated, _ = self.env.step(self.act(observation))
                    done = terminated or truncated
        except StopIteration:
            pass  # the evaluator ended the run

    def load(self):
        pass

    def save(self):
        pass
"""
POLICIES = {
    "balance": "int(observation[2] + observation[3] > 0)",  # push towards where the pole falls
    "angle": "int(observation[2] > 0)",  # the same on the angle alone
    "right": "1",  # push right, always
}


def agent_folder(root: Path, name: str) -> str:
    folder = root / name
    folder.mkdir()
    if name == "broken":  # an agent whose dependency is missing on the evaluation machine
        (folder / "agent.py").write_text("import a_package_the_image_lacks\n")
    else:
        (folder / "agent.py").write_text(textwrap.dedent(FIXED_POLICY_AGENT.format(policy=POLICIES[name])))
    return str(folder)


def runner(folder: str) -> list[str]:
    return [sys.executable, "-m", "arbiter.client.reinforcelab", folder]


@pytest.fixture(scope="module")
def cup(tmp_path_factory, redis_server):
    """Six submissions of four participants: ines (the shipped example), bruno twice (his
    better one first), cleo, dora (an agent that cannot start) and a debug run of ines's."""
    base = tmp_path_factory.mktemp("two-phase")
    agents = {name: agent_folder(base, name) for name in (*POLICIES, "broken")}
    example = str(paths.EXAMPLES / "reinforcelab_cartpole")
    competition = competition_file(base / "cartpole-cup.toml", HEAD, preset_leaderboard("two-phase-cartpole"))
    submissions = [
        Submission("ines", "ines", 1, runner(example)),
        Submission("bruno-balance", "bruno", 2, runner(agents["balance"])),
        Submission("cleo", "cleo", 3, runner(agents["angle"])),
        Submission("dora", "dora", 4, runner(agents["broken"])),
        Submission("bruno-right", "bruno", 5, runner(agents["right"])),
        Submission("ines-debug", "ines", 6, runner(agents["balance"]), debug=True),
    ]
    root = base / "results"
    for submission in submissions:
        evaluate(competition, submission, root=root, tests=None, redis_url=redis_server.url)
    return load_competition(competition), root, {s.label: s for s in submissions}


def streak_step(train: list[dict]) -> int | None:
    """The streak criterion: the first counting episode ≥ goal followed by WINDOW more ≥ goal, at
    the run's step count when the last of them ended. An episode counts when the env ended it
    (``complete``) or the agent did with a reset (``agent_reset``), not when the run's end cut it."""
    streak = 0
    for record in train:
        if not (record["complete"] or record.get("agent_reset")):
            continue
        streak = streak + 1 if record["return"] >= GOAL else 0
        if streak == WINDOW + 1:
            return record["total_steps"]
    return None


def own_figures(records: list[dict]) -> dict[str, float]:
    """phase1: mean phase-1 return; convergence: mean over the runs of the streak step (the
    penalty, factor × max_steps, for a run that never converged); eval: mean over the runs of
    their mean evaluation return. Means are fsum / n (correctly rounded, as the format's)."""
    phase1 = [r["return"] for r in records if r["phase"] == 1]
    runs = sorted({r["run"] for r in records if r["phase"] == 2})
    steps, evals = [], []
    for run in runs:
        train = [r for r in records if r["phase"] == 2 and r["run"] == run and r["stage"] == "train"]
        step = streak_step(train)
        steps.append(float(step) if step is not None else PENALTY_FACTOR * MAX_STEPS)
        returns = [r["return"] for r in records if r["phase"] == 2 and r["run"] == run and r["stage"] == "eval"]
        evals.append(math.fsum(returns) / len(returns))
    return {
        "phase1": math.fsum(phase1) / len(phase1),
        "convergence": math.fsum(steps) / len(steps),
        "eval": math.fsum(evals) / len(evals),
    }


def scored(cup) -> list[Scored]:
    spec, root, subs = cup
    return [
        Scored(s, own_figures(episodes(root, spec.name, s))) for s in subs.values() if not s.debug and s.label != "dora"
    ]


def test_every_figure_is_the_one_derived_from_the_episodes(cup):
    spec, root, subs = cup
    assert spec.leaderboard == load_competition("two-phase-cartpole").leaderboard  # the preset's table
    found = {s.submission.label: s.figures for s in scored(cup)}
    for label, figures in found.items():
        recorded = summary(root, spec.name, subs[label])["leaderboard"]["figures"]
        assert {f["name"]: f["value"] for f in recorded} == figures
        assert {f["name"]: f["direction"] for f in recorded} == COLUMNS
    # The agents differ where the board needs them to: no column ties them all.
    for column in COLUMNS:
        assert len({f[column] for f in found.values()}) > 1, column
    assert found["bruno-right"]["convergence"] == PENALTY_FACTOR * MAX_STEPS  # never converges


def test_the_default_board_ranks_by_average_rank_over_three_directed_columns(cup):
    spec, root, subs = cup
    board = build_board(spec, str(root))
    assert (board["ranking"], board["policy"], board["scoring"]) == ("average-rank", "best", "two-phase")
    assert [(c["name"], c["direction"]) for c in board["columns"]] == list(COLUMNS.items())
    assert_rows(board["rows"], expected_rows(scored(cup), COLUMNS, "average-rank", "best"), COLUMNS)
    assert all(not r["rescored"] for r in board["rows"])
    submissions = {r["participant"]: r["submissions"] for r in board["rows"]}
    assert submissions == {"ines": 1, "bruno": 2, "cleo": 1}  # ines's debug run is not hers to count
    assert_unranked(board, [subs["dora"]])
    assert_no_debug(board, [subs["ines-debug"]])
    assert board["counts"] == {
        "folders": 6,
        "ranked": 3,
        "unranked": 1,
        "debug_left_out": 1,
        "other_phases": 0,
        "baselines": 0,
    }


@pytest.mark.parametrize("policy", ["best", "latest"])
@pytest.mark.parametrize("ranking", ["lexicographic", "average-rank", "borda"])
def test_every_ranking_and_policy_orders_as_counted(cup, ranking, policy):
    spec, root, subs = cup
    board = build_board(spec, str(root), ranking=ranking, policy=policy)
    expected = expected_rows(scored(cup), COLUMNS, ranking, policy)
    assert_rows(board["rows"], expected, COLUMNS)
    bruno = next(r for r in board["rows"] if r["participant"] == "bruno")
    if policy == "latest":
        assert bruno["submission"] == subs["bruno-right"].id
    assert_unranked(board, [subs["dora"]])
    assert_no_debug(board, [subs["ines-debug"]])
