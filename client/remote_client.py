"""The participant SDK: ``env_create`` / ``env_step`` / ``submit`` against a remote evaluator.

A drop-in for flatland-rl's ``FlatlandRemoteClient`` that speaks the same wire protocol, plus:
the env's state comes from the evaluator (no copy of the test folder needed), every wait has
a timeout (a dead evaluator raises ``ServerUnavailable``, never hangs), nothing is unpickled,
a step costs one Redis round trip, and ``act_within_budget`` keeps a slow policy from timing an
episode out.
"""

from __future__ import annotations

import functools
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from arbiter.protocol import codec, keys
from arbiter.protocol.errors import (
    ArbiterError,
    ClientConflict,
    EpisodeLost,
    OutOfOrder,
    ServerUnavailable,
    TimeoutException,
    error_from_payload,
)
from arbiter.protocol.flatland_env import (
    build_rail_env,
    env_state_from_wire,
    preload,
    release_flatland_caches,
    rewards_for,
)
from arbiter.protocol.messages import EPISODE_LOST, EXTENSION_KEY, FLATLAND_RL, extension, request
from arbiter.protocol.redis_conn import connect, redacted

from .deadline_guard import BudgetClock, DeadlineGuard
from .flatland_service import flatland_version, load_local_env

log = logging.getLogger(__name__)

DEFAULT_SERVICE_ID = "T12345"  # flatland-rl's default, so unmodified setups line up
DEFAULT_REPLY_TIMEOUT_S = 60.0
RESEND_AFTER_S = 2.0  # re-send an unanswered request this often (the evaluator may restart)
# A refused handshake is sent again this long after the instant the evaluator named (its clock
# and ours run at the same rate, but the refusal took time to arrive).
TAKEOVER_RETRY_MARGIN_S = 0.02


def _plain_actions(action_dict: dict[Any, Any] | None) -> dict[int, int]:
    """Handles and actions as plain ints: flatland's RailEnvActions (a fastenum, which int()
    refuses) by their value, numpy ints by int(); plain ints, the usual case, as they are."""
    actions: dict[int, int] = {}
    for handle, value in (action_dict or {}).items():
        if type(value) is not int:
            value = int(getattr(value, "value", value))
        actions[handle if type(handle) is int else int(handle)] = value
    return actions


