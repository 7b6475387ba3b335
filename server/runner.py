"""``arbiter run``: a whole local evaluation in one command.

Redis (the given one, or an embedded redis-server), the evaluator in this process, and the
agent command as a child process with the connection settings in its environment.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from dataclasses import dataclass
from urllib.parse import urlparse

from .competition import CompetitionSpec
from .embedded_redis import EmbeddedRedis
from .evaluation import State
from .evaluator import run_to_end, start_service
from .progress import Progress

log = logging.getLogger(__name__)

AGENT_EXIT_GRACE_S = 10.0  # after the evaluation ends, time the agent gets to exit by itself


@dataclass
class RunOutcome:
    summary: dict
    agent_status: int | None
    exit_code: int


def agent_environment(redis_url: str, service_id: str, tests: str) -> dict[str, str]:
    """What the agent needs to connect: arbiter's variables and flatland's legacy ones."""
    env = dict(os.environ)
    env["ARBITER_REDIS_URL"] = redis_url
    env["AICROWD_SUBMISSION_ID"] = service_id
    env["redis_ip"] = urlparse(redis_url).hostname or "127.0.0.1"
    env["AICROWD_TESTS_FOLDER"] = os.path.abspath(tests)
    return env


def _stop_agent(agent: subprocess.Popen) -> None:
    try:
        agent.wait(timeout=AGENT_EXIT_GRACE_S)
    except subprocess.TimeoutExpired:
        log.warning("the agent did not exit %g s after the evaluation ended; terminating it", AGENT_EXIT_GRACE_S)
        agent.terminate()
        try:
            agent.wait(timeout=5)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()


def run_local(
    spec: CompetitionSpec,
    *,
    agent_command: list[str],
    tests: str,
    results_dir: str,
    service_id: str,
    redis_url: str | None,
    progress: Progress,
    redis_outage_s: float = 60.0,
) -> RunOutcome:
    embedded: EmbeddedRedis | None = None
    if redis_url is None:
        embedded = EmbeddedRedis()
        embedded.start()
        redis_url = embedded.url
        if embedded.port != 6379:
            progress.note(
                f"arbiter: port 6379 is busy, so the embedded Redis listens on {embedded.port}; agents using "
                "flatland's FlatlandRemoteClient with its default port will not reach it"
            )
    agent = None
    try:
        service = start_service(
            spec,
            tests=tests,
            results_dir=results_dir,
            redis_url=redis_url,
            service_id=service_id,
            progress=progress,
            redis_outage_s=redis_outage_s,
        )
        try:
            agent = subprocess.Popen(agent_command, env=agent_environment(redis_url, service_id, tests))
        except OSError as exc:
            service.evaluation.finish(State.FAILED, f"cannot start the agent {agent_command!r}: {exc}", 0.0)
            summary = service.evaluation.summary()
            progress.finished(summary, service.evaluation.records, results_dir)
            return RunOutcome(summary, None, 1)

        def watch_agent() -> None:
            service.agent_exited(agent.wait())

        threading.Thread(target=watch_agent, name="agent-watcher", daemon=True).start()
        summary = run_to_end(service, progress, results_dir)
        _stop_agent(agent)
        status = agent.returncode
        if summary["state"] == State.SUCCESS.value:
            exit_code = 0 if status in (0, None) else 1
        elif summary["state"] == State.INTERRUPTED.value:
            exit_code = 130
        else:
            exit_code = 1
        return RunOutcome(summary, status, exit_code)
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait()
        if embedded is not None:
            embedded.stop()
