"""The evaluator's Redis transport: commands in order, few round trips for many commands, and never
more than TAKE_BYTES taken from Redis at once, whatever the agent pushed."""

from __future__ import annotations

import threading
import time

import hiredis
import pytest

from arbiter.protocol import keys
from arbiter.protocol.errors import ConfigError
from arbiter.protocol.redis_conn import LARGE_ARGUMENT
from arbiter.server.service import transport as transport_module
from arbiter.server.service import waits as waits_module
from arbiter.server.service.replies import REPLY_TTL_S, Replies
from arbiter.server.service.transport import POP_BATCH, REQUEST_LIMIT, TAKE_BYTES, RedisTransport


def pop_calls(redis_conn) -> dict[str, int]:
    """Round trips that wait (BLMOVE) and that take (the bounded take: its script by text or digest)."""
    stats = redis_conn.info("commandstats")
    calls = {name: stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("blmove", "eval", "evalsha")}
    return {"wait": calls["blmove"], "take": calls["eval"] + calls["evalsha"]}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in after}


def wait_until_blocked(redis_conn) -> None:
    deadline = time.monotonic() + 5.0
    while not any(c.get("cmd") == "blmove" for c in redis_conn.client_list()):  # the evaluator is blocked
        assert time.monotonic() < deadline, "the transport never blocked in BLMOVE"
        time.sleep(0.005)


@pytest.fixture
def transport(redis_url, service_id):
    transport = RedisTransport(redis_url, service_id)
    yield transport
    transport.close()


def test_commands_queued_while_waiting_come_out_in_order_from_one_round_trip(transport, redis_conn, service_id):
    """The blocking wait and the take of what queued behind it travel together."""
    commands = [f"command-{n}".encode() for n in range(10)]
    popped: list[bytes | None] = []
    waiting = threading.Thread(target=lambda: popped.append(transport.pop(time.monotonic() + 10.0)))
    before = pop_calls(redis_conn)
    waiting.start()
    wait_until_blocked(redis_conn)
    # LPUSH with several values queues them atomically, first value first out (the clients LPUSH).
    redis_conn.lpush(keys.commands_key(service_id), *commands)
    waiting.join(timeout=5.0)
    assert popped == [commands[0]]
    rest = [transport.pop(time.monotonic() + 10.0) for _ in commands[1:]]
    assert rest == commands[1:]
    assert delta(pop_calls(redis_conn), before) == {"wait": 1, "take": 1}


def test_a_backlog_is_taken_a_batch_per_round_trip_in_order(transport, redis_conn, service_id):
    count = 2 * POP_BATCH + 5
    commands = [f"step-{n}".encode() for n in range(count)]
    redis_conn.lpush(keys.commands_key(service_id), *commands)
    before = pop_calls(redis_conn)
    assert [transport.pop(time.monotonic() + 10.0) for _ in range(count)] == commands
    calls = delta(pop_calls(redis_conn), before)
    # Every round trip carries one take (after a wait when it may wait), each taking a full batch.
    assert calls["take"] == 3 and calls["wait"] <= calls["take"], calls


def test_nothing_queued_returns_none_after_the_deadline_and_takes_nothing_later(transport, redis_conn, service_id):
    deadline = time.monotonic() + 0.3
    assert transport.pop(deadline) is None
    assert time.monotonic() >= deadline
    redis_conn.lpush(keys.commands_key(service_id), b"after")
    assert transport.queued() == 1  # left in Redis for the next pop, not swallowed
    assert transport.pop(time.monotonic() + 5.0) == b"after"


def test_with_nothing_queued_a_pop_ends_within_milliseconds_of_its_deadline(transport):
    """Redis times a blocked client out on its own timer (10 times a second at its default hz), so
    with nothing else waking it a blocking wait returns up to about 100 ms late. The transport
    blocks only until POLL_MARGIN_S before the deadline and polls the rest: a budget ends on time."""
    late_ms = []
    for wait_s in (0.013, 0.05, 0.137, 0.21, 0.33):  # deadlines that fall anywhere in Redis's timer period
        deadline = time.monotonic() + wait_s
        assert transport.pop(deadline) is None
        late_ms.append((time.monotonic() - deadline) * 1000)
    assert min(late_ms) >= 0 and max(late_ms) < 30, [round(ms, 1) for ms in late_ms]


