"""A results folder that fills up or turns read-only in the middle of an evaluation: the
evaluation ends at once as INTERRUPTED with the cause (in summary.json, or on stderr when even
that cannot be written), the agent's pending request is answered with that cause, no temporary
file is left, and every finished item is intact; once the folder can be written again,
``arbiter serve --resume`` plays the cut item again, whole.

A real `arbiter serve` and the ReinforceLab runner run as processes, on a two-phase evaluation
whose training run (one item of many episodes) is written only when it ends: that write is the
one that fails. The folder is made full with a small tmpfs and a filler file, and read-only
with a read-only bind mount laid over it: a plain ``mount -o remount,ro`` of a filesystem is
refused while a file on it is open for writing (the evaluator keeps events.jsonl open), where
the kernel's own remount after a disk error does not wait.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import paths
import pytest
from harness import read_episodes, read_events, read_summary, wait_for

from arbiter.server.service.records_file import read_records
from arbiter.server.service.results import ResultsStore, ResultsUnwritable

REPO = str(paths.REPO)
TESTS_DIR = str(paths.SUPPORT)
ARBITER = [sys.executable, "-m", "arbiter.server.cli"]
TRAINING_STEPS = 5000  # 1000 five-step episodes: the training run's item holds 1000 records
INTERRUPTED_EXIT = 130
# What a fast end looks like next to the agent's reply timeout (60 s), which a lost reply would cost.
PROMPT_S = 20.0

# Two-phase on the counting env: action 0 earns 5 an episode, never the goal of 9, so the only
# training run goes on to its step limit.
COMPETITION = f"""
format = "two-phase"
seed = 7
env_id = "fake_envs:CountingEnv"
env_kwargs = {{ length = 5, bonus = 1.0 }}
reward_per_step = [1.0, 2.0]
worst_return = 0.0
num_episodes = 2

[phase2]
max_steps = {TRAINING_STEPS}
goal_reward = 9.0
stability_window = 2
num_runs = 1
step_s = 5.0
planning_s = 5.0
run_budget_s = 90.0

[budgets]
step_s = 5.0
planning_s = 5.0
idle_s = 20.0
overall_s = 300.0
"""

AGENT = """
class Agent:
    def __init__(self, env):
        self.env = env

    def load(self):
        pass

    def act(self, observation):
        return 0

    def train(self):
        while True:  # until the evaluator ends the run (StopIteration)
            self.env.reset()
            done = False
            while not done:
                _, _, terminated, truncated, _ = self.env.step(0)
                done = terminated or truncated
"""


def run_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30)


def mount_or_skip(*args: str) -> None:
    done = run_command("mount", *args)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here (needs root and mount permission): {done.stderr.strip()}")


def unmount(path: Path) -> None:
    if run_command("umount", str(path)).returncode != 0:
        run_command("umount", "--lazy", str(path))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A small tmpfs, unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount_or_skip("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk))
    try:
        yield disk
    finally:
        unmount(disk)


def evaluation_files(tmp_path: Path) -> tuple[Path, Path]:
    """The competition file and the agent's submission folder."""
    competition = tmp_path / "counting.toml"
    competition.write_text(COMPETITION, encoding="utf-8")
    submission = tmp_path / "agent"
    submission.mkdir(exist_ok=True)
    (submission / "agent.py").write_text(AGENT, encoding="utf-8")
    return competition, submission


def start(command: list[str], log: Path, **env: str) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")]), **env}
    with open(log, "ab") as out:
        return subprocess.Popen(command, cwd=REPO, env=environment, stdout=subprocess.DEVNULL, stderr=out)


def serve(competition: Path, results: Path, redis_url: str, service_id: str, log: Path, resume: bool = False):
    command = [*ARBITER, "serve", "--competition", str(competition), "--results", str(results),
               "--redis-url", redis_url, "--service-id", service_id, "--quiet"]  # fmt: skip
    return start(command + (["--resume"] if resume else []), log)


def runner(submission: Path, redis_url: str, service_id: str, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "arbiter.client.reinforcelab", str(submission)]
    return start(command, log, ARBITER_REDIS_URL=redis_url, AICROWD_SUBMISSION_ID=service_id)


def stop(*processes: subprocess.Popen) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def leftovers(results: Path) -> list[str]:
    return [name for _, _, names in os.walk(results) for name in names if ".tmp." in name]


