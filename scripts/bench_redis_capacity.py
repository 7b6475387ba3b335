"""How many concurrent evaluations one Redis core carries: N evaluations at once on one private
redis-server, each an ``arbiter serve`` process (the two-phase format's CartPole preset, phase 2,
one training run) and a RemoteEnv agent process that thinks ``--think`` seconds (50 ms by
default) before each request, as a learning agent does; for N = 10, 20, 40 by default.

Processes, not threads: each evaluation runs as it does hosted, its evaluator and its agent in
processes of their own, so the evaluations' Python work spreads over the machine's cores and
cannot slow one another through one interpreter's lock; Redis sees the same traffic either way.
The sides meet over loopback TCP, as containers that share a Redis do (it costs Redis more CPU
than its unix socket).

For each N: every agent connects, resets, and waits; Redis's CPU is read while they wait (the
idle share: what the connected evaluations cost with no steps), then all start stepping together,
and after ``--settle`` seconds Redis's CPU (INFO's used_cpu_user + used_cpu_sys: every thread of
redis-server, this script's two INFO calls included) is read at the start and the end of a
``--window`` of seconds. Every agent records when each of its requests (an env step or reset,
each after its think time) was answered; the requests answered inside the window, over all
agents, are the agent steps. From them:

- Redis CPU per agent step = Redis CPU seconds in the window / agent steps in the window;
- evaluations one Redis core carries at 20 steps/s = 1 / (CPU seconds per step × 20);
- Redis's measured CPU share at the largest N, next to the share the smallest N's per-step cost
  predicts for the steps the largest N made.

Checked: every agent stepped through the whole window, and every evaluation ended in SUCCESS.

A farm's Redis serves far more evaluations than this machine can run, and Redis's work per step
may fall as its load rises (it reads more packets per wake-up). ``--model`` puts the load of 250,
500 and 1,000 evaluations on the same Redis with redis_traffic_model.py: the evaluator's and the
client's packets of each step, byte for byte, sent by a few processes (checked: the modelled
agents kept their pace). The model is trusted only where it costs Redis what the real
evaluations cost at the count both ran (its first count): then the target is judged at its
largest count, otherwise on the real evaluations.

    python scripts/bench_redis_capacity.py [--evaluations 10,20,40] [--model 40,250,500,1000]
                                           [--unix] [--pin] [--think S] [--window S]
                                           [--quick] [--json FILE] [--keep]

Exit status: 0 checks pass, 1 a check failed, 2 the benchmark could not run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from figures import Threshold
from harness import (
    BenchSession,
    emit,
    machine_info,
    machine_line,
    new_service_id,
    read_results,
    serve_argv,
    write_json,
)
from redis_floor import floor_checks, floor_level, print_floor, worker_floor_answer, worker_floor_ask
from redis_load import (
    CALIBRATION_BAND,
    PACE_STEPS_PER_S,
    cpu_share,
    model_checks,
    model_level,
    pin_redis_to_own_core,
    print_models,
    wait_ready,
    worker_model,
)

SCRIPT = Path(__file__).resolve()
PRESET = "two-phase-cartpole"
SEED = 1001  # the preset's competition seed
TARGET = Threshold(name="evaluations_per_redis_core", what="evaluations one Redis core carries at 20 steps/s",
                   unit="evaluations", bound=1000, at_least=True)  # fmt: skip
# The shortest training run the preset accepts with a window of 1 (two episodes at its goal, 475).
MIN_RUN_STEPS = 950
QUICK = {"evaluations": "2,4", "model": "4,40", "window": 1.5, "settle": 0.3, "idle": 0.5}


def steps_needed(args: argparse.Namespace) -> int:
    """Requests each agent makes: enough to step through settle and window with a margin (an agent
    makes fewer than 1/think requests a second, so these take longer than that). The margin covers
    the agents' start after the go, which does not grow with the window."""
    margin_s = min(2.0, args.window / 3)
    return math.ceil((args.settle + args.window + margin_s) / args.think)


def agent_action(observation: Any) -> int:
    return int(observation[3] > 0)  # push the cart the way the pole turns


