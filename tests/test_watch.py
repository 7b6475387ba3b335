"""`arbiter watch` as a real process, following a real evaluation through a real redis-server."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time

import pytest
from harness import finish, play_episode, running_service, spec, wait_for

from arbiter.client import RemoteClient
from arbiter.server.embedded_redis import free_port
from arbiter.server.watch import WatchError, follow

WATCH = [sys.executable, "-m", "arbiter.server.cli", "watch"]


def start_watch(redis_url: str, service_id: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*WATCH, "--redis-url", redis_url, "--service-id", service_id, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def collect_lines(stream) -> list[str]:
    """The lines a process prints, gathered by a thread as they come."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(stream.readline, "")), daemon=True).start()
    return lines


def test_watch_follows_a_live_evaluation_to_the_end(redis_url, service_id, tiny_tests, tmp_path):
    with running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        watcher = start_watch(redis_url, service_id, "--timeout", "20")
        try:
            lines = collect_lines(watcher.stdout)
            # The watcher is following before the agent plays a single step.
            wait_for(lambda: any("budgets:" in line for line in lines), what="the watcher's first lines")
            assert not any("[1/3]" in line for line in lines)
            client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
            for episode in range(3):
                assert client.env_create()[0]
                play_episode(client, episode)
                wait_for(lambda n=episode + 1: any(f"[{n}/3]" in line for line in lines), what=f"episode {episode}")
            client.submit()
            summary = finish(outcome)
            assert watcher.wait(timeout=20) == 0, watcher.stderr.read()
        finally:
            if watcher.poll() is None:
                watcher.kill()
                watcher.wait()
    text = "".join(lines)
    assert f"evaluation {service_id}: 3 episodes" in text
    assert "[3/3] Test_0/Level_2.pkl" in text and "score so far" in text
    assert "state: SUCCESS - all 3 episodes evaluated" in text
    assert f"primary   (mean normalized return): {summary['score']['primary']:.6f}" in text


@pytest.mark.parametrize("ending", ["FAILED", "INTERRUPTED"])
def test_a_late_watcher_sees_the_history_and_exits_with_the_state(ending, redis_url, service_id, tiny_tests, tmp_path):
    with running_service(
        spec(idle_s=0.2), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (service, outcome):
        if ending == "INTERRUPTED":
            service.request_stop("stopped by the test")
        assert finish(outcome)["state"] == ending  # no client: FAILED when the idle budget passes
    done = subprocess.run(
        [*WATCH, "--redis-url", redis_url, "--service-id", service_id, "--timeout", "10"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == {"FAILED": 1, "INTERRUPTED": 130}[ending], done.stderr
    assert f"evaluation {service_id}: 3 episodes" in done.stdout
    assert f"state: {ending} - " in done.stdout and "no score" in done.stdout


def test_watch_gives_up_after_its_timeout_with_no_event(redis_url, service_id):
    started = time.monotonic()
    done = subprocess.run(
        [*WATCH, "--redis-url", redis_url, "--service-id", service_id, "--timeout", "0.5"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert f"arbiter: error: no event from evaluation '{service_id}' for 0.5 s" in done.stderr
    assert time.monotonic() - started < 10


def test_watch_reports_an_unreachable_redis(service_id):
    done = subprocess.run(
        [*WATCH, "--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--service-id", service_id],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "arbiter: error: cannot reach Redis" in done.stderr


def test_new_only_skips_the_history(redis_url, service_id, tiny_tests, tmp_path):
    with running_service(
        spec(idle_s=0.2), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        finish(outcome)
    out = io.StringIO()
    assert follow(redis_url, service_id, timeout_s=5, out=out) == "FAILED"
    assert "state: FAILED" in out.getvalue()
    out = io.StringIO()
    with pytest.raises(WatchError, match="no event"):
        follow(redis_url, service_id, timeout_s=0.3, from_start=False, out=out)
    assert out.getvalue() == ""
