"""The evaluator's side of Redis: bounded blocking pops up to a deadline, replies, errors.

Redis checks blocking-command timeouts on its own timer (10 times a second by default), so a
blocking wait can return up to ~100 ms after its timeout. Budgets must be exact, so the
transport blocks only until ``POLL_MARGIN_S`` before the deadline and covers the last stretch
with non-blocking takes; the final take happens after the deadline, so a command queued before
the deadline is always seen, and nothing queued is ever dropped.

What the evaluator takes from Redis is bounded whatever the agent pushes (it may LPUSH values
of any size Redis accepts onto its commands list): the blocking wait leaves the requests in the
list and never sees one (``BLMOVE`` of the list onto itself, its reply switched off), and every
request is taken by a script that runs inside Redis (``redis_conn.bounded_take``; the
evaluator's user may run scripts, the participant's may not: see acl.py) and hands over at most
``TAKE_BYTES`` at once, cutting a request over the request size limit to one byte more than the
limit: enough to refuse it as too large, and no more.

While a fast agent decides its next step, the evaluator polls its socket for the request
before sleeping on it (``protocol/spin_wait.py``: a window of ``spin_us``, adaptive, off with
fewer than two CPUs): sleeping would leave its vCPU idle, and the agent's request would first
have to wake that vCPU for Redis to hand it over.

A reply and the wait for the next request go out in one packet when the service knows, as it
replies, when that wait must end (``reply(..., next_deadline=...)``): Redis is then woken once a
turn instead of twice, and the evaluator finishes its turn (notices, the next deadline) while
Redis already holds its wait. Nothing else is written on the connection until that wait's answers
are read (``_run_after_replies`` reads them first, whoever calls it), since Redis runs nothing of
a client's behind a blocked command.

Every call rides out Redis's outages and its refusals of writes for want of memory
(redis_calls.py); a stop requested by another thread ends the pop the evaluator waits in at once
(``request_stop``).
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from arbiter.protocol import keys
from arbiter.protocol.errors import ConfigError
from arbiter.protocol.redis_conn import Command, Packets, connect
from arbiter.protocol.spin_wait import SpinWait, polling_window
from arbiter.server.service.redis_calls import (  # noqa: F401 - RedisUnavailable, StopRequested: the service's
    DEFAULT_OUTAGE_LIMIT_S,
    OutageRidingCalls,
    RedisUnavailable,
    StopRequested,
)
from arbiter.server.service.replies import Replies
from arbiter.server.service.waits import (  # noqa: F401 - REQUEST_LIMIT, TAKE_BYTES: the benchmarks'
    POP_BATCH,
    REQUEST_LIMIT,
    TAKE_BYTES,
    WAIT_ANSWERED,
    WAIT_UNANSWERED,
    WaitCommands,
)

log = logging.getLogger(__name__)

POLL_MARGIN_S = 0.12  # longer than Redis's timer period at its default hz of 10
# Redis turns a blocking timeout into whole milliseconds and 0 means "block forever": never send
# a timeout that could round down to 0.
MIN_BLOCK_S = 0.01
POLL_INTERVAL_S = 0.0005
MAX_BLOCK_S = 1.0  # wake up at least this often to notice the agent's exit (arbiter run's watch of it)
# A Redis call that has not answered this long after its own blocking wait ended fails with a
# timeout: Redis is hung (an outage). What the call waited past its blocking wait is downtime.
HUNG_AFTER_S = 10.0
# Work done while waiting (preparing the next episode) runs only when the deadline is further
# away than this: far longer than that work takes, so it never delays a budget decision.
IDLE_WORK_MARGIN_S = 2.0
# A blocking wait that returns this much before its timeout with nothing to take was cut short.
EARLY_WAKE_S = 0.005
OOM_PROBE_SUFFIX = ":write-probe"  # a key nobody creates: LPUSHX onto it changes nothing
# An agent whose next request comes within this of its reply gets its replies written at once.
EAGER_REPLIES_WITHIN_S = 0.002
# How long the evaluator polls for the next request before sleeping on it (protocol/spin_wait.py):
# long enough for a fast agent's turn between a reply and its next request, short enough that
# an agent slower than that soon turns polling off (the window adapts).
EVALUATOR_WINDOW_US = 300.0


class RedisTransport(OutageRidingCalls):
    """Every Redis call of the evaluator goes through ``_call``, which rides out an outage (a
    Redis restart) with backoff for up to ``outage_limit_s``. ``outages`` and ``downtime_s``
    tell the service what happened, so the downtime is never charged to the participant."""

    def __init__(
        self,
        redis_url: str,
        service_id: str,
        outage_limit_s: float = DEFAULT_OUTAGE_LIMIT_S,
        eager_within_s: float = EAGER_REPLIES_WITHIN_S,
        spin_us: float = EVALUATOR_WINDOW_US,
    ):
        """``spin_us``: the window, in microseconds, to poll for a request in (0: never poll)."""
        super().__init__(connect(redis_url, socket_timeout_s=MAX_BLOCK_S + HUNG_AFTER_S), redis_url, outage_limit_s)
        window_s = polling_window(spin_us)
        self.spin = SpinWait(window_s) if window_s > 0 else None
        # The waits for commands and the replies that ride with them.
        self.packets = Packets(self.redis, waiter=self.spin)
        self.service_id = service_id
        self.commands_key = keys.commands_key(service_id)
        self.errors_key = keys.errors_key(service_id)
        self._batch: collections.deque[bytes] = collections.deque()  # taken from Redis, not handed out yet
        self.replies = Replies()  # given, and not yet acknowledged by Redis
        # A reply goes out at once while the agent answers within ``eager_within_s``: a fast agent
        # then gets it while the evaluator finishes its turn. A slower agent's reply rides the
        # evaluator's next packet: the microseconds it waits are nothing next to its think time,
        # and Redis reads one packet a step instead of two (what bounds how many evaluations
        # one Redis carries).
        self.eager_within_s = eager_within_s
        self._eager = True
        self._replied_at = 0.0
        self.waits = WaitCommands(self.commands_key)  # the wait and the take, packed (waits.py)
        # The wait written with the last reply, its answers not read yet: its timeout and when it went.
        self._wait_sent: tuple[float, float] | None = None

    @property
    def refused_replies(self) -> int:
        """Replies Redis refused because the agent made their list a non-list."""
        return self.replies.refused

    def request_stop(self) -> None:
        """Give up waiting for Redis. Asked by another thread than the evaluator's while the
        evaluator is inside a call (its blocking pop, mostly), that call ends now: the connection
        it waits on is shut down and the call raises StopRequested, where the pop would otherwise
        see the stop only at its next timeout. From a signal handler this only sets the flag
        (``interrupt_wait`` ends the handler's own thread's call)."""
        super().request_stop()
        waiting = self._waiting_thread
        if waiting is not None and waiting != threading.get_ident():
            self.packets.interrupt()

    def clear(self) -> None:
        """Forget a previous evaluation's leftovers (stale errors broke flatland's handshakes)."""
        self._call(lambda: self.redis.delete(*keys.evaluation_keys(self.service_id)))

    def pop(
        self,
        deadline: float,
        should_stop: Callable[[], bool] = lambda: False,
        idle_pending: Callable[[], bool] = lambda: False,
        idle_work: Callable[[], object] = lambda: None,
    ) -> bytes | None:
        """The next command, or None once ``deadline`` (monotonic) passed, a stop was asked, or
        an outage was ridden out (the caller moves its deadlines by the downtime and asks again).

        Commands are taken up to ``POP_BATCH`` (and ``TAKE_BYTES``) per round trip and handed
        out one by one: an evaluator that fell behind a fire-and-forget client catches up
        without a round trip per step, and one that keeps up waits and takes in a single round
        trip (see ``_wait_and_take``). Every command handed out from a batch was in Redis when
        the batch was taken, so it is on time for any window that opened later.

        While ``idle_pending()`` says there is work, nothing is queued and the deadline is far,
        ``idle_work()`` runs first."""
        if self._batch:
            self._send_replies()  # the agent waits for them while the batch is worked through
            return self._batch.popleft()
        outages = self.outages
        while not (self.stop_requested or should_stop()):
            if self._wait_sent is not None:
                # The wait went out with the last reply (``reply``): its answers come first, and
                # what it took joins the batch.
                sent_block_s, sent_at = self._wait_sent
                may_block = True
                self._call(self._read_sent_wait, blocks_s=max(0.0, sent_at + sent_block_s - time.monotonic()))
            else:
                remaining = deadline - time.monotonic()
                block_s = min(remaining - POLL_MARGIN_S, MAX_BLOCK_S)
                idle = remaining > IDLE_WORK_MARGIN_S and idle_pending()
                may_block = block_s >= MIN_BLOCK_S and not idle
                if may_block:
                    taken = self._call(functools.partial(self._wait_and_take, block_s), blocks_s=block_s)
                else:
                    taken = self._call(self._take_nowait)
                self._batch.extend(taken)
            if self._batch:
                self._eager = time.monotonic() - self._replied_at < self.eager_within_s
                return self._batch.popleft()
            if self.outages != outages:
                return None
            if may_block:
                continue
            if remaining <= 0:
                return None  # the empty take above ran after the deadline: nothing on time is left
            if idle:
                idle_work()
                continue
            time.sleep(min(POLL_INTERVAL_S, remaining))
        return None

    def _wait_and_take(self, block_s: float) -> list[bytes]:
        """Block until a command is queued, then take what is queued: one round trip.

        The wait is a BLMOVE of the commands list onto its own tail, which leaves the list as it
        was and returns once it holds a command; its reply (that command) is switched off, so
        nothing of any size reaches the evaluator but through the bounded take. Redis runs a blocked
        client's next command only once the block ends, so the script sent in the same packet
        takes the commands that were queued when the wait returned."""
        # A stop asked from another thread shuts down the socket this wait uses (request_stop):
        # checked once that socket exists, it is either seen here or cuts the wait off.
        self.packets.connect()
        if self.stop_requested:
            return []
        waited_from = time.monotonic()
        block_s = round(block_s, 3)
        ok, taken = self._run_after_replies(
            self.waits.wait(block_s), unanswered=WAIT_UNANSWERED, own_errors_in_place=True
        )
        return self._commands_waited_for(ok, taken, block_s, waited_from)

    def _read_sent_wait(self) -> None:
        """Read the wait written with the last reply once it returns; what it took joins the batch
        (``_run_after_replies``, which reads it first whoever calls it)."""
        self.packets.connect()  # the socket a stop from another thread shuts down (as _wait_and_take)
        if not self.stop_requested:
            self._run_after_replies([])

    def _commands_waited_for(self, ok: Any, taken: Any, block_s: float, waited_from: float) -> list[bytes]:
        """What a wait (``WaitCommands.wait``) took, from its answers: that of CLIENT REPLY ON, then
        that of the bounded take."""
        if ok != b"OK":
            # Redis refused to switch replies off (a user without CLIENT): it answered every
            # command, the wait with the request it saw, and the answers are out of step.
            self.packets.close()
            raise ConfigError(
                f"Redis refused CLIENT REPLY ({ok}): the evaluator's Redis user must be allowed CLIENT REPLY, "
                "BLMOVE, EVAL and EVALSHA"
            )
        commands = self._taken(taken, POP_BATCH)
        if not commands and time.monotonic() - waited_from < block_s - EARLY_WAKE_S:
            self._raise_if_refusing_writes()
        return commands

    def _raise_if_refusing_writes(self) -> None:
        """A wait that returned early with nothing to take may have been refused: Redis refuses
        BLMOVE once it holds ``maxmemory``, and the refusal of a command whose reply is switched
        off is not sent. A write that changes nothing (LPUSHX onto a key that never exists)
        asks Redis whether it takes writes; a refusal is raised (``_call`` rides it out)."""
        (answer,) = self.packets.run([("LPUSHX", self.commands_key + OOM_PROBE_SUFFIX, b"")], errors_in_place=True)
        if isinstance(answer, redis.ResponseError):
            raise answer

    def _take_nowait(self, most: int = POP_BATCH) -> list[bytes]:
        (taken,) = self._run_after_replies([self.waits.take(most)], own_errors_in_place=True)
        return self._taken(taken, most)

    def _taken(self, reply: Any, most: int) -> list[bytes]:
        """The commands the bounded take answered with; when Redis had lost its script
        (NOSCRIPT, which took nothing), those of running it again from its text."""
        if isinstance(reply, redis.ResponseError):
            if not isinstance(reply, redis.exceptions.NoScriptError):
                raise reply
            self.waits.script_cached = False
            return self._take_nowait(most)
        self.waits.script_cached = True
        return reply

    def _run_after_replies(
        self, commands: list[Command], unanswered: int = 0, own_errors_in_place: bool = False
    ) -> list[Any]:
        """``commands`` in one packet behind the replies not written yet, reading the
        acknowledgements of those written before, and first of all the answers of a wait written
        with the last reply (what it took joins the batch); their replies (``unanswered``: how many
        of ``commands`` get none). Every reply is confirmed when this returns; when it fails, every
        unconfirmed reply is to be sent again. An error reply to one of ``commands`` is raised,
        or with ``own_errors_in_place`` returned in its place."""
        own = len(commands) - unanswered
        replies = self.replies
        # Behind the acknowledgements of the replies written with it (or before it), unless the
        # connection it went on was lost meanwhile.
        sent_wait = self._wait_sent if self.packets.unread else None
        self._wait_sent = None
        wait_at = 2 * len(replies.unconfirmed)
        wait_answers = range(wait_at, wait_at + WAIT_ANSWERED) if sent_wait is not None else range(0)
        try:
            if replies.unwritten:
                commands = replies.commands() + commands
            answers = self.packets.run(commands, errors_in_place=True, unanswered=unanswered)
            for answer in answers:  # a loop: a generator in any() costs more than the rest of this check
                if isinstance(answer, redis.ResponseError):
                    replies.sort_refusals(answers, own, raise_own=not own_errors_in_place, skip=wait_answers)
                    break
        except BaseException:
            replies.lost()
            raise
        replies.confirmed()
        if sent_wait is not None:
            ok, taken = answers[wait_at : wait_at + WAIT_ANSWERED]
            self._batch.extend(self._commands_waited_for(ok, taken, *sent_wait))
        return answers[len(answers) - own :]

    def queued(self) -> int:
        """Commands not handled yet: those still in Redis and those taken in the last batch."""
        if self.replies.unwritten:
            self.flush()
        return int(self._call(lambda: self.redis.llen(self.commands_key))) + len(self._batch)

    def pop_nowait(self) -> bytes | None:
        """The next command queued, or None; a wait written with the last reply is read first
        (it returns once a command is queued, or at its timeout)."""
        if not self._batch and self._wait_sent is not None:
            self._call(self._read_sent_wait)
        if self._batch:
            self._send_replies()
            return self._batch.popleft()
        taken = self._call(functools.partial(self._take_nowait, 1))
        return taken[0] if taken else None

    def reply(self, channel: str, message: bytes, next_deadline: float | None = None) -> None:
        """Answer a request. ``next_deadline``: when the wait for the next request must end, given
        when that wait follows this reply with nothing else between (the service's turn then
        ends): the reply and that wait go out at once in one packet, and Redis is woken once. The
        wait's answers are read by the next ``pop``.

        Otherwise the reply is written at once to an agent that answers fast
        (``eager_within_s``), or goes in the evaluator's next packet to Redis, the one that waits
        for the next request. Work that may take longer than a turn's bookkeeping (preparing the
        next episode while the agent thinks, working through a batch of queued requests) sends
        the replies first. Redis's acknowledgements are read with a later packet's replies; a
        reply is kept until then, to be sent again after a failure (replies.py). A reply given
        while a wait written with an earlier one is out (not the service's way) follows that
        wait's answers."""
        self.replies.add(channel, message)
        self._replied_at = time.monotonic()
        if self._wait_sent is not None and self.packets.unread:
            return  # Redis runs nothing of this connection's before that wait returns
        if next_deadline is not None and not self._batch:
            block_s = round(min(next_deadline - self._replied_at - POLL_MARGIN_S, MAX_BLOCK_S), 3)
            if block_s >= MIN_BLOCK_S:
                self._send_replies(then_wait_s=block_s)
                return
        if self._eager:
            self._send_replies()

    def _send_replies(self, then_wait_s: float | None = None) -> None:
        """Write the replies not written yet, now, without waiting for Redis's answer, and with
        ``then_wait_s`` the wait for the next request after them (``reply``). A write that fails
        leaves them to go out ahead of the next Redis call, in its packet (which rides out the
        outage); a hung Redis's time spent on the write is downtime, and a stop ends the write at
        once (``interrupt_wait``). Once a stop is requested nothing is written: a reply larger
        than the socket's buffer would wait out a hung Redis's socket timeout."""
        replies = self.replies
        if not replies.unwritten or self.stop_requested:
            return
        self._waiting_thread = threading.get_ident()
        started = time.monotonic()
        try:
            if then_wait_s is None:
                self.packets.send(replies.commands())
            else:
                self.packets.send(replies.commands() + self.waits.wait(then_wait_s), unanswered=WAIT_UNANSWERED)
                self._wait_sent = (then_wait_s, started)
            replies.written()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            replies.lost()  # the connection is gone, and with it whatever it had not confirmed
            self._wait_sent = None
            if isinstance(exc, redis.TimeoutError):
                self.downtime_s += time.monotonic() - started
        finally:
            self._waiting_thread = None

    def flush(self) -> None:
        """Send the replies whose write failed (riding out the outage), and read what Redis made
        of every reply sent: once this returns, each is in its list."""
        if self.replies:
            self._call(lambda: self._run_after_replies([]))

    def flush_last(self) -> None:
        """The replies of the evaluation's last turn (ENV_SUBMIT's): one attempt, no riding out
        an outage, since the evaluation has ended."""
        if not self.replies or self.stop_requested:  # a stop is obeyed at once
            return
        try:
            self._run_after_replies([])
        except (StopRequested, redis.RedisError) as exc:
            log.warning("the last reply could not be sent: %s", exc)
        self.replies.confirmed()

    def push_error(self, message: bytes) -> None:
        self.flush()  # a reply to an earlier request goes first, as it was decided first
        self._call(lambda: self.redis.rpush(self.errors_key, message))

    def close(self) -> None:
        self.flush_last()
        self._wait_sent = None
        self.packets.close()
        self.redis.close()
