#!/usr/bin/env python3
"""Benchmark arbiter against a plain in-process loop and against flatland-rl's own evaluator.

    python scripts/bench.py [--rounds 5] [--warmup 1] [--preset bench] [--quick] [--full] [--json PATH]

One deterministic agent (actions a pure function of episode, step and handle) plays the same
reference test set (a preset generated with a fixed seed) four ways:

  direct    an in-process loop, no evaluator: load the env file, reset it with the evaluation
            seed, step until done (flatland's ``load_new``: its default rewards, its step
            recorder, its distance map computed at load);
  lean      the same loop on the env arbiter's client builds (the competition's rewards, no step
            recorder, the distance map computed when first read): the same env work as the
            arbiter agent, so arbiter/lean is what the evaluator itself costs;
  arbiter   ``arbiter serve`` in one process, the agent on ``arbiter.client.RemoteClient`` in
            another, over a redis-server this script starts on a free loopback port;
  flatland  flatland-rl's ``FlatlandRemoteEvaluationService`` in one process (main thread: it
            uses SIGALRM), the agent on its ``FlatlandRemoteClient`` in another.

The paths alternate within each round (direct, lean, arbiter, flatland, direct, ...) so that noise
shows as spread. Every agent runs in its own subprocess (``--worker MODE``, a mode of this
script) and measures itself after its imports: evaluation wall time (just before the first
env load or request to after submit), steps and arrivals per episode, and the time spent inside
each step call. To show where the time goes, the remote agents also time (by wrapping instance
attributes, ~1 µs a call; no library code is changed) the local ``env.step`` inside each
``env_step`` and the wait for each ``env_create`` reply. Both remote paths must see exactly the
direct loop's trajectories (same steps and arrivals per episode, on the client and on the server
side), else MISMATCH and exit 1.

Also measured (each can be skipped): protocol-only throughput (empty ENV_STEP requests through
arbiter's real transport and codec, no env), the client's env_create cost, the evaluator's
memory over many short episodes (next to a plain flatland loop over the same episodes, to tell
arbiter's growth from flatland's), and several concurrent evaluations on one Redis.

``--quick`` is a small, fast version for tests: 1 round, the first 2 envs, 50 episodes for the
memory check, 2 concurrent evaluations. Only 127.0.0.1 is used; every process this script
starts (and its redis-server) is stopped by pid on the way out, errors included.

Exit status: 0 all checks passed; 1 MISMATCH (trajectories, or scores of the concurrent runs);
2 a run failed, timed out or was interrupted.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
RESULT_MARK = "BENCH_RESULT "
EVAL_SEED = 1001  # flatland's evaluation seed, arbiter's default --seed
TESTSET_SEED = 42  # the reference test set: preset generated with this seed
HOST = "127.0.0.1"
PATHS = ("direct", "lean", "arbiter", "flatland")
LOCAL_PATHS = ("direct", "lean")  # in-process loops: no evaluator, nothing to wait for


class BenchError(RuntimeError):
    """A worker failed, timed out or produced no result."""


# ----------------------------------------------------------------------------------------
# The agent and small helpers shared by every path
# ----------------------------------------------------------------------------------------


def agent_actions(episode: int, step: int, num_agents: int) -> dict[int, int]:
    """The deterministic agent: the same dict of ints in every path."""
    return {handle: (episode * 7 + step * 3 + handle * 5) % 5 for handle in range(num_agents)}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (the definition arbiter's summary uses)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def step_stats(times: list[float]) -> dict[str, float]:
    if not times:
        return {"n": 0, "mean": 0.0, "p99": 0.0, "max": 0.0, "total": 0.0}
    return {
        "n": len(times),
        "mean": math.fsum(times) / len(times),
        "p99": percentile(times, 0.99),
        "max": max(times),
        "total": math.fsum(times),
    }


def ordered_env_paths(tests_dir: str) -> list[str]:
    """``Test_<t>/Level_<l>.pkl`` in flatland's evaluation order (t * 1000 + l), relative."""
    found = []
    for test_dir in Path(tests_dir).glob("Test_*"):
        for level in test_dir.glob("Level_*.pkl"):
            t, lv = int(test_dir.name.split("_")[1]), int(level.stem.split("_")[1])
            found.append((t, lv, f"{test_dir.name}/{level.name}"))
    return [rel for _, _, rel in sorted(found)]


def arrived_count(env: Any) -> int:
    from flatland.envs.step_utils.states import TrainState

    return sum(1 for agent in env.agents if agent.state == TrainState.DONE)


def vm_rss_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def emit(result: dict[str, Any]) -> None:
    print(RESULT_MARK + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------------------
# Workers: one process each; they import first, then measure
# ----------------------------------------------------------------------------------------


def _time_calls(owner: Any, name: str, sink: list[float], wanted: Callable[..., bool] = lambda *a, **k: True) -> None:
    """Wrap ``owner.name`` (an instance attribute, nothing is edited) to append the time of wanted calls."""
    original = getattr(owner, name, None)
    if original is None:
        return

    def timed(*args: Any, **kwargs: Any) -> Any:
        if not wanted(*args, **kwargs):
            return original(*args, **kwargs)
        before = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - before)

    setattr(owner, name, timed)


def _result(path: str, started_epoch: float, wall: float, episodes: list, steps: list, local: list, **extra: Any):
    return {
        "path": path,
        "wall_s": wall,
        "start_epoch": started_epoch,
        "end_epoch": started_epoch + wall,
        "episodes": episodes,
        "step_s": step_stats(steps),
        "local_step_s": step_stats(local),
        **extra,
    }


def worker_direct(args: argparse.Namespace) -> int:
    from flatland.core.env_observation_builder import DummyObservationBuilder
    from flatland.envs.persistence import RailEnvPersister

    def load(path: str) -> Any:
        env, _ = RailEnvPersister.load_new(path, obs_builder=DummyObservationBuilder())
        return env

    return _play_direct("direct", load, args)


