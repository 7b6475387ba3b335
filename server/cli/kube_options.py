"""``arbiter worker``'s options for ``--backend kubernetes`` (``--kube-...``), read into the
backend's KubernetesOptions, whose defaults they keep; server/cli/hosting.py adds them."""

from __future__ import annotations

import argparse
from typing import Any

from arbiter.protocol.errors import ConfigError

GUIDE = "docs/hosting-kubernetes.md"
REQUIRED = ("evaluator-image", "results-claim")
# --kube-OPTION: (the KubernetesOptions field it sets, its metavar, its help)
OPTIONS = {
    "evaluator-image": (
        "evaluator_image",
        "IMAGE",
        "the evaluator's image: docker/evaluator.Dockerfile built from this arbiter (required)",
    ),
    "results-claim": (
        "results_claim",
        "CLAIM",
        "the ReadWriteMany PersistentVolumeClaim every evaluator writes its results on, mounted at /results; "
        "--results-root must be the same storage (required)",
    ),
    "tests-claim": (
        "tests_claim",
        "CLAIM",
        "the claim holding the hidden test data, mounted read-only at /tests in the evaluator alone",
    ),
    "namespace": (
        "namespace",
        "NS",
        "where the Jobs go (default: the worker's own pod's namespace, else its kubeconfig context's)",
    ),
    "redis-image": ("redis_image", "IMAGE", "the image of each evaluation's Redis (default: redis:7-alpine)"),
    "evaluator-cpu": ("evaluator_cpu", "CPU", "the evaluator's CPU request and limit (default: 2)"),
    "evaluator-memory": ("evaluator_memory", "SIZE", "the evaluator's memory request and limit (default: 4Gi)"),
    "service-account": (
        "service_account",
        "NAME",
        "the evaluation pods' service account, for its image pull secrets; its token is never mounted "
        "(default: the namespace's default)",
    ),
    "runtime-class": (
        "runtime_class",
        "NAME",
        "the evaluation pods' RuntimeClass, e.g. a gVisor sandbox (default: the cluster's)",
    ),
}


def add_kubernetes_options(worker: argparse.ArgumentParser) -> None:
    group = worker.add_argument_group(f"kubernetes backend ({GUIDE})")
    for option, (field, metavar, help_text) in OPTIONS.items():
        group.add_argument(f"--kube-{option}", dest=f"kube_{field}", metavar=metavar, help=help_text)


def given_kubernetes_options(args: argparse.Namespace) -> list[str]:
    """The ``--kube-...`` options given on the command line."""
    return [
        f"--kube-{option}" for option, (field, _, _) in OPTIONS.items() if getattr(args, f"kube_{field}") is not None
    ]


def kubernetes_options(args: argparse.Namespace) -> Any:
    """The KubernetesOptions of the command line (the backend's module is imported for this
    backend only: the kubernetes extra may not be installed)."""
    from arbiter.server.hosting.kubernetes_manifests import KubernetesOptions

    missing = [f"--kube-{option}" for option in REQUIRED if getattr(args, f"kube_{OPTIONS[option][0]}") is None]
    if missing:
        raise ConfigError(f"--backend kubernetes needs {' and '.join(missing)} ({GUIDE})")
    given = {field: getattr(args, f"kube_{field}") for field, _, _ in OPTIONS.values()}
    return KubernetesOptions(**{field: value for field, value in given.items() if value is not None}).check()
