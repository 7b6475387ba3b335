"""The two-phase scores from records alone (docs/formats/two-phase.md): phase 1's mean return, the
runs' convergence steps with the penalty, evaluation returns, and which figure leads."""

from __future__ import annotations

import statistics

import pytest

from arbiter.server.formats.two_phase.options import Phase2Options, TwoPhaseOptions
from arbiter.server.formats.two_phase.scoring import TwoPhaseRule, interquartile_mean

PRESET = TwoPhaseOptions(phase2=Phase2Options(max_steps=20_000, goal_reward=475.0, stability_window=10))


def phase1(*returns):
    return [{"phase": 1, "episode": i, "return": r} for i, r in enumerate(returns)]


def converged_run(run, converged_at, window=10):
    """A training run whose window + 1 counting episodes reach the goal, the last ending at
    ``converged_at``, after one episode below the goal."""
    train = [{"phase": 2, "stage": "train", "run": run, "return": 20.0, "total_steps": 20, "complete": True}]
    per = (converged_at - 20) // (window + 1)
    for k in range(window + 1):
        end = converged_at if k == window else 20 + per * (k + 1)
        train.append({"phase": 2, "stage": "train", "run": run, "return": 500.0, "total_steps": end, "complete": True})
    return train


def unconverged_run(run):
    return [{"phase": 2, "stage": "train", "run": run, "return": 9.0, "total_steps": 20_000, "complete": False}]


def evals(run, *returns):
    return [{"phase": 2, "stage": "eval", "run": run, "return": r} for r in returns]


def test_the_worked_example_of_five_runs():
    # docs/formats/two-phase.md: 6,677, 6,813, 6,697, no convergence (1.5 × 20,000) and 6,758 → 11,389
    records = []
    for run, step in enumerate([6677, 6813, 6697, None, 6758]):
        records += converged_run(run, step) if step is not None else unconverged_run(run)
        records += evals(run, 500.0, 400.0)
    score = TwoPhaseRule(PRESET).aggregate(records)
    assert score["convergence"] == pytest.approx(11_389)
    assert [r["convergence_step"] for r in score["runs"]] == [6677, 6813, 6697, None, 6758]
    assert [r["penalized"] for r in score["runs"]] == [False, False, False, True, False]
    assert score["runs"][3]["score"] == 30_000
    assert score["eval"] == 450.0


def test_both_phases_lead_with_phase_1_then_convergence():
    records = phase1(100.0, 200.0, 300.0) + converged_run(0, 5000) + evals(0, 10.0)
    rule = TwoPhaseRule(PRESET)
    score = rule.aggregate(records)
    assert (score["primary"], score["secondary"]) == (200.0, 5000.0)
    assert (score["primary_name"], score["primary_higher_is_better"]) == ("phase 1 mean return", True)
    # the score so far is the phase being played: convergence once phase 2 has begun
    assert rule.primary(records[:3]) == 200.0
    assert rule.primary(records) == 5000.0


def test_phase_2_alone_leads_with_convergence_then_eval():
    options = TwoPhaseOptions(phase=2, phase2=PRESET.phase2)
    records = converged_run(0, 3000) + evals(0, 7.0, 9.0) + unconverged_run(1) + evals(1, 1.0)
    score = TwoPhaseRule(options).aggregate(records)
    assert score["phase1"] is None
    assert score["primary"] == statistics.fmean([3000, 30_000])
    assert score["secondary"] == statistics.fmean([8.0, 1.0])
    assert score["primary_higher_is_better"] is False
    assert score["rule"]["penalty"] == 30_000


def test_an_episode_the_runs_end_cut_short_does_not_complete_a_streak():
    window = PRESET.phase2.stability_window
    records = converged_run(0, 5000)
    records[-1] = {**records[-1], "complete": False}  # the last of the streak was cut by the run's end
    run = TwoPhaseRule(PRESET).runs(records)[0]
    assert run["converged"] is False and run["score"] == 30_000
    assert run["train_episodes"] == window + 2


def test_the_interquartile_mean_weights_the_cut_values():
    assert interquartile_mean([]) is None
    assert interquartile_mean([1, 2, 3, 4]) == 2.5  # the middle two
    # n = 5: the middle half spans 2.5 values: 1.25 ... 3.75 → 0.75 × 2 + 1 × 3 + 0.75 × 4
    assert interquartile_mean([5, 1, 4, 2, 3]) == pytest.approx((0.75 * 2 + 3 + 0.75 * 4) / 2.5)
    assert interquartile_mean([1, 2, 3, 4, 1000, 1000, 1000, -1000]) == pytest.approx(statistics.fmean([2, 3, 4, 1000]))