def worker_agent(args: argparse.Namespace) -> int:
    """One agent: connect, begin the training run, reset, say it is ready, wait for the go, then
    ``args.steps`` requests, each after ``args.think`` seconds; then, at full speed, the rest of
    the training run and its evaluation episode, and submit. Emits when each thinking request was
    answered (Unix times)."""
    from arbiter.client.remote_env import RemoteEnv
    from arbiter.protocol.messages import EXTENSION_KEY

    env = RemoteEnv(redis_url=args.redis_url, service_id=args.service_id, reply_timeout_s=args.reply_timeout)
    try:
        stages = [stage for stage in env.stages if stage["phase"] == 2]
        env.begin_stage(stages[0])
        observation, _ = env.reset()
        Path(args.ready).touch()
        deadline = time.monotonic() + args.reply_timeout
        while not Path(args.go).exists():  # a file, so that waiting adds nothing to Redis's load
            if time.monotonic() > deadline:
                raise TimeoutError(f"no go signal ({args.go}) within {args.reply_timeout:g} s")
            time.sleep(0.01)
        answered: list[float] = []
        run_over = False
        while len(answered) < args.steps and not run_over:
            time.sleep(args.think)
            observation, _, terminated, truncated, info = env.step(agent_action(observation))
            answered.append(time.time())
            run_over = bool(info[EXTENSION_KEY].get("stage_over"))
            if (terminated or truncated) and len(answered) < args.steps and not run_over:
                time.sleep(args.think)
                observation, _ = env.reset()
                answered.append(time.time())
        while not run_over:  # the rest of the run, not measured: the evaluator ends it at its max_steps
            observation, _, terminated, truncated, info = env.step(agent_action(observation))
            run_over = bool(info[EXTENSION_KEY].get("stage_over"))
            if (terminated or truncated) and not run_over:
                observation, _ = env.reset()
        for stage in stages[1:2]:  # the run's evaluation episodes, not measured
            env.begin_stage(stage)
            for _ in range(stage["items"][1] - stage["items"][0]):
                observation, _ = env.reset()
                over = False
                while not over:
                    observation, _, terminated, truncated, _ = env.step(agent_action(observation))
                    over = terminated or truncated
        env.submit()
    finally:
        env.close()
    emit({"answered": answered})
    return 0


def one_level(session: BenchSession, redis_url: str, count: int, args: argparse.Namespace) -> dict[str, Any]:
    """``count`` evaluations at once; Redis's CPU idle and while they step, the steps they made."""
    steps = steps_needed(args)
    overrides = ["phase=2", "num_episodes=1", "phase2.num_runs=1", f"phase2.max_steps={max(steps, MIN_RUN_STEPS)}",
                 "phase2.stability_window=1", f"seed={SEED}"]  # fmt: skip
    folder = session.workdir / f"n{count}"
    folder.mkdir()
    service_ids = [new_service_id(f"n{count}-{index}") for index in range(count)]
    servers = session.start_servers([
        lambda sid=sid: session.procs.start(f"serve-{sid}", serve_argv(
            redis_url, sid, folder / sid, "--competition", PRESET, overrides=overrides))
        for sid in service_ids
    ], timeout_s=args.timeout)  # fmt: skip
    go = folder / "go"
    ready = [folder / f"ready-{sid}" for sid in service_ids]
    agents = [
        session.procs.worker(f"agent-{sid}", "agent", "--redis-url", redis_url, "--service-id", sid,
                             "--steps", str(steps), "--think", str(args.think), "--ready", str(path),
                             "--go", str(go), "--reply-timeout", str(args.timeout))
        for sid, path in zip(service_ids, ready, strict=True)
    ]  # fmt: skip
    wait_ready(session, agents, ready, args.timeout)
    idle = cpu_share(session.conn, args.idle)
    go.touch()
    time.sleep(args.settle)
    busy = cpu_share(session.conn, args.window)
    busy_share, window_start, window_end = busy["share"], busy["start"], busy["end"]
    session.procs.wait(agents + servers, args.timeout)
    answered = [agent.result()["answered"] for agent in agents]
    window = window_end - window_start
    in_window = [sum(window_start <= t <= window_end for t in times) for times in answered]
    covered = sum(bool(times) and times[0] < window_start and times[-1] > window_end for times in answered)
    states = sorted({read_results(folder / sid)["state"] for sid in service_ids})
    steps_per_s = sum(in_window) / window
    cpu_per_step = busy_share * window / sum(in_window)
    per_step = {name: {"calls": stat["calls"] / sum(in_window), "usec": stat["usec"] / sum(in_window)}
                for name, stat in busy["commands"].items()}  # fmt: skip
    return {
        "evaluations": count,
        "window_s": window,
        "agent_steps": sum(in_window),
        "steps_per_s": steps_per_s,
        "steps_per_s_per_evaluation": statistics.median(n / window for n in in_window),
        "redis_cpu_share": busy_share,
        "redis_idle_cpu_share": idle["share"],
        # per agent step: each command's calls and the time Redis spent executing them (reading
        # requests and writing replies on the sockets is outside these, inside the CPU figure)
        "commands_per_step": dict(sorted(per_step.items(), key=lambda item: -item[1]["usec"])),
        "redis_cpu_per_step_s": cpu_per_step,
        "evaluations_per_core": 1.0 / (cpu_per_step * PACE_STEPS_PER_S),
        "agents_covering_window": covered,
        "states": states,
    }


