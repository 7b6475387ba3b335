"""Who plays an evaluation, and what a change of agent costs: an agent that lived through the
evaluator's restart, a new agent after a restart, a restarted agent taking over a live
evaluation, and a client made for another format. The Evaluation's third part
(``evaluation.restarts``; like its endings it works on the evaluation's state, and is apart so
that each part can be read on its own).

What an item depends on decides what a change costs (``Item.group``, core/resume.py):

- After ``--resume`` (the evaluator was killed: nothing the agent did) nothing is held against
  the agent, and no score mixes the agent that built a group's state with one that did not:
  - a new agent (another session, or a handshake: it starts from nothing) takes the evaluation
    back to the first item of the group in progress: the group's records are withdrawn from the
    results (kept in ``replayed.jsonl``, and the summary's ``replayed`` says so), the overall
    time they took is given back, and the group is played again;
  - the agent that lived on goes on where it is when it is between items. When it was inside an
    item (its next request is a step, or a reset within the item), that item went with the
    killed evaluator: the agent is told (``RESTARTED``, naming the item the evaluation goes on
    at) and the item is played again from its start, with its whole group when it has one (the
    agent's state moved on inside it). arbiter's runners rebuild their agent there; any other
    agent stops with that message and is restarted.
- In a live evaluation a restarted agent that takes over (core/gate.py) left its item timed
  out. The rest of that item's group could only be played by an agent without the state it
  depends on, and playing the group again would reward the crash with a second try: the rest of
  the group is recorded as not played, and the new agent goes on with the next group.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NoReturn

from arbiter.protocol.errors import EvaluatorRestarted, WrongFormat
from arbiter.protocol.messages import FLATLAND_RL
from arbiter.server.core.endings import State
from arbiter.server.core.resume import group_bounds
from arbiter.server.core.words import quoted_from_agent
from arbiter.server.formats import get_format

if TYPE_CHECKING:
    from arbiter.server.core.evaluation import Evaluation

log = logging.getLogger("arbiter.server.core.evaluation")

RESTART_HINT = "arbiter's runners rebuild the agent there by themselves; any other agent must be restarted"


class Restarts:
    """Who plays the evaluation and what a change of agent costs (see the module's docstring).
    Like the endings, it works on its evaluation's state and owns none of its own."""

    def __init__(self, evaluation: Evaluation) -> None:
        self.evaluation = evaluation

    def client_bound(
        self, session: str | None, now: float, *, handshake_type: str | None, took_over: bool, legacy: bool
    ) -> None:
        """A client was bound to the evaluation by the request being handled (core/gate.py)."""
        evaluation = self.evaluation
        evaluation.client_session = session
        if legacy and evaluation.server_side:
            self.refuse_wrong_client("flatland-rl's FlatlandRemoteClient, a Flatland client", now)
        if evaluation.restarted:
            starts_afresh = handshake_type == FLATLAND_RL.PING or (
                evaluation.previous_client is not None and session != evaluation.previous_client
            )
            if starts_afresh:
                evaluation.restarted = False
                self._back_to_group_start("a new agent after the evaluator restarted", now)
            return
        if took_over:
            self._skip_rest_of_group(now)

    def client_formats_check(self, ext: dict[str, Any], now: float) -> None:
        """A PING may say which formats its client plays (``formats``: a list of names, or
        ``"server-side"`` for any format whose env is the server's) and what it is (``client``);
        a client of another format ends the evaluation at once, with both named."""
        evaluation = self.evaluation
        formats = ext.get("formats")
        # Only a str is compared: an array from the wire would compare element by element.
        if isinstance(formats, str) and formats == "server-side":
            plays = evaluation.server_side
        elif isinstance(formats, list) and formats and all(isinstance(f, str) for f in formats):
            plays = evaluation.format_name in formats
        else:
            return  # says nothing (an older client): RemoteEnv and the runners check the PONG too
        if not plays:
            name = quoted_from_agent(ext.get("client") or "the client", limit=60)
            played = (
                "any format whose env is the evaluator's"
                if formats == "server-side"
                else quoted_from_agent(", ".join(formats), limit=120)
            )
            self.refuse_wrong_client(f"{name}, a client for {played}", now)

    def refuse_wrong_client(self, client: str, now: float) -> NoReturn:
        evaluation = self.evaluation
        clients = get_format(evaluation.format_name).clients
        cause = f"wrong client: {client} connected to a {evaluation.format_name} evaluation" + (
            f" (its agents run with {clients})" if clients else ""
        )
        evaluation.endings.finish(State.FAILED, cause, now)
        raise WrongFormat(cause)

    def restart_lost(self, now: float) -> NoReturn:
        """The agent that lived through a restart was inside the next item: it is played again
        from its start, with its group (see the module docstring)."""
        evaluation = self.evaluation
        lost = evaluation.next_index
        start = group_bounds(evaluation.items, lost)[0] if lost < evaluation.total else lost
        evaluation.restarted = False
        evaluation.counters["restarted_items"] += 1
        if start < lost:
            self._withdraw_from(start, f"the evaluator restarted while the agent played item {lost} of the group", now)
        state = " and the agent state its group built" if start < lost else ""
        raise EvaluatorRestarted(
            f"the evaluator was restarted while this agent was playing item {lost}, which cannot go on (its env"
            f"{state} went with the evaluator); the evaluation goes on at item {start}, from its start: {RESTART_HINT}",
            resume_item=start,
        )

    def _back_to_group_start(self, cause: str, now: float) -> None:
        evaluation = self.evaluation
        index = evaluation.next_index
        if 0 < index < evaluation.total:
            start = group_bounds(evaluation.items, index)[0]
            if start < index:
                self._withdraw_from(start, cause, now)

    def _withdraw_from(self, start: int, cause: str, now: float) -> None:
        """Take items ``start`` on out of the results and play them again from ``start``."""
        evaluation = self.evaluation
        evaluation.recording.announce()  # the withdrawn items' notices come before the withdrawal's
        withdrawn = evaluation.store.withdraw_from(start)
        indices = sorted({r["index"] for r in evaluation.records if r["index"] >= start})
        evaluation.records = [r for r in evaluation.records if r["index"] < start]
        evaluation.running_score_cache = (-1, None)  # dated by a record count, which may come back
        evaluation.next_index = start
        # The overall time the withdrawn items took is given back; so is their timeouts' streak.
        evaluation.used_before_s = float(evaluation.records[-1].get("elapsed_s") or 0.0) if evaluation.records else 0.0
        evaluation.successive_timeouts = 0
        for record in reversed(evaluation.records):
            if not record["timed_out"]:
                break
            evaluation.successive_timeouts += 1
        replayed = {"items": indices, "group": evaluation.items[start].group, "records": len(withdrawn), "cause": cause}
        evaluation.replayed.append(replayed)
        evaluation.counters["replayed_items"] += len(indices)
        log.warning("items %s are played again from item %d: %s", indices, start, cause)
        if evaluation.on_replay is not None:
            evaluation.on_replay(replayed)

    def _skip_rest_of_group(self, now: float) -> None:
        evaluation = self.evaluation
        index = evaluation.next_index
        if not 0 < index < evaluation.total:
            return
        start, end = group_bounds(evaluation.items, index)
        if start == index:
            return  # the group had not begun
        for item in evaluation.items[index:end]:
            evaluation.recording.write_item(item, evaluation.plan.unplayed(item), now, played=False)
        evaluation.next_index = end
        evaluation.counters["items_not_played_after_takeover"] += end - index
        log.warning("items %d-%d depend on the state of the agent that was replaced: not played", index, end - 1)