def phase1_only(results: Path) -> None:
    """Phase 1's two items, whole, and nothing of the training run: not a line, not a byte."""
    lines = (results / "episodes.jsonl").read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3, lines[2:][:1]
    assert [r["unit"] for r in read_episodes(str(results))] == ["phase1/eval/0", "phase1/eval/1"]


def ended_promptly(evaluator: subprocess.Popen, agent: subprocess.Popen, logs: Path) -> tuple[str, str]:
    """Both processes' exits (the evaluator's 130: INTERRUPTED), and their logs."""
    try:
        assert evaluator.wait(timeout=90) == INTERRUPTED_EXIT, (logs / "serve.log").read_text()[-3000:]
        # Told at once: a lost reply would keep it waiting for its reply timeout.
        assert agent.wait(timeout=PROMPT_S) == 1, (logs / "runner.log").read_text()[-3000:]
    finally:
        stop(evaluator, agent)
    return (logs / "serve.log").read_text(), (logs / "runner.log").read_text()


@pytest.mark.timeout(240)
def test_a_full_results_disk_interrupts_at_once_and_resume_plays_the_cut_item_whole(
    small_disk, redis_url, service_id, tmp_path
):
    competition, submission = evaluation_files(tmp_path)
    results = small_disk / "results"
    filler = small_disk / "filler"
    stat = os.statvfs(small_disk)
    # About 160 KiB left: room for phase 1's items and the files around them, not for the training
    # run's thousand records (about half a MiB).
    filler.write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - (160 << 10)))

    evaluator = serve(competition, results, redis_url, service_id, tmp_path / "serve.log")
    agent = runner(submission, redis_url, service_id, tmp_path / "runner.log")
    serve_log, runner_log = ended_promptly(evaluator, agent, tmp_path)

    summary = read_summary(str(results))
    assert summary["state"] == "INTERRUPTED"
    assert "episodes.jsonl: No space left on device" in summary["termination_cause"]
    assert "--resume" in summary["termination_cause"]
    assert "No space left on device" in runner_log  # the agent's pending step was answered with the cause
    assert "Traceback" not in serve_log
    assert leftovers(results) == []
    phase1_only(results)

    # Space freed: the evaluation goes on with the training run, played again from its start.
    filler.unlink()
    evaluator = serve(competition, results, redis_url, service_id, tmp_path / "serve.log", resume=True)
    agent = runner(submission, redis_url, service_id, tmp_path / "runner.log")
    try:
        assert agent.wait(timeout=120) == 0, (tmp_path / "runner.log").read_text()[-3000:]
        assert evaluator.wait(timeout=30) == 0, (tmp_path / "serve.log").read_text()[-3000:]
    finally:
        stop(evaluator, agent)
    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS" and summary["counters"]["resumed"] == 1
    train = [r for r in read_episodes(str(results)) if r["stage"] == "train"]
    assert len(train) == TRAINING_STEPS // 5 and sum(r["steps"] for r in train) == TRAINING_STEPS
    assert [r["episode"] for r in train] == list(range(len(train)))  # one run, whole, from its start
    rescored = subprocess.run([sys.executable, "-m", "arbiter.server.cli", "rescore", str(results)],
                              capture_output=True, text=True, cwd=REPO, timeout=60)  # fmt: skip
    assert rescored.returncode == 0 and "matches summary.json" in rescored.stdout, rescored.stdout + rescored.stderr
    assert leftovers(results) == []


@pytest.mark.timeout(120)
def test_a_results_folder_turned_read_only_interrupts_at_once_with_the_cause_on_stderr(redis_url, service_id, tmp_path):
    competition, submission = evaluation_files(tmp_path)
    results = tmp_path / "results"
    evaluator = serve(competition, results, redis_url, service_id, tmp_path / "serve.log")
    agent = runner(submission, redis_url, service_id, tmp_path / "runner.log")
    mounted = False
    try:
        # Phase 1 is written (its events come once both files have it); the training run goes on
        # for a thousand episodes.
        wait_for(lambda: len([e for e in read_events(str(results)) if e["event"] == "episode"]) == 2, timeout_s=60,
                 what="phase 1")  # fmt: skip
        mount_or_skip("--bind", str(results), str(results))
        mounted = True
        mount_or_skip("-o", "remount,bind,ro", str(results))
        serve_log, runner_log = ended_promptly(evaluator, agent, tmp_path)
        assert not (results / "summary.json").exists()  # it could not be written ...
        assert "Read-only file system" in runner_log
        assert "Traceback" not in serve_log
        # ... so stderr says how the evaluation ended, and why.
        assert "summary.json" in serve_log and "INTERRUPTED" in serve_log
        assert "episodes.jsonl: Read-only file system" in serve_log
        assert leftovers(results) == []
        phase1_only(results)
    finally:
        stop(evaluator, agent)
        if mounted:
            unmount(results)


