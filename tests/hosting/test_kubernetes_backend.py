"""The kubernetes backend (server/hosting/kubernetes_backend.py, kubernetes_status.py) without a
cluster, and on one when KUBECONFIG names it.

Without a cluster (how it reads the client's objects: test_kubernetes_status.py): how it
starts, follows, stops and collects an evaluation against ``ScriptedCluster``, a stand-in for
the cluster's side of one evaluation (no HTTP involved: it answers the backend's calls with the
client's own objects, built from the manifests the backend sends, and plays the Job
controller's and the kubelet's part as a script says). The stop signal is a real SIGTERM and
RQ's real job timeout. With KUBECONFIG set, the live test creates a Job on the cluster.
"""

from __future__ import annotations

import io
import json
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes.client import (
    V1Job,
    V1JobCondition,
    V1JobStatus,
    V1Pod,
)
from kubernetes.client.exceptions import ApiException
from kubernetes_objects import OPTIONS, a_pod, a_submission, client_model, plan_for, write_summary
from rq.timeouts import JobTimeoutException, UnixSignalDeathPenalty
from urllib3 import HTTPResponse

from arbiter.client.deadline_guard import release_logging_locks
from arbiter.protocol.errors import ConfigError
from arbiter.server.hosting.backends import Evaluated
from arbiter.server.hosting.farm import submission_spec
from arbiter.server.hosting.kubernetes_backend import KubernetesBackend, start_evaluation
from arbiter.server.hosting.kubernetes_manifests import SUBMISSION_ANNOTATION, job_manifest
from arbiter.server.hosting.kubernetes_status import (
    EvaluationLost,
    Phase,
    job_state,
)
from arbiter.server.hosting.submissions import Submission
from arbiter.server.service import held_stops, results_fence

# -- starting, following, stopping, collecting ---------------------------------------------------


@dataclass
class Moment:
    """One look of the worker at its released Job: the Job's state, its containers', and what the
    evaluator has written by then (a summary.json state)."""

    job: str = "running"  # "pending", "running", "complete", "failed"
    evaluator: str | int = "running"
    agent: str | int = "running"
    summary: str | None = None
    reason: str = ""


class ScriptedCluster:
    """The cluster's side of one evaluation (see the module's docstring). Each look at a released
    Job moves its play on by one ``Moment``; the last one lasts. Deleting the Job stops its pod:
    an evaluator still running records the evaluation as interrupted, and what the Job owns goes
    with it, the agent's log (``agent_output``) too."""

    def __init__(self, results_dir: Path, script: list[Moment]):
        self.results_dir, self.script = results_dir, script
        self.jobs: dict[str, V1Job] = {}
        self.bodies: dict[str, dict] = {}
        self.owned: dict[tuple[str, str], dict] = {}
        self.calls: list[tuple] = []
        self.moment: Moment | None = None
        self.looks = 0
        self.released = threading.Event()
        self.closed = False
        self.agent_output = b""  # what the agent's container printed
        self.log_reads: list[bool] = []  # whether each read asked for the previous instance's log

    def create_job(self, body: dict) -> V1Job | None:
        name = body["metadata"]["name"]
        self.calls.append(("create", body["spec"]["suspend"]))
        if name in self.jobs:
            return None  # 409 Conflict
        job = client_model("V1Job", body)
        job.metadata.uid, job.status = str(uuid.uuid4()), V1JobStatus()
        self.jobs[name], self.bodies[name] = job, body
        return job

    def read_job(self, name: str) -> V1Job | None:
        job = self.jobs.get(name)
        if job is not None and not job.spec.suspend and job.metadata.deletion_timestamp is None:
            self.play(job, self.script[min(self.looks, len(self.script) - 1)])
            self.looks += 1
        return job

    def play(self, job: V1Job, moment: Moment) -> None:
        self.moment = moment
        kinds = {"complete": "Complete", "failed": "Failed"}
        job.status = V1JobStatus(
            active=1 if moment.job == "running" else None,
            conditions=[V1JobCondition(type=kinds[moment.job], status="True", reason=moment.reason or None)]
            if moment.job in kinds
            else None,
        )
        if moment.summary is not None:
            write_summary(self.results_dir, moment.summary)

    def release_job(self, name: str) -> None:
        self.calls.append(("release",))
        self.jobs[name].spec.suspend = False
        self.released.set()

    def delete_job(self, name: str) -> None:
        self.calls.append(("delete",))
        job = self.jobs.pop(name, None)
        if job is None:
            return
        if self.moment is not None:
            if self.moment.evaluator == "running":  # SIGTERM: the evaluator ends as interrupted
                write_summary(self.results_dir, "INTERRUPTED")
            agent = 143 if self.moment.agent == "running" else self.moment.agent
            self.moment = Moment(self.moment.job, 143 if self.moment.evaluator == "running" else 0, agent)
        for key, body in list(self.owned.items()):
            if body["metadata"]["ownerReferences"][0]["uid"] == job.metadata.uid:
                del self.owned[key]

    def pods(self, name: str) -> list[V1Pod]:
        if self.moment is None:
            return []
        return [
            a_pod("2030-01-01T00:00:00Z", redis="running", evaluator=self.moment.evaluator, agent=self.moment.agent)
        ]

    def agent_log(self, pod: str, *, previous: bool = False) -> HTTPResponse | None:
        self.log_reads.append(previous)
        if not self.jobs or self.moment is None:
            return None  # 404: no pod
        if previous or str(self.moment.agent).startswith("waiting"):
            raise ApiException(status=400, reason="Bad Request")  # the container is waiting to start
        return HTTPResponse(body=io.BytesIO(self.agent_output), status=200, preload_content=False)

    def annotate_job(self, name: str, annotations: dict[str, str]) -> None:
        self.jobs[name].metadata.annotations.update(annotations)

    def ensure_owned(self, body: dict, owner_uid: str) -> None:
        assert body["metadata"]["ownerReferences"][0]["uid"] == owner_uid
        self.calls.append(("own", body["kind"]))
        self.owned.setdefault((body["kind"], body["metadata"]["name"]), body)

    def wait_gone(self, name: str, *, poll_s: float, observe=None) -> None:
        self.calls.append(("wait_gone",))
        if observe is not None:
            observe(self.pods(name))  # the stopped pod, as seen before it goes
        assert name not in self.jobs

    def close(self) -> None:
        self.closed = True


