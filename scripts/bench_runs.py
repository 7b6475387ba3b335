"""One measured run of each Flatland benchmark path (and of the extra checks): the processes it
takes, started in order, waited for, and their results joined with what the evaluator wrote."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench_common import TESTSET_SEED, BenchError
from bench_procs import Proc, Processes, brpop_clients, new_service_id, replicated_test_set, wait_until_listening


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
        from arbiter.server.formats.flatland.generate import cached_test_set

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
