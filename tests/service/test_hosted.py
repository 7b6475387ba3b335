"""Hosted evaluation end to end, without Docker or Kubernetes: the commands of docker/compose.yml
and docker/k8s-job.yaml run here as local processes.

For each file: the participant's ACL file is made with the documented `arbiter acl` command; a
real redis-server starts with the Redis service's own arguments (only its port moved to a free
loopback one); its health check runs; the evaluator runs the image's entrypoint with the file's
arguments and environment, each container path mapped to a host folder; the agent runs the
agent base image's command (``python run.py``, the example agent) with exactly the environment the
file gives it. The evaluation must complete, and the agent's credentials must be the limited ACL
user's, not the evaluator's.
"""

from __future__ import annotations

import contextlib
import io
import json
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import paths
import pytest
import redis
import yaml
from harness import wait_for
from hosted import (
    Processes,
    base_env,
    compose_interpolate,
    envsubst,
    image_command,
    kube_env,
    kube_expand,
    map_paths,
    placeholders,
    tail,
    volume_parts,
    wait_for_redis,
)
from redis.backoff import NoBackoff
from redis.retry import Retry

from arbiter.server.cli.embedded_redis import free_port, redis_server_binary
from arbiter.server.cli.main import main

REPO = paths.REPO
DOCKER = REPO / "docker"
AGENT_SOURCE = REPO / "examples" / "random_agent.py"


def arbiter_executable() -> str:
    """The `arbiter` console script the images run (installed with the package)."""
    found = shutil.which("arbiter")
    assert found, "the arbiter console script is not on PATH: is the package installed?"
    return found


def participant_acl(service_id: str, password: str) -> str:
    """The documented command, `arbiter acl --service-id ID --password PW --format config`
    (run in this process: the same parser and handler, without a second interpreter's start-up)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["acl", "--service-id", service_id, "--password", password, "--format", "config"]) == 0
    assert password not in out.getvalue()
    return out.getvalue()


def with_redis_tools(env: dict[str, str]) -> dict[str, str]:
    """redis-cli (for health checks) sits next to the redis-server binary the tests use."""
    return {**env, "PATH": f"{Path(redis_server_binary()).parent}:{env['PATH']}"}


def local_program(word: str) -> str:
    """An image's program as found on this machine."""
    if word == "python":
        return sys.executable
    if word == "arbiter":
        return arbiter_executable()
    if word == "redis-server":
        return redis_server_binary()
    raise AssertionError(f"unexpected program {word!r}")


def run_evaluation(
    *,
    work: Path,
    redis_argv: list[str],
    redis_cwd: Path,
    admin_url: str,
    health_check: list[str],
    health_env: dict[str, str],
    evaluator_argv: list[str],
    evaluator_env: dict[str, str],
    agent_argv: list[str],
    agent_env: dict[str, str],
    results: Path,
) -> dict:
    """Redis, its health check, the evaluator, then the agent; returns the evaluation's summary."""
    agent_dir = work / "home-agent"
    agent_dir.mkdir()
    shutil.copy(AGENT_SOURCE, agent_dir / "run.py")
    processes = Processes()
    try:
        server = processes.start(redis_argv, env=base_env(), cwd=redis_cwd, log=work / "redis.log")
        wait_for_redis(admin_url, server)
        health = subprocess.run(health_check, env=with_redis_tools(health_env), capture_output=True, timeout=30)
        assert health.returncode == 0, health
        evaluator = processes.start(evaluator_argv, env=evaluator_env, cwd=work, log=work / "evaluator.log")
        # An agent may start first (its client retries), but a request sent before the evaluator
        # clears its lists on start is dropped and resent 2 s later: wait, to keep the test quick.
        wait_for(lambda: "waiting for the agent" in tail(work / "evaluator.log"), timeout_s=60, what="the evaluator")
        agent = subprocess.run(agent_argv, env=agent_env, cwd=agent_dir, capture_output=True, text=True, timeout=120)
        assert agent.returncode == 0, agent.stderr[-3000:] + tail(work / "evaluator.log")
        assert "submitted: score " in agent.stdout
        assert evaluator.wait(timeout=60) == 0, tail(work / "evaluator.log")
        check_the_agent_is_confined(
            agent_env["ARBITER_REDIS_URL"],
            port=redis.Redis.from_url(admin_url).connection_pool.connection_kwargs["port"],
        )
    finally:
        processes.stop_all()
    return json.loads((results / "summary.json").read_text(encoding="utf-8"))


