"""Where a submission's agent runs while its worker evaluates it.

A backend takes one evaluation: the competition, the submission (its agent command and working
folder), its results folder and the Redis the agent talks to, and runs it to its end. ``local``
runs the agent as a process on the worker's machine, as ``arbiter run`` does; a backend that runs
it in a container implements the same method.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from arbiter.protocol.errors import ConfigError
from arbiter.server.cli.progress import Progress
from arbiter.server.core.competition import CompetitionSpec, persisted_seed
from arbiter.server.formats import get_format
from arbiter.server.hosting.submissions import Submission


@dataclass
class Evaluated:
    summary: dict  # the evaluation's summary.json
    agent_status: int | None  # the agent's exit status (None: it never started)


class Backend(Protocol):
    name: str

    def evaluate(
        self, spec: CompetitionSpec, submission: Submission, *, results_dir: str, redis_url: str, resume: bool
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


class LocalBackend:
    """The agent as a local process group of the worker's work-horse (``arbiter run``'s runner)."""

    name = "local"

    def evaluate(
        self, spec: CompetitionSpec, submission: Submission, *, results_dir: str, redis_url: str, resume: bool
    ) -> Evaluated:
        from arbiter.server.cli.runner import run_local

        results_dir = os.path.abspath(results_dir)
        tests = evaluation_tests(spec)
        tests = os.path.abspath(tests) if tests else None
        # Hosted: a format whose seeds stay secret draws one, kept in the results folder for a resume.
        spec = persisted_seed(results_dir, spec, resume=resume, hosted=True)
        # The agent command is read from its working folder, as the participant wrote it. The
        # work-horse is a process of its own for this one submission; the folder is restored for
        # a caller that runs the job in its own process.
        before = os.getcwd()
        if submission.workdir:
            os.chdir(submission.workdir)
        try:
            outcome = run_local(
                spec,
                agent_command=list(submission.agent),
                tests=tests,
                results_dir=results_dir,
                service_id=submission.id,
                redis_url=redis_url,
                progress=Progress(enabled=False, format_name=spec.format),
                resume=resume,
            )
        finally:
            os.chdir(before)
        return Evaluated(outcome.summary, outcome.agent_status)


BACKENDS: dict[str, type] = {"local": LocalBackend}


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    return BACKENDS[name]()
