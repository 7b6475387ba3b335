"""How the kubernetes backend reads the official client's V1Job and V1Pod objects, and collects
an evaluation's result (server/hosting/kubernetes_status.py): no cluster needed."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
from kubernetes.client import (
    V1JobCondition,
)
from kubernetes_objects import a_job, a_pod, a_submission, plan_for, write_summary

from arbiter.server.hosting.backends import Evaluated
from arbiter.server.hosting.kubernetes_status import (
    AgentWatch,
    ContainerOutcome,
    EvaluationLost,
    JobState,
    Phase,
    Step,
    collect,
    container_outcomes,
    job_state,
    next_step,
)

# -- reading the client's objects -----------------------------------------------------------------


def test_job_states_from_the_job_controllers_conditions() -> None:
    assert job_state(None) == JobState(Phase.GONE)
    assert job_state(a_job(suspend=True)).phase is Phase.SUSPENDED
    assert job_state(a_job()).phase is Phase.PENDING
    assert job_state(a_job(active=1)).phase is Phase.RUNNING
    assert job_state(a_job(("Complete", ""))).phase is Phase.SUCCEEDED
    failed = job_state(a_job(("FailureTarget", "DeadlineExceeded"), ("Failed", "DeadlineExceeded"), active=1))
    assert failed == JobState(Phase.FAILED, "DeadlineExceeded: ran out of time")
    assert job_state(a_job(("Complete", ""), deleting=True)).phase is Phase.DELETING
    not_yet = a_job(active=1)
    not_yet.status.conditions = [V1JobCondition(type="Failed", status="False")]
    assert job_state(not_yet).phase is Phase.RUNNING
    assert [state.ended for state in map(job_state, (a_job(active=1), a_job(("Failed", "x")), None))] == [
        False,
        True,
        True,
    ]


def test_container_outcomes_of_the_jobs_newest_pod() -> None:
    older = a_pod("2030-01-01T00:00:00Z", redis="running", evaluator="running", agent="running")
    newer = a_pod("2030-01-01T00:05:00Z", redis="running", evaluator=0, agent="waiting:ImagePullBackOff")
    outcomes = container_outcomes([newer, older])
    assert outcomes == {
        "redis": ContainerOutcome(True),
        "evaluator": ContainerOutcome(True, 0, "Completed"),
        "agent": ContainerOutcome(False, None, "ImagePullBackOff"),
    }
    assert container_outcomes([]) == {}
    assert container_outcomes([a_pod("2030-01-01T00:00:00Z", agent=137)])["agent"] == ContainerOutcome(
        True, 137, "OOMKilled"
    )


def test_the_next_step() -> None:
    running, agent_running = JobState(Phase.RUNNING), {"agent": ContainerOutcome(True)}
    agent_done = {"agent": ContainerOutcome(True, 0)}

    def step(state: JobState, outcomes: dict, *, stop: bool = False, ended_for: float | None = None) -> Step:
        return next_step(state, outcomes, stop_requested=stop, evaluator_ended_for_s=ended_for, agent_grace_s=10.0)

    assert step(running, agent_running) is Step.FOLLOW
    assert step(running, agent_running, stop=True) is Step.STOP
    assert step(JobState(Phase.SUCCEEDED), agent_done, stop=True) is Step.STOP
    assert step(JobState(Phase.FAILED, "DeadlineExceeded"), {}) is Step.COLLECT
    assert step(JobState(Phase.GONE), {}) is Step.COLLECT
    assert step(JobState(Phase.DELETING), agent_running) is Step.FOLLOW  # until it is gone
    assert step(running, agent_running, ended_for=9.9) is Step.FOLLOW
    assert step(running, agent_running, ended_for=10.0) is Step.FINISH
    assert step(running, {"agent": ContainerOutcome(False, None, "ErrImagePull")}, ended_for=10.0) is Step.FINISH
    assert step(running, agent_done, ended_for=60.0) is Step.FOLLOW  # the pod completes by itself


def test_the_agents_exit_status() -> None:
    watch = AgentWatch()
    assert watch.status(stopped_it=True) is None  # never seen: it never started
    watch.see({"agent": ContainerOutcome(False, None, "ContainerCreating")})
    assert watch.status(stopped_it=True) is None
    watch.see({"agent": ContainerOutcome(True)})
    assert watch.status(stopped_it=False) is None and watch.status(stopped_it=True) == -signal.SIGTERM
    watch.see({"agent": ContainerOutcome(True, 3, "Error")})
    watch.see({})  # the pod is gone: what was seen stays
    assert watch.status(stopped_it=True) == 3


def test_collect_reads_the_final_summary_and_waits_for_a_late_one(tmp_path: Path) -> None:
    plan = plan_for(a_submission(), tmp_path)[0]
    written = write_summary(tmp_path / "done", "FAILED")
    got = collect(str(tmp_path / "done"), plan, JobState(Phase.FAILED), 1, stopped=False, wait_s=0.0)
    assert got == Evaluated(written, 1)
    late = tmp_path / "late"
    write_summary(late, "RUNNING")  # what the evaluator writes as it starts
    writer = threading.Timer(0.1, write_summary, (late, "SUCCESS"))
    writer.start()
    try:
        got = collect(str(late), plan, JobState(Phase.SUCCEEDED), 0, stopped=False, wait_s=5.0)
    finally:
        writer.join()
    assert got.summary["state"] == "SUCCESS"


def test_collect_without_a_result(tmp_path: Path) -> None:
    plan = plan_for(a_submission(), tmp_path)[0]
    stopped = collect(str(tmp_path), plan, JobState(Phase.GONE), None, stopped=True, wait_s=0.0)
    assert stopped.summary["state"] == "INTERRUPTED" and stopped.agent_status is None
    started = time.monotonic()
    with pytest.raises(EvaluationLost, match=rf"{plan.name} ended failed \(DeadlineExceeded\).*kubectl logs"):
        collect(str(tmp_path), plan, JobState(Phase.FAILED, "DeadlineExceeded"), None, stopped=False, wait_s=0.1)
    assert time.monotonic() - started >= 0.1  # a shared filesystem's late write was waited for
