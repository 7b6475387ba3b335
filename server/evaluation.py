"""One evaluation as a state machine: episodes, budgets and scores, with no I/O of its own.

The service loop (service.py) feeds it requests and expired deadlines; it answers with reply
payloads and out-of-band errors, and writes each finished episode to the results store before
anything else happens. Its rules, in brief:

- episodes are handed out in order; each ENV_CREATE starts the next one (an unfinished episode
  is abandoned and scores as unfinished);
- a planning or step timeout scores the episode as unfinished, puts the timeout on the errors
  list and ignores the episode's late steps; the evaluation continues at the next ENV_CREATE;
- after a timeout the client has one step budget to ask for the next episode; every budget
  that passes in a row counts as a successive timeout, and the limit ends the evaluation;
- the wait after an episode's last step is not a step window: a finished episode is final;
- an evaluation that ends early after at least one episode was handed out (successive
  timeouts, an idle client, an early ENV_SUBMIT) is scored with every episode not played
  counting as unfinished; one where no episode was handed out, or that ran over the overall
  budget, FAILS with no score.
"""

from __future__ import annotations

import datetime
import enum
import logging
import math
import platform
import statistics
import time
from array import array
from collections import Counter
from collections.abc import Callable
from typing import Any

from arbiter.protocol.errors import ConfigError, EvaluationError, OutOfOrder, TimeoutException
from arbiter.protocol.messages import EPISODE_LOST, EXTENSION_KEY, FLATLAND_RL, PROTOCOL_VERSION, extension, reply

from .adapters.flatland import FlatlandEpisode, sanitize_actions
from .budgets import BudgetPolicy, Deadline, TimeBank, Wait, budget_for, silence_before_takeover_s
from .results import ResultsStore
from .scoring import ScoringRule

log = logging.getLogger(__name__)


class State(enum.StrEnum):
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    INTERRUPTED = "INTERRUPTED"


