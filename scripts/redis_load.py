"""Redis's load, measured: its CPU and its commands over a window, and the modelled evaluations
of bench_redis_capacity.py (redis_traffic_model.py's traffic, from a few processes)."""

from __future__ import annotations

import argparse
import array
import os
import time
from pathlib import Path
from typing import Any

from harness import BenchError, BenchSession, new_service_id

PACE_STEPS_PER_S = 20  # an agent that thinks 50 ms a step
MODEL_PACE_SHARE = 0.85  # modelled agents must step at this share of 1/think at least
CALIBRATION_BAND = (0.67, 1.5)  # the model's cost per step against the real evaluations', at the same count


def redis_cpu_s(conn: Any) -> float:
    info = conn.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def command_stats(conn: Any) -> dict[str, tuple[int, int]]:
    """Each command's calls and the microseconds Redis spent executing it, so far."""
    return {name.removeprefix("cmdstat_"): (stat["calls"], stat["usec"])
            for name, stat in conn.info("commandstats").items()}  # fmt: skip


def cpu_share(conn: Any, seconds: float) -> dict[str, Any]:
    """Redis's CPU share over ``seconds`` from now, the window's start and end (Unix times), and
    the calls and execution time of each command in it."""
    commands_before, cpu_before, started = command_stats(conn), redis_cpu_s(conn), time.time()
    time.sleep(seconds)
    cpu_after, ended, commands_after = redis_cpu_s(conn), time.time(), command_stats(conn)
    commands = {}
    for name, (calls, usec) in commands_after.items():
        calls_before, usec_before = commands_before.get(name, (0, 0))
        if calls > calls_before:
            commands[name] = {"calls": calls - calls_before, "usec": usec - usec_before}
    return {"share": (cpu_after - cpu_before) / (ended - started), "start": started, "end": ended,
            "commands": commands}  # fmt: skip


def wait_ready(session: BenchSession, agents: list[Any], ready: list[Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(path.exists() for path in ready):
        for agent in agents:
            if agent.popen.poll() is not None:
                raise BenchError(f"{agent.name} exited with status {agent.popen.returncode}:\n{agent.tail()}")
        if time.monotonic() > deadline:
            raise BenchError(f"{sum(not p.exists() for p in ready)} agent(s) not ready after {timeout_s:g} s")
        time.sleep(0.05)


def model_level(session: BenchSession, redis_url: str, count: int, args: argparse.Namespace) -> dict[str, Any]:
    """``count`` modelled evaluations (redis_traffic_model.py) spread over ``--model-processes``
    processes: Redis's CPU and the agent steps answered in the window, as for real evaluations."""
    from redis_traffic_model import ensure_script

    ensure_script(session.conn)
    folder = session.workdir / f"model-{count}"
    folder.mkdir()
    go = folder / "go"
    processes = min(args.model_processes, count)
    shares = [list(range(count))[index::processes] for index in range(processes)]
    ready = [folder / f"ready-{index}" for index in range(processes)]
    outs = [folder / f"answered-{index}" for index in range(processes)]
    until_s = args.settle + args.window + 1.0
    models = [
        session.procs.worker(f"model-{count}-{index}", "model", "--redis-url", redis_url,
                             "--service-id", ",".join(new_service_id(f"m{count}-{n}") for n in share),
                             "--think", str(args.think), "--ready", str(ready[index]), "--go", str(go),
                             "--until", str(until_s), "--out", str(outs[index]))
        for index, share in enumerate(shares)
    ]  # fmt: skip
    wait_ready(session, models, ready, args.timeout)
    idle = cpu_share(session.conn, args.idle)
    go.touch()
    time.sleep(args.settle)
    busy = cpu_share(session.conn, args.window)
    session.procs.wait(models, args.timeout)
    answered = array.array("d")
    for out in outs:
        answered.frombytes(out.read_bytes())
    window = busy["end"] - busy["start"]
    in_window = sum(busy["start"] <= t <= busy["end"] for t in answered)
    cpu_per_step = busy["share"] * window / in_window
    return {
        "evaluations": count,
        "processes": processes,
        "window_s": window,
        "agent_steps": in_window,
        "steps_per_s": in_window / window,
        "steps_per_s_per_evaluation": in_window / window / count,
        "redis_cpu_share": busy["share"],
        "redis_idle_cpu_share": idle["share"],
        "commands_per_step": {
            name: {"calls": stat["calls"] / in_window, "usec": stat["usec"] / in_window}
            for name, stat in sorted(busy["commands"].items(), key=lambda i: -i[1]["usec"])
        },
        "redis_cpu_per_step_s": cpu_per_step,
        "evaluations_per_core": 1.0 / (cpu_per_step * PACE_STEPS_PER_S),
    }


def worker_model(args: argparse.Namespace) -> int:
    import resource

    from redis_traffic_model import run as run_model

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # two connections per modelled evaluation
    run_model(args.redis_url, args.service_id.split(","), args.think, Path(args.ready), Path(args.go), args.until,
              Path(args.out))  # fmt: skip
    return 0


def model_checks(models: list[dict[str, Any]], think_s: float) -> list[str]:
    problems = []
    for level in models:
        if level["steps_per_s_per_evaluation"] < MODEL_PACE_SHARE / think_s:
            each = level["steps_per_s_per_evaluation"]
            problems.append(
                f"{level['evaluations']} modelled: {each:.1f} steps/s each, under "
                f"{MODEL_PACE_SHARE:.0%} of the pace asked (this machine could not drive them)"
            )
    return problems


def print_models(models: list[dict[str, Any]], calibration: dict[str, Any] | None) -> None:
    print("modelled evaluations (their packets, byte for byte, from few processes: redis_traffic_model.py)")
    print("at once  steps/s (each, all)  Redis CPU share idle / stepping  CPU per step  evaluations per core at 20/s")
    for level in models:
        print(f"{level['evaluations']:>7}  {level['steps_per_s_per_evaluation']:>7.1f}, {level['steps_per_s']:>7.1f}  "
              f"{100 * level['redis_idle_cpu_share']:>14.2f} % / {100 * level['redis_cpu_share']:>6.2f} %  "
              f"{1e6 * level['redis_cpu_per_step_s']:>9.1f} µs  {level['evaluations_per_core']:>12,.0f}")  # fmt: skip
    if calibration:
        model_us, real_us = 1e6 * calibration["model_s"], 1e6 * calibration["real_s"]
        print(f"calibration: at {calibration['evaluations']} at once the model costs Redis {model_us:.1f} µs a step, "
              f"the real evaluations {real_us:.1f} µs (ratio {calibration['ratio']:.2f})")  # fmt: skip
    largest = models[-1]
    calls = {name: round(stat["calls"], 2) for name, stat in largest["commands_per_step"].items()}
    print(f"commands per step at {largest['evaluations']} modelled: {calls}")


def pin_redis_to_own_core(redis_pid: int) -> str | None:
    """Redis on the first CPU, this benchmark and every process it starts on the others: Redis's
    CPU per step is then that of a core of its own, as a farm's Redis has, not one whose caches
    the evaluations' Python processes keep evicting. None where there is one CPU only."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    os.sched_setaffinity(redis_pid, {cpus[0]})
    os.sched_setaffinity(0, set(cpus[1:]))
    return f"Redis alone on CPU {cpus[0]}, the evaluations on CPU {','.join(map(str, cpus[1:]))}"