def test_a_fast_agents_reply_is_in_redis_as_soon_as_it_is_given(transport, redis_conn, service_id):
    channel = keys.response_key(service_id, "e" * 32)
    transport.reply(channel, b"answer")  # a new transport's agent counts as fast until it shows otherwise
    # No other call of the transport yet: the reply was written at once, and Redis stored it.
    assert redis_conn.blpop([channel], timeout=5) == (channel.encode(), b"answer")
    assert transport.packets.unread == 2  # RPUSH and EXPIRE, read with the next packet's replies
    redis_conn.lpush(keys.commands_key(service_id), b"next")
    assert transport.pop(time.monotonic() + 5.0) == b"next"
    assert transport.packets.unread == 0


def test_a_slow_agents_reply_rides_the_packet_that_waits_for_the_next_request(redis_url, redis_conn, service_id):
    transport = RedisTransport(redis_url, service_id, eager_within_s=0.0)  # every agent is slower than that
    redis_conn.lpush(keys.commands_key(service_id), b"first")
    assert transport.pop(time.monotonic() + 5.0) == b"first"
    channel = keys.response_key(service_id, "a" * 32)
    transport.reply(channel, b"answer")
    assert transport.packets.unread == 0 and redis_conn.llen(channel) == 0  # not written yet
    popped: list[bytes | None] = []
    waiter = threading.Thread(target=lambda: popped.append(transport.pop(time.monotonic() + 5.0)))
    waiter.start()
    # The evaluator now blocks waiting for the next request; its packet carried the reply.
    assert redis_conn.blpop([channel], timeout=5) == (channel.encode(), b"answer")
    redis_conn.lpush(keys.commands_key(service_id), b"next")
    waiter.join(timeout=5)
    try:
        assert popped == [b"next"]
        assert transport.packets.unread == 0 and not transport.replies
    finally:
        transport.close()


def test_a_reply_is_in_redis_before_the_idle_work_starts(redis_url, redis_conn, service_id):
    transport = RedisTransport(redis_url, service_id, eager_within_s=0.0)
    redis_conn.lpush(keys.commands_key(service_id), b"first")
    assert transport.pop(time.monotonic() + 5.0) == b"first"
    channel = keys.response_key(service_id, "d" * 32)
    transport.reply(channel, b"answer")
    seen_during_idle_work: list[list[bytes]] = []
    pending = [True]

    def idle_work() -> None:
        seen_during_idle_work.append(redis_conn.lrange(channel, 0, -1))
        pending[0] = False
        redis_conn.lpush(keys.commands_key(service_id), b"next")

    try:
        assert transport.pop(time.monotonic() + 10.0, idle_pending=lambda: pending[0], idle_work=idle_work) == b"next"
        assert seen_during_idle_work == [[b"answer"]]
    finally:
        transport.close()


def test_a_reply_whose_write_fails_goes_out_with_the_next_packet(transport, redis_conn, service_id):
    channel = keys.response_key(service_id, "b" * 32)
    first_id = transport.packets.run([("CLIENT", "ID")])[0]
    redis_conn.client_kill_filter(_id=first_id)  # Redis hangs up: the write or its reading fails
    transport.reply(channel, b"kept")
    redis_conn.lpush(keys.commands_key(service_id), b"next")
    assert transport.pop(time.monotonic() + 5.0) == b"next"
    assert redis_conn.lrange(channel, 0, -1) in ([b"kept"], [b"kept", b"kept"])  # written once, or again
    assert transport.packets.unread == 0 and not transport.replies


def test_push_error_follows_the_replies_given_before_it(transport, redis_conn, service_id):
    channel = keys.response_key(service_id, "c" * 32)
    transport.reply(channel, b"first")
    transport.push_error(b"then the error")
    assert transport.packets.unread == 0  # Redis had stored the reply before the error was pushed
    assert redis_conn.lrange(channel, 0, -1) == [b"first"]
    assert redis_conn.lrange(keys.errors_key(service_id), 0, -1) == [b"then the error"]


# -- what one round trip may take, whatever the agent pushed -----------------------------------


def bytes_sent_by_redis(redis_conn) -> int:
    return redis_conn.info("stats")["total_net_output_bytes"]


