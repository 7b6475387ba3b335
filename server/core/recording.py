"""How an evaluation's ended items are written and announced (a part of ``Evaluation``).

Every item that ends, however it ends, has its records made durable in the results store before
anything that follows; then come its rows in results.csv and its notices (``on_episode``: the
events, the progress line), in order, each notice showing the score with its item counted.

When the service loop runs the evaluation, the rows and notices wait for the turn's reply
(``notices_after_reply``), but for the item a step ended: its records are written and on their
way to the disk (``sync_later``) while its notices go out and the next item opens, and the reply
waits for the sync (``wait_durable``). results.csv is rebuilt from episodes.jsonl and the events
are informational, so nothing that matters leaves before the item is durable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from arbiter.protocol.errors import EvaluationError
from arbiter.server.core.budgets import Wait
from arbiter.server.core.summary import core_fields, merge_records, stats
from arbiter.server.formats.base import Item

if TYPE_CHECKING:
    from arbiter.server.core.evaluation import Evaluation


class Recording:
    def __init__(self, evaluation: Evaluation):
        self.evaluation = evaluation
        # Records whose notices (``on_episode``) and results.csv rows are due: the service loop gives
        # them once the turn's reply has gone (``notices_after_reply``); the next item's records, a
        # withdrawal and the end give those still due first: in order, each with its item's score.
        self.notices_after_reply = False
        self._unannounced: list[dict[str, Any]] = []
        self._syncing = 0  # records of the item whose sync is still to come (``write_item(sync_later=True)``)

    def record_current(
        self,
        now: float,
        *,
        finished: bool,
        timeout: str | None = None,
        abandoned: bool = False,
        sync_later: bool = False,
    ) -> None:
        evaluation = self.evaluation
        opened = evaluation.current
        assert opened is not None
        evaluation.current = None
        evaluation.stage_at = None
        try:
            records = opened.records(finished=finished, timeout=timeout, abandoned=abandoned)
        finally:
            opened.close()
        self.write_item(
            opened.item, records, now, played=True, timeout=timeout, abandoned=abandoned, sync_later=sync_later
        )
        if finished or abandoned:
            evaluation.set_wait(Wait.NEXT_EPISODE, now)

    def write_item(
        self,
        item: Item,
        format_records: list[dict[str, Any]],
        now: float,
        *,
        played: bool,
        timeout: str | None = None,
        abandoned: bool = False,
        sync_later: bool = False,
    ) -> None:
        """One item's records, durable before anything else happens; with ``sync_later``, written
        and durable once ``wait_durable`` returns, which comes before anything leaves but the
        item's notices (results.csv is rebuilt from episodes.jsonl, events are informational)."""
        evaluation = self.evaluation
        item_core, last_core = core_fields(
            timeout=timeout,
            abandoned=abandoned,
            played=played,
            debug=evaluation.debug,
            elapsed_s=evaluation.elapsed_s(now),
            invalid_actions=evaluation._invalid_actions,
            wall_s=now - evaluation._episode_started,
            planning_s=evaluation._planning_s,
            step_think_s=stats(evaluation._episode_think),
            time_bank_used_s=evaluation.bank.used_s,
            client=evaluation.client_session if played else None,
        )
        records = merge_records(item.index, item.unit, format_records, item_core, last_core)
        self.announce()
        evaluation.store.add_episodes(records, rows_later=self.notices_after_reply, sync_later=sync_later)
        self._syncing = len(records) if sync_later else 0
        # All of the item's records first, then one notice each: the score so far that every
        # notice shows is the item's, computed once (a training run may hold thousands of episodes).
        evaluation.records.extend(records)
        if evaluation.on_episode is not None:
            self._unannounced.extend(records)
            if not self.notices_after_reply:
                self.announce()

    def wait_durable(self) -> None:
        """The records ``write_item(sync_later=True)`` wrote, durable. If the disk refuses, the
        item leaves the evaluation as it left the files (ResultsUnwritable raised)."""
        syncing, self._syncing = self._syncing, 0
        try:
            self.evaluation.store.wait_durable()
        except EvaluationError:
            if syncing:
                del self.evaluation.records[-syncing:]
            raise

    def announce(self) -> None:
        """What waits for the reply: results.csv's rows of the items written since the last call
        (``ResultsStore.write_due_rows``), then their notices (``on_episode``, once per record)."""
        evaluation = self.evaluation
        evaluation.store.write_due_rows(replied=True)
        if not self._unannounced:  # most turns (this runs after every request): nothing to hand out
            return
        due, self._unannounced = self._unannounced, []
        for record in due:
            evaluation.on_episode(record, evaluation)  # type: ignore[misc]  # records are due only with on_episode
