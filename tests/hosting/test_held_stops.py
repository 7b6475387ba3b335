"""server/service/held_stops.py (F21): a hosted attempt's stop signal that comes while the
attempt is still starting (its Redis, the evaluator being built) waits for the evaluator's
handler instead of killing the work-horse: the evaluation ends as INTERRUPTED, with its summary,
and its agent never starts. Against a real redis-server and a real evaluator, in a process of its
own (the signal is real)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import paths

from arbiter.server.service import held_stops

# A stop signal raised before run_local builds the evaluator; the agent would leave a file.
STOPPED_WHILE_STARTING = """
import json, os, signal, sys
from arbiter.server.cli.progress import Progress
from arbiter.server.cli.runner import run_local
from arbiter.server.core.competition import spec_from_dict
from arbiter.server.service import held_stops

redis_url, service_id, results, marker = sys.argv[1:5]
spec = spec_from_dict("held", {"format": "two-phase", "seed": 3, "env_id": "CartPole-v1", "num_episodes": 2,
                               "phase": 1, "budgets": {"step_s": 5.0, "planning_s": 5.0, "overall_s": 60.0}})
agent = [sys.executable, "-c", f"open({marker!r}, 'w').close()"]
with held_stops.held():
    os.kill(os.getpid(), signal.SIGTERM)  # as the lock keeper of a cancelled submission does
    outcome = run_local(spec, agent_command=agent, tests=None, results_dir=results, service_id=service_id,
                        redis_url=redis_url, progress=Progress(enabled=False, format_name=spec.format))
print(json.dumps({"state": outcome.summary["state"], "cause": outcome.summary["termination_cause"],
                  "agent_status": outcome.agent_status}))
"""


def test_a_stop_that_comes_while_the_evaluator_is_built_ends_it_interrupted_before_its_agent_starts(
    redis_url: str, tmp_path: Path
) -> None:
    results, marker = tmp_path / "results", tmp_path / "the-agent-ran"
    service_id = f"held-{uuid.uuid4().hex[:8]}"
    done = subprocess.run(
        [sys.executable, "-c", STOPPED_WHILE_STARTING, redis_url, service_id, str(results), str(marker)],
        cwd=paths.REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, f"the process died of its stop signal ({done.returncode}): {done.stderr}"
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome == {"state": "INTERRUPTED", "cause": "stopped by SIGTERM", "agent_status": None}
    summary = json.loads((results / "summary.json").read_text())
    assert summary["state"] == "INTERRUPTED" and summary["termination_cause"] == "stopped by SIGTERM"
    assert not marker.exists(), "the agent was started after the stop"


def test_held_notes_stop_signals_and_then_gives_back_the_handler_it_found() -> None:
    heard: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: heard.append(signum))
    try:
        with held_stops.held():
            signal.raise_signal(signal.SIGTERM)
            signal.raise_signal(signal.SIGTERM)
            assert heard == []  # noted, not obeyed: nothing is ready to obey it yet
            assert held_stops.take() == signal.SIGTERM
            assert held_stops.take() == signal.SIGTERM
            assert held_stops.take() is None  # each is taken once
            signal.raise_signal(signal.SIGTERM)
        assert held_stops.take() is None, "what was noted and not taken is forgotten with the block"
        signal.raise_signal(signal.SIGTERM)
        assert heard == [signal.SIGTERM], "the handler found before is back"
    finally:
        signal.signal(signal.SIGTERM, before)


def test_held_does_nothing_outside_the_main_thread() -> None:
    found: list[object] = []

    def elsewhere() -> None:
        with held_stops.held():
            found.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(timeout=10)
    assert found == [before]
