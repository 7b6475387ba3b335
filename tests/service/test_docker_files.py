"""Static checks of docker/: no Docker engine or cluster needed, nothing is built or run.

The Dockerfiles, the compose file and the Kubernetes Job are read as text (tests/hosted.py).
Hosted evaluation relies on these properties: the agent reaches nothing but Redis, as its own
limited ACL user, never sees the test set or the evaluator's password, runs within the NeurIPS
2020 limits and never as root, and the evaluator's command line is one the CLI accepts.
tests/test_hosted.py runs the same commands end to end.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import paths
import pytest
import yaml
from hosted import (
    compose_interpolate,
    exec_form,
    k8s_container,
    only,
    parse_dockerfile,
    volume_parts,
)

from arbiter.server.cli.parser import build_parser
from arbiter.server.core.competition import HostingPolicy, size_bytes
from arbiter.server.hosting.kubernetes_manifests import KubernetesOptions, redis_maxmemory

REPO = paths.REPO
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yml"
EVALUATOR_DOCKERFILE = DOCKER / "evaluator.Dockerfile"
AGENT_DOCKERFILE = DOCKER / "agent-base.Dockerfile"
DOCKERFILES = [EVALUATOR_DOCKERFILE, AGENT_DOCKERFILE]
NON_ROOT_UID = "10001"
# `pip install .` or `pip install ".[extra,...]"`: the repository itself, with its extras
PIP_INSTALL_THE_REPO = r"""\s["']?\.(\[(?P<extras>[\w,]+)\])?["']?(\s|$)"""
REQUIRED_COMPOSE_VARIABLES = (
    "ARBITER_REDIS_PASSWORD",
    "ARBITER_AGENT_PASSWORD",
    "ARBITER_ACL_FILE",
    "AGENT_IMAGE",
    "AICROWD_SUBMISSION_ID",
)


# --- helpers ---------------------------------------------------------------------------------------


def copy_sources(args: str) -> list[str]:
    """Source paths of one COPY (shell or JSON form, flags skipped); [] for ``--from`` copies."""
    words = exec_form(args) if args.startswith("[") else shlex.split(args)
    flags = [word for word in words if word.startswith("--")]
    if any(flag.startswith("--from") for flag in flags):
        return []
    paths = [word for word in words if not word.startswith("--")]
    assert len(paths) >= 2, f"COPY needs a source and a destination: {args!r}"
    return paths[:-1]


@pytest.fixture(scope="module", params=DOCKERFILES, ids=lambda path: path.name)
def dockerfile(request: pytest.FixtureRequest) -> tuple[Path, list[tuple[str, str]]]:
    path: Path = request.param
    return path, parse_dockerfile(path.read_text(encoding="utf-8"))


def test_the_parser_joins_continuations_and_skips_comments() -> None:
    text = 'FROM x\n# note\nRUN a \\\n  # inside\n  && b\nCMD ["python", "run.py"]\n'
    assert parse_dockerfile(text) == [("FROM", "x"), ("RUN", "a && b"), ("CMD", '["python", "run.py"]')]


# --- the Dockerfiles ------------------------------------------------------------------------------


def test_dockerfiles_parse_into_instructions(dockerfile: tuple[Path, list[tuple[str, str]]]) -> None:
    path, instructions = dockerfile
    known = {"FROM", "ENV", "RUN", "WORKDIR", "COPY", "USER", "ENTRYPOINT", "CMD", "ARG", "LABEL"}
    assert instructions, path
    assert instructions[0] == ("FROM", "python:3.11-slim")
    unknown = {name for name, _ in instructions} - known
    assert not unknown, f"{path.name}: unexpected instructions {unknown}"


def test_every_copy_source_exists_in_the_repo(dockerfile: tuple[Path, list[tuple[str, str]]]) -> None:
    """The compose build context is the repository root (``..`` from docker/)."""
    path, instructions = dockerfile
    sources = [source for args in only(instructions, "COPY") for source in copy_sources(args)]
    assert sources, f"{path.name} copies nothing"
    for source in sources:
        assert not Path(source).is_absolute() and ".." not in Path(source).parts, source
        assert (REPO / source).exists(), f"{path.name}: COPY source {source!r} is not in the repository"


def test_everything_pip_install_needs_is_copied_first(dockerfile: tuple[Path, list[tuple[str, str]]]) -> None:
    """setup.py maps protocol/, client/, server/ into arbiter.* and reads README.md."""
    path, instructions = dockerfile
    needed = {"setup.py", "pyproject.toml", "README.md", "protocol", "client", "server"}
    install_at = next(
        i
        for i, (name, args) in enumerate(instructions)
        if name == "RUN" and "pip install" in args and re.search(PIP_INSTALL_THE_REPO, args)
    )
    copied = {
        source.rstrip("/")
        for name, args in instructions[:install_at]
        if name == "COPY"
        for source in copy_sources(args)
    }
    assert needed <= copied, f"{path.name} installs before copying {sorted(needed - copied)}"
    assert "--no-cache-dir" in instructions[install_at][1]


def test_the_evaluator_image_installs_the_diambra_and_kubernetes_extras() -> None:
    """Every format's env runs in it, and it runs the kubernetes backend's worker too."""
    instructions = parse_dockerfile(EVALUATOR_DOCKERFILE.read_text(encoding="utf-8"))
    (install,) = [args for name, args in instructions if name == "RUN" and re.search(PIP_INSTALL_THE_REPO, args)]
    extras = re.search(PIP_INSTALL_THE_REPO, install).group("extras")
    assert set(extras.split(",")) >= {"diambra", "kubernetes"}, install
    setup_py = (REPO / "setup.py").read_text(encoding="utf-8")
    for extra in extras.split(","):
        assert re.search(rf'"{extra}":', setup_py), f"setup.py has no extra {extra!r}"
    packages = " ".join(args for name, args in instructions if name == "RUN" and "apt-get install" in args)
    assert "libgl1" in packages and "libglib2.0-0" in packages  # what opencv-python loads


def user_is_root(user: str) -> bool:
    name = str(user).split(":")[0].strip()
    return name in ("", "root", "0")


def test_dockerfiles_end_as_the_non_root_user(dockerfile: tuple[Path, list[tuple[str, str]]]) -> None:
    path, instructions = dockerfile
    users = only(instructions, "USER")
    assert users, f"{path.name} has no USER line: it would run as root"
    assert not user_is_root(users[-1]), f"{path.name} runs as {users[-1]!r}"
    assert users[-1].split(":")[0] == NON_ROOT_UID
    created = " ".join(only(instructions, "RUN"))
    assert f"--uid {NON_ROOT_UID}" in created, f"{path.name} never creates uid {NON_ROOT_UID}"


def test_the_evaluator_command_line_is_accepted_by_the_cli() -> None:
    instructions = parse_dockerfile(EVALUATOR_DOCKERFILE.read_text(encoding="utf-8"))
    (entrypoint,) = [exec_form(args) for args in only(instructions, "ENTRYPOINT")]
    (cmd,) = [exec_form(args) for args in only(instructions, "CMD")]
    assert entrypoint == ["arbiter", "serve"]
    assert cmd[:4] == ["--tests", "/tests", "--results", "/results"]
    args = build_parser().parse_args(entrypoint[1:] + cmd)  # parse only: nothing runs
    assert args.command == "serve"
    assert args.tests == "/tests" and args.results == "/results"
    # and the same for the command compose gives it, if it overrides the image's CMD
    command = compose()["services"]["evaluator"].get("command")
    if command is not None:
        words = command if isinstance(command, list) else shlex.split(command)
        build_parser().parse_args(entrypoint[1:] + [str(word) for word in words])


def test_the_arbiter_console_script_is_the_cli() -> None:
    setup_py = (REPO / "setup.py").read_text(encoding="utf-8")
    assert re.search(r"[\"']arbiter\s*=\s*arbiter\.server\.cli:main[\"']", setup_py)


def test_the_agent_base_image_runs_run_py_from_home_agent() -> None:
    instructions = parse_dockerfile(AGENT_DOCKERFILE.read_text(encoding="utf-8"))
    assert only(instructions, "WORKDIR")[-1] == "/home/agent"
    assert [exec_form(args) for args in only(instructions, "CMD")] == [["python", "run.py"]]
    assert not only(instructions, "ENTRYPOINT")


def test_no_test_set_is_baked_into_an_image(dockerfile: tuple[Path, list[tuple[str, str]]]) -> None:
    path, instructions = dockerfile
    for args in only(instructions, "COPY"):
        for source in copy_sources(args):
            assert not source.rstrip("/").endswith("tests"), f"{path.name} copies {source!r}"


# --- compose.yml ----------------------------------------------------------------------------------


def compose() -> dict:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict), "compose.yml is not a mapping"
    return data


