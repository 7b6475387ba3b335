"""agent.log (server/hosting/agent_log.py): what a hosted evaluation's agent printed is in its
results folder, one part per attempt, each headed by its attempt and its start, capped; the
evaluation's cause names the file and never carries what the agent printed."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from pathlib import Path

import redis
from containers import RUNTIME, containers_of, open_to_all, reachable_mounts, remove_containers_of
from harness import in_forked_child, read_summary, wait_for
from hosting_farm import competition_file, seeded_agent

from arbiter.server.hosting import job
from arbiter.server.hosting.agent_log import AGENT_LOG_CAP_BYTES, AGENT_LOG_TAIL_BYTES
from arbiter.server.hosting.backends import LocalBackend
from arbiter.server.hosting.containers import ContainerBackend
from arbiter.server.hosting.farm import submit
from arbiter.server.hosting.submissions import AGENT_FAULT, FAILED, FINISHED, QUEUED, RUNNING, SubmissionStore

SECRET = "observed-env-7f3a"  # what a failing agent prints before its traceback
HEADER = re.compile(r"^=== arbiter: attempt (\d+), agent started (\S+) ===$", re.MULTILINE)


def run_job(redis_url: str, results_root: str, submission_id: str, backend=None) -> str:
    """``evaluate_submission`` in a child process, as a work-horse runs it."""

    def evaluate() -> str:
        job.configure(job.WorkerSettings(redis_url, results_root, backend or LocalBackend(), worker_name="test"))
        return job.evaluate_submission(submission_id)

    return in_forked_child(evaluate)[1]


def agent_log(results: str) -> str:
    return Path(results, "agent.log").read_text(encoding="utf-8", errors="replace")


def test_a_failing_agent_s_traceback_is_in_agent_log_and_its_cause_only_points_there(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path
) -> None:
    # (an idle budget long enough that the agent's exit, not its not connecting, ends the evaluation)
    competition = competition_file(tmp_path, tiny_tests, idle_s=30)
    crash = f"print({SECRET!r}, flush=True); import no_such_module_of_the_agent"
    submission = submit(redis_conn, competition=competition, participant="alice", agent=[sys.executable, "-c", crash])

    run_job(redis_url, str(tmp_path / "results"), submission.id)

    found = SubmissionStore(redis_conn).get(submission.id)
    assert found.state == FAILED and found.fault == AGENT_FAULT
    assert found.cause.endswith(
        "exited with status 1 before submitting; no episode was played; its output is in agent.log"
    )
    summary = read_summary(found.results)
    assert summary["termination_cause"] == found.cause
    written = agent_log(found.results)
    assert HEADER.match(written).group(1) == "1", written
    assert SECRET in written and "Traceback (most recent call last)" in written
    assert "ModuleNotFoundError: No module named 'no_such_module_of_the_agent'" in written
    assert SECRET not in Path(found.results, "summary.json").read_text(encoding="utf-8")


def test_a_resumed_evaluation_s_agent_log_holds_every_attempt_under_its_header(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path
) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    fast = tmp_path / "fast"  # the agent is slow until this file exists: the second attempt's is not
    slow = seeded_agent(0.02, slow_until=str(fast))[2]
    agent = ["sh", "-c", f'echo "agent up, attempt of $AICROWD_SUBMISSION_ID"; {slow}']
    submission = submit(redis_conn, competition=competition, participant="dave", agent=agent)
    store = SubmissionStore(redis_conn)
    attempt = store.change(submission.id, (QUEUED,), state=RUNNING, attempts=1)
    root = str(tmp_path / "results")
    results = job.results_folder(root, attempt)

    def stop_after_the_first_episode() -> None:
        wait_for(lambda: os.path.exists(os.path.join(results, "episodes.jsonl")), what="the first episode")
        os.kill(os.getpid(), signal.SIGTERM)  # the farm stops the attempt

    def first_attempt() -> str:
        from arbiter.server.core.competition import load_competition

        threading.Thread(target=stop_after_the_first_episode, daemon=True).start()
        return (
            LocalBackend()
            .evaluate(load_competition(competition), attempt, results_dir=results, resume=False)
            .summary["state"]
        )

    assert in_forked_child(first_attempt)[1] == "INTERRUPTED"
    fast.touch()
    store.change(submission.id, (RUNNING,), state=QUEUED)  # queued again, as the farm does
    run_job(redis_url, root, submission.id)

    done = store.get(submission.id)
    assert done.state == FINISHED and done.attempts == 2, done.cause
    written = agent_log(results)
    headers = list(HEADER.finditer(written))
    assert [header.group(1) for header in headers] == ["1", "2"], written
    assert headers[0].group(2) < headers[1].group(2) and headers[0].group(2).endswith("+00:00")
    first, second = written[headers[0].end() : headers[1].start()], written[headers[1].end() :]
    assert f"agent up, attempt of {submission.id}" in first and f"agent up, attempt of {submission.id}" in second
    assert '"score"' not in first and '"score"' in second, "only the second agent submitted"


def test_an_agent_printing_far_past_the_cap_leaves_a_capped_log_and_scores_as_otherwise(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path
) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    flood = 3 * AGENT_LOG_CAP_BYTES
    chatty = ["sh", "-c", f"head -c {flood} /dev/zero | tr '\\0' x >&2; " + seeded_agent()[2]]
    store = SubmissionStore(redis_conn)
    scores = {}
    for name, agent in (("quiet", seeded_agent()), ("chatty", chatty)):
        submission = submit(redis_conn, competition=competition, participant=name, agent=agent)
        run_job(redis_url, str(tmp_path / "results"), submission.id)
        found = store.get(submission.id)
        assert found.state == FINISHED, found.cause
        scores[name] = (found.score, read_summary(found.results)["episodes"])
    assert scores["chatty"] == scores["quiet"] and scores["quiet"][0] is not None

    raw = Path(found.results, "agent.log").read_bytes()
    header, rest = raw.split(b"\n", 1)
    assert HEADER.match(header.decode())
    head_bytes = AGENT_LOG_CAP_BYTES - AGENT_LOG_TAIL_BYTES
    # The local backend's socket bridge may say first that another program holds 127.0.0.1:6379.
    before = rest[: rest.index(b"x")]
    assert all(line.startswith(b"arbiter socket bridge: ") for line in before.splitlines()), before
    assert rest[:head_bytes] == before + b"x" * (head_bytes - len(before))
    cut = re.search(rb"\n=== arbiter: output cut here, (\d+) bytes dropped ===\n", rest)
    assert cut is not None and cut.start() == head_bytes
    tail = rest[cut.end() :]
    assert len(tail) == AGENT_LOG_TAIL_BYTES and tail.endswith(b"}\n")  # ends with the agent's submit reply
    reply = tail[tail.rindex(b"x") + 1 :]
    kept_or_dropped = len(before) + flood + len(reply) - AGENT_LOG_CAP_BYTES
    assert int(cut.group(1)) == kept_or_dropped, "every byte kept or counted as dropped"
    assert len(raw) < AGENT_LOG_CAP_BYTES + 1024


def test_a_failing_agent_s_output_in_a_podman_container_is_in_agent_log(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path, podman_env
) -> None:
    """The participant's mistake: a file its agent command names is not in its working folder."""
    # The agent's exit ends the evaluation: an idle budget that a loaded machine's container start
    # could outlast would end it first, as the agent's not connecting.
    competition = competition_file(tmp_path, tiny_tests, idle_s=30)
    workdir = tmp_path / "agent"
    workdir.mkdir()
    (workdir / "run.py").write_text("print('the agent is run.py')\n", encoding="utf-8")
    open_to_all(workdir)
    submission = submit(
        redis_conn, competition=competition, participant="alice", agent=[sys.executable, "agent.py"],
        workdir=str(workdir), image="rootfs:/",
    )  # fmt: skip
    options = [option.split("=", 1)[1] for option in reachable_mounts(tmp_path / "mounts")]
    try:
        run_job(redis_url, str(tmp_path / "results"), submission.id, ContainerBackend("podman", runtime=RUNTIME,
                options=options))  # fmt: skip
        found = SubmissionStore(redis_conn).get(submission.id)
        assert found.state == FAILED and found.fault == AGENT_FAULT, found.cause
        assert found.cause.endswith(
            "exited with status 2 before submitting; no episode was played; its output is in agent.log"
        )
        written = agent_log(found.results)
        assert HEADER.match(written).group(1) == "1", written
        assert "can't open file '/submission/agent.py': [Errno 2] No such file or directory" in written
        assert containers_of(submission.id, podman_env) == []
    finally:
        remove_containers_of([submission.id], podman_env)
