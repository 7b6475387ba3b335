"""Where a submission's agent runs while its worker evaluates it.

A backend takes one evaluation attempt: the competition, the submission (its agent command,
working folder and image; ``submission.attempts`` numbers the attempt) and its results folder,
and runs it to its end. The farm's Redis is never part of it: an attempt gets a Redis of its own
(private_redis.py), and the agent only its participant's user there. ``local`` runs the agent as
a process on the worker's machine, as ``arbiter run`` does; ``podman`` and ``docker`` run it in a
container (containers.py); ``kubernetes`` runs the whole evaluation as a Job on a cluster
(kubernetes_backend.py). A backend that cannot run an agent raises ``ConfigError`` starting
with ``cannot start the agent``: the submission then fails as its own fault.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from arbiter.protocol.errors import ConfigError
from arbiter.server.cli.embedded_redis import DEFAULT_PORT, HOST
from arbiter.server.cli.progress import Progress
from arbiter.server.core.competition import CompetitionSpec
from arbiter.server.core.seeds import persisted_seed
from arbiter.server.formats import get_format
from arbiter.server.hosting.agent_log import AgentLog
from arbiter.server.hosting.private_redis import PrivateRedis
from arbiter.server.hosting.submissions import Submission

if TYPE_CHECKING:
    from arbiter.server.cli.runner import AgentProcess, RunOutcome


@dataclass
class Evaluated:
    summary: dict  # the evaluation's summary.json
    agent_status: int | None  # the agent's exit status (None: it never started)
    # Why an evaluation the backend stopped is the agent's fault (it filled its Redis): the
    # submission then fails as such, never tried again; None for every other ending.
    agent_fault: str | None = None


class Backend(Protocol):
    name: str
    # Whether an attempt leaves its agent running on the worker's machine when its work-horse is
    # killed outright by something else than the worker (a container: the worker then removes it).
    # A Kubernetes Job is left to the next attempt, which follows it.
    agent_outlives_horse: bool

    def check(self) -> None:
        """Raise ConfigError when this machine cannot run agents so (called as the worker starts)."""

    def abandon(self, submission_id: str) -> None:
        """The worker killed the work-horse evaluating ``submission_id`` (a cold shutdown, a job
        far past its timeout): stop what its attempt runs outside the horse's processes."""

    def evaluate(
        self, spec: CompetitionSpec, submission: Submission, *, results_dir: str, resume: bool
    ) -> Evaluated: ...


def evaluation_tests(spec: CompetitionSpec) -> str | None:
    """The competition's test data, else the format's default (generated once per machine)."""
    if spec.tests:
        return spec.tests
    found = get_format(spec.format)
    if not found.requires_tests:
        return None
    if found.default_tests is None:
        raise ConfigError(f"competition {spec.name!r} names no tests, and format {spec.format!r} has no default")
    return found.default_tests()


@dataclass(frozen=True)
class Attempt:
    """What every backend settles before the evaluation starts."""

    spec: CompetitionSpec  # with the seed it is played with
    tests: str | None  # absolute
    results_dir: str  # absolute: <results root>/<competition>/<submission id> (job.results_folder)

    def hidden_folders(self, *more: os.PathLike | str) -> list[str]:
        """The folders an agent that sees the machine's files must not: the test data, the
        results root (every submission's results) and ``more``."""
        results_root = os.path.dirname(os.path.dirname(self.results_dir))
        return [str(folder) for folder in (self.tests, results_root, *more) if folder]


def prepare_attempt(spec: CompetitionSpec, results_dir: str, resume: bool) -> Attempt:
    results_dir = os.path.abspath(results_dir)
    tests = evaluation_tests(spec)
    # Hosted: a format whose seeds stay secret draws one, kept in the results folder for a resume.
    seeded = persisted_seed(results_dir, spec, resume=resume, hosted=True, tests=tests)
    return Attempt(seeded, os.path.abspath(tests) if tests else None, results_dir)


def private_redis(attempt: Attempt, submission: Submission) -> PrivateRedis:
    hosting = attempt.spec.hosting
    return PrivateRedis(submission.id, hosting.redis_memory_bytes, hosting.redis_memory)


