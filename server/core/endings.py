"""The deadlines an evaluation keeps, how its windows run out, how an item is cut short (a
takeover) and how the evaluation ends: the Evaluation's part that decides endings
(core/evaluation.py has the requests). A part of ``Evaluation`` (``evaluation.endings``): it works on
the evaluation's state, and is apart only so that each part can be read on its own."""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, Any

from arbiter.protocol.errors import EvaluationError
from arbiter.protocol.messages import FLATLAND_RL
from arbiter.server.core.budgets import Deadline, Wait, budget_for, silence_before_takeover_s
from arbiter.server.core.words import count_items

if TYPE_CHECKING:
    from arbiter.server.core.evaluation import Evaluation

log = logging.getLogger("arbiter.server.core.evaluation")


class State(enum.StrEnum):
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    INTERRUPTED = "INTERRUPTED"


class Endings:
    """The deadlines an evaluation keeps and how it ends. It works on its evaluation's state (the
    items, the running item, the budgets' clock) and owns none of its own: it is apart so that the
    requests (evaluation.py) and the endings can each be read on their own."""

    def __init__(self, evaluation: Evaluation) -> None:
        self.evaluation = evaluation

    def deadline(self) -> Deadline:
        evaluation = self.evaluation
        wait, stage_at = evaluation.wait, evaluation.stage_at
        at = evaluation.wait_started + budget_for(wait, evaluation.item_budgets, evaluation.bank.left_s)
        if stage_at is not None and wait in (Wait.PLANNING, Wait.STEP) and stage_at <= at:
            at = stage_at
            stage = True
        else:
            stage = False
        if evaluation.started_at is not None:
            overall_at = evaluation.started_at + evaluation.budgets.overall_s - evaluation.used_before_s
            if overall_at <= at:
                return Deadline(evaluation.wait, overall_at, overall=True)
        return Deadline(evaluation.wait, at, stage=stage)

    def add_downtime(self, downtime_s: float) -> None:
        """Move every running budget by an outage of the evaluator's infrastructure."""
        evaluation = self.evaluation
        evaluation.wait_started += downtime_s
        if evaluation.started_at is not None:
            evaluation.started_at += downtime_s
        evaluation.counters["downtime_ms"] += round(downtime_s * 1000)

    def expire(self, deadline: Deadline, now: float) -> list[dict[str, Any]]:
        """A deadline passed with no request; returns out-of-band errors for the client."""
        evaluation = self.evaluation
        if deadline.overall:
            self._fail_overall(now)
            return []
        wait = evaluation.wait
        if wait is Wait.CLIENT:
            heard = evaluation.heard_at is not None
            idle_s = evaluation.budgets.idle_s
            self.finish(
                State.FAILED,
                (
                    f"the client connected but asked for no episode within the idle budget of {idle_s:g} s"
                    if heard
                    else f"no client connected within the idle budget of {idle_s:g} s"
                ),
                now,
            )
            return []
        if wait in (Wait.PLANNING, Wait.STEP):
            kind = "planning" if wait is Wait.PLANNING else "step"
            budget = evaluation.item_budgets.planning_s if wait is Wait.PLANNING else evaluation.item_budgets.step_s
            if deadline.stage:
                stage_s = evaluation.current.stage_budget_s if evaluation.current is not None else None
                kind, budget = "stage", stage_s or 0.0
            evaluation.bank.spend_all()
            evaluation.recording.record_current(now, finished=False, timeout=kind)
            evaluation.counters[f"{kind}_timeouts"] += 1
            error_type = FLATLAND_RL.ENV_RESET_TIMEOUT if wait is Wait.PLANNING else FLATLAND_RL.ENV_STEP_TIMEOUT
            bank = f" and a time bank of {evaluation.bank.size_s:g} s" if evaluation.bank.size_s else ""
            log.warning("item %d timed out (%s budget of %g s%s)", evaluation.records[-1]["index"], kind, budget, bank)
            self._count_timeout(now)
            return [{"type": error_type}]
        if wait is Wait.AFTER_TIMEOUT:
            # The client did not come back for the next episode within a step budget.
            self._count_timeout(now)
            return []
        if wait is Wait.NEXT_EPISODE:
            self._end_early(
                f"the client asked for no new episode within the idle budget of {evaluation.budgets.idle_s:g} s", now
            )
            return []
        if wait is Wait.SUBMIT:
            self.finish(
                State.SUCCESS,
                f"{self.all_handed_out()}; no ENV_SUBMIT within the idle budget of {evaluation.budgets.idle_s:g} s",
                now,
            )
        return []

    def items_said(self, count: int) -> str:
        """``count`` items in the format's words ("3 episodes", "1 dataset")."""
        return count_items(count, self.evaluation.format_name, self.evaluation.plan.item_nouns)

    def all_handed_out(self) -> str:
        """Why no item is left: all were evaluated, or the rule stopped the evaluation before."""
        evaluation = self.evaluation
        every = "the" if evaluation.total == 1 else "all"  # "all 1 episode" reads as a slip
        return evaluation.stop_cause or f"{every} {self.items_said(evaluation.total)} evaluated"

    def check_overall(self, now: float) -> None:
        evaluation = self.evaluation
        if evaluation.started_at is not None and evaluation.elapsed_s(now) >= evaluation.budgets.overall_s:
            self._fail_overall(now)
            raise EvaluationError(evaluation.termination_cause)

    # -- endings ----------------------------------------------------------------------------

    def agent_exited(self, status: int | None, now: float, how: str | None = None, note: str | None = None) -> None:
        """``how``: how the agent ended, when its status does not say it (summary.py's words);
        ``note``: added at the cause's end (where the agent's output is: never the output itself)."""
        evaluation = self.evaluation
        if evaluation.finished:
            return
        after = f"; {note}" if note else ""
        if evaluation.wait is Wait.SUBMIT:
            evaluated = self.all_handed_out()
            self.finish(State.SUCCESS, f"{evaluated}; {how or 'the agent exited'} without ENV_SUBMIT{after}", now)
        else:
            cause = f"{how or f'the agent process exited with status {status}'} before submitting"
            self._end_early(cause, now, after)

    def nothing_left_to_play(self, now: float) -> None:
        """A resume found every item on record (its run was killed before its summary) and the
        agent is this process's to start (``arbiter run``), or none comes (``serve --no-agent``,
        as the Kubernetes backend starts it): no agent is started, as an agent would
        only be told there is nothing to play, which the loops some communities write do not
        expect (DIAMBRA's steps after its first reset); the evaluation ends as the uninterrupted
        one whose agent went quiet after its last item."""
        self.finish(
            State.SUCCESS,
            f"{self.all_handed_out()}; every item was on record when the evaluation resumed: "
            "nothing was left to play, so no agent was started",
            now,
        )

    def fail_for_misbehaviour(self, cause: str, now: float) -> None:
        """The agent attacked the evaluation (a flood): no score; finished episodes stay written."""
        if not self.evaluation.finished:
            self.finish(State.FAILED, cause, now)

    def interrupt(self, cause: str) -> None:
        evaluation = self.evaluation
        if not evaluation.finished:
            self.finish(State.INTERRUPTED, cause, evaluation.clock())

    def fail_internal(self, cause: str, now: float) -> None:
        """A fault of the evaluator itself (a bug, an unreadable test file): FAILED, with the cause."""
        if not self.evaluation.finished:
            self.finish(State.FAILED, f"internal error: {cause}", now)

    def finish(self, state: State, cause: str, now: float) -> None:
        evaluation = self.evaluation
        try:
            evaluation.store.write_due_rows()  # the last items' rows come before the end
        except EvaluationError as exc:  # results.csv refused them (results.ResultsUnwritable)
            # The items stand in episodes.jsonl, but a success without its table is not one yet
            # (--resume rebuilds the table); any other ending stands as decided.
            if state is State.SUCCESS:
                state, cause = State.INTERRUPTED, f"{exc} (the evaluation had ended: {cause})"
        evaluation.recording.announce()  # the last items' notices come before the end's
        evaluation.opener.discard()
        evaluation.state = state
        evaluation.termination_cause = cause
        evaluation.finished_at = now
        if evaluation.current is not None:
            evaluation.current.close()
            evaluation.current = None
        log.info("evaluation %s: %s", state.value, cause)
        if evaluation.on_finish is not None:
            evaluation.on_finish(evaluation)  # before the summary is written, so what the hook counts is in it
        try:
            evaluation.store.write_summary(evaluation.summary())
        except EvaluationError as exc:  # the results folder cannot be written (results.ResultsUnwritable)
            if evaluation.state is State.SUCCESS:
                # A score that cannot be written is not one: --resume writes it once it can.
                evaluation.termination_cause = f"{exc} (the evaluation had ended: {evaluation.termination_cause})"
                evaluation.state = State.INTERRUPTED
            log.error(
                "%s not written (%s); the evaluation ended %s: %s",
                evaluation.store.summary_path,
                exc.__cause__ or exc,
                evaluation.state.value,
                evaluation.termination_cause,
            )

    def _fail_overall(self, now: float) -> None:
        evaluation = self.evaluation
        elapsed = evaluation.elapsed_s(now)
        self.finish(
            State.FAILED,
            f"overall budget of {evaluation.budgets.overall_s:g} s exceeded after {elapsed:.1f} s; no score",
            now,
        )

    def _end_early(self, cause: str, now: float, after: str = "") -> None:
        """``after``: what the cause ends with, after what the ending leaves."""
        evaluation = self.evaluation
        if evaluation.current is None and not evaluation.records:
            self.finish(State.FAILED, f"{cause}; no episode was played{after}", now)
            return
        if evaluation.current is not None:
            evaluation.recording.record_current(now, finished=False, abandoned=True)
        skipped = evaluation.total - evaluation.next_index
        for item in evaluation.items[evaluation.next_index :]:
            evaluation.recording.write_item(item, evaluation.plan.unplayed(item), now, played=False)
        evaluation.next_index = evaluation.total
        verb = "counts" if skipped == 1 else "count"
        suffix = f"; {self.items_said(skipped)} not played {verb} {evaluation.plan.unplayed_count}" if skipped else ""
        self.finish(State.SUCCESS, cause + suffix + after, now)

    def _count_timeout(self, now: float) -> None:
        evaluation = self.evaluation
        evaluation.successive_timeouts += 1
        if evaluation.successive_timeouts >= evaluation.budgets.max_successive_timeouts:
            count = evaluation.successive_timeouts
            self._end_early(
                "1 timeout, the limit of successive timeouts" if count == 1 else f"{count} successive timeouts", now
            )
        else:
            evaluation.set_wait(Wait.AFTER_TIMEOUT, now)

    # -- an item cut short by the infrastructure or by a new client --------------------------

    def takeover_after_s(self) -> float:
        """How long the bound client must have been silent before another one may replace it."""
        evaluation = self.evaluation
        return silence_before_takeover_s(evaluation.wait, evaluation.budgets, evaluation.bank.left_s)

    def take_over(self, silent_s: float, now: float) -> None:
        """A new client replaced one silent for ``silent_s`` (over ``takeover_after_s``): the
        episode the silent one left running times out now, its deadline passed or all but. The
        timeout is not posted: the errors list belongs to the new client from here on."""
        evaluation = self.evaluation
        evaluation.counters["takeovers"] += 1
        log.warning("a new client took over from one silent for %.2f s", silent_s)
        if evaluation.current is not None and evaluation.wait in (Wait.PLANNING, Wait.STEP):
            self.expire(Deadline(evaluation.wait, now), now)