def checks(levels: list[dict[str, Any]]) -> list[str]:
    problems = []
    for level in levels:
        n = level["evaluations"]
        if level["agents_covering_window"] != n:
            problems.append(f"{n} at once: only {level['agents_covering_window']} agents stepped through the window")
        if level["states"] != ["SUCCESS"]:
            problems.append(f"{n} at once: evaluations ended {level['states']}")
    return problems


def print_report(levels: list[dict[str, Any]], prediction: dict[str, Any], heading: str) -> None:
    print(heading)
    print("at once  steps/s (each, all)  Redis CPU share idle / stepping  CPU per step  evaluations per core at 20/s")
    for level in levels:
        print(f"{level['evaluations']:>7}  {level['steps_per_s_per_evaluation']:>7.1f}, {level['steps_per_s']:>7.1f}  "
              f"{100 * level['redis_idle_cpu_share']:>14.2f} % / {100 * level['redis_cpu_share']:>6.2f} %  "
              f"{1e6 * level['redis_cpu_per_step_s']:>9.1f} µs  {level['evaluations_per_core']:>12,.0f}")  # fmt: skip
    measured, predicted = 100 * prediction["measured_share"], 100 * prediction["predicted_share"]
    print(f"check: at {prediction['evaluations']} at once Redis used {measured:.2f} % of a core; "
          f"{prediction['from_evaluations']} at once's cost per step predicts {predicted:.2f} % "
          f"for the {prediction['steps_per_s']:.0f} steps/s made")  # fmt: skip
    largest = levels[-1]
    executing = sum(stat["usec"] for stat in largest["commands_per_step"].values())
    calls = sum(stat["calls"] for stat in largest["commands_per_step"].values())
    print(f"Redis's work per agent step at {largest['evaluations']} at once: {calls:.1f} commands, executing them "
          f"{executing:.1f} µs of its {1e6 * largest['redis_cpu_per_step_s']:.1f} µs (the rest: reading requests, "
          "writing replies, its event loop); by command, calls and µs per step:")  # fmt: skip
    print("  " + ", ".join(f"{name} {stat['calls']:.2f} / {stat['usec']:.1f}"
                           for name, stat in largest["commands_per_step"].items()))  # fmt: skip


