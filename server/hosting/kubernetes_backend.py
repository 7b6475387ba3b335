"""``--backend kubernetes``: each submission evaluated by a Job of its own on a Kubernetes cluster.

The worker's work-horse creates the submission's Job (kubernetes_manifests.py) through the
official client, follows it, and collects its result; the evaluation itself runs in the Job's pod.

- Start. The Job is named after the submission, so a second create fails with 409 Conflict. The
  Job is created suspended; its Secret and NetworkPolicy, owned by it (deleted with it), are
  created next, and only then is the Job released, so its pod never runs without them. A worker
  that finds the Job already there (the worker before it was lost) follows that one, finishing
  its setup if it was lost before; a Job that ended without a result is deleted, and a new one
  continues the evaluation (the evaluator's resume, decided by job.py from the results folder).
- Follow. The Job is polled every ``poll_interval_s``. A SIGTERM to the work-horse (job.py's
  LockKeeper sends one when the submission is cancelled or its lock lost) or RQ's job timeout
  deletes the Job in the foreground: its pod is stopped (the evaluator records the evaluation as
  interrupted), then the Job and what it owns are gone. Once the evaluator has ended, the agent
  gets ``agent_exit_grace_s`` to exit, as with ``arbiter run``, then the Job is deleted the same way.
  An attempt that lost its lock (results_fence.py) deletes nothing: the Job is the submission's,
  and the attempt that holds the submission now follows it.
- The agent's log. Read into the results folder's agent.log before the Job goes
  (kubernetes_agent_log.py): before the worker deletes it, once it ended, before it is replaced.
- Collect. The results claim is the worker's --results-root: the evaluator writes
  ``<competition>/<submission id>/`` on it, the folder job.py gives the backend, and the worker
  reads summary.json there. A Job that ended with no final summary.json raises
  ``EvaluationLost``: job.py retries the submission (RQ's retries), and the next attempt resumes.

A worker killed outright (SIGKILL, its machine lost) leaves its Job running: the next attempt
follows it, and the Job's own deadline (activeDeadlineSeconds) ends it if no attempt comes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rq.timeouts import BaseTimeoutException

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.competition import CompetitionSpec
from arbiter.server.hosting.kubernetes_agent_log import keep_agent_log, with_attempt
from arbiter.server.hosting.kubernetes_cluster import Cluster, connect, require_kubernetes
from arbiter.server.hosting.kubernetes_manifests import (
    SUBMISSION_ANNOTATION,
    Credentials,
    EvaluationPlan,
    KubernetesOptions,
    evaluation_name,
    job_manifest,
    network_policy_manifest,
    owner_reference,
    secret_manifest,
)
from arbiter.server.hosting.kubernetes_plan import nothing_left_to_play, plan_evaluation
from arbiter.server.hosting.kubernetes_status import (
    AgentWatch,
    EvaluationLost,
    Phase,
    Step,
    collect,
    container_outcomes,
    job_state,
    next_step,
)
from arbiter.server.hosting.stop_signal import StopSignal
from arbiter.server.hosting.submissions import Submission
from arbiter.server.service import results_fence

if TYPE_CHECKING:  # backends.py lists this backend: it is imported from there at run time, not here
    from arbiter.server.hosting.backends import Evaluated

log = logging.getLogger(__name__)


def start_evaluation(
    cluster: Cluster,
    plan: EvaluationPlan,
    options: KubernetesOptions,
    *,
    release: bool = True,
    attempt: int = 0,
    results_dir: str | None = None,
) -> Any:
    """Create the submission's Job, or take over the one already there; returns the V1Job.
    ``attempt`` creates it; a Job replaced leaves its agent's log in ``results_dir``."""
    for _ in range(3):
        job = cluster.create_job(with_attempt(job_manifest(plan, options, suspended=True), attempt))
        if job is not None:
            break
        existing = cluster.read_job(plan.name)
        if existing is None:
            continue  # deleted meanwhile: create it again
        owner = (existing.metadata.annotations or {}).get(SUBMISSION_ANNOTATION)
        if owner != plan.submission_id:
            raise ConfigError(f"the Job {plan.name} is submission {owner!r}'s, not {plan.submission_id!r}'s")
        state = job_state(existing)
        if state.phase in (Phase.SUSPENDED, Phase.PENDING, Phase.RUNNING):
            log.info("following the Job %s, started by an earlier attempt (%s)", plan.name, state.describe())
            job = existing
            break
        log.warning("the Job %s ended %s without a result: replaced by a new one", plan.name, state.describe())
        if results_dir is not None:
            keep_agent_log(cluster, existing, results_dir, attempt=attempt - 1, leaves_job=False)
        cluster.delete_job(plan.name)
        cluster.wait_gone(plan.name, poll_s=min(options.poll_interval_s, 1.0))
    else:
        raise EvaluationLost(f"the Job {plan.name} could be neither created nor taken over")
    owner = owner_reference(plan.name, job.metadata.uid)
    cluster.ensure_owned(network_policy_manifest(plan, owner), job.metadata.uid)
    cluster.ensure_owned(secret_manifest(plan, Credentials.new(), owner), job.metadata.uid)
    if release and job.spec.suspend:
        cluster.release_job(plan.name)
    return job


