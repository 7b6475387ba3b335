"""Shared helpers for tests that run a real evaluator against a real redis-server."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import logging_lock
import numpy as np

from arbiter.server.core.budgets import BudgetPolicy
from arbiter.server.core.competition import CompetitionSpec
from arbiter.server.service.build import build_service
from arbiter.server.service.loop import EvaluatorService
from arbiter.server.service.records_file import read_records


def wait_for(condition: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition") -> Any:
    """Poll ``condition`` until it is truthy; fail the test with ``what`` after ``timeout_s``."""
    give_up = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.002)


def in_forked_child(report: Callable[[], Any]) -> tuple[int, str]:
    """Fork; the child runs ``report`` and sends back its text, then leaves without cleanup (as a
    forked worker of an agent's would). Returns the child's pid and that text."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.write(write_end, str(report()).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        text = pipe.read().decode()
    assert os.waitpid(child, 0)[1] == 0
    return child, text


def sealed_memory_files() -> bool:
    """This system makes the sealed memory files a shared frames segment is (Linux's memfd)."""
    from arbiter.protocol.shared_frames import LARGE_ARRAY_BYTES, SharedFramesWriter

    try:
        SharedFramesWriter(LARGE_ARRAY_BYTES).close()
    except OSError:
        return False
    return True


def spec(**budgets: Any) -> CompetitionSpec:
    """The NeurIPS 2020 competition with the given (usually sub-second) budgets."""
    scoring = budgets.pop("scoring", "neurips2020")
    debug = budgets.pop("debug", False)
    max_episodes = budgets.pop("max_episodes", None)
    return CompetitionSpec(
        name="test", scoring=scoring, debug=debug, max_episodes=max_episodes, budgets=BudgetPolicy(**budgets)
    )


@contextlib.contextmanager
def running_service(
    competition: CompetitionSpec,
    *,
    tests: str | None,
    results: str,
    redis_url: str,
    service_id: str,
    resume: bool = False,
) -> Iterator[tuple[EvaluatorService, dict[str, Any]]]:
    """An evaluator serving in a background thread; yields (service, outcome) where outcome
    gets "summary" once the evaluation ends. Always stopped and joined on exit. ``resume``: it
    continues the evaluation of ``results`` (``arbiter serve --resume``)."""
    service = build_service(
        competition, tests=tests, results_dir=results, redis_url=redis_url, service_id=service_id, resume=resume
    )
    outcome: dict[str, Any] = {}

    def serve() -> None:
        try:
            outcome["summary"] = service.run()
        except BaseException as exc:  # surfaced by finish() below
            outcome["error"] = exc

    thread = threading.Thread(target=serve, name="evaluator", daemon=True)
    thread.start()
    outcome["thread"] = thread
    try:
        yield service, outcome
    finally:
        service.request_stop("test finished")
        thread.join(timeout=10)
        service.close()
        assert not thread.is_alive(), f"the evaluator thread did not stop; {where_threads_are()}"


def finish(outcome: dict[str, Any], timeout_s: float = 20.0) -> dict[str, Any]:
    """Wait for the evaluation in ``outcome`` to end and return its summary."""
    outcome["thread"].join(timeout=timeout_s)
    assert not outcome["thread"].is_alive(), f"the evaluation did not end; {where_threads_are()}"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["summary"]


def where_threads_are() -> str:
    """Every live thread of the test process and where it is, for a failure that found an
    evaluator thread still running: what it waits on, and what holds it up."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    frames = sys._current_frames()
    holder = logging_lock.owner()
    # The logging lock's holder first: a long report is cut in the middle, where the rest goes.
    order = sorted(frames, key=lambda ident: ident != holder)
    stacks = [f"thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frames[ident]))}" for ident in order]
    return f"{logging_lock.describe_owner()}; the test process's threads:\n" + "\n".join(stacks)


def read_episodes(results: str, missing_ok: bool = False) -> list[dict[str, Any]]:
    """The records of episodes.jsonl's whole items, read as resume and scoring read them."""
    path = os.path.join(results, "episodes.jsonl")
    if not (missing_ok or os.path.exists(path)):
        raise FileNotFoundError(path)
    return read_records(path)


def read_events(results: str) -> list[dict[str, Any]]:
    """The progress events of events.jsonl (none before the file exists)."""
    path = os.path.join(results, "events.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def read_summary(results: str) -> dict[str, Any]:
    with open(os.path.join(results, "summary.json"), encoding="utf-8") as handle:
        return json.load(handle)


def seeded_actions(episode: int, step: int, num_agents: int) -> dict[int, int]:
    """A deterministic agent: actions are a pure function of episode, step and handle."""
    rng = np.random.default_rng([episode, step])
    return {handle: int(a) for handle, a in enumerate(rng.integers(0, 5, size=num_agents))}


def play_episode(client: Any, episode: int, record: list | None = None) -> dict:
    """Step the client's current episode to the end with ``seeded_actions``; returns last done."""
    step = 0
    while True:
        actions = seeded_actions(episode, step, client.env.get_num_agents())
        if record is not None:
            record.append(actions)
        _, _, done, _ = client.env_step(actions)
        step += 1
        if done["__all__"]:
            return done


def time_out_episode(client: Any, redis_conn: Any, *, episode: int, steps: int) -> None:
    """Play ``steps`` steps of the current episode, then stop until the evaluator times it out:
    awaited on the errors list, where the client learns it on its next step."""
    from arbiter.client import TimeoutException
    from arbiter.protocol import keys

    for step in range(steps):
        client.env_step(seeded_actions(episode, step, client.env.get_num_agents()))
    errors = keys.errors_key(client.service_id)
    wait_for(lambda: redis_conn.llen(errors) > 0, what=f"the timeout of episode {episode}")
    try:
        client.env_step(seeded_actions(episode, steps, client.env.get_num_agents()))
    except TimeoutException:
        return
    raise AssertionError("the step after the timeout did not raise TimeoutException")


# -- RemoteEnv (formats whose env is the server's) ------------------------------------------


def remote_episode(env: Any, policy: Any, before_step: dict[int, Any]) -> tuple[float, list[Any]]:
    """One episode on the evaluator; ``before_step[k](action)`` runs before step k with the policy's
    action and returns the form in which it is sent (None: as the policy gave it)."""
    observation, _ = env.reset()
    seen, total, done, step = [observation], 0.0, False, 0
    while not done:
        action = policy(observation)
        sent = before_step[step](action) if step in before_step else None
        observation, reward, terminated, truncated, _ = env.step(action if sent is None else sent)
        seen.append(observation)
        total += reward
        done, step = terminated or truncated, step + 1
    return total, seen


def train_until_the_run_ends(env: Any, action: int) -> None:
    """Five-step episodes of ``action`` until the evaluator ends the training run."""
    try:
        while True:
            env.reset()
            for _ in range(5):
                env.step(action)
    except StopIteration:
        return
