"""`arbiter serve --private-redis`: a Redis that serves one evaluation alone (a hosted
evaluation's own) and stays full was filled by its agent. The evaluation fails for it; on a Redis
that may be shared, the same refusals stop it as INTERRUPTED, for a resume."""

from __future__ import annotations

import json
import subprocess
import sys

import paths
import pytest
import redis

from arbiter.client import RemoteEnv
from arbiter.server.cli.embedded_redis import EmbeddedRedis


@pytest.mark.parametrize("private", [True, False], ids=["private", "maybe-shared"])
def test_a_redis_that_stays_full_fails_a_private_evaluation_and_interrupts_another(private, service_id, tmp_path):
    """The agent starts its first episode; then the Redis is full (its maxmemory brought under
    what it holds, as an agent's junk would fill it): the evaluator's next write, the planning
    timeout, is refused until the outage limit passes."""
    results = tmp_path / "r"
    with EmbeddedRedis() as server:
        command = [sys.executable, "-m", "arbiter.server.cli", "serve", "--competition", "two-phase-cartpole",
                   "--phase", "1", "--seed", "3", "--redis-url", server.url, "--service-id", service_id,
                   "--results", str(results), "--planning-timeout", "0.5", "--redis-outage-timeout", "0.5",
                   "--quiet", *(["--private-redis"] if private else [])]  # fmt: skip
        serving = subprocess.Popen(command, cwd=str(paths.REPO), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True)  # fmt: skip
        try:
            env = RemoteEnv(redis_url=server.url, service_id=service_id, reply_timeout_s=30)
            env.reset()
            redis.Redis.from_url(server.url).config_set("maxmemory", 1)  # full from now on
            status = serving.wait(timeout=30)
            stderr = serving.stderr.read()
            env.close()
        finally:
            if serving.poll() is None:
                serving.kill()
                serving.wait()
    summary = json.loads((results / "summary.json").read_text())
    assert "refused writes for more than 0.5 s" in summary["termination_cause"]
    if private:
        assert (status, summary["state"]) == (1, "FAILED"), stderr
        assert summary["termination_cause"].startswith("the agent filled its evaluation's Redis")
    else:
        assert (status, summary["state"]) == (130, "INTERRUPTED"), stderr