def evaluate(cluster: ScriptedCluster, submission: Submission, results_dir: Path, *, resume: bool = False):
    backend = KubernetesBackend(OPTIONS, open_cluster=lambda: cluster)
    return backend.evaluate(submission_spec(submission), submission, results_dir=str(results_dir), resume=resume)


def test_the_job_is_released_only_once_its_policy_and_secret_exist(tmp_path: Path) -> None:
    submission = a_submission()
    plan, results_dir = plan_for(submission, tmp_path)
    script = [Moment("pending", "waiting:ContainerCreating", "waiting:ContainerCreating"), Moment(),
              Moment("complete", 0, 0, summary="SUCCESS")]  # fmt: skip
    cluster = ScriptedCluster(results_dir, script)
    evaluated = evaluate(cluster, submission, results_dir)
    assert evaluated == Evaluated(json.loads((results_dir / "summary.json").read_text()), 0)
    assert evaluated.summary["state"] == "SUCCESS"
    assert cluster.calls == [("create", True), ("own", "NetworkPolicy"), ("own", "Secret"), ("release",)]
    assert sorted(cluster.owned) == [("NetworkPolicy", plan.name), ("Secret", plan.name)]
    assert cluster.closed and cluster.looks == len(script)


def test_an_agent_outstaying_the_evaluator_is_stopped_with_its_job(tmp_path: Path) -> None:
    submission = a_submission()
    _, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment(), Moment(evaluator=0, summary="FAILED")])
    started = time.monotonic()
    evaluated = evaluate(cluster, submission, results_dir)
    assert time.monotonic() - started >= OPTIONS.agent_exit_grace_s
    assert evaluated.summary["state"] == "FAILED" and evaluated.agent_status == 143  # stopped by its SIGTERM
    assert cluster.calls[-2:] == [("delete",), ("wait_gone",)] and not cluster.owned


def test_a_job_that_failed_without_a_result_is_replaced_by_one_that_resumes(tmp_path: Path) -> None:
    submission = a_submission()
    plan, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment("failed", 137, "running", reason="DeadlineExceeded")])
    with pytest.raises(EvaluationLost, match="DeadlineExceeded"):
        evaluate(cluster, submission, results_dir)
    first_uid = cluster.jobs[plan.name].metadata.uid  # left for its logs until the next attempt
    # the next attempt (job.py saw the events of the first: resume) replaces it
    cluster.script, cluster.looks, cluster.calls = [Moment("complete", 0, 0, summary="SUCCESS")], 0, []
    evaluated = evaluate(cluster, submission, results_dir, resume=True)
    assert evaluated.summary["state"] == "SUCCESS"
    assert cluster.calls[:4] == [("create", True), ("delete",), ("wait_gone",), ("create", True)]
    assert cluster.jobs[plan.name].metadata.uid != first_uid
    evaluator = cluster.bodies[plan.name]["spec"]["template"]["spec"]["containers"][0]
    assert evaluator["args"][-1] == "--resume"