def check_the_agent_is_confined(agent_url: str, *, port: int) -> None:
    """The agent's credentials open only its ACL user; without them nothing is open at all."""
    no_retry = Retry(NoBackoff(), 0)  # a refusal is the answer expected here, not a reason to retry
    agent = redis.Redis.from_url(agent_url, socket_timeout=5, retry=no_retry)
    anonymous = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, retry=no_retry)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            agent.keys("*")
        with pytest.raises(redis.exceptions.NoPermissionError):
            agent.execute_command("CONFIG", "GET", "requirepass")
        with pytest.raises(redis.exceptions.AuthenticationError):
            anonymous.ping()
    finally:
        agent.close()
        anonymous.close()


# --- compose.yml -----------------------------------------------------------------------------------


def test_compose_runs_one_evaluation_end_to_end(tiny_tests, service_id, tmp_path) -> None:
    admin_password, agent_password = secrets.token_hex(16), secrets.token_hex(16)
    acl_file = tmp_path / "participant-acl.conf"
    acl_file.write_text(participant_acl(service_id, agent_password), encoding="utf-8")
    results = tmp_path / "results"
    results.mkdir()
    env = {
        "ARBITER_REDIS_PASSWORD": admin_password,
        "ARBITER_AGENT_PASSWORD": agent_password,
        "AICROWD_SUBMISSION_ID": service_id,
        "AGENT_IMAGE": "my-agent:latest",
        "ARBITER_ACL_FILE": str(acl_file),
        "ARBITER_TESTS": tiny_tests,
        "ARBITER_RESULTS": str(results),
    }
    compose = compose_interpolate(yaml.safe_load((DOCKER / "compose.yml").read_text(encoding="utf-8")), env)
    services = compose["services"]
    port = free_port()

    def on_loopback(value: str) -> str:
        return value.replace("@redis:6379/", f"@127.0.0.1:{port}/")

    # redis: its secrets appear under /run/secrets/<name>
    redis_spec = services["redis"]
    secret_mounts = {f"/run/secrets/{name}": Path(compose["secrets"][name]["file"]) for name in redis_spec["secrets"]}
    command = [str(word) for word in redis_spec["command"]]
    redis_argv = [local_program(command[0])] + [map_paths(word, secret_mounts) for word in command[1:]]
    redis_argv += ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)]
    check = redis_spec["healthcheck"]["test"]
    assert check[0] == "CMD-SHELL"
    health_check = ["sh", "-c", check[1].replace("-p 6379", f"-p {port}")]

    # the evaluator: the image's entrypoint and command, its volumes
    evaluator_spec = services["evaluator"]
    mounts = {target: Path(source) for source, target, _ in map(volume_parts, evaluator_spec["volumes"])}
    assert mounts["/tests"] == Path(tiny_tests) and mounts["/results"] == results
    entrypoint, cmd = image_command(DOCKER / "evaluator.Dockerfile")
    words = entrypoint + [str(word) for word in evaluator_spec.get("command", cmd)]
    evaluator_argv = [local_program(words[0])] + [map_paths(word, mounts) for word in words[1:]]
    evaluator_env = {**base_env(), **{k: on_loopback(str(v)) for k, v in evaluator_spec["environment"].items()}}

    # the agent: the base image's command, only the environment compose gives it
    agent_spec = services["agent"]
    assert "command" not in agent_spec and "entrypoint" not in agent_spec and "volumes" not in agent_spec
    _, agent_cmd = image_command(DOCKER / "agent-base.Dockerfile")
    agent_env = {**base_env(), **{k: on_loopback(str(v)) for k, v in agent_spec["environment"].items()}}
    assert admin_password not in "".join(agent_env.values())
    assert tiny_tests not in "".join(agent_env.values())

    summary = run_evaluation(
        work=tmp_path,
        redis_argv=redis_argv,
        redis_cwd=tmp_path,
        admin_url=f"redis://:{admin_password}@127.0.0.1:{port}/0",
        health_check=health_check,
        health_env={**base_env(), **{k: str(v) for k, v in redis_spec["environment"].items()}},
        evaluator_argv=evaluator_argv,
        evaluator_env=evaluator_env,
        agent_argv=[local_program(agent_cmd[0]), *agent_cmd[1:]],
        agent_env=agent_env,
        results=Path(evaluator_argv[evaluator_argv.index("--results") + 1]),  # each run's own folder
    )
    assert summary["state"] == "SUCCESS" and summary["service_id"] == service_id
    assert summary["episodes"]["finished"] == 3


# --- k8s-job.yaml ----------------------------------------------------------------------------------


