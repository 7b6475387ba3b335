"""Reading docker/ the way Docker, Compose and Kubernetes read it, for tests without any of them.

- Dockerfiles: instructions with continuations joined (ENTRYPOINT / CMD in exec form);
- compose.yml: variables interpolated as Compose does (``${VAR}``, ``:-``, ``-``, ``:?``, ``?``,
  ``$$``), a missing required one being an error;
- k8s-job.yaml: the ``${VAR}`` placeholders filled in as ``envsubst`` does, and a container's
  ``$(VAR)`` references expanded from its own env as the kubelet does.

Then ``Processes`` runs the containers' commands as local processes on loopback, with each
container path mapped to a host folder.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import redis
import yaml

# --- Dockerfiles ---------------------------------------------------------------------------------


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """``[(INSTRUCTION, args)]``: comments dropped, backslash continuations joined.

    As in Docker, a comment line inside a continued instruction is skipped, not an end.
    """
    instructions: list[tuple[str, str]] = []
    pending: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        pending.append(line)
        joined = " ".join(part for part in pending if part)
        pending = []
        keyword, _, args = joined.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def exec_form(args: str) -> list[str]:
    """A JSON-array argument (``["a", "b"]``), as ENTRYPOINT / CMD use it."""
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(item, str) for item in value), args
    return value


def only(instructions: list[tuple[str, str]], keyword: str) -> list[str]:
    return [args for name, args in instructions if name == keyword]


def image_command(dockerfile: Path) -> tuple[list[str], list[str]]:
    """``(ENTRYPOINT, CMD)`` of an image, each [] when absent (the last one counts, as in Docker)."""
    instructions = parse_dockerfile(dockerfile.read_text(encoding="utf-8"))
    entrypoints = [exec_form(args) for args in only(instructions, "ENTRYPOINT")]
    cmds = [exec_form(args) for args in only(instructions, "CMD")]
    return (entrypoints[-1] if entrypoints else []), (cmds[-1] if cmds else [])


# --- Compose interpolation -----------------------------------------------------------------------

_COMPOSE_VARIABLE = re.compile(r"\$(?:(\$)|\{(\w+)(?:(:?[-?])([^}]*))?\}|(\w+))")


def compose_interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's variable interpolation, applied to every string in a parsed compose file."""
    if isinstance(value, dict):
        return {key: compose_interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [compose_interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        dollar, name, operator, argument, bare = match.groups()
        if dollar:
            return "$"
        name = name or bare
        current = env.get(name)
        unset_or_empty = current is None or current == ""
        missing = unset_or_empty if operator and operator.startswith(":") else current is None
        if operator and operator.endswith("?") and missing:
            raise KeyError(f"required variable {name} is missing: {argument}")
        if operator and operator.endswith("-") and missing:
            return argument
        return current or ""

    return _COMPOSE_VARIABLE.sub(replace, value)


def volume_parts(volume: str | dict) -> tuple[str, str, str]:
    """``(source, target, mode)`` of a compose short-syntax string or long-syntax mapping.

    The source may hold ``${VAR:-default}``, whose own ``:`` must not split it.
    """
    if isinstance(volume, dict):
        mode = "ro" if volume.get("read_only") else "rw"
        return str(volume.get("source", "")), str(volume.get("target", "")), mode
    match = re.fullmatch(r"(\$\{[^}]*\}|[^:]+)(?::([^:]+))?(?::([^:]+))?", volume)
    assert match, f"unreadable volume {volume!r}"
    source, target, mode = match.groups()
    if target is None:
        return "", source, "rw"
    return source, target, mode or "rw"


# --- Kubernetes ----------------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"\$\{(\w+)\}")
_KUBE_REFERENCE = re.compile(r"\$\((\w+)\)")


def placeholders(text: str) -> set[str]:
    return set(_PLACEHOLDER.findall(text))


def envsubst(text: str, values: Mapping[str, str]) -> str:
    """``envsubst 'LIST'``: each listed ``${VAR}`` replaced, everything else left alone."""
    return _PLACEHOLDER.sub(lambda match: values.get(match.group(1), match.group(0)), text)


def kube_expand(text: str, env: Mapping[str, str]) -> str:
    """The kubelet's ``$(VAR)`` expansion: a reference to an unknown variable stays as written."""
    return _KUBE_REFERENCE.sub(lambda match: env.get(match.group(1), match.group(0)), text)


def kube_env(container: dict, secrets: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """A container's environment: values (which may refer to earlier variables) and secret keys."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "valueFrom" in item:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secrets[ref["name"]][ref["key"]]
        else:
            env[item["name"]] = kube_expand(str(item["value"]), env)
    return env


# --- running containers' commands as local processes ---------------------------------------------


def map_paths(word: str, mounts: Mapping[str, Path]) -> str:
    """A container path under one of ``mounts`` (container path → host folder) as a host path."""
    for target in sorted(mounts, key=len, reverse=True):
        if word == target or word.startswith(target.rstrip("/") + "/"):
            return str(mounts[target]) + word[len(target.rstrip("/")) :]
    return word


def wait_for_redis(url: str, process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    client = redis.Redis.from_url(url, socket_timeout=1)
    try:
        while True:
            assert process.poll() is None, f"redis-server exited with {process.returncode}"
            try:
                if client.ping():
                    return
            except redis.RedisError:
                pass
            assert time.monotonic() < deadline, "redis-server did not answer"
            time.sleep(0.02)
    finally:
        client.close()


class Processes:
    """Processes started for one test, each stopped (by its pid) and reaped at the end."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, argv: list[str], *, env: Mapping[str, str], cwd: Path, log: Path) -> subprocess.Popen:
        with open(log, "wb") as output:
            process = subprocess.Popen(
                argv, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT
            )
        self.started.append(process)
        return process

    def stop_all(self) -> None:
        for process in reversed(self.started):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def base_env() -> dict[str, str]:
    """What any container has: a PATH and a HOME; nothing of this test process's own settings."""
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}


def tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-chars:] if path.exists() else ""


# --- docker/k8s-job.yaml, its placeholders filled in ------------------------------------------

K8S_JOB = Path(__file__).resolve().parents[2] / "docker" / "k8s-job.yaml"
K8S_VALUES = {
    "AICROWD_SUBMISSION_ID": "T12345",
    "EVALUATION": "arbiter-t12345",
    "EVALUATOR_IMAGE": "arbiter-evaluator:latest",
    "AGENT_IMAGE": "my-agent:latest",
    "ARBITER_TESTS_CLAIM": "hidden-tests",
    "ARBITER_RESULTS_CLAIM": "arbiter-results",
}


def k8s_documents() -> dict[str, dict]:
    documents = list(yaml.safe_load_all(envsubst(K8S_JOB.read_text(encoding="utf-8"), K8S_VALUES)))
    kinds = [document["kind"] for document in documents]
    assert sorted(kinds) == ["Job", "NetworkPolicy"], kinds  # no Secret: passwords never live in this file
    return {document["kind"]: document for document in documents}


def pod_spec() -> dict:
    return k8s_documents()["Job"]["spec"]["template"]["spec"]


def k8s_container(name: str) -> dict:
    spec = pod_spec()
    (found,) = [c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name]
    return found
