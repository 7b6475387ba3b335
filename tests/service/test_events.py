"""Live progress events: in the Redis stream and in events.jsonl, in order, whatever Redis does."""

from __future__ import annotations

import datetime
import json
import socket
import threading
import time

import pytest
from harness import (
    finish,
    play_episode,
    read_episodes,
    read_events,
    read_summary,
    running_service,
    spec,
    time_out_episode,
    wait_for,
)

from arbiter.client import RemoteClient
from arbiter.protocol import keys
from arbiter.server.cli.embedded_redis import free_port
from arbiter.server.service import events
from arbiter.server.service.build import build_service
from arbiter.server.service.events import EVENTS_TTL_S, EventLog


def stream_events(redis_conn, service_id: str) -> list[dict]:
    return [json.loads(fields[b"data"]) for _, fields in redis_conn.xrange(keys.events_key(service_id))]


def test_a_full_evaluation_with_a_timeout_publishes_its_events_in_order(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path
):
    results = str(tmp_path / "r")
    with running_service(
        spec(step_s=0.3, planning_s=5), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id
    ) as (service, outcome):
        assert service.evaluation.plan.__class__.__name__ == "FlatlandPlan"  # no recording wrapper
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        client.env_create()
        time_out_episode(client, redis_conn, episode=0, steps=3)
        for episode in (1, 2):
            assert client.env_create()[0]
            play_episode(client, episode)
        assert client.env_create() == (False, False)
        client.submit()
        summary = finish(outcome)

    events = read_events(results)
    assert [e["event"] for e in events] == ["started", "timeout", "episode", "episode", "episode", "finished"]
    # The stream holds the same events, in the same order, and expires now that it is over.
    assert stream_events(redis_conn, service_id) == events
    assert 0 < redis_conn.ttl(keys.events_key(service_id)) <= EVENTS_TTL_S

    started, timeout, *episode_events, finished_event = events
    assert started["service_id"] == service_id and started["competition"] == "test"
    assert started["episodes_total"] == 3 and started["episodes_done"] == 0 and started["resumed"] is False
    assert started["budgets"]["step_s"] == 0.3 and started["debug"] is False
    assert timeout["kind"] == "step" and timeout["index"] == 0 and timeout["steps"] == 3
    for event, record in zip(episode_events, read_episodes(results), strict=True):
        for field in ("index", "env", "steps", "normalized_return", "arrived_fraction", "timed_out", "timeout"):
            assert event[field] == record[field], field
        assert event["elapsed_s"] == record["elapsed_s"] and event["wall_s"] == record["wall_s"]
    assert [e["episodes_done"] for e in episode_events] == [1, 2, 3]
    assert episode_events[0]["timed_out"] is True and episode_events[0]["normalized_return"] == -1.0
    assert episode_events[-1]["score_so_far"] == pytest.approx(summary["score"]["primary"])
    assert finished_event["state"] == "SUCCESS"
    assert finished_event["termination_cause"] == summary["termination_cause"]
    assert finished_event["score"]["primary"] == summary["score"]["primary"]
    assert finished_event["score"]["secondary"] == summary["score"]["secondary"]
    assert finished_event["timed_out"] == 1 and finished_event["episodes_done"] == 3
    assert "events_unpublished" not in summary["counters"]


def test_a_stream_key_of_the_wrong_type_costs_the_stream_not_the_evaluation(
    redis_url, redis_conn, service_id, tiny_tests, tmp_path
):
    """XADD fails with WRONGTYPE on every event: counted, logged, and nothing else changes."""
    results = str(tmp_path / "r")
    key = keys.events_key(service_id)
    with running_service(spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        _,
        outcome,
    ):
        wait_for(lambda: redis_conn.xlen(key) == 1, what="the started event in the stream")
        redis_conn.delete(key)
        redis_conn.set(key, "not a stream")
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        for episode in range(3):
            assert client.env_create()[0]
            play_episode(client, episode)
        client.submit()
        summary = finish(outcome)

    assert summary["state"] == "SUCCESS" and summary["episodes"]["finished"] == 3
    assert read_summary(results)["counters"]["events_unpublished"] == 4  # 3 episodes + finished
    assert [e["event"] for e in read_events(results)] == ["started", "episode", "episode", "episode", "finished"]
    assert redis_conn.get(key) == b"not a stream"


def test_an_unreachable_redis_costs_the_stream_not_the_file(tmp_path):
    path = str(tmp_path / "events.jsonl")
    log = EventLog(path=path, redis_url=f"redis://127.0.0.1:{free_port()}/0", service_id="t-unreachable")
    for index in range(5):
        log.emit("episode", index=index)
    log.close()
    assert log.unpublished == 5 and log.unwritten == 0
    assert [e["index"] for e in read_events(str(tmp_path))] == [0, 1, 2, 3, 4]
    log.emit("episode", index=5)  # after close: ignored, never raised
    assert len(read_events(str(tmp_path))) == 5


