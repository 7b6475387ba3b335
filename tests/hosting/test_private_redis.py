"""Each hosted evaluation on a Redis of its own (server/hosting/private_redis.py): the agent as
its participant user over a unix socket, a memory bound that refuses writes, a server that dies
with its work-horse (F20); the socket bridge that serves it to flatland's TCP-only client; and
the tenant attack it answers (F18): two submissions, two workers, one farm Redis, and one agent
flooding its Redis as fast as it can while the other is evaluated exactly as it would be alone."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import paths
import pytest
import redis
from harness import finish, read_episodes, read_events, read_summary, running_service, wait_for
from hosting_farm import REPO, competition_file, seeded_agent, wait_state
from processes import alive, descendants

from arbiter.protocol import keys
from arbiter.server.cli import embedded_redis
from arbiter.server.cli.embedded_redis import free_port
from arbiter.server.core.competition import load_competition
from arbiter.server.hosting import private_redis
from arbiter.server.hosting.farm import submit
from arbiter.server.hosting.private_redis import PrivateRedis, remove_abandoned
from arbiter.server.hosting.submissions import AGENT_FAULT, FAILED, FINISHED, RUNNING, SubmissionStore

SERVICE = "sub-private-1"
FLOOD_AGENT = paths.SUPPORT / "flood_agent_main.py"


def test_the_agent_gets_its_own_user_on_a_socket_and_the_evaluator_the_rest(monkeypatch) -> None:
    started: list[list[str]] = []
    real_popen = embedded_redis.subprocess.Popen

    def recording_popen(args, **kwargs):
        if any(os.path.basename(str(word)) == "redis-server" for word in args):
            started.append(list(args))
            # A fork with a preexec_fn would run every loaded library's at-fork handlers (gRPC's crash).
            assert kwargs.get("preexec_fn") is None or shutil.which("setpriv") is None
        return real_popen(args, **kwargs)

    monkeypatch.setattr(embedded_redis.subprocess, "Popen", recording_popen)
    with PrivateRedis(SERVICE, 8 << 20, "8m") as private:
        agent = redis.Redis.from_url(private.agent_url(), socket_timeout=5)
        evaluator = redis.Redis.from_url(private.evaluator_url, socket_timeout=5)
        assert agent.lpush(keys.commands_key(SERVICE), b"request") == 1
        for refused in (lambda: agent.get("x"), lambda: agent.lpush(keys.commands_key("sub-other"), b"x")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                refused()
        assert evaluator.rpop(keys.commands_key(SERVICE)) == b"request"
        config = evaluator.config_get("*")
        assert config["port"] == "0", "no TCP: the socket is the only way in"
        assert (config["maxmemory"], config["maxmemory-policy"]) == (str(8 << 20), "noeviction")
        # A container's user of any id connects through the mounted folder, which holds the socket alone.
        assert os.listdir(private.socket_folder) == ["redis.sock"]
        assert stat.S_IMODE(private.socket_folder.stat().st_mode) == 0o755
        assert stat.S_IMODE(private.socket.stat().st_mode) == 0o777
        # The passwords are in a file of this user's alone, never on a command line.
        (command_line,) = started
        if shutil.which("setpriv"):  # tied to its starter by the kernel, through util-linux's setpriv
            assert command_line[1:4] == ["--pdeathsig", "KILL", "--"]
        assert not any(private.server.password in word or private.participant_password in word for word in command_line)
        assert config["requirepass"] == private.server.password
        assert stat.S_IMODE((private.socket_folder.parent / "redis.conf").stat().st_mode) == 0o600
        # Writes past the bound are refused, nothing is evicted.
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for _ in range(64):
                agent.lpush(keys.response_key(SERVICE, "junk"), os.urandom(512 * 1024))
        assert private.full() == private.full_cause and "redis_memory" in private.full_cause
        assert evaluator.llen(keys.response_key(SERVICE, "junk")) > 0
        agent.close()
        evaluator.close()
    with PrivateRedis(SERVICE, 8 << 20) as fresh:
        assert fresh.participant_password != private.participant_password, "a password per attempt"
        assert fresh.full() is None


def test_the_server_dies_with_its_work_horse_and_a_later_attempt_removes_its_folder(monkeypatch) -> None:
    """A work-horse killed with SIGKILL (its process alone, not its group) takes its Redis along;
    the folder left behind, named after the horse, is removed by the next evaluation on the
    machine at once, and that evaluation's own folder stays. A folder of its own for this test's
    servers."""
    temp = Path(tempfile.mkdtemp(prefix="arbiter-test-"))  # short: a socket's path has a limit
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    reported = temp / "redis.pid"
    program = (
        "import threading\n"
        "from arbiter.server.hosting.private_redis import PrivateRedis\n"
        "private = PrivateRedis('sub-horse', 8 << 20).start()\n"
        f"open({str(reported)!r}, 'w').write(str(private.server.pid))\n"
        "threading.Event().wait()\n"
    )
    horse = subprocess.Popen([sys.executable, "-c", program], env={**os.environ, "TMPDIR": str(temp)})
    try:
        wait_for(lambda: reported.exists() and reported.read_text(), what="the horse's Redis started")
        server = int(reported.read_text())
        assert alive(server)
        (left,) = temp.glob(f"{private_redis.FOLDER_PREFIX}*")
        assert left.name.startswith(f"{private_redis.FOLDER_PREFIX}{horse.pid}-")
        assert remove_abandoned() == [], "the folder of a horse that runs stays"
        os.kill(horse.pid, signal.SIGKILL)
        horse.wait(timeout=10)
        wait_for(lambda: not alive(server), timeout_s=5, what="the Redis of the killed horse gone")
        with PrivateRedis("sub-next", 8 << 20) as later_attempt:
            assert not left.exists()
            assert later_attempt.socket.exists(), "a live server's folder is kept"
            (kept,) = temp.glob(f"{private_redis.FOLDER_PREFIX}*")
            assert kept.name.startswith(f"{private_redis.FOLDER_PREFIX}{os.getpid()}-")
    finally:
        horse.kill()
        horse.wait()
        shutil.rmtree(temp, ignore_errors=True)


def test_a_folder_is_abandoned_once_its_starter_ended_or_if_it_names_none_once_old_and_silent(
    monkeypatch, tmp_path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    prefix = private_redis.FOLDER_PREFIX
    folders = {
        "ended": tmp_path / f"{prefix}{ended.pid}-a1",
        "zombie": tmp_path / f"{prefix}{zombie.pid}-a2",
        "running": tmp_path / f"{prefix}{os.getpid()}-a3",
        "no pid, young": tmp_path / f"{prefix}b4",
        "no pid, old": tmp_path / f"{prefix}b5",
        "another kind": tmp_path / f"arbiter-redis-{ended.pid}-c6",
    }
    for folder in folders.values():
        (folder / "socket").mkdir(parents=True)
    now = time.time()
    old = now - private_redis.ABANDONED_AFTER_S - 1
    os.utime(folders["no pid, old"], (old, old))
    try:
        removed = remove_abandoned(now=now)
    finally:
        zombie.wait()
    assert sorted(removed) == sorted([folders["ended"], folders["zombie"], folders["no pid, old"]])
    assert {name for name, folder in folders.items() if folder.exists()} == {"running", "no pid, young", "another kind"}


@pytest.mark.parametrize("address_taken", [False, True], ids=["its-own-address", "another-agent-s-address"])
def test_flatland_s_own_client_reaches_the_evaluation_through_the_bridge(address_taken, tiny_tests, tmp_path) -> None:
    """flatland-rl's unmodified FlatlandRemoteClient (TCP, port 6379, no password) plays a whole
    evaluation through the bridge, as the participant's user; on a machine where another agent's
    bridge holds 127.0.0.1 on that port too (two local workers), through the next loopback
    address, which flatland's client finds in ``$redis_ip``."""
    port = free_port()
    taken = socket.create_server(("127.0.0.1", port)) if address_taken else contextlib.nullcontext()
    with taken, PrivateRedis(SERVICE, 64 << 20) as private:
        spec = load_competition(competition_file(tmp_path, tiny_tests))
        with running_service(
            spec, tests=tiny_tests, results=str(tmp_path / "results"), redis_url=private.evaluator_url,
            service_id=SERVICE,
        ) as (_, outcome):  # fmt: skip
            code = (
                "from flatland.evaluators import client\n"
                "defaults = list(client.FlatlandRemoteClient.__init__.__defaults__)\n"
                f"defaults[0], defaults[1], defaults[3] = {tiny_tests!r}, {SERVICE!r}, {port}\n"
                "client.FlatlandRemoteClient.__init__.__defaults__ = tuple(defaults)\n"
                "print('host', defaults[2])\n"
                "exec(open('examples/legacy_starter_kit_agent.py').read())\n"
            )  # the one change: the port, so that a Redis on this machine's 6379 is left alone
            agent = subprocess.run(
                [sys.executable, "-m", "arbiter.client.socket_bridge", "--listen", f"127.0.0.1:{port}",
                 "--any-loopback", "--redis-url", private.agent_url(), "--", sys.executable, "-c", code],
                cwd=REPO, capture_output=True, text=True, timeout=60,
                env={**os.environ, "redis_ip": "127.0.0.1"},
            )  # fmt: skip
            assert agent.returncode == 0, agent.stderr[-2000:]
            summary = finish(outcome)
    assert "submitted: score" in agent.stdout
    assert summary["state"] == "SUCCESS" and summary["episodes"]["finished"] == 3
    host = "127.0.0.2" if address_taken else "127.0.0.1"
    assert f"host {host}\n" in agent.stdout
    assert (f"127.0.0.1:{port} is taken; listening on {host}:{port}" in agent.stderr) is address_taken


