"""The podman backend (server/hosting/containers.py): the arguments a container is made of, and
real podman workers evaluating real submissions: the same deterministic agents score in their
containers exactly as they do as local processes, and a worker lost or stopped at once in the
middle of an evaluation leaves no container behind (F20)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import paths
import pytest
import redis
from containers import (
    ROOTFS_IMAGE,
    RUNTIME,
    containers_of,
    reachable_mounts,
    remove_containers_of,
    worker_options,
)
from harness import in_forked_child, read_episodes, read_summary, wait_for
from hosting_farm import REPO, Workers, competition_file, kill_tree, seeded_agent, wait_lines, wait_state
from rq.suspension import resume, suspend

from arbiter.server.core.competition import HostingPolicy
from arbiter.server.hosting import job
from arbiter.server.hosting.containers import ContainerBackend, ContainerSpec, run_arguments
from arbiter.server.hosting.farm import submit
from arbiter.server.hosting.quotas import QuotaExceeded
from arbiter.server.hosting.submissions import (
    AGENT_FAULT,
    FAILED,
    FINISHED,
    INFRASTRUCTURE_FAULT,
    RUNNING,
    SubmissionStore,
)

CARTPOLE_AGENT = [sys.executable, "-m", "arbiter.client.reinforcelab", str(paths.EXAMPLES / "reinforcelab_cartpole")]
TWO_PHASE = ["num_episodes=2", "seed=7"]  # a fixed seed: both backends play the same episodes


def container(engine: str, **changes) -> ContainerSpec:
    fields = dict(
        engine=engine, name="arbiter-sub-1-2", submission_id="sub-1", attempt=2, image="registry.example/agent:3",
        command=["python", "run.py"], hosting=HostingPolicy(cpus=2.5, memory="3g", pids=256),
        socket_folder="/tmp/r/socket", workdir="/srv/agents/alice", environment=["ARBITER_REDIS_URL"],
    )  # fmt: skip
    fields.update(changes)
    return ContainerSpec(**fields)


def option_values(arguments: list[str], option: str) -> list[str]:
    return [arguments[index + 1] for index, given in enumerate(arguments) if given == option]


@pytest.mark.parametrize("engine", ["podman", "docker"])
def test_a_container_is_fenced_in_and_limited_by_the_competition(engine: str) -> None:
    arguments = run_arguments(container(engine), runtime="runc")
    assert arguments[0] == "run" and arguments[-3:] == ["registry.example/agent:3", "python", "run.py"]
    assert option_values(arguments, "--network") == ["none"] and "--read-only" in arguments
    assert option_values(arguments, "--user") == ["10001:10001"]
    assert option_values(arguments, "--cap-drop") == ["all"]
    assert option_values(arguments, "--security-opt") == ["no-new-privileges"]
    assert option_values(arguments, "--cpus") == ["2.5"] and option_values(arguments, "--pids-limit") == ["256"]
    assert option_values(arguments, "--memory") == option_values(arguments, "--memory-swap") == [str(3 << 30)]
    assert option_values(arguments, "--name") == ["arbiter-sub-1-2"]
    assert option_values(arguments, "--label") == ["arbiter.submission=sub-1", "arbiter.attempt=2"]
    assert option_values(arguments, "--env") == ["HOME=/tmp", "ARBITER_SOLE_TENANT=/tmp", "ARBITER_REDIS_URL"], (
        "no value: no secret in argv"
    )
    mounts = option_values(arguments, "--mount")
    assert "type=bind,source=/tmp/r/socket,destination=/run/arbiter,readonly" in mounts
    assert "type=bind,source=/srv/agents/alice,destination=/submission,readonly" in mounts
    assert [mount for mount in mounts if "destination=/tmp," in mount][0].startswith("type=tmpfs,")
    assert not option_values(arguments, "--gpus") and not option_values(arguments, "--device")
    if engine == "podman":
        assert "--read-only-tmpfs=false" in arguments and "--runtime" not in arguments  # podman's is global
    else:
        assert option_values(arguments, "--runtime") == ["runc"]


def test_gpus_are_granted_by_cdi_on_podman_and_by_count_on_docker() -> None:
    two = HostingPolicy(gpus=2)
    podman = run_arguments(container("podman", hosting=two))
    assert option_values(podman, "--device") == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert option_values(run_arguments(container("docker", hosting=two)), "--gpus") == ["2"]


def test_the_machine_s_own_files_are_a_podman_rootfs_with_the_results_and_tests_hidden() -> None:
    hidden = ["/srv/tests", "/srv/results"]
    arguments = run_arguments(container("podman", image=ROOTFS_IMAGE, hidden_folders=hidden))
    assert arguments[-4:] == ["--rootfs", "/:O", "python", "run.py"]
    for folder in hidden:
        (mount,) = [mount for mount in option_values(arguments, "--mount") if f"destination={folder}," in mount]
        assert mount.startswith("type=tmpfs,") and mount.endswith(",notmpcopyup")


@pytest.mark.parametrize(
    ("engine", "image", "message"),
    [
        ("podman", None, "neither the submission .* nor the competition .* names an image"),
        ("docker", ROOTFS_IMAGE, "needs the podman backend"),
    ],
)
def test_a_submission_with_no_image_it_can_run_fails_as_the_agent_s_fault(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path, engine, image, message
) -> None:
    submission = submit(redis_conn, competition=competition_file(tmp_path, tiny_tests), participant="alice",
                        agent=seeded_agent(), image=image)  # fmt: skip

    def evaluate() -> str:
        job.configure(job.WorkerSettings(redis_url, str(tmp_path / "results"), ContainerBackend(engine)))
        return job.evaluate_submission(submission.id)

    in_forked_child(evaluate)
    found = SubmissionStore(redis_conn).get(submission.id)
    assert found.state == FAILED and found.fault == AGENT_FAULT
    assert found.cause.startswith("cannot start the agent") and re.search(message, found.cause)


UNPULLABLE = "localhost:1/arbiter-no-such-agent:1"  # a registry that refuses every connection


@pytest.mark.parametrize(
    ("engine", "image", "hosting", "fault", "cause"),
    [
        ("podman", UNPULLABLE, "", AGENT_FAULT, f"cannot start the agent: its image '{UNPULLABLE}' cannot be pulled: "),
        ("podman", None, f'image = "{UNPULLABLE}"', INFRASTRUCTURE_FAULT, f"[hosting] image '{UNPULLABLE}' cannot be "),
        (
            "docker",
            None,
            f'image = "{ROOTFS_IMAGE}"',
            INFRASTRUCTURE_FAULT,
            "[hosting] image 'rootfs:/' (the machine's",
        ),
    ],
)
def test_an_image_that_cannot_run_is_the_fault_of_whoever_named_it(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path, podman_env, engine, image, hosting, fault, cause
) -> None:
    """A submission's own image that cannot be pulled uses up one of its participant's daily
    submissions; the competition's ([hosting] image, the organiser's) fails it as the farm's
    fault, which the participant's quota does not count."""
    competition = competition_file(tmp_path, tiny_tests, hosting=f"daily_submissions = 1\n{hosting}")
    submission = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(), image=image)

    def evaluate() -> str:
        job.configure(job.WorkerSettings(redis_url, str(tmp_path / "results"), ContainerBackend(engine)))
        return job.evaluate_submission(submission.id)

    in_forked_child(evaluate)
    found = SubmissionStore(redis_conn).get(submission.id)
    assert found.state == FAILED and found.fault == fault and found.cause.startswith(cause), found.cause
    if fault == AGENT_FAULT:
        with pytest.raises(QuotaExceeded):
            submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(), image=image)
    else:
        submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(), image=image)


