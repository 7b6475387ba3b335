"""``arbiter run``: a whole local evaluation in one command.

Redis (the given one, or an embedded redis-server), the evaluator in this process, and the
agent command as a child process with the connection settings in its environment.

Stopping (Ctrl-C, SIGTERM, SIGHUP): the agent runs in its own process group, so a terminal's
Ctrl-C reaches arbiter alone, which ends the evaluation as INTERRUPTED, sends SIGTERM to the
agent's whole group at once, kills the group if it is still there ``AGENT_INTERRUPT_GRACE_S``
later (at once on a second signal), then stops the embedded Redis. When ``arbiter run`` returns,
no process of the agent's group is left. SIGTERM, not the SIGINT of a Ctrl-C: a Python agent
ends on it quietly, where SIGINT would fill the terminal with its KeyboardInterrupt traceback;
the person who pressed Ctrl-C is told in one line that the agent was stopped.

A run that cannot start (an agent command that is not a program, a Redis that cannot be used)
fails with a clear error and leaves no results folder of its own behind.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from arbiter.protocol.errors import ConfigError
from arbiter.protocol.redis_conn import redacted
from arbiter.server.cli.embedded_redis import DEFAULT_PORT, EmbeddedRedis
from arbiter.server.cli.local_runs import announce_run, watch_command, withdraw_run
from arbiter.server.cli.parent_death import death_signal_wrapper
from arbiter.server.cli.progress import Progress
from arbiter.server.cli.settings import first_missing
from arbiter.server.core.competition import CompetitionSpec
from arbiter.server.core.evaluation import State
from arbiter.server.formats import get_format
from arbiter.server.service.build import everything_on_record, run_to_end, start_service
from arbiter.server.service.loop import EvaluatorService
from arbiter.server.service.submission_naming import name_submission
from arbiter.server.service.transport import EVALUATOR_WINDOW_US

log = logging.getLogger(__name__)

AGENT_EXIT_GRACE_S = 10.0  # after the evaluation ends, time the agent gets to exit by itself
AGENT_TERMINATE_GRACE_S = 5.0  # then, after SIGTERM, before SIGKILL
# After an interrupt is passed on, time the agent gets to exit before its group is killed: enough
# for a Python agent to unwind a KeyboardInterrupt, short enough that Ctrl-C means "stop now".
AGENT_INTERRUPT_GRACE_S = 2.0
AGENT_POLL_S = 0.02  # how often the wait for the agent to exit looks at the clock and at signals
STOP_CHECK_S = 0.25  # how often a caller's stop condition (``run_local``'s ``stop_check``) is asked


@dataclass
class RunOutcome:
    summary: dict
    agent_status: int | None
    exit_code: int
    interrupted: bool = False  # a stop signal (Ctrl-C) ended the run and stopped the agent


def agent_command_problem(command: list[str]) -> str | None:
    """Why ``command`` cannot be started as it is, or None: checked before anything is set up,
    so a typo costs no Redis, no results folder and no evaluation. (The agent's PATH is this
    process's: ``agent_environment`` adds to the environment, never changes it.)"""
    program = command[0]
    if os.sep in program:
        if not os.path.exists(program):
            return f"{program!r} does not exist"
        if os.path.isdir(program):
            return f"{program!r} is a folder, not a program"
        if not os.access(program, os.X_OK):
            return f"{program!r} is not executable (make it so, or name its interpreter: python {program})"
        if _script_without_interpreter(program):
            return f"{program!r} names no interpreter in a #! first line (add one, or run it as: python {program})"
    elif shutil.which(program) is None:
        return f"{program!r} is not a program on PATH"
    script = command[1] if len(command) > 1 else ""
    if os.path.basename(program).startswith("python") and script.endswith(".py") and not os.path.exists(script):
        where = "" if os.path.isabs(script) else f" (in {os.getcwd()})"
        return f"{script!r} does not exist{where}"  # the usual typo: python would say so an evaluation later
    return None


def _script_without_interpreter(path: str) -> bool:
    """A text file without a ``#!`` line: the system cannot run it (a program file holds NUL bytes)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(512)
    except OSError:
        return False  # the start itself says what is wrong
    return not head.startswith(b"#!") and b"\0" not in head


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

    def __init__(self, command: list[str], env: dict[str, str], cwd: str | None = None):
        self.command = command
        self.env = env
        self.cwd = cwd  # the folder it starts in (None: this process's)
        self.output: Any = None  # where its stdout and stderr go (hosting/agent_log.py); None: ours
        self.process: subprocess.Popen | None = None
        self.interrupted_at: float | None = None  # monotonic time of the first stop signal
        self._interrupts = 0

    def start(self) -> None:
        # A process group in a terminal's background is stopped (SIGTTIN) if it reads from the
        # terminal: the agent reads an empty stdin instead.
        stdin = subprocess.DEVNULL if os.isatty(0) else None
        # The kernel kills the agent's first process when the evaluator's process ends, killed
        # with SIGKILL included (by the kernel's out-of-memory killer, say): no agent left behind
        # retrying a Redis that is gone, or holding a port the next attempt wants.
        launcher = death_signal_wrapper() if sys.platform.startswith("linux") else []
        out, err = (subprocess.PIPE, subprocess.STDOUT) if self.output is not None else (None, None)
        self.process = subprocess.Popen(
            [*launcher, *self.command], env=self.env, stdin=stdin, process_group=0, cwd=self.cwd, stdout=out, stderr=err
        )
        if self.output is not None:
            self.output.follow(self.process.stdout)
        if self._interrupts:  # a stop signal came while the agent was being started
            self._signal_group(signal.SIGTERM if self._interrupts == 1 else signal.SIGKILL)

    def interrupt(self, signum: int) -> None:
        """A stop signal reached arbiter: the first sends SIGTERM to the agent's group (see the
        module's docstring), the second kills the group."""
        self._interrupts += 1
        if self._interrupts == 1:
            self.interrupted_at = time.monotonic()
        if self.process is not None:
            self._signal_group(signal.SIGTERM if self._interrupts == 1 else signal.SIGKILL)

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
            if self.output is not None:
                self.output.close()

    def ended_how(self, status: int) -> str | None:
        """How the agent ended, in the evaluation's words, when its exit status alone does not
        say it (an agent in a container killed at its memory limit); None: the status says it."""
        return None


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
    resume: bool = False,
    agent: AgentProcess | None = None,
    stop_check: Callable[[], str | None] | None = None,
    participant: str | None = None,
    submitted_at: float | None = None,
    poll_window_us: float = EVALUATOR_WINDOW_US,
    made_folder: str | None = None,
    command: str | None = "run",
) -> RunOutcome:
    """``resume``: continue the evaluation in ``results_dir`` after its last finished item, with
    a new agent (a hosted submission whose worker was lost); one with every item on record ends
    at once, without the agent (nothing is left to play). ``agent``: the agent to start, built
    and checked by the caller (a hosted evaluation's, with its own Redis user, in a container or
    not); by default ``agent_command``, given ``redis_url`` in its environment. ``stop_check``:
    asked every ``STOP_CHECK_S`` while the agent runs; a reason it returns stops the evaluation
    (INTERRUPTED, with that reason as its cause) and the agent, as a stop signal does.
    ``participant``: whose evaluation it is (``name_submission``), submitted at ``submitted_at``
    (a Unix time; by default when the evaluation started). ``made_folder``: a folder the caller
    made for the results (``claim_results``), removed like one the run makes if it fails before
    the agent starts. ``command``: what the evaluation's messages name as its way to resume
    (``build_service``; a hosted attempt's, None, is resumed by its farm)."""
    embedded: EmbeddedRedis | None = None
    announcement: str | None = None
    created = first_missing(results_dir) or made_folder  # removed again if the run fails before the agent starts
    tcp_clients = get_format(spec.format).tcp_clients  # flatland-rl's own client knows only TCP
    legacy_host = None
    redis_label = None  # how the start line names the Redis: by default, the URL
    agent_started = False
    try:
        problem = agent_command_problem(agent_command) if agent is None else None
        if problem:
            raise ConfigError(f"cannot start the agent: {problem}")
        if redis_url is None:
            # Linux: the kernel ends it with this process, even one killed with SIGKILL (no orphan
            # holding the port the next run wants).
            embedded = EmbeddedRedis(die_with_parent=sys.platform.startswith("linux"))
            embedded.start()
            # arbiter's own sides speak over the unix socket; flatland's client over TCP
            redis_url = embedded.local_url
            legacy_host = embedded.host  # 127.0.0.1, or the loopback address free on 6379 (in $redis_ip)
            if tcp_clients and redis_url != embedded.url:
                redis_label = f"{redacted(redis_url)} (flatland's client: {redacted(embedded.url)})"
            if tcp_clients and embedded.port != DEFAULT_PORT:
                progress.note(
                    f"arbiter: port {DEFAULT_PORT} is held on every loopback address, so the embedded Redis listens "
                    f"on {embedded.port}; flatland's FlatlandRemoteClient, which knows port {DEFAULT_PORT} only, "
                    "would reach the server holding it, not this evaluation"
                )
        if agent is None:
            agent = AgentProcess(agent_command, agent_environment(redis_url, service_id, tests, legacy_host))
        service = start_service(
            spec,
            tests=tests,
            results_dir=results_dir,
            redis_url=redis_url,
            service_id=service_id,
            progress=progress,
            redis_outage_s=redis_outage_s,
            resume=resume,
            on_stop_signal=agent.interrupt,
            redis_label=redis_label,
            poll_window_us=poll_window_us,
            command=command,
            agent_if_done=False,
        )
        name_submission(service, participant, results_dir=results_dir, resume=resume, submitted_at=submitted_at)
        evaluation = service.evaluation
        # Killed after its last item and before its summary: an agent would be told at once there
        # is nothing to play, which not every agent's loop expects (Endings.nothing_left_to_play).
        nothing_left = resume and everything_on_record(evaluation)
        if nothing_left:
            progress.note(
                f"arbiter: every item is on record ({evaluation.endings.all_handed_out()}): nothing is left to "
                "play, so the agent is not started"
            )
            evaluation.endings.nothing_left_to_play(evaluation.clock())
        else:
            announcement = announce_run(redis_url, service_id, results_dir)
            progress.note(f"arbiter: to follow it from another terminal: {_follow_hint(redis_url, service_id)}")
        if not service.stop_requested and not nothing_left:  # stopped while it started: the agent never runs
            try:
                agent.start()
            except OSError as exc:
                # The command passed the check above, yet cannot run (a program built for another
                # system, say): nothing was evaluated, so nothing of this run is kept.
                service.evaluation.endings.finish(State.FAILED, f"cannot start the agent {agent_command!r}: {exc}", 0.0)
                service.close()
                raise ConfigError(f"cannot start the agent {agent_command!r}: {exc}") from None
            agent_started = True
            threading.Thread(target=_watch_agent, args=(agent, service), name="agent-watcher", daemon=True).start()
            if stop_check is not None:
                threading.Thread(
                    target=_watch_stop_check, args=(stop_check, service, agent), name="stop-check", daemon=True
                ).start()
        # An agent still running when the evaluation ended is told so at its next request.
        after_end_s = AGENT_EXIT_GRACE_S if agent_started else 0.0
        summary = run_to_end(service, progress, results_dir, answer_after_end_s=after_end_s)
        status = None
        if agent.process is not None:
            agent.stop(evaluation_ended_at=service.ended_at if service.ended_at is not None else time.monotonic())
            status = agent.process.returncode
        interrupted = agent.interrupted_at is not None
        if summary["state"] == State.SUCCESS.value:
            # An agent stopped by Ctrl-C once the evaluation had ended did not crash: interrupted.
            exit_code = 130 if interrupted and status not in (0, None) else 0 if status in (0, None) else 1
        elif summary["state"] == State.INTERRUPTED.value:
            exit_code = 130
        else:
            exit_code = 1
        return RunOutcome(summary, status, exit_code, interrupted=interrupted)
    except BaseException:
        if not agent_started and created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    finally:
        withdraw_run(announcement)
        if agent is not None:
            agent.kill()
        if embedded is not None:
            embedded.stop()


def _watch_agent(agent: AgentProcess, service: EvaluatorService) -> None:
    """Tell the evaluation when the agent exits, and how."""
    assert agent.process is not None
    status = agent.process.wait()
    how = agent.ended_how(status)
    service.agent_exited(status, how, agent.output.note(status, how) if agent.output else None)


def _watch_stop_check(check: Callable[[], str | None], service: EvaluatorService, agent: AgentProcess) -> None:
    while not service.evaluation.finished and agent.interrupted_at is None:
        reason = check()
        if reason:
            service.request_stop(reason)
            agent.interrupt(signal.SIGTERM)
            return
        time.sleep(STOP_CHECK_S)


def _follow_hint(redis_url: str, service_id: str) -> str:
    """The ``arbiter watch`` command that follows this run. A URL with a password is not
    printed: ``arbiter watch`` finds the run by its announcement (server/local_runs.py) instead."""
    if urlparse(redis_url).password:
        return f"arbiter watch --service-id {shlex.quote(service_id)}"
    return watch_command(redis_url, service_id)