def test_a_request_over_the_limit_reaches_the_evaluator_cut_to_one_byte_over_it(transport, redis_conn, service_id):
    huge = bytes(range(256)) * (16 << 10)  # 4 MiB
    around = [b"before", huge, b"after"]
    popped: list[bytes | None] = []
    waiting = threading.Thread(target=lambda: popped.append(transport.pop(time.monotonic() + 10.0)))
    waiting.start()
    wait_until_blocked(redis_conn)
    sent_before = bytes_sent_by_redis(redis_conn)
    redis_conn.lpush(keys.commands_key(service_id), *around)
    waiting.join(timeout=5.0)
    popped += [transport.pop(time.monotonic() + 10.0) for _ in around[1:]]
    # What Redis sent anyone meanwhile: the take's bytes and a few replies, never the 4 MiB.
    assert bytes_sent_by_redis(redis_conn) - sent_before < TAKE_BYTES + 4096
    assert popped == [b"before", huge[: REQUEST_LIMIT + 1], b"after"]
    assert transport.queued() == 0


def test_one_round_trip_takes_at_most_take_bytes(transport, redis_conn, service_id):
    requests = [bytes([n]) * (30 << 10) for n in range(6)]  # two fit in TAKE_BYTES, three do not
    redis_conn.lpush(keys.commands_key(service_id), *requests)
    before = pop_calls(redis_conn)
    assert [transport.pop(time.monotonic() + 10.0) for _ in requests] == requests
    assert delta(pop_calls(redis_conn), before)["take"] == 3


def test_pop_nowait_takes_one_request_cut_like_the_others(transport, redis_conn, service_id):
    redis_conn.lpush(keys.commands_key(service_id), b"x" * (1 << 20), b"next")
    assert transport.pop_nowait() == b"x" * (REQUEST_LIMIT + 1)
    assert transport.queued() == 1
    assert transport.pop_nowait() == b"next"
    assert transport.pop_nowait() is None


def test_a_redis_that_lost_the_script_is_given_it_again(transport, redis_conn, service_id):
    redis_conn.lpush(keys.commands_key(service_id), b"first")
    assert transport.pop(time.monotonic() + 5.0) == b"first"  # the script is cached from here on
    redis_conn.script_flush()
    redis_conn.lpush(keys.commands_key(service_id), b"second")
    before = redis_conn.info("commandstats").get("cmdstat_eval", {}).get("calls", 0)
    assert transport.pop(time.monotonic() + 5.0) == b"second"
    assert redis_conn.info("commandstats")["cmdstat_eval"]["calls"] == before + 1  # its text went again


def test_a_redis_user_that_may_not_switch_replies_off_is_refused_with_the_reason(redis_url, redis_conn, service_id):
    redis_conn.execute_command("ACL", "SETUSER", "no-client", "on", ">pw", "~*", "+@all", "-client")
    transport = RedisTransport(redis_url.replace("redis://", "redis://no-client:pw@", 1), service_id)
    try:
        redis_conn.lpush(keys.commands_key(service_id), b"x" * (1 << 20), b"next")
        for _ in range(2):  # the connection whose answers were out of step is not read again
            with pytest.raises(ConfigError, match="must be allowed CLIENT REPLY"):
                transport.pop(time.monotonic() + 5.0)
    finally:
        transport.close()
        redis_conn.acl_deluser("no-client")


def test_the_wait_is_packed_once_and_again_only_when_its_timeout_changes(
    transport, redis_conn, service_id, monkeypatch
):
    """Packing the wait's four commands costs more than the rest of a turn's bookkeeping: turns
    that wait with the same timeout send the same packed commands."""
    packs: list[tuple] = []

    def counted_pack(command: tuple) -> bytes:
        packs.append(command)
        return hiredis.pack_command(command)

    monkeypatch.setattr(waits_module, "pack", counted_pack)
    commands_key = keys.commands_key(service_id)
    far = time.monotonic() + 30.0  # every wait blocks for MAX_BLOCK_S
    packed_after = []
    for n in range(5):
        redis_conn.lpush(commands_key, f"step-{n}".encode())
        assert transport.pop(far) == f"step-{n}".encode()
        packed_after.append(len(packs))
    # The first wait sends the take's script as text; once Redis has it, by its digest: packed
    # again once, then never.
    assert packed_after == [4, 8, 8, 8, 8]
    assert [packs[1][0], packs[1][-1], packs[3][0], packs[7][0]] == [
        "BLMOVE",
        transport_module.MAX_BLOCK_S,
        "EVAL",
        "EVALSHA",
    ]
    redis_conn.lpush(commands_key, b"near its deadline")
    assert transport.pop(time.monotonic() + 0.5) == b"near its deadline"  # a shorter wait: packed again
    assert len(packs) == 12 and packs[9][0] == "BLMOVE" and packs[9][-1] < transport_module.MAX_BLOCK_S


# -- a reply that takes the wait for the next request along ------------------------------------