def test_the_kubernetes_job_runs_one_evaluation_end_to_end(tiny_tests, service_id, tmp_path) -> None:
    admin_password, agent_password = secrets.token_hex(16), secrets.token_hex(16)
    text = (DOCKER / "k8s-job.yaml").read_text(encoding="utf-8")
    values = {
        "AICROWD_SUBMISSION_ID": service_id,
        "EVALUATION": "arbiter-" + service_id.lower(),
        "EVALUATOR_IMAGE": "arbiter-evaluator:latest",
        "AGENT_IMAGE": "my-agent:latest",
        "ARBITER_TESTS_CLAIM": "hidden-tests",
        "ARBITER_RESULTS_CLAIM": "arbiter-results",
    }
    assert placeholders(text) == set(values)
    documents = list(yaml.safe_load_all(envsubst(text, values)))
    job = next(document for document in documents if document["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    # the Secret the documented kubectl command creates
    the_secret = {
        "redis-password": admin_password,
        "agent-password": agent_password,
        "participant-acl.conf": participant_acl(service_id, agent_password),
    }
    cluster_secrets = {values["EVALUATION"]: the_secret}
    results_claim = tmp_path / "results-claim"
    results_claim.mkdir()
    claims = {"hidden-tests": Path(tiny_tests), "arbiter-results": results_claim}

    volumes: dict[str, Path] = {}
    for volume in pod["volumes"]:
        if "secret" in volume:
            folder = tmp_path / f"secret-{volume['name']}"
            folder.mkdir()
            for item in volume["secret"]["items"]:
                (folder / item["path"]).write_text(cluster_secrets[volume["secret"]["secretName"]][item["key"]])
            volumes[volume["name"]] = folder
        elif "emptyDir" in volume:
            volumes[volume["name"]] = tmp_path / f"empty-{volume['name']}"
            volumes[volume["name"]].mkdir()
        else:
            volumes[volume["name"]] = claims[volume["persistentVolumeClaim"]["claimName"]]

    def mounts_of(container: dict) -> dict[str, Path]:
        return {mount["mountPath"]: volumes[mount["name"]] for mount in container.get("volumeMounts", [])}

    port = free_port()

    def on_loopback(value: str) -> str:
        return value.replace("@127.0.0.1:6379/", f"@127.0.0.1:{port}/")

    (redis_spec,) = pod["initContainers"]
    redis_env = kube_env(redis_spec, cluster_secrets)
    words = [kube_expand(str(word), redis_env) for word in redis_spec["command"]]
    words = [str(port) if word == "6379" else word for word in words]
    redis_argv = [local_program(words[0])] + [map_paths(word, mounts_of(redis_spec)) for word in words[1:]]
    probe = redis_spec["startupProbe"]["exec"]["command"]
    health_check = [*probe[:-1], probe[-1].replace("-p 6379", f"-p {port}")]

    containers = {container["name"]: container for container in pod["containers"]}
    evaluator_spec = containers["evaluator"]
    evaluator_env = {k: on_loopback(v) for k, v in kube_env(evaluator_spec, cluster_secrets).items()}
    entrypoint, cmd = image_command(DOCKER / "evaluator.Dockerfile")
    words = entrypoint + [kube_expand(str(word), evaluator_env) for word in evaluator_spec.get("args", cmd)]
    evaluator_argv = [local_program(words[0])] + [map_paths(word, mounts_of(evaluator_spec)) for word in words[1:]]

    agent_spec = containers["agent"]
    assert "command" not in agent_spec and "args" not in agent_spec
    assert [mount["mountPath"] for mount in agent_spec["volumeMounts"]] == ["/tmp"]  # its scratch only
    _, agent_cmd = image_command(DOCKER / "agent-base.Dockerfile")
    agent_env = {k: on_loopback(v) for k, v in kube_env(agent_spec, cluster_secrets).items()}
    assert admin_password not in "".join(agent_env.values())

    summary = run_evaluation(
        work=tmp_path,
        redis_argv=redis_argv,
        redis_cwd=mounts_of(redis_spec)["/data"],
        admin_url=f"redis://:{admin_password}@127.0.0.1:{port}/0",
        health_check=health_check,
        health_env={**base_env(), **redis_env},
        evaluator_argv=evaluator_argv,
        evaluator_env={**base_env(), **evaluator_env},
        agent_argv=[local_program(agent_cmd[0]), *agent_cmd[1:]],
        agent_env={**base_env(), **agent_env},
        results=Path(evaluator_argv[evaluator_argv.index("--results") + 1]),  # <competition>/<id> on the claim
    )
    assert summary["state"] == "SUCCESS" and summary["service_id"] == service_id
    assert summary["episodes"]["finished"] == 3
