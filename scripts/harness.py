"""What every benchmark in scripts/ is built on: a private redis-server and work folder, the
measured processes (a benchmark's own ``--worker MODE``, each ``emit``-ting one result line), an
evaluator started and waited for, rounds that alternate the paths, medians and spreads, the
target and whether it is met (figures.py), the machine it ran on and what the hypervisor took from
it meanwhile (machine.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from figures import Target, median_of, per_round_ratios, percentile, spread  # noqa: F401 (benchmarks import them from here too)
from machine import (  # noqa: F401 (benchmarks import them from here too)
    REPO,
    benchmark_time_line,
    cpu_ticks,
    machine_info,
    machine_line,
    steal_share,
)

RESULT_MARK = "BENCH_RESULT "


class BenchError(RuntimeError):
    """A worker failed, timed out or produced no result."""


def emit(result: dict[str, Any]) -> None:
    """A worker's result: one marked line that ``Proc.result`` finds in the worker's log."""
    print(RESULT_MARK + json.dumps(result), flush=True)


def write_json(path: str | None, report: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=2), encoding="utf-8")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def result(self) -> dict[str, Any]:
        for line in reversed(self.tail(chars=1 << 30).splitlines()):
            if line.startswith(RESULT_MARK):
                return json.loads(line[len(RESULT_MARK) :])
        raise BenchError(f"{self.name} printed no result; its output ends with:\n{self.tail()}")


class Processes:
    """Every child a benchmark starts, each with its own log; ``stop_all`` ends those still running, by pid."""

    def __init__(self, workdir: Path, script: Path):
        self.workdir = workdir
        self.script = script  # the benchmark whose ``--worker MODE`` runs each measured process
        self.procs: list[Proc] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        (self.workdir / "logs").mkdir(exist_ok=True)
        log = self.workdir / "logs" / f"{len(self.procs) + 1:03d}-{name}.log"
        with open(log, "wb") as output:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})}, cwd=self.workdir)  # fmt: skip
        self.procs.append(Proc(name, popen, log))
        return self.procs[-1]

    def worker_argv(self, mode: str, *options: str) -> list[str]:
        return [sys.executable, str(self.script), "--worker", mode, *options]

    def worker(self, name: str, mode: str, *options: str, env: dict[str, str] | None = None) -> Proc:
        return self.start(name, self.worker_argv(mode, *options), env=env)

    def wait(self, procs: list[Proc], timeout_s: float) -> None:
        """Wait until every one exited 0; fail at the first non-zero exit or at the timeout."""
        deadline = time.monotonic() + timeout_s
        pending = list(procs)
        while pending:
            for proc in [p for p in pending if p.popen.poll() is not None]:
                pending.remove(proc)
                if proc.popen.returncode != 0:
                    raise BenchError(f"{proc.name} (pid {proc.popen.pid}) exited with status {proc.popen.returncode}:\n"
                                     f"{proc.tail()}")  # fmt: skip
            if pending and time.monotonic() > deadline:
                names = ", ".join(f"{p.name} (pid {p.popen.pid})" for p in pending)
                raise BenchError(f"timed out after {timeout_s:g} s waiting for {names}:\n{pending[0].tail()}")
            time.sleep(0.02 if pending else 0)

    def stop_all(self) -> None:
        self.stop(self.procs)

    def stop(self, procs: list[Proc], grace_s: float = 5.0) -> None:
        """SIGTERM those of ``procs`` still running, by pid; SIGKILL any left after ``grace_s``."""
        running = [p for p in procs if p.popen.poll() is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError):  # it exited since the check
                os.kill(proc.popen.pid, signal.SIGTERM)
        for proc in running:
            try:
                proc.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait()


def new_service_id(label: str) -> str:
    return f"bench-{label}-{uuid.uuid4().hex[:8]}"


def serve_argv(
    redis_url: str, service_id: str, results: Path, *options: str, overrides: Sequence[str] = ()
) -> list[str]:
    """``arbiter serve`` with ``options`` (``--competition``, ``--tests``) and ``--set`` ``overrides``."""
    argv = [sys.executable, "-m", "arbiter.server.cli", "serve", *options]
    for item in overrides:
        argv += ["--set", item]
    return argv + ["--redis-url", redis_url, "--service-id", service_id, "--results", str(results), "--quiet"]


def read_results(results: Path) -> dict[str, Any]:
    """What an evaluator wrote: its summary, its episode records and its step timings."""
    summary = json.loads((results / "summary.json").read_text(encoding="utf-8"))
    lines = (results / "episodes.jsonl").read_text(encoding="utf-8").splitlines()
    timing = summary.get("timing") or {}
    return {
        "summary": summary,
        "records": [json.loads(line) for line in lines if line.strip()],
        "state": summary.get("state"),
        "server_step_mean_s": (timing.get("server_step_s") or {}).get("mean"),
        "server_think_mean_s": (timing.get("step_think_s") or {}).get("mean"),
        "record_durable_mean_s": (timing.get("record_durable_s") or {}).get("mean"),
    }


class BenchSession:
    """One benchmark's work folder, processes and private redis-server, as a context: everything
    is stopped and the folder removed (kept with ``keep``) however it ends. A ``BenchError`` or an
    interrupt ends the ``with`` block and is kept in ``failure``; other errors go on."""

    def __init__(self, prefix: str, *, script: Path, keep: bool = False):
        from arbiter.server.cli.embedded_redis import EmbeddedRedis, free_port

        self.workdir = Path(tempfile.mkdtemp(prefix=prefix))
        self.procs = Processes(self.workdir, script)
        self.redis = EmbeddedRedis(port=free_port())  # on a free loopback port and a unix socket
        self.keep = keep
        self.failure: str | None = None
        self.conn: Any = None
        self.transport = ""  # how the benchmarked sides meet, for the report's heading (start_redis)

    def __enter__(self) -> BenchSession:
        return self

    def __exit__(self, kind: Any, exc: Any, traceback: Any) -> bool:
        if isinstance(exc, BenchError | KeyboardInterrupt):
            self.failure = str(exc) if isinstance(exc, BenchError) else "interrupted"
        self.procs.stop_all()
        if self.conn is not None:
            self.conn.close()
        self.redis.stop()
        if self.keep:
            print(f"bench: work folder kept: {self.workdir}", file=sys.stderr)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return self.failure is not None

    def start_redis(self, tcp: bool = False) -> str:
        """Start the redis-server; return where the benchmarked sides meet: its unix socket, as
        ``arbiter run`` connects them, or (``tcp``) loopback TCP, as containers that share a Redis do."""
        import redis

        self.redis.start()
        url = self.redis.url if tcp else self.redis.local_url
        self.transport = "Redis over loopback TCP" if tcp else "Redis over its unix socket, as arbiter run"
        self.conn = redis.Redis.from_url(url, socket_timeout=10)
        return url

    def listening(self) -> int:
        """Evaluators blocked in their wait for requests: arbiter's (a BLMOVE, see
        server/service/transport.py) and flatland-rl's (a BRPOP); agents wait with BLPOP."""
        return sum(1 for client in self.conn.client_list() if client.get("cmd") in ("blmove", "brpop"))

    def start_servers(self, starts: list[Callable[[], Proc]], timeout_s: float = 60.0) -> list[Proc]:
        """Start evaluators and wait until each blocks on its command list: agents then measure a
        ready evaluator (they would be correct without it: they retry their handshake)."""
        baseline = self.listening()
        servers = [start() for start in starts]
        deadline = time.monotonic() + timeout_s
        while self.listening() < baseline + len(servers):
            for proc in servers:
                if proc.popen.poll() is not None:
                    raise BenchError(f"{proc.name} exited with status {proc.popen.returncode}:\n{proc.tail()}")
            if time.monotonic() > deadline:
                print(f"bench: warning: servers not seen listening after {timeout_s:g} s; going on", file=sys.stderr)
                break
            time.sleep(0.02)
        return servers

    def evaluate(
        self, label: str, serve: list[str], agent: list[str], timeout_s: float, listening: Callable | None = None
    ) -> dict[str, Any]:
        """One evaluation: the evaluator ``serve`` until it listens (then ``listening()`` is
        called), then the agent; both must end well. Returns the agent's result."""
        (server,) = self.start_servers([lambda: self.procs.start(f"serve-{label}", serve)])
        if listening is not None:
            listening()
        agent_proc = self.procs.start(f"agent-{label}", agent)
        self.procs.wait([agent_proc, server], timeout_s)
        return agent_proc.result()

    def failed(self) -> bool:
        """Say so when the benchmark failed; the caller then exits 2."""
        if self.failure is not None:
            print(f"bench: FAILED: {self.failure}", file=sys.stderr)
        return self.failure is not None


