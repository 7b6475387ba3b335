"""The floor under the Flatland benchmark's arbiter path (scripts/bench.py): the lean loop whose
every step also goes through Redis to a process that steps its own copy of the env, with arbiter's
own packets and Redis commands and nothing of its evaluator.

Flatland's protocol has the agent step a local copy of the env for its observations while the
evaluator steps the env it scores, so any evaluator of it costs the agent a write to Redis a step
and a second process stepping the same env beside it. Two processes, ``--worker mirror`` (the
agent) and ``--worker mirror-env``:

- the agent plays the lean loop; before each local ``env.step`` it sends the step as arbiter's
  client does (one packet that takes the errors list's next entry and queues the step, its
  answers read after the local step), and once the last episode ends it waits until the other
  side has stepped everything (where arbiter's agent waits for its submission's reply). Like
  arbiter's client, it freezes what its process has loaded before the first episode;
- the other side waits and takes as arbiter's evaluator does (its blocking ``BLMOVE`` with the
  reply switched off, then the bounded take) and steps its lean copy, loading each episode's env
  when the first step of that episode comes; like the evaluator's env, that copy builds no step
  info (``FlatlandEpisode``), which no one on that side reads.

Steps are bare msgpack lists: the episode's index and the agents' actions in handle order. The
floor's wall time over the lean loop's is what flatland's protocol costs on this machine before
any evaluator logic; ``arbiter / lean`` can come no nearer to 1.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from bench_flatland import EVAL_SEED
from bench_remote_floor import packets_to, requests_taken
from bench_workers import lean_loader, play_in_process
from harness import emit

READY, END = "ready", "end"


def _keys(service_id: str) -> tuple[str, str, str]:
    prefix = f"arbiter-floor:{service_id}"
    return f"{prefix}:steps", f"{prefix}:done", f"{prefix}:errors"


def worker_mirror(args: argparse.Namespace) -> int:
    import msgpack

    steps_key, done_key, errors_key = _keys(args.service_id)
    packets = packets_to(args.redis_url, waits_as="agent")

    def told(message: list[Any], wait_s: float) -> None:
        """``message`` sent, and the other side's answer waited for."""
        found = packets.run([("LPUSH", steps_key, msgpack.packb(message)), ("BLPOP", done_key, wait_s)])[-1]
        if found is None:
            raise RuntimeError(f"the floor's env side did not answer within {wait_s:g} s")

    def stepper(env: Any, index: int) -> Any:
        handles = range(env.get_num_agents())

        def step(actions: dict[int, int]) -> tuple:
            packed = msgpack.packb([index, [actions[h] for h in handles]])
            packets.send([("RPOP", errors_key), ("LPUSH", steps_key, packed)])
            result = env.step(actions)
            packets.run([])  # the two answers, read after the local step as arbiter's client does
            return result

        return step

    told([READY], args.reply_timeout)  # the other side has started: its start is not measured
    # What arbiter's client does to its process once it is set up, before the first episode
    # (client/remote_client.py): the floor's agent has it too, with what the loop imports loaded.
    import flatland.envs.step_utils.states  # noqa: F401

    import arbiter.server.formats.flatland.generate  # noqa: F401
    from arbiter.client.remote_client import set_aside_what_is_loaded

    set_aside_what_is_loaded()
    try:
        return play_in_process("mirror", lean_loader(), args, stepper, finish=lambda: told([END], args.reply_timeout))
    finally:
        packets.close()


def worker_mirror_env(args: argparse.Namespace) -> int:
    import msgpack

    from arbiter.server.formats.flatland.generate import list_env_paths

    steps_key, done_key, _ = _keys(args.service_id)
    load = lean_loader()
    paths = list_env_paths(args.tests)
    packets = packets_to(args.redis_url, waits_as="evaluator")
    env, playing, stepped = None, -1, 0
    try:
        for raw in requests_taken(packets, steps_key, args.reply_timeout):
            message = msgpack.unpackb(raw)
            if message[0] in (READY, END):
                packets.run([("RPUSH", done_key, b"1")])
                if message[0] == END:
                    emit({"steps": stepped})
                    return 0
                continue
            index, actions = message
            if index != playing:
                env = load(os.path.join(args.tests, paths[index]))
                env.reset(regenerate_rail=True, regenerate_schedule=True, random_seed=EVAL_SEED)
                env.get_info_dict = dict  # as arbiter's evaluator steps its env: no info built for anyone
                playing = index
            env.step(dict(enumerate(actions)))
            stepped += 1
        raise AssertionError("unreachable: requests_taken ends only by raising")
    finally:
        packets.close()


WORKERS = {"mirror": worker_mirror, "mirror-env": worker_mirror_env}
