"""MetaLC's scores (docs/formats/metalc.md): the ALC by hand and the phase figures."""

from __future__ import annotations

import math

import pytest

from arbiter.server.formats.metalc.scoring import alc, phase_score

# -- scores ------------------------------------------------------------------------------------------


def test_alc_by_hand_on_a_tiny_curve():
    def t(x):
        return math.log(1 + x / 60) / math.log(1 + 100 / 60)

    # best-so-far 0.2, 0.5, 0.5: the drop to 0.4 adds nothing
    assert alc([10.0, 50.0, 100.0], [0.2, 0.5, 0.4], 100) == pytest.approx(
        0.2 * (1 - t(10)) + 0.3 * (1 - t(50)), abs=1e-15
    )
    assert alc([100.0], [0.9], 100) == 0.0  # a score first reached at the very end counts nothing


def record(run, dataset, times, scores, *, phase="final", timed_out=False, budget=100):
    return {"phase": phase, "run": run, "fold": 0, "dataset": dataset, "time_budget": budget, "steps": len(times),
            "finished": True, "timed_out": timed_out, "times": times, "scores": scores}  # fmt: skip


def test_the_final_phase_reports_the_first_of_its_worst_runs():
    records = [
        record(0, "d", [0.0], [0.5]),  # ALC 0.5, final 0.5
        record(1, "d", [100.0], [0.5]),  # ALC 0, final 0.5
        record(2, "d", [100.0], [0.3]),  # ALC 0 too, final 0.3
    ]
    score = phase_score(records, "final")
    assert [(r.average_alc, r.average_final_score) for r in score.runs] == [(0.5, 0.5), (0.0, 0.5), (0.0, 0.3)]
    assert (score.reported_run, score.average_alc, score.average_final_score) == (1, 0.0, 0.5)


def test_final_phase_figures_are_rounded_and_timeouts_and_unplayed_datasets_count_zero():
    records = [
        record(0, "a", [10.0, 100.0], [0.333, 0.666]),
        record(0, "b", [10.0], [0.9], timed_out=True),
    ]
    score = phase_score(records, "final", datasets=["a", "b", "c"])
    per_dataset = score.runs[0].per_dataset
    assert per_dataset["a"] == {"alc": round(alc([10.0, 100.0], [0.333, 0.666], 100), 2), "final_score": 0.67}
    assert per_dataset["b"] == per_dataset["c"] == {"alc": 0.0, "final_score": 0.0}
    assert score.average_final_score == 0.22  # 0.67 / 3, rounded
    dev = phase_score([dict(r, phase="dev") for r in records], "dev")
    assert dev.average_final_score == 0.666 / 2  # unrounded, over the 2 datasets recorded


# -- numpy's rounding, once a step ------------------------------------------------------------------


def test_round2_is_numpys_two_decimal_rounding_to_the_bit():
    import numpy as np

    from arbiter.server.formats.metalc.scoring import round2

    rng = np.random.default_rng(2022)
    values = np.concatenate(
        [
            rng.uniform(-1e4, 1e4, 20_000),
            rng.integers(-(10**6), 10**6, 20_000) / 200.0,  # exact halves of a hundredth: the ties
            rng.integers(0, 10**6, 20_000) / 1000.0 + 0.005,
            [0.0, -0.0, -0.001, 0.004999999999999999, 0.005, 0.015, 0.025, 1e300, -1e300, 2.0**60 + 0.5],
            [math.inf, -math.inf, math.nan, 1e308],  # not finite, or not once scaled: numpy's own
        ]
    )
    for value in values.tolist():
        with np.errstate(over="ignore"):
            expected = float(np.around(np.float64(value), decimals=2))
        got = round2(value)
        assert (got == expected or (math.isnan(got) and math.isnan(expected))) and (
            math.copysign(1.0, got) == math.copysign(1.0, expected)
        ), value