@dataclass
class Runs:
    """What the runs of one benchmark share: its options, its session, where its sides meet."""

    args: Any
    session: BenchSession
    redis_url: str

    @property
    def procs(self) -> Processes:
        return self.session.procs

    def results_dir(self, service_id: str) -> Path:
        return self.session.workdir / "results" / service_id


def alternate_rounds(
    rounds: int, warmup: int, orders: tuple[Sequence[str], Sequence[str]], run: Callable[[str, str], dict[str, Any]],
    describe: Callable[[dict[str, Any]], str], after_round: Callable[[int], None] | None = None,
) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """``warmup`` unmeasured rounds (the first run of a path pays for cold caches), then ``rounds``
    measured ones; odd rounds run the paths in ``orders[0]``, even ones in ``orders[1]``, so that
    noise shows as spread. ``run(path, label)`` is one run; returns each path's measured runs."""
    runs: dict[str, list[dict[str, Any]]] = {path: [] for path in orders[0]}
    for round_ in range(1 - warmup, rounds + 1):
        counted = round_ > 0
        label = f"r{round_}" if counted else f"warmup{round_ + warmup}"
        for path in orders[round_ % 2 == 0]:
            result = run(path, label)
            if counted:
                runs[path].append(result)
            name = f"round {round_}" if counted else "warm-up"
            print(f"bench: {name} {path:<9} {describe(result)}{'' if counted else ' (not counted)'}", flush=True)
        if counted and after_round is not None:
            after_round(round_)
    return runs


