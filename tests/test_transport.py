"""The evaluator's Redis transport: commands in order, and few round trips for many commands."""

from __future__ import annotations

import threading
import time

import pytest

from arbiter.protocol import keys
from arbiter.server.transport import POP_BATCH, RedisTransport


def pop_calls(redis_conn) -> dict[str, int]:
    stats = redis_conn.info("commandstats")
    return {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("brpop", "rpop")}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in after}


@pytest.fixture
def transport(redis_url, service_id):
    transport = RedisTransport(redis_url, service_id)
    yield transport
    transport.close()


def test_commands_queued_while_waiting_come_out_in_order_from_one_round_trip(transport, redis_conn, service_id):
    """The blocking pop and the RPOP of what queued behind it travel together."""
    commands = [f"command-{n}".encode() for n in range(10)]
    popped: list[bytes | None] = []
    waiting = threading.Thread(target=lambda: popped.append(transport.pop(time.monotonic() + 10.0)))
    before = pop_calls(redis_conn)
    waiting.start()
    deadline = time.monotonic() + 5.0
    while not any(c.get("cmd") == "brpop" for c in redis_conn.client_list()):  # the evaluator is blocked
        assert time.monotonic() < deadline, "the transport never blocked in BRPOP"
        time.sleep(0.005)
    # LPUSH with several values queues them atomically, first value first out (the clients LPUSH).
    redis_conn.lpush(keys.commands_key(service_id), *commands)
    waiting.join(timeout=5.0)
    assert popped == [commands[0]]
    rest = [transport.pop(time.monotonic() + 10.0) for _ in commands[1:]]
    assert rest == commands[1:]
    assert delta(pop_calls(redis_conn), before) == {"brpop": 1, "rpop": 1}


def test_a_backlog_is_taken_a_batch_per_round_trip_in_order(transport, redis_conn, service_id):
    count = 2 * POP_BATCH + 5
    commands = [f"step-{n}".encode() for n in range(count)]
    redis_conn.lpush(keys.commands_key(service_id), *commands)
    before = pop_calls(redis_conn)
    assert [transport.pop(time.monotonic() + 10.0) for _ in range(count)] == commands
    calls = delta(pop_calls(redis_conn), before)
    # Every round trip carries one RPOP (after a BRPOP when it may wait), each taking a full batch.
    assert calls["rpop"] == 3 and calls["brpop"] <= calls["rpop"], calls


def test_nothing_queued_returns_none_after_the_deadline_and_takes_nothing_later(transport, redis_conn, service_id):
    deadline = time.monotonic() + 0.3
    assert transport.pop(deadline) is None
    assert time.monotonic() >= deadline
    redis_conn.lpush(keys.commands_key(service_id), b"after")
    assert transport.queued() == 1  # left in Redis for the next pop, not swallowed
    assert transport.pop(time.monotonic() + 5.0) == b"after"


def test_a_reply_is_in_redis_as_soon_as_it_is_given_and_its_acknowledgement_rides_the_next_packet(
    transport, redis_conn, service_id
):
    channel = keys.response_key(service_id, "a" * 32)
    transport.reply(channel, b"answer")
    # No other call of the transport yet: the reply was written at once, and Redis stored it.
    assert redis_conn.blpop([channel], timeout=5) == (channel.encode(), b"answer")
    assert transport.packets.unread == 2  # RPUSH and EXPIRE, read with the next packet's replies
    redis_conn.lpush(keys.commands_key(service_id), b"next")
    assert transport.pop(time.monotonic() + 5.0) == b"next"
    assert transport.packets.unread == 0


def test_a_reply_whose_write_fails_goes_out_with_the_next_packet(transport, redis_conn, service_id):
    channel = keys.response_key(service_id, "b" * 32)
    first_id = transport.packets.run([("CLIENT", "ID")])[0]
    redis_conn.client_kill_filter(_id=first_id)  # Redis hangs up: the write or its reading fails
    transport.reply(channel, b"kept")
    redis_conn.lpush(keys.commands_key(service_id), b"next")
    assert transport.pop(time.monotonic() + 5.0) == b"next"
    assert redis_conn.lrange(channel, 0, -1) in ([b"kept"], [b"kept", b"kept"])  # written once, or again
    assert transport.packets.unread == 0 and not transport._replies


def test_push_error_follows_the_replies_given_before_it(transport, redis_conn, service_id):
    channel = keys.response_key(service_id, "c" * 32)
    transport.reply(channel, b"first")
    transport.push_error(b"then the error")
    assert transport.packets.unread == 0  # Redis had stored the reply before the error was pushed
    assert redis_conn.lrange(channel, 0, -1) == [b"first"]
    assert redis_conn.lrange(keys.errors_key(service_id), 0, -1) == [b"then the error"]
