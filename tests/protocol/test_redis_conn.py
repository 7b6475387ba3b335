"""protocol/redis_conn.Packets against a real redis-server: one write per packet, replies in
order, error replies, lost connections and exceptions in the middle of a read."""

from __future__ import annotations

import threading

import hiredis
import pytest
import redis
from harness import in_forked_child, wait_for

from arbiter.protocol.redis_conn import LARGE_ARGUMENT, LARGE_READ_CHUNK, Packets, connect, pack, pack3, packed


@pytest.fixture
def packets(redis_url):
    client = connect(redis_url, socket_timeout_s=5.0)
    packets = Packets(client)
    yield packets
    packets.close()
    client.close()


def test_replies_come_back_in_the_order_of_the_commands(packets, redis_conn):
    replies = packets.run(
        [
            ("RPUSH", "list", b"a", b"b"),
            ("EXPIRE", "list", 600),
            ("LPOP", "list"),
            ("BLPOP", "list", 0.5),
            ("RPOP", "list", 5),
            ("RPOP", "list"),
        ]
    )
    assert replies == [2, 1, b"a", [b"list", b"b"], None, None]
    assert not redis_conn.exists("list")


def test_a_blocking_pop_waits_in_the_packet_for_what_another_client_pushes(packets, redis_conn):
    pushed = threading.Timer(0.05, lambda: redis_conn.lpush("queue", b"late"))
    pushed.start()
    try:
        assert packets.run([("RPOP", "nothing"), ("BRPOP", "queue", 2.0)]) == [None, [b"queue", b"late"]]
    finally:
        pushed.cancel()


def test_a_timed_out_blocking_pop_gives_none(packets):
    assert packets.run([("BRPOP", "empty", 0.01)]) == [None]


def test_one_connection_serves_every_packet(packets, redis_conn):
    ids = {packets.run([("CLIENT", "ID")])[0] for _ in range(5)}
    assert len(ids) == 1


def test_an_error_reply_is_raised_after_the_whole_packet_ran(packets, redis_conn):
    redis_conn.set("text", "not a list")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        packets.run([("LPUSH", "text", b"x"), ("RPUSH", "after", b"ran"), ("LLEN", "after")])
    assert redis_conn.lrange("after", 0, -1) == [b"ran"]
    # every reply of that packet was read: the next packet gets its own replies, not leftovers
    assert packets.run([("LLEN", "after"), ("ECHO", "next")]) == [1, b"next"]


def test_a_killed_connection_raises_connection_error_and_the_next_packet_reconnects(packets, redis_conn):
    first_id = packets.run([("CLIENT", "ID")])[0]
    redis_conn.client_kill_filter(_id=first_id)
    with pytest.raises(redis.ConnectionError):
        packets.run([("ECHO", "lost")])
    assert packets.run([("ECHO", "back")]) == [b"back"]
    assert packets.run([("CLIENT", "ID")])[0] != first_id


class Interrupt(BaseException):
    """Stands for an exception a signal handler raises in the middle of a read."""


def test_an_exception_in_the_middle_of_a_read_closes_the_connection_so_no_reply_is_read_as_another(
    packets, redis_conn, monkeypatch
):
    first_id = packets.run([("CLIENT", "ID")])[0]
    real_read = packets._reply
    reads = []

    def read_then_interrupt(*args, **kwargs):
        reads.append(real_read(*args, **kwargs))
        raise Interrupt

    monkeypatch.setattr(packets, "_reply", read_then_interrupt)
    with pytest.raises(Interrupt):
        packets.run([("ECHO", "one"), ("ECHO", "two")])
    monkeypatch.undo()
    assert reads == [b"one"]
    # "two" was never read on this connection: it was closed, and the next packet starts afresh
    assert packets.run([("ECHO", "three")]) == [b"three"]
    assert packets.run([("CLIENT", "ID")])[0] != first_id


def test_close_releases_the_connection_and_a_later_packet_opens_another(packets, redis_conn):
    packets.run([("ECHO", "x")])
    packets.close()
    assert packets._connection is None
    assert packets.run([("ECHO", "y")]) == [b"y"]


