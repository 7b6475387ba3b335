"""MetaLC scores recomputed from a results folder alone (episodes.jsonl, results.csv), with this
file's own arithmetic (docs/formats/metalc.md), not the format's code, and checked against summary.json.

Two evaluations through a real evaluator: the random example agent's final phase (three runs
whose averages differ, the worst reported), and a hand-driven development phase holding the
cases that score 0: a dataset that timed out, and one that credited a time its validation curve
lacks (the meta-dataset's test curve is shifted for it)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import paths
import pytest
from harness import finish, read_episodes, read_summary, running_service, wait_for

from arbiter.client.wire import Wire
from arbiter.protocol.errors import TimeoutException
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL, extension
from arbiter.server.core.competition import load_competition
from arbiter.server.formats.metalc.generate import GeneratorSettings, write_meta_dataset

REPO = str(paths.REPO)
AGENTS_DIR = os.path.join(REPO, "examples", "metalc_agent")
FAST = ["budgets.idle_s=10", "budgets.overall_s=300"]


# -- the arithmetic of docs/formats/metalc.md, written out again -------------------------------------------


def round2(value: float) -> float:
    return float(np.around(np.float64(value), decimals=2))  # numpy's rounding, as the challenge's


def dataset_alc(record: dict[str, Any]) -> tuple[float, float]:
    """(ALC, final score) of one record; 0 for both unless it finished with every credited score
    known."""
    scores = record["scores"]
    if not record["finished"] or record["timed_out"] or not scores or any(s is None for s in scores):
        return 0.0, 0.0
    budget = record["time_budget"]
    area, best, previous = 0.0, 0.0, 0.0
    for time, score in zip(record["times"], scores, strict=True):
        best = max(best, score)
        area += (best - previous) * (1 - np.log(1 + time / 60.0) / np.log(1 + budget / 60.0))
        previous = best
    area, final = float(area), scores[-1]
    return (round2(area), round2(final)) if record["phase"] == "final" else (area, final)


def recompute(results: str) -> dict[str, Any]:
    records = read_episodes(results)
    phase = records[0]["phase"]
    runs: dict[int, dict[str, tuple[float, float]]] = {}
    for record in records:
        runs.setdefault(record["run"], {})[record["dataset"]] = dataset_alc(record)
    averages = []
    for run in sorted(runs):
        names = sorted(runs[run])  # string order, summed left to right
        total_alc = total_final = 0.0
        for name in names:
            total_alc += runs[run][name][0]
            total_final += runs[run][name][1]
        alc, final = total_alc / len(names), total_final / len(names)
        averages.append((round2(alc), round2(final)) if phase == "final" else (alc, final))
    worst = min(range(len(averages)), key=lambda i: averages[i][0])
    return {"per_run": runs, "averages": averages, "reported": worst, "records": records}


def check_folder(results: str) -> dict[str, Any]:
    """Everything summary.json and results.csv say about the scores, against ``recompute``."""
    mine = recompute(results)
    score = read_summary(results)["score"]
    assert (score["primary"], score["secondary"]) == mine["averages"][mine["reported"]]
    assert score["reported_run"] == sorted(mine["per_run"])[mine["reported"]]
    assert [(r["average_alc"], r["average_final_score"]) for r in score["runs"]] == mine["averages"]
    reported = mine["per_run"][score["reported_run"]]
    assert {d: (v["alc"], v["final_score"]) for d, v in score["per_dataset"].items()} == reported
    for record in mine["records"]:
        assert (record["alc"], record["final_score"]) == mine["per_run"][record["run"]][record["dataset"]]
    with open(os.path.join(results, "results.csv"), encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["run"], r["dataset"], float(r["alc"])) for r in rows] == [
        (str(record["run"]), record["dataset"], record["alc"]) for record in mine["records"]
    ]
    return mine


# -- evaluations to recompute ---------------------------------------------------------------------


def test_the_final_phase_of_the_random_agent_recomputes_from_its_folder(tmp_path, redis_url, service_id):
    data = tmp_path / "data"
    write_meta_dataset(str(data), GeneratorSettings(datasets=14, algorithms=6, seed=1, missing_fraction=0.05))
    competition = load_competition("metalc-wcci2022", ["phase=final", *FAST])
    results = str(tmp_path / "r")
    with running_service(competition, tests=str(data), results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        env = {**os.environ, "ARBITER_REDIS_URL": redis_url, "AICROWD_SUBMISSION_ID": service_id}
        agent = subprocess.run(
            [sys.executable, "-m", "arbiter.client.metalc", AGENTS_DIR, "--agent-module", "random_agent"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert agent.returncode == 0, agent.stderr[-3000:]
        assert finish(outcome)["state"] == "SUCCESS"
    mine = check_folder(results)
    assert len(mine["per_run"]) == 3 and len(set(mine["averages"])) > 1  # the runs differ: the worst matters


def shift_test_curve(data: str, dataset: str, algorithm: str, by: float) -> list[float]:
    """Move a test curve's times by ``by`` so they miss the validation curve's; returns the
    validation times."""
    with open(os.path.join(data, "valid", dataset, algorithm, "scores.txt"), encoding="utf-8") as handle:
        lines = dict(line.split(":", 1) for line in handle if line.strip())
    times = json.loads(lines["times"])
    scores = json.loads(lines["scores"])
    with open(os.path.join(data, "test", dataset, algorithm, "scores.txt"), "w", encoding="utf-8") as handle:
        handle.write(f"times: {json.dumps([round(t + by, 2) for t in times])}\nscores: {json.dumps(scores)}\n")
    return times


def test_timed_out_and_unscorable_datasets_recompute_to_zero(tmp_path, redis_url, service_id):
    data = tmp_path / "data"
    write_meta_dataset(str(data), GeneratorSettings(datasets=6, algorithms=3, seed=11))
    valid_times = shift_test_curve(str(data), "syn0", "1", by=0.5)
    competition = load_competition("metalc-wcci2022", ["budgets.step_s=0.3", *FAST])
    results = str(tmp_path / "r")
    with running_service(competition, tests=str(data), results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        wire = Wire(redis_url, service_id, reply_timeout_s=10)
        wire.handshake("test")

        def step(action: list[Any]) -> dict[str, Any]:
            return wire.request(FLATLAND_RL.ENV_STEP, {"action": action, EXTENSION_KEY: {"reply": True}})["payload"]

        # syn0: explore '1' to its second validation point, then credit '1': its test curve's
        # point at that counter has another time, missing from the validation curve
        wire.request(FLATLAND_RL.ENV_CREATE, {})
        assert step([None, "1", valid_times[1]])["observation"][1] == valid_times[1]
        assert step(["1", "1", 1e9])["done"]
        # syn1: a step, then silence past the step budget
        wire.request(FLATLAND_RL.ENV_CREATE, {})
        step(["0", "0", 1.0])
        wait_for(lambda: service.evaluation.counters["step_timeouts"] == 1, what="the step timeout")
        with pytest.raises(TimeoutException):
            step(["0", "0", 1e9])
        # the rest: several honest steps each
        while not extension(created := wire.request(FLATLAND_RL.ENV_CREATE, {})["payload"]).get("finished"):
            budget = float(created["info"]["dataset_meta_features"]["time_budget"])
            best = None
            for k in range(1, 5):
                reply = step([best, str(k % 3), budget / 4])
                best = str(k % 3)
            assert reply["done"]
        wire.request(FLATLAND_RL.ENV_SUBMIT, {})
        wire.close()
        assert finish(outcome)["state"] == "SUCCESS"
    mine = check_folder(results)
    records = mine["records"]
    assert records[0]["dataset"] == "syn0" and None in records[0]["scores"] and records[0]["finished"]
    assert (records[0]["alc"], records[1]["alc"], records[1]["timed_out"]) == (0.0, 0.0, True)
    assert all(r["alc"] > 0 for r in records[2:])  # the zeros above are the rule, not a blank agent
