"""`arbiter serve` stopped by SIGTERM as soon as its evaluation has started on disk (its started
event written), before anything was served: the evaluation ends INTERRUPTED with a summary and
exit status 130, as a stop at any later moment does, never killed by the signal without a word."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import paths
from harness import read_summary, wait_for


def started(results: str) -> bool:
    path = os.path.join(results, "events.jsonl")
    return os.path.exists(path) and '"event":"started"' in open(path, encoding="utf-8").read()


def test_a_stop_as_the_started_event_is_written_ends_interrupted(redis_url, service_id, tiny_tests, tmp_path):
    for attempt in range(3):  # the moment right after the event is a few milliseconds wide
        results = str(tmp_path / f"results-{attempt}")
        evaluator = subprocess.Popen(
            [sys.executable, "-m", "arbiter.server.cli", "serve", "--tests", tiny_tests, "--redis-url", redis_url,
             "--service-id", f"{service_id}-{attempt}", "--results", results, "--quiet"],
            cwd=str(paths.REPO), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for(lambda e=evaluator, r=results: started(r) or e.poll() is not None, timeout_s=30, what="its start")
            evaluator.send_signal(signal.SIGTERM)
            status = evaluator.wait(timeout=10)
            said = evaluator.stdout.read().decode()
        finally:
            if evaluator.poll() is None:
                evaluator.kill()
                evaluator.wait()
        assert status == 130, (status, said)
        summary = read_summary(results)
        assert summary["state"] == "INTERRUPTED" and "SIGTERM" in summary["termination_cause"], summary
