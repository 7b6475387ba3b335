"""The handshake names the format: a client of another format is refused with one clear error
naming both, and the evaluation ends FAILED with that cause, for every pair of client and format
that can meet (arbiter's RemoteClient, RemoteEnv and runners, flatland-rl's FlatlandRemoteClient;
the Flatland, two-phase, DIAMBRA and MetaLC formats)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import paths
import pytest
from harness import finish, running_service

from arbiter.protocol.errors import WrongFormat
from arbiter.server.core.competition import load_competition

REPO = str(paths.REPO)

# competition name and settings per format, small
COMPETITIONS = {
    "flatland": ("flatland-neurips2020", []),
    "two-phase": ("two-phase-cartpole", ["num_episodes=1", "phase2.num_runs=1"]),
    "diambra": ("diambra", ["frame_shape=[32, 32, 1]"]),
    "metalc": ("metalc-wcci2022", []),
}
# client → the formats it plays
CLIENT_FORMATS = {
    "RemoteClient": {"flatland"},
    "FlatlandRemoteClient": {"flatland"},
    "RemoteEnv": {"two-phase", "diambra", "metalc"},
    "reinforcelab": {"two-phase"},
    "metalc runner": {"metalc"},
}
MISMATCHES = [(client, fmt) for client, plays in CLIENT_FORMATS.items() for fmt in COMPETITIONS if fmt not in plays]


@pytest.fixture(scope="module")
def metalc_data(tmp_path_factory: pytest.TempPathFactory) -> str:
    from arbiter.server.formats.metalc.generate import GeneratorSettings, write_meta_dataset

    folder = tmp_path_factory.mktemp("metalc") / "data"
    write_meta_dataset(str(folder), GeneratorSettings(datasets=6, algorithms=3, seed=1))
    return str(folder)


def connect(client: str, redis_server: Any, service_id: str, tiny_tests: str) -> Callable[[], str]:
    """A callable that starts ``client`` against the evaluation and returns what it said when it
    was refused."""
    url = redis_server.url

    def in_process(make: Callable[[], Any]) -> Callable[[], str]:
        def run() -> str:
            with pytest.raises(Exception) as refused:
                make()
            return f"{type(refused.value).__name__}: {refused.value}"

        return run

    def as_process(*command: str) -> Callable[[], str]:
        def run() -> str:
            environment = {**os.environ, "ARBITER_REDIS_URL": url, "AICROWD_SUBMISSION_ID": service_id}
            done = subprocess.run([sys.executable, *command], cwd=REPO, env=environment, capture_output=True,
                                  text=True, timeout=60)  # fmt: skip
            assert done.returncode != 0
            said = (done.stdout + done.stderr).strip().splitlines()
            assert len(said) <= 2, "one clear error, not a traceback:\n" + "\n".join(said)
            return said[-1]

        return run

    if client == "RemoteClient":
        from arbiter.client import RemoteClient

        return in_process(lambda: RemoteClient(redis_url=url, service_id=service_id, reply_timeout_s=10))
    if client == "RemoteEnv":
        from arbiter.client import RemoteEnv

        return in_process(lambda: RemoteEnv(redis_url=url, service_id=service_id, reply_timeout_s=10))
    if client == "FlatlandRemoteClient":
        from flatland.evaluators.client import FlatlandRemoteClient

        return in_process(
            lambda: FlatlandRemoteClient(
                test_env_folder=tiny_tests, flatland_rl_service_id=service_id, remote_port=redis_server.port
            )
        )
    if client == "reinforcelab":
        return as_process("-m", "arbiter.client.reinforcelab", os.path.join(REPO, "examples", "reinforcelab_cartpole"))
    return as_process("-m", "arbiter.client.metalc", os.path.join(REPO, "examples", "metalc_agent"))


@pytest.mark.parametrize("client, fmt", MISMATCHES)
def test_a_client_of_another_format_is_refused_and_the_evaluation_fails(
    client, fmt, redis_server, service_id, tiny_tests, metalc_data, tmp_path
):
    name, settings = COMPETITIONS[fmt]
    competition = load_competition(name, settings)
    tests = {"flatland": tiny_tests, "metalc": metalc_data}.get(fmt)
    results = str(tmp_path / "results")
    with running_service(competition, tests=tests, results=results, redis_url=redis_server.url,
                         service_id=service_id) as (_, outcome):  # fmt: skip
        said = connect(client, redis_server, service_id, tiny_tests)()
        summary = finish(outcome)
    assert summary["state"] == "FAILED"
    cause = summary["termination_cause"]
    assert cause.startswith("wrong client:") and f"a {fmt} evaluation" in cause, cause
    if client != "FlatlandRemoteClient":  # flatland's own client shows the reply its own way
        assert "WrongFormat" in said and f"a {fmt} evaluation" in said, said
    assert summary["score"]["primary"] is None


def test_the_right_client_is_not_refused(redis_server, service_id, tmp_path):
    """The check is not a refusal of everything: RemoteEnv on DIAMBRA and two-phase handshakes."""
    from arbiter.client import RemoteEnv

    for name, settings in (COMPETITIONS["diambra"], COMPETITIONS["two-phase"]):
        sid = f"{service_id}-{name}"
        competition = load_competition(name, settings)
        with running_service(competition, tests=None, results=str(tmp_path / name), redis_url=redis_server.url,
                             service_id=sid) as (service, _):  # fmt: skip
            env = RemoteEnv(redis_url=redis_server.url, service_id=sid, reply_timeout_s=10)
            assert env.server_info["format"] == competition.format
            env.close()
            assert not service.evaluation.finished


def test_wrong_format_is_an_arbiter_error():
    from arbiter.protocol.errors import ArbiterError, error_from_payload

    error = error_from_payload({"code": "WRONG_FORMAT", "message": "x"})
    assert isinstance(error, WrongFormat) and isinstance(error, ArbiterError)
