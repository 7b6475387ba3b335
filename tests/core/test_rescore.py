"""`arbiter rescore` on the results folders of real evaluations (the example agents run by `arbiter
run` against the session's redis-server), as they were written and tampered with; and the clear
error of a command reaching a format through a hook it does not have."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import paths
import pytest

REPO = str(paths.REPO)
ARBITER = [sys.executable, "-m", "arbiter.server.cli"]
REINFORCELAB = [sys.executable, "-m", "arbiter.client.reinforcelab", str(paths.EXAMPLES / "reinforcelab_cartpole")]
# Both phases in a couple of seconds: CartPole's example agent converges within a few episodes.
SHORT_TWO_PHASE = ["num_episodes=2", "phase2.num_runs=1", "phase2.max_steps=3000", "phase2.goal_reward=100",
                   "phase2.stability_window=2"]  # fmt: skip


def arbiter(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*ARBITER, *args], capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


def evaluated(redis_url: str, results: Path, *run_args: str) -> str:
    """The results folder of a whole `arbiter run` on the session's Redis."""
    service_id = "t-" + uuid.uuid4().hex[:12]
    done = arbiter("run", "--redis-url", redis_url, "--service-id", service_id, "--results", str(results), "--quiet",
                   *run_args, timeout_s=100)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return str(results)


@pytest.fixture(scope="module")
def flatland_results(redis_server, tiny_tests, tmp_path_factory) -> str:
    results = tmp_path_factory.mktemp("flatland") / "results"
    return evaluated(redis_server.url, results, "--tests", tiny_tests, "--", sys.executable, "examples/random_agent.py")


@pytest.fixture(scope="module")
def two_phase_results(redis_server, tmp_path_factory) -> str:
    results = tmp_path_factory.mktemp("two-phase") / "results"
    overrides = [arg for key in SHORT_TWO_PHASE for arg in ("--set", key)]
    return evaluated(redis_server.url, results, "--competition", "two-phase-cartpole", *overrides, "--", *REINFORCELAB)


def summary_of(results: str) -> dict[str, Any]:
    with open(os.path.join(results, "summary.json"), encoding="utf-8") as handle:
        return json.load(handle)


