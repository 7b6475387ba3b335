"""The Kubernetes objects of one hosted evaluation, built as plain dicts: no cluster, no client.

One submission is one Job, named after the submission (``evaluation_name``), whose single pod runs
three containers that share the pod's loopback:

- ``redis``: the evaluation's private Redis, a native sidecar (an init container that restarts
  always: up before the others, stopped after them), listening on 127.0.0.1 only, its memory
  bounded by the competition's ``[hosting] redis_memory``;
- ``evaluator``: ``arbiter serve`` with the hidden test data mounted read-only, writing into
  ``<competition>/<submission id>/`` on the results claim;
- ``agent``: the participant's image, with the ``[hosting]`` resources as its requests and
  limits, non-root, a read-only root filesystem with an emptyDir at /tmp, every capability
  dropped, no privilege escalation, seccomp RuntimeDefault. It mounts nothing else: no test data,
  no secret file, no service-account token.

With it a Secret (the two Redis passwords, the participant's ACL rule, the organiser's competition
file) and a NetworkPolicy that lets nothing into the pod and nothing out of it: the containers
talk over the pod's loopback, which no NetworkPolicy filters, so the evaluation needs no network.

``pids`` of ``[hosting]`` has no pod field: the kubelet's ``podPidsLimit`` (a node setting, for
every pod of the node) is the only bound on the pod's processes.

scripts/k8s_job_example.py prints docker/k8s-job.yaml from these builders: the same objects for
one evaluation started by hand.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Any

from arbiter.protocol.errors import ConfigError
from arbiter.server.cli.runner import AGENT_EXIT_GRACE_S
from arbiter.server.core.competition import HostingPolicy
from arbiter.server.service.acl import config_line, participant_acl

# Where the pod's volumes appear (the tests claim at the same path in every evaluator).
TESTS_MOUNT = "/tests"
RESULTS_MOUNT = "/results"
COMPETITION_MOUNT = "/etc/arbiter/competition"
ACL_MOUNT = "/etc/arbiter-redis"
SCRATCH_MOUNT = "/tmp"
REDIS_PORT = 6379
# The images' own users: arbiter's images create uid 10001; redis:7-alpine's redis user is 999.
ARBITER_UID = 10001
REDIS_UID, REDIS_GID = 999, 1000
# The Secret's keys.
REDIS_PASSWORD_KEY, AGENT_PASSWORD_KEY = "redis-password", "agent-password"
ACL_KEY, COMPETITION_KEY = "participant-acl.conf", "competition.toml"
# Redis stops taking writes (an error to the writer) at this share of its container's memory, so
# an agent flooding its queue gets refused instead of the kernel killing the evaluation's Redis.
REDIS_MAXMEMORY_SHARE = 0.75
REDIS_CPU = "500m"
# Time the evaluator gets, once stopped, to record the evaluation as interrupted.
TERMINATION_GRACE_S = 30

APP_LABEL = "app.kubernetes.io/name"
APP = "arbiter-evaluation"
EVALUATION_LABEL = "arbiter/evaluation"  # the Job's name: what the NetworkPolicy and the worker select
SUBMISSION_ANNOTATION = "arbiter/submission"  # the submission id as it is (a label value allows fewer)
COMPETITION_ANNOTATION = "arbiter/competition"

NAME_PREFIX = "arbiter-"
MAX_NAME = 63  # the Job controller copies the name into a label of its pod: a label's 63 characters
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


@dataclass(frozen=True)
class KubernetesOptions:
    """The worker's settings for ``--backend kubernetes`` (``arbiter worker --kube-...``)."""

    evaluator_image: str  # docker/evaluator.Dockerfile's image, the same arbiter as the worker's
    results_claim: str  # a ReadWriteMany claim: /results in the evaluator, the worker's --results-root
    tests_claim: str | None = None  # the hidden test data, mounted read-only at TESTS_MOUNT
    namespace: str | None = None  # None: the worker's own (in a pod), else its kubeconfig context's
    redis_image: str = "redis:7-alpine"
    service_account: str | None = None  # the evaluation pod's (image pull secrets); it mounts no token
    runtime_class: str | None = None  # a sandboxing runtime for the pod, e.g. gVisor's
    evaluator_cpu: str = "2"  # the evaluator's requests and limits (equal: the pod is Guaranteed)
    evaluator_memory: str = "4Gi"
    scratch_size: str = "2Gi"  # the agent's /tmp
    poll_interval_s: float = 2.0  # how often the worker looks at its Job
    ttl_after_finished_s: int = 24 * 3600  # a finished Job (and its logs) stays this long
    results_wait_s: float = 30.0  # how long an ended Job's summary.json may take to show (NFS caches)
    agent_exit_grace_s: float = AGENT_EXIT_GRACE_S  # after the evaluator ended, before the agent is stopped

    def check(self) -> KubernetesOptions:
        """Each setting as Kubernetes accepts it, or a clear error naming its option."""
        for option, value in (
            ("--kube-evaluator-image", self.evaluator_image),
            ("--kube-redis-image", self.redis_image),
        ):
            if not value or not value.strip() or any(character.isspace() for character in value):
                raise ConfigError(f"{option} must name an image such as registry.example.org/arbiter-evaluator:1")
        names = {
            "--kube-results-claim": self.results_claim,
            "--kube-tests-claim": self.tests_claim,
            "--kube-service-account": self.service_account,
            "--kube-runtime-class": self.runtime_class,
        }
        for option, name in names.items():
            if name is not None and not (len(name) <= 253 and DNS_SUBDOMAIN.fullmatch(name)):
                raise ConfigError(f"{option} {name!r} is not a Kubernetes object name (lowercase, digits, - and .)")
        if self.namespace is not None and not (len(self.namespace) <= 63 and DNS_LABEL.fullmatch(self.namespace)):
            raise ConfigError(f"--kube-namespace {self.namespace!r} is not a namespace name (lowercase, digits, -)")
        if (
            not self.poll_interval_s > 0
            or min(self.results_wait_s, self.agent_exit_grace_s, self.ttl_after_finished_s) < 0
        ):
            raise ConfigError("the poll interval must be > 0; the results wait, the agent's grace and the TTL >= 0")
        return self


