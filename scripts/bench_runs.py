"""One measured run of each Flatland benchmark path (and of the extra checks): the processes it
takes, started in order, waited for, and their results joined with what the evaluator wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench_flatland import TESTSET_SEED, replicated_test_set
from harness import BenchError, Proc, Runs, new_service_id, read_results, serve_argv


class Bench(Runs):
    # -- the four paths ----------------------------------------------------------------------

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

    def run_mirrored(self, tests: Path, label: str) -> dict[str, Any]:
        """The floor (bench_flatland_floor.py): the lean loop with every step sent through Redis
        to a process that steps its own copy, as flatland's protocol has an evaluator do."""
        meet = ["--tests", str(tests), "--redis-url", self.redis_url, "--service-id", new_service_id(label),
                "--reply-timeout", str(self.args.reply_timeout)]  # fmt: skip
        env_side = self.procs.worker(f"mirror-env-{label}", "mirror-env", *meet)
        agent = self.procs.worker(f"mirror-{label}", "mirror", *meet)
        self.procs.wait([agent, env_side], self.args.timeout)
        return agent.result()

    def start_arbiter_server(self, tests: Path, service_id: str) -> Proc:
        argv = serve_argv(self.redis_url, service_id, self.results_dir(service_id), "--tests", str(tests))
        return self.procs.start(f"arbiter-serve-{service_id}", argv)

    def arbiter_agent_argv(self, service_id: str, *extra: str) -> list[str]:
        return self.procs.worker_argv("arbiter", "--redis-url", self.redis_url, "--service-id", service_id,
                                      "--reply-timeout", str(self.args.reply_timeout), *extra)  # fmt: skip

    def run_arbiter(self, tests: Path, label: str) -> dict[str, Any]:
        service_id = new_service_id(label)
        serve = serve_argv(self.redis_url, service_id, self.results_dir(service_id), "--tests", str(tests))
        out = self.session.evaluate(label, serve, self.arbiter_agent_argv(service_id), self.args.timeout)
        out.update(flatland_results(self.results_dir(service_id)))
        return out

    def run_flatland(self, tests: Path, label: str) -> dict[str, Any]:
        service_id = new_service_id(label)
        port = str(self.session.redis.port)  # flatland-rl's client and service speak loopback TCP only
        (server,) = self.session.start_servers([lambda: self.procs.worker(
            f"flatland-service-{label}", "flatland-service", "--tests", str(tests), "--service-id", service_id,
            "--port", port, "--results", str(self.results_dir(service_id)) + ".csv",
            env={"TEST_MIN_PERCENTAGE_COMPLETE_MEAN": "0"},
        )])  # fmt: skip
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
        connection = ("--redis-url", self.redis_url, "--service-id", service_id)
        (server,) = self.session.start_servers([lambda: self.procs.worker("proto-server", "proto-server", *connection)])
        client = self.procs.worker("proto-client", "proto-client", *connection, "--n", str(n),
                                   "--reply-timeout", str(self.args.reply_timeout))  # fmt: skip
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
        tests = replicated_test_set(tiny, self.session.workdir / f"memory-{episodes}", episodes)
        service_id = new_service_id("memory")
        (server,) = self.session.start_servers([lambda: self.start_arbiter_server(tests, service_id)])
        agent = self.procs.start("memory-agent", self.arbiter_agent_argv(
            service_id, "--rss-pid", str(server.popen.pid), "--rss-every", str(every)))  # fmt: skip
        self.procs.wait([agent, server], self.args.timeout * max(1, episodes / 200))
        out = agent.result()
        state = flatland_results(self.results_dir(service_id))["state"]
        report = {"episodes": episodes, "every": every, "state": state, "wall_s": out["wall_s"]}
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
        servers = self.session.start_servers(
            [lambda sid=sid: self.start_arbiter_server(tests, sid) for sid in service_ids]
        )
        agents = [self.procs.start(f"scale-agent-{i}", self.arbiter_agent_argv(sid))
                  for i, sid in enumerate(service_ids)]  # fmt: skip
        self.procs.wait(agents + servers, self.args.timeout * count)
        runs = []
        for sid, agent in zip(service_ids, agents, strict=True):
            out = agent.result()
            out.update(flatland_results(self.results_dir(sid)))
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


def flatland_results(results: Path) -> dict[str, Any]:
    """What arbiter's evaluator wrote of a Flatland evaluation, in the benchmark's terms."""
    written = read_results(results)
    score = written["summary"].get("score") or {}
    return {
        "state": written["state"],
        "score": {k: score.get(k) for k in ("primary", "secondary")},
        "server_step_mean_s": written["server_step_mean_s"],
        "server_think_mean_s": written["server_think_mean_s"],
        "server_evaluation_s": (written["summary"].get("timing") or {}).get("evaluation_s"),
        "server_episodes": [{"env": r["env"], "agents": r["num_agents"], "steps": r["steps"], "arrived": r["arrived"]}
                            for r in written["records"]],
    }  # fmt: skip