@pytest.mark.timeout(90)
def test_an_agent_that_exits_with_the_engine_s_failure_status_is_at_fault_itself(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path, podman_env
) -> None:
    """podman exits with 125 when it cannot run a container, the farm's fault, which uses up no
    daily submission; an agent whose own process exits with 125 gets no free try from it."""
    competition = competition_file(tmp_path, tiny_tests, hosting="daily_submissions = 2")
    own = submit(redis_conn, competition=competition, participant="alice", agent=["sh", "-c", "exit 125"],
                 image=ROOTFS_IMAGE)  # fmt: skip
    unrunnable = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(),
                        image=ROOTFS_IMAGE)  # fmt: skip
    shown = [option.removeprefix("--container-option=") for option in reachable_mounts(tmp_path)]
    missing = f"--mount=type=bind,source={tmp_path / 'no-such-folder'},destination=/missing"
    for submission, options in ((own, shown), (unrunnable, [*shown, missing])):

        def evaluate(submission=submission, options=options) -> str:
            backend = ContainerBackend("podman", runtime=RUNTIME, options=options)
            job.configure(job.WorkerSettings(redis_url, str(tmp_path / "results"), backend))
            return job.evaluate_submission(submission.id)

        in_forked_child(evaluate)
    store = SubmissionStore(redis_conn)
    found = store.get(own.id)
    assert found.state == FAILED and found.fault == AGENT_FAULT, (found.fault, found.cause)
    assert found.cause.startswith("the agent process exited with status 125 before submitting"), found.cause
    found = store.get(unrunnable.id)
    assert found.state == FAILED and found.fault == INFRASTRUCTURE_FAULT, (found.fault, found.cause)
    assert found.cause.startswith("internal error: podman could not run the agent's container"), found.cause
    submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(), image=ROOTFS_IMAGE)
    with pytest.raises(QuotaExceeded):  # the agent's 125 counted, the engine's did not
        submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(), image=ROOTFS_IMAGE)
    assert containers_of(own.id, podman_env) == containers_of(unrunnable.id, podman_env) == []


