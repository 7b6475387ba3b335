"""``RemoteEnv``: a real ``gymnasium.Env`` whose env lives on the evaluator.

For every format that keeps its env on the server (two-phase, DIAMBRA, MetaLC): ``reset()`` asks
the evaluator for its next episode (``ENV_CREATE``) and ``step(action)`` sends the action and
returns the evaluator's ``(observation, reward, terminated, truncated, info)``. The spaces come
from the evaluator at the handshake. Training loops written for Gymnasium (a hand-written loop,
stable-baselines3, CleanRL) use it unchanged.

Seeds, env ids and options are the organiser's: ``reset(seed=...)`` cannot choose the seed (the
evaluator resets with its own, and names it only once the episode is over, in the
``info["arbiter"]["seed"]`` of the step that ends it). Every wait has a
timeout (``ServerUnavailable``); a budget timeout raises ``TimeoutException`` (a
``StopAsyncIteration``) at the next call, as in ``RemoteClient``. When the evaluator ends a
training stage (converged, or its step limit), the step that ends it is ``truncated`` with
``info["arbiter"]["stage_over"]`` set, and a ``step()`` after it raises ``StopIteration``, as
ReinforceLab's convergence monitor does. A runner that follows the plan's stages
(``begin_stage``) gets ``StopIteration`` from ``reset()`` too, until it begins the next stage; a
plain loop's ``reset()`` starts whatever the plan holds next.

When the evaluator is restarted (``--resume``) while this env is inside an item, the next call
raises ``EvaluatorRestarted``: that item (with everything in the plan that depends on it) is
played again from its start, at ``exc.resume_item``, and ``next_item`` says so; the agent's state
from inside it is not to be trusted, so an agent should be started again (arbiter's runners
rebuild theirs). Between items, a restart goes unnoticed.

On the evaluator's machine an observation's large arrays (a game frame) are not copied: they are
views of the evaluator's shared memory segment (``protocol/shared_frames.py``), writable, and
each stays as it came for as long as anything references it. An agent that holds more
observations than the segment has slots gets the next ones as copies.

``info["env_done"]`` says whether the evaluation has an episode left, the way DIAMBRA's
evaluation env says it: every ``reset()`` reports False while it starts an episode; once the
evaluation has none left, ``reset()`` returns the last observation with ``env_done`` True (and
``env.finished`` is set), so a loop written for DIAMBRA ends where it should.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import gymnasium

from arbiter.client.wire import Wire
from arbiter.protocol.errors import ArbiterError, EvaluatorRestarted, OutOfOrder
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL, PROTOCOL_VERSION, extension
from arbiter.protocol.redis_conn import LARGE_ARGUMENT, LARGE_READ_CHUNK
from arbiter.protocol.shared_frames import SHARED, SharedFramesReader
from arbiter.protocol.spaces import as_element, data_bytes, holds_tuple, space_from_wire, spec_from_wire

log = logging.getLogger(__name__)

TRAINING_RUN_ENDED = "the evaluator ended this training run (converged, or at its step limit)"


class RemoteEnv(gymnasium.Env):
    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        redis_url: str | None = None,
        service_id: str | None = None,
        *,
        reply_timeout_s: float | None = None,
        spin_us: float | None = None,
        shared_frames: bool | None = None,
        formats: list[str] | str = "server-side",
        client_name: str = "arbiter.client.RemoteEnv",
    ):
        """``formats``: the formats this env's agent plays (default: any whose env is the
        evaluator's); the handshake names them, and another format's evaluation refuses it."""
        super().__init__()
        self.wire = Wire(redis_url, service_id, reply_timeout_s=reply_timeout_s, spin_us=spin_us)
        if shared_frames is None:
            shared_frames = os.environ.get("ARBITER_SHARED_FRAMES", "1").strip() != "0"
        asks: dict[str, Any] = {"client": client_name, "formats": formats}
        if shared_frames:
            asks["frames"] = SHARED
        self.server_info = self.wire.handshake(f"arbiter-{PROTOCOL_VERSION}", asks=asks)
        self.frames = self._map_frames(self.server_info.get("frames"))
        if "spaces" not in self.server_info:
            raise ArbiterError(
                "this evaluator keeps no env on the server (a Flatland evaluation): use arbiter.client.RemoteClient"
            )
        self.observation_space = space_from_wire(self.server_info["spaces"]["observation"])
        self.action_space = space_from_wire(self.server_info["spaces"]["action"])
        self.spec = spec_from_wire(self.server_info.get("spec"))  # the server's env's registration
        self._tuples_inside = holds_tuple(self.observation_space)  # rebuilt from msgpack's lists
        if data_bytes(self.observation_space) > LARGE_ARGUMENT and self.frames is None:  # every reply is large
            self.wire.packets.read_in_chunks_of(LARGE_READ_CHUNK)
        self.stages: list[dict[str, Any]] = list(self.server_info.get("stages", []))
        self.next_item: int = int(self.server_info.get("next", 0))  # where the evaluation stands
        self.episode: dict[str, Any] = {}  # the running episode's place in the plan (item, phase, stage, run ...)
        self.finished = False  # the evaluation has no episode left
        self._last_observation: Any = None
        self._stage: dict[str, Any] | None = None
        self._stage_over = False
        self._ignored_seed_warned = False
        self._ignored_options_warned = False

    @staticmethod
    def _map_frames(offer: Any) -> SharedFramesReader | None:
        """The evaluator's shared frames segment, if it offered one that this process can map
        (protocol/shared_frames.py); else None, and large arrays come through Redis."""
        if offer is None:
            return None
        try:
            return SharedFramesReader(offer)
        except (OSError, ArbiterError) as exc:  # another machine or container: nothing is lost
            log.info("observations come through Redis: the evaluator's shared frames are out of reach (%s)", exc)
            return None

    # -- stages (used by runners that follow the plan, e.g. arbiter.client.reinforcelab) --------

    def begin_stage(self, stage: dict[str, Any]) -> None:
        """Play ``stage`` (one of ``self.stages``) next: a training stage's resets stay in it, an
        evaluation stage's resets go through its episodes in order."""
        self._stage = stage
        self._stage_over = False
        self.episode = {}  # a new stage: no episode runs yet
        self.next_item = max(self.next_item, stage["items"][0])

    def _expected_item(self) -> int | None:
        stage = self._stage
        if stage is None:
            return None
        return stage["items"][0] if stage["stage"] == "train" else self.next_item

    # -- gymnasium.Env --------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        # gymnasium.Env's own: ``np_random`` seeded as asked (the agent's randomness, never the env's)
        super().reset(seed=seed)
        # Python warnings, as gymnasium's own (a caller filters or records them as it does those).
        if seed is not None and not self._ignored_seed_warned:
            said = f"the evaluator chooses every reset's seed; reset(seed={seed!r}) seeds np_random only"
            warnings.warn(said, UserWarning, stacklevel=2)
            self._ignored_seed_warned = True
        if options and not self._ignored_options_warned:
            said = f"the evaluator decides every episode; reset(options={options!r}) is ignored"
            warnings.warn(said, UserWarning, stacklevel=2)
            self._ignored_options_warned = True
        if self._stage_over and self._stage is not None and self.episode.get("stage") == "train":
            raise StopIteration(TRAINING_RUN_ENDED)
        asks = self._frames_asks({})
        expected = self._expected_item()
        if expected is not None:
            asks["item"] = expected
            # A reset inside the item it names (a training run's next episode): after an
            # evaluator restart, that item cannot go on (see the module docstring).
            if self.episode.get("item") == expected:
                asks["within"] = True
        body = self._request(FLATLAND_RL.ENV_CREATE, {EXTENSION_KEY: asks} if asks else {})["payload"]
        ext = extension(body)
        if ext.get("finished"):
            self.finished = True
            self.episode = {}
            return self._last_observation, {"env_done": True, EXTENSION_KEY: {"finished": True}}
        self.episode = {k: v for k, v in ext.items() if k not in ("finished",)}
        item = ext.get("item")
        if isinstance(item, int):
            self.next_item = item + 1
        self._stage_over = False
        info = dict(body.get("info") or {})
        info[EXTENSION_KEY] = self.episode
        info.setdefault("env_done", False)
        self._last_observation = self._observation(body.get("observation"))
        return self._last_observation, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if self._stage_over and self.episode.get("stage") == "train":
            raise StopIteration(TRAINING_RUN_ENDED)
        if self.finished:
            raise OutOfOrder("the evaluation has no episode left (reset() said env_done): call submit()")
        if not self.episode:
            raise OutOfOrder("step() before reset(): there is no running episode")
        asks = self._frames_asks({"reply": True})
        body = self._request(FLATLAND_RL.ENV_STEP, {"action": action, EXTENSION_KEY: asks})["payload"]
        ext = extension(body)
        self._stage_over = bool(ext.get("stage_over"))
        info = dict(body.get("info") or {})
        if ext:
            info[EXTENSION_KEY] = ext
        observation = body["observation"]
        if self.frames is not None or self._tuples_inside:  # a step's path: no call when neither applies
            observation = self._observation(observation)
        self._last_observation = observation
        return observation, float(body["reward"]), bool(body["terminated"]), bool(body["truncated"]), info

    def render(self) -> None:
        """Nothing: the env and its screen are the evaluator's (a DIAMBRA observation carries its
        ``frame``). None, as an env made without a render mode returns, so a loop that calls
        ``render()`` on every step plays on."""
        return None

    def _observation(self, observation: Any) -> Any:
        """An observation as the env made it: its large arrays from the shared frames, its tuples
        tuples again."""
        if self.frames is not None:
            observation = self.frames.restore(observation)
        if self._tuples_inside:
            observation = as_element(self.observation_space, observation)
        return observation

    def _frames_asks(self, asks: dict[str, Any]) -> dict[str, Any]:
        """``asks`` with the slot of the shared frames segment the reply's arrays go to."""
        if self.frames is not None:
            slot = self.frames.ask()
            if slot is not None:
                asks["frames"] = slot
        return asks

    def _request(self, type_: str, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.wire.request(type_, payload)
        except EvaluatorRestarted as exc:
            # Nothing runs any more: the plan goes on at the item the evaluator named.
            self.episode = {}
            self._stage = None
            self._stage_over = False
            if exc.resume_item is not None:
                self.next_item = exc.resume_item
            raise

    def submit(self) -> dict[str, Any]:
        """End the evaluation; returns the scores the evaluator computed."""
        return self.wire.request(FLATLAND_RL.ENV_SUBMIT, {})["payload"]

    def close(self) -> None:
        """Release the evaluation (another client may go on with it at once) and close the
        connection. An episode left running is not ended by it: its budget runs on."""
        self.wire.release()
        self.wire.close()
        if self.frames is not None:
            self.frames.close()
            self.frames = None
        super().close()
