#!/usr/bin/env python3
"""What the evaluator's turn costs in Python, with Redis's socket stood in for: arbiter's evaluator
against the floor's env side, each answering the same CartPole steps, nothing of Redis on the path.

    python scripts/bench_turn.py [--steps N] [--rounds R] [--warmup W] [--json PATH] [--quick]

bench_remote_env.py measures whole steps, in which Redis and two wake-ups take most of the time and
swing from round to round by more than a change to a turn makes. Here each side's connection to
Redis keeps its socket's place but not its socket: what the side writes is dropped, and its next
read gets what Redis would answer (the acknowledgements of the last reply, the wait's ``+OK`` and
the take holding the next request), at no cost of its own. So a turn is timed as the side runs it
(its decoding, its bookkeeping, its packets packed and parsed) with nothing but its own Python:

  arbiter  the evaluator of bench_remote_env.py's preset (phase 2, one training run), built as
           ``arbiter serve`` builds it; one ``EvaluatorService._serve_once`` per turn, fed the
           requests RemoteEnv sends (built between turns, not timed);
  floor    bench_remote_floor.py's env side: its packet with the last reply and the wait, the take
           read, the bare msgpack request decoded, the env stepped and the reply built;
  env      CartPole's own step in a loop of its own, for scale.

Both sides play the evaluator's seeds with bench_remote_workers.py's agent, and their episodes
must come out the same (MISMATCH, exit 1, otherwise). A redis-server is started (the evaluator's
build and the floor's script need one), and stopped by its pid on the way out.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_remote_env import ENV_ID, MIN_STEPS, PRESET, SEED
from bench_remote_floor import REPLY_TTL_S, _keys, evaluator_wait, floor_answer, take_after
from bench_remote_workers import agent_action
from harness import BenchSession, machine_info, machine_line, write_json

PATHS = ("arbiter", "floor", "env")
QUICK = {"rounds": 1, "warmup": 0, "steps": 500}


def redis_answers(acknowledged: int, request: bytes) -> bytes:
    """What Redis answers a side's packet with: ``acknowledged`` replies' RPUSH and EXPIRE, then the
    wait's CLIENT REPLY ON and the take, holding ``request``."""
    return b":1\r\n:1\r\n" * acknowledged + b"+OK\r\n*1\r\n$%d\r\n%s\r\n" % (len(request), request)


class StandInSocket:
    """A connection's socket as the side sees it, at no cost: writes are dropped, and the next read
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


def stand_in(packets: Any) -> StandInSocket:
    """``packets``' connection (opened on the real Redis) with its socket stood in for; no polling."""
    packets.connect()
    socket = StandInSocket()
    packets._connection._sock = socket
    packets._waiter = None
    return socket


