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
from arbiter.server.hosting.kubernetes_manifests import (
    EVALUATION_LABEL,
    SUBMISSION_ANNOTATION,
    TERMINATION_GRACE_S,
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

INSTALL_HINT = "pip install 'arbiter[kubernetes]' (from a checkout: pip install -e '.[kubernetes]')"
API_OUTAGE_S = 60.0  # how long the API server may fail (5xx, 429, no connection) before the attempt stops
GONE_WAIT_S = TERMINATION_GRACE_S + 60.0  # a deleted Job's pod stops within its grace, then the Job goes
IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def require_kubernetes() -> Any:
    try:
        import kubernetes
    except ImportError as exc:
        raise ConfigError(f"--backend kubernetes needs the official Kubernetes client ({exc}): {INSTALL_HINT}") from exc
    return kubernetes


# -- the cluster ----------------------------------------------------------------------------------


class Cluster:
    """The API calls of one evaluation, in one namespace. A failure of the API server (5xx, 429,
    no connection) is retried for ``API_OUTAGE_S``: the Job runs on without the worker meanwhile."""

    def __init__(self, configuration: Any, namespace: str):
        from kubernetes import client

        self.namespace = namespace
        self.api_client = client.ApiClient(configuration)
        self.batch = client.BatchV1Api(self.api_client)
        self.core = client.CoreV1Api(self.api_client)
        self.networking = client.NetworkingV1Api(self.api_client)

    def close(self) -> None:
        self.api_client.close()

    def _call(self, call: Callable[..., Any], *args: Any, absent_ok: bool = False, **kwargs: Any) -> Any:
        """``call``'s answer; None for a 404 when ``absent_ok``."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        give_up_at = time.monotonic() + API_OUTAGE_S
        while True:
            try:
                return call(*args, **kwargs)
            except ApiException as exc:
                if exc.status == 404 and absent_ok:
                    return None
                if exc.status not in (429, 500, 502, 503, 504) or time.monotonic() > give_up_at:
                    raise
                problem: Exception = exc
            except (HTTPError, OSError) as exc:
                if time.monotonic() > give_up_at:
                    raise
                problem = exc
            log.warning("the Kubernetes API failed (%s); trying again", problem)
            time.sleep(1.0)

    def create_job(self, body: dict[str, Any]) -> Any | None:
        """The created V1Job; None when one of that name exists (409 Conflict)."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self._call(self.batch.create_namespaced_job, self.namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                return None
            raise

    def read_job(self, name: str) -> Any | None:
        return self._call(self.batch.read_namespaced_job, name, self.namespace, absent_ok=True)

    def release_job(self, name: str) -> None:
        self._call(self.batch.patch_namespaced_job, name, self.namespace, {"spec": {"suspend": False}})

    def delete_job(self, name: str) -> None:
        """Foreground: the Job stays until its pod and what it owns are gone."""
        self._call(
            self.batch.delete_namespaced_job, name, self.namespace, propagation_policy="Foreground", absent_ok=True
        )

    def pods(self, name: str) -> list[Any]:
        found = self._call(self.core.list_namespaced_pod, self.namespace, label_selector=f"{EVALUATION_LABEL}={name}")
        return list(found.items or [])

    def ensure_owned(self, body: dict[str, Any], owner_uid: str) -> None:
        """Create a Secret or NetworkPolicy the Job owns. One of that name owned by the same Job is
        kept (its worker was lost after making it); one left from an earlier Job is replaced."""
        from kubernetes.client.exceptions import ApiException

        kind, name = body["kind"], body["metadata"]["name"]
        if kind == "Secret":
            create, read, delete = (
                self.core.create_namespaced_secret,
                self.core.read_namespaced_secret,
                self.core.delete_namespaced_secret,
            )
        else:
            create, read, delete = (
                self.networking.create_namespaced_network_policy,
                self.networking.read_namespaced_network_policy,
                self.networking.delete_namespaced_network_policy,
            )
        for _ in range(3):
            try:
                self._call(create, self.namespace, body)
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
            existing = self._call(read, name, self.namespace, absent_ok=True)
            owners = (existing.metadata.owner_references or []) if existing is not None else []
            if any(owner.uid == owner_uid for owner in owners):
                return
            self._call(delete, name, self.namespace, absent_ok=True)
        raise EvaluationLost(f"the {kind} {name} keeps coming back from an earlier Job; delete it by hand")

    def wait_gone(self, name: str, *, poll_s: float, observe: Callable[[list[Any]], None] | None = None) -> None:
        give_up_at = time.monotonic() + GONE_WAIT_S
        while self.read_job(name) is not None:
            if observe is not None:
                observe(self.pods(name))
            if time.monotonic() > give_up_at:
                raise EvaluationLost(f"the Job {name} is still there {GONE_WAIT_S:g} s after its deletion")
            time.sleep(poll_s)


def connect(options: KubernetesOptions) -> tuple[Any, str]:
    """The client's configuration and the namespace: the pod's service account when the worker runs
    in the cluster, else its kubeconfig (``KUBECONFIG``, ``~/.kube/config``). Access is checked."""
    require_kubernetes()
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
        with open(IN_CLUSTER_NAMESPACE, encoding="utf-8") as handle:
            namespace = handle.read().strip()
    except (config.ConfigException, OSError):
        try:
            config.load_kube_config(client_configuration=configuration)
            _, active = config.list_kube_config_contexts()
        except (config.ConfigException, OSError, TypeError) as exc:
            raise ConfigError(
                f"--backend kubernetes finds no cluster: the worker runs in no pod, and has no usable kubeconfig "
                f"({exc}); set KUBECONFIG"
            ) from None
        namespace = active.get("context", {}).get("namespace") or "default"
    namespace = options.namespace or namespace
    api_client = client.ApiClient(configuration)
    try:
        client.BatchV1Api(api_client).list_namespaced_job(namespace, limit=1)
    except ApiException as exc:
        raise ConfigError(
            f"the Kubernetes API refuses to list Jobs in namespace {namespace!r} ({exc.status} {exc.reason}): give "
            "the worker's account the Role of docs/hosting-kubernetes.md"
        ) from None
    except (HTTPError, OSError) as exc:
        raise ConfigError(f"cannot reach the Kubernetes API at {configuration.host}: {exc}") from None
    finally:
        api_client.close()
    return configuration, namespace


# -- the backend ----------------------------------------------------------------------------------


def start_evaluation(
    cluster: Cluster, plan: EvaluationPlan, options: KubernetesOptions, *, release: bool = True
) -> Any:
    """Create the submission's Job, or take over the one already there; returns the V1Job."""
    for _ in range(3):
        job = cluster.create_job(job_manifest(plan, options, suspended=True))
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
    cluster: Cluster, plan: EvaluationPlan, options: KubernetesOptions, results_dir: str, stop: StopSignal
) -> Evaluated:
    """Watch the Job until it ends, or end it; then collect its result."""
    agent = AgentWatch()
    evaluator_ended_at: float | None = None
    while True:
        state = job_state(cluster.read_job(plan.name))
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
            log.info("deleting the Job %s: %s", plan.name, "stopped" if step is Step.STOP else "the evaluation ended")
            cluster.delete_job(plan.name)
            cluster.wait_gone(
                plan.name,
                poll_s=min(options.poll_interval_s, 1.0),
                observe=lambda pods: agent.see(container_outcomes(pods)),
            )
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
        try:
            with StopSignal() as stop:
                try:
                    start_evaluation(cluster, plan, self.options)
                    return follow(cluster, plan, self.options, results_dir, stop)
                except BaseTimeoutException:  # RQ ended this attempt: its pod goes with it
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