@dataclass(frozen=True)
class EvaluationPlan:
    """One evaluation as the manifests need it, worked out from its spec and submission."""

    name: str  # the Job's, the Secret's and the NetworkPolicy's
    submission_id: str  # also the evaluation's service id (its Redis keys, its ACL user)
    competition_name: str
    agent_image: str
    agent_args: tuple[str, ...]  # replaces the image's CMD, as `docker run IMAGE ARGS...` does; () keeps it
    evaluator_args: tuple[str, ...]
    competition_file: tuple[str, str] | None  # (file name, text) of an organiser's competition file
    tests: str | None  # the evaluator's --tests (under TESTS_MOUNT)
    deadline_s: int  # activeDeadlineSeconds
    hosting: HostingPolicy
    # False: the pod runs the evaluator alone (a resume with every item on record, `serve
    # --no-agent`): an agent would only be told there is nothing to play.
    agent: bool = True

    @property
    def results_subpath(self) -> str:
        """The results folder, relative to the results root (the worker's layout, job.py's)."""
        return f"{self.competition_name}/{self.submission_id}"


@dataclass(frozen=True)
class Credentials:
    redis_password: str  # the evaluator's: Redis's default user
    agent_password: str  # the participant's ACL user's

    @classmethod
    def new(cls) -> Credentials:
        return cls(secrets.token_hex(24), secrets.token_hex(24))


def evaluation_name(submission_id: str) -> str:
    """A DNS-1123 label for the submission's objects, the same every time. An id that is one
    already (lowercase, digits, -) keeps its text; any other gets a digest of it as its end,
    so two ids never share a name."""
    lowered = re.sub(r"[^a-z0-9-]+", "-", submission_id.lower()).strip("-")
    name = NAME_PREFIX + lowered
    if lowered == submission_id and len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(submission_id.encode("utf-8")).hexdigest()[:10]
    return f"{name[: MAX_NAME - len(digest) - 1].rstrip('-')}-{digest}"


def cpu_quantity(cpus: float) -> str:
    millis = round(cpus * 1000)
    if millis < 1:
        raise ConfigError(f"[hosting] cpus {cpus} is less than Kubernetes' smallest share, 0.001")
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def memory_quantity(size: int) -> str:
    for suffix, factor in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if size % factor == 0:
            return f"{size // factor}{suffix}"
    return str(size)


def redis_maxmemory(hosting: HostingPolicy) -> int:
    return int(hosting.redis_memory_bytes * REDIS_MAXMEMORY_SHARE)


