"""The Flatland benchmark's children and test sets: start each process with its own log, wait for
it, stop every one still running by pid; wait until evaluators listen; copy the test sets a run needs.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_common import RESULT_MARK, BenchError, ordered_env_paths

BENCH_SCRIPT = Path(__file__).resolve().parent / "bench.py"


class Proc:
    def __init__(self, name: str, popen: subprocess.Popen, log: Path):
        self.name = name
        self.popen = popen
        self.log = log

    @property
    def pid(self) -> int:
        return self.popen.pid

    def tail(self, chars: int = 3000) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return text[-chars:]

    def result(self) -> dict[str, Any]:
        try:
            lines = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
        for line in reversed(lines):
            if line.startswith(RESULT_MARK):
                return json.loads(line[len(RESULT_MARK) :])
        raise BenchError(f"{self.name} printed no result; its output ends with:\n{self.tail()}")


class Processes:
    """Every child this script starts; ``stop_all`` ends those still running, by pid."""

    def __init__(self, workdir: Path, script: Path = BENCH_SCRIPT):
        self.workdir = workdir
        self.script = script  # the benchmark whose ``--worker MODE`` runs each measured process
        self.procs: list[Proc] = []
        self._count = 0

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        self._count += 1
        log = self.workdir / "logs" / f"{self._count:03d}-{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as output:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=self.workdir,
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def worker(self, name: str, mode: str, *options: str, env: dict[str, str] | None = None) -> Proc:
        return self.start(name, [sys.executable, str(self.script), "--worker", mode, *options], env=env)

    def wait(self, procs: list[Proc], timeout_s: float) -> None:
        """Wait until every one exited 0; fail at the first non-zero exit or at the timeout."""
        deadline = time.monotonic() + timeout_s
        pending = list(procs)
        while pending:
            for proc in list(pending):
                code = proc.popen.poll()
                if code is None:
                    continue
                pending.remove(proc)
                if code != 0:
                    raise BenchError(f"{proc.name} (pid {proc.pid}) exited with status {code}:\n{proc.tail()}")
            if pending and time.monotonic() > deadline:
                names = ", ".join(f"{p.name} (pid {p.pid})" for p in pending)
                raise BenchError(f"timed out after {timeout_s:g} s waiting for {names}:\n{pending[0].tail()}")
            if pending:
                time.sleep(0.02)

    def stop_all(self) -> None:
        running = [p for p in self.procs if p.popen.poll() is None]
        for proc in running:
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in running:
            try:
                proc.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.popen.wait()
        self.procs = [p for p in self.procs if p.popen.returncode is None]


def brpop_clients(conn: Any) -> int:
    """Connections blocked in the evaluator's wait for requests (a BLMOVE: server/transport.py)."""
    return sum(1 for client in conn.client_list() if client.get("cmd") == "blmove")


def wait_until_listening(conn: Any, servers: list[Proc], baseline: int, timeout_s: float = 60.0) -> None:
    """Wait until the servers block on their command lists (so agents measure a ready server).

    Agents are correct without this (they retry their handshake); it keeps server start-up off
    the CPU while an agent measures, and saves the 2 s a cleared handshake would cost.
    """
    deadline = time.monotonic() + timeout_s
    while brpop_clients(conn) < baseline + len(servers):
        for proc in servers:
            if proc.popen.poll() is not None:
                raise BenchError(f"{proc.name} exited with status {proc.popen.returncode}:\n{proc.tail()}")
        if time.monotonic() > deadline:
            print(f"bench: warning: servers not seen listening after {timeout_s:g} s; going on", file=sys.stderr)
            return
        time.sleep(0.02)


def subset_test_set(source: Path, out: Path, count: int) -> Path:
    """A test folder with the first ``count`` envs of ``source`` and the matching metadata rows."""
    keep = ordered_env_paths(str(source))[:count]
    out.mkdir(parents=True)
    for rel in keep:
        (out / rel).parent.mkdir(exist_ok=True)
        shutil.copy2(source / rel, out / rel)
    with open(source / "metadata.csv", newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        columns = list(reader.fieldnames or [])
        rows = [row for row in reader if f"{row['test_id']}/{row['env_id']}.pkl" in keep]
    with open(out / "metadata.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return out


def replicated_test_set(source: Path, out: Path, count: int) -> Path:
    """``Test_0/Level_0..count-1``: copies of ``source``'s envs, round-robin, with metadata rows."""
    sources = ordered_env_paths(str(source))
    with open(source / "metadata.csv", newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        columns = list(reader.fieldnames or [])
        by_path = {f"{row['test_id']}/{row['env_id']}.pkl": row for row in reader}
    (out / "Test_0").mkdir(parents=True)
    rows = []
    for level in range(count):
        rel = sources[level % len(sources)]
        shutil.copyfile(source / rel, out / "Test_0" / f"Level_{level}.pkl")
        rows.append({**by_path[rel], "test_id": "Test_0", "env_id": f"Level_{level}"})
    with open(out / "metadata.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return out


def transport_label(tcp: bool) -> str:
    """How a benchmark's sides meet (``BenchSession.redis_url``), for its table's heading."""
    return "Redis over loopback TCP" if tcp else "Redis over its unix socket, as arbiter run"


def new_service_id(label: str) -> str:
    return f"bench-{label}-{uuid.uuid4().hex[:8]}"


class BenchSession:
    """One benchmark's work folder, processes and redis-server (on a free loopback port and a unix
    socket), as a
    context: everything is stopped and the folder removed (kept with ``keep``) however it ends. A
    ``BenchError`` or an interrupt ends the ``with`` block and is kept in ``failure``."""

    def __init__(self, prefix: str, *, script: Path | None = None, keep: bool = False):
        from arbiter.server.cli.embedded_redis import EmbeddedRedis, free_port

        self.workdir = Path(tempfile.mkdtemp(prefix=prefix))
        self.procs = Processes(self.workdir, script=script) if script is not None else Processes(self.workdir)
        self.redis = EmbeddedRedis(port=free_port())
        self.keep = keep
        self.failure: str | None = None

    def __enter__(self) -> BenchSession:
        return self

    def __exit__(self, kind: Any, exc: Any, traceback: Any) -> bool:
        if isinstance(exc, BenchError):
            self.failure = str(exc)
        elif isinstance(exc, KeyboardInterrupt):
            self.failure = "interrupted"
        self.procs.stop_all()
        self.redis.stop()
        if self.keep:
            print(f"bench: work folder kept: {self.workdir}", file=sys.stderr)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return self.failure is not None

    def redis_url(self, tcp: bool) -> str:
        """Where the benchmarked sides meet: the unix socket, as ``arbiter run`` connects them,
        or (``tcp``) loopback TCP, as containers that share a Redis do."""
        return self.redis.url if tcp else self.redis.local_url

    def failed(self) -> bool:
        """Say so when the benchmark failed; the caller then exits 2."""
        if self.failure is not None:
            print(f"bench: FAILED: {self.failure}", file=sys.stderr)
        return self.failure is not None


def run_with_sigterm_as_interrupt(run: Any, args: Any) -> int:
    """``run(args)``, a SIGTERM ending it like Ctrl-C: the session stops what it started."""

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    return run(args)
