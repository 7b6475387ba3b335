"""``arbiter run``: a whole local evaluation in one command.

Redis (the given one, or an embedded redis-server), the evaluator in this process, and the
agent command as a child process with the connection settings in its environment.

Stopping (Ctrl-C, SIGTERM, SIGHUP): the agent runs in its own process group, so a terminal's
Ctrl-C reaches arbiter alone, which ends the evaluation as INTERRUPTED, passes the signal on to
the agent's whole group at once, kills the group if it is still there ``AGENT_INTERRUPT_GRACE_S``
later (at once on a second signal), then stops the embedded Redis. When ``arbiter run`` returns,
no process of the agent's group is left.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlparse

from arbiter.protocol.redis_conn import redacted

from .competition import CompetitionSpec
from .embedded_redis import HOST, EmbeddedRedis
from .evaluation import State
from .evaluator import run_to_end, start_service
from .progress import Progress

log = logging.getLogger(__name__)

AGENT_EXIT_GRACE_S = 10.0  # after the evaluation ends, time the agent gets to exit by itself
AGENT_TERMINATE_GRACE_S = 5.0  # then, after SIGTERM, before SIGKILL
# After an interrupt is passed on, time the agent gets to exit before its group is killed: enough
# for a Python agent to unwind a KeyboardInterrupt, short enough that Ctrl-C means "stop now".
AGENT_INTERRUPT_GRACE_S = 2.0
AGENT_POLL_S = 0.02  # how often the wait for the agent to exit looks at the clock and at signals


@dataclass
class RunOutcome:
    summary: dict
    agent_status: int | None
    exit_code: int


def agent_environment(
    redis_url: str, service_id: str, tests: str | None, legacy_host: str | None = None
) -> dict[str, str]:
    """What the agent needs to connect: arbiter's variables and flatland's legacy ones
    (``legacy_host``: the TCP host for flatland's client, which knows no unix sockets; by
    default the URL's own host)."""
    env = dict(os.environ)
    env["ARBITER_REDIS_URL"] = redis_url
    env["AICROWD_SUBMISSION_ID"] = service_id
    env["redis_ip"] = legacy_host or urlparse(redis_url).hostname or "127.0.0.1"
    if tests is not None:
        env["AICROWD_TESTS_FOLDER"] = os.path.abspath(tests)
    return env


class AgentProcess:
    """The agent command, run in a process group of its own (its pgid is its pid).

    ``interrupt`` is called from the signal handler, so it only sets attributes and sends
    signals: no lock, no logging, no output."""

    def __init__(self, command: list[str], env: dict[str, str]):
        self.command = command
        self.env = env
        self.process: subprocess.Popen | None = None
        self.interrupted_at: float | None = None  # monotonic time of the first stop signal
        self._first_signal = signal.SIGINT
        self._interrupts = 0

    def start(self) -> None:
        # A process group in a terminal's background is stopped (SIGTTIN) if it reads from the
        # terminal: the agent reads an empty stdin instead.
        stdin = subprocess.DEVNULL if os.isatty(0) else None
        self.process = subprocess.Popen(self.command, env=self.env, stdin=stdin, process_group=0)
        if self._interrupts:  # a stop signal came while the agent was being started
            self._signal_group(self._first_signal if self._interrupts == 1 else signal.SIGKILL)

    def interrupt(self, signum: int) -> None:
        """A stop signal reached arbiter: the first is passed on to the agent's group, the
        second kills the group."""
        self._interrupts += 1
        if self._interrupts == 1:
            self._first_signal = signum
            self.interrupted_at = time.monotonic()
        if self.process is not None:
            self._signal_group(signum if self._interrupts == 1 else signal.SIGKILL)

    def _signal_group(self, signum: int) -> None:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass  # every process of the group has exited

    def stop(self, evaluation_ended_at: float) -> None:
        """Give the agent its grace to exit by itself, then end its whole group."""
        assert self.process is not None
        terminated_at: float | None = None
        while self.process.poll() is None:
            now = time.monotonic()
            if self.interrupted_at is not None:
                if now >= self.interrupted_at + AGENT_INTERRUPT_GRACE_S:
                    log.warning("the agent did not exit %g s after the interrupt; killing it", AGENT_INTERRUPT_GRACE_S)
                    break
            elif terminated_at is None and now >= evaluation_ended_at + AGENT_EXIT_GRACE_S:
                log.warning(
                    "the agent did not exit %g s after the evaluation ended; terminating it", AGENT_EXIT_GRACE_S
                )
                self._signal_group(signal.SIGTERM)
                terminated_at = now
            elif terminated_at is not None and now >= terminated_at + AGENT_TERMINATE_GRACE_S:
                break
            # Not process.wait(timeout): a signal arriving meanwhile shortens the grace.
            time.sleep(AGENT_POLL_S)
        self.kill()

    def kill(self) -> None:
        """SIGKILL whatever is left of the agent's group (processes it started included); reap it."""
        if self.process is not None:
            self._signal_group(signal.SIGKILL)
            self.process.wait()


def run_local(
    spec: CompetitionSpec,
    *,
    agent_command: list[str],
    tests: str | None,
    results_dir: str,
    service_id: str,
    redis_url: str | None,
    progress: Progress,
    redis_outage_s: float = 60.0,
) -> RunOutcome:
    embedded: EmbeddedRedis | None = None
    agent: AgentProcess | None = None
    legacy_host = None
    redis_label = None  # how the start line names the Redis: by default, the URL
    try:
        if redis_url is None:
            embedded = EmbeddedRedis()
            embedded.start()
            # arbiter's own sides speak over the unix socket; flatland's client over TCP
            redis_url = embedded.local_url
            legacy_host = HOST
            if redis_url != embedded.url:
                redis_label = f"{redacted(redis_url)} (flatland's client: {redacted(embedded.url)})"
            if embedded.port != 6379:
                progress.note(
                    f"arbiter: port 6379 is busy, so the embedded Redis listens on {embedded.port}; agents using "
                    "flatland's FlatlandRemoteClient with its default port will not reach it"
                )
        agent = AgentProcess(agent_command, agent_environment(redis_url, service_id, tests, legacy_host))
        service = start_service(
            spec,
            tests=tests,
            results_dir=results_dir,
            redis_url=redis_url,
            service_id=service_id,
            progress=progress,
            redis_outage_s=redis_outage_s,
            on_stop_signal=agent.interrupt,
            redis_label=redis_label,
        )
        if not service.stop_requested:  # stopped while it started: the agent never runs
            try:
                agent.start()
            except OSError as exc:
                service.evaluation.finish(State.FAILED, f"cannot start the agent {agent_command!r}: {exc}", 0.0)
                service.transport.close()
                summary = service.evaluation.summary()
                progress.finished(summary, service.evaluation, results_dir)
                return RunOutcome(summary, None, 1)
            process = agent.process
            threading.Thread(
                target=lambda: service.agent_exited(process.wait()), name="agent-watcher", daemon=True
            ).start()
        summary = run_to_end(service, progress, results_dir)
        status = None
        if agent.process is not None:
            agent.stop(evaluation_ended_at=time.monotonic())
            status = agent.process.returncode
        if summary["state"] == State.SUCCESS.value:
            exit_code = 0 if status in (0, None) else 1
        elif summary["state"] == State.INTERRUPTED.value:
            exit_code = 130
        else:
            exit_code = 1
        return RunOutcome(summary, status, exit_code)
    finally:
        if agent is not None:
            agent.kill()
        if embedded is not None:
            embedded.stop()