def test_packets_work_over_the_embedded_servers_unix_socket(redis_server):
    client = connect(redis_server.local_url, socket_timeout_s=5.0)
    packets = Packets(client)
    try:
        assert redis_server.local_url.startswith("unix://")
        assert packets.run([("ECHO", "unix"), ("DBSIZE",)])[0] == b"unix"
    finally:
        packets.close()
        client.close()


def test_a_forked_child_opens_its_own_connection_and_leaves_its_parents_alone(packets, redis_conn):
    parent_id = packets.run([("CLIENT", "ID")])[0]
    _, child_id = in_forked_child(lambda: packets.run([("CLIENT", "ID")])[0])
    assert int(child_id) != parent_id
    # the parent's connection is untouched: same id, replies still in step
    assert packets.run([("ECHO", "still mine"), ("CLIENT", "ID")]) == [b"still mine", parent_id]


def test_a_large_argument_is_sent_as_it_is_and_arrives_whole(packets, redis_conn):
    frame = bytes(range(256)) * 3000  # 768,000 bytes: framed by hand, not through hiredis's packer
    assert len(frame) > LARGE_ARGUMENT
    replies = packets.run(
        [("RPUSH", "frames", frame), ("EXPIRE", "frames", 600), ("RPUSH", "frames", b"small"), ("LLEN", "frames")]
    )
    assert replies == [1, 1, 2, 2]
    assert redis_conn.lrange("frames", 0, -1) == [frame, b"small"]
    assert packets.run([("LPOP", "frames")]) == [frame]


def test_packed_pieces_are_the_bytes_hiredis_would_send():
    large = b"L" * (LARGE_ARGUMENT + 1)
    commands = [("RPOP", "e"), ("RPUSH", "k", large), ("EXPIRE", "k", 600), ("BRPOP", "q", 0.25), ("ECHO", "é")]
    pieces = packed(commands)
    assert b"".join(pieces) == b"".join(hiredis.pack_command(command) for command in commands)
    assert any(piece is large for piece in pieces)  # the large argument itself, not a copy
    small_only = [("LPUSH", "c", b"x" * 100), ("BLPOP", "r", 2.0)]
    assert packed(small_only) == [b"".join(hiredis.pack_command(command) for command in small_only)]


def test_a_command_packed_ahead_goes_into_the_packet_as_it_is(packets, redis_conn):
    """``pack`` once, send many times: the bytes are those of the command given as arguments, in
    a packet of small commands or beside a large argument, and Redis answers each command."""
    large = b"L" * (LARGE_ARGUMENT + 1)
    length = pack(("LLEN", "packed-ahead"))
    assert packed([length, ("ECHO", "x")]) == [
        hiredis.pack_command(("LLEN", "packed-ahead")) + hiredis.pack_command(("ECHO", "x"))
    ]
    around_large = [length, ("RPUSH", "packed-ahead", large), length]
    as_arguments = [("LLEN", "packed-ahead"), ("RPUSH", "packed-ahead", large), ("LLEN", "packed-ahead")]
    pieces = packed(around_large)
    assert b"".join(pieces) == b"".join(hiredis.pack_command(command) for command in as_arguments)
    assert any(piece is large for piece in pieces)  # still written as it is
    assert packets.run(around_large) == [0, 1, 1]
    assert packets.run([length, ("RPUSH", "packed-ahead", b"small"), length]) == [1, 2, 2]
    assert redis_conn.lrange("packed-ahead", 0, -1) == [large, b"small"]


def test_an_argument_of_another_type_is_refused_before_anything_is_sent():
    with pytest.raises(TypeError, match="bytes, text or a number"):
        packed([("RPUSH", "k", b"x" * (LARGE_ARGUMENT + 1), None)])