# -- the objects --------------------------------------------------------------------------------


def _metadata(plan: EvaluationPlan, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": plan.name,
        "labels": {APP_LABEL: APP, EVALUATION_LABEL: plan.name},
        "annotations": {SUBMISSION_ANNOTATION: plan.submission_id, COMPETITION_ANNOTATION: plan.competition_name},
    }
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return metadata


def owner_reference(job_name: str, job_uid: str) -> dict[str, Any]:
    """Deleting the Job deletes what it owns; a foreground deletion waits for them."""
    return {"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": job_uid, "blockOwnerDeletion": True}


def _secret_env(name: str, plan: EvaluationPlan, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": plan.name, "key": key}}}


def _hardened(uid: int, gid: int, *, read_only: bool) -> dict[str, Any]:
    context: dict[str, Any] = {
        "runAsUser": uid,
        "runAsGroup": gid,
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if read_only:
        context["readOnlyRootFilesystem"] = True
    return context


def _guaranteed(resources: dict[str, str]) -> dict[str, Any]:
    """Requests equal to limits: the node reserves them, and the pod is never evicted first."""
    return {"requests": dict(resources), "limits": dict(resources)}


def _redis_container(plan: EvaluationPlan, options: KubernetesOptions) -> dict[str, Any]:
    # after its config file, which holds the participant's `user` line alone
    settings = {
        "--requirepass": "$(ARBITER_REDIS_PASSWORD)",
        "--bind": "127.0.0.1",
        "--port": str(REDIS_PORT),
        "--save": "",
        "--appendonly": "no",
        "--maxmemory": str(redis_maxmemory(plan.hosting)),
        "--maxmemory-policy": "noeviction",
    }
    return {
        "name": "redis",
        "image": options.redis_image,
        "restartPolicy": "Always",
        "command": ["redis-server", f"{ACL_MOUNT}/{ACL_KEY}", *(word for pair in settings.items() for word in pair)],
        "env": [
            _secret_env("ARBITER_REDIS_PASSWORD", plan, REDIS_PASSWORD_KEY),
            # read by redis-cli, so the probe needs no password on its command line
            {"name": "REDISCLI_AUTH", "value": "$(ARBITER_REDIS_PASSWORD)"},
        ],
        "startupProbe": {
            "exec": {"command": ["sh", "-c", f"redis-cli -h 127.0.0.1 -p {REDIS_PORT} ping | grep -q PONG"]},
            "periodSeconds": 1,
            "failureThreshold": 60,
        },
        "securityContext": _hardened(REDIS_UID, REDIS_GID, read_only=True),
        "resources": _guaranteed({"cpu": REDIS_CPU, "memory": memory_quantity(plan.hosting.redis_memory_bytes)}),
        "volumeMounts": [
            {"name": "participant-acl", "mountPath": ACL_MOUNT, "readOnly": True},
            {"name": "redis-data", "mountPath": "/data"},
        ],
    }


def _evaluator_container(plan: EvaluationPlan, options: KubernetesOptions) -> dict[str, Any]:
    mounts = [{"name": "results", "mountPath": RESULTS_MOUNT}]
    if plan.tests is not None:
        mounts.insert(0, {"name": "tests", "mountPath": TESTS_MOUNT, "readOnly": True})
    if plan.competition_file is not None:
        mounts.append({"name": "competition", "mountPath": COMPETITION_MOUNT, "readOnly": True})
    return {
        "name": "evaluator",
        "image": options.evaluator_image,
        "args": list(plan.evaluator_args),  # the image's entrypoint is `arbiter serve`
        "env": [
            _secret_env("ARBITER_REDIS_PASSWORD", plan, REDIS_PASSWORD_KEY),
            {"name": "ARBITER_REDIS_URL", "value": f"redis://:$(ARBITER_REDIS_PASSWORD)@127.0.0.1:{REDIS_PORT}/0"},
            {"name": "AICROWD_SUBMISSION_ID", "value": plan.submission_id},
        ],
        "securityContext": _hardened(ARBITER_UID, ARBITER_UID, read_only=False),
        "resources": _guaranteed({"cpu": options.evaluator_cpu, "memory": options.evaluator_memory}),
        "volumeMounts": mounts,
    }


def _agent_container(plan: EvaluationPlan) -> dict[str, Any]:
    resources = {"cpu": cpu_quantity(plan.hosting.cpus), "memory": memory_quantity(plan.hosting.memory_bytes)}
    if plan.hosting.gpus:
        resources["nvidia.com/gpu"] = str(plan.hosting.gpus)
    container: dict[str, Any] = {"name": "agent", "image": plan.agent_image}
    if plan.agent_args:
        container["args"] = list(plan.agent_args)
    user = f"participant-{plan.submission_id}"
    container.update(
        env=[
            _secret_env("ARBITER_AGENT_PASSWORD", plan, AGENT_PASSWORD_KEY),
            {
                "name": "ARBITER_REDIS_URL",
                "value": f"redis://{user}:$(ARBITER_AGENT_PASSWORD)@127.0.0.1:{REDIS_PORT}/0",
            },
            {"name": "AICROWD_SUBMISSION_ID", "value": plan.submission_id},
            {"name": "redis_ip", "value": "127.0.0.1"},  # flatland's own client reads it
            # Its own process namespace and /tmp: the MetaLC runner may clear a fold's leavings.
            {"name": "ARBITER_SOLE_TENANT", "value": SCRATCH_MOUNT},
        ],
        securityContext=_hardened(ARBITER_UID, ARBITER_UID, read_only=True),
        resources=_guaranteed(resources),
        volumeMounts=[{"name": "scratch", "mountPath": SCRATCH_MOUNT}],
    )
    return container


def _volumes(plan: EvaluationPlan, options: KubernetesOptions) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": "participant-acl", "secret": {"secretName": plan.name, "items": [{"key": ACL_KEY, "path": ACL_KEY}]}},
        {"name": "redis-data", "emptyDir": {}},
        {"name": "scratch", "emptyDir": {"sizeLimit": options.scratch_size}},
    ]
    if plan.tests is not None:
        volumes.append({"name": "tests", "persistentVolumeClaim": {"claimName": options.tests_claim, "readOnly": True}})
    volumes.append({"name": "results", "persistentVolumeClaim": {"claimName": options.results_claim}})
    if plan.competition_file is not None:
        item = {"key": COMPETITION_KEY, "path": plan.competition_file[0]}
        volumes.append({"name": "competition", "secret": {"secretName": plan.name, "items": [item]}})
    return volumes


def job_manifest(plan: EvaluationPlan, options: KubernetesOptions, *, suspended: bool) -> dict[str, Any]:
    """``suspended``: the worker creates the Job suspended and releases it once the Secret and the
    NetworkPolicy it owns exist, so its pod never runs without them."""
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "securityContext": {
            "runAsNonRoot": True,
            "fsGroup": ARBITER_UID,  # the results claim becomes the evaluator's group's
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [_redis_container(plan, options)],
        "containers": [_evaluator_container(plan, options), *([_agent_container(plan)] if plan.agent else [])],
        "volumes": _volumes(plan, options),
    }
    if options.service_account:
        pod["serviceAccountName"] = options.service_account
    if options.runtime_class:
        pod["runtimeClassName"] = options.runtime_class
    if plan.hosting.gpus:  # GPU nodes are commonly tainted so that only GPU pods land there
        pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    metadata = _metadata(plan)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "suspend": suspended,
            # One pod: a second would start the evaluation over; the worker resumes it instead.
            "backoffLimit": 0,
            "activeDeadlineSeconds": plan.deadline_s,
            "ttlSecondsAfterFinished": options.ttl_after_finished_s,
            "template": {"metadata": {"labels": dict(metadata["labels"])}, "spec": pod},
        },
    }


def network_policy_manifest(plan: EvaluationPlan, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """Nothing in, nothing out: no rule is listed for either direction."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(plan, owner),
        "spec": {
            "podSelector": {"matchLabels": {EVALUATION_LABEL: plan.name}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        },
    }


def secret_manifest(plan: EvaluationPlan, credentials: Credentials, owner: dict[str, Any]) -> dict[str, Any]:
    data = {
        REDIS_PASSWORD_KEY: credentials.redis_password,
        AGENT_PASSWORD_KEY: credentials.agent_password,
        ACL_KEY: config_line(participant_acl(plan.submission_id, credentials.agent_password)) + "\n",
    }
    if plan.competition_file is not None:
        data[COMPETITION_KEY] = plan.competition_file[1]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(plan, owner),
        "type": "Opaque",
        "immutable": True,
        "stringData": data,
    }
