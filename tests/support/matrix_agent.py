"""An agent for the resume matrix (tests/test_resume_matrix.py): a real client of one format that
pauses once at a chosen point of the evaluation, so that the test kills the evaluator exactly
there, then lets the agent go on (it lived through the restart) or kills it too.

    python tests/matrix_agent.py CONTROL_DIR KIND [ARGS...]

KIND: ``two-phase SUBMISSION_DIR`` (the ReinforceLab runner), ``metalc SUBMISSION_DIR`` (the MetaLC
runner), ``diambra`` (a DIAMBRA-style RemoteEnv loop) or ``flatland`` (a RemoteClient agent).
Every agent is deterministic: the same actions for the same item and step, however often it is
started.

``MATRIX_PAUSE`` (environment) says where to pause, in the items of the evaluator's plan:
``create:I`` before the request that starts item I (item I-1 has ended: between items; I = 0:
before the first), ``step:I:K`` before step K of item I (K = 0: before its first step), or
``created:I`` once the reply that starts item I has arrived, before the agent sees it (a MetaLC
fold's meta-training would start now). That reply is an ENV_CREATE's, or that of the step that
ended item I-1 when the client asked for the next item with it (the MetaLC runner does).
Paused, it writes CONTROL_DIR/paused and waits for CONTROL_DIR/go.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from arbiter.protocol.messages import FLATLAND_RL, extension

CONTROL = sys.argv[1]
PAUSE = os.environ.get("MATRIX_PAUSE", "")


class Progress:
    """Where the agent is in the plan, as its requests and replies show it."""

    def __init__(self) -> None:
        self.item: int | None = None  # the item the last create reply started or continued
        self.steps = 0  # steps sent in that item
        self.over = False  # that item has ended
        self.paused = False

    def pause_if(self, point: str) -> None:
        if self.paused or point != PAUSE:
            return
        self.paused = True
        with open(os.path.join(CONTROL, "paused.part"), "w") as out:
            out.write(str(os.getpid()))
        os.rename(os.path.join(CONTROL, "paused.part"), os.path.join(CONTROL, "paused"))
        while not os.path.exists(os.path.join(CONTROL, "go")):  # the test's signal: a file
            time.sleep(0.002)

    def before_create(self) -> None:
        if self.item is None:
            self.pause_if("create:0")
        elif self.over:
            self.pause_if(f"create:{self.item + 1}")

    def created(self, item: Any) -> None:
        if item is None or item == self.item:
            return
        self.item, self.steps, self.over = item, 0, False
        self.pause_if(f"created:{item}")

    def before_step(self) -> None:
        self.pause_if(f"step:{self.item}:{self.steps}")

    def stepped(self, item_over: bool) -> None:
        self.steps += 1
        self.over = item_over


PROGRESS = Progress()


def watch_the_wire() -> None:
    """Every client of a server-side format sends through ``Wire.request``."""
    from arbiter.client import wire

    real_request = wire.Wire.request

    def request(self: Any, type_: str, payload: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        if type_ == FLATLAND_RL.ENV_CREATE:
            PROGRESS.before_create()
        elif type_ == FLATLAND_RL.ENV_STEP:
            PROGRESS.before_step()
        response = real_request(self, type_, payload, *args, **kwargs)
        body = response.get("payload") or {}
        if type_ == FLATLAND_RL.ENV_CREATE:
            PROGRESS.created(extension(body).get("item"))
        elif type_ == FLATLAND_RL.ENV_STEP:
            PROGRESS.stepped(bool(body.get("done")))
            brought = extension(body).get("next")  # the next item, opened by the step that ended this one
            if isinstance(brought, dict):
                PROGRESS.created(extension(brought).get("item"))
        return response

    wire.Wire.request = request


def diambra() -> int:
    """DIAMBRA's agent loop (reset on terminated or truncated, leave on env_done), with actions
    drawn from a sampler seeded by the item it plays."""
    from arbiter.client.remote_env import RemoteEnv

    env = RemoteEnv()
    observation, info = env.reset()
    env.action_space.seed(env.episode["item"])
    while True:
        observation, reward, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:
            observation, info = env.reset()
            if info["env_done"]:
                break
            env.action_space.seed(env.episode["item"])
    env.submit()
    env.close()
    return 0


def flatland() -> int:
    """A RemoteClient agent whose actions are a function of (episode, step, handle)."""
    from harness import seeded_actions

    from arbiter.client import RemoteClient

    client = RemoteClient()
    while True:
        PROGRESS.before_create()
        observation, _ = client.env_create()
        if not observation:
            break
        PROGRESS.created(client.episode_index)
        step = 0
        while True:
            PROGRESS.before_step()
            _, _, done, _ = client.env_step(seeded_actions(client.episode_index, step, client.env.get_num_agents()))
            PROGRESS.stepped(done["__all__"])
            step += 1
            if done["__all__"]:
                break
    client.submit()
    client.close()
    return 0


def main() -> int:
    kind, args = sys.argv[2], sys.argv[3:]
    if kind == "flatland":
        return flatland()
    watch_the_wire()
    if kind == "diambra":
        return diambra()
    if kind == "two-phase":
        from arbiter.client import reinforcelab

        return reinforcelab.main(args)
    if kind == "metalc":
        from arbiter.client import metalc

        return metalc.main(args)
    raise SystemExit(f"unknown kind {kind!r}")


if __name__ == "__main__":
    sys.exit(main())
