"""A Redis client with explicit timeouts and no silent retries.

redis-py retries failed commands by default; a retried LPUSH duplicates a request and a
retried BLPOP can wait many times its timeout, so every retry here is the caller's decision.
``bounded_take`` pops from a list without ever receiving more than a given number of bytes,
whatever another client pushed there.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from hiredis import pack_command
from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
from redis.backoff import NoBackoff
from redis.retry import Retry

# What a connection reads from its socket at once: redis-py's default, and a size for the sides
# that receive large replies (a client whose observations are frames). hiredis's reader slows
# down sharply on a large reply fed in many small chunks: a 740 KB frame parses in ~1 ms from
# 64 KiB reads and in ~60 µs from 1 MiB reads; small replies read a little faster (~3 % a step)
# into the smaller buffer.
READ_CHUNK = 64 * 1024
LARGE_READ_CHUNK = 1 << 20
# A command argument larger than this is framed by hand and sent as it is: hiredis's packer
# copies a large argument slowly (~1.2 ms for 740 KB, where a plain copy takes ~25 µs).
LARGE_ARGUMENT = 64 * 1024
# A command: its arguments, or the command already packed (``pack``).
Command = tuple[Any, ...] | bytes

# How many forks this process descends from: a Packets made before a fork sees it is in a child
# by this number, without asking the kernel for its pid at every exchange (a system call each).
_fork_generation = 0


def _count_fork() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_count_fork)


def connect(redis_url: str, socket_timeout_s: float, read_chunk: int = READ_CHUNK) -> redis.Redis:
    return redis.Redis.from_url(
        redis_url,
        socket_read_size=read_chunk,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=min(socket_timeout_s, 10.0),
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        health_check_interval=0,
    )


class Packets:
    """Packets of commands, each sent in one write on one connection kept for them, their
    replies returned in order: what a non-transactional pipeline does, without its per-command
    bookkeeping and the pool's per-call checkout, which together cost as much Python time as
    the round trip itself on a step's path. Replies are Redis's own (a blocking pop gives
    ``[key, value]`` or None). Not for use by several threads at once.

    redis-py connects (address, password, database) and parses (its hiredis reader); the packet's
    bytes are written and its replies read here, straight on the connection's socket: redis-py's
    per-reply layers cost more than the parsing itself on a step's path.

    An error reply is raised once every reply of its packet has been read (or returned in its
    place, for a caller that sorts them: ``run(..., errors_in_place=True)``); any other failure
    (a lost connection, an exception from a signal handler) closes the connection, so no reply
    of one packet is ever read as another's, and the next packet connects again.
    """

    def __init__(self, client: redis.Redis, waiter: Any = None):
        self._pool = client.connection_pool
        # What waits for a reply's bytes: the socket's own blocking read, or an object whose
        # ``recv_into(sock, buffer, fresh)`` does (the client's ``SpinWait``, which polls first).
        self._waiter = waiter
        self._connection: Any = None
        self._unread = 0  # replies of sent commands not read yet (``send``)
        self._fork_generation = _fork_generation

    def read_in_chunks_of(self, size: int) -> None:
        """Read replies ``size`` bytes at a time from now on (``LARGE_READ_CHUNK`` for a side that
        receives large replies): the next packet goes out on a new connection with that buffer."""
        pool = self._pool
        self.close()
        kwargs = {**pool.connection_kwargs, "socket_read_size": size}
        self._pool = redis.ConnectionPool(connection_class=pool.connection_class, **kwargs)

    @property
    def unread(self) -> int:
        """Replies of sent commands that no ``run`` has read yet."""
        return self._unread

    def send(self, commands: Sequence[Command], unanswered: int = 0) -> None:
        """Write ``commands`` now and read their replies with the next ``run``'s: what must reach
        Redis at once (a reply an agent waits for) without waiting for Redis's answer.
        ``unanswered``: how many of ``commands`` Redis sends no reply for (as in ``run``)."""
        self._exchange(commands, read=False, unanswered=unanswered)

    def run(self, commands: Sequence[Command], errors_in_place: bool = False, unanswered: int = 0) -> list[Any]:
        """Write ``commands`` and return their replies (read after those of earlier sends). An
        error reply is raised, or with ``errors_in_place`` returned as its ``ResponseError``,
        the replies of earlier sends included. ``unanswered``: how many of ``commands`` Redis
        sends no reply for (``CLIENT REPLY OFF`` and those it runs before ``CLIENT REPLY ON``)."""
        return self._exchange(commands, read=True, errors_in_place=errors_in_place, unanswered=unanswered)

    def _exchange(
        self, commands: Sequence[Command], read: bool, errors_in_place: bool = False, unanswered: int = 0
    ) -> list[Any]:
        self.connect()  # closed after a failure, or never opened
        connection = self._connection
        try:
            sock = connection._sock
            if commands:
                for piece in packed(commands):
                    sock.sendall(piece)
            if not read:
                self._unread += len(commands) - unanswered
                return []
            parser = connection._parser
            replies = [self._reply(sock, parser) for _ in range(self._unread + len(commands) - unanswered)]
            self._unread = 0
        except TimeoutError as exc:  # the socket's timeout: Redis hung
            self._lost(connection)
            raise redis.TimeoutError(f"Timeout talking to Redis at {connection._host_error()}") from exc
        except OSError as exc:
            self._lost(connection)
            raise redis.ConnectionError(f"Error talking to Redis at {connection._host_error()}: {exc}") from exc
        except BaseException:
            self._lost(connection)
            raise
        if errors_in_place:
            return replies
        for reply in replies:
            if isinstance(reply, redis.ResponseError):  # read whole, like the replies after it
                raise reply
        return replies[len(replies) - (len(commands) - unanswered) :]

    def _own_connection(self) -> Any:
        if self._fork_generation != _fork_generation:
            # A forked child never writes on its parent's socket (nor shuts it down): it leaves
            # the inherited connection alone and opens its own, as redis-py's pool does.
            self._connection = None
            self._unread = 0
            self._fork_generation = _fork_generation
        if self._connection is None:
            self._connection = self._pool.get_connection()
        return self._connection

    def connect(self) -> None:
        """Connect now, if not connected: a caller that checks for an ``interrupt`` before a
        blocking exchange does so once the socket that exchange will use exists, so an interrupt
        after the check finds that socket."""
        connection = self._own_connection()
        if connection._sock is None:
            try:
                connection.connect()
            except BaseException:
                self._lost(connection)
                raise
            self._unread = 0

    def interrupt(self) -> None:
        """For another thread than the one these packets belong to: end the exchange that thread
        waits in (a blocking pop) now. The connection's socket is shut down, so the exchange fails
        as a lost connection would, and the next one connects again."""
        sock = getattr(self._connection, "_sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed meanwhile by its own thread: nothing waits on it

    def _lost(self, connection: Any) -> None:
        connection.disconnect()
        self._unread = 0  # gone with the connection

    def _reply(self, sock: Any, parser: Any) -> Any:
        """The next reply (an error reply as its exception, not raised), read from ``sock`` as far
        as the parser needs."""
        reader = parser._reader
        reply = reader.gets()
        while reply is _NOT_ENOUGH_DATA:
            buffer = parser._buffer
            if self._waiter is None:
                size = sock.recv_into(buffer)
            else:
                size = self._waiter.recv_into(sock, buffer, not reader.has_data())
            if size == 0:
                raise ConnectionError("Redis closed the connection")
            reader.feed(buffer, 0, size)
            reply = reader.gets()
        return reply

    def close(self) -> None:
        if self._connection is not None:
            self._connection.disconnect()
            self._pool.release(self._connection)
            self._connection = None


def pack(command: tuple[Any, ...]) -> bytes:
    """``command`` in Redis's protocol, for a caller that sends the same command many times: a
    packed command goes into a packet as it is, where packing it again each time would cost the
    caller more than the rest of its turn's bookkeeping (the docs' performance log)."""
    return pack_command(command)


# A command of three arguments in Redis's protocol, to be %-formatted with each argument's length
# and bytes: what ``pack`` makes of it, for the commands of every step (a reply's, a request's),
# at a fraction of the cost of hiredis's packer.
THREE_ARGUMENTS = b"*3\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n"


def pack3(first: bytes, second: bytes, third: bytes) -> bytes:
    """A command of three arguments, given as bytes, packed (``THREE_ARGUMENTS``)."""
    return THREE_ARGUMENTS % (len(first), first, len(second), second, len(third), third)


def packed(commands: Sequence[Command]) -> list[bytes]:
    """The commands in Redis's protocol, as the pieces to write in order: one piece, unless an
    argument is larger than ``LARGE_ARGUMENT``, which is then a piece of its own (never copied).
    A command given as bytes is one packed already (``pack``)."""
    pieces = []
    for command in commands:
        if isinstance(command, bytes):
            pieces.append(command)
            continue
        for argument in command:
            if type(argument) is bytes and len(argument) > LARGE_ARGUMENT:  # _is_large, inlined: per step
                return _packed_around_large(commands)
        pieces.append(pack_command(command))
    return [b"".join(pieces)]


def _packed_around_large(commands: Sequence[Command]) -> list[bytes]:
    pieces: list[bytes] = []
    small: list[bytes] = []
    for command in commands:
        if isinstance(command, bytes):
            small.append(command)
            continue
        if not any(_is_large(argument) for argument in command):
            small.append(pack_command(command))
            continue
        small.append(b"*%d\r\n" % len(command))
        for argument in command:
            if _is_large(argument):
                small.append(b"$%d\r\n" % len(argument))
                pieces += [b"".join(small), argument]
                small = [b"\r\n"]
            else:
                value = _argument_bytes(argument)
                small.append(b"$%d\r\n%s\r\n" % (len(value), value))
    pieces.append(b"".join(small))
    return pieces


def _is_large(argument: Any) -> bool:
    return type(argument) is bytes and len(argument) > LARGE_ARGUMENT


def _argument_bytes(argument: Any) -> bytes:
    """An argument as redis-py and hiredis send it: text as UTF-8, numbers as their text."""
    if isinstance(argument, bytes):
        return argument
    if isinstance(argument, str):
        return argument.encode()
    if isinstance(argument, (int, float)) and not isinstance(argument, bool):
        return repr(argument).encode()
    raise TypeError(f"a Redis command argument must be bytes, text or a number, not {type(argument).__name__}")


# Runs inside Redis: takes up to ARGV[1] values from the tail of the list KEYS[1], the oldest
# first, while their bytes add up to at most ARGV[2]; a value over ARGV[3] bytes is cut to
# ARGV[3] + 1. One that does not fit any more is put back where it was, to be taken first next.
BOUNDED_TAKE_SCRIPT = """
local most, room, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local taken = {}
for i = 1, most do
  local value = redis.call('RPOP', KEYS[1])
  if not value then break end
  local kept = value
  if #kept > limit then kept = string.sub(kept, 1, limit + 1) end
  if #kept > room then
    redis.call('RPUSH', KEYS[1], value)
    break
  end
  room = room - #kept
  taken[i] = kept
end
return taken
"""
BOUNDED_TAKE_SHA = hashlib.sha1(BOUNDED_TAKE_SCRIPT.encode()).hexdigest()


def bounded_take(key: str, most: int, room: int, cut_after: int, cached: bool) -> tuple[Any, ...]:
    """The command that takes values from the tail of list ``key`` (the oldest, as LPUSH queues
    them) and never hands over more than ``room`` bytes, however large the values: at most
    ``most`` of them, each over ``cut_after`` bytes cut to ``cut_after + 1`` (``room`` must hold
    one such). Its reply is the list of values taken. ``cached``: Redis has run the script
    already (EVALSHA, which a Redis that lost its script cache answers with NOSCRIPT)."""
    script = ("EVALSHA", BOUNDED_TAKE_SHA) if cached else ("EVAL", BOUNDED_TAKE_SCRIPT)
    return (*script, 1, key, most, room, cut_after)


def redacted(redis_url: str) -> str:
    """The URL as it may be shown in logs and messages: any password replaced by ``***``."""
    parts = urlsplit(redis_url)
    if parts.password is None:
        return redis_url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