def test_reading_in_larger_chunks_moves_to_a_new_connection_that_reads_large_replies_whole(packets, redis_conn):
    first_id = packets.run([("CLIENT", "ID")])[0]
    packets.read_in_chunks_of(LARGE_READ_CHUNK)
    frame = bytes(range(256)) * 4000
    replies = packets.run([("CLIENT", "ID"), ("RPUSH", "frames", frame), ("LPOP", "frames")])
    assert replies[0] != first_id and replies[1:] == [1, frame]
    # the old connection was closed (Redis notices a closed socket on its own time)
    wait_for(lambda: first_id not in [int(client["id"]) for client in redis_conn.client_list()], what="the close")


def test_sent_commands_are_read_with_the_next_run_which_returns_only_its_own_replies(packets, redis_conn):
    packets.send([("RPUSH", "sent", b"a"), ("EXPIRE", "sent", 600)])
    assert packets.unread == 2
    assert redis_conn.lrange("sent", 0, -1) == [b"a"]  # in Redis before anything was read
    assert packets.run([("LLEN", "sent"), ("ECHO", "own")]) == [1, b"own"]
    assert packets.unread == 0
    assert packets.run([]) == [] and packets.unread == 0


def test_sent_commands_that_redis_does_not_answer_are_not_waited_for(packets, redis_conn):
    packets.send(
        [("CLIENT", "REPLY", "OFF"), ("SET", "quiet", "v"), ("CLIENT", "REPLY", "ON"), ("GET", "quiet")], unanswered=2
    )
    assert packets.unread == 2  # CLIENT REPLY ON and GET
    assert packets.run([("ECHO", "own")]) == [b"own"] and packets.unread == 0
    assert redis_conn.get("quiet") == b"v"


def test_an_error_reply_to_a_sent_command_is_raised_by_the_next_run_after_reading_everything(packets, redis_conn):
    redis_conn.set("text", "not a list")
    packets.send([("RPUSH", "text", b"x")])
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        packets.run([("ECHO", "after")])
    assert packets.unread == 0
    assert packets.run([("ECHO", "clean")]) == [b"clean"]  # no reply of the failed run is left over


def test_errors_in_place_come_back_among_the_replies_with_those_of_earlier_sends(packets, redis_conn):
    redis_conn.set("text", "not a list")
    packets.send([("RPUSH", "text", b"x"), ("ECHO", "sent")])
    replies = packets.run([("LPUSH", "text", b"y"), ("ECHO", "mine")], errors_in_place=True)
    assert [type(r) if isinstance(r, Exception) else r for r in replies] == [
        redis.ResponseError, b"sent", redis.ResponseError, b"mine"
    ]  # fmt: skip
    assert str(replies[0]).startswith("WRONGTYPE") and packets.unread == 0
    assert packets.run([("ECHO", "clean")]) == [b"clean"]


def test_a_lost_connection_forgets_the_unread_replies_and_the_next_run_reconnects(packets, redis_conn):
    first_id = packets.run([("CLIENT", "ID")])[0]
    packets.send([("ECHO", "never read")])
    redis_conn.client_kill_filter(_id=first_id)
    with pytest.raises(redis.ConnectionError):
        packets.run([("ECHO", "lost")])
    assert packets.unread == 0
    assert packets.run([("ECHO", "back")]) == [b"back"]


@pytest.mark.parametrize(
    "arguments",
    [
        (b"LPUSH", b"flatland-rl::sid::commands", b"\x83\xa4type\r\n$3\r\n*1"),
        (b"BLPOP", "flatland-rl::sid::response::é".encode(), repr(0.25).encode()),
        (b"EXPIRE", b"k", b"600"),
        (b"X", b"", bytes(range(256)) * 300),
    ],
)
def test_pack3_frames_a_command_as_hiredis_does(arguments):
    assert pack3(*arguments) == hiredis.pack_command(arguments)


def test_a_packet_of_pack3_commands_is_answered_as_the_same_commands_as_arguments(packets, redis_conn):
    value = b"\r\n*2\r\n$4\r\nPING"  # protocol bytes inside a value stay a value
    replies = packets.run([pack3(b"RPUSH", b"l", value), pack3(b"EXPIRE", b"l", b"600"), ("LRANGE", "l", 0, -1)])
    assert replies == [1, 1, [value]]
