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
from hosted import compose_interpolate, envsubst, exec_form, only, parse_dockerfile, placeholders, volume_parts

from arbiter.server.cli.main import build_parser

REPO = paths.REPO
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yml"
EVALUATOR_DOCKERFILE = DOCKER / "evaluator.Dockerfile"
AGENT_DOCKERFILE = DOCKER / "agent-base.Dockerfile"
DOCKERFILES = [EVALUATOR_DOCKERFILE, AGENT_DOCKERFILE]
K8S_JOB = DOCKER / "k8s-job.yaml"
NON_ROOT_UID = "10001"
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


# --- k8s-job.yaml ----------------------------------------------------------------------------------

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


def test_the_k8s_placeholders_are_the_documented_envsubst_list() -> None:
    text = K8S_JOB.read_text(encoding="utf-8")
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    (listed,) = re.findall(r"envsubst '([^']*)'", text)
    assert placeholders(body) == placeholders(listed) == set(K8S_VALUES)
    assert "$" not in envsubst(body, K8S_VALUES).replace("$(", "")  # only the kubelet's $(VAR) remain


def test_the_job_runs_redis_evaluator_and_agent_once() -> None:
    job = k8s_documents()["Job"]
    spec = pod_spec()
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] > 8 * 3600  # longer than the overall budget
    assert spec["restartPolicy"] == "Never"
    assert [c["name"] for c in spec["containers"]] == ["evaluator", "agent"]
    (redis,) = spec["initContainers"]
    assert redis["name"] == "redis" and redis["restartPolicy"] == "Always"  # a native sidecar
    assert k8s_container("evaluator")["image"] == "arbiter-evaluator:latest"
    assert k8s_container("agent")["image"] == "my-agent:latest"


def test_nothing_in_the_pod_runs_as_root_or_reaches_the_cluster() -> None:
    spec = pod_spec()
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    for key in ("hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace"):
        assert not spec.get(key, False), key
    for container in spec["containers"] + spec["initContainers"]:
        context = container["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] != 0, container["name"]
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]
        assert not context.get("privileged", False)
    agent = k8s_container("agent")["securityContext"]
    assert (agent["runAsUser"], agent["runAsGroup"]) == (int(NON_ROOT_UID), int(NON_ROOT_UID))


def test_the_k8s_agent_gets_the_neurips2020_limits() -> None:
    resources = k8s_container("agent")["resources"]
    assert resources["limits"] == {"cpu": "4", "memory": "15G"}
    assert resources["requests"] == resources["limits"]


def test_the_test_set_is_mounted_read_only_into_the_evaluator_alone() -> None:
    spec = pod_spec()
    (tests,) = [v for v in spec["volumes"] if v["name"] == "tests"]
    assert tests["persistentVolumeClaim"] == {"claimName": "hidden-tests", "readOnly": True}
    mounts = {
        c["name"]: {m["name"]: m for m in c.get("volumeMounts", [])}
        for c in spec["containers"] + spec["initContainers"]
    }
    assert [name for name, by_volume in mounts.items() if "tests" in by_volume] == ["evaluator"]
    assert mounts["evaluator"]["tests"] == {"name": "tests", "mountPath": "/tests", "readOnly": True}
    assert mounts["agent"] == {}  # the agent mounts nothing at all
    assert [name for name, by_volume in mounts.items() if "participant-acl" in by_volume] == ["redis"]


def test_the_agent_gets_only_its_own_secret() -> None:
    agent = k8s_container("agent")
    refs = [e["valueFrom"]["secretKeyRef"] for e in agent["env"] if "valueFrom" in e]
    assert refs == [{"name": "arbiter-t12345", "key": "agent-password"}]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["ARBITER_REDIS_URL"] == "redis://participant-T12345:$(ARBITER_AGENT_PASSWORD)@127.0.0.1:6379/0"
    assert env["AICROWD_SUBMISSION_ID"] == "T12345"
    assert "redis-password" not in str(agent) and "AICROWD_TESTS_FOLDER" not in env


def test_the_network_policy_leaves_the_pod_only_its_redis_port() -> None:
    documents = k8s_documents()
    policy = documents["NetworkPolicy"]["spec"]
    labels = documents["Job"]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert labels["arbiter/submission"] == "T12345"  # one evaluation's pod, not every evaluation's
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    assert policy["ingress"] == []
    (rule,) = policy["egress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    assert rule["to"] == [{"podSelector": {"matchLabels": policy["podSelector"]["matchLabels"]}}]
    command = [str(word) for word in k8s_container("redis")["command"]]
    assert command[command.index("--port") + 1] == "6379"
    assert command[command.index("--bind") + 1] == "127.0.0.1"  # the containers share the pod's network


def test_redis_loads_the_participants_acl_and_requires_the_evaluators_password() -> None:
    redis = k8s_container("redis")
    command = [str(word) for word in redis["command"]]
    (mount,) = [m for m in redis["volumeMounts"] if m["name"] == "participant-acl"]
    (volume,) = [v for v in pod_spec()["volumes"] if v["name"] == "participant-acl"]
    assert volume["secret"]["items"] == [{"key": "participant-acl.conf", "path": "participant-acl.conf"}]
    assert command[:2] == ["redis-server", f"{mount['mountPath']}/participant-acl.conf"] and mount["readOnly"]
    assert command[command.index("--requirepass") + 1] == "$(ARBITER_REDIS_PASSWORD)"
    assert command[command.index("--save") + 1] == ""
    refs = [e["valueFrom"]["secretKeyRef"] for e in redis["env"] if "valueFrom" in e]
    assert refs == [{"name": "arbiter-t12345", "key": "redis-password"}]


def test_the_k8s_evaluator_command_line_is_accepted_by_the_cli() -> None:
    instructions = parse_dockerfile(EVALUATOR_DOCKERFILE.read_text(encoding="utf-8"))
    (entrypoint,) = [exec_form(args) for args in only(instructions, "ENTRYPOINT")]
    evaluator = k8s_container("evaluator")
    assert "command" not in evaluator  # the image's entrypoint, `arbiter serve`
    args = build_parser().parse_args(entrypoint[1:] + evaluator["args"])
    assert (args.command, args.tests, args.results) == ("serve", "/tests", "/results/T12345")
    env = {e["name"]: e.get("value") for e in evaluator["env"]}
    assert env["ARBITER_REDIS_URL"] == "redis://:$(ARBITER_REDIS_PASSWORD)@127.0.0.1:6379/0"
    assert env["AICROWD_SUBMISSION_ID"] == "T12345"