def test_a_bridge_passes_the_agent_s_exit_and_refuses_a_wrong_password(tmp_path) -> None:
    with PrivateRedis(SERVICE, 8 << 20) as private:
        wrong = private.agent_url().replace(private.participant_password, "nope")
        port = free_port()
        probe = (
            "import socket\n"
            f"s = socket.create_connection(('127.0.0.1', {port}))\n"
            "s.sendall(b'*1\\r\\n$4\\r\\nPING\\r\\n')\n"
            "try:\n"
            "    print('answered' if s.recv(100) else 'closed')\n"
            "except ConnectionResetError:\n"
            "    print('closed')\n"
        )  # the bridge drops a client it cannot authenticate
        done = subprocess.run(
            [sys.executable, "-m", "arbiter.client.socket_bridge", "--listen", f"127.0.0.1:{port}",
             "--redis-url", wrong, "--", sys.executable, "-c", probe + "raise SystemExit(7)"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    assert done.returncode == 7
    assert done.stdout.strip() == "closed" and "refused the bridge's AUTH" in done.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_a_bridge_killed_with_sigkill_takes_its_agent_along(tmp_path) -> None:
    """Killed with the evaluation that started it (its work-horse, by the out-of-memory killer, say),
    the bridge leaves no agent behind, retrying a Redis that is gone."""
    pid_file = tmp_path / "agent.pid"
    agent = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    with PrivateRedis(SERVICE, 8 << 20) as private:
        bridge = subprocess.Popen(
            [sys.executable, "-m", "arbiter.client.socket_bridge", "--listen", f"127.0.0.1:{free_port()}",
             "--redis-url", private.agent_url(), "--", sys.executable, "-c", agent],
        )  # fmt: skip
        try:
            wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="the agent started")
            agent_pid = int(pid_file.read_text())
            bridge.kill()
            bridge.wait(timeout=10)
            wait_for(lambda: not alive(agent_pid), timeout_s=10, what="the agent gone with its bridge")
        finally:
            if bridge.poll() is None:
                bridge.kill()
                bridge.wait()


@pytest.mark.timeout(90)
def test_a_flooding_tenant_leaves_the_other_evaluation_as_it_would_be_alone(
    redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path
) -> None:
    competition = competition_file(tmp_path, tiny_tests, hosting='redis_memory = "32m"')
    flood = [sys.executable, str(FLOOD_AGENT), "30"]  # floods for up to 30 s, unless stopped
    attacker = submit(redis_conn, competition=competition, participant="mallory", agent=flood)
    victim = submit(redis_conn, competition=competition, participant="bob", agent=seeded_agent(0.005))
    workers = []
    try:
        for index in range(2):  # the flood's log lines go to files: a pipe nobody reads would fill
            log = open(tmp_path / f"worker-{index}.log", "w")  # noqa: SIM115 - closed below
            workers.append((log, subprocess.Popen(
                [sys.executable, "-m", "arbiter.server.cli", "worker", "--redis-url", redis_url,
                 "--results-root", str(tmp_path / "results")],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, process_group=0,
            )))  # fmt: skip
        store = SubmissionStore(redis_conn)
        flooded = wait_state(store, attacker.id, FINISHED, FAILED, timeout_s=60)
        scored = wait_state(store, victim.id, FINISHED, FAILED, timeout_s=60)
        # The same agent on the same competition, alone on the farm.
        alone = submit(redis_conn, competition=competition, participant="bob", agent=seeded_agent(0.005))
        undisturbed = wait_state(store, alone.id, FINISHED, FAILED, timeout_s=60)
    finally:
        for log, worker in workers:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
            log.close()
    assert scored.state == undisturbed.state == FINISHED
    assert read_summary(scored.results)["state"] == "SUCCESS"
    assert scored.score == undisturbed.score is not None
    assert read_episodes(scored.results) != [] and [r["env"] for r in read_episodes(scored.results)] == [
        r["env"] for r in read_episodes(undisturbed.results)
    ]
    # The attacker's own evaluation is stopped once its Redis is full, as the agent's fault, once.
    assert flooded.state == FAILED and flooded.fault == AGENT_FAULT and flooded.attempts == 1
    assert "filled its evaluation's Redis" in flooded.cause
    summary = read_summary(flooded.results)
    assert summary["state"] == "INTERRUPTED" and summary["termination_cause"] == flooded.cause
    # Nothing of the flood reached the farm's Redis.
    assert redis_conn.keys(f"*{attacker.id}::*") == []
    assert redis_conn.info("memory")["used_memory"] < 16 << 20


def test_an_evaluation_s_redis_held_up_past_a_step_budget_costs_the_agent_nothing(
    redis_conn: redis.Redis, tiny_tests, tmp_path, workers
) -> None:
    """The evaluation's own Redis held up for longer than a step's budget (1 s) but less than a
    hang's socket timeout (its machine stalled; here SIGSTOP) while the agent is in its steps:
    that time is downtime, not the agent's, so no step times out and the submission scores as
    one never held up."""
    competition = competition_file(tmp_path, tiny_tests)
    store = SubmissionStore(redis_conn)
    budgets = ["budgets.planning_s=1", "budgets.step_s=1"]
    fast = tmp_path / "fast"  # the agent's steps are slow (the evaluator waits on Redis) until then
    agent = seeded_agent(0.2, slow_until=str(fast))
    held = submit(redis_conn, competition=competition, participant="alice", agent=agent, sets=budgets)
    worker = workers.start()
    wait_state(store, held.id, RUNNING, timeout_s=30)
    server, evaluator = wait_for(lambda: _evaluation_redis(worker.pid), what="the evaluation's redis-server")
    # A few steps in: the agent's requests are its handshake, the episode's creation, then steps.
    wait_for(lambda: evaluator.info("commandstats").get("cmdstat_lpush", {}).get("calls", 0) >= 6, timeout_s=30,
             what="the agent's first steps")  # fmt: skip
    evaluator.close()
    os.kill(server, signal.SIGSTOP)
    try:
        time.sleep(2.5)  # the stall itself is the fault under test: nothing to await
    finally:
        os.kill(server, signal.SIGCONT)
        fast.touch()
    ended = wait_state(store, held.id, FINISHED, FAILED, timeout_s=60)
    alone = submit(redis_conn, competition=competition, participant="bob", agent=seeded_agent(), sets=budgets)
    undisturbed = wait_state(store, alone.id, FINISHED, FAILED, timeout_s=60)
    assert ended.state == undisturbed.state == FINISHED and ended.attempts == 1
    assert not any(record["timed_out"] for record in read_episodes(ended.results))
    assert ended.cause == undisturbed.cause == "all 3 episodes evaluated"
    assert ended.score == undisturbed.score is not None


def test_an_evaluation_whose_redis_is_killed_is_tried_again_at_once(
    redis_conn: redis.Redis, tiny_tests, tmp_path, workers
) -> None:
    """The evaluation's own Redis killed in the middle (no one starts it again): the attempt
    stops at once, without waiting out the evaluator's outage limit (60 s), and the next attempt
    scores as an evaluation never interrupted."""
    competition = competition_file(tmp_path, tiny_tests)
    store = SubmissionStore(redis_conn)
    killed = submit(redis_conn, competition=competition, participant="alice", agent=seeded_agent(0.01))
    worker = workers.start()
    wait_state(store, killed.id, RUNNING, timeout_s=30)
    server, evaluator = wait_for(lambda: _evaluation_redis(worker.pid), what="the evaluation's redis-server")
    wait_for(lambda: evaluator.info("commandstats").get("cmdstat_lpush", {}).get("calls", 0) >= 6, timeout_s=30,
             what="the agent's first steps")  # fmt: skip
    evaluator.close()
    os.kill(server, signal.SIGKILL)
    ended = wait_state(store, killed.id, FINISHED, FAILED, timeout_s=20)
    alone = submit(redis_conn, competition=competition, participant="bob", agent=seeded_agent())
    undisturbed = wait_state(store, alone.id, FINISHED, FAILED, timeout_s=60)
    assert ended.state == undisturbed.state == FINISHED and ended.attempts == 2
    assert ended.score == undisturbed.score is not None
    first = [event for event in read_events(ended.results) if event.get("event") == "finished"][0]
    assert first["state"] == "INTERRUPTED" and "the evaluation's Redis ended" in first["termination_cause"]


def _evaluation_redis(worker: int) -> tuple[int, redis.Redis] | None:
    """The evaluation's redis-server under ``worker`` once it runs, and a client of it as its
    evaluator: redis-server names its socket in its process title, and its password is in the
    config file two folders up."""
    for child in descendants(worker):
        try:
            title = Path(f"/proc/{child}/cmdline").read_text(errors="replace")
        except OSError:
            continue
        if "redis-server" in title and "unixsocket:" in title:
            socket_path = Path(title.split("unixsocket:", 1)[1].split()[0].strip("\0"))
            config = socket_path.parent.parent / embedded_redis.CONFIG_NAME
            line = next(line for line in config.read_text().splitlines() if line.startswith("requirepass"))
            password = bytes.fromhex(line.split(" ", 1)[1].strip('"').replace("\\x", "")).decode()
            return child, redis.Redis(unix_socket_path=str(socket_path), password=password, socket_timeout=5)
    return None