def lines_of(results: str) -> list[dict[str, Any]]:
    """episodes.jsonl's lines as written (end-of-item marks included)."""
    with open(os.path.join(results, "episodes.jsonl"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def tampered(results: str, folder: Path, change: Any) -> str:
    """A copy of ``results`` whose episodes.jsonl had ``change(lines)`` applied."""
    copy = str(folder / "tampered")
    shutil.copytree(results, copy)
    lines = lines_of(copy)
    change(lines)
    with open(os.path.join(copy, "episodes.jsonl"), "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(line) + "\n" for line in lines)
    return copy


def recomputed(results: str) -> dict[str, Any]:
    done = arbiter("rescore", results, "--json")
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


# -- as written: every figure matches -------------------------------------------------------------


@pytest.mark.parametrize("results", ["flatland_results", "two_phase_results"])
def test_an_evaluation_as_written_rescores_to_its_recorded_score(results, request):
    folder = request.getfixturevalue(results)
    summary = summary_of(folder)
    assert summary["state"] == "SUCCESS"
    done = arbiter("rescore", folder)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    records = len(lines_of(folder))
    assert lines[0].startswith(
        f"{records} records, format {summary['format']}, rule {summary['scoring']}, state SUCCESS"
    )
    primary = next(line for line in lines if line.startswith("primary "))
    assert primary.split() == ["primary", repr(summary["score"]["primary"]), repr(summary["score"]["primary"])]
    assert lines[-1] == "matches summary.json and episodes.jsonl"


def test_json_gives_the_recomputed_score_next_to_the_recorded_one(two_phase_results):
    found = recomputed(two_phase_results)
    summary = summary_of(two_phase_results)
    assert found["matches"] is True and found["differences"] == []
    assert found["recorded"] == summary["score"]
    assert found["recomputed"]["phase1"] == summary["score"]["phase1"]
    assert found["recomputed"]["runs"][0]["convergence_step"] == summary["score"]["runs"][0]["convergence_step"]
    assert (found["format"], found["scoring"], found["state"]) == ("two-phase", "two-phase", "SUCCESS")
    assert found["rederived"] is False  # two-phase's rule reads raw returns and steps: nothing to derive


# -- tampered: the differing figure is named --------------------------------------------------------


def test_a_changed_raw_reward_changes_the_flatland_score_and_says_where(flatland_results, tmp_path):
    lines = lines_of(flatland_results)
    finished = next(i for i, line in enumerate(lines) if not (line["timed_out"] or line["abandoned"]))

    def more_reward(lines: list[dict[str, Any]]) -> None:
        lines[finished]["reward"] += 1.0

    copy = tampered(flatland_results, tmp_path, more_reward)
    done = arbiter("rescore", copy)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "DIFFERS from what was recorded" in done.stdout
    assert "score.primary: recomputed " in done.stdout
    # The stored normalized return no longer follows from the reward it sits next to.
    where = f"episodes.jsonl line {finished + 1} (item {lines[finished]['index']}).normalized_return: recomputed "
    assert where in done.stdout
    found = recomputed(copy)
    line = lines[finished]
    budget = line["max_episode_steps"] * line["num_agents"]
    assert math.isclose(
        found["recomputed"]["primary"] - summary_of(copy)["score"]["primary"], 1.0 / budget / len(lines)
    )


def test_a_changed_derived_figure_alone_is_caught_though_the_score_holds(flatland_results, tmp_path):
    def inflated(lines: list[dict[str, Any]]) -> None:
        lines[0]["normalized_return"] = 0.5

    copy = tampered(flatland_results, tmp_path, inflated)
    found = recomputed(copy)
    assert found["matches"] is False and found["rederived"] is True
    assert found["recomputed"]["primary"] == summary_of(copy)["score"]["primary"]  # derived again from the reward
    assert [
        d for d in found["differences"] if not d.startswith("episodes.jsonl line 1 (item 0).normalized_return")
    ] == []


def test_a_changed_two_phase_return_changes_phase1(two_phase_results, tmp_path):
    def lower_return(lines: list[dict[str, Any]]) -> None:
        next(line for line in lines if line["phase"] == 1)["return"] -= 100.0

    done = arbiter("rescore", tampered(two_phase_results, tmp_path, lower_return))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "score.phase1: recomputed " in done.stdout and "score.primary: recomputed " in done.stdout


def test_a_changed_leaderboard_figure_is_caught_though_the_score_holds(flatland_results, tmp_path):
    """What a leaderboard ranks by is the summary's leaderboard block: rescore checks it too."""
    copy = tampered(flatland_results, tmp_path, lambda lines: None)
    summary = summary_of(copy)
    summary["leaderboard"]["figures"][0]["value"] = -0.5
    with open(os.path.join(copy, "summary.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle)
    done = arbiter("rescore", copy)
    assert done.returncode == 1
    assert "leaderboard.figures[0].value" in done.stdout and "-0.5" in done.stdout


def test_a_damaged_line_before_whole_items_is_named_not_taken_for_a_torn_tail(flatland_results, tmp_path):
    """A crash leaves at most the start of one item; a damaged line with records after it is
    damage, which rescore says (the records it scored may not be all there were)."""
    copy = tampered(flatland_results, tmp_path, lambda lines: None)
    path = os.path.join(copy, "episodes.jsonl")
    with open(path, encoding="utf-8") as handle:
        lines = handle.readlines()
    lines[0] = lines[0].replace('"steps":', '"steps":,', 1).replace('"steps": ', '"steps": ,', 1)
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(lines)
    done = arbiter("rescore", copy)
    assert done.returncode == 1
    assert "episodes.jsonl: damaged after its 0 whole items (line 1 after the last whole item is not valid JSON" in (
        done.stdout
    )


def test_another_rule_of_another_reward_model_is_refused(flatland_results):
    """flatland3 scores the rewards of flatland's own reward model: a NeurIPS 2020 evaluation's
    rewards say nothing of what that model would have paid, so no figure is made up from them."""
    done = arbiter("rescore", flatland_results, "--scoring", "flatland3")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    assert "cannot be rescored: episode 0's reward was earned under flatland's 'neurips2020' reward model" in (
        done.stderr
    )


def test_records_no_evaluation_writes_are_a_clear_error(flatland_results, tmp_path):
    for name, edit in {"nan": lambda r: {**r, "reward": float("nan")}, "text": lambda r: {**r, "reward": "x"}}.items():
        copy = tmp_path / name
        shutil.copytree(flatland_results, copy)
        records = lines_of(str(copy))
        (copy / "episodes.jsonl").write_text("".join(json.dumps(edit(r)) + "\n" for r in records))
        done = arbiter("rescore", str(copy))
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert f"{copy} cannot be rescored: its records hold what no evaluation writes" in done.stderr


# -- what cannot be rescored, and formats without a hook --------------------------------------------


def test_a_folder_that_cannot_be_rescored_is_a_clear_error(flatland_results, tmp_path):
    missing = arbiter("rescore", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    copy = tmp_path / "killed"
    shutil.copytree(flatland_results, copy)
    (copy / "summary.json").unlink()  # as a killed evaluation leaves its folder
    killed = arbiter("rescore", str(copy))
    assert killed.returncode == 2 and "has no summary.json" in killed.stderr
    unknown = arbiter("rescore", flatland_results, "--scoring", "nope")
    assert unknown.returncode == 2 and "unknown scoring rule 'nope'" in unknown.stderr
    lost = tmp_path / "lost"
    shutil.copytree(flatland_results, lost)
    (lost / "episodes.jsonl").unlink()
    missing_records = arbiter("rescore", str(lost))
    assert missing_records.returncode == 2, missing_records.stdout
    assert "has no episodes.jsonl, and its summary.json counts 3 items" in missing_records.stderr


def test_generate_for_a_format_without_a_generator_is_one_clear_line(tmp_path):
    done = arbiter("generate", "--format", "two-phase", "--out", str(tmp_path / "data"))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "arbiter: error: format 'two-phase' has no test-data generator: `arbiter generate` cannot write its data"
    ]
    assert not (tmp_path / "data").exists()


def test_replay_of_a_two_phase_evaluation_is_one_clear_line(two_phase_results, tmp_path):
    done = arbiter("replay", two_phase_results, "0", "--out", str(tmp_path / "x.gif"))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"arbiter: error: format 'two-phase' has no replays: `arbiter replay` cannot play {two_phase_results} again"
    ]
    assert not (tmp_path / "x.gif").exists()


def test_recording_a_format_without_a_recorder_is_refused_at_start(tmp_path):
    done = arbiter("run", "--competition", "two-phase-cartpole", "--record", "1", "--results", str(tmp_path / "r"),
                   "--", *REINFORCELAB)  # fmt: skip
    assert done.returncode == 2
    assert "record_episodes (replays): format 'two-phase' has no recorder" in done.stderr
    assert not (tmp_path / "r").exists()


def test_an_option_another_formats_generator_reads_is_refused(tmp_path):
    done = arbiter("generate", "--out", str(tmp_path / "tests"), "--datasets", "8")
    assert done.returncode == 2
    assert "the flatland generator takes --preset, --seed and --overwrite, not --datasets" in done.stderr
    assert not (tmp_path / "tests").exists()