def service(name: str) -> dict:
    return compose()["services"][name]


def service_networks(spec: dict) -> list[str]:
    networks = spec.get("networks", [])
    return list(networks) if isinstance(networks, (list, dict)) else []


def test_compose_parses_and_has_the_three_services() -> None:
    data = compose()
    assert {"redis", "evaluator", "agent"} <= set(data["services"])


def test_the_agent_network_is_internal_and_holds_only_the_agent_and_redis() -> None:
    data = compose()
    assert service_networks(service("agent")) == ["agent"]
    assert data["networks"]["agent"]["internal"] is True
    assert "network_mode" not in service("agent")
    members = {name for name, spec in data["services"].items() if "agent" in service_networks(spec)}
    assert members == {"agent", "redis"}


def test_every_service_stays_on_internal_networks_and_publishes_nothing() -> None:
    data = compose()
    for name, spec in data["services"].items():
        networks = service_networks(spec)
        assert networks, f"{name} would join compose's default network, which is not internal"
        for network in networks:
            assert data["networks"][network].get("internal") is True, f"{name} joins {network}"
        assert "network_mode" not in spec, name
        assert "ports" not in spec, f"{name} publishes ports"
    assert service_networks(service("evaluator")) == ["evaluator"]
    assert sorted(service_networks(service("redis"))) == ["agent", "evaluator"]


