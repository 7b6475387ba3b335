"""The client's side of the wire, shared by every client of arbiter (``RemoteClient`` for
Flatland, ``RemoteEnv`` for envs that live on the server).

Every request carries this client's session id and a sequence number, so the evaluator applies
it once however often it is resent; every wait has a timeout (a dead evaluator raises
``ServerUnavailable``, never hangs); the errors list is checked before every request, and a
timeout found there raises ``TimeoutException``, an ending (the evaluation ended, or its
evaluator was stopped) its ``EvaluationError``; a request whose reply is late looks there again
each time it is resent, so an agent learns of a stop then, not at the end of its reply timeout.
The handshake takes the evaluation over from a client that went silent (an agent that crashed
and was started again): the evaluator says when that becomes possible, and the PING is sent
again then, within the reply timeout.
"""

from __future__ import annotations

import collections
import functools
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from arbiter.client.connection import DEFAULT_SERVICE_ID, connection_settings, reply_timeout  # noqa: F401 (re-exported)
from arbiter.protocol import codec, keys
from arbiter.protocol.errors import (
    ArbiterError,
    ClientConflict,
    EvaluatorRestarted,
    MessageTooLarge,
    ServerUnavailable,
    TimeoutException,
    error_from_payload,
)
from arbiter.protocol.messages import ARBITER, EXTENSION_KEY, FLATLAND_RL, extension, request
from arbiter.protocol.redis_conn import LARGE_ARGUMENT, Command, Packets, connect, pack, pack3, redacted
from arbiter.protocol.spin_wait import SpinWait, window_from_environment

log = logging.getLogger(__name__)

RESEND_AFTER_S = 2.0  # re-send an unanswered request this often (the evaluator may restart)
# A refused handshake is sent again this long after the instant the evaluator named (its clock
# and ours run at the same rate, but the refusal took time to arrive).
TAKEOVER_RETRY_MARGIN_S = 0.02


