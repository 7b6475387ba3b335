"""The worker's command line for the kubernetes backend: its options, and the clear errors of a
worker that cannot use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.server.cli.embedded_redis import free_port
from arbiter.server.cli.main import main
from arbiter.server.hosting.kubernetes_manifests import KubernetesOptions

# -- the worker's command line --------------------------------------------------------------------


def test_without_the_kubernetes_client_the_backend_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['kubernetes'] = None\n"
        "from arbiter.server.hosting.kubernetes_backend import KubernetesBackend\n"
        "from arbiter.server.hosting.kubernetes_manifests import KubernetesOptions\n"
        "KubernetesBackend(KubernetesOptions(evaluator_image='e:1', results_claim='results'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "ConfigError" in done.stderr and "pip install 'arbiter[kubernetes]'" in done.stderr


def test_a_worker_without_a_reachable_cluster_says_so_before_taking_work(tmp_path: Path) -> None:
    port = free_port()
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "grading"}}],
        "current-context": "x",
    }
    (tmp_path / "kubeconfig").write_text(json.dumps(kubeconfig), encoding="utf-8")
    code = (
        "from arbiter.server.hosting.kubernetes_backend import KubernetesBackend\n"
        "from arbiter.server.hosting.kubernetes_manifests import KubernetesOptions\n"
        "KubernetesBackend(KubernetesOptions(evaluator_image='e:1', results_claim='results')).check()\n"
    )
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}  # no ~/.kube here
    for env, expected in (
        ({"KUBECONFIG": str(tmp_path / "kubeconfig")}, f"cannot reach the Kubernetes API at http://127.0.0.1:{port}"),
        ({}, "finds no cluster: the worker runs in no pod, and has no usable kubeconfig"),
    ):
        done = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        assert done.returncode != 0 and "ConfigError" in done.stderr and expected in done.stderr, done.stderr[-2000:]


def test_kubernetes_options_are_refused_for_another_backend(redis_url: str, tmp_path: Path, capsys) -> None:
    worker = ["worker", "--redis-url", redis_url, "--results-root", str(tmp_path / "results"), "--burst"]
    assert main([*worker, "--kube-evaluator-image", "e:1"]) == 2
    assert "--kube-evaluator-image is for --backend kubernetes, not local" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()  # refused before the worker started


def test_the_worker_options_become_the_backends(capsys) -> None:
    from arbiter.server.cli.kube_options import kubernetes_options
    from arbiter.server.cli.parser import build_parser

    base = ["worker", "--redis-url", "redis://x", "--results-root", "r"]
    args = build_parser().parse_args(
        [*base, "--kube-evaluator-image", "e:2", "--kube-results-claim", "results", "--kube-evaluator-memory", "8Gi"]
    )
    options = kubernetes_options(args)
    assert (options.evaluator_image, options.results_claim, options.evaluator_memory) == ("e:2", "results", "8Gi")
    assert options.redis_image == KubernetesOptions.redis_image and options.tests_claim is None
    with pytest.raises(ConfigError, match="--kube-results-claim"):
        kubernetes_options(build_parser().parse_args([*base, "--kube-evaluator-image", "e:2"]))
    bad = build_parser().parse_args([*base, "--kube-evaluator-image", "e:2", "--kube-results-claim", "No_Claim"])
    with pytest.raises(ConfigError, match="--kube-results-claim 'No_Claim'"):
        kubernetes_options(bad)
    with pytest.raises(SystemExit):
        main(["worker", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for field in ("redis_image", "evaluator_cpu", "evaluator_memory"):
        assert f"(default: {getattr(KubernetesOptions, field)})" in help_text, field