def blocked_clients(redis_conn) -> int:
    return sum(1 for client in redis_conn.client_list() if client.get("cmd") == "blmove")


def test_a_reply_given_its_next_deadline_goes_out_with_the_wait_for_the_next_request(transport, redis_conn, service_id):
    """One packet, written at once: the reply is in Redis and the evaluator blocked in its wait
    before the transport is called again; the next pop reads that wait's answers."""
    channel = keys.response_key(service_id, "f" * 32)
    before = pop_calls(redis_conn)
    transport.reply(channel, b"answer", next_deadline=time.monotonic() + 30.0)
    assert redis_conn.blpop([channel], timeout=5) == (channel.encode(), b"answer")
    wait_until_blocked(redis_conn)
    redis_conn.lpush(keys.commands_key(service_id), b"next")
    assert transport.pop(time.monotonic() + 30.0) == b"next"
    assert delta(pop_calls(redis_conn), before) == {"wait": 1, "take": 1}  # no second wait
    assert transport.packets.unread == 0 and not transport.replies


def test_a_reply_whose_next_deadline_is_too_near_to_block_for_goes_out_alone(transport, redis_conn, service_id):
    channel = keys.response_key(service_id, "9" * 32)
    deadline = time.monotonic() + transport_module.POLL_MARGIN_S + transport_module.MIN_BLOCK_S / 2
    transport.reply(channel, b"answer", next_deadline=deadline)
    assert transport.packets.unread == 2 and blocked_clients(redis_conn) == 0  # RPUSH and EXPIRE only
    assert transport.pop(deadline) is None and time.monotonic() >= deadline
    redis_conn.lpush(keys.commands_key(service_id), b"after")
    assert transport.pop(time.monotonic() + 5.0) == b"after"


def test_a_wait_sent_with_a_reply_ends_in_time_for_its_deadline(transport, redis_conn, service_id):
    """Its timeout is the one the pop would have blocked for: the pop returns None at the
    deadline (not a blocking wait's later), and what comes after stays queued."""
    channel = keys.response_key(service_id, "8" * 32)
    deadline = time.monotonic() + 0.4
    transport.reply(channel, b"answer", next_deadline=deadline)
    wait_until_blocked(redis_conn)
    assert transport.pop(deadline) is None
    # A wait of MAX_BLOCK_S would have kept it past the deadline by more than half a second.
    assert deadline <= time.monotonic() < deadline + 0.45
    redis_conn.lpush(keys.commands_key(service_id), b"late")
    assert transport.queued() == 1
    assert transport.pop(time.monotonic() + 5.0) == b"late"


def test_pop_nowait_reads_the_wait_sent_with_a_reply_first_and_keeps_the_order(transport, redis_conn, service_id):
    transport.reply(keys.response_key(service_id, "7" * 32), b"answer", next_deadline=time.monotonic() + 30.0)
    wait_until_blocked(redis_conn)
    redis_conn.lpush(keys.commands_key(service_id), b"first", b"second")  # one LPUSH: first out first
    assert [transport.pop_nowait(), transport.pop_nowait(), transport.pop_nowait()] == [b"first", b"second", None]


def test_push_error_after_a_reply_with_its_wait_keeps_what_that_wait_took(transport, redis_conn, service_id):
    channel = keys.response_key(service_id, "6" * 32)
    transport.reply(channel, b"answer", next_deadline=time.monotonic() + 30.0)
    wait_until_blocked(redis_conn)
    redis_conn.lpush(keys.commands_key(service_id), b"next")
    transport.push_error(b"the error")
    assert redis_conn.lrange(keys.errors_key(service_id), 0, -1) == [b"the error"]
    assert redis_conn.lrange(channel, 0, -1) == [b"answer"]
    assert transport.pop(time.monotonic() + 5.0) == b"next"  # taken by the wait, handed out now


def test_a_connection_lost_under_a_sent_wait_loses_neither_the_reply_nor_the_request(transport, redis_conn, service_id):
    channel = keys.response_key(service_id, "5" * 32)
    own_id = transport.packets.run([("CLIENT", "ID")])[0]
    transport.reply(channel, b"kept", next_deadline=time.monotonic() + 30.0)
    wait_until_blocked(redis_conn)
    redis_conn.client_kill_filter(_id=own_id)  # Redis hangs up on the blocked wait
    redis_conn.lpush(keys.commands_key(service_id), b"next")
    popped = transport.pop(time.monotonic() + 30.0)
    if popped is None:  # the pop ended with the outage it rode out, as after any outage
        assert transport.outages == 1
        popped = transport.pop(time.monotonic() + 30.0)
    assert popped == b"next"
    assert redis_conn.lrange(channel, 0, -1) in ([b"kept"], [b"kept", b"kept"])  # written once, or again
    assert transport.packets.unread == 0 and not transport.replies


