#!/usr/bin/env python3
"""Where a remote step's time goes between the agent, Redis and the evaluator, read from the
kernel's scheduler events: nothing is added to the measured processes.

    python scripts/step_trace.py [--steps N] [--trace-s S] [--paths remote,floor] [--tcp] [--json PATH]
    python scripts/step_trace.py --from-events FILE --pids AGENT,EVALUATOR,REDIS

Each path of ``bench_remote_env.py`` named (``remote``: RemoteEnv against ``arbiter serve``;
``floor``: the same packets and Redis commands with no protocol) plays one run of up to ``--steps``
CartPole steps as that benchmark plays it; once its agent has run ``--settle-s``, ``perf record``
takes the scheduler's wake-ups and switches on every CPU for ``--trace-s``, and the run is stopped
there (what it would play after the trace is measured by ``bench_remote_env.py``). A step leaves two
marks there: the agent's request wakes Redis, and the evaluator's reply (with its next wait) wakes
Redis again; after each, Redis goes back to sleep once it has passed the message on. Each step
splits into

  agent      Redis asleep, the reply passed on -> the agent's write of its next request
  request    that write -> Redis asleep again, the request handed to the evaluator
  evaluator  -> the evaluator's write of its reply
  reply      that write -> Redis asleep, the reply passed on to the agent

(their sum is the step, from one request's write to the next). It also counts how many of each
side's writes woke Redis on another CPU than the writer's (an interrupt between CPUs, which on a
virtual machine is an exit to the hypervisor), and how much of the traced time each process ran
on each CPU. Tracing costs the machine a little: compare paths traced alike.

``--from-events`` analyses a trace recorded elsewhere: the text of ``perf script -F
tid,cpu,time,event,trace`` over a recording of ``sched:sched_wakeup`` and ``sched:sched_switch``,
with the thread ids of the agent, the evaluator (its main thread) and redis-server.

Needs ``perf`` (Debian: linux-perf) allowed to record scheduler tracepoints on every CPU (root, or
``kernel.perf_event_paranoid`` at -1 with tracefs readable). Exit status: 0 done; 2 perf missing or
refused, or a run that failed or ended before its trace.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEGMENTS = ("agent", "request", "evaluator", "reply", "step")
WHAT_RUNS = {
    "agent": "the agent: its reply read, its own turn, its next request written",
    "request": "Redis: the request queued and handed to the evaluator",
    "evaluator": "the evaluator: the request read, its turn, its reply written",
    "reply": "Redis: the reply passed on, the next wait set",
    "step": "one step, from a request's write to the next",
}
EVENTS = "sched:sched_wakeup,sched:sched_switch"
SCRIPT_FIELDS = "tid,cpu,time,event,trace"
# "  22600 [000] 80568.961000: sched:sched_wakeup: comm=redis-server pid=22339 prio=120 target_cpu=000"
_LINE = re.compile(
    r"^\s*(?P<tid>-?\d+)\s+\[(?P<cpu>\d+)\]\s+(?P<time>\d+\.\d+):\s+sched:(?P<event>\w+):\s*(?P<trace>.*)$"
)
_FIELD = re.compile(r"(\w+)=(\S+)")


class TraceError(RuntimeError):
    """perf missing or refused, or a run that gave nothing to trace."""


@dataclass
class Trace:
    """What one recording says about the three processes: every step's marks in order, and the
    time each ran on each CPU."""

    marks: list[tuple[float, str]] = field(default_factory=list)  # (µs, "agent" | "evaluator" | "asleep")
    crossed: Counter = field(default_factory=Counter)  # writes that woke Redis on another CPU, by writer
    writes: Counter = field(default_factory=Counter)
    ran_us: Counter = field(default_factory=Counter)  # (process, cpu) -> µs
    span_us: float = 0.0


def read_events(lines: Any, agent: int, evaluator: int, redis: int) -> Trace:
    """The marks of ``perf script -F tid,cpu,time,event,trace`` output (see the module's docstring)."""
    names = {agent: "agent", evaluator: "evaluator", redis: "redis"}
    trace = Trace()
    running: dict[str, tuple[float, str]] = {}  # cpu -> (since µs, who)
    first = last = None
    for line in lines:
        match = _LINE.match(line)
        if match is None:
            continue
        at = float(match["time"]) * 1e6
        cpu, tid = match["cpu"].lstrip("0") or "0", int(match["tid"])
        fields = dict(_FIELD.findall(match["trace"]))
        first = at if first is None else first
        last = at
        if match["event"] == "sched_wakeup":
            writer = names.get(tid)
            if fields.get("pid") == str(redis) and writer in ("agent", "evaluator"):
                trace.marks.append((at, writer))
                trace.writes[writer] += 1
                trace.crossed[writer] += (fields.get("target_cpu", "").lstrip("0") or "0") != cpu
        elif match["event"] == "sched_switch":
            if fields.get("prev_pid") == str(redis) and fields.get("prev_state", "").startswith("S"):
                trace.marks.append((at, "asleep"))
            if cpu in running:
                since, who = running[cpu]
                trace.ran_us[(who, cpu)] += at - since
            nxt = int(fields.get("next_pid", -1))
            running[cpu] = (at, names.get(nxt, "idle" if nxt == 0 else "other"))
    for cpu, (since, who) in running.items():  # still running when the trace ended
        trace.ran_us[(who, cpu)] += last - since
    trace.span_us = (last - first) if first is not None else 0.0
    return trace


def step_segments(marks: list[tuple[float, str]]) -> list[dict[str, float]]:
    """Each whole step among ``marks``: the agent's write, Redis asleep, the evaluator's write,
    Redis asleep, the agent's next write. A step whose marks are missing or out of that order (at
    the ends of the trace) is left out; a reset, a request and its reply too, counts as a step; a
    second write of the evaluator's before the agent's next one is part of its reply."""
    steps = []
    agent_at = evaluator_at = asleep_after_request = asleep_after_reply = None
    for at, mark in marks:
        if mark == "asleep":
            if evaluator_at is not None:
                asleep_after_reply = at  # the last time Redis slept before the agent's next write
            elif agent_at is not None:
                asleep_after_request = at
        elif mark == "evaluator":
            if agent_at is not None and evaluator_at is None and asleep_after_request is not None:
                evaluator_at = at
        else:  # the agent's write
            if evaluator_at is not None and asleep_after_reply is not None:
                steps.append({
                    "agent": at - asleep_after_reply,
                    "request": asleep_after_request - agent_at,
                    "evaluator": evaluator_at - asleep_after_request,
                    "reply": asleep_after_reply - evaluator_at,
                    "step": at - agent_at,
                })  # fmt: skip
            agent_at, evaluator_at, asleep_after_request, asleep_after_reply = at, None, None, None
    return steps


def summary(trace: Trace) -> dict[str, Any]:
    steps = step_segments(trace.marks)
    segments = {
        name: {"p50_us": statistics.median(s[name] for s in steps), "mean_us": statistics.mean(s[name] for s in steps)}
        for name in SEGMENTS
    } if steps else {}  # fmt: skip
    cpus = sorted({cpu for _, cpu in trace.ran_us}, key=int)
    shares = {
        who: {cpu: trace.ran_us[(who, cpu)] / trace.span_us for cpu in cpus if trace.ran_us[(who, cpu)] > 0}
        for who in ("agent", "evaluator", "redis", "idle")
    } if trace.span_us > 0 else {}  # fmt: skip
    return {
        "steps": len(steps),
        "traced_s": trace.span_us / 1e6,
        "traced_steps_per_s": len(steps) / (trace.span_us / 1e6) if trace.span_us > 0 else 0.0,
        "segments": segments,
        "woke_redis_on_another_cpu": {w: trace.crossed[w] / trace.writes[w] for w in trace.writes if trace.writes[w]},
        "cpu_shares": shares,
    }


def print_summary(name: str, result: dict[str, Any]) -> None:
    print(f"\n{name}: {result['steps']} whole steps in {result['traced_s']:.2f} s traced "
          f"({result['traced_steps_per_s']:,.0f} steps/s)")  # fmt: skip
    if not result["segments"]:
        print("  no whole step in the trace")
        return
    print(f"  {'segment':10s} {'p50 µs':>8s} {'mean µs':>8s}  what runs")
    for segment in SEGMENTS:
        figures = result["segments"][segment]
        print(f"  {segment:10s} {figures['p50_us']:8.1f} {figures['mean_us']:8.1f}  {WHAT_RUNS[segment]}")
    crossed = ", ".join(f"the {w}'s {share:.0%}" for w, share in result["woke_redis_on_another_cpu"].items())
    print(f"  writes that woke Redis on another CPU than the writer's: {crossed}")
    shares = "; ".join(
        f"{who} " + ", ".join(f"{share:.0%} on CPU {cpu}" for cpu, share in per_cpu.items())
        for who, per_cpu in result["cpu_shares"].items() if per_cpu
    )  # fmt: skip
    print(f"  of the traced time: {shares}")


# -- recording ---------------------------------------------------------------------------------


def perf_binary() -> str:
    binary = shutil.which("perf")
    if binary is None:
        raise TraceError("perf is not installed (Debian: apt-get install linux-perf)")
    probe = subprocess.run([binary, "record", "-q", "-e", EVENTS, "-a", "-o", "/dev/null", "--", "true"],
                           capture_output=True, text=True)  # fmt: skip
    if probe.returncode != 0:
        raise TraceError(
            f"perf may not record scheduler events on every CPU here ({probe.stderr.strip()[-300:]}): run as root, "
            "or set kernel.perf_event_paranoid to -1 with tracefs readable"
        )
    return binary


def record(perf: str, out: Path, seconds: float) -> list[str]:
    subprocess.run([perf, "record", "-q", "-e", EVENTS, "-a", "-o", str(out), "--", "sleep", str(seconds)],
                   check=True, capture_output=True)  # fmt: skip
    script = subprocess.run([perf, "script", "-i", str(out), "-F", SCRIPT_FIELDS],
                            check=True, capture_output=True, text=True)  # fmt: skip
    return script.stdout.splitlines()


def trace_path(bench: Any, session: Any, perf: str, path: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``path`` (bench_remote_env's), traced once its agent has settled, then stopped."""
    label = f"trace-{path}"
    names = {"remote": (f"agent-{label}", f"serve-{label}"), "floor": (f"floor-{label}", f"floor-env-{label}")}[path]
    outcome: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: outcome.update(result=_guarded(bench.run, path, label)), daemon=True)
    runner.start()
    procs: dict[str, Any] = {}
    deadline = time.monotonic() + args.timeout
    while len(procs) < 2 and runner.is_alive() and time.monotonic() < deadline:
        procs = {p.name: p for p in session.procs.procs if p.name in names}
        time.sleep(0.05)
    if len(procs) < 2:
        runner.join(args.timeout)
        raise TraceError(f"the {path} run ended before its processes were seen: {outcome.get('result')}")
    time.sleep(args.settle_s)
    if not runner.is_alive():
        raise TraceError(f"the {path} run ended before its trace began: give it more --steps")
    lines = record(perf, session.workdir / f"{label}.data", args.trace_s)
    ended = [name for name in names if procs[name].popen.poll() is not None]
    if ended:  # it failed, or played its last step while traced: the trace holds idle time too
        runner.join(args.timeout)
        raise TraceError(f"the {path} run ended while it was traced (give it more --steps): {outcome.get('result')}")
    # Traced: the rest of the run would add nothing to the figures, so both of its processes are
    # stopped now (by pid), and the run's own ending, an error, is not read.
    session.procs.stop([procs[name] for name in names])
    runner.join(args.timeout)
    agent, evaluator = (procs[name].popen.pid for name in names)
    redis = int(session.conn.info()["process_id"])
    return summary(read_events(lines, agent, evaluator, redis))


def _guarded(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except Exception as exc:  # reported by the tracing thread, which raises TraceError
        return exc


def run_traces(args: argparse.Namespace) -> dict[str, Any]:
    import bench_remote_env
    from harness import BenchSession

    perf = perf_binary()
    options = ["--steps", str(args.steps), "--timeout", str(args.timeout)] + (["--tcp"] if args.tcp else [])
    bench_args = bench_remote_env.build_parser().parse_args(options)
    results = {}
    with BenchSession("arbiter-step-trace-", script=Path(bench_remote_env.__file__).resolve()) as session:
        bench = bench_remote_env.RemoteEnvBench(bench_args, session, session.start_redis(args.tcp))
        for path in args.paths:
            print(f"step_trace: {path}: {args.steps} steps, traced for {args.trace_s:g} s after {args.settle_s:g} s",
                  flush=True)  # fmt: skip
            results[path] = trace_path(bench, session, perf, path, args)
    if session.failed():
        raise TraceError("a run failed (see above)")
    return results


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60_000,
                        help="the most CartPole steps a run takes: it stops once traced (default 60,000)")  # fmt: skip
    parser.add_argument("--settle-s", type=float, default=1.5, help="run time before the trace (default 1.5)")
    parser.add_argument("--trace-s", type=float, default=0.5, help="how long to trace (default 0.5)")
    parser.add_argument("--paths", default="remote,floor", help="of remote and floor (default both)")
    parser.add_argument("--tcp", action="store_true", help="loopback TCP instead of Redis's unix socket")
    parser.add_argument("--timeout", type=float, default=300.0, help="the limit per run, in seconds")
    parser.add_argument("--json", metavar="PATH", help="write the figures there")
    parser.add_argument("--from-events", metavar="FILE", help="analyse perf script text instead of running")
    parser.add_argument("--pids", help="with --from-events: AGENT,EVALUATOR,REDIS thread ids")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if set(args.paths) - {"remote", "floor"} or not args.paths:
        build_parser().error(f"--paths takes remote and floor, got {','.join(args.paths)!r}")
    try:
        if args.from_events:
            if not args.pids or len(args.pids.split(",")) != 3:
                build_parser().error("--from-events needs --pids AGENT,EVALUATOR,REDIS")
            agent, evaluator, redis = (int(pid) for pid in args.pids.split(","))
            with open(args.from_events, encoding="utf-8") as lines:
                results = {"trace": summary(read_events(lines, agent, evaluator, redis))}
        else:
            results = run_traces(args)
    except TraceError as exc:
        print(f"step_trace: {exc}", file=sys.stderr)
        return 2
    for name, result in results.items():
        print_summary(name, result)
    if {"remote", "floor"} <= set(results) and results["remote"]["segments"] and results["floor"]["segments"]:
        print("\nremote − floor, p50 µs: " + ", ".join(
            f"{s} {results['remote']['segments'][s]['p50_us'] - results['floor']['segments'][s]['p50_us']:+.1f}"
            for s in SEGMENTS))  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