def test_the_agent_never_sees_the_test_set() -> None:
    agent = service("agent")
    assert "volumes_from" not in agent
    for volume in agent.get("volumes", []):
        source, target, _ = volume_parts(volume)
        assert "tests" not in source.lower() and "tests" not in target.lower(), volume
        assert "ARBITER_TESTS" not in source, volume
    environment = agent.get("environment", {})
    assert "AICROWD_TESTS_FOLDER" not in environment
    for name, spec in compose()["services"].items():
        mounts = [volume_parts(volume) for volume in spec.get("volumes", [])]
        if any("ARBITER_TESTS" in source for source, _, _ in mounts):
            assert name == "evaluator", f"{name} mounts the test set"


def test_the_evaluator_mounts_the_tests_read_only() -> None:
    mounts = [volume_parts(volume) for volume in service("evaluator")["volumes"]]
    tests = [(source, mode) for source, target, mode in mounts if target == "/tests"]
    assert tests == [("${ARBITER_TESTS:-./tests}", "ro")]
    assert any(target == "/results" for _, target, _ in mounts)


def test_the_compose_agent_gets_the_hosting_defaults_and_the_kubernetes_hardening() -> None:
    """The limits and the hardening a worker gives an agent (the competition's [hosting]
    defaults, the NeurIPS 2020 limits; the Kubernetes agent's container), in compose too."""
    defaults, agent = HostingPolicy(), service("agent")
    assert agent["cpus"] == defaults.cpus
    assert size_bytes(agent["mem_limit"], "mem_limit") == defaults.memory_bytes
    assert agent["memswap_limit"] == agent["mem_limit"]  # no swap beyond it
    assert agent["pids_limit"] == defaults.pids
    kubernetes_agent = k8s_container("agent")
    context = kubernetes_agent["securityContext"]
    assert str(agent["user"]) == f"{context['runAsUser']}:{context['runAsGroup']}"
    assert agent["read_only"] is context["readOnlyRootFilesystem"] is True
    (scratch,) = kubernetes_agent["volumeMounts"]
    (tmpfs,) = agent["tmpfs"]
    target, _, size = tmpfs.partition(":size=")
    assert target == scratch["mountPath"]
    assert size_bytes(size, "tmpfs") == size_bytes(KubernetesOptions.scratch_size.removesuffix("i"), "scratch")
    assert agent["cap_drop"] == ["ALL"] and context["capabilities"]["drop"] == ["ALL"]
    assert "no-new-privileges:true" in agent["security_opt"] and context["allowPrivilegeEscalation"] is False


def test_the_compose_redis_is_bounded_as_a_workers_is() -> None:
    redis = service("redis")
    defaults = HostingPolicy()
    assert size_bytes(redis["mem_limit"], "mem_limit") == defaults.redis_memory_bytes
    command = [str(word) for word in redis["command"]]
    assert int(command[command.index("--maxmemory") + 1]) == redis_maxmemory(defaults)
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"


def test_each_compose_run_writes_its_own_results_folder() -> None:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    env = {name: "x" for name in REQUIRED_COMPOSE_VARIABLES}
    folders = []
    for service_id in ("sub-1", "sub-2"):
        done = compose_interpolate(data, {**env, "AICROWD_SUBMISSION_ID": service_id})
        words = done["services"]["evaluator"]["command"]
        folders.append(words[words.index("--results") + 1])
    assert folders == ["/results/sub-1", "/results/sub-2"]


