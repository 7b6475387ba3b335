"""The official kubernetes client's objects as a cluster would answer them, and the options, for
the kubernetes backend's tests."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from kubernetes.client import (
    V1ContainerState,
    V1ContainerStateRunning,
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1Job,
    V1JobCondition,
    V1JobSpec,
    V1JobStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodStatus,
    V1PodTemplateSpec,
)

from arbiter.server.hosting.farm import submission_spec
from arbiter.server.hosting.kubernetes_manifests import KubernetesOptions
from arbiter.server.hosting.submissions import Submission, new_submission_id

OPTIONS = KubernetesOptions(
    evaluator_image="registry.example.org/arbiter-evaluator:1",
    results_claim="arbiter-results",
    tests_claim="hidden-tests",
    poll_interval_s=0.02,
    results_wait_s=0.2,
    agent_exit_grace_s=0.2,
)


def a_job(*conditions: tuple[str, str], suspend: bool = False, active: int = 0, deleting: bool = False) -> V1Job:
    return V1Job(
        metadata=V1ObjectMeta(name="arbiter-x", deletion_timestamp="2030-01-01T00:00:00Z" if deleting else None),
        spec=V1JobSpec(template=V1PodTemplateSpec(), suspend=suspend),
        status=V1JobStatus(
            active=active or None,
            conditions=[
                V1JobCondition(type=kind, status="True", reason=reason, message="ran out of time" if reason else None)
                for kind, reason in conditions
            ]
            or None,
        ),
    )


STARTED = datetime.datetime(2030, 1, 1, 0, 0, 1, tzinfo=datetime.UTC)  # when a started container started


def container(name: str, state: str | int) -> V1ContainerStatus:
    """``state``: "running", "waiting:<reason>", or an exit code."""
    if state == "running":
        found = V1ContainerState(running=V1ContainerStateRunning(started_at=STARTED))
    elif isinstance(state, str):
        found = V1ContainerState(waiting=V1ContainerStateWaiting(reason=state.partition(":")[2]))
    else:
        reason = "Completed" if state == 0 else ("OOMKilled" if state == 137 else "Error")
        found = V1ContainerState(
            terminated=V1ContainerStateTerminated(exit_code=state, reason=reason, started_at=STARTED)
        )
    return V1ContainerStatus(name=name, image="i", image_id="", ready=False, restart_count=0, state=found)


def a_pod(created: str, **states: str | int) -> V1Pod:
    statuses = [container(name, state) for name, state in states.items()]
    return V1Pod(
        metadata=V1ObjectMeta(name="arbiter-x-7xk2p", creation_timestamp=created),
        status=V1PodStatus(
            init_container_statuses=[one for one in statuses if one.name == "redis"],
            container_statuses=[one for one in statuses if one.name != "redis"],
        ),
    )


def write_summary(results_dir: Path, state: str) -> dict:
    summary = {"state": state, "termination_cause": f"ended {state.lower()}", "score": {"primary": 0.5}}
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return summary


def a_submission() -> Submission:
    submission = Submission(
        id=new_submission_id(), competition="flatland-debug", participant="alice", agent=[],
        sets=["hosting.image=registry.example.org/team/agent:7"],
    )  # fmt: skip
    submission.competition_name = submission_spec(submission).name
    return submission


def plan_for(submission: Submission, root: Path, *, resume: bool = False):
    from arbiter.server.hosting.kubernetes_plan import plan_evaluation

    plan = plan_evaluation(submission_spec(submission), submission, OPTIONS, resume=resume)
    return plan, root / submission.competition_name / submission.id


def client_model(kind: str, manifest: dict):
    """``manifest`` as the official client's model of ``kind`` (``V1Job`` ...), read the way the
    client reads the API server's answers."""
    import json

    import kubernetes

    class Answer:  # what ApiClient.deserialize reads: the body of an HTTP response
        data = json.dumps(manifest)

    return kubernetes.client.ApiClient().deserialize(Answer(), kind)