def run(args: argparse.Namespace) -> int:
    counts = [int(part) for part in args.evaluations.split(",")]
    model_counts = [int(part) for part in args.model.split(",")] if args.model else []
    machine = machine_info("redis", "gymnasium")
    with BenchSession("arbiter-bench-redis-capacity-", script=SCRIPT, keep=args.keep) as session:
        redis_url = session.start_redis(tcp=not args.unix)
        pinned = pin_redis_to_own_core(session.redis.pid) if args.pin else None
        levels = []
        for count in counts:
            levels.append(one_level(session, redis_url, count, args))
            print(f"bench: {count} at once: Redis {100 * levels[-1]['redis_cpu_share']:.2f} % of a core for "
                  f"{levels[-1]['steps_per_s']:.0f} steps/s", flush=True)  # fmt: skip
        floor = None
        if not args.no_floor:
            floor = floor_level(session, redis_url, counts[-1], steps_needed(args), args)
            print(f"bench: {counts[-1]} bare exchanges: Redis {100 * floor['redis_cpu_share']:.2f} % of a core for "
                  f"{floor['steps_per_s']:.0f} steps/s", flush=True)  # fmt: skip
        models = []
        for count in model_counts:
            models.append(model_level(session, redis_url, count, args))
            print(f"bench: {count} modelled: Redis {100 * models[-1]['redis_cpu_share']:.2f} % of a core for "
                  f"{models[-1]['steps_per_s']:.0f} steps/s", flush=True)  # fmt: skip
    if session.failed():
        return 2
    smallest, largest = levels[0], levels[-1]
    prediction = {
        "evaluations": largest["evaluations"],
        "from_evaluations": smallest["evaluations"],
        "steps_per_s": largest["steps_per_s"],
        "measured_share": largest["redis_cpu_share"],
        "predicted_share": largest["steps_per_s"] * smallest["redis_cpu_per_step_s"],
    }
    real_by_count = {level["evaluations"]: level for level in levels}
    calibration = next(({"evaluations": m["evaluations"], "model_s": m["redis_cpu_per_step_s"],
                         "real_s": real_by_count[m["evaluations"]]["redis_cpu_per_step_s"],
                         "ratio": m["redis_cpu_per_step_s"] / real_by_count[m["evaluations"]]["redis_cpu_per_step_s"]}
                        for m in models if m["evaluations"] in real_by_count), None)  # fmt: skip
    problems = checks(levels) + floor_checks(floor) + model_checks(models, args.think)
    heading = (f"one redis-server, N evaluations at once (arbiter serve + RemoteEnv agent thinking "
               f"{1000 * args.think:g} ms a step, CartPole), {session.transport}, window {args.window:g} s, "
               f"{pinned or 'Redis sharing the CPUs with the evaluations'}; "
               f"{machine_line(machine)}")  # fmt: skip
    print_report(levels, prediction, heading)
    if floor:
        print_floor(floor, levels[-1])
    if models:
        print_models(models, calibration)
    # What one core carries is read where Redis is loaded as a farm loads it, at the most modelled
    # evaluations, when the model costs Redis what the real evaluations do at the count both ran;
    # otherwise from the real evaluations alone.
    model_trusted = (
        bool(models)
        and calibration is not None
        and (CALIBRATION_BAND[0] <= calibration["ratio"] <= CALIBRATION_BAND[1])
    )
    judged = [models[-1]] if model_trusted else levels
    values = [level["evaluations_per_core"] for level in judged]
    print(TARGET.line(values, [f"{level['evaluations']} {'modelled' if model_trusted else 'at once'}"
                               for level in judged]))  # fmt: skip
    if models and not model_trusted:
        print(
            f"the target is judged on the real evaluations: the model's cost per step is not within "
            f"{CALIBRATION_BAND[0]:g}-{CALIBRATION_BAND[1]:g} × theirs at the count both ran"
        )
    print("checks: " + ("every agent stepped through the window; every evaluation ended SUCCESS"
                        + ("; the modelled agents kept the pace" if models else "")
                        if not problems else "; ".join(problems)))  # fmt: skip
    write_json(args.json, {"machine": machine, "think_s": args.think, "levels": levels, "prediction": prediction,
                           "floor": floor, "models": models, "calibration": calibration, "model_trusted": model_trusted,
                           "target": TARGET.report(values), "problems": problems})  # fmt: skip
    return 1 if problems else 0


WORKERS = {"agent": worker_agent, "model": worker_model, "floor-ask": worker_floor_ask,
           "floor-answer": worker_floor_answer}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--evaluations", default="10,20,40", help="evaluations at once, comma-separated, "
                        "smallest first (default 10,20,40)")  # fmt: skip
    parser.add_argument("--think", type=float, default=0.05, help="the agent's think time per step, s (default 0.05)")
    parser.add_argument("--window", type=float, default=20.0, help="measured seconds per level (default 20)")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds after the go before measuring (default 1)")
    parser.add_argument("--idle", type=float, default=2.0, help="seconds Redis is measured with agents waiting")
    parser.add_argument("--timeout", type=float, default=300.0, help="per level and per reply, s (default 300)")
    parser.add_argument("--model", default="40,250,500,1000", help="modelled evaluations at once, comma-separated, "
                        "smallest first; the first also among --evaluations, to compare (default 40,250,500,1000; "
                        "empty: none)")  # fmt: skip
    parser.add_argument("--model-processes", type=int, default=2, help="processes sending the modelled traffic")
    parser.add_argument("--unix", action="store_true", help="meet over Redis's unix socket, as a worker's private "
                        "Redis and its containers do (default: loopback TCP)")  # fmt: skip
    parser.add_argument("--pin", action="store_true", help="Redis alone on the first CPU, the evaluations on the "
                        "others (default: all share every CPU)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="2 and 4 at once, short windows")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, results)")
    parser.add_argument("--no-floor", action="store_true", help="skip the bare exchanges (the floor, run at the "
                        "largest --evaluations count)")  # fmt: skip
    parser.add_argument("--worker", choices=list(WORKERS), help=argparse.SUPPRESS)
    for hidden in ("--redis-url", "--service-id", "--ready", "--go", "--out"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--until", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--reply-timeout", type=float, default=300.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return WORKERS[args.worker](args)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    parts = [part.strip() for part in args.evaluations.split(",")]
    if not all(part.isdigit() and int(part) >= 1 for part in parts):
        print(f"bench: --evaluations {args.evaluations!r}: give counts, e.g. 10,20,40", file=sys.stderr)
        return 2
    if args.think <= 0 or args.window <= 0 or args.settle < 0 or args.idle <= 0:
        print("bench: --think, --window and --idle must be positive, --settle at least 0", file=sys.stderr)
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