def follow(
    cluster: Cluster,
    plan: EvaluationPlan,
    options: KubernetesOptions,
    results_dir: str,
    stop: StopSignal,
    *,
    attempt: int = 0,
) -> Evaluated:
    """Watch the Job until it ends, or end it; then collect its result."""
    agent = AgentWatch()
    evaluator_ended_at: float | None = None
    while True:
        job = cluster.read_job(plan.name)
        state = job_state(job)
        outcomes = container_outcomes(cluster.pods(plan.name)) if state.phase is not Phase.GONE else {}
        agent.see(outcomes)
        evaluator = outcomes.get("evaluator")
        if evaluator is not None and evaluator.exit_code is not None and evaluator_ended_at is None:
            evaluator_ended_at = time.monotonic()
        ended_for = None if evaluator_ended_at is None else time.monotonic() - evaluator_ended_at
        step = next_step(
            state,
            outcomes,
            stop_requested=stop.is_set(),
            evaluator_ended_for_s=ended_for,
            agent_grace_s=options.agent_exit_grace_s,
        )
        if step is Step.FOLLOW:
            stop.wait(options.poll_interval_s)
            continue
        if step is not Step.COLLECT:
            refused = results_fence.refusal()
            if refused is not None:  # the Job is followed now by the attempt that holds the submission
                raise EvaluationLost(f"the Job {plan.name} is left to the attempt that holds the submission: {refused}")
            keep_agent_log(cluster, job, results_dir, attempt=attempt, leaves_job=False)
            log.info("deleting the Job %s: %s", plan.name, "stopped" if step is Step.STOP else "the evaluation ended")
            cluster.delete_job(plan.name)
            cluster.wait_gone(
                plan.name,
                poll_s=min(options.poll_interval_s, 1.0),
                observe=lambda pods: agent.see(container_outcomes(pods)),
            )
        else:
            keep_agent_log(cluster, job, results_dir, attempt=attempt, leaves_job=True)
        status = agent.status(stopped_it=step is not Step.COLLECT)
        return collect(results_dir, plan, state, status, stopped=step is Step.STOP, wait_s=options.results_wait_s)


class KubernetesBackend:
    """Agents in Jobs on a Kubernetes cluster (``arbiter worker --backend kubernetes``)."""

    name = "kubernetes"
    agent_outlives_horse = False  # its Job runs on, and the next attempt follows it

    def __init__(self, options: KubernetesOptions, open_cluster: Callable[[], Cluster] | None = None):
        """``open_cluster``: how an evaluation reaches the cluster; by default the client that
        ``check`` configures (the pod's service account, else the kubeconfig)."""
        self.options = options.check()
        require_kubernetes()
        self.open_cluster = open_cluster

    def check(self) -> None:
        """Connect, and see that the namespace's Jobs may be listed: a worker that cannot reach
        the cluster takes no submission."""
        if self.open_cluster is None:
            configuration, namespace = connect(self.options)
            self.open_cluster = _ClusterOpener(configuration, namespace)

    def abandon(self, submission_id: str) -> None:
        """The worker killed the work-horse that followed this submission's Job (a cancel, a
        job timeout, a cold shutdown): the Job would run on without anyone to collect it, so it
        is deleted; the next attempt, if any, starts a new one that resumes."""
        try:
            self.check()
            assert self.open_cluster is not None
            cluster = self.open_cluster()
            try:
                cluster.delete_job(evaluation_name(submission_id))
            finally:
                cluster.close()
        except Exception as exc:  # the worker goes on; the Job's deadline ends it at worst
            log.error("the Job of %s was not deleted: %s", submission_id, exc)

    def evaluate(self, spec: CompetitionSpec, submission: Submission, *, results_dir: str, resume: bool) -> Evaluated:
        # Nothing left to play: no agent is started, as the local and container backends start none.
        nothing_left = resume and nothing_left_to_play(results_dir)
        plan = plan_evaluation(spec, submission, self.options, resume=resume, agent=not nothing_left)
        if not os.path.normpath(results_dir).endswith(os.sep + os.path.join(plan.competition_name, plan.submission_id)):
            raise ConfigError(f"{results_dir} is not <results root>/{plan.results_subpath}, where the evaluator writes")
        # Made by the worker, so that the evaluator (the same uid) writes into a folder of its own user.
        os.makedirs(results_dir, exist_ok=True)
        self.check()
        assert self.open_cluster is not None
        cluster = self.open_cluster()
        attempt = submission.attempts
        try:
            with StopSignal() as stop:
                try:
                    start_evaluation(cluster, plan, self.options, attempt=attempt, results_dir=results_dir)
                    return follow(cluster, plan, self.options, results_dir, stop, attempt=attempt)
                except BaseTimeoutException:  # RQ ended this attempt: its pod goes with it
                    keep_agent_log(cluster, plan.name, results_dir, attempt=attempt, leaves_job=False)
                    cluster.delete_job(plan.name)
                    raise
        finally:
            cluster.close()


@dataclass(frozen=True)
class _ClusterOpener:
    """A new client per evaluation, made in the work-horse (never shared across a fork)."""

    configuration: Any
    namespace: str

    def __call__(self) -> Cluster:
        return Cluster(self.configuration, self.namespace)