def worker_lean(args: argparse.Namespace) -> int:
    from flatland.core.env_observation_builder import DummyObservationBuilder
    from flatland.envs.persistence import RailEnvPersister

    from arbiter.protocol.flatland_env import build_rail_env, rewards_for
    from arbiter.server.competition import load_competition
    from arbiter.server.scoring import RULES

    # What arbiter's client builds for the evaluation `arbiter serve` runs by default.
    reward_model = RULES[load_competition().scoring].reward_model

    def load(path: str) -> Any:
        env_dict = RailEnvPersister.load_env_dict(path)
        return build_rail_env(
            env_dict, obs_builder=DummyObservationBuilder(), rewards=rewards_for(reward_model), record_steps=False
        )

    return _play_direct("lean", load, args)


def _play_direct(path_name: str, load: Callable[[str], Any], args: argparse.Namespace) -> int:
    from flatland.envs.step_utils.states import TrainState  # noqa: F401 - imported before timing

    paths = ordered_env_paths(args.tests)
    step_times: list[float] = []
    creates: list[float] = []
    episodes = []
    rss: list[list[int]] = []
    clock = time.perf_counter
    started_epoch = time.time()
    started = clock()
    for index, rel in enumerate(paths):
        created = clock()
        env = load(os.path.join(args.tests, rel))
        env.reset(regenerate_rail=True, regenerate_schedule=True, random_seed=EVAL_SEED)
        creates.append(clock() - created)
        num_agents = env.get_num_agents()
        step = 0
        while True:
            actions = agent_actions(index, step, num_agents)
            before = clock()
            _, _, dones, _ = env.step(actions)
            step_times.append(clock() - before)
            step += 1
            if dones["__all__"]:
                break
        episodes.append({"env": rel, "agents": num_agents, "steps": step, "arrived": arrived_count(env)})
        if args.rss_self and (index == 0 or (index + 1) % args.rss_every == 0):
            rss.append([index + 1, vm_rss_kib(os.getpid()) or 0])
    wall = clock() - started
    emit(
        _result(
            path_name,
            started_epoch,
            wall,
            episodes,
            step_times,
            step_times,
            create_s=creates,
            create_wait_s=[0.0] * len(creates),
            create_total_s=math.fsum(creates),
            final_create_s=0.0,
            submit_s=0.0,
            handshake_s=0.0,
            rss_kib=rss,
        )
    )
    return 0


def _play_remote(
    path: str, client: Any, create_waits: list[float], env_path: Callable[[], str], args: Any, handshake_s: float
) -> int:
    """The agent loop shared by both clients; ``create_waits`` gets the reply wait of every env_create."""
    from flatland.core.env_observation_builder import DummyObservationBuilder

    clock = time.perf_counter
    obs_builder = DummyObservationBuilder()
    step_times: list[float] = []
    local_times: list[float] = []
    creates: list[float] = []
    episodes = []
    rss: list[list[int]] = []
    index = 0
    final_create = 0.0
    started_epoch = time.time()
    started = clock()
    while True:
        created = clock()
        observation, _ = client.env_create(obs_builder_object=obs_builder)
        took = clock() - created
        if not observation:
            final_create = took  # the closing env_create: the evaluator drains the last episode first
            break
        creates.append(took)
        env = client.env
        _time_calls(env, "step", local_times)  # the local env.step inside env_step
        num_agents = env.get_num_agents()
        step = 0
        while True:
            actions = agent_actions(index, step, num_agents)
            before = clock()
            _, _, dones, _ = client.env_step(actions)
            step_times.append(clock() - before)
            step += 1
            if dones["__all__"]:
                break
        episodes.append({"env": env_path(), "agents": num_agents, "steps": step, "arrived": arrived_count(env)})
        index += 1
        if args.rss_pid and (index == 1 or index % args.rss_every == 0):
            rss.append([index, vm_rss_kib(args.rss_pid) or 0])
    submitted = clock()
    scores = client.submit()
    end = clock()
    if args.rss_pid:
        rss.append([index, vm_rss_kib(args.rss_pid) or 0])
    emit(
        _result(
            path,
            started_epoch,
            end - started,
            episodes,
            step_times,
            local_times,
            create_s=creates,
            create_wait_s=create_waits[: len(creates)],
            create_total_s=math.fsum(creates),
            final_create_s=final_create,
            submit_s=end - submitted,
            handshake_s=handshake_s,
            scores=_jsonable(scores),
            rss_kib=rss,
        )
    )
    return 0


def worker_arbiter(args: argparse.Namespace) -> int:
    import flatland.core.env_observation_builder  # noqa: F401 - imported before timing

    from arbiter.client import RemoteClient
    from arbiter.protocol.messages import FLATLAND_RL

    before = time.perf_counter()
    client = RemoteClient(redis_url=args.redis_url, service_id=args.service_id, reply_timeout_s=args.reply_timeout)
    handshake = time.perf_counter() - before
    waits: list[float] = []
    _time_calls(client, "_request", waits, lambda type_, *a, **k: type_ == FLATLAND_RL.ENV_CREATE)
    try:
        return _play_remote("arbiter", client, waits, lambda: str(client.current_env_path), args, handshake)
    finally:
        client.close()


def worker_flatland_client(args: argparse.Namespace) -> int:
    from flatland.evaluators import messages
    from flatland.evaluators.client import FlatlandRemoteClient

    before = time.perf_counter()
    client = FlatlandRemoteClient(
        test_env_folder=args.tests, flatland_rl_service_id=args.service_id, remote_host=HOST, remote_port=args.port
    )
    handshake = time.perf_counter() - before
    waits: list[float] = []
    _time_calls(
        client,
        "_remote_request",
        waits,
        lambda request, *a, **k: request.get("type") == messages.FLATLAND_RL.ENV_CREATE,
    )
    rel = lambda: os.path.relpath(client.current_env_path, args.tests)  # noqa: E731
    return _play_remote("flatland", client, waits, rel, args, handshake)


