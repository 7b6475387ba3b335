"""The deadlines an evaluation keeps, how its windows run out, how an item is cut short (a
takeover) and how the evaluation ends: the Evaluation's part that decides endings
(server/evaluation.py has the requests). Mixed into ``Evaluation``: it works on the same state,
and is apart only so that each part can be read on its own."""

from __future__ import annotations

import enum
import logging
from typing import Any

from arbiter.protocol.errors import EvaluationError
from arbiter.protocol.messages import FLATLAND_RL
from arbiter.server.cli.progress import count_items
from arbiter.server.core.budgets import Deadline, Wait, budget_for, silence_before_takeover_s

log = logging.getLogger("arbiter.server.core.evaluation")


class State(enum.StrEnum):
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    INTERRUPTED = "INTERRUPTED"


class Endings:
    def deadline(self) -> Deadline:
        at = self.wait_started + budget_for(self.wait, self.item_budgets, self.bank.left_s)
        if self.stage_at is not None and self.wait in (Wait.PLANNING, Wait.STEP) and self.stage_at <= at:
            at = self.stage_at
            stage = True
        else:
            stage = False
        if self.started_at is not None:
            overall_at = self.started_at + self.budgets.overall_s - self.used_before_s
            if overall_at <= at:
                return Deadline(self.wait, overall_at, overall=True)
        return Deadline(self.wait, at, stage=stage)

    def elapsed_s(self, now: float) -> float:
        """Overall budget used so far, across restarts (downtime between runs is not counted)."""
        return self.used_before_s + (now - self.started_at if self.started_at is not None else 0.0)

    def time_left_s(self, now: float) -> float:
        return max(0.0, self.budgets.overall_s - self.elapsed_s(now))

    def add_downtime(self, downtime_s: float) -> None:
        """Move every running budget by an outage of the evaluator's infrastructure."""
        self.wait_started += downtime_s
        if self.started_at is not None:
            self.started_at += downtime_s
        self.counters["downtime_ms"] += round(downtime_s * 1000)

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
            budget = self.item_budgets.planning_s if wait is Wait.PLANNING else self.item_budgets.step_s
            if deadline.stage:
                kind, budget = "stage", self.current.stage_budget_s if self.current is not None else 0.0
            self.bank.spend_all()
            self._record_current(now, finished=False, timeout=kind)
            self.counters[f"{kind}_timeouts"] += 1
            error_type = FLATLAND_RL.ENV_RESET_TIMEOUT if wait is Wait.PLANNING else FLATLAND_RL.ENV_STEP_TIMEOUT
            bank = f" and a time bank of {self.bank.size_s:g} s" if self.bank.size_s else ""
            log.warning("item %d timed out (%s budget of %g s%s)", self.records[-1]["index"], kind, budget, bank)
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
                f"all {self.items_said(self.total)} evaluated; "
                f"no ENV_SUBMIT within the idle budget of {self.budgets.idle_s:g} s",
                now,
            )
        return []

    def items_said(self, count: int) -> str:
        """``count`` items in the format's words ("3 episodes", "1 dataset")."""
        return count_items(count, self.format_name)

    def check_overall(self, now: float) -> None:
        if self.started_at is not None and self.elapsed_s(now) >= self.budgets.overall_s:
            self._fail_overall(now)
            raise EvaluationError(self.termination_cause)

    # -- endings ----------------------------------------------------------------------------

    def agent_exited(self, status: int | None, now: float) -> None:
        if self.finished:
            return
        if self.wait is Wait.SUBMIT:
            self.finish(
                State.SUCCESS, f"all {self.items_said(self.total)} evaluated; the agent exited without ENV_SUBMIT", now
            )
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
        if self.current is not None:
            self.current.close()
            self.current = None
        log.info("evaluation %s: %s", state.value, cause)
        if self.on_finish is not None:
            self.on_finish(self)  # before the summary is written, so what the hook counts is in it
        try:
            self.store.write_summary(self.summary())
        except EvaluationError as exc:  # the results folder cannot be written (results.ResultsUnwritable)
            if self.state is State.SUCCESS:
                # A score that cannot be written is not one: --resume writes it once it can.
                self.termination_cause = f"{exc} (the evaluation had ended: {self.termination_cause})"
                self.state = State.INTERRUPTED
            log.error(
                "%s not written (%s); the evaluation ended %s: %s",
                self.store.summary_path,
                exc.__cause__ or exc,
                self.state.value,
                self.termination_cause,
            )

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
        for item in self.items[self.next_index :]:
            self._write(item, self.plan.unplayed(item), now, played=False)
        self.next_index = self.total
        suffix = f"; {self.items_said(skipped)} not played count as unfinished" if skipped else ""
        self.finish(State.SUCCESS, cause + suffix, now)

    def _count_timeout(self, now: float) -> None:
        self.successive_timeouts += 1
        if self.successive_timeouts >= self.budgets.max_successive_timeouts:
            self._end_early(f"{self.successive_timeouts} successive timeouts", now)
        else:
            self._set_wait(Wait.AFTER_TIMEOUT, now)

    # -- an item cut short by the infrastructure or by a new client --------------------------

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
