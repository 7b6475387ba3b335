"""What the cluster says about an evaluation's Job, interpreted: pure functions of the official
client's objects (V1Job, V1Pod), and what the worker does next (kubernetes_backend.py acts on it).

A Job's own success or failure is not the evaluation's: the pod fails when the agent exits
non-zero, however the evaluation ended, so the outcome is always read from summary.json.
"""

from __future__ import annotations

import datetime
import enum
import json
import os
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from arbiter.server.hosting.kubernetes_manifests import EvaluationPlan

if TYPE_CHECKING:  # backends.py lists the kubernetes backend: imported from there at run time, not here
    from arbiter.server.hosting.backends import Evaluated

FINAL_STATES = ("SUCCESS", "FAILED", "INTERRUPTED")  # summary.json's states once the evaluator has ended


class EvaluationLost(RuntimeError):
    """The Job ended, or was lost, without a result: the attempt failed and may be retried."""


class Phase(enum.StrEnum):
    SUSPENDED = "suspended"  # created, not released yet
    PENDING = "pending"  # released, its pod not running yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # every container exited 0
    FAILED = "failed"  # a container failed, or the deadline passed: the result may still be there
    DELETING = "deleting"
    GONE = "gone"


@dataclass(frozen=True)
class JobState:
    phase: Phase
    reason: str = ""  # of a failed Job: its condition's reason and message

    @property
    def ended(self) -> bool:
        return self.phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.GONE)

    def describe(self) -> str:
        return f"{self.phase.value} ({self.reason})" if self.reason else self.phase.value


def job_state(job: Any) -> JobState:
    """The state of a V1Job (None: there is none)."""
    if job is None:
        return JobState(Phase.GONE)
    if job.metadata is not None and job.metadata.deletion_timestamp is not None:
        return JobState(Phase.DELETING)
    status = job.status
    true = {condition.type: condition for condition in (status.conditions if status else None) or []
            if condition.status == "True"}  # fmt: skip
    if "Complete" in true:
        return JobState(Phase.SUCCEEDED)
    if "Failed" in true:
        failed = true["Failed"]
        return JobState(Phase.FAILED, ": ".join(part for part in (failed.reason, failed.message) if part))
    if job.spec is not None and job.spec.suspend:
        return JobState(Phase.SUSPENDED)
    return JobState(Phase.RUNNING if status is not None and status.active else Phase.PENDING)


@dataclass(frozen=True)
class ContainerOutcome:
    started: bool
    exit_code: int | None = None  # once it ended
    reason: str = ""  # why it waits (ImagePullBackOff ...) or how it ended (OOMKilled ...)


def container_outcomes(pods: list[Any]) -> dict[str, ContainerOutcome]:
    """Each container of the Job's pod (V1Pod; with backoffLimit 0 there is one), by name."""
    if not pods:
        return {}

    def created(pod: Any) -> float:
        stamp = pod.metadata.creation_timestamp if pod.metadata is not None else None
        return stamp.timestamp() if isinstance(stamp, datetime.datetime) else 0.0

    status = max(pods, key=created).status
    if status is None:
        return {}
    outcomes: dict[str, ContainerOutcome] = {}
    for container in [*(status.init_container_statuses or []), *(status.container_statuses or [])]:
        state = container.state
        if state is not None and state.terminated is not None:
            ended = state.terminated
            outcomes[container.name] = ContainerOutcome(True, ended.exit_code, ended.reason or "")
        elif state is not None and state.running is not None:
            outcomes[container.name] = ContainerOutcome(True)
        else:
            waiting = state.waiting if state is not None else None
            outcomes[container.name] = ContainerOutcome(False, reason=(waiting.reason or "") if waiting else "")
    return outcomes


class Step(enum.Enum):
    FOLLOW = "follow"  # nothing to do yet
    COLLECT = "collect"  # the Job ended: read its result
    FINISH = "finish"  # the evaluator ended and the agent outstayed its grace: delete the Job, then collect
    STOP = "stop"  # the attempt was told to stop: delete the Job, then collect


def next_step(
    state: JobState,
    outcomes: dict[str, ContainerOutcome],
    *,
    stop_requested: bool,
    evaluator_ended_for_s: float | None,
    agent_grace_s: float,
) -> Step:
    if stop_requested:
        return Step.STOP
    if state.ended:
        return Step.COLLECT
    agent = outcomes.get("agent")
    agent_running = agent is None or agent.exit_code is None
    if evaluator_ended_for_s is not None and agent_running and evaluator_ended_for_s >= agent_grace_s:
        return Step.FINISH
    return Step.FOLLOW


class AgentWatch:
    """The agent's container as last seen, for its exit status."""

    def __init__(self) -> None:
        self.seen: ContainerOutcome | None = None

    def see(self, outcomes: dict[str, ContainerOutcome]) -> None:
        found = outcomes.get("agent")
        if found is not None and (self.seen is None or self.seen.exit_code is None):
            self.seen = found

    def status(self, *, stopped_it: bool) -> int | None:
        """Its exit status; None when it never started. An agent still running when its pod was
        deleted was sent SIGTERM by the kubelet: -SIGTERM, as ``arbiter run`` reports a signal."""
        if self.seen is None or not self.seen.started:
            return None
        if self.seen.exit_code is not None:
            return self.seen.exit_code
        return -signal.SIGTERM if stopped_it else None


def read_summary(results_dir: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(results_dir, "summary.json"), encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def collect(
    results_dir: str, plan: EvaluationPlan, state: JobState, agent_status: int | None, *, stopped: bool, wait_s: float
) -> Evaluated:
    """The evaluation's summary.json, once final. A shared filesystem may show the evaluator's
    last write late, so it is looked for during ``wait_s``."""
    from arbiter.server.hosting.backends import Evaluated

    deadline = time.monotonic() + wait_s
    while True:
        summary = read_summary(results_dir)
        if summary is not None and summary.get("state") in FINAL_STATES:
            return Evaluated(summary, agent_status)
        if time.monotonic() >= deadline:
            break
        time.sleep(min(1.0, max(deadline - time.monotonic(), 0.0)))
    if stopped:
        cause = "stopped before its evaluator recorded an ending"
        return Evaluated({"state": "INTERRUPTED", "termination_cause": cause}, agent_status)
    raise EvaluationLost(
        f"the Job {plan.name} ended {state.describe()} without a result: {results_dir} holds no final summary.json "
        f"(its logs: kubectl logs job/{plan.name} -c evaluator)"
    )