def worker_flatland_service(args: argparse.Namespace) -> int:
    """flatland-rl's own evaluator, unmodified, as the main thread of this process."""
    from flatland.evaluators import messages
    from flatland.evaluators.service import FlatlandRemoteEvaluationService

    service = FlatlandRemoteEvaluationService(
        test_env_folder=args.tests,
        flatland_rl_service_id=args.service_id,
        remote_host=HOST,
        remote_port=args.port,
        result_output_path=args.results,
    )
    outcome = service.run()
    metadata = service.evaluation_metadata_df
    episodes = []
    for rel, steps, complete in zip(
        service.simulation_env_file_paths,
        service.simulation_steps,
        service.simulation_percentage_complete,
        strict=False,
    ):
        agents = int(metadata.loc[rel, "n_agents"])
        episodes.append({"env": rel, "agents": agents, "steps": int(steps), "arrived": round(complete * agents)})
    emit(
        {
            "outcome": outcome.get("type"),
            "server_step_mean_s": service.stats.get("internal_env_step_time_mean"),
            "server_step_max_s": service.stats.get("internal_env_step_time_max"),
            "server_steps": service.stats.get("internal_env_step_time_counter"),
            "episodes": episodes,
        }
    )
    return 0 if outcome.get("type") == messages.FLATLAND_RL.ENV_SUBMIT_RESPONSE else 1


def worker_proto_server(args: argparse.Namespace) -> int:
    """An evaluator-like loop without envs: arbiter's transport pops, arbiter's codec decodes."""
    from arbiter.protocol import codec
    from arbiter.protocol.messages import FLATLAND_RL, reply
    from arbiter.server.transport import RedisTransport

    transport = RedisTransport(args.redis_url, args.service_id)
    transport.clear()
    clock = time.perf_counter
    steps = 0
    decode_s = 0.0
    first_step = last_step = None
    try:
        while True:
            raw = transport.pop(time.monotonic() + args.idle_timeout)
            if raw is None:
                emit({"error": f"no request for {args.idle_timeout} s after {steps} steps"})
                return 1
            before = clock()
            message = codec.decode(raw, codec.COMMAND_LIMITS)
            decode_s += clock() - before
            kind = message.get("type")
            if kind == FLATLAND_RL.ENV_STEP:
                if first_step is None:
                    first_step = before
                last_step = clock()
                steps += 1
                message["payload"].get("action")
            elif kind == FLATLAND_RL.PING:
                transport.reply(message["response_channel"], codec.encode(reply(FLATLAND_RL.PONG, {})))
            elif kind == FLATLAND_RL.ENV_SUBMIT:
                transport.reply(
                    message["response_channel"], codec.encode(reply(FLATLAND_RL.ENV_SUBMIT_RESPONSE, {"steps": steps}))
                )
                break
    finally:
        transport.close()
    span = (last_step - first_step) if first_step is not None and last_step is not None else 0.0
    emit({"steps_read": steps, "decode_mean_s": decode_s / max(steps, 1), "server_span_s": span})
    return 0


def worker_proto_client(args: argparse.Namespace) -> int:
    """Pushes empty ENV_STEP requests exactly as RemoteClient.env_step does (its _send_step)."""
    from arbiter.client import RemoteClient

    client = RemoteClient(redis_url=args.redis_url, service_id=args.service_id, reply_timeout_s=args.reply_timeout)
    clock = time.perf_counter
    last_step_end = time.monotonic()
    started = clock()
    for _ in range(args.n):
        collect = client._send_step({"action": {}, "inference_time": time.monotonic() - last_step_end})
        if collect is not None:
            collect()
        last_step_end = time.monotonic()
    sent = clock()
    answer = client.submit()  # queued behind every step: answered once the server read them all
    done = clock()
    client.close()
    emit(
        {
            "n": args.n,
            "send_s": sent - started,
            "elapsed_s": done - started,
            "steps_per_s": args.n / (done - started),
            "client_call_mean_s": (sent - started) / args.n,
            "server_steps": answer.get("steps"),
        }
    )
    return 0


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


WORKERS = {
    "direct": worker_direct,
    "lean": worker_lean,
    "arbiter": worker_arbiter,
    "flatland": worker_flatland_client,
    "flatland-service": worker_flatland_service,
    "proto-server": worker_proto_server,
    "proto-client": worker_proto_client,
}


# ----------------------------------------------------------------------------------------
# The orchestrator: processes, Redis, test sets
# ----------------------------------------------------------------------------------------


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

    def __init__(self, workdir: Path):
        self.workdir = workdir
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
        return self.start(name, [sys.executable, str(HERE), "--worker", mode, *options], env=env)

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
    """Connections whose last command was BRPOP: evaluators waiting for requests."""
    return sum(1 for client in conn.client_list() if client.get("cmd") == "brpop")


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


