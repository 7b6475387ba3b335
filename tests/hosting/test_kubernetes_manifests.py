"""The Kubernetes objects of one hosted evaluation (server/hosting/kubernetes_manifests.py and
kubernetes_plan.py), checked without a cluster: every object is validated against the Kubernetes
API's own schema (kubernetes-validate, strict: an unknown field is an error) for the oldest
version arbiter supports (1.29: native sidecars) and the version of the installed client, read
back through the official client's models, and its settings asserted from the competition's."""

from __future__ import annotations

import math
import re

import kubernetes.client
import kubernetes_validate
import paths
import pytest
import yaml
from kubernetes_objects import client_model

from arbiter.protocol.errors import ConfigError
from arbiter.server.cli.parser import build_parser
from arbiter.server.cli.settings import resolve_spec
from arbiter.server.core.competition import HostingPolicy, load_competition
from arbiter.server.hosting.farm import submission_spec
from arbiter.server.hosting.kubernetes_manifests import (
    AGENT_PASSWORD_KEY,
    COMPETITION_MOUNT,
    EVALUATION_LABEL,
    REDIS_PASSWORD_KEY,
    TESTS_MOUNT,
    Credentials,
    KubernetesOptions,
    evaluation_name,
    job_manifest,
    network_policy_manifest,
    owner_reference,
    secret_manifest,
)
from arbiter.server.hosting.kubernetes_plan import plan_evaluation
from arbiter.server.hosting.queue import JOB_MARGIN_S
from arbiter.server.hosting.submissions import Submission, new_submission_id
from arbiter.server.service.acl import config_line, participant_acl

OLDEST_SUPPORTED = "1.29.0"  # the first release with native sidecars on by default
MODELS = {"Job": "V1Job", "NetworkPolicy": "V1NetworkPolicy", "Secret": "V1Secret"}
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
OPTIONS = KubernetesOptions(
    evaluator_image="registry.example.org/arbiter-evaluator:1", results_claim="arbiter-results", tests_claim="tests"
)
COMPETITION_TOML = """\
format = "flatland"
tests = "/tests/round-2"
[budgets]
overall_s = 1800
[hosting]
cpus = 2.5
memory = "3g"
gpus = 1
redis_memory = "64m"
image = "registry.example.org/team/agent:7"
"""


def client_schema_version() -> str:
    """The Kubernetes release the installed client was generated for (``release-1.N``)."""
    report = kubernetes.client.Configuration().to_debug_report()
    (minor,) = re.findall(r"Version of the API: release-1\.(\d+)", report)
    found = f"1.{minor}.0"
    return found if found in kubernetes_validate.utils.all_versions() else kubernetes_validate.latest_version()


SCHEMA_VERSIONS = sorted({OLDEST_SUPPORTED, client_schema_version()})


def validate(manifest: dict) -> None:
    for version in SCHEMA_VERSIONS:
        kubernetes_validate.validate(manifest, version, strict=True)
    model = client_model(MODELS[manifest["kind"]], manifest)
    # the client's models know every field: nothing is dropped on the way to the API server
    assert kubernetes.client.ApiClient().sanitize_for_serialization(model) == manifest


