"""The command line end to end: real processes, a real redis-server, the example agents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import paths
import pytest

from arbiter.server.cli.embedded_redis import port_is_free

REPO = str(paths.REPO)
ARBITER = [sys.executable, "-m", "arbiter.server.cli"]


def arbiter(*args: str, timeout_s: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*ARBITER, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def summary_of(results) -> dict:
    return json.loads((results / "summary.json").read_text())


def test_generate_writes_a_flatland_test_folder(tmp_path):
    out = tmp_path / "tests"
    done = arbiter("generate", "--out", str(out), "--preset", "tiny", "--seed", "3")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (out / "Test_0").iterdir()) == ["Level_0.pkl", "Level_1.pkl", "Level_2.pkl"]
    assert (out / "metadata.csv").read_text().startswith("test_id,env_id,n_agents")
    again = arbiter("generate", "--out", str(out), "--preset", "tiny")
    assert again.returncode == 2 and "arbiter: error:" in again.stderr


def test_run_with_the_example_agent(redis_url, service_id, tiny_tests, tmp_path):
    results = tmp_path / "results"
    done = arbiter(
        "run",
        "--tests",
        tiny_tests,
        "--redis-url",
        redis_url,
        "--service-id",
        service_id,
        "--results",
        str(results),
        "--",
        sys.executable,
        "examples/random_agent.py",
    )
    assert done.returncode == 0, done.stderr
    summary = summary_of(results)
    assert summary["state"] == "SUCCESS" and summary["episodes"]["finished"] == 3
    # progress lines while it works, then the table with the scores
    assert "[1/3] Test_0/Level_0.pkl" in done.stderr and "[3/3]" in done.stderr
    assert "time left" in done.stderr and "score so far" in done.stderr
    assert f"primary   (mean normalized return): {summary['score']['primary']:.6f}" in done.stderr
    assert done.stdout.startswith("submitted: score ")  # the agent's own output is passed through
    rescored = subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", "rescore", str(results)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert rescored.returncode == 0 and "matches summary.json" in rescored.stdout


@pytest.mark.alone  # port 6379, which any other test's `arbiter run` takes when it is free
def test_run_with_the_legacy_starter_kit_agent_on_the_embedded_redis(tmp_path, tiny_tests):
    """Unmodified FlatlandRemoteClient defaults: Redis on 127.0.0.1:6379, service id from the env."""
    if not port_is_free("127.0.0.1", 6379):
        pytest.skip("port 6379 is taken by another Redis on this machine; the embedded one needs it here")
    results = tmp_path / "results"
    done = arbiter(
        "run",
        "--tests",
        tiny_tests,
        "--results",
        str(results),
        "--debug",
        "--",
        sys.executable,
        "examples/legacy_starter_kit_agent.py",
    )
    assert done.returncode == 0, done.stderr
    summary = summary_of(results)
    assert summary["state"] == "SUCCESS" and summary["debug"] is True
    assert "[DEBUG]" in done.stderr
    assert port_is_free("127.0.0.1", 6379)  # the embedded redis-server was stopped


def test_run_without_tests_uses_the_generated_debug_set(redis_url, service_id, tmp_path):
    results = tmp_path / "results"
    done = arbiter(
        "run",
        "--redis-url",
        redis_url,
        "--service-id",
        service_id,
        "--results",
        str(results),
        "--",
        sys.executable,
        "examples/random_agent.py",
        env={"ARBITER_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr
    summary = summary_of(results)
    assert summary["episodes"]["total"] == 8 and summary["state"] == "SUCCESS"
    assert any(p.name.startswith("tests-debug-seed42") for p in (tmp_path / "cache").iterdir())


def test_run_reports_a_crashing_agent(redis_url, service_id, tiny_tests, tmp_path):
    results = tmp_path / "results"
    done = arbiter(
        "run",
        "--tests",
        tiny_tests,
        "--redis-url",
        redis_url,
        "--service-id",
        service_id,
        "--results",
        str(results),
        "--",
        sys.executable,
        "-c",
        "import sys; sys.exit(3)",
    )
    assert done.returncode == 1
    assert "the agent exited with status 3" in done.stderr
    summary = summary_of(results)
    assert summary["state"] == "FAILED" and "exited with status 3" in summary["termination_cause"]


def test_run_needs_an_agent_command(tiny_tests):
    done = arbiter("run", "--tests", tiny_tests)
    assert done.returncode == 2 and "no agent command" in done.stderr


def test_serve_with_no_client_ends_after_the_idle_budget(redis_url, service_id, tiny_tests, tmp_path):
    results = tmp_path / "results"
    done = arbiter(
        "serve",
        "--tests",
        tiny_tests,
        "--redis-url",
        redis_url,
        "--service-id",
        service_id,
        "--results",
        str(results),
        "--idle-timeout",
        "0.3",
    )
    assert done.returncode == 1
    summary = summary_of(results)
    assert summary["state"] == "FAILED" and "no client connected" in summary["termination_cause"]
    assert "no score" in done.stderr


def serving(tiny_tests: str, redis_url: str, service_id: str, results, *options: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*ARBITER, "serve", "--tests", tiny_tests, "--redis-url", redis_url, "--service-id", service_id,
         "--results", str(results), "--quiet", *options],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def client_outlived_by_its_evaluation(redis_url: str, service_id: str, results):
    """A RemoteClient that started an episode and is still thinking when the overall budget ends
    its evaluation (its summary written)."""
    from harness import wait_for

    from arbiter.client import RemoteClient

    client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
    client.env_create()
    wait_for(lambda: (results / "summary.json").exists(), what="the overall budget to end the evaluation")
    return client


def test_serve_answers_a_request_that_came_as_its_evaluation_ended(redis_url, service_id, tiny_tests, tmp_path):
    """A request sent just as the evaluation ended by itself (its client read the errors list a
    moment before the ending was posted) reaches a queue the evaluation no longer serves: serve
    answers it with the ending, where flatland's client would wait for a reply for ever, and
    exits once it has."""

    from arbiter.protocol.errors import error_from_payload
    from arbiter.protocol.messages import FLATLAND_RL

    results = tmp_path / "results"
    server = serving(tiny_tests, redis_url, service_id, results, "--overall-timeout", "0.5")
    try:
        client = client_outlived_by_its_evaluation(redis_url, service_id, results)
        channel = client._new_channel()
        late = client._tagged(FLATLAND_RL.ENV_CREATE, {}, channel)  # sent without reading the errors list
        response = client._send_and_await(FLATLAND_RL.ENV_CREATE, late, channel, give_up=time.monotonic() + 5, wait_s=5)
        error = error_from_payload(response["payload"])
        assert type(error).__name__ == "EvaluationError" and "overall" in str(error)
        assert server.wait(timeout=5) == 1, server.stderr.read()  # told: it waits no longer
        assert error.ended == summary_of(results)["state"] == "FAILED"
        client.close()
    finally:
        server.kill()
        server.wait()
        server.stderr.close()


def test_serve_waits_on_no_agent_that_read_its_ending(redis_url, service_id, tiny_tests, tmp_path):
    """The agent learns of the ending from the errors list, at its next request, before sending
    it: serve sees the list read and exits, well within the time it would answer late requests."""

    from arbiter.client import EvaluationError

    results = tmp_path / "results"
    server = serving(tiny_tests, redis_url, service_id, results, "--overall-timeout", "0.5")
    try:
        client = client_outlived_by_its_evaluation(redis_url, service_id, results)
        with pytest.raises(EvaluationError, match="overall"):
            client.env_create()
        assert server.wait(timeout=5) == 1, server.stderr.read()
        client.close()
    finally:
        server.kill()
        server.wait()
        server.stderr.close()


def test_serve_whose_redis_is_out_of_reach_leaves_no_folder_behind(tiny_tests, tmp_path):
    """Nothing was evaluated: the folder it would have written (and the folders above it that it
    would have made) are gone again, so a later serve there starts clean, not as a resume."""
    from arbiter.server.cli.embedded_redis import free_port

    results = tmp_path / "new" / "results"
    done = arbiter("serve", "--tests", tiny_tests, "--redis-url", f"redis://127.0.0.1:{free_port()}/0",
                   "--results", str(results), "--redis-outage-timeout", "0.2")  # fmt: skip
    assert done.returncode != 0 and "unreachable" in done.stderr
    assert not (tmp_path / "new").exists()


def test_run_with_a_redis_that_does_not_answer_says_so_before_anything_starts(tiny_tests, tmp_path):
    """A typo in --redis-url costs seconds, not the minute an outage is ridden out for."""
    from arbiter.server.cli.embedded_redis import free_port

    results = tmp_path / "r"
    url = f"redis://127.0.0.1:{free_port()}/0"
    done = arbiter("run", "--tests", tiny_tests, "--redis-url", url, "--results", str(results), "--",
                   sys.executable, "examples/random_agent.py", timeout_s=30)  # fmt: skip
    assert done.returncode == 2
    assert f"cannot reach Redis at {url}" in done.stderr and "is the URL" in done.stderr
    assert not results.exists()


def test_serve_reads_flatland_environment_variables(redis_url, service_id, tiny_tests, tmp_path):
    results = tmp_path / "results"
    done = arbiter(
        "serve",
        "--redis-url",
        redis_url,
        "--results",
        str(results),
        "--idle-timeout",
        "0.2",
        env={
            "AICROWD_TESTS_FOLDER": tiny_tests,
            "AICROWD_SUBMISSION_ID": service_id,
            "FLATLAND_PER_STEP_TIMEOUT": "2.5",
            "FLATLAND_INITIAL_PLANNING_TIMEOUT": "7",
        },
    )
    summary = summary_of(results)
    assert done.returncode == 1
    assert summary["service_id"] == service_id
    assert summary["budgets"]["step_s"] == 2.5 and summary["budgets"]["planning_s"] == 7


def test_bad_settings_are_clear_errors(tiny_tests, tmp_path):
    assert "must be positive" in arbiter("serve", "--tests", tiny_tests, "--step-timeout", "0").stderr
    missing = arbiter("serve", "--tests", str(tmp_path / "nope"), "--redis-url", "redis://127.0.0.1:1/0")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    unknown = arbiter("serve", "--tests", tiny_tests, "--competition", "no-such-thing")
    assert unknown.returncode == 2 and "unknown competition" in unknown.stderr
    bad_id = arbiter("serve", "--tests", tiny_tests, "--service-id", "a::b")
    assert bad_id.returncode == 2 and "invalid service id" in bad_id.stderr


def test_serve_stopped_by_sigterm_leaves_an_interrupted_summary(redis_url, service_id, tiny_tests, tmp_path):
    import signal
    import time

    results = tmp_path / "results"
    serve = subprocess.Popen(
        [
            *ARBITER,
            "serve",
            "--tests",
            tiny_tests,
            "--redis-url",
            redis_url,
            "--service-id",
            service_id,
            "--results",
            str(results),
        ],
        cwd=REPO,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "waiting for the agent" in serve.stderr.readline() + serve.stderr.readline()
        sent = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(timeout=10)
        assert code == 130, f"exit status {code}; serve's stderr:\n{serve.stderr.read()}"
        assert time.monotonic() - sent < 10
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    summary = summary_of(results)
    assert summary["state"] == "INTERRUPTED" and summary["termination_cause"] == "stopped by SIGTERM"
    assert summary["score"]["primary"] is None


def test_a_native_crash_of_serve_prints_where_each_thread_was(redis_url, redis_conn, service_id, tiny_tests, tmp_path):
    import ctypes
    import signal

    from harness import wait_for

    from arbiter.protocol import keys

    env = {name: value for name, value in os.environ.items() if name != "PYTHONFAULTHANDLER"}
    serve = subprocess.Popen(
        [*ARBITER, "serve", "--tests", tiny_tests, "--redis-url", redis_url, "--service-id", service_id,
         "--results", str(tmp_path / "results")],
        cwd=REPO, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert "waiting for the agent" in serve.stderr.readline() + serve.stderr.readline()
        # The events thread is in its loop once it has published the evaluation's first event; a
        # busy machine may not have run it that far when the evaluator says it waits.
        wait_for(lambda: redis_conn.xlen(keys.events_key(service_id)) == 1, what="the started event in the stream")
        # A fault raises SIGSEGV in the thread that faulted: here the evaluator's own (a kill of
        # the process would land in any of its threads, numpy's workers included).
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.tgkill(serve.pid, serve.pid, signal.SIGSEGV) == 0, os.strerror(ctypes.get_errno())
        assert serve.wait(timeout=10) == -signal.SIGSEGV
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    report = serve.stderr.read()
    assert "Fatal Python error: Segmentation fault" in report
    # Every thread's stack, the evaluator's own (wherever it was in serving) marked as current.
    assert "Current thread" in report
    current = report.split("Current thread", 1)[1].split("\n\n", 1)[0]
    assert "(most recent call first)" in current and "in cmd_serve" in current
    assert "in _publish_loop" in report  # the events thread's, beside it


def test_generate_writes_a_synthetic_metalc_meta_dataset(tmp_path):
    from arbiter.server.formats.metalc.data import load_meta_dataset
    from arbiter.server.formats.metalc.generate import GeneratorSettings, synthetic_files

    out = tmp_path / "meta"
    done = arbiter("generate", "--format", "metalc", "--out", str(out), "--datasets", "8", "--algorithms", "3",
                   "--seed", "5")  # fmt: skip
    assert done.returncode == 0, done.stderr
    meta = load_meta_dataset(str(out))
    assert len(meta.datasets) == 8 and len(meta.algorithms) == 3
    expected = synthetic_files(GeneratorSettings(datasets=8, algorithms=3, seed=5))
    written = {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()}
    assert written == expected
    too_few = arbiter("generate", "--format", "metalc", "--out", str(tmp_path / "small"), "--datasets", "4")
    assert too_few.returncode == 2 and "at least 6 datasets" in too_few.stderr


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as handle:
        return [int(child) for child in handle.read().split()]


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_a_run_killed_with_sigkill_takes_its_redis_server_and_its_agent_along(tmp_path):
    """No orphaned redis-server holding the port the next run wants, and no agent retrying a Redis
    that is gone: the kernel ends both with the run."""
    import signal
    import time

    # TMPDIR: the folder of its Redis, which a killed run cannot remove, goes with the test's.
    run = subprocess.Popen([*ARBITER, "run", "--competition", "two-phase-cartpole", "--results", str(tmp_path / "r"),
                            "--quiet", "--", sys.executable, "-c", "import time; time.sleep(120)"],
                           cwd=str(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env={**os.environ, "TMPDIR": str(tmp_path)})  # fmt: skip
    agent = server = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (server is None or agent is None):
            for child in _children(run.pid):
                line = _command_line(child)
                if "redis-server" in line or "setpriv" in line:
                    server = child
                elif "time.sleep(120)" in line:
                    agent = child
            time.sleep(0.05)
        assert server is not None and agent is not None, "the run did not start its redis-server and agent"
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _running(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(server), "the redis-server outlived the run killed with SIGKILL"
        while _running(agent) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(agent), "the agent outlived the run killed with SIGKILL"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if agent is not None:
            try:
                os.killpg(agent, signal.SIGKILL)  # the agent's own group: a killed run leaves it to its fate
            except ProcessLookupError:
                pass


SLOW_AGENT = """
import time
from arbiter.client import RemoteClient, TimeoutException
from arbiter.protocol.errors import EvaluationError

client = RemoteClient()
try:
    while True:
        observation, info = client.env_create()
        if not observation:
            break
        try:
            while True:
                time.sleep(0.5)  # over the step budget of 0.3 s, every step
                _, _, done, _ = client.env_step({handle: 2 for handle in client.env.get_agent_handles()})
                if done["__all__"]:
                    break
        except TimeoutException:
            pass
except EvaluationError as exc:
    print(f"told: {exc}", flush=True)
"""


def test_an_agent_still_playing_when_the_evaluation_ends_is_told_at_its_next_request(tiny_tests, tmp_path):
    """Two successive timeouts end the evaluation while the agent waits; its next env_create gets
    the ending at once (not silence until its reply timeout), so it can exit by itself."""
    (tmp_path / "slow.py").write_text(SLOW_AGENT)
    done = arbiter("run", "--tests", tiny_tests, "--step-timeout", "0.3", "--max-successive-timeouts", "2",
                   "--results", str(tmp_path / "r"), "--", sys.executable, str(tmp_path / "slow.py"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "told: the evaluation has ended (SUCCESS): 2 successive timeouts" in done.stdout
    assert "did not exit" not in done.stderr
    assert summary_of(tmp_path / "r")["state"] == "SUCCESS"