def new_service_id(label: str) -> str:
    return f"bench-{label}-{uuid.uuid4().hex[:8]}"


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path, procs: Processes, redis_url: str, redis_port: int):
        import redis

        self.args = args
        self.workdir = workdir
        self.procs = procs
        self.redis_url = redis_url
        self.redis_port = redis_port
        self.conn = redis.Redis.from_url(redis_url, socket_timeout=10)

    # -- the three paths -------------------------------------------------------------------

    def run_direct(self, tests: Path, label: str, mode: str = "direct") -> dict[str, Any]:
        agent = self.procs.worker(f"{mode}-{label}", mode, "--tests", str(tests))
        self.procs.wait([agent], self.args.timeout)
        return agent.result()

    def run_lean(self, tests: Path, label: str) -> dict[str, Any]:
        return self.run_direct(tests, label, mode="lean")

    def run_lean_pair(self, tests: Path, label: str) -> list[dict[str, Any]]:
        """Two lean loops started together, no evaluator: how much two busy processes slow
        each other on this machine, right now (an evaluator steps its copy next to the agent)."""
        agents = [self.procs.worker(f"lean-pair{n}-{label}", "lean", "--tests", str(tests)) for n in (1, 2)]
        self.procs.wait(agents, self.args.timeout)
        return [agent.result() for agent in agents]

    def start_arbiter_server(self, tests: Path, service_id: str, results: Path) -> Proc:
        argv = [sys.executable, "-m", "arbiter.server.cli", "serve", "--tests", str(tests), "--redis-url",
                self.redis_url, "--service-id", service_id, "--results", str(results), "--quiet"]  # fmt: skip
        return self.procs.start(f"arbiter-serve-{service_id}", argv)

    def arbiter_agent(self, name: str, service_id: str, *extra: str) -> Proc:
        return self.procs.worker(
            name, "arbiter", "--redis-url", self.redis_url, "--service-id", service_id,
            "--reply-timeout", str(self.args.reply_timeout), *extra,
        )  # fmt: skip

    def run_arbiter(self, tests: Path, label: str) -> dict[str, Any]:
        service_id = new_service_id(label)
        results = self.workdir / "results" / service_id
        baseline = brpop_clients(self.conn)
        server = self.start_arbiter_server(tests, service_id, results)
        wait_until_listening(self.conn, [server], baseline)
        agent = self.arbiter_agent(f"arbiter-agent-{label}", service_id)
        self.procs.wait([agent, server], self.args.timeout)
        out = agent.result()
        out.update(read_arbiter_results(results))
        return out

    def run_flatland(self, tests: Path, label: str) -> dict[str, Any]:
        service_id = new_service_id(label)
        results = self.workdir / "results" / f"{service_id}.csv"
        baseline = brpop_clients(self.conn)
        port = str(self.redis_port)
        server = self.procs.worker(
            f"flatland-service-{label}", "flatland-service", "--tests", str(tests), "--service-id", service_id,
            "--port", port, "--results", str(results), env={"TEST_MIN_PERCENTAGE_COMPLETE_MEAN": "0"},
        )  # fmt: skip
        wait_until_listening(self.conn, [server], baseline)
        agent = self.procs.worker(
            f"flatland-agent-{label}", "flatland", "--tests", str(tests), "--service-id", service_id, "--port", port
        )
        self.procs.wait([agent, server], self.args.timeout)
        out = agent.result()
        served = server.result()
        out["server_step_mean_s"] = served["server_step_mean_s"]
        out["server_episodes"] = served["episodes"]
        return out

    # -- extras ----------------------------------------------------------------------------

    def run_protocol(self, n: int) -> dict[str, Any]:
        service_id = new_service_id("proto")
        baseline = brpop_clients(self.conn)
        server = self.procs.worker(
            "proto-server", "proto-server", "--redis-url", self.redis_url, "--service-id", service_id
        )
        wait_until_listening(self.conn, [server], baseline)
        client = self.procs.worker(
            "proto-client", "proto-client", "--redis-url", self.redis_url, "--service-id", service_id, "--n", str(n),
            "--reply-timeout", str(self.args.reply_timeout),
        )  # fmt: skip
        self.procs.wait([client, server], self.args.timeout)
        out = client.result()
        served = server.result()
        out["server_steps_read"] = served["steps_read"]
        out["server_decode_mean_s"] = served["decode_mean_s"]
        out["server_span_s"] = served["server_span_s"]
        if served["steps_read"] != n:
            raise BenchError(f"protocol: the server read {served['steps_read']} of {n} steps")
        return out

    def run_memory(self, episodes: int, every: int) -> dict[str, Any]:
        from arbiter.server.testsets import cached_test_set

        tiny = cached_test_set("tiny", TESTSET_SEED, cache_dir=self.args.cache_dir)
        tests = replicated_test_set(tiny, self.workdir / f"memory-{episodes}", episodes)
        service_id = new_service_id("memory")
        results = self.workdir / "results" / service_id
        baseline = brpop_clients(self.conn)
        server = self.start_arbiter_server(tests, service_id, results)
        wait_until_listening(self.conn, [server], baseline)
        agent = self.arbiter_agent("memory-agent", service_id, "--rss-pid", str(server.pid), "--rss-every", str(every))
        self.procs.wait([agent, server], self.args.timeout * max(1, episodes / 200))
        out = agent.result()
        summary = read_arbiter_results(results)
        report = {"episodes": episodes, "every": every, "state": summary["state"], "wall_s": out["wall_s"]}
        report.update(rss_growth(out["rss_kib"], every))
        report["episodes_played"] = len(out["episodes"])
        if self.args.memory_baseline:
            # The same episodes in a plain flatland loop in one process: is the growth arbiter's or flatland's?
            loop = self.procs.worker(
                "memory-direct", "direct", "--tests", str(tests), "--rss-self", "--rss-every", str(every)
            )
            self.procs.wait([loop], self.args.timeout * max(1, episodes / 200))
            report["direct_loop"] = rss_growth(loop.result()["rss_kib"], every)
        return report

    def run_scale(self, tests: Path, count: int, reference_summary: dict[str, Any]) -> dict[str, Any]:
        service_ids = [new_service_id(f"scale{i}") for i in range(count)]
        baseline = brpop_clients(self.conn)
        servers = [self.start_arbiter_server(tests, sid, self.workdir / "results" / sid) for sid in service_ids]
        wait_until_listening(self.conn, servers, baseline)
        agents = [self.arbiter_agent(f"scale-agent-{i}", sid) for i, sid in enumerate(service_ids)]
        self.procs.wait(agents + servers, self.args.timeout * count)
        runs = []
        for sid, agent in zip(service_ids, agents, strict=True):
            out = agent.result()
            out.update(read_arbiter_results(self.workdir / "results" / sid))
            out["service_id"] = sid
            runs.append(out)
        return {"count": count, "runs": runs, "reference_score": reference_summary}


# Flat: under 16 KiB an episode (what the evaluator keeps of each episode: its record, its results
# row, its step timings), where a leak of flatland envs costs megabytes an episode.
FLAT_KIB_PER_EPISODE = 16


def rss_growth(samples: list[list[int]], every: int) -> dict[str, Any]:
    """Growth between the first and the last periodic sample (taken every ``every`` episodes;
    the one after episode 1 is a baseline, one taken after submit is reported apart)."""
    samples = [s for s in samples if s[1] > 0]
    periodic = [s for s in samples if s[0] % every == 0] or samples
    during = [s for i, s in enumerate(periodic) if i == 0 or s[0] != periodic[i - 1][0]]  # first at each count
    first, last = during[0], during[-1]
    growth = (last[1] - first[1]) / first[1] if first[1] else None
    per_episode = (last[1] - first[1]) / (last[0] - first[0]) if last[0] > first[0] else None
    return {
        "samples_kib": samples,
        "first": first,
        "last": last,
        "after_submit": periodic[-1] if periodic[-1] is not last else None,
        "growth": growth,
        "kib_per_episode": per_episode,
        "flat": per_episode is not None and per_episode < FLAT_KIB_PER_EPISODE,
    }