class ArbiterSide:
    def __init__(self, redis_url: str, results: Path, total_steps: int):
        from arbiter.protocol import codec, keys
        from arbiter.protocol.messages import FLATLAND_RL, PROTOCOL_VERSION
        from arbiter.server.cli.main import load_competition
        from arbiter.server.service.build import build_service

        max_steps = max(total_steps + 1, MIN_STEPS)  # the training run outlasts the benchmark
        overrides = ["phase=2", "num_episodes=1", "phase2.num_runs=1", f"phase2.max_steps={max_steps}",
                     "phase2.stability_window=1", f"seed={SEED}"]  # fmt: skip
        service_id = f"turn-{uuid.uuid4().hex[:8]}"
        self.codec, self.types = codec, FLATLAND_RL
        self.service = build_service(
            load_competition(PRESET, overrides), tests=None, results_dir=str(results), redis_url=redis_url,
            service_id=service_id, poll_window_us=0,
        )  # fmt: skip
        self.socket = stand_in(self.service.transport.packets)
        self.session, self.seq = uuid.uuid4().hex, 0
        self.channel = keys.response_key(service_id, uuid.uuid4().hex)
        ping = {"version": f"arbiter-{PROTOCOL_VERSION}", "arbiter": {"client": "bench_turn", "formats": "server-side"}}
        pong = self.turn(FLATLAND_RL.PING, ping)[1]
        self.item = next(s for s in pong["payload"]["arbiter"]["stages"] if s["phase"] == 2)["items"][0]

    def turn(self, type_: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """One request served: its turn's nanoseconds and the reply."""
        from arbiter.protocol.messages import request

        self.seq += 1
        payload["arbiter"] = {**payload.get("arbiter", {}), "session": self.session, "seq": self.seq}
        raw = self.codec.encode(request(type_, payload, self.channel))
        replies = self.service.transport.replies
        self.socket.answers = redis_answers(len(replies.unconfirmed) + len(replies.unwritten), raw)
        started = time.perf_counter_ns()
        self.service._serve_once()
        took = time.perf_counter_ns() - started
        reply = self.codec.decode((replies.unwritten or replies.unconfirmed)[-1][1], self.codec.REPLY_LIMITS)
        if reply.get("type") == self.types.ERROR:
            raise RuntimeError(f"the evaluator refused {type_}: {reply['payload']}")
        return took, reply

    def reset(self, episode: int) -> Any:
        asks = {"item": self.item, **({"within": True} if episode else {})}
        return self.turn(self.types.ENV_CREATE, {"arbiter": asks})[1]["payload"]["observation"]

    def step(self, action: int) -> tuple[int, Any, float, bool]:
        took, reply = self.turn(self.types.ENV_STEP, {"action": action, "arbiter": {"reply": True}})
        body = reply["payload"]
        return took, body["observation"], body["reward"], body["terminated"] or body["truncated"]


class FloorSide:
    def __init__(self, redis_url: str):
        import gymnasium
        import msgpack
        import numpy as np
        from bench_remote_floor import packets_to

        from arbiter.server.service.transport import WAIT_UNANSWERED

        self.msgpack, self.np, self.unanswered = msgpack, np, WAIT_UNANSWERED
        self.env = gymnasium.make(ENV_ID)
        service_id = f"turn-{uuid.uuid4().hex[:8]}"
        self.requests, self.replies, _ = _keys(service_id)
        self.packets = packets_to(redis_url, waits_as="evaluator")
        self.wait = evaluator_wait(self.packets, self.requests)  # loads the take's script into Redis
        self.socket = stand_in(self.packets)
        self.reply: list[Any] = []

    def turn(self, message: list[Any]) -> tuple[int, list[Any]]:
        self.socket.answers = redis_answers(1 if self.reply else 0, self.msgpack.packb(message))
        started = time.perf_counter_ns()
        taken = take_after(self.packets, self.reply, self.wait, self.unanswered)
        body = floor_answer(self.env, self.msgpack.unpackb(taken[0]))
        self.reply = [("RPUSH", self.replies, self.msgpack.packb(body)), ("EXPIRE", self.replies, REPLY_TTL_S)]
        took = time.perf_counter_ns() - started
        return took, body

    def reset(self, episode: int) -> Any:
        from arbiter.server.formats.base import reset_seed

        return self.np.asarray(self.turn(["reset", reset_seed(SEED, 2, 0, episode)])[1][0], dtype=self.np.float32)

    def step(self, action: int) -> tuple[int, Any, float, bool]:
        took, (observation, reward, terminated, truncated) = self.turn(["step", action])
        return took, self.np.asarray(observation, dtype=self.np.float32), reward, terminated or truncated


class EnvAlone:
    def __init__(self) -> None:
        import gymnasium

        self.env = gymnasium.make(ENV_ID)

    def reset(self, episode: int) -> Any:
        from arbiter.server.formats.base import reset_seed

        return self.env.reset(seed=reset_seed(SEED, 2, 0, episode))[0]

    def step(self, action: int) -> tuple[int, Any, float, bool]:
        started = time.perf_counter_ns()
        observation, reward, terminated, truncated, _ = self.env.step(action)
        took = time.perf_counter_ns() - started
        return took, observation, float(reward), terminated or truncated


class Player:
    """One side played episode after episode, across rounds: its steps' turns timed, its episodes'
    returns kept for the comparison."""

    def __init__(self, side: Any):
        self.side = side
        self.returns: list[float] = []
        self.observation = side.reset(0)
        self.episode_return = 0.0

    def play(self, steps: int) -> float:
        """``steps`` steps; the µs of a step's turn on average (resets not counted)."""
        spent = 0
        for _ in range(steps):
            took, self.observation, reward, over = self.side.step(agent_action(self.observation))
            spent += took
            self.episode_return += reward
            if over:
                self.returns.append(self.episode_return)
                self.episode_return = 0.0
                self.observation = self.side.reset(len(self.returns))
        return spent / steps / 1000


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
    turns_us: dict[str, list[float]] = {path: [] for path in PATHS}
    with BenchSession("arbiter-bench-turn-", script=Path(__file__).resolve()) as session:
        session.start_redis()
        total = args.steps * (args.rounds + args.warmup)
        with tempfile.TemporaryDirectory(prefix="arbiter-bench-turn-") as results:
            players = {
                "arbiter": Player(ArbiterSide(session.redis.local_url, Path(results), total)),
                "floor": Player(FloorSide(session.redis.local_url)),
                "env": Player(EnvAlone()),
            }
            gc.collect()
            gc.freeze()  # what was built is kept: no collection walks it between turns
            for round_ in range(args.warmup + args.rounds):
                order = PATHS if round_ % 2 == 0 else PATHS[::-1]
                for path in order:
                    us = players[path].play(args.steps)
                    counted = round_ >= args.warmup
                    if counted:
                        turns_us[path].append(us)
                    label = f"round {round_ - args.warmup + 1}" if counted else "warm-up"
                    print(f"bench: {label} {path:<8} {us:7.2f} µs a turn", file=sys.stderr)
    played = {path: players[path].returns for path in PATHS}
    same = played["arbiter"] == played["floor"] == played["env"]
    differences = [a - f for a, f in zip(turns_us["arbiter"], turns_us["floor"], strict=True)]
    print(
        f"\nThe evaluator's turn, Redis's socket stood in for — {ENV_ID}, {args.steps} steps per path and round; "
        f"{args.rounds} round(s) after {args.warmup} warm-up; {machine_line(machine)}"
    )
    print(f"{'path':<9} {'µs a turn: median [min–max]':<30}")
    for path in PATHS:
        values = turns_us[path]
        print(f"{path:<9} {statistics.median(values):8.2f} [{min(values):.2f}–{max(values):.2f}]")
    print(
        f"arbiter − floor: median {statistics.median(differences):.2f} µs a turn "
        f"(per round: {', '.join(f'{d:.2f}' for d in differences)})"
    )
    episodes = len(played["arbiter"])
    print(f"episodes: {'identical' if same else 'MISMATCH'} on every path ({episodes} finished)")
    report = {"machine": machine, "args": vars(args), "turn_us": turns_us, "returns": played, "same": same}
    write_json(args.json, report)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
