#!/usr/bin/env python3
"""What a remote step costs each side in Python, with Redis stood in for: arbiter's RemoteEnv and
evaluator against the floor's agent and env side, playing the same CartPole steps in one process.

    python scripts/bench_turn.py [--steps N] [--rounds R] [--warmup W] [--json PATH] [--quick]

bench_remote_env.py measures whole steps, in which Redis and two wake-ups take most of the time and
swing from round to round by more than a change to either side makes. Here each side's connection
to Redis keeps its socket's place but not its socket: the agent's packet is answered in process
(its errors list empty, its request handed to the env side's turn, its wait given that turn's
reply), and the env side's next read gets what Redis would answer (the acknowledgements of the
last reply, the wait's ``+OK`` and the take holding the request). So each side's work is timed as
it runs, its packets packed and parsed, with nothing of Redis's in it; what the stand-ins do is
kept out of the agent's time:

  arbiter  ``RemoteEnv.step`` against the evaluator of bench_remote_env.py's preset (phase 2, one
           training run), built as ``arbiter serve`` builds it: one ``EvaluatorService._serve_once``
           a step;
  floor    bench_remote_floor.py's agent and env side: bare msgpack lists, the env side's packet
           with the last reply and the wait, the take read, the env stepped;
  env      CartPole's own step in a loop of its own, for scale.

Every path plays the evaluator's seeds with bench_remote_workers.py's agent, and their episodes
must come out the same (MISMATCH, exit 1, otherwise). A redis-server is started (each side's
connection opens on it before its socket is stood in for, and the floor loads its script there),
and stopped by its pid on the way out.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench_remote_env import ENV_ID, MIN_STEPS, PRESET, SEED
from bench_remote_floor import REPLY_TTL_S, FloorAgent, _keys, evaluator_wait, floor_answer, packets_to, take_after
from bench_remote_workers import _seed, agent_action
from harness import BenchSession, machine_info, machine_line, write_json

PATHS = ("arbiter", "floor", "env")
QUICK = {"rounds": 1, "warmup": 0, "steps": 500}
PLAN = argparse.Namespace(seed=SEED)  # the evaluator's seeds, as bench_remote_env.py's workers reset with them
clock = time.perf_counter_ns


def redis_answers(acknowledged: int, request: bytes) -> bytes:
    """What Redis answers an env side's packet with: ``acknowledged`` replies' RPUSH and EXPIRE,
    then the wait's CLIENT REPLY ON and the take, holding ``request``."""
    return b":1\r\n:1\r\n" * acknowledged + b"+OK\r\n*1\r\n$%d\r\n%s\r\n" % (len(request), request)


def commands_in(packet: bytes) -> Iterator[list[bytes]]:
    """The commands of a packet in Redis's protocol, each as its arguments."""
    at = 0
    while at < len(packet):
        end = packet.index(b"\r\n", at)
        count = int(packet[at + 1 : end])  # *<arguments>
        at = end + 2
        arguments = []
        for _ in range(count):
            end = packet.index(b"\r\n", at)
            size = int(packet[at + 1 : end])  # $<bytes>
            arguments.append(packet[end + 2 : end + 2 + size])
            at = end + 2 + size + 2
        yield arguments


class StandInSocket:
    """A connection's socket as its side sees it, at no cost: writes are dropped, and the next read
    gets ``answers`` (set before each turn), once."""

    def __init__(self) -> None:
        self.answers = b""

    def sendall(self, data: Any) -> None:
        pass

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        data, self.answers = self.answers, b""
        buffer[: len(data)] = data
        return len(data)

    def settimeout(self, value: Any) -> None:
        pass

    def gettimeout(self) -> None:
        return None

    def shutdown(self, how: int) -> None:
        pass

    def close(self) -> None:
        pass


