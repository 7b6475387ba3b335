"""The floor under bench_redis_capacity.py's figures: the barest request and reply two processes
can make through Redis lists, at the same pace and with as many processes as the real
evaluations.

Each bare evaluation is two processes, as a real one is: an asker that thinks, then sends
``LPUSH request`` and ``BLPOP reply`` in one packet and waits; an answerer that sends ``LPUSH
reply`` and the ``BLPOP request`` that waits for the next one, in one packet. Four commands a
step, two packets into Redis and the replies' writes out of it, nothing else: no sequence
numbers, no errors list, no bounded take, no expiry, messages of a CartPole step's size. What
Redis spends per step here is what any protocol built on its lists costs it on this machine, so
the real evaluations' cost is read against it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from harness import BenchSession, emit, new_service_id
from redis_load import PACE_STEPS_PER_S, cpu_share, wait_ready

# About a CartPole step's request and reply as RemoteEnv and the evaluator encode them.
REQUEST_BYTES = 120
REPLY_BYTES = 200
BLOCK_S = 5  # every wait is answered long before this


def _keys(service_id: str) -> tuple[str, str]:
    return f"floor:{service_id}:request", f"floor:{service_id}:reply"


def _connection(redis_url: str) -> Any:
    import redis

    return redis.Redis.from_url(redis_url).connection_pool.get_connection()


def worker_floor_answer(args: argparse.Namespace) -> int:
    """Answer every request at once until ``args.steps`` were answered."""
    request_key, reply_key = _keys(args.service_id)
    connection = _connection(args.redis_url)
    reply = b"r" * REPLY_BYTES
    connection.send_command("BLPOP", request_key, 0)
    for _ in range(args.steps):
        if connection.read_response() is None:
            raise TimeoutError("a blocking wait without timeout returned nothing")
        connection.send_packed_command(connection.pack_commands([("LPUSH", reply_key, reply),
                                                                 ("BLPOP", request_key, 0)]))  # fmt: skip
        connection.read_response()  # the LPUSH's acknowledgement
    emit({})
    return 0


def worker_floor_ask(args: argparse.Namespace) -> int:
    """Wait for the go, then ``args.steps`` requests, each after ``args.think`` seconds; emits when
    each was answered (Unix times)."""
    request_key, reply_key = _keys(args.service_id)
    connection = _connection(args.redis_url)
    request = b"q" * REQUEST_BYTES
    Path(args.ready).touch()
    deadline = time.monotonic() + args.reply_timeout
    while not Path(args.go).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no go signal ({args.go}) within {args.reply_timeout:g} s")
        time.sleep(0.01)
    answered: list[float] = []
    packet = connection.pack_commands([("LPUSH", request_key, request), ("BLPOP", reply_key, BLOCK_S)])
    for _ in range(args.steps):
        time.sleep(args.think)
        connection.send_packed_command(packet)
        connection.read_response()  # the LPUSH's acknowledgement
        if connection.read_response() is None:
            raise TimeoutError(f"no reply within {BLOCK_S} s")
        answered.append(time.time())
    emit({"answered": answered})
    return 0


def floor_level(
    session: BenchSession, redis_url: str, count: int, steps: int, args: argparse.Namespace
) -> dict[str, Any]:
    """``count`` bare evaluations at once: Redis's CPU per step while they step, as ``one_level``
    measures the real ones."""
    folder = session.workdir / f"floor-{count}"
    folder.mkdir()
    go = folder / "go"
    service_ids = [new_service_id(f"floor{count}-{index}") for index in range(count)]
    ready = [folder / f"ready-{sid}" for sid in service_ids]
    answerers = [session.procs.worker(f"floor-answer-{sid}", "floor-answer", "--redis-url", redis_url,
                                      "--service-id", sid, "--steps", str(steps))
                 for sid in service_ids]  # fmt: skip
    askers = [session.procs.worker(f"floor-ask-{sid}", "floor-ask", "--redis-url", redis_url, "--service-id", sid,
                                   "--steps", str(steps), "--think", str(args.think), "--ready", str(path),
                                   "--go", str(go), "--reply-timeout", str(args.timeout))
              for sid, path in zip(service_ids, ready, strict=True)]  # fmt: skip
    wait_ready(session, askers, ready, args.timeout)
    go.touch()
    time.sleep(args.settle)
    busy = cpu_share(session.conn, args.window)
    session.procs.wait(askers + answerers, args.timeout)
    answered = [asker.result()["answered"] for asker in askers]
    window = busy["end"] - busy["start"]
    in_window = sum(busy["start"] <= t <= busy["end"] for times in answered for t in times)
    covered = sum(bool(times) and times[0] < busy["start"] and times[-1] > busy["end"] for times in answered)
    cpu_per_step = busy["share"] * window / in_window
    return {
        "evaluations": count,
        "window_s": window,
        "agent_steps": in_window,
        "steps_per_s": in_window / window,
        "redis_cpu_share": busy["share"],
        "commands_per_step": {name: stat["calls"] / in_window for name, stat in busy["commands"].items()},
        "redis_cpu_per_step_s": cpu_per_step,
        "evaluations_per_core": 1.0 / (cpu_per_step * PACE_STEPS_PER_S),
        "askers_covering_window": covered,
    }


def floor_checks(floor: dict[str, Any] | None) -> list[str]:
    if floor is None or floor["askers_covering_window"] == floor["evaluations"]:
        return []
    return [f"bare exchange: only {floor['askers_covering_window']} of {floor['evaluations']} askers stepped "
            "through the window"]  # fmt: skip


def print_floor(floor: dict[str, Any], real: dict[str, Any]) -> None:
    real_us, floor_us = 1e6 * real["redis_cpu_per_step_s"], 1e6 * floor["redis_cpu_per_step_s"]
    commands = ", ".join(f"{name} {calls:.2f}" for name, calls in sorted(floor["commands_per_step"].items())
                         if calls >= 0.01)  # fmt: skip
    print(f"floor: {floor['evaluations']} bare exchanges at once (LPUSH + BLPOP each way, two processes each; "
          f"per step {commands}): {floor['steps_per_s']:.0f} steps/s, Redis {100 * floor['redis_cpu_share']:.2f} % "
          f"of a core, {floor_us:.1f} µs a step, {floor['evaluations_per_core']:,.0f} per core at 20/s")  # fmt: skip
    print(f"floor: the real evaluations at {real['evaluations']} at once cost Redis {real_us / floor_us:.2f} × the "
          f"bare exchange ({real_us:.1f} µs against {floor_us:.1f} µs a step)")  # fmt: skip
