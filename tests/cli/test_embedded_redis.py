"""EmbeddedRedis against the real redis-server binary: lifecycle, URLs, auth, binding, failures."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from arbiter.server.cli import embedded_redis
from arbiter.server.cli.embedded_redis import EmbeddedRedis, EmbeddedRedisError, free_port, port_is_free


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition") -> None:
    give_up = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.005)


def pid_is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def test_binary_is_found_and_runnable():
    path = embedded_redis.redis_server_binary()
    assert os.access(path, os.X_OK)


def test_start_and_stop_on_a_free_port():
    port = free_port()
    server = EmbeddedRedis(port=port)
    assert server.pid is None
    server.start()
    try:
        pid, data_dir = server.pid, server.log_file.parent
        assert pid is not None and data_dir.is_dir()
        assert server.port == port and not port_is_free("127.0.0.1", port)
        with client(server.url) as conn:
            assert conn.ping()
            assert conn.info("server")["process_id"] == pid
    finally:
        server.stop()
    assert server.pid is None
    wait_until(lambda: pid_is_gone(pid), what=f"pid {pid} to disappear")
    wait_until(lambda: port_is_free("127.0.0.1", port), what=f"port {port} to be free")
    assert not data_dir.exists()


def test_url_without_password(redis_server):
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"


def test_password_is_required_and_quoted_in_the_url():
    password = "s3cr:t@/x y"
    with EmbeddedRedis(port=free_port(), password=password) as server:
        assert server.url == f"redis://:s3cr%3At%40%2Fx%20y@127.0.0.1:{server.port}/0"
        with client(server.url) as conn:
            assert conn.ping()
        with client(f"redis://127.0.0.1:{server.port}/0") as anonymous:
            with pytest.raises(redis.AuthenticationError):
                anonymous.ping()
        with client(f"redis://:wrong@127.0.0.1:{server.port}/0") as wrong:
            with pytest.raises(redis.AuthenticationError):
                wrong.ping()


def test_local_url_is_a_unix_socket_only_this_user_opens(redis_server):
    path = redis_server.unix_socket
    assert path is not None and path.parent == redis_server.log_file.parent
    assert redis_server.local_url == f"unix://{path}?db=0"
    assert stat.S_ISSOCK(path.stat().st_mode)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700  # no other user of the machine connects
    with client(redis_server.local_url) as conn:
        assert conn.ping()
        # the same server as the TCP URL's, not another one
        assert conn.info("server")["process_id"] == redis_server.pid


def test_local_url_carries_the_password():
    with EmbeddedRedis(port=free_port(), password="p@ss/word") as server:
        assert server.local_url == f"unix://:p%40ss%2Fword@{server.unix_socket}?db=0"
        with client(server.local_url) as conn:
            assert conn.ping()
        with client(f"unix://{server.unix_socket}?db=0") as anonymous:
            with pytest.raises(redis.AuthenticationError):
                anonymous.ping()


def test_a_temporary_folder_too_long_for_a_socket_falls_back_to_tcp(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr(embedded_redis.tempfile, "tempdir", None)  # tempfile caches the folder it picked
    with EmbeddedRedis(port=free_port()) as server:
        assert str(server.log_file).startswith(str(deep))
        assert server.unix_socket is None
        assert server.local_url == server.url
        with client(server.local_url) as conn:
            assert conn.ping()
    assert server.unix_socket is None and server.local_url == server.url


def test_a_busy_port_is_a_clear_error(redis_server):
    with pytest.raises(EmbeddedRedisError, match=rf"port {redis_server.port} .*already in use"):
        EmbeddedRedis(port=redis_server.port).start()


def test_a_port_taken_after_the_check_fails_with_the_server_log(redis_server, monkeypatch):
    """The race free_port() cannot close: redis-server itself fails to bind, and says why."""
    monkeypatch.setattr(embedded_redis, "port_is_free", lambda host, port: True)
    server = EmbeddedRedis(port=redis_server.port)
    with pytest.raises(EmbeddedRedisError, match=r"(?s)exited with code.*Address already in use"):
        server.start()
    assert server.pid is None and server.log_file is None


def test_a_port_of_its_own_picking_taken_first_is_given_up_for_another(redis_server, monkeypatch):
    """Runs started together both find 6379 free; the one whose redis-server loses the bind
    takes another free port instead of failing."""
    server = EmbeddedRedis()
    server._port = redis_server.port  # as if picked in the moment before the other server bound it
    lies = iter([True])  # that port is then said to be free, once: the check before the bind
    real = embedded_redis.port_is_free
    monkeypatch.setattr(embedded_redis, "port_is_free", lambda host, port: next(lies, None) or real(host, port))
    with server:
        assert server.port != redis_server.port
        assert redis.Redis.from_url(server.url).ping()


def test_a_server_that_never_answers_times_out_and_is_killed(tmp_path: Path, monkeypatch):
    pid_file = tmp_path / "pid"
    fake = tmp_path / "fake-redis-server"
    fake.write_text(f'#!/bin/sh\necho "pretending to start" >&2\necho $$ > {pid_file}\nexec sleep 60\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(embedded_redis, "redis_server_binary", lambda: str(fake))
    with pytest.raises(EmbeddedRedisError, match=r"(?s)did not answer PING.*within 0.5 s.*pretending to start"):
        EmbeddedRedis(port=free_port(), start_timeout_s=0.5).start()
    pid = int(pid_file.read_text())
    wait_until(lambda: pid_is_gone(pid), what=f"the fake server pid {pid} to be reaped")


def test_context_manager():
    with EmbeddedRedis(port=free_port()) as server:
        pid, port = server.pid, server.port
        with client(server.url) as conn:
            conn.set("k", "v")
            assert conn.get("k") == b"v"
    assert server.pid is None
    wait_until(lambda: pid_is_gone(pid), what=f"pid {pid} to disappear")
    wait_until(lambda: port_is_free("127.0.0.1", port), what=f"port {port} to be free")


def test_stop_is_idempotent():
    server = EmbeddedRedis(port=free_port())
    server.stop()  # never started
    server.start()
    server.stop()
    server.stop()
    assert server.pid is None


@pytest.mark.alone  # port 6379, which any other test's `arbiter run` takes when it is free
def test_default_port_prefers_6379_when_free():
    expected = 6379 if port_is_free("127.0.0.1", 6379) else None
    server = EmbeddedRedis()
    if expected is not None:
        assert server.port == expected
    else:
        assert server.port != 6379 and port_is_free("127.0.0.1", server.port)


def test_binds_only_to_loopback_and_keeps_nothing_on_disk(redis_server, redis_conn):
    config = {_text(k): _text(v) for k, v in redis_conn.config_get("*").items()}
    assert config["bind"] == "127.0.0.1"
    assert config["protected-mode"] == "yes"
    assert config["save"] == ""
    assert config["appendonly"] == "no"
    # Bound to 127.0.0.1 exactly, not 0.0.0.0: another address of this host does not answer.
    # (127.0.0.2 is a loopback address on Linux; elsewhere it is unreachable, which also refuses.)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.2", redis_server.port), timeout=1).close()


def test_redis_conn_fixture_talks_to_the_session_server(redis_server, redis_url, redis_conn, service_id):
    assert redis_url == redis_server.url
    assert service_id.startswith("t-") and len(service_id) == 14
    redis_conn.set("conftest-isolation-probe", service_id)


def test_redis_conn_is_flushed_between_tests(redis_conn):
    # Runs after the test above; its key must be gone.
    assert redis_conn.get("conftest-isolation-probe") is None


def test_a_server_left_running_is_stopped_at_interpreter_exit():
    program = (
        "from arbiter.server.cli.embedded_redis import EmbeddedRedis, free_port\n"
        "server = EmbeddedRedis(port=free_port()).start()\n"
        "print(server.pid, server.port, flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=30, check=True)
    pid, port = map(int, done.stdout.split())
    wait_until(lambda: pid_is_gone(pid), what=f"pid {pid} to be stopped by atexit")
    wait_until(lambda: port_is_free("127.0.0.1", port), what=f"port {port} to be free")


def test_no_binary_anywhere_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(embedded_redis.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(embedded_redis.shutil, "which", lambda name: None)
    with pytest.raises(EmbeddedRedisError, match="no redis-server binary"):
        embedded_redis.redis_server_binary()
