"""A killed `arbiter run` continued by `arbiter run --resume` (its own Redis again, the agent
started again) or by `arbiter serve --resume` given the results folder and the same Redis, not its
test folder: the folder the run played comes from `seed.json`."""

from __future__ import annotations

import html
import json
import os
import shutil
import signal
import subprocess
import sys

import paths
import pytest
from harness import play_episode, read_episodes, read_summary, wait_for

from arbiter.client import RemoteClient

ARBITER = [sys.executable, "-m", "arbiter.server.cli"]

# Plays the first episode, asks for the second (its reply comes once the first is durable), then
# waits to be killed with the run.
FIRST_EPISODE_AGENT = """
import time
from arbiter.client import RemoteClient

client = RemoteClient()
client.env_create()
while not client.env_step({handle: 2 for handle in client.env.get_agent_handles()})[2]["__all__"]:
    pass
client.env_create()
time.sleep(120)
"""


def killed_after_its_first_episode(
    options: list[str], results, cwd, environment: dict[str, str], signum: int = signal.SIGKILL
) -> None:
    """`arbiter run` with ``options``, its agent playing one episode, killed (``signum``) once that
    episode is on record."""
    run = subprocess.Popen(
        [*ARBITER, "run", *options, "--results", str(results), "--quiet", "--", sys.executable, "-c",
         FIRST_EPISODE_AGENT],
        cwd=str(cwd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environment,
    )  # fmt: skip
    try:
        wait_for(lambda: len(read_episodes(str(results), missing_ok=True)) == 1, what="the first episode's record")
        run.send_signal(signum)
        run.wait(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


def test_serve_resume_plays_the_test_folder_a_killed_local_run_started_on(redis_url, service_id, tiny_tests, tmp_path):
    results = tmp_path / "r"
    environment = {name: value for name, value in os.environ.items() if name != "AICROWD_TESTS_FOLDER"}
    killed_after_its_first_episode(
        ["--tests", tiny_tests, "--redis-url", redis_url, "--service-id", service_id], results, tmp_path, environment
    )
    assert json.loads((results / "seed.json").read_text())["tests"] == os.path.abspath(tiny_tests)

    serve = subprocess.Popen(
        [*ARBITER, "serve", "--resume", "--results", str(results), "--redis-url", redis_url,
         "--service-id", service_id, "--quiet"],
        cwd=str(paths.REPO), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=environment,
    )  # fmt: skip
    try:
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=30, resend_after_s=0.3)
        while client.env_create()[0]:
            play_episode(client, client.episode_index)
        client.submit()
        assert serve.wait(timeout=60) == 0
        stderr = serve.stderr.read()
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    assert f"playing the test folder the evaluation started on, {os.path.abspath(tiny_tests)}" in stderr
    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS" and summary["episodes"]["recorded"] == 3
    assert [record["index"] for record in read_episodes(str(results))] == [0, 1, 2]


def test_serve_resume_without_tests_or_a_recorded_folder_asks_for_them(redis_url, service_id, tmp_path):
    results = tmp_path / "r"
    results.mkdir()
    (results / "seed.json").write_text(json.dumps({"seed": 1001, "drawn": False}) + "\n")  # as written before
    environment = {name: value for name, value in os.environ.items() if name != "AICROWD_TESTS_FOLDER"}
    done = subprocess.run(
        [*ARBITER, "serve", "--resume", "--results", str(results), "--redis-url", redis_url,
         "--service-id", service_id],
        capture_output=True, text=True, timeout=60, env=environment,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"arbiter: error: --resume: {results} names no test folder (no seed.json): give it with --tests DIR" in (
        done.stderr
    )


def test_serve_resume_on_another_test_folder_than_the_evaluation_started_on_is_refused(redis_url, service_id, tmp_path):
    """Item names match across test sets (Test_0/Level_0.pkl); the data behind them need not."""
    results = tmp_path / "r"
    results.mkdir()
    started_on = tmp_path / "tests-a"
    (results / "seed.json").write_text(json.dumps({"seed": 1001, "drawn": False, "tests": str(started_on)}) + "\n")
    (results / "events.jsonl").write_text("")
    done = subprocess.run(
        [*ARBITER, "serve", "--resume", "--results", str(results), "--redis-url", redis_url,
         "--service-id", service_id, "--tests", str(tmp_path / "tests-b")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert (
        f"--resume: the evaluation started on the test folder {started_on}, not {tmp_path / 'tests-b'}" in done.stderr
    )
    assert sorted(p.name for p in results.iterdir()) == ["events.jsonl", "seed.json"]  # nothing touched


FORWARD_AGENT = """
from arbiter.client import RemoteClient

client = RemoteClient()
while client.env_create()[0]:
    while not client.env_step({handle: 2 for handle in client.env.get_agent_handles()})[2]["__all__"]:
        pass
client.submit()
"""


def test_run_resume_continues_a_killed_run_with_its_own_redis_and_scores_as_an_uninterrupted_one(tiny_tests, tmp_path):
    """The killed run's embedded Redis went with it: `run --resume` starts another, plays the
    test folder and seed the run started with, keeps its participant, and starts the agent again."""
    environment = {name: value for name, value in os.environ.items() if name != "AICROWD_TESTS_FOLDER"}
    results = tmp_path / "r"
    killed_after_its_first_episode(["--tests", tiny_tests, "--participant", "ada"], results, tmp_path, environment)
    resumed = subprocess.run(
        [*ARBITER, "run", "--resume", "--results", str(results), "--", sys.executable, "-c", FORWARD_AGENT],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=120, env=environment,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert f"playing the test folder the evaluation started on, {os.path.abspath(tiny_tests)}" in resumed.stderr
    assert f"arbiter: evaluating 3 episodes of {tiny_tests}, 1 already on record (" in resumed.stderr
    whole = subprocess.run(
        [*ARBITER, "run", "--tests", tiny_tests, "--results", str(tmp_path / "whole"), "--quiet",
         "--", sys.executable, "-c", FORWARD_AGENT],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=120, env=environment,
    )  # fmt: skip
    assert whole.returncode == 0, whole.stderr
    summary, uninterrupted = read_summary(str(results)), read_summary(str(tmp_path / "whole"))
    assert summary["state"] == "SUCCESS" and summary["counters"]["resumed"] == 1
    assert summary["submission"]["participant"] == "ada"
    # Episode 0 was played by the killed run's agent (always forward too), the rest after the resume.
    assert summary["score"] == uninterrupted["score"]
    assert [r["index"] for r in read_episodes(str(results))] == [0, 1, 2]


def test_run_resume_needs_a_folder_holding_an_evaluation(tmp_path):
    done = subprocess.run([*ARBITER, "run", "--resume", "--", "true"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--resume needs the --results folder of the evaluation to continue" in done.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run(
        [*ARBITER, "run", "--resume", "--results", str(empty), "--competition", "two-phase-cartpole", "--", "true"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"--resume: {empty} holds no evaluation to continue (no events.jsonl or episodes.jsonl)" in done.stderr
    assert not any(empty.iterdir())
    # A Flatland run, whose resume looks for the test folder the evaluation started on: the folder
    # holding nothing is what is said, not "give it with --tests DIR".
    missing = tmp_path / "missing"
    done = subprocess.run(
        [*ARBITER, "run", "--resume", "--results", str(missing), "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and f"--resume: {missing} holds no evaluation to continue" in done.stderr
    assert not missing.exists()


def test_a_resume_under_other_settings_than_the_evaluation_started_with_is_refused(tiny_tests, tmp_path):
    """Its items would be played under another budget or rule than the earlier ones: refused,
    each difference named, and the folder left as it was."""
    environment = {name: value for name, value in os.environ.items() if name != "AICROWD_TESTS_FOLDER"}
    results = tmp_path / "r"
    killed_after_its_first_episode(["--tests", tiny_tests], results, tmp_path, environment)
    before = {path.name: path.read_bytes() for path in results.iterdir() if path.is_file()}
    refused = subprocess.run(
        [*ARBITER, "run", "--resume", "--results", str(results), "--step-timeout", "2", "--scoring", "flatland3",
         "--", sys.executable, "-c", FORWARD_AGENT],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=120, env=environment,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "--resume: the evaluation started under other settings than these: scoring 'neurips2020' (given now: " in (
        refused.stderr
    )
    assert "budgets.step_s 5 (given now: 2.0)" in refused.stderr
    assert {path.name: path.read_bytes() for path in results.iterdir() if path.is_file()} == before


def test_a_resume_under_another_format_is_refused_before_it_writes_anything(tiny_tests, tmp_path):
    """The folder's table (Flatland's columns) is not rewritten in the other format's columns,
    and no file is added, whether the first run's settings are in events.jsonl or it is gone and
    the plan's items tell the folder apart."""
    environment = {name: value for name, value in os.environ.items() if name != "AICROWD_TESTS_FOLDER"}
    results = tmp_path / "r"
    killed_after_its_first_episode(["--tests", tiny_tests], results, tmp_path, environment)
    for events in ("kept", "lost"):
        if events == "lost":
            (results / "events.jsonl").unlink()
        before = {path.name: path.read_bytes() for path in results.iterdir()}
        refused = subprocess.run(
            [*ARBITER, "run", "--resume", "--results", str(results), "--competition", "two-phase-cartpole",
             "--", sys.executable, "-c", "pass"],
            cwd=str(tmp_path), capture_output=True, text=True, timeout=120, env=environment,
        )  # fmt: skip
        assert refused.returncode == 2
        assert ("competition 'flatland-neurips2020' (given now: 'two-phase-cartpole')" if events == "kept" else
                "the results folder does not belong to this test set or plan: item 0") in refused.stderr  # fmt: skip
        assert {path.name: path.read_bytes() for path in results.iterdir()} == before, events


DIAMBRA_EXAMPLE = str(paths.REPO / "examples" / "diambra_agent" / "agent.py")


DIAMBRA_OPTIONS = ["--competition", "diambra", "--set", "episodes=1", "--set", "frame_shape=[64, 64, 1]"]


def killed_after_its_last_item(redis_url, service_id, tmp_path):
    """A DIAMBRA evaluation of one episode as a SIGKILL between the episode's record and the
    summary leaves it, and the folder of the same evaluation played to its end."""
    pytest.importorskip("diambra.arena")
    played = tmp_path / "played"
    whole = subprocess.run(
        [*ARBITER, "run", *DIAMBRA_OPTIONS, "--redis-url", redis_url, "--service-id", service_id + "-a",
         "--results", str(played), "--quiet", "--", sys.executable, DIAMBRA_EXAMPLE],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert whole.returncode == 0, whole.stderr[-3000:]
    results = tmp_path / "killed"
    shutil.copytree(played, results)
    (results / "summary.json").unlink()
    events = (results / "events.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (results / "events.jsonl").write_text("".join(e for e in events if '"event":"finished"' not in e), "utf-8")
    return played, results


NOTHING_LEFT_CAUSE = (
    "the 1 episode evaluated; every item was on record when the evaluation resumed: nothing was left to play, "
    "so no agent was started"
)


def test_serve_resume_with_no_agent_ends_at_once_when_every_item_is_on_record(redis_url, service_id, tmp_path):
    """What the Kubernetes backend runs when every item is on record (it starts no agent):
    `serve --resume --no-agent` ends at once, SUCCESS with the uninterrupted run's score."""
    played, results = killed_after_its_last_item(redis_url, service_id, tmp_path)
    served = subprocess.run(
        [*ARBITER, "serve", "--resume", "--no-agent", *DIAMBRA_OPTIONS, "--redis-url", redis_url,
         "--service-id", service_id, "--results", str(results)],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert served.returncode == 0, served.stderr[-3000:]
    assert "waiting" not in served.stderr and "no agent comes (--no-agent)" in served.stderr
    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS" and summary["termination_cause"] == NOTHING_LEFT_CAUSE
    assert summary["score"] == read_summary(str(played))["score"]


def test_serve_no_agent_with_items_left_or_without_resume_is_refused_and_keeps_the_folder(
    redis_url, service_id, tmp_path
):
    _, results = killed_after_its_last_item(redis_url, service_id, tmp_path)
    (results / "episodes.jsonl").write_text("", encoding="utf-8")  # killed inside its only episode
    before = (results / "events.jsonl").read_text(encoding="utf-8")
    serve = [*ARBITER, "serve", "--no-agent", *DIAMBRA_OPTIONS, "--redis-url", redis_url, "--service-id", service_id,
             "--results", str(results)]  # fmt: skip
    refused = subprocess.run([*serve, "--resume"], cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "--no-agent: not every item is on record (1 episode of 1 left to play)" in refused.stderr
    assert not (results / "summary.json").exists() and (results / "episodes.jsonl").read_text() == ""
    assert (results / "events.jsonl").read_text(encoding="utf-8").startswith(before)
    alone = subprocess.run(serve, cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert alone.returncode == 2 and "--no-agent goes with --resume" in alone.stderr


def test_run_resume_with_every_item_on_record_ends_without_starting_the_agent(redis_url, service_id, tmp_path):
    """Killed after its last item and before its summary: nothing is left to play, so the agent is
    not started (DIAMBRA's loop, told so by its first reset, would step on and exit 1) nor said to
    be waited for; the run ends SUCCESS with the uninterrupted run's score and exit status 0, and says why."""
    played, results = killed_after_its_last_item(redis_url, service_id, tmp_path)
    options = [*DIAMBRA_OPTIONS, "--redis-url", redis_url]
    resumed = subprocess.run(
        [*ARBITER, "run", "--resume", *options, "--service-id", service_id, "--results", str(results),
         "--", sys.executable, DIAMBRA_EXAMPLE],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "nothing is left to play, so the agent is not started" in resumed.stderr
    started = [line for line in resumed.stderr.splitlines() if line.startswith(f"arbiter: service id {service_id!r}")]
    assert started == [f"arbiter: service id {service_id!r} on {redis_url}"]  # no agent is waited for
    assert "submitted:" not in resumed.stdout  # the agent never ran
    summary = read_summary(str(results))
    assert summary["state"] == "SUCCESS"
    assert summary["termination_cause"] == NOTHING_LEFT_CAUSE
    assert summary["score"] == read_summary(str(played))["score"]
    assert summary["counters"]["resumed"] == 1


def test_a_local_run_names_arbiter_run_resume_as_its_way_to_go_on(redis_url, service_id, tiny_tests, tmp_path):
    """What a user reads about an `arbiter run` stopped or killed before its end (its report, a
    results folder it cannot write) names `arbiter run --resume` with the options the run started
    with, the way to go on with it: without them, a run started under another budget is refused."""
    results = tmp_path / "r"
    connection = ["--redis-url", redis_url, "--service-id", service_id]
    options = ["--tests", tiny_tests, "--step-timeout", "30", *connection]
    killed_after_its_first_episode(options, results, tmp_path, dict(os.environ), signum=signal.SIGTERM)
    assert read_summary(str(results))["state"] == "INTERRUPTED"
    bare = subprocess.run(
        [*ARBITER, "run", "--resume", "--results", str(results), *connection, "--", sys.executable, "-c", "pass"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bare.returncode == 2 and "budgets.step_s 30.0 (given now: 5)" in bare.stderr, bare.stderr
    resume = f"`arbiter run --resume --results {results} [the same options] -- AGENT_COMMAND`"
    # the page is read later, from anywhere: it names the folder's absolute path, however given
    report = subprocess.run([*ARBITER, "report", "r"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    page = html.unescape((results / "report.html").read_text(encoding="utf-8"))
    assert f"the evaluation was interrupted before it ended ({resume} continues it)" in page
    (results / "summary.json").unlink()  # as a SIGKILL leaves it
    report = subprocess.run([*ARBITER, "report", str(results)], capture_output=True, text=True, timeout=60)
    assert report.returncode == 2 and f"its evaluator was killed ({resume} finishes it)" in report.stderr

    from arbiter.server.service.results import ResultsStore, ResultsUnwritable

    store = ResultsStore(str(tmp_path / "gone"), ["index"], lambda record: {"index": record["index"]})
    store.command = "run"
    store.start_fresh()
    shutil.rmtree(tmp_path / "gone")
    with pytest.raises(
        ResultsUnwritable,
        match=r"`arbiter run --resume --results DIR \[the same options\] -- AGENT_COMMAND` continues it",
    ):
        store.write_summary({"state": "INTERRUPTED"})


def test_a_resume_on_a_test_folder_whose_contents_changed_is_refused_before_it_writes(tiny_tests, tmp_path):
    """The folder the run started on, regenerated with other episodes at the same path: its
    remaining episodes are not that evaluation's, so the resume is refused and writes nothing."""
    environment = {name: value for name, value in os.environ.items() if name != "AICROWD_TESTS_FOLDER"}
    tests, results = tmp_path / "tests", tmp_path / "r"
    shutil.copytree(tiny_tests, tests)
    killed_after_its_first_episode(["--tests", str(tests)], results, tmp_path, environment)
    recorded = json.loads((results / "seed.json").read_text())["tests_digest"]
    level = next(tests.rglob("*.pkl"))
    level.write_bytes(level.read_bytes() + b"\0")  # another episode under the same name
    before = {path.name: path.read_bytes() for path in results.iterdir() if path.is_file()}
    resumed = subprocess.run(
        [*ARBITER, "run", "--resume", "--results", str(results), "--quiet", "--", sys.executable, "-c", FORWARD_AGENT],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=120, env=environment,
    )  # fmt: skip
    assert resumed.returncode == 2, resumed.stderr
    assert "the test folder's contents changed since the evaluation" in resumed.stderr
    assert f"was {recorded.removeprefix('sha256:')[:12]}" in resumed.stderr
    assert {path.name: path.read_bytes() for path in results.iterdir() if path.is_file()} == before