def read_arbiter_results(results: Path) -> dict[str, Any]:
    with open(results / "summary.json", encoding="utf-8") as handle:
        summary = json.load(handle)
    with open(results / "episodes.jsonl", encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    step = (summary.get("timing") or {}).get("server_step_s") or {}
    think = (summary.get("timing") or {}).get("step_think_s") or {}
    return {
        "state": summary.get("state"),
        "score": {k: (summary.get("score") or {}).get(k) for k in ("primary", "secondary")},
        "server_step_mean_s": step.get("mean"),
        "server_think_mean_s": think.get("mean"),
        "server_evaluation_s": (summary.get("timing") or {}).get("evaluation_s"),
        "server_episodes": [
            {"env": r["env"], "agents": r["num_agents"], "steps": r["steps"], "arrived": r["arrived"]} for r in records
        ],
    }


# ----------------------------------------------------------------------------------------
# Checks, aggregation, the table
# ----------------------------------------------------------------------------------------


def compare(label: str, reference: list[dict[str, Any]], seen: list[dict[str, Any]]) -> list[str]:
    problems = []
    if len(seen) != len(reference):
        problems.append(f"{label}: {len(seen)} episodes, the direct loop played {len(reference)}")
    for ref, got in zip(reference, seen, strict=False):
        for key in ("env", "steps", "arrived"):
            if ref[key] != got[key]:
                problems.append(f"{label}: {ref['env']}: {key} {got[key]!r}, direct {ref[key]!r}")
    return problems


def contention_summary(pairs: list[list[dict[str, Any]]], lean_runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Each round's pair against that round's lean loop alone: mean pair wall / alone wall."""
    if not pairs:
        return None
    factors = [
        statistics.fmean(r["wall_s"] for r in pair) / alone["wall_s"]
        for pair, alone in zip(pairs, lean_runs, strict=True)
    ]
    return {
        "pair_walls_s": [[r["wall_s"] for r in pair] for pair in pairs],
        "factor_per_round": factors,
        "factor_median": statistics.median(factors),
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _median_of(runs: list[dict[str, Any]], get: Callable[[dict[str, Any]], float | None]) -> float | None:
    values = [v for v in (get(run) for run in runs) if v is not None]
    return statistics.median(values) if values else None


def summarise_path(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One path over its rounds: medians across rounds (and the spread of the wall time)."""
    walls = [run["wall_s"] for run in runs]
    creates = [c for run in runs for c in run["create_s"]]
    waits = [w for run in runs for w in run["create_wait_s"]]
    steps = sum(e["steps"] for e in runs[0]["episodes"])

    def step_total(run: dict[str, Any]) -> float:
        return run["step_s"]["total"]

    def other(run: dict[str, Any]) -> float:
        accounted = step_total(run) + run["create_total_s"] + run["final_create_s"] + run["submit_s"]
        return run["wall_s"] - accounted

    return {
        "wall_s": spread(walls),
        "steps": steps,
        "steps_per_s": steps / statistics.median(walls),
        "client_step_mean_s": _median_of(runs, lambda r: r["step_s"]["mean"]),
        "client_step_p99_s": _median_of(runs, lambda r: r["step_s"]["p99"]),
        "local_step_mean_s": _median_of(runs, lambda r: r["local_step_s"]["mean"]),
        "step_overhead_mean_s": _median_of(runs, lambda r: r["step_s"]["mean"] - r["local_step_s"]["mean"]),
        "env_create_median_s": statistics.median(creates) if creates else None,
        "env_create_wait_median_s": statistics.median(waits) if waits else None,
        "server_step_mean_s": _median_of(runs, lambda r: r.get("server_step_mean_s")),
        "server_think_mean_s": _median_of(runs, lambda r: r.get("server_think_mean_s")),
        # Where the agent's wall time goes (seconds, median over rounds).
        "breakdown_s": {
            "local_env_step": _median_of(runs, lambda r: r["local_step_s"]["total"]),
            "step_wire": _median_of(runs, lambda r: step_total(r) - r["local_step_s"]["total"]),
            "create_wait": _median_of(runs, lambda r: math.fsum(r["create_wait_s"])),
            "create_local": _median_of(runs, lambda r: r["create_total_s"] - math.fsum(r["create_wait_s"])),
            "final_create": _median_of(runs, lambda r: r["final_create_s"]),
            "submit": _median_of(runs, lambda r: r["submit_s"]),
            "agent_other": _median_of(runs, other),
        },
        "runs": [
            {
                "wall_s": run["wall_s"],
                "step_s": run["step_s"],
                "local_step_s": run["local_step_s"],
                "create_s": run["create_s"],
                "create_wait_s": run["create_wait_s"],
                "final_create_s": run["final_create_s"],
                "submit_s": run["submit_s"],
                "handshake_s": run.get("handshake_s"),
                "server_step_mean_s": run.get("server_step_mean_s"),
                "server_think_mean_s": run.get("server_think_mean_s"),
            }
            for run in runs
        ],
    }


def ms(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value * 1e3:.{digits}f}"


def _memory_line(label: str, memory: dict[str, Any]) -> str:
    growth, per_episode = memory["growth"], memory.get("kib_per_episode")
    first, last = memory["first"], memory["last"]
    verdict = "flat" if memory["flat"] else "GROWING"
    after = memory.get("after_submit")
    return (
        f"{label}: {first[1] / 1024:.1f} MiB after episode {first[0]} → {last[1] / 1024:.1f} MiB after episode "
        f"{last[0]} ({'n/a' if growth is None else f'{growth * 100:+.1f} %'}, "
        f"{'n/a' if per_episode is None else f'{per_episode:+.1f} KiB per episode'}, {verdict})"
        + (f"; {after[1] / 1024:.1f} MiB after submit" if after else "")
        + f"; samples (episode: MiB) {', '.join(f'{s[0]}: {s[1] / 1024:.0f}' for s in memory['samples_kib'])}"
    )


def print_table(report: dict[str, Any]) -> None:
    cfg = report["config"]
    mach = report["machine"]
    paths = report["paths"]
    ref = report["reference"]
    print()
    print(
        f"arbiter benchmark — preset {cfg['preset']} (seed {cfg['testset_seed']}), {len(ref)} envs, "
        f"{sum(e['steps'] for e in ref)} steps; {cfg['rounds']} round(s); {mach['cpus']} CPUs, "
        f"Python {mach['python']}, flatland-rl {mach['flatland']}, arbiter {mach['arbiter_rev']}; "
        f"load average at start {mach['loadavg_start']}"
    )
    print("reference trajectories (the direct loop; both remote paths must match, client and server side):")
    for e in ref:
        print(f"  {e['env']}: {e['agents']} agents, {e['steps']} steps, {e['arrived']} arrived")
    print()
    header = (
        f"{'path':<9} {'wall s: median [min–max]':<26} {'steps/s':>7}  {'client step ms mean/p99':>23}  "
        f"{'in env.step':>11}  {'wire/step':>9}  {'server step':>11}  {'env_create ms (wait)':>20}"
    )
    print(header)
    print("-" * len(header))
    for name in PATHS:
        p = paths[name]
        wall = p["wall_s"]
        wait = "" if name in LOCAL_PATHS else f" ({ms(p['env_create_wait_median_s'], 1)})"
        print(
            f"{name:<9} {wall['median']:>7.3f} [{wall['min']:.3f}–{wall['max']:.3f}]{'':<3} {p['steps_per_s']:>7.0f}  "
            f"{ms(p['client_step_mean_s'], 3) + ' / ' + ms(p['client_step_p99_s'], 3):>23}  "
            f"{ms(p['local_step_mean_s'], 3):>11}  {ms(p['step_overhead_mean_s'], 3):>9}  "
            f"{ms(p['server_step_mean_s'], 3):>11}  {ms(p['env_create_median_s'], 1) + wait:>20}"
        )
    print(
        "(times per step in ms; 'in env.step' is the local env.step inside the client's env_step, 'wire/step' the rest)"
    )
    print()
    print("where the agent's wall time goes (s, median over rounds):")
    keys = ["local_env_step", "step_wire", "create_wait", "create_local", "final_create", "submit", "agent_other"]
    print(f"{'path':<9} " + " ".join(f"{k:>14}" for k in keys) + f" {'wall':>8}")
    for name in PATHS:
        b = paths[name]["breakdown_s"]
        print(f"{name:<9} " + " ".join(f"{b[k]:>14.3f}" for k in keys) + f" {paths[name]['wall_s']['median']:>8.3f}")
    print(
        "(create_wait: waiting for the evaluator's env_create reply; create_local: loading/building + reset in the "
        "agent; final_create: the closing env_create, which waits for the evaluator to finish the last episode)"
    )
    ratios = report["ratios"]
    print()
    print(
        f"ratios of median wall times: arbiter/direct = {ratios['arbiter_over_direct']:.3f}, "
        f"arbiter/lean = {ratios['arbiter_over_lean']:.3f}, arbiter/flatland = {ratios['arbiter_over_flatland']:.3f}"
    )
    paired = ratios["median_of_round_ratios"]
    print(
        f"median of the per-round ratios: arbiter/direct = {paired['arbiter_over_direct']:.3f}, "
        f"arbiter/lean = {paired['arbiter_over_lean']:.3f}, arbiter/flatland = {paired['arbiter_over_flatland']:.3f}"
    )
    for r in ratios["per_round"]:
        print(
            f"  round {r['round']}: direct {r['direct_s']:.3f} s, lean {r['lean_s']:.3f} s, arbiter "
            f"{r['arbiter_s']:.3f} s, flatland {r['flatland_s']:.3f} s → arbiter/direct "
            f"{r['arbiter_over_direct']:.3f}, arbiter/lean {r['arbiter_over_lean']:.3f}, "
            f"arbiter/flatland {r['arbiter_over_flatland']:.3f}"
        )
    print(
        "(direct: flatland's load_new, with its default rewards, step recorder and eager distance map; lean: the "
        "env arbiter's client builds, so arbiter/lean is the evaluator's own cost)"
    )
    contention = report.get("contention")
    if contention:
        print(
            f"two lean loops at once (independent processes, no evaluator): each took "
            f"{contention['factor_median']:.3f}× its time alone (median over rounds; "
            + ", ".join(f"{f:.2f}" for f in contention["factor_per_round"])
            + "): what two busy processes cost each other on this machine now"
        )
    a = paths["arbiter"]
    if a.get("server_think_mean_s") is not None:
        print(
            f"arbiter server (summary.json): step {ms(a['server_step_mean_s'], 3)} ms mean; the agent's time between "
            f"steps as the server sees it (step_think_s) {ms(a['server_think_mean_s'], 3)} ms mean"
        )
    trajectories = report["trajectories"]
    if trajectories["match"]:
        print(f"trajectories: identical in all {trajectories['runs_checked']} runs (client and server side)")
    else:
        print("trajectories: MISMATCH")
        for line in trajectories["mismatches"]:
            print(f"  MISMATCH {line}")

    proto = report.get("protocol")
    if proto:
        print()
        print(
            f"protocol only: {proto['n']} empty ENV_STEP requests in {proto['elapsed_s']:.3f} s = "
            f"{proto['steps_per_s']:.0f} steps/s; client {proto['client_call_mean_s'] * 1e6:.1f} µs per "
            f"send+collect (all sent after {proto['send_s']:.3f} s); server read them in "
            f"{proto['server_span_s']:.3f} s "
            f"({proto['server_steps_read'] / max(proto['server_span_s'], 1e-9):.0f}/s), decode "
            f"{proto['server_decode_mean_s'] * 1e6:.1f} µs per request"
        )
    creates = report.get("env_create")
    if creates:
        print(
            "env_create on the client, median per episode: "
            f"arbiter {ms(creates['arbiter_s'], 1)} ms, flatland {ms(creates['flatland_s'], 1)} ms "
            f"(direct load+reset {ms(creates['direct_s'], 1)} ms, lean {ms(creates['lean_s'], 1)} ms); "
            f"arbiter/flatland {creates['arbiter_over_flatland']:.2f}"
        )
    memory = report.get("memory")
    if memory:
        print(_memory_line(f"server memory (arbiter serve VmRSS, {memory['episodes']} tiny episodes)", memory))
        if memory.get("direct_loop"):
            print(_memory_line("  the same episodes in a plain flatland loop (one process)", memory["direct_loop"]))
    scale = report.get("scale")
    if scale:
        print(
            f"scale: {scale['count']} concurrent evaluations on one Redis: "
            f"{'all match the single run' if scale['consistent'] else 'MISMATCH'}; aggregate "
            f"{scale['aggregate_steps_per_s']:.0f} steps/s over {scale['span_s']:.2f} s vs "
            f"{scale['single_steps_per_s']:.0f} steps/s alone (×{scale['speedup']:.2f}); wall per evaluation "
            f"{' '.join(f'{w:.2f}' for w in scale['walls_s'])} s"
        )
        for line in scale["mismatches"]:
            print(f"  MISMATCH {line}")
    print()
    print(f"benchmark time: {report['total_s']:.1f} s; raw results: {report.get('json_path') or '(no --json)'}")


def machine_info() -> dict[str, Any]:
    from importlib.metadata import version

    try:
        rev = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return {
        "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "flatland": version("flatland-rl"),
        "arbiter_rev": rev or "unknown",
    }


# ----------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------


def run_benchmark(args: argparse.Namespace) -> int:
    from arbiter.server.embedded_redis import EmbeddedRedis, free_port
    from arbiter.server.testsets import cached_test_set

    began = time.monotonic()
    if args.quick:
        args.rounds = 1
        args.warmup = 0
        envs = 2
        memory_episodes = 50
        concurrent = 2
        proto_n = 5000
    else:
        envs = args.envs
        memory_episodes = 1000 if args.full else 200
        concurrent = args.concurrent
        proto_n = args.protocol_steps
    memory_every = 100 if memory_episodes >= 200 else max(1, memory_episodes // 5)

    full_set = cached_test_set(args.preset, TESTSET_SEED, cache_dir=args.cache_dir)
    workdir = Path(tempfile.mkdtemp(prefix="arbiter-bench-"))
    procs = Processes(workdir)
    redis_server = EmbeddedRedis(port=free_port())
    failure: str | None = None
    report: dict[str, Any] = {}
    try:
        tests = full_set
        if envs and envs < len(ordered_env_paths(str(full_set))):
            tests = subset_test_set(full_set, workdir / f"tests-first{envs}", envs)
        redis_server.start()
        bench = Bench(args, workdir, procs, redis_server.url, redis_server.port)
        runners = {
            "direct": bench.run_direct,
            "lean": bench.run_lean,
            "arbiter": bench.run_arbiter,
            "flatland": bench.run_flatland,
        }
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in PATHS}
        pairs: list[list[dict[str, Any]]] = []  # two lean loops at once, per round (--no-contention: none)
        for _ in range(args.warmup):
            # Unmeasured: the first run of each path pays for cold file and CPU caches.
            for name in PATHS:
                result = runners[name](tests, "warmup")
                print(f"bench: warm-up  {name:<8} wall {result['wall_s']:.3f} s (not counted)", flush=True)
        for round_ in range(1, args.rounds + 1):
            for name in PATHS:
                result = runners[name](tests, f"r{round_}")
                runs[name].append(result)
                print(
                    f"bench: round {round_} {name:<8} wall {result['wall_s']:.3f} s, "
                    f"step mean {result['step_s']['mean'] * 1e3:.3f} ms",
                    flush=True,
                )
            if not args.no_contention:
                pair = bench.run_lean_pair(tests, f"r{round_}")
                pairs.append(pair)
                walls = " and ".join(f"{r['wall_s']:.3f}" for r in pair)
                print(f"bench: round {round_} lean ×2   wall {walls} s (two at once)", flush=True)

        reference = runs["direct"][0]["episodes"]
        mismatches: list[str] = []
        checked = 0
        for name in PATHS:
            for i, run in enumerate(runs[name], start=1):
                mismatches += compare(f"{name} round {i} (client)", reference, run["episodes"])
                checked += 1
                if "server_episodes" in run:
                    mismatches += compare(f"{name} round {i} (server)", reference, run["server_episodes"])
        for i, pair in enumerate(pairs, start=1):
            for run in pair:
                mismatches += compare(f"lean ×2 round {i}", reference, run["episodes"])
        for i, run in enumerate(runs["arbiter"], start=1):
            if run.get("state") != "SUCCESS":
                mismatches.append(f"arbiter round {i}: evaluation state {run.get('state')}")

        summaries = {name: summarise_path(runs[name]) for name in PATHS}
        medians = {name: summaries[name]["wall_s"]["median"] for name in PATHS}
        report = {
            "config": {
                "preset": args.preset,
                "testset_seed": TESTSET_SEED,
                "eval_seed": EVAL_SEED,
                "rounds": args.rounds,
                "warmup_rounds": args.warmup,
                "envs": len(reference),
                "quick": args.quick,
                "full": args.full,
                "tests": str(tests),
                "agent": "(episode * 7 + step * 3 + handle * 5) % 5",
            },
            "machine": machine_info(),
            "reference": reference,
            "paths": summaries,
            "raw_runs": runs,
            "ratios": {
                "arbiter_over_direct": medians["arbiter"] / medians["direct"],
                "arbiter_over_lean": medians["arbiter"] / medians["lean"],
                "arbiter_over_flatland": medians["arbiter"] / medians["flatland"],
                # Paired: each round's paths ran back to back, so slow drift of the machine cancels.
                "median_of_round_ratios": {
                    "arbiter_over_direct": statistics.median(
                        a["wall_s"] / d["wall_s"] for a, d in zip(runs["arbiter"], runs["direct"], strict=True)
                    ),
                    "arbiter_over_lean": statistics.median(
                        a["wall_s"] / d["wall_s"] for a, d in zip(runs["arbiter"], runs["lean"], strict=True)
                    ),
                    "arbiter_over_flatland": statistics.median(
                        a["wall_s"] / f["wall_s"] for a, f in zip(runs["arbiter"], runs["flatland"], strict=True)
                    ),
                },
                "per_round": [
                    {
                        "round": i + 1,
                        "direct_s": runs["direct"][i]["wall_s"],
                        "lean_s": runs["lean"][i]["wall_s"],
                        "arbiter_s": runs["arbiter"][i]["wall_s"],
                        "flatland_s": runs["flatland"][i]["wall_s"],
                        "arbiter_over_direct": runs["arbiter"][i]["wall_s"] / runs["direct"][i]["wall_s"],
                        "arbiter_over_lean": runs["arbiter"][i]["wall_s"] / runs["lean"][i]["wall_s"],
                        "arbiter_over_flatland": runs["arbiter"][i]["wall_s"] / runs["flatland"][i]["wall_s"],
                    }
                    for i in range(args.rounds)
                ],
            },
            "trajectories": {"match": not mismatches, "runs_checked": checked, "mismatches": mismatches},
            "contention": contention_summary(pairs, runs["lean"]),
            "trajectories_match": not mismatches,
            "env_create": {
                "direct_s": summaries["direct"]["env_create_median_s"],
                "lean_s": summaries["lean"]["env_create_median_s"],
                "arbiter_s": summaries["arbiter"]["env_create_median_s"],
                "flatland_s": summaries["flatland"]["env_create_median_s"],
                "arbiter_over_flatland": summaries["arbiter"]["env_create_median_s"]
                / summaries["flatland"]["env_create_median_s"],
            },
        }

        if not args.no_protocol:
            print(f"bench: protocol-only throughput, {proto_n} steps", flush=True)
            report["protocol"] = bench.run_protocol(proto_n)
        if not args.no_memory:
            print(f"bench: server memory over {memory_episodes} tiny episodes", flush=True)
            report["memory"] = bench.run_memory(memory_episodes, memory_every)
        if not args.no_scale and concurrent > 0:
            print(f"bench: {concurrent} concurrent evaluations", flush=True)
            single = runs["arbiter"][0]
            scale = bench.run_scale(tests, concurrent, single["score"])
            scale_problems = []
            for i, run in enumerate(scale["runs"]):
                scale_problems += compare(f"scale evaluation {i} (client)", reference, run["episodes"])
                scale_problems += compare(f"scale evaluation {i} (server)", reference, run["server_episodes"])
                if run["state"] != "SUCCESS":
                    scale_problems.append(f"scale evaluation {i}: state {run['state']}")
                if run["score"] != single["score"]:
                    scale_problems.append(f"scale evaluation {i}: score {run['score']}, single run {single['score']}")
            span = max(r["end_epoch"] for r in scale["runs"]) - min(r["start_epoch"] for r in scale["runs"])
            total_steps = sum(sum(e["steps"] for e in r["episodes"]) for r in scale["runs"])
            single_rate = summaries["arbiter"]["steps_per_s"]
            report["scale"] = {
                "count": concurrent,
                "consistent": not scale_problems,
                "mismatches": scale_problems,
                "span_s": span,
                "total_steps": total_steps,
                "aggregate_steps_per_s": total_steps / span,
                "single_steps_per_s": single_rate,
                "speedup": (total_steps / span) / single_rate,
                "walls_s": [r["wall_s"] for r in scale["runs"]],
                "client_step_mean_s": [r["step_s"]["mean"] for r in scale["runs"]],
                "server_step_mean_s": [r["server_step_mean_s"] for r in scale["runs"]],
                "scores": [r["score"] for r in scale["runs"]],
                "single_score": single["score"],
            }
    except BenchError as exc:
        failure = str(exc)
    except KeyboardInterrupt:
        failure = "interrupted"
    finally:
        procs.stop_all()
        redis_server.stop()
        if args.keep:
            print(f"bench: work folder kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    if failure is not None:
        print(f"bench: FAILED: {failure}", file=sys.stderr)
        return 2
    report["total_s"] = time.monotonic() - began
    report["json_path"] = args.json
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    print_table(report)
    bad = list(report["trajectories"]["mismatches"])
    if "scale" in report and not report["scale"]["consistent"]:
        bad += report["scale"]["mismatches"]
    if bad:
        print(f"MISMATCH: {len(bad)} difference(s) from the direct loop or the single run (see above)")
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of (direct, lean, arbiter, flatland) (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default 1; --quick: 0)")
    parser.add_argument("--preset", default="bench", help="test set preset (default bench)")
    parser.add_argument("--envs", type=int, default=0, help="use only the first N envs of the preset (0 = all)")
    parser.add_argument("--quick", action="store_true", help="1 round, 2 envs, 50 memory episodes, 2 concurrent")
    parser.add_argument("--full", action="store_true", help="1000 episodes for the memory check (default 200)")
    parser.add_argument("--json", metavar="PATH", help="write the raw results here")
    parser.add_argument("--cache-dir", help="where the generated test sets are cached (default arbiter's cache)")
    parser.add_argument("--concurrent", type=int, default=4, help="concurrent evaluations for the scale check")
    parser.add_argument("--protocol-steps", type=int, default=20_000, help="requests for the protocol-only check")
    parser.add_argument("--no-protocol", action="store_true", help="skip the protocol-only throughput")
    parser.add_argument("--no-memory", action="store_true", help="skip the server memory check")
    parser.add_argument("--no-scale", action="store_true", help="skip the concurrent evaluations")
    parser.add_argument(
        "--no-contention", action="store_true", help="skip the two lean loops at once that end each round"
    )
    parser.add_argument(
        "--no-memory-baseline",
        dest="memory_baseline",
        action="store_false",
        help="skip the plain flatland loop that the server's memory is compared with",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="limit per evaluation run, seconds")
    parser.add_argument("--reply-timeout", type=float, default=300.0, help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, results)")
    # Worker mode (internal): one measured process of a path.
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--tests", help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    parser.add_argument("--service-id", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    parser.add_argument("--rss-pid", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--rss-every", type=int, default=100, help=argparse.SUPPRESS)
    parser.add_argument("--rss-self", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=20_000, help=argparse.SUPPRESS)
    parser.add_argument("--idle-timeout", type=float, default=120.0, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        return WORKERS[args.worker](args)
    if args.rounds < 1:
        print("bench: --rounds must be at least 1", file=sys.stderr)
        return 2

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    return run_benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