def killed_after(results_dir: Path, items: int, total: int) -> None:
    """What an evaluator of ``total`` items killed once ``items`` were on record leaves: its
    started event, those items' records, no summary."""
    results_dir.mkdir(parents=True)
    started = {"event": "started", "episodes_total": total, "episodes_done": 0, "resumed": False}
    (results_dir / "events.jsonl").write_text(json.dumps(started) + "\n", encoding="utf-8")
    records = "".join(json.dumps({"index": index, "unit": f"Level_{index}"}) + "\n" for index in range(items))
    (results_dir / "episodes.jsonl").write_text(records, encoding="utf-8")


@pytest.mark.parametrize(("items", "agent"), [(3, False), (2, True)], ids=["every-item", "one-left"])
def test_a_resume_with_every_item_on_record_runs_no_agent(items: int, agent: bool, tmp_path: Path) -> None:
    """An agent started then would only be told there is nothing to play (DIAMBRA's loop steps on
    after its first reset, and fails): the Job runs the evaluator alone, told no agent comes."""
    submission = a_submission()
    plan, results_dir = plan_for(submission, tmp_path)
    killed_after(results_dir, items, total=3)
    cluster = ScriptedCluster(results_dir, [Moment("complete", 0, 0, summary="SUCCESS")])
    assert evaluate(cluster, submission, results_dir, resume=True).summary["state"] == "SUCCESS"
    pod = cluster.bodies[plan.name]["spec"]["template"]["spec"]
    assert [container["name"] for container in pod["containers"]] == ["evaluator", *(["agent"] if agent else [])]
    assert pod["containers"][0]["args"][-1] == ("--resume" if agent else "--no-agent")


def test_a_worker_follows_the_job_its_lost_predecessor_started(tmp_path: Path) -> None:
    submission = a_submission()
    plan, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment(), Moment(), Moment("complete", 0, 0, summary="SUCCESS")])
    started = start_evaluation(cluster, plan, OPTIONS)  # the lost worker's attempt
    cluster.read_job(plan.name)  # it runs on without a worker
    evaluated = evaluate(cluster, submission, results_dir)
    assert evaluated.summary["state"] == "SUCCESS"
    assert cluster.jobs[plan.name].metadata.uid == started.metadata.uid  # no second Job
    assert [call for call in cluster.calls if call[0] in ("create", "release", "delete")] == [
        ("create", True), ("release",), ("create", True),
    ]  # fmt: skip


def test_a_suspended_job_left_by_a_lost_worker_is_set_up_and_released(tmp_path: Path) -> None:
    submission = a_submission()
    plan, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment("complete", 0, 0, summary="SUCCESS")])
    start_evaluation(cluster, plan, OPTIONS, release=False)
    cluster.owned.clear()  # lost before its Secret and NetworkPolicy were made
    assert evaluate(cluster, submission, results_dir).summary["state"] == "SUCCESS"
    assert sorted(kind for kind, _ in cluster.owned) == ["NetworkPolicy", "Secret"]
    assert cluster.calls.count(("release",)) == 1


def test_another_submissions_job_is_left_alone(tmp_path: Path) -> None:
    submission = a_submission()
    plan, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment()])
    other = start_evaluation(cluster, plan, OPTIONS)
    other.metadata.annotations[SUBMISSION_ANNOTATION] = "someone-else"
    with pytest.raises(ConfigError, match="someone-else"):
        evaluate(cluster, submission, results_dir)
    assert ("delete",) not in cluster.calls


def test_a_sigterm_stops_the_job_and_the_evaluation_ends_interrupted(tmp_path: Path) -> None:
    submission = a_submission()
    _, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment()])

    def cancel() -> None:  # job.py's LockKeeper, when the submission is cancelled
        if cluster.released.wait(10):
            os.kill(os.getpid(), signal.SIGTERM)

    def unhandled(signum, frame) -> None:
        raise AssertionError("the SIGTERM reached the test's own handler, not the backend's")

    before = signal.signal(signal.SIGTERM, unhandled)
    canceller = threading.Thread(target=cancel)
    canceller.start()
    try:
        evaluated = evaluate(cluster, submission, results_dir)
        assert signal.getsignal(signal.SIGTERM) is unhandled  # the work-horse's own handling is back
    finally:
        canceller.join()
        signal.signal(signal.SIGTERM, before)
    assert evaluated.summary["state"] == "INTERRUPTED" and evaluated.agent_status == 143
    assert ("delete",) in cluster.calls and not cluster.jobs


def test_a_sigterm_that_came_while_the_attempt_got_ready_stops_the_job_it_follows(tmp_path: Path) -> None:
    submission = a_submission()
    _, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment()])
    with held_stops.held():  # as job.py holds it
        signal.raise_signal(signal.SIGTERM)  # the lock keeper's, before the backend set its handler
        evaluated = evaluate(cluster, submission, results_dir)
    assert evaluated.summary["state"] == "INTERRUPTED" and evaluated.agent_status == 143
    assert ("delete",) in cluster.calls and not cluster.jobs