@pytest.mark.parametrize("name", ["agent", "evaluator"])
def test_agent_and_evaluator_do_not_run_as_root(name: str) -> None:
    spec = service(name)
    assert "user" in spec, f"{name} has no user: it runs as the image's user, maybe root"
    assert not user_is_root(spec["user"]), spec["user"]
    assert str(spec["user"]) == f"{NON_ROOT_UID}:{NON_ROOT_UID}"
    assert not spec.get("privileged", False)


def test_the_evaluator_is_built_from_its_dockerfile_with_the_repo_as_context() -> None:
    build = service("evaluator")["build"]
    context = (DOCKER / build["context"]).resolve()
    assert context == REPO
    assert (context / build["dockerfile"]).resolve() == EVALUATOR_DOCKERFILE


def test_the_agent_runs_the_participant_image_after_the_evaluator() -> None:
    agent = service("agent")
    assert agent["image"].startswith("${AGENT_IMAGE:?")
    depends = agent["depends_on"]
    assert "evaluator" in (depends if isinstance(depends, list) else list(depends))
    assert "build" not in agent


def test_the_agent_connects_as_its_acl_user_and_never_gets_the_evaluators_password() -> None:
    evaluator = service("evaluator")["environment"]
    agent = service("agent")["environment"]
    service_id = "${AICROWD_SUBMISSION_ID:?set AICROWD_SUBMISSION_ID}"
    assert (
        evaluator["ARBITER_REDIS_URL"] == "redis://:${ARBITER_REDIS_PASSWORD:?set ARBITER_REDIS_PASSWORD}@redis:6379/0"
    )
    assert agent["ARBITER_REDIS_URL"] == (
        f"redis://participant-{service_id}:${{ARBITER_AGENT_PASSWORD:?set ARBITER_AGENT_PASSWORD}}@redis:6379/0"
    )
    assert evaluator["AICROWD_SUBMISSION_ID"] == agent["AICROWD_SUBMISSION_ID"] == service_id
    assert agent["redis_ip"] == "redis"
    assert "ARBITER_REDIS_PASSWORD" not in str(service("agent"))
    assert "ARBITER_AGENT_PASSWORD" not in str(service("evaluator"))


def test_only_redis_gets_the_participants_acl_file() -> None:
    data = compose()
    assert data["secrets"] == {
        "participant_acl": {
            "file": "${ARBITER_ACL_FILE:?set ARBITER_ACL_FILE to the output of arbiter acl --format config}"
        }
    }
    holders = [name for name, spec in data["services"].items() if spec.get("secrets")]
    assert holders == ["redis"] and service("redis")["secrets"] == ["participant_acl"]


def test_redis_requires_the_password_and_keeps_nothing_on_disk() -> None:
    redis = service("redis")
    assert redis["image"] == "redis:7-alpine"
    command = [str(word) for word in redis["command"]]
    # redis-server CONFIG-FILE --option value ...: the ACL file is read as its config file
    assert command[:2] == ["redis-server", "/run/secrets/participant_acl"]
    assert command[command.index("--requirepass") + 1] == "${ARBITER_REDIS_PASSWORD:?set ARBITER_REDIS_PASSWORD}"
    assert redis["healthcheck"]["test"] == ["CMD-SHELL", "redis-cli -h 127.0.0.1 -p 6379 ping | grep -q PONG"]
    assert "ARBITER_REDIS_PASSWORD" in redis["environment"]["REDISCLI_AUTH"]
    assert command[command.index("--save") + 1] == ""
    assert "ports" not in redis


def test_required_variables_never_fall_back_to_a_default() -> None:
    """A missing password or agent image must stop compose, not run with an empty value."""
    # comments are not interpolated (the header shows shell commands that use these variables)
    text = "\n".join(
        line for line in COMPOSE.read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith("#")
    )
    for variable in REQUIRED_COMPOSE_VARIABLES:
        uses = re.findall(r"\$\{" + variable + r"([^}]*)\}", text)
        assert uses, variable
        assert all(use.startswith(":?") for use in uses), f"{variable}: {uses}"
        assert f"${variable}" not in text.replace("${", "{"), f"bare ${variable}"


def test_compose_interpolates_with_the_documented_variables_and_stops_without_them() -> None:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    env = {name: "x" for name in REQUIRED_COMPOSE_VARIABLES}
    done = compose_interpolate(data, env)
    assert done["services"]["evaluator"]["volumes"][0] == "./tests:/tests:ro"
    assert done["services"]["agent"]["environment"]["ARBITER_REDIS_URL"] == "redis://participant-x:x@redis:6379/0"
    for missing in REQUIRED_COMPOSE_VARIABLES:
        with pytest.raises(KeyError, match=missing):
            compose_interpolate(data, {**env, missing: ""})
