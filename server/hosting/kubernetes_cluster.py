"""The Kubernetes API as one evaluation calls it (kubernetes_backend.py): the official client,
configured from the pod's service account or a kubeconfig, in one namespace, each call retried
while the API server fails for a while (its Job runs on without the worker meanwhile).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from arbiter.protocol.errors import ConfigError
from arbiter.server.hosting.kubernetes_agent_log import AGENT_CONTAINER
from arbiter.server.hosting.kubernetes_manifests import EVALUATION_LABEL, TERMINATION_GRACE_S, KubernetesOptions
from arbiter.server.hosting.kubernetes_status import EvaluationLost

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'arbiter[kubernetes]' (from a checkout: pip install -e '.[kubernetes]')"
API_OUTAGE_S = 60.0  # how long the API server may fail (5xx, 429, no connection) before the attempt stops
API_RETRY_S = 1.0  # between two tries of a failed API call
LOG_TIMEOUT_S = (10.0, 60.0)  # to connect, then for each read of a log (the default waits for ever)
GONE_WAIT_S = TERMINATION_GRACE_S + 60.0  # a deleted Job's pod stops within its grace, then the Job goes
IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def require_kubernetes() -> Any:
    try:
        import kubernetes
    except ImportError as exc:
        raise ConfigError(f"--backend kubernetes needs the official Kubernetes client ({exc}): {INSTALL_HINT}") from exc
    return kubernetes


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
            time.sleep(API_RETRY_S)

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

    def annotate_job(self, name: str, annotations: dict[str, str]) -> None:
        self._call(self.batch.patch_namespaced_job, name, self.namespace, {"metadata": {"annotations": annotations}})

    def agent_log(self, pod: str, *, previous: bool = False) -> Any | None:
        """The log of ``pod``'s agent container as a urllib3 response, to ``stream`` (the client
        would decode it, a line of JSON into a Python repr); None when the pod is gone."""
        return self._call(
            self.core.read_namespaced_pod_log, pod, self.namespace, container=AGENT_CONTAINER, previous=previous,
            absent_ok=True, _preload_content=False, _request_timeout=LOG_TIMEOUT_S,
        )  # fmt: skip

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