def burst(redis_url: str, results_root: Path, log: Path, *options: str) -> None:
    with open(log, "w") as output:
        done = subprocess.run(
            [sys.executable, "-m", "arbiter.server.cli", "worker", "--redis-url", redis_url,
             "--results-root", str(results_root), "--burst", *options],
            cwd=REPO, stdout=output, stderr=subprocess.STDOUT, timeout=100,
        )  # fmt: skip
    assert done.returncode == 0, log.read_text()[-3000:]


@pytest.mark.timeout(150)
def test_agents_score_in_their_containers_as_they_do_as_local_processes(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path, podman_env
) -> None:
    flatland = competition_file(tmp_path, tiny_tests)
    scored: dict[str, dict[str, object]] = {}
    for backend, options in (("podman", worker_options(tmp_path)), ("local", [])):
        ids = {
            "flatland": submit(redis_conn, competition=flatland, participant=backend, agent=seeded_agent(),
                               image=ROOTFS_IMAGE).id,
            "two-phase": submit(redis_conn, competition="two-phase-cartpole", participant=backend, phase=1,
                                sets=TWO_PHASE, agent=CARTPOLE_AGENT, image=ROOTFS_IMAGE).id,
        }  # fmt: skip
        burst(redis_url, tmp_path / backend, tmp_path / f"{backend}.log", *options)
        store = SubmissionStore(redis_conn)
        for name, submission_id in ids.items():
            found = store.get(submission_id)
            assert found.state == FINISHED, (backend, name, found.cause)
            episodes = [{key: record.get(key) for key in ("env", "seed", "return")} for record in
                        read_episodes(found.results)]  # fmt: skip
            scored[f"{backend} {name}"] = {"score": found.score, "episodes": episodes}
            assert containers_of(submission_id, podman_env) == []
    assert scored["podman flatland"] == scored["local flatland"] and scored["podman flatland"]["score"] is not None
    assert scored["podman two-phase"] == scored["local two-phase"] and scored["podman two-phase"]["score"] == 500.0
    listed = subprocess.run([sys.executable, "-m", "arbiter.server.cli", "submissions", "--redis-url", redis_url],
                            cwd=REPO, capture_output=True, text=True, timeout=30)  # fmt: skip
    assert listed.stdout.count(ROOTFS_IMAGE) == 4, "each submission's image is listed"


@pytest.mark.timeout(120)
def test_a_worker_lost_mid_evaluation_leaves_no_container_once_another_finishes(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path, podman_env
) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    submission = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(0.01),
                        image=ROOTFS_IMAGE)  # fmt: skip
    workers = Workers(redis_url, str(tmp_path / "results"))
    try:
        first = workers.start(*worker_options(tmp_path / "first"))
        store = SubmissionStore(redis_conn)
        running = wait_state(store, submission.id, RUNNING, timeout_s=30)
        wait_lines(os.path.join(running.results, "episodes.jsonl"), 1)
        assert containers_of(submission.id, podman_env) == [f"arbiter-{submission.id}-1"]
        kill_tree(first.pid)  # the worker, its work-horse and the engine's client: not the container
        assert containers_of(submission.id, podman_env) == [f"arbiter-{submission.id}-1"], "left by the lost worker"
        workers.start(*worker_options(tmp_path / "second"))
        done = wait_state(store, submission.id, FINISHED, FAILED, timeout_s=60)
        assert done.state == FINISHED and done.attempts == 2, done.cause
        assert read_summary(done.results)["episodes"]["finished"] == 3
        wait_for(lambda: containers_of(submission.id, podman_env) == [], timeout_s=15, what="no container left")
    finally:
        workers.stop_all()
        remove_containers_of([submission.id], podman_env)


