"""Static checks of docker/: no Docker engine needed, nothing is built or run.

The compose file and the Dockerfiles are read as text. Hosted evaluation relies on these
properties: the agent reaches nothing but Redis, never sees the test set, runs within the
NeurIPS 2020 limits and never as root, and the evaluator's command line is one the CLI accepts.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from arbiter.server.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yml"
EVALUATOR_DOCKERFILE = DOCKER / "evaluator.Dockerfile"
AGENT_DOCKERFILE = DOCKER / "agent-base.Dockerfile"
DOCKERFILES = [EVALUATOR_DOCKERFILE, AGENT_DOCKERFILE]
NON_ROOT_UID = "10001"


# --- a tiny Dockerfile parser --------------------------------------------------------------------


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
        if name == "RUN" and "pip install" in args and re.search(r"\s\.(\s|$)", args)
    )
    copied = {
        source.rstrip("/")
        for name, args in instructions[:install_at]
        if name == "COPY"
        for source in copy_sources(args)
    }
    assert needed <= copied, f"{path.name} installs before copying {sorted(needed - copied)}"
    assert "--no-cache-dir" in instructions[install_at][1]


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


def volume_parts(volume: str | dict) -> tuple[str, str, str]:
    """``(source, target, mode)`` of a short-syntax string or long-syntax mapping.

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


def test_compose_parses_and_has_the_three_services() -> None:
    data = compose()
    assert {"redis", "evaluator", "agent"} <= set(data["services"])


def test_the_agent_network_is_internal_and_its_only_one() -> None:
    data = compose()
    agent_networks = service_networks(service("agent"))
    assert agent_networks == ["internal"]
    assert data["networks"]["internal"]["internal"] is True
    assert "network_mode" not in service("agent")


def test_every_service_stays_on_internal_networks_and_publishes_nothing() -> None:
    data = compose()
    for name, spec in data["services"].items():
        networks = service_networks(spec)
        assert networks, f"{name} would join compose's default network, which is not internal"
        for network in networks:
            assert data["networks"][network].get("internal") is True, f"{name} joins {network}"
        assert "network_mode" not in spec, name
        assert "ports" not in spec, f"{name} publishes ports"
    assert service_networks(service("evaluator")) == ["internal"]
    assert service_networks(service("redis")) == ["internal"]


def test_the_agent_never_sees_the_test_set() -> None:
    agent = service("agent")
    assert "volumes_from" not in agent
    for volume in agent.get("volumes", []):
        source, target, _ = volume_parts(volume)
        assert "tests" not in source.lower() and "tests" not in target.lower(), volume
        assert "ARBITER_TESTS" not in source, volume
    environment = agent.get("environment", {})
    assert "AICROWD_TESTS_FOLDER" not in environment


def test_the_evaluator_mounts_the_tests_read_only() -> None:
    mounts = [volume_parts(volume) for volume in service("evaluator")["volumes"]]
    tests = [(source, mode) for source, target, mode in mounts if target == "/tests"]
    assert tests == [("${ARBITER_TESTS:-./tests}", "ro")]
    assert any(target == "/results" for _, target, _ in mounts)


def test_the_agent_gets_the_neurips2020_limits() -> None:
    agent = service("agent")
    assert agent["cpus"] == 4
    assert agent["mem_limit"] == "15g"


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


def test_both_sides_get_the_same_connection_settings() -> None:
    evaluator = service("evaluator")["environment"]
    agent = service("agent")["environment"]
    url = "redis://:${ARBITER_REDIS_PASSWORD:?set ARBITER_REDIS_PASSWORD}@redis:6379/0"
    assert evaluator["ARBITER_REDIS_URL"] == agent["ARBITER_REDIS_URL"] == url
    assert evaluator["AICROWD_SUBMISSION_ID"] == agent["AICROWD_SUBMISSION_ID"]
    assert agent["redis_ip"] == "redis"


def test_redis_requires_the_password_and_keeps_nothing_on_disk() -> None:
    redis = service("redis")
    assert redis["image"] == "redis:7-alpine"
    command = [str(word) for word in redis["command"]]
    assert command[command.index("--requirepass") + 1] == "${ARBITER_REDIS_PASSWORD:?set ARBITER_REDIS_PASSWORD}"
    assert command[command.index("--save") + 1] == ""
    assert "ports" not in redis


def test_required_variables_never_fall_back_to_a_default() -> None:
    """A missing password or agent image must stop compose, not run with an empty value."""
    text = COMPOSE.read_text(encoding="utf-8")
    for variable in ("ARBITER_REDIS_PASSWORD", "AGENT_IMAGE"):
        uses = re.findall(r"\$\{" + variable + r"([^}]*)\}", text)
        assert uses, variable
        assert all(use.startswith(":?") for use in uses), f"{variable}: {uses}"
        assert f"${variable}" not in text.replace("${", "{"), f"bare ${variable}"