def run_attempt(
    attempt: Attempt, submission: Submission, private: PrivateRedis, agent: AgentProcess, resume: bool
) -> RunOutcome:
    """The evaluation of one attempt, on its private Redis, with ``agent`` started the backend's
    way (a local process, a container); stopped at once if the agent fills that Redis. What
    the agent prints goes to the results folder's agent.log (agent_log.py)."""
    from arbiter.server.cli.runner import run_local

    agent.output = AgentLog(attempt.results_dir, submission.attempts)
    return run_local(
        attempt.spec,
        agent_command=list(submission.agent),
        tests=attempt.tests,
        results_dir=attempt.results_dir,
        service_id=submission.id,
        redis_url=private.evaluator_url,
        progress=Progress(enabled=False, format_name=attempt.spec.format),
        resume=resume,
        agent=agent,
        stop_check=private.stop_cause,
        participant=submission.participant,
        submitted_at=submission.submitted_at,
        command=None,  # a hosted attempt: the farm resumes it
    )


def evaluated(outcome: RunOutcome, private: PrivateRedis) -> Evaluated:
    """The backend's answer from ``run_local``'s: the agent's fault when it filled its Redis."""
    summary = outcome.summary
    filled = summary.get("state") == "INTERRUPTED" and summary.get("termination_cause") == private.full_cause
    return Evaluated(summary, outcome.agent_status, agent_fault=summary["termination_cause"] if filled else None)


def bridge_command(python: str, listen: str, *, shared_machine: bool = False) -> list[str]:
    """The socket bridge (client/socket_bridge.py) in front of an agent command, for flatland's
    client, which knows only TCP; it reads the socket and the user from ARBITER_REDIS_URL.
    ``shared_machine``: other agents may hold ``listen``: the bridge takes another loopback address
    on its port (given to the agent as ``$redis_ip``), or runs the agent without the TCP path."""
    options = ["--any-loopback", "--if-free"] if shared_machine else []
    return [python, "-m", "arbiter.client.socket_bridge", "--listen", listen, *options, "--"]


class LocalBackend:
    """The agent as a local process group of the worker's work-horse (``arbiter run``'s runner),
    with its own Redis's participant URL (over the unix socket) in its environment. flatland's
    client reaches that socket through the socket bridge on port 6379 of 127.0.0.1, or of the next
    loopback address free on that port (another worker's agent holds it), named in ``$redis_ip``."""

    name = "local"
    agent_outlives_horse = False  # a process group of the horse: the kernel ends it with the horse

    def check(self) -> None:
        pass

    def abandon(self, submission_id: str) -> None:
        pass  # the agent is a process group of the horse: the worker kills it with the horse

    def evaluate(self, spec: CompetitionSpec, submission: Submission, *, results_dir: str, resume: bool) -> Evaluated:
        from arbiter.server.cli.runner import AgentProcess, agent_command_problem, agent_environment

        attempt = prepare_attempt(spec, results_dir, resume)
        # The agent command is read from its working folder, as the participant wrote it. The
        # work-horse is a process of its own for this one submission; the folder is restored for
        # a caller that runs the job in its own process.
        before = os.getcwd()
        if submission.workdir:
            os.chdir(submission.workdir)
        try:
            problem = agent_command_problem(list(submission.agent))
            if problem:
                raise ConfigError(f"cannot start the agent: {problem}")
            with private_redis(attempt, submission) as private:
                command = list(submission.agent)
                if get_format(attempt.spec.format).tcp_clients:
                    command = bridge_command(sys.executable, f"{HOST}:{DEFAULT_PORT}", shared_machine=True) + command
                environment = agent_environment(private.agent_url(), submission.id, attempt.tests)
                outcome = run_attempt(attempt, submission, private, AgentProcess(command, environment), resume)
        finally:
            os.chdir(before)
        return evaluated(outcome, private)


def _container_backend(engine: str) -> Any:
    def make(**options: Any) -> Backend:
        from arbiter.server.hosting.containers import ContainerBackend

        return ContainerBackend(engine, **options)

    return make


def _kubernetes_backend(**options: Any) -> Backend:
    from arbiter.server.hosting.kubernetes_backend import KubernetesBackend

    return KubernetesBackend(**options)


# name -> a function of the worker's options for that backend (cmd_worker gives them); each
# backend's module is imported only by the workers that use it.
BACKENDS: dict[str, Any] = {
    "local": LocalBackend,
    "podman": _container_backend("podman"),
    "docker": _container_backend("docker"),
    "kubernetes": _kubernetes_backend,
}


def get_backend(name: str, **options: Any) -> Backend:
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    return BACKENDS[name](**options)
