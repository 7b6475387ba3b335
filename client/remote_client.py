"""The participant SDK: ``env_create`` / ``env_step`` / ``submit`` against a remote evaluator.

A drop-in for flatland-rl's ``FlatlandRemoteClient`` that speaks the same wire protocol, plus:
the env's state comes from the evaluator (no copy of the test folder needed), every wait has
a timeout (a dead evaluator raises ``ServerUnavailable``, never hangs), nothing is unpickled,
a step costs one Redis round trip, and ``act_within_budget`` keeps a slow policy from timing an
episode out.
"""

from __future__ import annotations

import gc
import logging
import os
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import numpy as np
import redis

from arbiter.client.deadline_guard import BudgetClock, DeadlineGuard
from arbiter.client.flatland_service import flatland_version, load_local_env
from arbiter.client.wire import RESEND_AFTER_S, Wire
from arbiter.protocol import keys
from arbiter.protocol.errors import OutOfOrder
from arbiter.protocol.legacy.flatland_env import (
    build_rail_env,
    env_state_from_wire,
    env_state_maps,
    preload,
    release_flatland_caches,
    rewards_for,
)
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL, extension
from arbiter.protocol.redis_conn import pack, pack3

log = logging.getLogger(__name__)

_gc_set_aside = False  # what the process had loaded is frozen (set_aside_what_is_loaded)


def set_aside_what_is_loaded() -> None:
    """Collect once, then freeze what is left (``gc.freeze``), once per process.

    Each episode builds an env of many small objects, and Python's full collections, which those
    start, would otherwise walk everything the process holds each time: flatland, numpy, the
    agent's own modules and model. Frozen objects are never collected: what the process holds
    now lives on anyway, and only a reference cycle among them that later becomes garbage stays
    (``ARBITER_FREEZE_GC=0`` or ``freeze_gc=False`` keeps the collector as it was)."""
    global _gc_set_aside
    if not _gc_set_aside:
        gc.collect()
        gc.freeze()
        _gc_set_aside = True


def _freeze_gc_wanted(freeze_gc: bool | None) -> bool:
    if freeze_gc is not None:
        return freeze_gc
    return os.environ.get("ARBITER_FREEZE_GC", "1").strip() != "0"


_PLAIN = (int, float, str, type(None))  # bool is an int


def _plain_actions(action_dict: Any) -> dict[Any, Any]:
    """The action map as the wire carries it; the local env steps with the same map, and the
    evaluator reads each agent's action from it exactly as flatland's env does, so the two copies
    stay in step whatever the map holds. Flatland's RailEnvActions (a fastenum, which msgpack
    cannot pack) go by their value, numpy scalars (and one-element arrays, a policy's usual
    output) as Python's; plain ints, the usual case, as they are. An entry neither copy reads as
    an action (``"forward"``, ``2.7``, ``None``) is DO_NOTHING on both, and counted in
    ``invalid_actions``; what the wire cannot carry (a list where an action belongs) goes as None,
    and a key that is no number or string is left out. A map is needed, as flatland's env.step
    needs one: anything else is a TypeError, and nothing is sent."""
    if not isinstance(action_dict, dict):
        hint = ""
        if isinstance(action_dict, (list, tuple, np.ndarray)):
            hint = "; for the agents 0, 1, ... in order, pass dict(enumerate(actions))"
        raise TypeError(
            f"env_step takes a map of agent handle to action (flatland's action_dict), not a "
            f"{type(action_dict).__name__}{hint}"
        )
    actions: dict[Any, Any] = {}
    for handle, value in action_dict.items():
        if type(handle) is not int:
            handle = _plain_scalar(handle)
            if not isinstance(handle, _PLAIN) or handle is None:
                continue
        if type(value) is not int:
            value = _plain_scalar(getattr(value, "value", value))
            if not isinstance(value, _PLAIN):
                value = None
        actions[handle] = value
    return actions


def _plain_scalar(value: Any) -> Any:
    """A numpy scalar, or an array of one element, as the Python value it holds; anything else as it is."""
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.size == 1):
        return value.item()
    return value


_UNSET: Any = object()  # env_step's map not given under this name