def test_a_stop_from_another_thread_ends_the_read_of_a_sent_wait(redis_url, redis_conn, service_id, monkeypatch):
    monkeypatch.setattr(transport_module, "MAX_BLOCK_S", 60.0)  # the wait alone would outlast the test
    transport = RedisTransport(redis_url, service_id)
    outcome: list[object] = []

    def pop() -> None:
        try:
            outcome.append(transport.pop(time.monotonic() + 120.0))
        except BaseException as exc:  # StopRequested, as the service loop gets it
            outcome.append(exc)

    try:
        transport.reply(keys.response_key(service_id, "4" * 32), b"answer", next_deadline=time.monotonic() + 120.0)
        waiting = threading.Thread(target=pop)
        waiting.start()
        deadline = time.monotonic() + 5.0
        while transport._waiting_thread is None:
            assert time.monotonic() < deadline, "the pop never read the sent wait"
            time.sleep(0.005)
        transport.request_stop()
        waiting.join(timeout=5.0)
        assert not waiting.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], transport_module.StopRequested)
    finally:
        transport.close()


def test_a_reply_refused_with_wrongtype_under_a_sent_wait_is_counted_and_the_wait_still_takes(
    transport, redis_conn, service_id
):
    channel = keys.response_key(service_id, "3" * 32)
    redis_conn.set(channel, "the agent made its reply list a string")
    transport.reply(channel, b"answer", next_deadline=time.monotonic() + 30.0)
    wait_until_blocked(redis_conn)
    redis_conn.lpush(keys.commands_key(service_id), b"next")
    assert transport.pop(time.monotonic() + 5.0) == b"next"
    assert transport.refused_replies == 1 and transport.outages == 0


def test_a_sent_wait_whose_script_redis_lost_takes_with_the_scripts_text(transport, redis_conn, service_id):
    redis_conn.lpush(keys.commands_key(service_id), b"first")
    assert transport.pop(time.monotonic() + 5.0) == b"first"  # the script is cached from here on
    redis_conn.script_flush()
    transport.reply(keys.response_key(service_id, "2" * 32), b"answer", next_deadline=time.monotonic() + 30.0)
    wait_until_blocked(redis_conn)
    before = redis_conn.info("commandstats").get("cmdstat_eval", {}).get("calls", 0)
    redis_conn.lpush(keys.commands_key(service_id), b"second")
    assert transport.pop(time.monotonic() + 5.0) == b"second"
    assert redis_conn.info("commandstats")["cmdstat_eval"]["calls"] == before + 1


@pytest.mark.parametrize("size", [0, 1, 200, LARGE_ARGUMENT, LARGE_ARGUMENT + 1])
def test_a_replys_commands_are_what_hiredis_packs_and_a_large_one_is_left_unpacked(size):
    """A reply's RPUSH and EXPIRE are framed by hand (replies.framed_reply): byte for byte what
    hiredis packs; one over LARGE_ARGUMENT stays arguments, sent as it is by the packet."""
    channel = keys.response_key("sid-1", "0123456789abcdef" * 2)
    message = (bytes(range(256)) * (size // 256 + 1))[:size]  # CR, LF, "$" and "*" among its bytes
    replies = Replies()
    replies.add(channel, message)
    commands = replies.commands()
    expected = [("RPUSH", channel, message), ("EXPIRE", channel, REPLY_TTL_S)]
    if size > LARGE_ARGUMENT:
        assert commands == expected
    else:
        assert commands == [hiredis.pack_command(command) for command in expected]


def test_replies_large_and_small_reach_their_lists_whole_with_their_expiry(transport, redis_conn, service_id):
    small, large = b"\r\n*1\r\n$3\r\nnot a command", bytes(range(256)) * (LARGE_ARGUMENT // 256 + 1)
    channels = [keys.response_key(service_id, f"{n:032x}") for n in (1, 2)]
    transport.reply(channels[0], small)
    transport.reply(channels[1], large)
    transport.flush()
    assert [redis_conn.lrange(channel, 0, -1) for channel in channels] == [[small], [large]]
    assert all(0 < redis_conn.ttl(channel) <= REPLY_TTL_S for channel in channels)