class RemoteClient:
    """Connects to the evaluator and hands out its episodes one by one.

    Connection settings, in order: the ``redis_url`` / ``service_id`` keywords; the
    environment (``ARBITER_REDIS_URL``, else ``redis_ip`` as flatland's client reads it, on
    port 6379; ``AICROWD_SUBMISSION_ID``); flatland's defaults (127.0.0.1:6379, ``T12345``).
    """

    def __init__(
        self,
        redis_url: str | None = None,
        service_id: str | None = None,
        *,
        reply_timeout_s: float | None = None,
        test_env_folder: str | None = None,
        step_replies: bool = False,
        record_steps: bool = False,
        resend_after_s: float = RESEND_AFTER_S,
    ):
        self.redis_url = (
            redis_url
            or os.environ.get("ARBITER_REDIS_URL")
            or (f"redis://{os.environ.get('redis_ip', '127.0.0.1')}:6379/0")
        )
        self.service_id = keys.validate_service_id(
            service_id or os.environ.get("AICROWD_SUBMISSION_ID") or DEFAULT_SERVICE_ID
        )
        if reply_timeout_s is None:
            reply_timeout_s = float(os.environ.get("ARBITER_REPLY_TIMEOUT", DEFAULT_REPLY_TIMEOUT_S))
        if not reply_timeout_s > 0:
            raise ValueError(f"reply_timeout_s must be positive, got {reply_timeout_s!r}")
        self.reply_timeout_s = reply_timeout_s
        # Only used against flatland's own service, which sends no env state.
        self.test_env_folder = test_env_folder or os.environ.get("AICROWD_TESTS_FOLDER")
        self.step_replies = step_replies
        # flatland's load_new attaches a step recorder (env.cur_episode, for save_episode) to
        # every env it loads; an agent rarely reads it and it costs ~5 % of every env.step.
        self.record_steps = record_steps
        self.resend_after_s = resend_after_s
        self.session = uuid.uuid4().hex  # binds the evaluation to this client
        # Fire-and-forget steps expect no reply: they all name this one channel (the protocol
        # wants a valid one); only an error for a refused step could land there, and expire.
        self._step_channel = keys.response_key(self.service_id, self.session)
        self._seq = 0
        self.episode_index: int | None = None  # the evaluator's index of the running episode
        self._step_conn: Any = None  # a connection of its own for steps (see _send_step)
        self.redis = connect(self.redis_url, socket_timeout_s=reply_timeout_s + 10.0)
        self.commands_key = keys.commands_key(self.service_id)
        self.errors_key = keys.errors_key(self.service_id)
        self.env: Any = None
        self.server_info: dict[str, Any] = {}
        self.current_env_path: str | None = None
        self._last_step_end = time.monotonic()
        self._budget_clock = BudgetClock()
        self._guard = DeadlineGuard()
        self.fallbacks_used = 0  # calls of act_within_budget that returned the fallback
        preload()
        self._handshake()

    # -- the SDK --------------------------------------------------------------------------

    def ping_pong(self, *, raise_pending: bool = True) -> bool:
        """Handshake; resent while the evaluator is not up yet, and while another client is
        bound to the evaluation until it may take over (see server/clients.py), within
        ``reply_timeout_s``."""
        response = self._request(FLATLAND_RL.PING, {"version": flatland_version()}, raise_pending=raise_pending)
        if response["type"] != FLATLAND_RL.PONG:
            raise ArbiterError(f"handshake failed: expected PONG, got {response['type']!r}")
        self.server_info = extension(response.get("payload"))
        return True

    def time_left_s(self, *, use_time_bank: bool = True) -> float | None:
        """Seconds left until the evaluator's deadline for the next ``env_step`` (the first one of
        an episode has the planning budget), plus what is left of the episode's time bank, on
        this client's clock (see deadline_guard.py); None without a running episode or without
        budgets (flatland's own evaluator sends none)."""
        return None if self.env is None else self._budget_clock.time_left_s(use_time_bank=use_time_bank)

    def act_within_budget(
        self,
        policy: Callable[..., Any],
        *args: Any,
        fallback: Any,
        margin_s: float = 0.1,
        use_time_bank: bool = True,
    ) -> Any:
        """``policy(*args)``, stopped when only ``margin_s`` is left of ``time_left_s()``; then
        ``fallback`` is returned instead: an action map, or a callable that is given ``args`` and
        returns one (it runs inside the margin: keep it cheap). A slow policy costs a step's
        quality, never the episode. ``use_time_bank=False`` keeps the time bank for what no
        signal can stop (see deadline_guard.py for how and where a policy is interrupted).
        Without budgets from the evaluator the policy runs with no limit."""
        left_s = self.time_left_s(use_time_bank=use_time_bank)
        if left_s is None:
            return policy(*args)
        finished, action = self._guard.call(left_s - margin_s, policy, args)
        if finished:
            return action
        self.fallbacks_used += 1
        log.info("the policy ran out of time (%.3f s left before the margin): fallback", left_s - margin_s)
        return fallback(*args) if callable(fallback) else fallback

    def env_create(self, obs_builder_object: Any = None) -> tuple[Any, Any]:
        """Start the next episode: ``(observation, info)``, or ``(False, False)`` when none is left."""
        # Before asking, so it costs none of the planning budget: flatland's caches would keep
        # every earlier episode's env alive for the whole evaluation.
        self.env = None
        release_flatland_caches()
        response = self._request(FLATLAND_RL.ENV_CREATE, {})
        self._budget_clock.episode_started(self.server_info.get("budgets"), time.monotonic())
        payload = response["payload"]
        if not payload.get("observation"):
            self.env = None
            return False, False
        ext = extension(payload)
        self.current_env_path = payload.get("env_file_path")
        self.episode_index = ext.get("episode")
        if "env_state" in ext:
            env_dict = env_state_from_wire(ext["env_state"])
            rewards = rewards_for(ext.get("reward_model", "flatland"))
            self.env = build_rail_env(
                env_dict, obs_builder=obs_builder_object, rewards=rewards, record_steps=self.record_steps
            )
        else:
            self.env = load_local_env(
                self.test_env_folder, payload.get("env_file_path"), obs_builder_object, record_steps=self.record_steps
            )
        observation, info = self.env.reset(
            regenerate_rail=True, regenerate_schedule=True, random_seed=payload.get("random_seed")
        )
        self._last_step_end = time.monotonic()
        return observation, info

    def env_step(self, action_dict: dict[Any, Any]) -> tuple[Any, Any, Any, Any]:
        """Send the actions and step the local env: ``(obs, rewards, done, info)``.

        Raises ``TimeoutException`` (a ``StopAsyncIteration``) once the evaluator has timed
        the episode out; call ``env_create()`` to go on with the next one.
        """
        if self.env is None:
            raise OutOfOrder("env_step() before env_create(): there is no running episode")
        actions = _plain_actions(action_dict)
        sent_at = time.monotonic()
        self._budget_clock.step_sent(sent_at)
        payload: dict[str, Any] = {"action": actions, "inference_time": sent_at - self._last_step_end}
        if self.step_replies:
            payload[EXTENSION_KEY] = {"reply": True}
            self._request(FLATLAND_RL.ENV_STEP, payload)
            collect = None
        else:
            collect = self._send_step(payload)
        try:
            observation, rewards, done, info = self.env.step(actions)
        finally:
            if collect is not None:
                collect()  # raises TimeoutException if the evaluator had timed the episode out
        self._last_step_end = time.monotonic()
        return observation, rewards, done, info

    def submit(self) -> dict[str, Any]:
        """End the evaluation and return the scores."""
        response = self._request(FLATLAND_RL.ENV_SUBMIT, {})
        return response["payload"]

    def close(self) -> None:
        if self._step_conn is not None:
            self._step_conn.disconnect()
        self.redis.close()

    # -- the handshake ----------------------------------------------------------------------

    def _handshake(self) -> None:
        """PING / PONG as a new client. Timeouts already on the errors list were posted for an
        earlier client (one that crashed, or ran before a ``--resume``): this one has played
        nothing yet. They are dropped before the PING and again after the PONG, by which time
        the evaluator has dealt with whatever that client left running."""
        self._discard_pending_errors()
        self.ping_pong(raise_pending=False)
        self._discard_pending_errors()

    def _discard_pending_errors(self) -> None:
        give_up = time.monotonic() + self.reply_timeout_s
        while self._with_reconnect(lambda: self.redis.rpop(self.errors_key), FLATLAND_RL.PING, give_up) is not None:
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

    # -- the wire ---------------------------------------------------------------------------

    def _raise_pending_timeout(self, error: bytes | None) -> None:
        if error is None:
            return
        try:
            message = codec.decode(error, codec.COMMAND_LIMITS)
            kind = message.get("type") if isinstance(message, dict) else None
        except ArbiterError:
            kind = None
        if kind == EPISODE_LOST:
            raise EpisodeLost("the evaluator lost this episode's steps in a Redis outage; env_create() replays it")
        if kind == FLATLAND_RL.ENV_RESET_TIMEOUT:
            raise TimeoutException("the evaluator timed out this episode: planning budget exceeded")
        raise TimeoutException("the evaluator timed out this episode: step budget exceeded")

    def _tagged(self, type_: str, payload: dict[str, Any], channel: str) -> bytes:
        """The request, with this client's session and next sequence number (see server/clients.py)."""
        self._seq += 1
        ext = dict(payload.get(EXTENSION_KEY, {}))
        ext.update(session=self.session, seq=self._seq)
        return codec.encode(request(type_, {**payload, EXTENSION_KEY: ext}, channel))

    def _send_step(self, payload: dict[str, Any]) -> Callable[[], None]:
        """Send a step without waiting; returns the call that collects Redis's answers.

        One round trip per step, and it overlaps the local env step: the commands (check for a
        timeout, push the step) go out first, the answers are read after the local step. A step
        pushed after a timeout is ignored by the evaluator, and a step pushed twice (a retry
        after a lost connection) carries the same sequence number and is applied once.
        """
        message = self._tagged(FLATLAND_RL.ENV_STEP, payload, self._step_channel)
        commands = [("RPOP", self.errors_key), ("LPUSH", self.commands_key, message)]
        try:
            connection = self._step_connection()
            connection.send_packed_command(connection.pack_commands(commands), check_health=False)
        except (redis.ConnectionError, redis.TimeoutError):
            return self._step_after_connection_loss(message)

        def collect() -> None:
            try:
                error = connection.read_response()
                connection.read_response()
            except (redis.ConnectionError, redis.TimeoutError):
                self._step_after_connection_loss(message)()
                return
            self._raise_pending_timeout(error)

        return collect

    def _step_connection(self) -> Any:
        if self._step_conn is None:
            self._step_conn = self.redis.connection_pool.get_connection()
        return self._step_conn

    def _step_after_connection_loss(self, message: bytes) -> Callable[[], None]:
        """The slow, sure path: drop the connection, retry through the outage, then check."""
        if self._step_conn is not None:
            self._step_conn.disconnect()
            self._step_conn = None

        def send() -> Any:
            pipe = self.redis.pipeline(transaction=False)
            pipe.rpop(self.errors_key)
            pipe.lpush(self.commands_key, message)
            return pipe.execute()

        error, _ = self._with_reconnect(send, FLATLAND_RL.ENV_STEP, time.monotonic() + self.reply_timeout_s)
        return lambda: self._raise_pending_timeout(error)

    def _request(
        self, type_: str, payload: dict[str, Any], wait_s: float | None = None, *, raise_pending: bool = True
    ) -> dict[str, Any]:
        wait_s = self.reply_timeout_s if wait_s is None else wait_s
        give_up = time.monotonic() + wait_s
        pending = self._with_reconnect(lambda: self.redis.rpop(self.errors_key), type_, give_up)
        if raise_pending:
            self._raise_pending_timeout(pending)
        channel = self._new_channel()
        message = self._tagged(type_, payload, channel)
        # arbiter's evaluator answers a resent request from its cache, so resending after a lost
        # message is safe; flatland's would apply it twice, so only its PING is resent.
        resend = type_ == FLATLAND_RL.PING or "protocol" in self.server_info
        while True:
            self._with_reconnect(lambda: self.redis.lpush(self.commands_key, message), type_, give_up)
            response = self._await_reply(type_, channel, message, resend=resend, give_up=give_up, wait_s=wait_s)
            if response["type"] != FLATLAND_RL.ERROR:
                return response
            error = error_from_payload(response.get("payload"))
            takeover_wait_s = self._takeover_wait_s(type_, error, response, give_up)
            if takeover_wait_s is None:
                break
            log.info("another client is bound to this evaluation; asking again in %.2f s", takeover_wait_s)
            time.sleep(takeover_wait_s)
        if isinstance(error, TimeoutException):
            # The evaluator also posted this timeout on the errors list (before answering):
            # it is told now, so it must not be raised a second time by the next call.
            self._with_reconnect(lambda: self.redis.rpop(self.errors_key), type_, give_up)
        raise error

    def _await_reply(
        self, type_: str, channel: str, message: bytes, *, resend: bool, give_up: float, wait_s: float
    ) -> dict[str, Any]:
        """The reply on ``channel``, the request sent again every ``resend_after_s`` if ``resend``."""
        while True:
            left = give_up - time.monotonic()
            chunk = min(left, self.resend_after_s) if resend else left
            # Redis rounds a blocking timeout to milliseconds and 0 means forever: never send < 10 ms.
            block_s = round(max(chunk, 0.01), 3)
            found = self._with_reconnect(
                functools.partial(self.redis.blpop, [channel], timeout=block_s), type_, give_up
            )
            if found is not None:
                break
            if time.monotonic() >= give_up:
                raise ServerUnavailable(
                    f"no reply to {type_} from the evaluator within {wait_s:g} s "
                    f"(Redis {redacted(self.redis_url)}, service id {self.service_id!r}): is the evaluator running?"
                )
            if resend:
                self._with_reconnect(lambda: self.redis.lpush(self.commands_key, message), type_, give_up)
        response = codec.decode(found[1], codec.REPLY_LIMITS)
        if not isinstance(response, dict) or "type" not in response:
            raise ArbiterError(f"malformed reply to {type_}")
        return response

    def _with_reconnect(self, call: Any, type_: str, give_up: float) -> Any:
        """Run a Redis call, retrying through connection errors (a Redis restart) until ``give_up``."""
        pause_s = 0.05
        while True:
            try:
                return call()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if time.monotonic() + pause_s >= give_up:
                    raise ServerUnavailable(
                        f"cannot reach Redis at {redacted(self.redis_url)} for {type_}: {exc}"
                    ) from exc
                log.warning("Redis unreachable (%s); retrying", exc)
                time.sleep(pause_s)
                pause_s = min(pause_s * 2, 1.0)

    def _new_channel(self) -> str:
        return keys.response_key(self.service_id, uuid.uuid4().hex)
