"""`arbiter watch` as a real process, following a real evaluation through a real redis-server."""

from __future__ import annotations

import io
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import paths
import pytest
from harness import finish, play_episode, read_episodes, read_summary, running_service, spec, wait_for

from arbiter.client import RemoteClient
from arbiter.protocol import keys
from arbiter.server.cli.embedded_redis import free_port
from arbiter.server.cli.watch import WatchError, follow

WATCH = [sys.executable, "-m", "arbiter.server.cli", "watch"]


def start_watch(redis_url: str, service_id: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*WATCH, "--redis-url", redis_url, "--service-id", service_id, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def collect_lines(stream) -> list[str]:
    """The lines a process prints, gathered by a thread as they come."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(stream.readline, "")), daemon=True).start()
    return lines


def test_watch_follows_a_live_evaluation_to_the_end(redis_url, service_id, tiny_tests, tmp_path):
    with running_service(
        spec(), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        watcher = start_watch(redis_url, service_id, "--timeout", "20")
        try:
            lines = collect_lines(watcher.stdout)
            # The watcher is following before the agent plays a single step.
            wait_for(lambda: any("budgets:" in line for line in lines), what="the watcher's first lines")
            assert not any("[1/3]" in line for line in lines)
            client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
            for episode in range(3):
                assert client.env_create()[0]
                play_episode(client, episode)
                wait_for(lambda n=episode + 1: any(f"[{n}/3]" in line for line in lines), what=f"episode {episode}")
            client.submit()
            summary = finish(outcome)
            assert watcher.wait(timeout=20) == 0, watcher.stderr.read()
        finally:
            if watcher.poll() is None:
                watcher.kill()
                watcher.wait()
    text = "".join(lines)
    assert f"evaluation {service_id}: 3 episodes" in text
    assert "[3/3] Test_0/Level_2.pkl" in text and "score so far" in text
    assert "state: SUCCESS - all 3 episodes evaluated" in text
    assert f"primary   (mean normalized return): {summary['score']['primary']:.6f}" in text


@pytest.mark.parametrize("ending", ["FAILED", "INTERRUPTED"])
def test_a_late_watcher_sees_the_history_and_exits_with_the_state(ending, redis_url, service_id, tiny_tests, tmp_path):
    with running_service(
        spec(idle_s=0.2), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (service, outcome):
        if ending == "INTERRUPTED":
            service.request_stop("stopped by the test")
        assert finish(outcome)["state"] == ending  # no client: FAILED when the idle budget passes
    done = subprocess.run(
        [*WATCH, "--redis-url", redis_url, "--service-id", service_id, "--timeout", "10"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == {"FAILED": 1, "INTERRUPTED": 130}[ending], done.stderr
    assert f"evaluation {service_id}: 3 episodes" in done.stdout
    assert f"state: {ending} - " in done.stdout and "no score" in done.stdout


def test_watch_gives_up_after_its_timeout_with_no_event(redis_url, service_id):
    started = time.monotonic()
    done = subprocess.run(
        [*WATCH, "--redis-url", redis_url, "--service-id", service_id, "--timeout", "0.5"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert f"arbiter: error: no event from evaluation '{service_id}' for 0.5 s" in done.stderr
    assert time.monotonic() - started < 10


def test_watch_reports_an_unreachable_redis(service_id):
    done = subprocess.run(
        [*WATCH, "--redis-url", f"redis://127.0.0.1:{free_port()}/0", "--service-id", service_id],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "arbiter: error: cannot reach Redis" in done.stderr


@pytest.mark.parametrize("from_start", [True, False], ids=["from-start", "new-only"])
def test_the_timeout_bounds_the_wait_for_a_redis_that_never_answers(from_start, service_id):
    """A server that takes the connection and never answers: the error comes within --timeout
    (and a quarter second), not after the socket's own wait."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel takes connections; nothing ever reads them
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        started = time.monotonic()
        with pytest.raises(WatchError, match=r"cannot reach Redis: it did not answer within 0.75 s"):
            follow(url, service_id, timeout_s=0.5, from_start=from_start, out=io.StringIO())
        assert time.monotonic() - started < 1.5


def test_new_only_skips_the_history(redis_url, service_id, tiny_tests, tmp_path):
    with running_service(
        spec(idle_s=0.2), tests=tiny_tests, results=str(tmp_path / "r"), redis_url=redis_url, service_id=service_id
    ) as (_, outcome):
        finish(outcome)
    out = io.StringIO()
    assert follow(redis_url, service_id, timeout_s=5, out=out) == "FAILED"
    assert "state: FAILED" in out.getvalue()
    history = out.getvalue().splitlines()
    # The evaluation has ended: --new-only says how, at once, and shows none of what came before.
    out = io.StringIO()
    started = time.monotonic()
    assert follow(redis_url, service_id, timeout_s=30, from_start=False, out=out) == "FAILED"
    assert time.monotonic() - started < 5
    shown = out.getvalue().splitlines()
    assert shown[0].startswith("state: FAILED") and shown == history[-len(shown) :] and len(shown) < len(history)


# --- an evaluation that takes several runs of the evaluator (--resume) --------------------------

REPO = str(paths.REPO)


def serve(tiny_tests: str, redis_url: str, service_id: str, results: str) -> subprocess.Popen:
    """`arbiter serve --resume` as a hosted evaluation runs it (on a new folder: a fresh start)."""
    return subprocess.Popen(
        [sys.executable, "-m", "arbiter.server.cli", "serve", "--tests", tiny_tests, "--redis-url", redis_url,
         "--service-id", service_id, "--results", results, "--resume", "--quiet"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def play_next(client: RemoteClient, results: str, redis_conn) -> None:
    """The next episode, to its end, into the results folder and announced in the event stream
    (a kill right after the record is written may cost the event; the watcher's counts do not
    depend on it, see the streams written below, but its lines do)."""
    before = len(read_episodes(results, missing_ok=True))
    assert client.env_create()[0]
    index = client.episode_index
    play_episode(client, index)
    wait_for(lambda: len(read_episodes(results, missing_ok=True)) > before, what="the episode in episodes.jsonl")
    key = keys.events_key(client.service_id)
    wait_for(
        lambda: any(json.loads(fields[b"data"]).get("index") == index for _, fields in redis_conn.xrange(key)),
        what="the episode's event",
    )


def end(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


def test_watch_follows_an_evaluation_through_a_sigkill_and_its_resume(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path
):
    results = str(tmp_path / "r")
    evaluator = serve(tiny_tests, redis_url, service_id, results)
    watcher = start_watch(redis_url, service_id, "--timeout", "30")
    try:
        lines = collect_lines(watcher.stdout)
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=30, resend_after_s=0.3)
        play_next(client, results, redis_conn)
        wait_for(lambda: any("[1/3]" in line for line in lines), what="the watcher to show episode 0")
        evaluator.send_signal(signal.SIGKILL)  # no `finished` event: the run just stops
        evaluator.wait(timeout=10)
        evaluator = serve(tiny_tests, redis_url, service_id, results)
        play_next(client, results, redis_conn)
        play_next(client, results, redis_conn)
        client.submit()
        assert evaluator.wait(timeout=30) == 0, evaluator.stderr.read()
        assert watcher.wait(timeout=30) == 0, watcher.stderr.read()
    finally:
        end(evaluator)
        end(watcher)
    text = "".join(lines)
    assert read_summary(results)["state"] == "SUCCESS"
    assert "the evaluator's previous run ended without finishing (killed); this one continues it" in text
    competition = "flatland-neurips2020, scoring neurips2020"
    assert f"evaluation {service_id}: 3 episodes ({competition})\n" in text
    assert f"evaluation {service_id}: 3 episodes ({competition}, resumed after 1 episode)" in text
    assert "[3/3] Test_0/Level_2.pkl" in text
    assert "state: SUCCESS - all 3 episodes evaluated" in text and "3 of 3 episodes recorded" in text
    assert "INTERRUPTED" not in text


def test_a_late_watcher_follows_an_interrupted_then_killed_evaluation_to_its_end(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path
):
    results = str(tmp_path / "r")
    evaluator = serve(tiny_tests, redis_url, service_id, results)
    try:
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=30, resend_after_s=0.3)
        play_next(client, results, redis_conn)
        evaluator.send_signal(signal.SIGTERM)  # ends the run as INTERRUPTED: a `finished` event
        assert evaluator.wait(timeout=10) == 130
        evaluator = serve(tiny_tests, redis_url, service_id, results)
        # The agent, told of the stop until the resumed evaluator withdraws that notice, goes on once it has.
        wait_for(lambda: not redis_conn.llen(keys.errors_key(service_id)), what="the notice withdrawn")
        play_next(client, results, redis_conn)
        evaluator.send_signal(signal.SIGKILL)
        evaluator.wait(timeout=10)
        evaluator = serve(tiny_tests, redis_url, service_id, results)
        play_next(client, results, redis_conn)
        client.submit()
        assert evaluator.wait(timeout=30) == 0, evaluator.stderr.read()
    finally:
        end(evaluator)
    done = subprocess.run([*WATCH, "--redis-url", redis_url, "--service-id", service_id, "--timeout", "10"],
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "state: INTERRUPTED - stopped by SIGTERM" in lines
    score = read_summary(results)["score"]
    assert lines[-4:-1] == [
        "state: SUCCESS - all 3 episodes evaluated",
        f"primary   (mean normalized return): {score['primary']:.6f}",
        f"secondary (mean fraction of agents arrived): {score['secondary']:.6f}",
    ]
    assert lines[-1].startswith("3 of 3 episodes recorded, 0 timed out")
    resumed = [line for line in lines if "resumed after" in line]
    assert [line.split("resumed after ")[1] for line in resumed] == ["1 episode)", "2 episodes)"]
    assert [line.split("]")[0] for line in lines if line.startswith("[")] == ["[1/3", "[2/3", "[3/3"]


# --- streams written here: a replay, and items with many records -------------------------------


def publish(redis_conn, service_id: str, *events: dict) -> None:
    """Events as the evaluator XADDs them (server/events.py): the kind, and the event as JSON."""
    for event in events:
        redis_conn.xadd(keys.events_key(service_id), {"event": event["event"], "data": json.dumps(event)})


def started(resumed: bool, done: int, counts_items: bool = True) -> dict:
    """A ``started`` event: this evaluator's names its format and counts items in episodes_done;
    an older one's did neither (it counted records)."""
    event = {
        "event": "started",
        "service_id": "s",
        "competition": "two-phase-cartpole",
        "scoring": "two-phase",
        "format": "two-phase",
        "episodes_total": 4,
        "episodes_done": done,
        "resumed": resumed,
        "budgets": {"planning_s": 1, "step_s": 1, "overall_s": 60, "idle_s": 1, "max_successive_timeouts": 3},
    }
    if not counts_items:
        del event["format"]
    return event


def records(index: int, count: int) -> list[dict]:
    """An item's episode events: a training run's records are shown with its last one only."""
    return [
        {
            "event": "episode",
            "index": index,
            "episodes_done": index + 1,
            "episodes_total": 4,
            "text": f"item {index}" if k == count - 1 else None,
            "timed_out": False,
        }
        for k in range(count)
    ]


def finished(done: int, total: int = 4, **fields) -> dict:
    return {
        "event": "finished",
        "state": "SUCCESS",
        "termination_cause": "all done",
        "episodes_total": total,
        "episodes_done": done,
        "timed_out": 1,
        "evaluation_s": 1.5,
        "score": {"primary": 1.0, "primary_name": "phase 1 mean return", "secondary": None},
        **fields,
    }


def killed_replayed_and_finished(counts_items: bool) -> tuple[list[dict], dict]:
    """Items 0-2 played (item 1 a training run of 5 records), the evaluator killed, resumed, and
    the group of items 1-3 played again by a new agent. Killed at once, the first run's last
    event never reached the stream: this evaluator's resumed start still says 3 items are done;
    an older one counted the 7 records that were."""
    first_run = [started(False, 0, counts_items), *records(0, 1), *records(1, 5)]
    if not counts_items:
        first_run += records(2, 1)
    second_run = [
        started(True, 3 if counts_items else 7, counts_items),
        {"event": "replayed", "items": [1, 2, 3], "cause": "a new agent after the evaluator restarted"},
        *records(1, 4),
        *records(2, 1),
        {"event": "timeout", "index": 3, "env": "e", "kind": "step", "steps": 1},
        *records(3, 1),
    ]
    return first_run + second_run, finished(4 if counts_items else 7)


@pytest.mark.parametrize("counts_items", [True, False], ids=["this evaluator", "an older evaluator"])
def test_replayed_items_are_counted_once_and_the_replay_is_shown(counts_items, redis_conn, redis_url, service_id):
    history, end_event = killed_replayed_and_finished(counts_items)
    publish(redis_conn, service_id, *history, end_event)
    out = io.StringIO()
    assert follow(redis_url, service_id, timeout_s=5, out=out) == "SUCCESS"
    lines = out.getvalue().splitlines()
    items = "episodes and training runs" if counts_items else "episodes"
    assert f"evaluation s: 4 {items} (two-phase-cartpole, scoring two-phase)" in lines
    assert "the evaluator's previous run ended without finishing (killed); this one continues it" in lines
    assert f"evaluation s: 4 {items} (two-phase-cartpole, scoring two-phase, resumed after 3 {items})" in lines
    cause = "a new agent after the evaluator restarted"
    assert f"replayed: 3 {items} (#1-3) withdrawn, to be played again: {cause}" in lines
    assert f"TIMEOUT: {'item' if counts_items else 'episode'} 3 (e) exceeded its step budget after 1 step" in lines
    shown = [line.split("  |")[0] for line in lines if line.startswith("[")]
    assert shown == ["[1/4] item 0", "[2/4] item 1"] + ([] if counts_items else ["[3/4] item 2"]) + [
        "[2/4] item 1", "[3/4] item 2", "[4/4] item 3"
    ]  # fmt: skip
    assert lines[-1] == f"4 of 4 {items} recorded, 1 timed out, evaluation time 1.50 s"


def test_items_are_counted_in_the_words_the_started_event_gives(redis_conn, redis_url, service_id):
    """A two-phase plan of phase 1 alone holds episodes only: its started event says so."""
    phase1 = {**started(False, 0), "item_nouns": ["episode", "episodes"]}
    publish(redis_conn, service_id, phase1, *records(0, 1), *records(1, 1), *records(2, 1), *records(3, 1),
            finished(4))  # fmt: skip
    out = io.StringIO()
    assert follow(redis_url, service_id, timeout_s=5, out=out) == "SUCCESS"
    lines = out.getvalue().splitlines()
    assert "evaluation s: 4 episodes (two-phase-cartpole, scoring two-phase)" in lines
    assert lines[-1] == "4 of 4 episodes recorded, 1 timed out, evaluation time 1.50 s"


def test_new_only_counts_the_history_it_does_not_show(redis_conn, redis_url, service_id):
    history, end_event = killed_replayed_and_finished(counts_items=False)
    publish(redis_conn, service_id, *history)
    out = io.StringIO()
    outcome: dict = {}
    thread = threading.Thread(
        target=lambda: outcome.update(state=follow(redis_url, service_id, timeout_s=10, from_start=False, out=out)),
        daemon=True,
    )
    thread.start()
    # The watcher has read the history once it waits for what comes next.
    wait_for(lambda: any(client["cmd"] == "xread" for client in redis_conn.client_list()), what="the watcher's XREAD")
    publish(redis_conn, service_id, end_event)
    thread.join(timeout=10)
    assert outcome["state"] == "SUCCESS"
    assert out.getvalue().splitlines() == [
        "state: SUCCESS - all done",
        "primary   (phase 1 mean return): 1.000000",
        "4 of 4 episodes recorded, 1 timed out, evaluation time 1.50 s",
    ]


def test_an_interrupted_end_with_nothing_after_it_is_final(redis_conn, redis_url, service_id):
    one = {**started(False, 0), "format": "flatland", "episodes_total": 1}
    interrupted = finished(1, 1, state="INTERRUPTED", termination_cause="stopped by SIGTERM", score=None, timed_out=0)
    publish(redis_conn, service_id, one, {**records(0, 1)[0], "episodes_total": 1}, interrupted)
    out = io.StringIO()
    assert follow(redis_url, service_id, timeout_s=5, out=out) == "INTERRUPTED"
    assert out.getvalue().splitlines()[-2:] == [
        "no score",
        "1 of 1 episode recorded, 0 timed out, evaluation time 1.50 s",
    ]