def _stats(values: Any) -> dict[str, float] | None:
    if not len(values):
        return None
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "min": ordered[0],
        "mean": math.fsum(ordered) / len(ordered),
        "p99": ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)],
        "max": ordered[-1],
    }


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for package in ("arbiter", "flatland-rl", "redis", "msgpack", "numpy"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "unknown"
    return found


class Evaluation:
    def __init__(
        self,
        adapter: Any,
        rule: ScoringRule,
        budgets: BudgetPolicy,
        store: ResultsStore,
        *,
        competition: str,
        service_id: str,
        debug: bool = False,
        clock: Callable[[], float] = time.monotonic,
        on_episode: Callable[[dict[str, Any], Evaluation], None] | None = None,
        on_finish: Callable[[Evaluation], None] | None = None,
    ):
        self.adapter = adapter
        self.specs = adapter.episodes
        self.rule = rule
        self.budgets = budgets
        self.store = store
        self.competition = competition
        self.service_id = service_id
        self.debug = debug
        self.clock = clock
        self.on_episode = on_episode
        self.on_finish = on_finish

        self.state = State.RUNNING
        self.termination_cause = ""
        self.records: list[dict[str, Any]] = []
        self.current: FlatlandEpisode | None = None
        self.next_index = 0
        self.wait = Wait.CLIENT
        self.wait_started = clock()
        self.created_at = clock()
        self.started_at: float | None = None  # first request: the overall budget starts here
        self.used_before_s = 0.0  # overall time used by earlier runs of a resumed evaluation
        self.finished_at: float | None = None
        self.started_wall = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self.successive_timeouts = 0
        self.counters: Counter[str] = Counter()
        self.client_version: str | None = None
        # Per-step timings (seconds), kept compact: an 8-hour evaluation makes millions of steps.
        self.think_s = array("d")  # client time between our readiness and its next step
        self.server_step_s = array("d")  # our time to apply one step
        self._episode_think = array("d")
        self._episode_started = 0.0
        self._planning_s: float | None = None
        self._invalid_actions = 0
        self.bank = TimeBank(budgets.time_bank_s)
        # The next episode's env, built ahead while the evaluator would otherwise wait (see
        # prepare_ahead), so loading it rarely sits between an ENV_CREATE and its reply.
        self._prepared: tuple[int, FlatlandEpisode | Exception] | None = None

    # -- what the service loop asks -------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.state is not State.RUNNING

    @property
    def total(self) -> int:
        return len(self.specs)

    def deadline(self) -> Deadline:
        at = self.wait_started + budget_for(self.wait, self.budgets, self.bank.left_s)
        if self.started_at is not None:
            overall_at = self.started_at + self.budgets.overall_s - self.used_before_s
            if overall_at <= at:
                return Deadline(self.wait, overall_at, overall=True)
        return Deadline(self.wait, at)

    def elapsed_s(self, now: float) -> float:
        """Overall budget used so far, across restarts (downtime between runs is not counted)."""
        return self.used_before_s + (now - self.started_at if self.started_at is not None else 0.0)

    def time_left_s(self, now: float) -> float:
        return max(0.0, self.budgets.overall_s - self.elapsed_s(now))

    def expire(self, deadline: Deadline, now: float) -> list[dict[str, Any]]:
        """A deadline passed with no request; returns out-of-band errors for the client."""
        if deadline.overall:
            self._fail_overall(now)
            return []
        wait = self.wait
        if wait is Wait.CLIENT:
            heard = self.started_at is not None
            self.finish(
                State.FAILED,
                (
                    f"the client connected but asked for no episode within the idle budget of {self.budgets.idle_s:g} s"
                    if heard
                    else f"no client connected within the idle budget of {self.budgets.idle_s:g} s"
                ),
                now,
            )
            return []
        if wait in (Wait.PLANNING, Wait.STEP):
            kind = "planning" if wait is Wait.PLANNING else "step"
            budget = self.budgets.planning_s if wait is Wait.PLANNING else self.budgets.step_s
            self.bank.spend_all()
            self._record_current(now, finished=False, timeout=kind)
            self.counters[f"{kind}_timeouts"] += 1
            error_type = FLATLAND_RL.ENV_RESET_TIMEOUT if wait is Wait.PLANNING else FLATLAND_RL.ENV_STEP_TIMEOUT
            bank = f" and a time bank of {self.bank.size_s:g} s" if self.bank.size_s else ""
            log.warning("episode %d timed out (%s budget of %g s%s)", len(self.records) - 1, kind, budget, bank)
            self._count_timeout(now)
            return [{"type": error_type}]
        if wait is Wait.AFTER_TIMEOUT:
            # The client did not come back for the next episode within a step budget.
            self._count_timeout(now)
            return []
        if wait is Wait.NEXT_EPISODE:
            self._end_early(
                f"the client asked for no new episode within the idle budget of {self.budgets.idle_s:g} s", now
            )
            return []
        if wait is Wait.SUBMIT:
            self.finish(
                State.SUCCESS,
                f"all {self.total} episodes evaluated; "
                f"no ENV_SUBMIT within the idle budget of {self.budgets.idle_s:g} s",
                now,
            )
        return []

    def check_overall(self, now: float) -> None:
        if self.started_at is not None and self.elapsed_s(now) >= self.budgets.overall_s:
            self._fail_overall(now)
            raise EvaluationError(self.termination_cause)

    def add_downtime(self, downtime_s: float) -> None:
        """Move every running budget by an outage of the evaluator's infrastructure."""
        self.wait_started += downtime_s
        if self.started_at is not None:
            self.started_at += downtime_s
        self.counters["downtime_ms"] += round(downtime_s * 1000)

    def restore(self, records: list[dict[str, Any]]) -> None:
        """Continue a killed evaluation after its last finished episode (``--resume``)."""
        for record, spec in zip(records, self.specs, strict=False):
            if record.get("env") != spec.env or record.get("index") != spec.index:
                raise ConfigError(
                    f"the results folder does not belong to this test set: episode {record.get('index')} "
                    f"is {record.get('env')!r} there, {spec.env!r} here"
                )
        if len(records) > self.total:
            raise ConfigError(f"the results folder holds {len(records)} episodes; this test set has {self.total}")
        self.records = list(records)
        self.next_index = len(records)
        self.used_before_s = float(records[-1].get("elapsed_s") or 0.0) if records else 0.0
        for record in reversed(records):
            if not record["timed_out"]:
                break
            self.successive_timeouts += 1
        self.counters["resumed"] += 1
        log.info(
            "resuming after %d finished episodes (%.1f s of the overall budget used)", len(records), self.used_before_s
        )

    # -- requests ---------------------------------------------------------------------------

    def on_ping(self, payload: dict[str, Any], now: float) -> dict[str, Any]:
        self._heard(now)
        version = payload.get("version") if isinstance(payload, dict) else None
        self.client_version = str(version)[:64] if version is not None else None
        return reply(
            FLATLAND_RL.PONG,
            {
                EXTENSION_KEY: {
                    "protocol": PROTOCOL_VERSION,
                    "budgets": self.budgets.as_dict(),
                    "episodes": self.total,
                    "scoring": self.rule.name,
                    "reward_model": self.rule.reward_model,
                    "debug": self.debug,
                }
            },
        )

    def on_create(self, payload: dict[str, Any], now: float) -> dict[str, Any]:
        self._heard(now)
        if self.current is not None:
            self.counters["abandoned_episodes"] += 1
            self._record_current(now, finished=False, abandoned=True)
        if self.next_index >= self.total:
            self._set_wait(Wait.SUBMIT, now)
            done = {"observation": False, "info": False, "random_seed": False, "env_file_path": False}
            return reply(FLATLAND_RL.ENV_CREATE_RESPONSE, done)
        spec = self.specs[self.next_index]
        self.current = self._open(self.next_index)
        self.next_index += 1
        body = self.current.create_payload()
        body[EXTENSION_KEY] = {
            "env_state": self.current.wire_state,
            "episode": spec.index,
            "episodes": self.total,
            "reward_model": self.rule.reward_model,
            "debug": self.debug,
        }
        self._episode_think = array("d")
        self._planning_s = None
        self._invalid_actions = 0
        self.bank.refill()
        # Loading the env is our time, not the participant's: planning starts when it is ready.
        ready = self.clock()
        self._episode_started = ready
        self._set_wait(Wait.PLANNING, ready)
        return reply(FLATLAND_RL.ENV_CREATE_RESPONSE, body)

    def on_step(self, payload: dict[str, Any], now: float) -> dict[str, Any] | None:
        self._heard(now)
        wants_reply = bool(extension(payload).get("reply"))
        episode = self.current
        if episode is None:
            if self.wait is Wait.AFTER_TIMEOUT or (self.records and self.records[-1]["timed_out"]):
                # A step of the episode that already timed out: late, ignored, never applied.
                self.counters["late_steps"] += 1
                if wants_reply:
                    raise TimeoutException("the episode timed out; call env_create() for the next one")
                return None
            raise OutOfOrder("ENV_STEP without a running episode: call env_create() first")
        think = now - self.wait_started
        if self.wait is Wait.PLANNING:
            self._planning_s = think
            over_budget_s = think - self.budgets.planning_s
        else:
            self._episode_think.append(think)
            self.think_s.append(think)
            over_budget_s = think - self.budgets.step_s
        if over_budget_s > 0:
            self.bank.draw(over_budget_s)
        action = payload.get("action") if isinstance(payload, dict) else None
        actions, invalid = sanitize_actions(action, episode.num_agents)
        if invalid:
            self._invalid_actions += invalid
            self.counters["invalid_actions"] += invalid
        started = self.clock()
        done = episode.step(actions)
        finished_step = self.clock()
        self.server_step_s.append(finished_step - started)
        if done:
            self.successive_timeouts = 0
            self._record_current(finished_step, finished=True)
        else:
            self._set_wait(Wait.STEP, finished_step)
        if not wants_reply:
            return None
        return reply(FLATLAND_RL.ENV_STEP_RESPONSE, {"done": done, "step": episode.steps, "invalid_actions": invalid})

    def on_submit(self, payload: dict[str, Any], now: float) -> dict[str, Any]:
        self._heard(now)
        if self.next_index >= self.total and self.current is None:
            self.finish(State.SUCCESS, f"all {self.total} episodes evaluated", now)
        else:
            played = len(self.records) + (self.current is not None)
            self._end_early(f"ENV_SUBMIT after {played} of {self.total} episodes", now)
        return reply(FLATLAND_RL.ENV_SUBMIT_RESPONSE, self.submit_payload())

    def preparation_pending(self) -> bool:
        index = self.next_index
        return not self.finished and index < self.total and (self._prepared is None or self._prepared[0] != index)

    def prepare_ahead(self) -> None:
        """Build the next episode's env now; the service loop calls this only when no deadline
        is near and nothing is queued, so the work never delays a budget decision."""
        if self.preparation_pending():
            index = self.next_index
            try:
                self._prepared = (index, self.adapter.open(self.specs[index], self.rule.reward_model))
            except Exception as exc:  # raised when the episode is asked for, where it can be reported
                self._prepared = (index, exc)

    def _open(self, index: int) -> FlatlandEpisode:
        if self._prepared is not None and self._prepared[0] == index:
            episode = self._prepared[1]
            self._prepared = None
            if isinstance(episode, Exception):
                raise episode
            return episode
        return self.adapter.open(self.specs[index], self.rule.reward_model)

    def replay_current_episode(self, now: float) -> list[dict[str, Any]]:
        """The running episode lost steps in an outage: forget it; the next ENV_CREATE hands
        the same episode out again. The client learns it through an out-of-band error."""
        if self.current is None:
            return []
        self.counters["episodes_replayed"] += 1
        log.warning("episode %d lost steps in a Redis outage; it will be played again", self.current.spec.index)
        self.current = None
        self.next_index -= 1
        self._set_wait(Wait.NEXT_EPISODE, now)
        return [{"type": EPISODE_LOST}]

    def takeover_after_s(self) -> float:
        """How long the bound client must have been silent before another one may replace it."""
        return silence_before_takeover_s(self.wait, self.budgets, self.bank.left_s)

    def take_over(self, silent_s: float, now: float) -> None:
        """A new client replaced one silent for ``silent_s`` (over ``takeover_after_s``): the
        episode the silent one left running times out now, its deadline passed or all but. The
        timeout is not posted: the errors list belongs to the new client from here on."""
        self.counters["takeovers"] += 1
        log.warning("a new client took over from one silent for %.2f s", silent_s)
        if self.current is not None and self.wait in (Wait.PLANNING, Wait.STEP):
            self.expire(Deadline(self.wait, now), now)

    # -- endings ----------------------------------------------------------------------------

    def agent_exited(self, status: int | None, now: float) -> None:
        if self.finished:
            return
        if self.wait is Wait.SUBMIT:
            self.finish(State.SUCCESS, f"all {self.total} episodes evaluated; the agent exited without ENV_SUBMIT", now)
        else:
            self._end_early(f"the agent process exited with status {status} before submitting", now)

    def fail_for_misbehaviour(self, cause: str, now: float) -> None:
        """The agent attacked the evaluation (a flood): no score; finished episodes stay written."""
        if not self.finished:
            self.finish(State.FAILED, cause, now)

    def interrupt(self, cause: str) -> None:
        if not self.finished:
            self.finish(State.INTERRUPTED, cause, self.clock())

    def fail_internal(self, cause: str, now: float) -> None:
        """A fault of the evaluator itself (a bug, an unreadable test file): FAILED, with the cause."""
        if not self.finished:
            self.finish(State.FAILED, f"internal error: {cause}", now)

    def finish(self, state: State, cause: str, now: float) -> None:
        self._prepared = None
        self.state = state
        self.termination_cause = cause
        self.finished_at = now
        self.current = None
        log.info("evaluation %s: %s", state.value, cause)
        if self.on_finish is not None:
            self.on_finish(self)  # before the summary is written, so what the hook counts is in it
        self.store.write_summary(self.summary())

    def _fail_overall(self, now: float) -> None:
        elapsed = self.elapsed_s(now)
        self.finish(
            State.FAILED,
            f"overall budget of {self.budgets.overall_s:g} s exceeded after {elapsed:.1f} s; no score",
            now,
        )

    def _end_early(self, cause: str, now: float) -> None:
        if self.current is None and not self.records:
            self.finish(State.FAILED, f"{cause}; no episode was played", now)
            return
        if self.current is not None:
            self._record_current(now, finished=False, abandoned=True)
        skipped = self.total - self.next_index
        for spec in self.specs[self.next_index :]:
            self._record(spec, now, num_agents=None, finished=False, skipped=True)
        self.next_index = self.total
        suffix = f"; {skipped} episodes not played count as unfinished" if skipped else ""
        self.finish(State.SUCCESS, cause + suffix, now)

    def _count_timeout(self, now: float) -> None:
        self.successive_timeouts += 1
        if self.successive_timeouts >= self.budgets.max_successive_timeouts:
            self._end_early(f"{self.successive_timeouts} successive timeouts", now)
        else:
            self._set_wait(Wait.AFTER_TIMEOUT, now)

    # -- bookkeeping --------------------------------------------------------------------------

    def _heard(self, now: float) -> None:
        if self.started_at is None:
            self.started_at = now

    def _set_wait(self, wait: Wait, since: float) -> None:
        self.wait = wait
        self.wait_started = since

    def _record_current(
        self, now: float, *, finished: bool, timeout: str | None = None, abandoned: bool = False
    ) -> None:
        episode = self.current
        assert episode is not None
        self.current = None
        self._record(episode.spec, now, episode=episode, finished=finished, timeout=timeout, abandoned=abandoned)
        episode.close()
        if finished or abandoned:
            self._set_wait(Wait.NEXT_EPISODE, now)

    def _record(
        self,
        spec: Any,
        now: float,
        *,
        episode: FlatlandEpisode | None = None,
        num_agents: int | None = None,
        finished: bool,
        timeout: str | None = None,
        abandoned: bool = False,
        skipped: bool = False,
    ) -> None:
        if episode is not None:
            num_agents = episode.num_agents
            max_steps, steps, reward, arrived = (
                episode.max_episode_steps,
                episode.steps,
                episode.reward,
                episode.arrived(),
            )
        else:
            max_steps, steps, reward, arrived = None, 0, 0.0, 0
        normalized = self.rule.normalized_return(
            reward=reward, max_episode_steps=max_steps or 1, num_agents=num_agents or 1, finished=finished
        )
        arrived_fraction = (
            self.rule.arrived_fraction(arrived=arrived, num_agents=num_agents, finished=finished) if num_agents else 0.0
        )
        record = {
            "index": spec.index,
            "env": spec.env,
            "test": spec.test,
            "level": spec.level,
            "num_agents": num_agents,
            "max_episode_steps": max_steps,
            "steps": steps,
            "reward": reward,
            "normalized_return": normalized,
            "arrived": arrived,
            "arrived_fraction": arrived_fraction,
            "timed_out": timeout is not None,
            "timeout": timeout,
            "abandoned": abandoned,
            "skipped": skipped,
            "invalid_actions": self._invalid_actions if episode is not None else 0,
            "malfunctions": episode.malfunctions if episode is not None else 0,
            "wall_s": (now - self._episode_started) if episode is not None else 0.0,
            "planning_s": self._planning_s if episode is not None else None,
            "step_think_s": _stats(self._episode_think) if episode is not None else None,
            "time_bank_used_s": self.bank.used_s if episode is not None else 0.0,
            "seed": self.adapter.seed,
            "debug": self.debug,
            "elapsed_s": self.elapsed_s(now),  # overall budget used when it ended (for --resume)
        }
        self.store.add_episode(record)  # durable before anything else happens
        self.records.append(record)
        if self.on_episode is not None:
            self.on_episode(record, self)

    # -- reports ----------------------------------------------------------------------------

    def scores(self) -> dict[str, Any] | None:
        """Only a completed evaluation has a score; a failed or interrupted one has none."""
        if self.state is not State.SUCCESS or not self.records:
            return None
        return self.rule.aggregate(self.records)

    def running_score(self) -> float | None:
        if not self.records:
            return None
        # Asked after every episode (progress line, events), between a step and the next reply:
        # the primary alone, never the full aggregate with its bootstrap.
        return self.rule.primary(self.records)

    def submit_payload(self) -> dict[str, Any]:
        """Flatland's four submit figures (for legacy clients), plus arbiter's full scores."""
        scores = self.scores()
        normalized = [r["normalized_return"] for r in self.records]
        return {
            "mean_reward": statistics.fmean(r["reward"] for r in self.records) if self.records else None,
            "mean_normalized_reward": statistics.fmean(normalized) if normalized else None,
            "sum_normalized_reward": math.fsum(normalized) if normalized else None,
            "mean_percentage_complete": (
                statistics.fmean(r["arrived_fraction"] for r in self.records) if self.records else None
            ),
            "score": scores["primary"] if scores else None,
            "score_secondary": scores["secondary"] if scores else None,
            EXTENSION_KEY: {"state": self.state.value, "debug": self.debug, "scores": scores},
        }

    def summary(self) -> dict[str, Any]:
        end = self.finished_at if self.finished_at is not None else self.clock()
        scores = self.scores()
        return {
            "state": self.state.value,
            "debug": self.debug,
            "competition": self.competition,
            "scoring": self.rule.name,
            "service_id": self.service_id,
            "score": {
                "primary": scores["primary"] if scores else None,
                "secondary": scores["secondary"] if scores else None,
                "primary_name": scores["primary_name"] if scores else None,
                "secondary_name": scores["secondary_name"] if scores else None,
                "per_test": scores["per_test"] if scores else None,
                "spread": scores["spread"] if scores else None,
            },
            "termination_cause": self.termination_cause,
            "episodes": {
                "total": self.total,
                "recorded": len(self.records),
                "finished": sum(1 for r in self.records if not (r["timed_out"] or r["abandoned"] or r["skipped"])),
                "timed_out": sum(1 for r in self.records if r["timed_out"]),
                "abandoned": sum(1 for r in self.records if r["abandoned"]),
                "skipped": sum(1 for r in self.records if r["skipped"]),
            },
            "budgets": self.budgets.as_dict(),
            "counters": dict(self.counters),
            "timing": {
                "evaluation_s": self.elapsed_s(end),
                "step_think_s": _stats(self.think_s),
                "server_step_s": _stats(self.server_step_s),
                "time_bank_used_s": _stats([r.get("time_bank_used_s", 0.0) for r in self.records if not r["skipped"]]),
            },
            "seed": self.adapter.seed,
            "tests": self.adapter.tests_dir,
            "client_version": self.client_version,
            "started_at": self.started_wall,
            "versions": _versions(),
        }