# -- the store on its own: a write the disk refuses takes nothing with it -----------------------


def record(index: int, n: int = 0, padding: int = 0, last: bool = True) -> dict:
    """A record as the core makes it (``last``: the last of its item)."""
    return {"index": index, "unit": f"item-{index}", "n": n, "pad": "x" * padding, "last_of_item": last}


def test_an_item_the_disk_cannot_hold_leaves_the_folder_as_it_was(small_disk):
    store = ResultsStore(str(small_disk / "r"), ["index", "n"], lambda r: {"index": r["index"], "n": r["n"]})
    store.add_episodes([record(0)])
    before = {name: (small_disk / "r" / name).read_bytes() for name in ("episodes.jsonl", "results.csv")}
    with pytest.raises(ResultsUnwritable, match=r"episodes.jsonl: No space left on device"):
        store.add_episodes([record(1, n, padding=1000, last=n == 2999) for n in range(3000)])  # 3 MB into 2 MiB
    assert {name: (small_disk / "r" / name).read_bytes() for name in before} == before
    assert store.unwritable is not None and leftovers(small_disk) == []
    assert read_records(store.episodes_path) == [record(0)]


def test_an_item_whose_csv_rows_the_disk_cannot_hold_is_taken_back_out_of_episodes(small_disk):
    # Rows far larger than their records: an item's lines fit, results.csv rewritten with it does not.
    def large_row(r: dict) -> dict:
        return {"index": r["index"], "blob": "y" * 100_000}

    store = ResultsStore(str(small_disk / "r"), ["index", "blob"], large_row)
    added = []
    with pytest.raises(ResultsUnwritable, match=r"results.csv: No space left on device"):
        for index in range(40):
            store.add_episodes([record(index)])
            added.append(index)
    assert 0 < len(added) < 40
    assert read_records(store.episodes_path) == [record(index) for index in added]  # not the refused one
    with open(store.csv_path, encoding="utf-8") as handle:
        assert [row["index"] for row in csv.DictReader(handle)] == [str(index) for index in added]
    assert leftovers(small_disk) == []


def test_rows_refused_after_their_reply_stay_due_and_their_item_stays(small_disk, caplog):
    # The service appends an item's rows once its reply has gone: by then the item stands (durable
    # in episodes.jsonl, the agent told), so a refusal there keeps the item and the rows stay due.
    # They are written again before the next item's records, where a refusal is raised.
    def large_row(r: dict) -> dict:
        return {"index": r["index"], "blob": "y" * 100_000}

    folder = str(small_disk / "r")
    store = ResultsStore(folder, ["index", "blob"], large_row)
    for index in range(40):
        store.add_episodes([record(index)], rows_later=True)
        store.write_due_rows(replied=True)
        if len(table_indices(store)) <= index:
            break
    refused = index
    assert 0 < refused < 39
    assert table_indices(store) == [str(i) for i in range(refused)]
    assert read_records(store.episodes_path) == [record(i) for i in range(refused + 1)]  # the refused one too
    assert store.unwritable is None  # logged, not remembered: the evaluation goes on
    assert "results.csv refused the rows due (1): [Errno 28] No space left on device" in caplog.text
    with pytest.raises(ResultsUnwritable, match=r"results.csv: No space left on device"):
        store.add_episodes([record(refused + 1)], rows_later=True)  # its rows first: still refused
    assert read_records(store.episodes_path) == [record(i) for i in range(refused + 1)]  # not the next item
    assert store.unwritable is not None and leftovers(small_disk) == []

    os.remove(store.csv_path)  # space freed, and rows that fit: the resume writes the table whole
    resumed = ResultsStore(folder, ["index"], lambda r: {"index": r["index"]})
    assert resumed.load_for_resume() == [record(i) for i in range(refused + 1)]
    assert table_indices(resumed) == [str(i) for i in range(refused + 1)]


def table_indices(store: ResultsStore) -> list[str]:
    with open(store.csv_path, encoding="utf-8") as handle:
        return [row["index"] for row in csv.DictReader(handle)]