def flatland_redis_url(host: str | None, port: int | None, db: int | None, password: str | None) -> str | None:
    """The Redis URL flatland's client keywords name (``remote_host``, ``remote_port``,
    ``remote_db``, ``remote_password``), with flatland's defaults for those left out (``redis_ip``,
    else 127.0.0.1; 6379; 0; none); None when none is given (the environment then decides)."""
    if host is None and port is None and db is None and password is None:
        return None
    host = host or os.environ.get("redis_ip", "127.0.0.1")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    auth = f":{urllib.parse.quote(str(password), safe='')}@" if password is not None else ""
    return f"redis://{auth}{host}:{int(port if port is not None else 6379)}/{int(db or 0)}"


def log_verbosely() -> None:
    """flatland's ``verbose=True``: the client's debug messages, on stderr unless logging is set up."""
    logger = logging.getLogger("arbiter.client")
    logger.setLevel(logging.DEBUG)
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        logger.addHandler(handler)


class RemoteClient(Wire):
    """Connects to the evaluator and hands out its episodes one by one.

    Connection settings, in order: the ``redis_url`` / ``service_id`` keywords; the
    environment (``ARBITER_REDIS_URL``, else ``redis_ip`` as flatland's client reads it, on
    port 6379; ``AICROWD_SUBMISSION_ID``); flatland's defaults (127.0.0.1:6379, ``T12345``).
    The wire (session, resends, reconnects, the handshake and its takeover) is ``Wire``'s.
    """

    # Requests are rare here (one an episode: steps go fire-and-forget, see _send_step), so each
    # goes out with its own LPUSH, through ``self.redis.lpush``, the one call that queues them
    # (tests/test_fault_clients.py drops one there to see it resent).
    pipelined = False

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
        spin_us: float | None = None,
        freeze_gc: bool | None = None,
        # flatland-rl's FlatlandRemoteClient keywords (4.3.0's, and the 2020 client's test_envs_root)
        flatland_rl_service_id: str | None = None,
        remote_host: str | None = None,
        remote_port: int | None = None,
        remote_db: int | None = None,
        remote_password: str | None = None,
        test_envs_root: str | None = None,
        verbose: bool = False,
        use_pickle: bool = False,
    ):
        if redis_url is None:
            redis_url = flatland_redis_url(remote_host, remote_port, remote_db, remote_password)
        self.verbose = verbose
        if verbose:
            log_verbosely()
        # Accepted as flatland's client accepts it; requests go as msgpack whatever it says, which
        # arbiter's evaluator and flatland's (unless started with --pickle) read.
        self.use_pickle = use_pickle
        super().__init__(
            redis_url,
            service_id or flatland_rl_service_id,
            reply_timeout_s=reply_timeout_s,
            resend_after_s=resend_after_s,
            spin_us=spin_us,
        )
        test_env_folder = test_env_folder or test_envs_root
        # Only used against flatland's own service, which sends no env state.
        self.test_env_folder = test_env_folder or os.environ.get("AICROWD_TESTS_FOLDER")
        self.step_replies = step_replies
        # flatland's load_new attaches a step recorder (env.cur_episode, for save_episode) to
        # every env it loads; an agent rarely reads it and it costs ~5 % of every env.step.
        self.record_steps = record_steps
        # Fire-and-forget steps expect no reply: they all name this one channel (the protocol
        # wants a valid one); only an error for a refused step could land there, and expire.
        self._step_channel = keys.response_key(self.service_id, self.session)
        self.episode_index: int | None = None  # the evaluator's index of the running episode
        self._step_conn: Any = None  # a connection of its own for steps (see _send_step)
        # The first command of every step's packet, the same each time: packed once.
        self._take_error_packed = pack(("RPOP", self.errors_key))
        self.env: Any = None
        self._episode_done = False  # the running episode ended: a step now is out of order
        self.current_env_path: str | None = None
        self._last_step_end = time.monotonic()
        self._budget_clock = BudgetClock()
        self._guard = DeadlineGuard()
        self.fallbacks_used = 0  # calls of act_within_budget that returned the fallback
        preload()
        # The PING says what this client plays: on another format's evaluation it is refused at
        # once, with both named, instead of failing on the first reply it cannot read.
        self.handshake(flatland_version(), asks={"client": "arbiter.client.RemoteClient", "formats": ["flatland"]})
        if _freeze_gc_wanted(freeze_gc):  # after the imports above, before the first episode's env
            set_aside_what_is_loaded()

    # -- the SDK --------------------------------------------------------------------------

    def ping_pong(self, *, raise_pending: bool = True) -> bool:
        """flatland's handshake call: a PING (see ``Wire.ping``), True once answered."""
        self.ping(flatland_version(), raise_pending=raise_pending)
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
        self.env, self._episode_done = None, False
        release_flatland_caches()
        # The env state is rebuilt as the reply is decoded: no second pass over it.
        response = self.request(FLATLAND_RL.ENV_CREATE, {}, maps=env_state_maps)
        self._budget_clock.episode_started(self.server_info.get("budgets"), time.monotonic())
        payload = response["payload"]
        if not payload.get("observation"):
            self.env = None
            if self.verbose:
                log.debug("env_create: no episode is left")
            return False, False
        ext = extension(payload)
        self.current_env_path = payload.get("env_file_path")
        self.episode_index = ext.get("episode")
        if self.verbose:
            log.debug("env_create: episode %s, %s, seed %s", self.episode_index, self.current_env_path,
                      payload.get("random_seed"))  # fmt: skip
        if "env_state" in ext:
            env_dict = env_state_from_wire(ext["env_state"], rebuilt=True)
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

    def env_step(
        self, action_dict: Any = _UNSET, render: bool = False, *, action: Any = _UNSET
    ) -> tuple[Any, Any, Any, Any]:
        """Send the actions and step the local env: ``(obs, rewards, done, info)``.

        Raises ``TimeoutException`` (a ``StopAsyncIteration``) once the evaluator has timed
        the episode out; call ``env_create()`` to go on with the next one. ``action`` is
        flatland's client's name for the map, and ``render`` is accepted as flatland's client
        accepts it, which renders nothing either.
        """
        if action is not _UNSET:
            if action_dict is not _UNSET:
                raise TypeError("env_step() takes the actions once: as action_dict or as action, not both")
            action_dict = action
        elif action_dict is _UNSET:
            raise TypeError("env_step() needs the actions: a map of agent handle to action")
        if self.env is None:
            raise OutOfOrder("env_step() before env_create(): there is no running episode")
        if self._episode_done:  # flatland's env would refuse it too, once the step had been sent
            raise OutOfOrder("env_step() after the episode ended: call env_create() for the next one")
        actions = _plain_actions(action_dict)
        if self.verbose:
            log.debug("env_step: %s", actions)
        sent_at = time.monotonic()
        self._budget_clock.step_sent(sent_at)
        payload: dict[str, Any] = {"action": actions, "inference_time": sent_at - self._last_step_end}
        if self.step_replies:
            payload[EXTENSION_KEY] = {"reply": True}
            self.request(FLATLAND_RL.ENV_STEP, payload)
            collect = None
        else:
            collect = self._send_step(payload)
        try:
            observation, rewards, done, info = self.env.step(actions)
        finally:
            if collect is not None:
                collect()  # raises TimeoutException if the evaluator had timed the episode out
        self._last_step_end = time.monotonic()
        self._episode_done = bool(done.get("__all__")) if isinstance(done, dict) else bool(done)
        return observation, rewards, done, info

    def submit(self) -> dict[str, Any]:
        """End the evaluation and return the scores."""
        response = self.request(FLATLAND_RL.ENV_SUBMIT, {})
        if self.verbose:
            log.debug("submit: %s", response["payload"])
        return response["payload"]

    def close(self) -> None:
        """Release the evaluation (another client may go on with it at once) and close the
        connections."""
        self.release()
        if self._step_conn is not None:
            self._step_conn.disconnect()
        super().close()

    # -- fire-and-forget steps ----------------------------------------------------------------

    def _send_step(self, payload: dict[str, Any]) -> Callable[[], None]:
        """Send a step without waiting; returns the call that collects Redis's answers.

        One round trip per step, and it overlaps the local env step: the commands (check for a
        timeout, push the step) go out first, the answers are read after the local step. A step
        pushed after a timeout is ignored by the evaluator, and a step pushed twice (a retry
        after a lost connection) carries the same sequence number and is applied once.
        """
        message = self._tagged(FLATLAND_RL.ENV_STEP, payload, self._step_channel)
        # One piece, the errors list's RPOP packed once and the LPUSH framed here (pack3): redis-py's
        # own packing of these two commands costs more than encoding the request itself (the docs'
        # performance log).
        packet = self._take_error_packed + pack3(b"LPUSH", self._commands_key_bytes, message)
        try:
            connection = self._step_connection()
            connection.send_packed_command([packet], check_health=False)
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
        # A forked child never writes on its parent's connection: redis-py's Connection records
        # the pid that opened it, and the child's pool opens the child its own.
        if self._step_conn is None or self._step_conn.pid != os.getpid():
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
