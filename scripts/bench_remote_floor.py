"""The floor under bench_remote_env.py's remote path: the same episodes stepped through the same
redis-server with arbiter's own packets and Redis commands, and nothing of arbiter's protocol.

Two processes, ``--worker floor`` (the agent) and ``--worker floor-env`` (the env's side):

- the agent sends each request as RemoteEnv does, in one packet that takes the errors list's next
  entry, queues the request and waits for its reply (``RPOP``, ``LPUSH``, ``BLPOP``), polling its
  socket as RemoteEnv does (``protocol/spin_wait.py``);
- the env's side waits and takes as the evaluator does (its blocking ``BLMOVE`` with the reply
  switched off, then the bounded take, polling its socket in the evaluator's window), and writes
  each reply (``RPUSH``, ``EXPIRE``) and that wait for the next request in one packet, as the
  evaluator does when its turn ends in that wait (``RedisTransport.reply``).

Requests and replies are bare msgpack lists: a reset names its seed, a step its action, and a
reply holds the observation as a list of floats (which carries CartPole's float32 values exactly).
What the remote path costs beyond this floor is arbiter's own work on each side: the codec and its
checks, the client gate, the budgets, the records, RemoteEnv's bookkeeping.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import Any

from bench_remote_workers import _emit, _seed, play
from harness import emit

REPLY_TTL_S = 600  # as the evaluator's replies
READY, END = "ready", "end"


def _keys(service_id: str) -> tuple[str, str, str]:
    prefix = f"arbiter-floor:{service_id}"
    return f"{prefix}:requests", f"{prefix}:replies", f"{prefix}:errors"


def packets_to(redis_url: str, waits_as: str) -> Any:
    """arbiter's packets on a connection of their own, waiting for what they read as ``waits_as``
    waits: "agent" (RemoteEnv's polling window, ``ARBITER_SPIN_US``) or "evaluator" (the
    evaluator's, ``ARBITER_EVALUATOR_SPIN_US``, as ``arbiter serve`` reads it)."""
    from arbiter.protocol.redis_conn import Packets, connect
    from arbiter.protocol.spin_wait import SpinWait, polling_window, window_from_environment
    from arbiter.server.cli.settings import resolve_poll_window_us

    window_s = window_from_environment() if waits_as == "agent" else polling_window(resolve_poll_window_us())
    return Packets(connect(redis_url, socket_timeout_s=30.0), waiter=SpinWait(window_s) if window_s > 0 else None)


def evaluator_wait(packets: Any, key: str) -> list[bytes]:
    """The evaluator's wait for requests queued on ``key``, as ``RedisTransport`` sends it: a
    blocking ``BLMOVE`` of the list onto itself with the reply switched off, then the bounded take
    (whose script this loads first), packed once. ``packets.run(wait, unanswered=2)[-1]`` is what
    was taken."""
    from arbiter.protocol.redis_conn import BOUNDED_TAKE_SCRIPT, bounded_take, pack
    from arbiter.server.service.transport import POP_BATCH, REQUEST_LIMIT, TAKE_BYTES

    packets.run([("SCRIPT", "LOAD", BOUNDED_TAKE_SCRIPT)])
    return [
        pack(("CLIENT", "REPLY", "OFF")),
        pack(("BLMOVE", key, key, "RIGHT", "RIGHT", 1.0)),
        pack(("CLIENT", "REPLY", "ON")),
        pack(bounded_take(key, POP_BATCH, TAKE_BYTES, REQUEST_LIMIT, cached=True)),
    ]


def requests_taken(packets: Any, key: str, idle_s: float) -> Iterator[bytes]:
    """Each request queued on ``key``, taken in batches as the evaluator takes them
    (``evaluator_wait``); a RuntimeError once ``idle_s`` pass with none."""
    wait = evaluator_wait(packets, key)
    give_up = time.monotonic() + idle_s
    while True:
        taken = packets.run(wait, unanswered=2)[-1]
        if taken:
            give_up = time.monotonic() + idle_s
        elif time.monotonic() > give_up:
            raise RuntimeError(f"no request for {idle_s:g} s")
        yield from taken


def take_after(packets: Any, reply: list[Any], wait: list[bytes], unanswered: int) -> list[bytes]:
    """The requests the wait takes, written behind ``reply`` (the last request's, or nothing) in
    one packet: Redis is woken once for both, as the evaluator's reply and next wait wake it.
    ``unanswered``: the wait's commands Redis sends no reply for (``WAIT_UNANSWERED``)."""
    if not reply:
        return packets.run(wait, unanswered=unanswered)[-1]
    packets.send([*reply, *wait], unanswered=unanswered)
    return packets.run([], errors_in_place=True)[-1]  # the reply's acknowledgements, then the take's answer


class FloorAgent:
    """The floor's agent: each request sent as RemoteEnv sends it, in one packet that takes the
    errors list's next entry, queues the request and waits for its reply, over ``packets``."""

    def __init__(self, packets: Any, service_id: str):
        import msgpack
        import numpy as np

        self.packets, self.msgpack, self.np = packets, msgpack, np
        self.requests, self.replies, self.errors = _keys(service_id)

    def request(self, message: list[Any], wait_s: float = 10.0) -> list[Any]:
        push = ("LPUSH", self.requests, self.msgpack.packb(message))
        found = self.packets.run([("RPOP", self.errors), push, ("BLPOP", self.replies, wait_s)])
        if found[-1] is None:
            raise RuntimeError(f"the floor's env side did not answer within {wait_s:g} s")
        return self.msgpack.unpackb(found[-1][1])

    def reset(self, seed: int | None) -> Any:
        return self.np.asarray(self.request(["reset", seed])[0], dtype=self.np.float32)

    def step(self, action: int) -> tuple[Any, float, bool, bool]:
        observation, reward, terminated, truncated = self.request(["step", action])
        return self.np.asarray(observation, dtype=self.np.float32), reward, terminated, truncated


def worker_floor_agent(args: argparse.Namespace) -> int:
    packets = packets_to(args.redis_url, waits_as="agent")
    agent = FloorAgent(packets, args.service_id)
    before = time.perf_counter()
    agent.request([READY], wait_s=args.reply_timeout)  # the env side has started: its start is not measured
    setup = time.perf_counter() - before

    def reset(episode: int) -> tuple[Any, int | None]:
        seed = _seed(args, episode)
        return agent.reset(seed), seed

    try:
        played = play(reset, agent.step, args.steps)
        agent.request([END])
    finally:
        packets.close()
    return _emit("floor", setup, played)


def floor_answer(env: Any, message: list[Any]) -> list[Any] | None:
    """The env side's answer to a request, as a bare list; None for the last one (``END``)."""
    if message[0] == "reset":
        return [env.reset(seed=message[1])[0].tolist()]
    if message[0] == "step":
        observation, reward, terminated, truncated, _ = env.step(message[1])
        return [observation.tolist(), float(reward), bool(terminated), bool(truncated)]
    if message[0] == READY:
        return []
    return None


def worker_floor_env(args: argparse.Namespace) -> int:
    import gymnasium
    import msgpack

    from arbiter.server.service.transport import WAIT_UNANSWERED  # imported once, not on each step

    requests, replies, _ = _keys(args.service_id)
    env = gymnasium.make(args.env_id)
    packets = packets_to(args.redis_url, waits_as="evaluator")
    wait = evaluator_wait(packets, requests)
    reply: list[Any] = []  # the last request's reply: written with the next wait
    handled = 0
    give_up = time.monotonic() + args.reply_timeout
    try:
        while True:
            taken = take_after(packets, reply, wait, WAIT_UNANSWERED)
            reply = []
            if taken:
                give_up = time.monotonic() + args.reply_timeout
            elif time.monotonic() > give_up:
                raise RuntimeError(f"no request for {args.reply_timeout:g} s")
            for raw in taken:
                if reply:  # several requests taken at once: the earlier ones' replies go now
                    packets.send(reply)
                body = floor_answer(env, msgpack.unpackb(raw))
                if body is None:
                    packets.run([("RPUSH", replies, msgpack.packb([])), ("EXPIRE", replies, REPLY_TTL_S)])
                    emit({"handled": handled})
                    return 0
                reply = [("RPUSH", replies, msgpack.packb(body)), ("EXPIRE", replies, REPLY_TTL_S)]
                handled += 1
    finally:
        packets.close()
        env.close()


WORKERS = {"floor": worker_floor_agent, "floor-env": worker_floor_env}
