"""server/cli/progress.py: what a person watching ``arbiter run`` / ``arbiter serve`` reads.

The bank note is checked directly (the words for items are in tests/core/test_words.py); the lines
themselves are those a real evaluation (two-phase on a counting env, over the session's
redis-server) prints as its episodes end, and the table it prints at its end.
"""

from __future__ import annotations

import io
import re
import threading
from typing import Any

from fake_envs import counting_competition
from harness import remote_episode

from arbiter.client.remote_env import RemoteEnv
from arbiter.server.cli.progress import Progress, bank_note
from arbiter.server.service.build import build_service, run_to_end


def test_a_bank_note_only_when_the_bank_was_drawn_on():
    assert bank_note({"time_bank_used_s": 0.25}) == "  bank used 0.250 s"
    assert bank_note({"time_bank_used_s": 0.0}) == "" and bank_note({}) == ""
    assert bank_note({"time_bank_used_s": "a lot"}) == ""


def test_a_disabled_progress_prints_nothing():
    stream = io.StringIO()
    Progress(stream, enabled=False).note("anything")
    assert stream.getvalue() == ""


def test_the_start_lines_name_the_evaluation_and_mark_a_debug_run():
    stream = io.StringIO()
    Progress(stream, format_name="metalc").started(
        service_id="svc", tests="/data/meta", episodes=6, competition="metalc", debug=True, redis="redis://h:1/0"
    )
    first, second = stream.getvalue().splitlines()
    assert first == (
        "arbiter: evaluating 6 datasets of /data/meta (metalc) [DEBUG run: shortened, not an official score]"
    )
    assert second == "arbiter: service id 'svc' on redis://h:1/0; waiting for the agent"


def evaluate_with_progress(redis_url: str, service_id: str, results: str, actions: list[int]) -> tuple[str, Any]:
    """A counting evaluation of one episode per action, its progress printed into a string."""
    stream = io.StringIO()
    progress = Progress(stream, format_name="two-phase")
    service = build_service(
        counting_competition(num_episodes=len(actions)),
        tests=None,
        results_dir=results,
        redis_url=redis_url,
        service_id=service_id,
        on_episode=progress.episode,
    )
    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.update(summary=run_to_end(service, progress, results)))
    thread.start()
    try:
        env = RemoteEnv(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        for action in actions:
            remote_episode(env, lambda observation, action=action: action, {})
        env.submit()
        env.close()
    finally:
        thread.join(timeout=20)
        if thread.is_alive():
            service.request_stop("the test gave up")
            thread.join(timeout=10)
    assert not thread.is_alive()
    return stream.getvalue(), outcome["summary"]


def test_a_line_per_episode_then_the_results_table(redis_url, service_id, tmp_path):
    results = str(tmp_path / "results")
    printed, summary = evaluate_with_progress(redis_url, service_id, results, actions=[1, 0])
    lines = printed.splitlines()
    episode_lines = [line for line in lines if re.match(r"\[\d/2\] ", line)]
    assert [line[:6] for line in episode_lines] == ["[1/2] ", "[2/2] "]
    # The score so far follows the episodes: 10 after the first, then the mean of 10 and 5.
    assert "score so far 10.0000" in episode_lines[0] and "score so far 7.5000" in episode_lines[1]
    assert all(re.search(r"time left \d+m\d\ds", line) for line in episode_lines)
    assert f"state: SUCCESS - {summary['termination_cause']}" in lines
    assert f"primary   ({summary['score']['primary_name']}): 7.500000" in lines
    assert lines[-1].startswith("evaluation time: ") and lines[-1].endswith(f"s; results in {results}")