def test_a_redis_that_does_not_answer_fills_the_queue_and_the_rest_is_dropped_and_counted(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(events, "EVENTS_QUEUE_LIMIT", 3)
    monkeypatch.setattr(events, "throttled_log", events.ThrottledLog(events.log))  # none said yet
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers: the first XADD hangs
    try:
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        log = EventLog(path=str(tmp_path / "events.jsonl"), redis_url=url, service_id="t-silent")
        log.emit("episode", index=0)
        wait_for(lambda: log._in_flight, what="the publisher to take the first event")
        for index in range(1, 8):
            log.emit("episode", index=index)
        assert log.dropped == 4  # three wait behind the one in flight; the four after them are dropped
        # Said once, not once per event (the rest within the second are counted with the next line).
        assert sum("events queue full" in record.getMessage() for record in caplog.records) == 1
        log.close(flush_s=0.2)
        assert log.unpublished == 8  # the dropped, and what the close gave up on (in flight and queued)
        assert [e["index"] for e in read_events(str(tmp_path))] == list(range(8))  # the file has them all
    finally:
        silent.close()


def test_the_stream_is_capped(redis_url, redis_conn, tmp_path):
    log = EventLog(path=str(tmp_path / "events.jsonl"), redis_url=redis_url, service_id="t-capped", maxlen=10)
    for index in range(1000):
        log.emit("episode", index=index)
    log.close()
    assert log.unpublished == 0
    # Approximate trimming drops whole stream nodes (100 entries by default): at most ~10 + 100 stay.
    assert 10 <= redis_conn.xlen(keys.events_key("t-capped")) <= 200
    assert len(read_events(str(tmp_path))) == 1000


def test_a_resumed_evaluation_appends_its_events(redis_url, redis_conn, service_id, tiny_tests, tmp_path):
    results = str(tmp_path / "r")
    key = keys.events_key(service_id)
    with running_service(spec(), tests=tiny_tests, results=results, redis_url=redis_url, service_id=service_id) as (
        service,
        outcome,
    ):
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        client.env_create()
        play_episode(client, 0)
        wait_for(lambda: read_episodes(results, missing_ok=True), what="episode 0 written")
        service.request_stop("stopped by the test")
        assert finish(outcome)["state"] == "INTERRUPTED"
    assert redis_conn.ttl(key) > 0

    service = build_service(spec(), tests=tiny_tests, results_dir=results, redis_url=redis_url, service_id=service_id,
                            resume=True)  # fmt: skip
    done: dict = {}
    thread = threading.Thread(target=lambda: done.update(summary=service.run()), daemon=True)
    thread.start()
    try:
        wait_for(lambda: redis_conn.xlen(key) == 4, what="the resumed run's started event")
        assert redis_conn.ttl(key) == -1  # expiry lifted while the evaluation runs again
        client = RemoteClient(redis_url=redis_url, service_id=service_id, reply_timeout_s=10)
        for episode in (1, 2):
            assert client.env_create()[0]
            play_episode(client, episode)
        client.submit()
        thread.join(timeout=20)
    finally:
        service.request_stop("test over")
        thread.join(timeout=10)
        service.close()
    assert done["summary"]["state"] == "SUCCESS"

    events = read_events(results)
    kinds = ["started", "episode", "finished", "started", "episode", "episode", "finished"]
    assert [e["event"] for e in events] == kinds
    assert [e["state"] for e in events if e["event"] == "finished"] == ["INTERRUPTED", "SUCCESS"]
    assert events[3]["resumed"] is True and events[3]["episodes_done"] == 1
    assert [e["index"] for e in events if e["event"] == "episode"] == [0, 1, 2]
    assert stream_events(redis_conn, service_id) == events


def test_an_events_time_is_written_as_datetime_writes_it():
    # rounded at the microsecond (the first one up into the next second), the first and last
    # millisecond of a second, seconds in a row (the second's text is kept between them), and now
    now = time.time()
    timestamps = [1764322012.9999996, 1764322012.0000004, 1764322013.0, 1764322013.0005, 1764322013.999,
                  1764322014.5, 1704067199.9995, 1704067200.0015, 951782400.25, now]  # fmt: skip
    for timestamp in timestamps:
        expected = datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat(timespec="milliseconds")
        assert events.wall_text(timestamp) == expected, timestamp
    assert datetime.datetime.fromisoformat(events.wall_text(now)).timestamp() == pytest.approx(now, abs=1e-3)