def test_an_attempt_that_lost_its_lock_leaves_the_job_to_the_one_that_holds_it(tmp_path: Path) -> None:
    """The worker was held up past its lock: its keeper's SIGTERM comes, and the fence says the
    submission is another attempt's now. That attempt follows the same Job: it is not deleted."""
    submission = a_submission()
    plan, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment()])
    with held_stops.held(), results_fence.fenced(lambda: "its lock lapsed"):
        signal.raise_signal(signal.SIGTERM)  # the keeper's, once it found the lock lost
        with pytest.raises(EvaluationLost, match="left to the attempt that holds the submission: its lock lapsed"):
            evaluate(cluster, submission, results_dir)
    assert ("delete",) not in cluster.calls and plan.name in cluster.jobs
    assert not (results_dir / "summary.json").exists()


def test_rqs_job_timeout_deletes_the_job(tmp_path: Path) -> None:
    submission = a_submission()
    _, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment()])
    try:
        with pytest.raises(JobTimeoutException), UnixSignalDeathPenalty(1, JobTimeoutException):
            evaluate(cluster, submission, results_dir)
    finally:
        # RQ's timeout is raised by a signal wherever the work-horse is, inside a log call too,
        # which leaves logging's locks held; the horse ends with its job, this process goes on.
        release_logging_locks()
    assert cluster.calls[-1] == ("delete",) and not cluster.jobs and cluster.closed
    assert (results_dir / "agent.log").read_bytes().startswith(b"=== arbiter: attempt")  # read before


def test_results_must_be_where_the_evaluator_writes(tmp_path: Path) -> None:
    submission = a_submission()
    cluster = ScriptedCluster(tmp_path, [Moment()])
    with pytest.raises(ConfigError, match="<results root>/"):
        evaluate(cluster, submission, tmp_path / submission.id)
    assert cluster.calls == []


def test_a_worker_that_abandons_a_submission_deletes_its_job(tmp_path: Path) -> None:
    submission = a_submission()
    plan, results_dir = plan_for(submission, tmp_path)
    cluster = ScriptedCluster(results_dir, [Moment()])
    cluster.create_job(job_manifest(plan, OPTIONS, suspended=False))
    KubernetesBackend(OPTIONS, open_cluster=lambda: cluster).abandon(submission.id)
    assert plan.name not in cluster.jobs and cluster.calls[-1] == ("delete",) and cluster.closed


# -- a real cluster -------------------------------------------------------------------------------


@pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="no cluster: KUBECONFIG is not set")
@pytest.mark.timeout(300)
def test_live_a_job_is_created_taken_over_and_deleted_with_what_it_owns(tmp_path: Path) -> None:
    """On the cluster KUBECONFIG names (its context's namespace): the Job is created suspended,
    so nothing is pulled or run; a second start takes it over (409), the worker may read pod logs
    (a Job with no pod leaves no agent.log), and a foreground deletion takes its Secret and
    NetworkPolicy with it."""
    from arbiter.server.hosting.kubernetes_agent_log import keep_agent_log
    from arbiter.server.hosting.kubernetes_cluster import Cluster, connect

    configuration, namespace = connect(OPTIONS)
    cluster = Cluster(configuration, namespace)
    submission = a_submission()
    plan, _ = plan_for(submission, tmp_path)
    try:
        created = start_evaluation(cluster, plan, OPTIONS, release=False)
        again = start_evaluation(cluster, plan, OPTIONS, release=False)
        assert again.metadata.uid == created.metadata.uid
        found = cluster.read_job(plan.name)
        assert job_state(found).phase is Phase.SUSPENDED
        assert found.metadata.annotations[SUBMISSION_ANNOTATION] == submission.id
        secret = cluster.core.read_namespaced_secret(plan.name, namespace)
        policy = cluster.networking.read_namespaced_network_policy(plan.name, namespace)
        for owned in (secret, policy):
            assert [owner.uid for owner in owned.metadata.owner_references] == [created.metadata.uid]
        assert cluster.pods(plan.name) == []  # suspended: no pod
        # the worker may read a pod's log (403 otherwise): of a pod that is not there, none
        assert cluster.agent_log(f"{plan.name}-none") is None
        assert not keep_agent_log(cluster, found, str(tmp_path), attempt=1, leaves_job=True)  # no pod: no part
        assert not (tmp_path / "agent.log").exists()
    finally:
        cluster.delete_job(plan.name)
        cluster.wait_gone(plan.name, poll_s=0.5)
    deadline = time.monotonic() + 60
    while cluster._call(cluster.core.read_namespaced_secret, plan.name, namespace, absent_ok=True) is not None:
        assert time.monotonic() < deadline, "the Job's Secret outlived it"
        time.sleep(0.5)
    cluster.close()