def cpus(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def size(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    return int(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else int(quantity)


def a_submission(competition: str, *sets: str, debug: bool = False, agent: tuple[str, ...] = ()) -> Submission:
    submission = Submission(
        id=new_submission_id(), competition=competition, participant="alice", agent=list(agent), sets=list(sets),
        debug=debug,
    )  # fmt: skip
    submission.competition_name = submission_spec(submission).name
    return submission


@pytest.fixture
def competition_file(tmp_path) -> str:
    path = tmp_path / "round-2.toml"
    path.write_text(COMPETITION_TOML, encoding="utf-8")
    return str(path)


def every_variant(competition_file: str) -> list[tuple[str, Submission]]:
    """Official and debug, with and without a GPU, a preset and an organiser's file, a format
    without test data, an agent command and none."""
    image = "hosting.image=registry.example.org/team/agent:7"
    return [
        ("official preset", a_submission("flatland-neurips2020", image)),
        ("debug preset", a_submission("flatland-neurips2020", image, debug=True)),
        ("official file with gpu", a_submission(competition_file, agent=("python", "run.py", "--fast"))),
        ("debug file with gpu", a_submission(competition_file, debug=True)),
        ("no test data", a_submission("two-phase-cartpole", image, "hosting.gpus=2")),
    ]


def objects(submission: Submission, *, resume: bool = False) -> tuple[dict, dict, dict]:
    plan = plan_evaluation(submission_spec(submission), submission, OPTIONS, resume=resume)
    owner = owner_reference(plan.name, "6d1f3c9e-5b7a-4c1e-9a0d-2f4b8e6c1a33")
    return (
        job_manifest(plan, OPTIONS, suspended=True),
        network_policy_manifest(plan, owner),
        secret_manifest(plan, Credentials.new(), owner),
    )


def containers(job: dict) -> dict[str, dict]:
    pod = job["spec"]["template"]["spec"]
    return {container["name"]: container for container in pod["initContainers"] + pod["containers"]}


def test_every_object_of_every_variant_is_valid_for_the_api(competition_file: str) -> None:
    for label, submission in every_variant(competition_file):
        for manifest in objects(submission):
            try:
                validate(manifest)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{label}: {manifest['kind']}: {exc}")


def test_a_resume_with_nothing_left_to_play_runs_the_evaluator_alone(competition_file: str) -> None:
    for _, submission in every_variant(competition_file):
        plan = plan_evaluation(submission_spec(submission), submission, OPTIONS, resume=True, agent=False)
        job = job_manifest(plan, OPTIONS, suspended=True)
        validate(job)
        assert set(containers(job)) == {"redis", "evaluator"}
        assert containers(job)["evaluator"]["args"][-2:] == ["--resume", "--no-agent"]


def test_the_schema_check_refuses_what_the_api_server_would() -> None:
    job, _, _ = objects(a_submission("flatland-neurips2020", "hosting.image=a/b:1"))
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsRoot"] = False  # no such field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, OLDEST_SUPPORTED, strict=True)


@pytest.mark.parametrize("debug", [False, True], ids=["official", "debug"])
def test_the_deadline_is_the_overall_budget_plus_the_margin(competition_file: str, debug: bool) -> None:
    submission = a_submission(competition_file, debug=debug)
    spec = submission_spec(submission)
    job, _, _ = objects(submission)
    assert job["spec"]["activeDeadlineSeconds"] == math.ceil(spec.budgets.overall_s + JOB_MARGIN_S)
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["suspend"] is True
    assert job["spec"]["ttlSecondsAfterFinished"] == OPTIONS.ttl_after_finished_s
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_the_agent_gets_the_competitions_resources_and_gpu(competition_file: str) -> None:
    submission = a_submission(competition_file)
    hosting = submission_spec(submission).hosting
    job, _, _ = objects(submission)
    agent = containers(job)["agent"]["resources"]
    assert agent["requests"] == agent["limits"]
    assert cpus(agent["limits"]["cpu"]) == hosting.cpus == 2.5
    assert size(agent["limits"]["memory"]) == hosting.memory_bytes
    assert agent["limits"]["nvidia.com/gpu"] == str(hosting.gpus)
    pod = job["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    redis = containers(job)["redis"]
    assert size(redis["resources"]["limits"]["memory"]) == hosting.redis_memory_bytes
    maxmemory = int(redis["command"][redis["command"].index("--maxmemory") + 1])
    assert 0 < maxmemory < hosting.redis_memory_bytes  # Redis refuses writes before the kernel kills it
    for container in containers(job).values():  # requests = limits everywhere: the pod is Guaranteed
        assert container["resources"]["requests"] == container["resources"]["limits"], container["name"]


def test_without_a_gpu_the_agent_asks_for_none() -> None:
    job, _, _ = objects(a_submission("flatland-neurips2020", "hosting.image=a/b:1"))
    defaults = HostingPolicy()
    limits = containers(job)["agent"]["resources"]["limits"]
    assert limits == {"cpu": "4", "memory": "15Gi"} and cpus(limits["cpu"]) == defaults.cpus
    assert size(limits["memory"]) == defaults.memory_bytes
    assert "tolerations" not in job["spec"]["template"]["spec"]


def test_the_agent_is_confined(competition_file: str) -> None:
    job, _, _ = objects(a_submission(competition_file))
    pod = job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    for key in ("hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace"):
        assert not pod.get(key, False), key
    assert pod["securityContext"]["runAsNonRoot"] is True
    agent = containers(job)["agent"]
    context = agent["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]} and context["seccompProfile"] == {"type": "RuntimeDefault"}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    (scratch,) = agent["volumeMounts"]
    assert scratch["mountPath"] == "/tmp" and set(volumes[scratch["name"]]) == {"name", "emptyDir"}
    secrets_read = [env["valueFrom"]["secretKeyRef"]["key"] for env in agent["env"] if "valueFrom" in env]
    assert secrets_read == [AGENT_PASSWORD_KEY]
    for name, container in containers(job).items():
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}, name
        mounted = {mount["name"] for mount in container.get("volumeMounts", [])}
        if "tests" in mounted:
            assert name == "evaluator"
    tests_mount = next(m for m in containers(job)["evaluator"]["volumeMounts"] if m["name"] == "tests")
    assert tests_mount == {"name": "tests", "mountPath": TESTS_MOUNT, "readOnly": True}
    assert volumes["tests"]["persistentVolumeClaim"] == {"claimName": OPTIONS.tests_claim, "readOnly": True}


def test_the_network_policy_lets_the_pod_reach_nothing() -> None:
    job, policy, _ = objects(a_submission("flatland-neurips2020", "hosting.image=a/b:1"))
    labels = job["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector == {EVALUATION_LABEL: job["metadata"]["name"]} and selector.items() <= labels.items()
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert policy["spec"]["ingress"] == [] and policy["spec"]["egress"] == []
    redis = containers(job)["redis"]
    assert redis["command"][redis["command"].index("--bind") + 1] == "127.0.0.1"  # the pod's loopback only
    assert redis["restartPolicy"] == "Always"  # a native sidecar: up before the evaluator and the agent


def test_the_secret_holds_the_credentials_and_is_owned_by_the_job(competition_file: str) -> None:
    submission = a_submission(competition_file)
    plan = plan_evaluation(submission_spec(submission), submission, OPTIONS, resume=False)
    credentials = Credentials.new()
    owner = owner_reference(plan.name, "uid-1")
    secret = secret_manifest(plan, credentials, owner)
    data = secret["stringData"]
    assert data[REDIS_PASSWORD_KEY] == credentials.redis_password
    assert data[AGENT_PASSWORD_KEY] == credentials.agent_password
    assert data["participant-acl.conf"].strip() == config_line(
        participant_acl(submission.id, credentials.agent_password)
    )
    assert credentials.agent_password not in data["participant-acl.conf"]  # only its hash
    with open(competition_file, encoding="utf-8") as handle:
        assert data["competition.toml"] == handle.read()
    assert secret["immutable"] is True
    assert secret["metadata"]["ownerReferences"] == [owner] and owner["blockOwnerDeletion"] is True
    assert Credentials.new() != credentials


@pytest.mark.parametrize("which", ["preset", "file"])
def test_the_evaluator_evaluates_the_spec_the_worker_resolved(competition_file: str, which: str) -> None:
    competition = "flatland-neurips2020" if which == "preset" else competition_file
    sets = ("hosting.image=a/b:1", "budgets.step_s=2.5") if which == "preset" else ("seed=7",)
    submission = a_submission(competition, *sets, debug=True)
    plan = plan_evaluation(submission_spec(submission), submission, OPTIONS, resume=True)
    args = list(plan.evaluator_args)
    # the file the pod mounts from the Secret is the worker's file
    args = [competition_file if arg == f"{COMPETITION_MOUNT}/round-2.toml" else arg for arg in args]
    parsed = build_parser().parse_args(["serve", *args])
    assert parsed.resume is True and parsed.service_id == submission.id
    assert parsed.private_redis is True  # the pod's Redis is this evaluation's alone
    assert parsed.results == f"/results/{submission.competition_name}/{submission.id}"
    assert resolve_spec(parsed).as_dict() == submission_spec(submission).as_dict()


def test_a_competition_names_its_tests_under_the_claims_mount(competition_file: str) -> None:
    submission = a_submission(competition_file)
    plan = plan_evaluation(submission_spec(submission), submission, OPTIONS, resume=False)
    assert plan.tests == "/tests/round-2"
    outside = a_submission("flatland-neurips2020", "hosting.image=a/b:1", "tests=/srv/hidden")
    with pytest.raises(ConfigError, match="mounted at /tests"):
        plan_evaluation(submission_spec(outside), outside, OPTIONS, resume=False)
    no_claim = KubernetesOptions(evaluator_image="e:1", results_claim="r")
    with pytest.raises(ConfigError, match="--kube-tests-claim"):
        plan_evaluation(submission_spec(submission), submission, no_claim, resume=False)
    no_tests = a_submission("two-phase-cartpole", "hosting.image=a/b:1")
    plan = plan_evaluation(submission_spec(no_tests), no_tests, no_claim, resume=False)
    assert plan.tests is None and "--tests" not in plan.evaluator_args


def test_the_agent_image_is_the_submissions_else_the_competitions() -> None:
    submission = a_submission("flatland-neurips2020", "hosting.image=registry.example.org/default:1")
    spec = submission_spec(submission)
    assert plan_evaluation(spec, submission, OPTIONS, resume=False).agent_image == "registry.example.org/default:1"
    submission.image = "registry.example.org/own:2"
    assert plan_evaluation(spec, submission, OPTIONS, resume=False).agent_image == "registry.example.org/own:2"
    bare = a_submission("flatland-neurips2020")
    with pytest.raises(ConfigError, match=r"no agent image.*\[hosting\] image"):
        plan_evaluation(submission_spec(bare), bare, OPTIONS, resume=False)


def test_names_are_deterministic_dns_labels_and_never_shared() -> None:
    ids = [new_submission_id(), "T12345", "t12345", "sub_1.a", "sub-1-a", "-x-", "a" * 64, "a" * 63 + "b", "Z" * 64]
    names = [evaluation_name(one) for one in ids]
    for submission_id, name in zip(ids, names, strict=True):
        assert evaluation_name(submission_id) == name  # the same every time
        assert len(name) <= 63 and DNS_LABEL.fullmatch(name), name
    assert len(set(names)) == len(ids)
    assert names[0] == f"arbiter-{ids[0]}"  # arbiter's own ids keep their text


@pytest.mark.parametrize(
    ("change", "option"),
    [
        ({"results_claim": "Results"}, "--kube-results-claim"),
        ({"tests_claim": "tests claim"}, "--kube-tests-claim"),
        ({"evaluator_image": " "}, "--kube-evaluator-image"),
        ({"namespace": "a.b"}, "--kube-namespace"),
        ({"runtime_class": "gVisor"}, "--kube-runtime-class"),
    ],
)
def test_bad_options_are_named(change: dict, option: str) -> None:
    settings = {"evaluator_image": "e:1", "results_claim": "results", **change}
    with pytest.raises(ConfigError, match=re.escape(option)):
        KubernetesOptions(**settings).check()


def test_a_cpu_share_below_a_millicore_is_refused() -> None:
    submission = a_submission("flatland-neurips2020", "hosting.image=a/b:1", "hosting.cpus=0.0001")
    plan = plan_evaluation(submission_spec(submission), submission, OPTIONS, resume=False)
    with pytest.raises(ConfigError, match="cpus"):
        job_manifest(plan, OPTIONS, suspended=True)
    assert load_competition("flatland-neurips2020").hosting.cpus == HostingPolicy().cpus


# -- the guide's own manifests ----------------------------------------------------------------------

GUIDE = paths.REPO / "docs" / "hosting-kubernetes.md"
CLUSTER_SOURCE = paths.REPO / "server" / "hosting" / "kubernetes_cluster.py"  # every API call the worker makes
# the client's resource in a method name -> (API group, resource) for RBAC
RESOURCES = {"job": ("batch", "jobs"), "pod": ("", "pods"), "pod_log": ("", "pods/log"), "secret": ("", "secrets"),
             "network_policy": ("networking.k8s.io", "networkpolicies")}  # fmt: skip
VERBS = {"create": "create", "read": "get", "patch": "patch", "delete": "delete", "list": "list"}


def guide_objects() -> list[dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    return [document for block in blocks for document in yaml.safe_load_all(block) if document]


def test_the_guides_manifests_are_valid_for_the_api() -> None:
    found = guide_objects()
    assert {one["kind"] for one in found} >= {"PersistentVolumeClaim", "Role", "RoleBinding", "Deployment"}
    for document in found:
        for version in SCHEMA_VERSIONS:
            kubernetes_validate.validate(document, version, strict=True)


def test_the_guides_role_allows_every_call_the_worker_makes() -> None:
    (role,) = [one for one in guide_objects() if one["kind"] == "Role"]
    allowed = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    calls = set(re.findall(r"\.(create|read|patch|delete|list)_namespaced_(\w+?)\b", CLUSTER_SOURCE.read_text()))
    assert {("create", "job"), ("list", "pod"), ("read", "pod_log"), ("delete", "network_policy")} <= calls
    needed = {(*RESOURCES[resource], VERBS[verb]) for verb, resource in calls}
    assert needed <= allowed, f"the Role lacks {sorted(needed - allowed)}"
    assert ("batch", "jobs/finalizers", "update") in allowed  # blockOwnerDeletion on what a Job owns
    granted = {(group, resource) for group, resource, _ in allowed}
    assert granted - {("batch", "jobs/finalizers")} == {RESOURCES[resource] for _, resource in calls}  # no more
    worker = next(one for one in guide_objects() if one["kind"] == "Deployment")["spec"]["template"]["spec"]
    args = worker["containers"][0]["args"]
    given = dict(zip(args[::2], args[1::2], strict=True))
    assert worker["containers"][0]["command"] == ["arbiter", "worker"] and given["--backend"] == "kubernetes"
    assert worker["serviceAccountName"] == role["metadata"]["name"]
    mounted = {mount["mountPath"]: mount["name"] for mount in worker["containers"][0]["volumeMounts"]}
    claims = {volume["name"]: volume.get("persistentVolumeClaim", {}).get("claimName") for volume in worker["volumes"]}
    assert claims[mounted[given["--results-root"]]] == given["--kube-results-claim"]  # the same storage