class Wire:
    """Requests and replies over Redis for one client session."""

    # A request that may be resent goes out together with the wait for its reply (one round
    # trip, see _push_and_wait); False sends it with its own LPUSH first.
    pipelined = True
    _folded_error: bytes | None = None  # the errors-list entry a step's packet took (see request)

    def __init__(
        self,
        redis_url: str | None = None,
        service_id: str | None = None,
        *,
        reply_timeout_s: float | None = None,
        resend_after_s: float = RESEND_AFTER_S,
        spin_us: float | None = None,
    ):
        self.redis_url, self.service_id = connection_settings(redis_url, service_id)
        self.reply_timeout_s = reply_timeout(reply_timeout_s)
        self.resend_after_s = resend_after_s
        self.session = uuid.uuid4().hex  # binds the evaluation to this client
        self._seq = 0
        # Reply lists are named by a random part and a counter: unique like a fresh uuid each (no
        # list is ever named twice), for a fraction of its cost on every request. The list's name
        # but for its counter is made once; a request appends the counter's 8 hex digits.
        self._channel_base = keys.response_key(self.service_id, uuid.uuid4().hex[:24])
        self._channels = 0
        self.redis = connect(self.redis_url, socket_timeout_s=self.reply_timeout_s + 10.0)
        # A request and the wait for its reply; the reply is polled for before sleeping on it.
        window_s = window_from_environment(spin_us)
        self.spin = SpinWait(window_s) if window_s > 0 else None
        self.packets = Packets(self.redis, waiter=self.spin)
        self.commands_key = keys.commands_key(self.service_id)
        self._commands_key_bytes = self.commands_key.encode()
        self.errors_key = keys.errors_key(self.service_id)
        self._take_error_packed = pack(("RPOP", self.errors_key))  # in every step's packet: packed once
        self.server_info: dict[str, Any] = {}  # the PONG's extension: what the evaluator runs
        self.resend_all = False  # arbiter's evaluator answered: every request may be resent
        # Errors-list entries a late reply's look took that were not an ending (a timeout): given
        # to the next request as if it had taken them itself (``_take_error``).
        self._held: collections.deque[bytes] = collections.deque()

    # -- one session, several processes -------------------------------------------------------

    def hand_over(self) -> dict[str, Any]:
        """What another process needs to go on with this session (``Wire.taking_over``): while it
        does, this one sends nothing, and when it is done, ``take_back`` its last sequence number.
        The evaluator sees one client throughout. Holds the Redis URL, password included."""
        return {
            "redis_url": self.redis_url,
            "service_id": self.service_id,
            "session": self.session,
            "seq": self._seq,
            "reply_timeout_s": self.reply_timeout_s,
            "resend_after_s": self.resend_after_s,
            "resend_all": self.resend_all,
        }

    @classmethod
    def taking_over(cls, handed: dict[str, Any], spin_us: float | None = None) -> Wire:
        """A wire that goes on with the session ``hand_over`` gave, on a connection of its own."""
        wire = cls(
            handed["redis_url"],
            handed["service_id"],
            reply_timeout_s=handed["reply_timeout_s"],
            resend_after_s=handed["resend_after_s"],
            spin_us=spin_us,
        )
        wire.session, wire._seq, wire.resend_all = handed["session"], handed["seq"], handed["resend_all"]
        return wire

    def connect(self) -> None:
        """Open the connection now, not with the first request, whose round trip then does not
        include setting it up; ``ServerUnavailable`` when Redis stays unreachable for the reply timeout."""
        self._with_reconnect(self.packets.connect, "the connection", time.monotonic() + self.reply_timeout_s)

    @property
    def seq(self) -> int:
        """The sequence number of the last request sent."""
        return self._seq

    def take_back(self, seq: int) -> None:
        """The session is this wire's again, the other process's last request numbered ``seq``."""
        self._seq = max(self._seq, seq)

    # -- the handshake ----------------------------------------------------------------------

    def handshake(self, version: str, asks: dict[str, Any] | None = None) -> dict[str, Any]:
        """PING / PONG as a new client; returns ``server_info``. Timeouts already on the errors
        list were posted for an earlier client (one that crashed, or ran before a ``--resume``):
        this one has played nothing yet. They are dropped before the PING and again after the
        PONG, by which time the evaluator has dealt with whatever that client left running."""
        self._discard_pending_errors()
        self.ping(version, raise_pending=False, asks=asks)
        self._discard_pending_errors()
        return self.server_info

    def ping(self, version: str, *, raise_pending: bool = True, asks: dict[str, Any] | None = None) -> dict[str, Any]:
        """PING; resent while the evaluator is not up yet, and while another client is bound to
        the evaluation until this one may take over (see server/clients.py), within
        ``reply_timeout_s``. ``asks``: extension fields for the evaluator (shared frames).
        Returns the PONG's extension, kept as ``server_info``."""
        payload: dict[str, Any] = {"version": version}
        if asks:
            payload[EXTENSION_KEY] = dict(asks)
        response = self.request(FLATLAND_RL.PING, payload, raise_pending=raise_pending)
        if response["type"] != FLATLAND_RL.PONG:
            raise ArbiterError(f"handshake failed: expected PONG, got {response['type']!r}")
        self.server_info = extension(response.get("payload"))
        # arbiter's evaluator answers a resent request from its cache, so resending after a lost
        # message is safe; flatland's would apply it twice, so only its PING is resent.
        self.resend_all = "protocol" in self.server_info
        return self.server_info

    def _discard_pending_errors(self) -> None:
        give_up = time.monotonic() + self.reply_timeout_s
        while self._with_reconnect(self._take_error, FLATLAND_RL.PING, give_up) is not None:
            pass

    def _takeover_wait_s(
        self, type_: str, error: ArbiterError, response: dict[str, Any], give_up: float
    ) -> float | None:
        """How long to wait before sending a refused PING again, or None to give up: the
        evaluator says when the bound client will have been silent long enough for a takeover."""
        if type_ != FLATLAND_RL.PING or not isinstance(error, ClientConflict):
            return None
        retry_after_s = extension(response.get("payload")).get("retry_after_s")
        if isinstance(retry_after_s, bool) or not isinstance(retry_after_s, (int, float)) or retry_after_s < 0:
            return None
        wait_s = retry_after_s + TAKEOVER_RETRY_MARGIN_S
        return wait_s if time.monotonic() + wait_s < give_up else None

    # -- requests ---------------------------------------------------------------------------

    def request(
        self,
        type_: str,
        payload: dict[str, Any],
        wait_s: float | None = None,
        *,
        raise_pending: bool = True,
        maps: Callable[[dict], Any] = codec.map_from_wire,
    ) -> dict[str, Any]:
        """Send one request and wait for its reply; an ERROR reply is raised as its error class.
        A timeout waiting on the errors list is raised first, unless ``raise_pending`` is False.
        ``maps``: what each map of the reply becomes as it is decoded (``codec.decode``)."""
        wait_s = self.reply_timeout_s if wait_s is None else wait_s
        give_up = time.monotonic() + wait_s
        # A step to arbiter's evaluator checks the errors list in its own packet: a step sent after
        # a timeout is refused there, never applied, so the timeout is raised all the same.
        fold = type_ == FLATLAND_RL.ENV_STEP and raise_pending and self.resend_all and self.pipelined and not self._held
        if not fold:
            pending = self._with_reconnect(self._take_error, type_, give_up)
            if raise_pending:
                self._raise_pending_timeout(pending)
        channel = self._new_channel()
        message = self._tagged(type_, payload, channel)
        while True:
            response = self._send_and_await(
                type_, message, channel, give_up=give_up, wait_s=wait_s, fold=fold, maps=maps, look=raise_pending
            )
            if fold:
                self._raise_pending_timeout(self._folded_error)  # it decided the step's fate: first
            if response["type"] != FLATLAND_RL.ERROR:
                return response
            error = error_from_payload(response.get("payload"))
            if isinstance(error, EvaluatorRestarted):
                resume_item = extension(response.get("payload")).get("resume_item")
                error.resume_item = resume_item if type(resume_item) is int else None
            takeover_wait_s = self._takeover_wait_s(type_, error, response, give_up)
            if takeover_wait_s is None:
                break
            log.info("another client is bound to this evaluation; asking again in %.2f s", takeover_wait_s)
            time.sleep(takeover_wait_s)
        if isinstance(error, TimeoutException):
            # The evaluator also posted this timeout on the errors list (before answering):
            # it is told now, so it must not be raised a second time by the next call.
            self._with_reconnect(self._take_error, type_, give_up)
        raise error

    def _send_and_await(
        self,
        type_: str,
        message: bytes,
        channel: str,
        *,
        give_up: float,
        wait_s: float,
        fold: bool = False,
        maps: Callable[[dict], Any] = codec.map_from_wire,
        look: bool = False,
    ) -> dict[str, Any]:
        """Push ``message`` and return the reply on ``channel``; a request that may be resent is
        sent again every ``resend_after_s`` until ``give_up``. ``fold``: the first packet also
        takes the errors list's next entry, into ``_folded_error``. ``look``: while the reply is
        late, an ending found on the errors list is raised (``_look_for_ending``); never for a
        handshake, whose evaluator may not have cleared an earlier evaluation's yet."""
        resend = type_ == FLATLAND_RL.PING or self.resend_all
        push_with_wait = resend and self.pipelined
        self._folded_error = None
        if not push_with_wait:
            self._with_reconnect(lambda: self.redis.lpush(self.commands_key, message), type_, give_up)
        while True:
            left = give_up - time.monotonic()
            chunk = min(left, self.resend_after_s) if resend else left
            # Redis rounds a blocking timeout to milliseconds and 0 means forever: never send < 10 ms.
            block_s = round(max(chunk, 0.01), 3)
            if push_with_wait:
                wait = functools.partial(self._push_and_wait, message, channel, block_s, fold)
                fold = False  # a resend does not take the errors list again
            else:
                wait = functools.partial(self.redis.blpop, [channel], timeout=block_s)
            found = self._with_reconnect(wait, type_, give_up)
            if found is not None:
                break
            if self._folded_error is not None:
                # The errors list already decided this step (a timeout: it is refused; or the
                # evaluation's end): a reply could only say so, and an evaluator gone gives none.
                self._raise_pending_timeout(self._folded_error)
            if look and self.resend_all:
                self._look_for_ending(type_, give_up)
            if time.monotonic() >= give_up:
                raise ServerUnavailable(
                    f"no reply to {type_} from the evaluator within {wait_s:g} s "
                    f"(Redis {redacted(self.redis_url)}, service id {self.service_id!r}): is the evaluator running?"
                )
            if resend and not push_with_wait:
                self._with_reconnect(lambda: self.redis.lpush(self.commands_key, message), type_, give_up)
        response = codec.decode(found[1], codec.REPLY_LIMITS, maps)
        if not isinstance(response, dict) or "type" not in response:
            raise ArbiterError(f"malformed reply to {type_}")
        return response

    def _take_error(self) -> bytes | None:
        """The errors list's next entry (one a late reply's look held first), on the connection
        the requests use (redis-py's own call costs as much again in Python as the round trip)."""
        if self._held:
            return self._held.popleft()
        (error,) = self.packets.run([("RPOP", self.errors_key)])
        return error

    def _look_for_ending(self, type_: str, give_up: float) -> None:
        """A reply is late: whether the errors list says the evaluation ended or its evaluator was
        stopped, raised as the EvaluationError it holds. Anything else found there (a timeout) is
        held for the next request, which raises it as it would have."""
        while True:
            (entry,) = self._with_reconnect(lambda: self.packets.run([("RPOP", self.errors_key)]), type_, give_up)
            if entry is None:
                return
            try:
                message = codec.decode(entry, codec.COMMAND_LIMITS)
            except ArbiterError:
                message = None
            if isinstance(message, dict) and message.get("type") == FLATLAND_RL.ERROR:
                self._raise_pending_timeout(entry)  # an ending: raised
            self._held.append(entry)

    def _push_and_wait(self, message: bytes, channel: str, block_s: float, take_error: bool = False) -> Any:
        """LPUSH the request and BLPOP its reply in one packet: one round trip where two would
        wait for each other (Redis runs them in order, so the wait starts once the request is
        queued). Only for requests that may be resent: after a connection error it is unknown
        whether the LPUSH landed, and the retry pushes it again. ``take_error``: RPOP the errors
        list first, in the same packet."""
        push_and_wait: tuple[Command, Command] = (
            ("LPUSH", self.commands_key, message)  # a large one is sent as it is, never copied (redis_conn)
            if len(message) > LARGE_ARGUMENT
            else pack3(b"LPUSH", self._commands_key_bytes, message),
            pack3(b"BLPOP", channel.encode(), repr(block_s).encode()),
        )
        results = self.packets.run((self._take_error_packed, *push_and_wait) if take_error else push_and_wait)
        if take_error:
            self._folded_error = results[0]
        return results[-1]

    # -- the parts of a request -------------------------------------------------------------

    def _tagged(self, type_: str, payload: dict[str, Any], channel: str | None) -> bytes:
        """The request, with this client's session and next sequence number (server/clients.py)."""
        self._seq += 1
        ext = payload.get(EXTENSION_KEY)
        tags = {"session": self.session, "seq": self._seq}
        encoded = codec.encode(request(type_, {**payload, EXTENSION_KEY: {**ext, **tags} if ext else tags}, channel))
        if len(encoded) > codec.COMMAND_LIMITS.max_bytes:  # the evaluator would refuse it unanswered
            self._seq -= 1
            raise MessageTooLarge(
                f"the {type_} request is {len(encoded):,} bytes, more than the {codec.COMMAND_LIMITS.max_bytes:,} the "
                "evaluator takes: not sent (an action is a few numbers: is an observation being sent back?)"
            )
        return encoded

    def _new_channel(self) -> str:
        self._channels += 1
        return f"{self._channel_base}{self._channels & 0xFFFFFFFF:08x}"

    def _raise_pending_timeout(self, error: bytes | None) -> None:
        """Raise what the evaluator posted on the errors list, if anything (None: nothing): a
        timeout, or an ending the client did not ask for (EvaluationError, saying how it ended)."""
        if error is None:
            return
        try:
            message = codec.decode(error, codec.COMMAND_LIMITS)
            kind = message.get("type") if isinstance(message, dict) else None
        except ArbiterError:
            kind = None
        if kind == FLATLAND_RL.ERROR:
            raise error_from_payload(message.get("payload"))
        if kind == FLATLAND_RL.ENV_RESET_TIMEOUT:
            raise TimeoutException("the evaluator timed out this episode: planning budget exceeded")
        raise TimeoutException("the evaluator timed out this episode: step budget exceeded")

    def _with_reconnect(self, call: Any, type_: str, give_up: float) -> Any:
        """Run a Redis call, retrying through connection errors (a Redis restart) until ``give_up``."""
        pause_s = 0.05
        while True:
            try:
                return call()
            except (redis.AuthenticationError, redis.exceptions.AuthorizationError) as exc:
                # Not an outage: the user or password is wrong, and asking again will not mend it.
                raise ServerUnavailable(
                    f"Redis at {redacted(self.redis_url)} refused this client's user or password ({type_}): {exc}"
                ) from exc
            except redis.exceptions.InvalidResponse as exc:  # something else listens there
                raise ServerUnavailable(
                    f"what listens at {redacted(self.redis_url)} does not answer as Redis does ({type_}): {exc}"
                ) from exc
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if time.monotonic() + pause_s >= give_up:
                    raise ServerUnavailable(
                        f"cannot reach Redis at {redacted(self.redis_url)} for {type_}: {exc}"
                    ) from exc
                log.warning("Redis unreachable (%s); retrying", exc)
                time.sleep(pause_s)
                pause_s = min(pause_s * 2, 1.0)

    def release(self) -> None:
        """Tell arbiter's evaluator this client is done with the evaluation, so another client
        (the next ``RemoteEnv`` of this process, a restarted agent) is served at once rather than
        after this one's silence. Sent once, never answered, never waited for: a Redis out of
        reach here only means the successor waits as before. Nothing to release when no
        arbiter evaluator answered this client (flatland's own service knows no release)."""
        if not self.resend_all or self._seq == 0:
            return
        try:
            message = self._tagged(ARBITER.RELEASE, {}, None)
            self.packets.run([pack3(b"LPUSH", self._commands_key_bytes, message)])
        except (redis.RedisError, OSError) as exc:
            log.info("could not tell the evaluator this client is done (%s): the next client waits its turn", exc)

    def close(self) -> None:
        self.packets.close()
        self.redis.close()