class AgentStandIn(StandInSocket):
    """An agent's connection, answered in process: the errors list is empty, a pushed request is
    served by ``serve`` (the env side's turn, which returns its reply), and the wait that follows
    gets that reply. What this takes, the env side's turn included, is counted in ``inside_ns``, to
    be taken off the agent's time."""

    def __init__(self, serve: Callable[[bytes], bytes]):
        super().__init__()
        self.serve = serve
        self.packets: list[bytes] = []
        self.inside_ns = 0

    def sendall(self, data: Any) -> None:
        self.packets.append(data)

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        started = clock()
        answers = []
        reply = b""
        for packet in self.packets:
            for command in commands_in(bytes(packet)):
                name = command[0].upper()
                if name == b"RPOP":
                    answers.append(b"$-1\r\n")
                elif name == b"LPUSH":
                    reply = self.serve(command[2])
                    answers.append(b":1\r\n")
                elif name == b"BLPOP":
                    key = command[1]
                    answers.append(b"*2\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, len(reply), reply))
                else:
                    raise RuntimeError(f"an agent sent {name!r}, which the stand-in does not answer")
        self.packets.clear()
        self.answers = b"".join(answers)
        size = super().recv_into(buffer)
        self.inside_ns += clock() - started
        return size


def stand_in(packets: Any, socket: StandInSocket) -> StandInSocket:
    """``packets``' connection, opened on the real Redis, with ``socket`` for its socket; no polling."""
    packets.connect()
    packets._connection._sock = socket
    packets._waiter = None
    return socket


class ArbiterSides:
    """The evaluator, and RemoteEnv on a connection answered by it."""

    def __init__(self, redis_url: str, results: Path, total_steps: int):
        from arbiter.client import remote_env
        from arbiter.server.core.competition import load_competition
        from arbiter.server.service.build import build_service

        max_steps = max(total_steps + 1, MIN_STEPS)  # the training run outlasts the benchmark
        overrides = ["phase=2", "num_episodes=1", "phase2.num_runs=1", f"phase2.max_steps={max_steps}",
                     "phase2.stability_window=1", f"seed={SEED}"]  # fmt: skip
        service_id = f"turn-{uuid.uuid4().hex[:8]}"
        self.service = build_service(
            load_competition(PRESET, overrides), tests=None, results_dir=str(results), redis_url=redis_url,
            service_id=service_id, poll_window_us=0,
        )  # fmt: skip
        self.evaluator_socket = stand_in(self.service.transport.packets, StandInSocket())
        self.agent_socket = AgentStandIn(self.serve)
        self.turn_ns = 0
        sides = self

        class StandInWire(remote_env.Wire):  # RemoteEnv's wire, stood in for before its handshake
            def __init__(self, *args: Any, **kwargs: Any):
                super().__init__(*args, **kwargs)
                stand_in(self.packets, sides.agent_socket)

        real_wire, remote_env.Wire = remote_env.Wire, StandInWire
        try:
            self.env = remote_env.RemoteEnv(redis_url, service_id, reply_timeout_s=30.0, shared_frames=False)
        finally:
            remote_env.Wire = real_wire
        self.env.begin_stage(next(stage for stage in self.env.stages if stage["phase"] == 2))

    def serve(self, request: bytes) -> bytes:
        """The evaluator's turn on ``request``: its reply."""
        replies = self.service.transport.replies
        self.evaluator_socket.answers = redis_answers(len(replies.unconfirmed) + len(replies.unwritten), request)
        started = clock()
        self.service._serve_once()
        self.turn_ns += clock() - started
        return (replies.unwritten or replies.unconfirmed)[-1][1]

    def reset(self, episode: int) -> Any:
        return self.env.reset()[0]

    def step(self, action: int) -> tuple[Any, float, bool]:
        observation, reward, terminated, truncated, _ = self.env.step(action)
        return observation, reward, terminated or truncated


class FloorSides:
    """The floor's env side, and its agent on a connection answered by it."""

    def __init__(self, redis_url: str):
        import gymnasium
        import msgpack

        from arbiter.server.service.transport import WAIT_UNANSWERED

        self.msgpack, self.unanswered = msgpack, WAIT_UNANSWERED
        self.env = gymnasium.make(ENV_ID)
        service_id = f"turn-{uuid.uuid4().hex[:8]}"
        requests_key, self.replies_key, _ = _keys(service_id)
        self.packets = packets_to(redis_url, waits_as="evaluator")
        self.wait = evaluator_wait(self.packets, requests_key)  # loads the take's script into Redis
        self.evaluator_socket = stand_in(self.packets, StandInSocket())
        self.reply: list[Any] = []
        self.turn_ns = 0
        self.agent_socket = AgentStandIn(self.serve)
        agent_packets = packets_to(redis_url, waits_as="agent")
        stand_in(agent_packets, self.agent_socket)
        self.agent = FloorAgent(agent_packets, service_id)

    def serve(self, request: bytes) -> bytes:
        self.evaluator_socket.answers = redis_answers(1 if self.reply else 0, request)
        started = clock()
        taken = take_after(self.packets, self.reply, self.wait, self.unanswered)
        body = self.msgpack.packb(floor_answer(self.env, self.msgpack.unpackb(taken[0])))
        self.reply = [("RPUSH", self.replies_key, body), ("EXPIRE", self.replies_key, REPLY_TTL_S)]
        self.turn_ns += clock() - started
        return body

    def reset(self, episode: int) -> Any:
        return self.agent.reset(_seed(PLAN, episode))

    def step(self, action: int) -> tuple[Any, float, bool]:
        observation, reward, terminated, truncated = self.agent.step(action)
        return observation, reward, terminated or truncated


class EnvAlone:
    """CartPole stepped in process; its step's time is the "agent's"."""

    def __init__(self) -> None:
        import gymnasium

        self.env = gymnasium.make(ENV_ID)
        self.agent_socket = AgentStandIn(lambda request: b"")  # never used: nothing inside a step
        self.turn_ns = 0

    def reset(self, episode: int) -> Any:
        return self.env.reset(seed=_seed(PLAN, episode))[0]

    def step(self, action: int) -> tuple[Any, float, bool]:
        observation, reward, terminated, truncated, _ = self.env.step(action)
        return observation, float(reward), terminated or truncated


class Player:
    """One path played episode after episode, across rounds: the agent's and the env side's time in
    its steps (resets not counted), and its episodes' returns for the comparison."""

    def __init__(self, sides: Any):
        self.sides = sides
        self.returns: list[float] = []
        self.observation = sides.reset(0)
        self.episode_return = 0.0

    def play(self, steps: int) -> tuple[float, float]:
        """``steps`` steps; µs a step: the agent's, the env side's."""
        sides, socket = self.sides, self.sides.agent_socket
        agent_ns = turn_ns = 0
        for _ in range(steps):
            action = agent_action(self.observation)
            inside, turns = socket.inside_ns, sides.turn_ns
            started = clock()
            self.observation, reward, over = sides.step(action)
            agent_ns += clock() - started - (socket.inside_ns - inside)
            turn_ns += sides.turn_ns - turns
            self.episode_return += reward
            if over:
                self.returns.append(self.episode_return)
                self.episode_return = 0.0
                self.observation = sides.reset(len(self.returns))
        return agent_ns / steps / 1000, turn_ns / steps / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20_000, help="steps per path and round (default 20000)")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default 1)")
    parser.add_argument("--json", metavar="PATH", help="write the raw results here")
    parser.add_argument("--quick", action="store_true", help="a short run for tests: rounds 1, warmup 0, steps 500")
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    if args.steps < 1 or args.rounds < 1 or args.warmup < 0:
        parser.error("--steps and --rounds must be at least 1, --warmup at least 0")
    machine = machine_info("gymnasium")
    agent_us: dict[str, list[float]] = {path: [] for path in PATHS}
    env_side_us: dict[str, list[float]] = {path: [] for path in PATHS}
    with BenchSession("arbiter-bench-turn-", script=Path(__file__).resolve()) as session:
        session.start_redis()
        total = args.steps * (args.rounds + args.warmup)
        with tempfile.TemporaryDirectory(prefix="arbiter-bench-turn-") as results:
            players = {
                "arbiter": Player(ArbiterSides(session.redis.local_url, Path(results), total)),
                "floor": Player(FloorSides(session.redis.local_url)),
                "env": Player(EnvAlone()),
            }
            gc.collect()
            gc.freeze()  # what was built is kept: no collection walks it between steps
            for round_ in range(args.warmup + args.rounds):
                for path in PATHS if round_ % 2 == 0 else PATHS[::-1]:
                    agent, env_side = players[path].play(args.steps)
                    counted = round_ >= args.warmup
                    if counted:
                        agent_us[path].append(agent)
                        env_side_us[path].append(env_side)
                    label = f"round {round_ - args.warmup + 1}" if counted else "warm-up"
                    print(f"bench: {label} {path:<8} agent {agent:7.2f} µs, env side {env_side:7.2f} µs a step",
                          file=sys.stderr)  # fmt: skip
    played = {path: players[path].returns for path in PATHS}
    same = played["arbiter"] == played["floor"] == played["env"]

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):8.2f} [{min(values):.2f}–{max(values):.2f}]"

    print(
        f"\nA step's Python on each side, Redis stood in for — {ENV_ID}, {args.steps} steps per path and round; "
        f"{args.rounds} round(s) after {args.warmup} warm-up; {machine_line(machine)}"
    )
    print(f"{'path':<8} {'agent µs a step: median [min–max]':<34} env side µs a step")
    for path in ("arbiter", "floor"):
        print(f"{path:<8} {spread(agent_us[path]):<34} {spread(env_side_us[path])}")
    print(f"{'env':<8} {spread(agent_us['env']):<34} (CartPole's step alone)")
    for side, figures in (("agent", agent_us), ("env side", env_side_us)):
        differences = [a - f for a, f in zip(figures["arbiter"], figures["floor"], strict=True)]
        print(
            f"arbiter − floor, {side}: median {statistics.median(differences):.2f} µs a step "
            f"(per round: {', '.join(f'{d:.2f}' for d in differences)})"
        )
    print(f"episodes: {'identical' if same else 'MISMATCH'} on every path ({len(played['env'])} finished)")
    report = {"machine": machine, "args": vars(args), "agent_us": agent_us, "env_side_us": env_side_us,
              "returns": played, "same": same}  # fmt: skip
    write_json(args.json, report)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