def add_run_options(
    parser: argparse.ArgumentParser, *, workers: Iterable[str], rounds: int, warmup_rounds: int | None = 1,
    timeout_s: float = 600.0, reply_timeout_s: float = 120.0, tcp: bool = True,
) -> None:  # fmt: skip
    """The options every benchmark takes, and those of its worker mode (hidden from --help)."""
    parser.add_argument("--rounds", type=int, default=rounds, help=f"measured rounds (default {rounds})")
    if warmup_rounds is not None:
        parser.add_argument("--warmup", type=int, default=warmup_rounds,
                            help=f"unmeasured rounds first (default {warmup_rounds}; --quick: 0)")  # fmt: skip
    if tcp:
        parser.add_argument("--tcp", action="store_true", help="loopback TCP, not the unix socket arbiter run uses")
    parser.add_argument("--json", metavar="PATH", help="write the raw results here")
    parser.add_argument("--timeout", type=float, default=timeout_s, help=f"limit per run, s (default {timeout_s:g})")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, results)")
    parser.add_argument("--reply-timeout", type=float, default=reply_timeout_s, help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=sorted(workers), help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    parser.add_argument("--service-id", help=argparse.SUPPRESS)


def checks_report(mismatches: list[str], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {"match": not mismatches, "runs_checked": sum(map(len, runs.values())), "mismatches": mismatches}


def print_checks_and_time(report: dict[str, Any], same: str, where: str) -> None:
    """The checks' verdict (``same``: what every run had the same of, ``where`` it was seen), the time taken."""
    checks = report["checks"]
    if checks["match"]:
        print(f"{same}: identical in all {checks['runs_checked']} runs ({where})")
    for line in checks["mismatches"]:
        print(f"  MISMATCH {line}")
    print(f"{benchmark_time_line(report)}; raw results: {report.get('json_path') or '(no --json)'}")


def run_main(args: Any, workers: dict[str, Callable[[Any], int]], run: Callable[[Any], int],
             refusals: Iterable[tuple[bool, str]] = ()) -> int:  # fmt: skip
    """A worker's measured process, or the benchmark ``run(args)`` unless one of ``refusals``
    (whether it applies, why) does; a SIGTERM ends the benchmark like Ctrl-C, so that its session
    stops what it started."""
    if args.worker:
        return workers[args.worker](args)
    refusals = [(args.rounds < 1, "--rounds must be at least 1"), (args.warmup < 0, "--warmup must be at least 0"),
                (bool(getattr(args, "profile", None)) and shutil.which("py-spy") is None,
                 "--profile needs py-spy (pip install py-spy)"), *refusals]  # fmt: skip
    for applies, why in refusals:
        if applies:
            print(f"bench: {why}", file=sys.stderr)
            return 2
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # which raises KeyboardInterrupt
    return run(args)