def slow_in_a_container(redis_conn: redis.Redis, tiny_tests: str, tmp_path: Path):
    """A submission whose agent plays slowly in a container of the machine's own files."""
    competition = competition_file(tmp_path, tiny_tests)
    return submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(0.05),
                  image=ROOTFS_IMAGE)  # fmt: skip


def its_container_running(redis_conn: redis.Redis, submission, podman_env):
    """The submission's record once a worker runs it and its agent's container is up."""
    running = wait_state(SubmissionStore(redis_conn), submission.id, RUNNING, timeout_s=30)
    wait_for(lambda: containers_of(submission.id, podman_env), what="the agent's container")
    return running


@pytest.mark.timeout(60)
def test_a_worker_stopped_at_once_takes_the_container_with_it(
    redis_conn: redis.Redis, redis_url, tiny_tests, tmp_path, podman_env
) -> None:
    submission = slow_in_a_container(redis_conn, tiny_tests, tmp_path)
    workers = Workers(redis_url, str(tmp_path / "results"))
    try:
        worker = workers.start(*worker_options(tmp_path))
        running = its_container_running(redis_conn, submission, podman_env)
        # RQ's cold shutdown: a second SIGTERM, a second or more after the first one it noted.
        worker.send_signal(signal.SIGTERM)
        wait_for(lambda: redis_conn.hget(f"rq:worker:{running.worker}", "shutdown_requested_date"), what="noted")
        noted = time.monotonic()
        wait_for(lambda: time.monotonic() - noted > 1.2, what="RQ's window for a repeated signal")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=20) is not None
        # the worker's log is read only on a failure (the message is evaluated then alone)
        assert containers_of(submission.id, podman_env) == [], (
            f"removed with the work-horse it belonged to; the worker said:\n{workers.log_of(worker)}"
        )
    finally:
        workers.stop_all()
        remove_containers_of([submission.id], podman_env)


def children_of(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as handle:
            found += [int(child) for child in handle.read().split()]
    return found


@pytest.mark.timeout(90)
def test_a_work_horse_killed_outright_takes_its_container_with_it(
    redis_conn: redis.Redis, redis_url, tiny_tests, tmp_path, podman_env
) -> None:
    """The kernel's out-of-memory killer ends a work-horse alone, its worker alive: the agent's
    container is no process of the horse's, and its worker removes it before the submission is
    retried, whose next attempt may run on another machine (here none runs: the queue is
    suspended, as RQ suspends it)."""
    submission = slow_in_a_container(redis_conn, tiny_tests, tmp_path)
    workers = Workers(redis_url, str(tmp_path / "results"))
    try:
        worker = workers.start(*worker_options(tmp_path))
        store = SubmissionStore(redis_conn)
        its_container_running(redis_conn, submission, podman_env)
        suspend(redis_conn)
        (horse,) = children_of(worker.pid)
        os.kill(horse, signal.SIGKILL)
        wait_for(lambda: containers_of(submission.id, podman_env) == [], timeout_s=20, what="the container removed")
        assert store.get(submission.id).attempts == 1 and worker.poll() is None
    finally:
        resume(redis_conn)
        workers.stop_all()
        remove_containers_of([submission.id], podman_env)


def test_container_options_belong_to_container_workers_and_an_image_must_be_one(
    redis_url, redis_conn, tmp_path
) -> None:
    worker = subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", "worker", "--redis-url", redis_url, "--results-root",
         str(tmp_path), "--container-runtime", "runc"],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert worker.returncode == 2 and "--container-runtime is for --backend podman or docker" in worker.stderr
    submitted = subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", "submit", "--redis-url", redis_url, "--competition",
         "two-phase-cartpole", "--participant", "alice", "--image=--volume=/:/host", "--", "python", "run.py"],
        cwd=REPO, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert submitted.returncode == 2 and "is not an image name" in submitted.stderr
    assert redis_conn.keys("*") == [], "refused: nothing written"


def test_only_what_other_users_can_reach_needs_hiding_on_the_machines_own_files(tmp_path) -> None:
    import tempfile

    from arbiter.server.hosting.containers import reachable_by_others

    open_folder = Path(tempfile.mkdtemp(prefix="arbiter-open-", dir="/tmp"))
    try:
        open_folder.chmod(0o755)
        (open_folder / "tests").mkdir(mode=0o755)
        assert reachable_by_others(str(open_folder / "tests"))
        open_folder.chmod(0o700)  # a folder on the way closed to others: the agent's user stops there
        assert not reachable_by_others(str(open_folder / "tests"))
    finally:
        open_folder.chmod(0o755)
        (open_folder / "tests").rmdir()
        open_folder.rmdir()
