"""One evaluation as a state machine: a format's plan, budgets and scores, with no I/O of its own.

The service loop (service.py) feeds it requests and expired deadlines; it answers with reply
payloads and out-of-band errors, and writes each finished item's records to the results store
before anything else happens. It knows no format: it plays the plan's items (formats/base.py),
each an episode or a stage of episodes. Its rules, in brief (an "episode" is one item):

- items are handed out in order; each ENV_CREATE starts the next one (an unfinished episode
  is abandoned and scores as unfinished), except within an item that spans resets (a training
  run), where it starts the item's next episode unless the client names a later item;
- a stage budget, where an item has one, bounds the whole item like a step budget bounds a step;
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
import logging
import time
from array import array
from collections import Counter
from collections.abc import Callable
from typing import Any

from arbiter.protocol.errors import ArbiterError, OutOfOrder, TimeoutException
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL, PROTOCOL_VERSION, extension, reply
from arbiter.server.core import summary as evaluation_summary
from arbiter.server.core.budgets import BudgetPolicy, TimeBank, Wait
from arbiter.server.core.endings import Endings, State
from arbiter.server.core.opening import ItemOpener
from arbiter.server.core.recording import Recording
from arbiter.server.core.restarts import Restarts
from arbiter.server.core.scoring import ScoringRule
from arbiter.server.formats.base import Item, OpenItem, Plan
from arbiter.server.service.results import ResultsStore

log = logging.getLogger(__name__)


class Evaluation:
    def __init__(
        self,
        plan: Plan,
        rule: ScoringRule,
        budgets: BudgetPolicy,
        store: ResultsStore,
        *,
        competition: str,
        service_id: str,
        format_name: str = "flatland",
        options: dict[str, Any] | None = None,
        debug: bool = False,
        clock: Callable[[], float] = time.monotonic,
        on_episode: Callable[[dict[str, Any], Evaluation], None] | None = None,
        on_finish: Callable[[Evaluation], None] | None = None,
        on_replay: Callable[[dict[str, Any]], None] | None = None,
    ):
        self.plan = plan
        self.items: list[Item] = plan.items
        self.format_name = format_name
        self.options = options  # the format's competition keys, for the summary
        # Server-side formats answer every step with the observation; Flatland's client mirrors
        # its env and answers itself, so its steps are answered only when asked (the legacy wire).
        self.server_side: bool = plan.server_side
        self.rule = rule
        self.budgets = budgets
        self.store = store
        self.competition = competition
        self.service_id = service_id
        self.debug = debug
        self.submission: dict[str, Any] | None = None  # summary.json's submission: who it is for, if named
        self.clock = clock
        self.on_episode = on_episode
        self.on_finish = on_finish
        self.on_replay = on_replay  # items withdrawn to be played again (restarts.py): their ``replayed`` entry

        self.state = State.RUNNING
        self.termination_cause = ""
        self.records: list[dict[str, Any]] = []
        self.running_score_cache: tuple[int, float | None] = (0, None)  # (records it was computed from, score)
        self.current: OpenItem | None = None
        self.item_budgets = budgets  # the running item's budgets (an item may have its own)
        self.stage_at: float | None = None  # the running item's stage deadline, if it has one
        self.next_index = 0
        self.wait = Wait.CLIENT
        self.wait_started = clock()
        self.created_at = clock()
        # The overall budget starts at the first ENV_CREATE (flatland's evaluator starts its clock
        # there): an agent may handshake, then load its model, within the idle budget. A resumed
        # evaluation was already under way: its clock goes on at its first request.
        self.started_at: float | None = None
        self.heard_at: float | None = None  # the first request of any kind
        self.used_before_s = 0.0  # overall time used by earlier runs of a resumed evaluation
        self.finished_at: float | None = None
        self.started_wall = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self.successive_timeouts = 0
        self.counters: Counter[str] = Counter()
        self.client_version: str | None = None
        self.tests_digest: str | None = None  # what the test folder holds (folder_digest.py), for the summary
        self.client_session: str | None = None  # the bound client's; every record names who played it
        self.previous_client: str | None = None  # who played the last item before a restart
        # Resumed, with the env on the server: the client may be inside an item this evaluator
        # never opened (evaluation_restarts.py), until the first item is opened.
        self.restarted = False
        self.replayed: list[dict[str, Any]] = []  # items withdrawn and played again, for the summary
        self.submitted = False  # ENV_SUBMIT came: the evaluation ends with it
        self.stop_cause: str | None = None  # the plan's rule stopped handing out items (stop_before)
        # Per-step timings (seconds), kept compact: an 8-hour evaluation makes millions of steps.
        self.think_s = array("d")  # client time between our readiness and its next step
        self.server_step_s = array("d")  # our time to apply one step
        self._episode_think = array("d")
        self._episode_started = 0.0
        self._planning_s: float | None = None
        self._invalid_actions = 0
        self.bank = TimeBank(budgets.time_bank_s)
        self.opener = ItemOpener(plan)  # the next item, opened while the agent thinks (opening.py)
        # Its parts, each read on its own: how it ends (deadlines, timeouts, the final state), who
        # plays it (restarts, takeovers, a client of another format), and how each ended item is
        # written and announced.
        self.endings = Endings(self)
        self.restarts = Restarts(self)
        self.recording = Recording(self)

    # -- what the service loop asks -------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.state is not State.RUNNING

    @property
    def total(self) -> int:
        return len(self.items)

    def elapsed_s(self, now: float) -> float:
        """Overall budget used so far, across restarts (downtime between runs is not counted)."""
        return self.used_before_s + (now - self.started_at if self.started_at is not None else 0.0)

    def time_left_s(self, now: float) -> float:
        return max(0.0, self.budgets.overall_s - self.elapsed_s(now))

    # -- requests ---------------------------------------------------------------------------

    def on_ping(self, payload: dict[str, Any], now: float) -> dict[str, Any]:
        self._heard(now)
        self.restarts.client_formats_check(extension(payload), now)
        version = payload.get("version") if isinstance(payload, dict) else None
        self.client_version = str(version)[:64] if version is not None else None
        body = {
            "protocol": PROTOCOL_VERSION,
            "budgets": self.budgets.as_dict(),
            "episodes": self.total,
            "scoring": self.rule.name,
            "debug": self.debug,
            **self.plan.handshake(),
        }
        if self.server_side:
            body["format"] = self.format_name
            body["next"] = self.next_index  # where a restarted client picks the plan up
        return reply(FLATLAND_RL.PONG, {EXTENSION_KEY: body})

    def on_create(self, payload: dict[str, Any], now: float) -> dict[str, Any]:
        self._heard(now)
        if self.started_at is None:
            self.started_at = now  # the first ENV_CREATE: the overall budget starts
        current = self.current
        ext = extension(payload) if self.server_side else {}
        wanted = ext.get("item")
        if self.restarted and current is None:
            # The first reset after a restart: from inside an item (a reset within it, or one for
            # an item after it) it cannot go on; from between items it goes on where it is.
            if ext.get("within") is True or (type(wanted) is int and wanted > self.next_index):
                self.restarts.restart_lost(now)
            self.restarted = False
        if current is not None:
            if current.spans_resets:
                if wanted is None or (type(wanted) is int and wanted == current.item.index):
                    return self._next_reset(current, now)
                if not (type(wanted) is int and current.item.index < wanted < self.total):
                    raise OutOfOrder(
                        f"ENV_CREATE names item {str(wanted)[:40]!r} during item {current.item.index}'s stage: "
                        f"name it (its next episode) or a later item, below {self.total}; nothing was applied"
                    )
            self.counters["abandoned_episodes"] += 1
            self.recording.record_current(now, finished=False, abandoned=True)
        elif type(wanted) is int and wanted < self.next_index and self.records and self.records[-1]["index"] == wanted:
            # A reset for the stage that just ended, sent before the client heard: its stage is
            # over (timed out, or ended by the evaluator) and the next item is not handed out for it.
            if self.records[-1]["timed_out"] or self.records[-1].get("timeout"):
                raise TimeoutException(f"item {wanted} timed out; call env_create() for the next item")
            raise OutOfOrder(f"item {wanted} is over; call env_create() for the next item")
        if self.next_index < self.total and self.stop_cause is None:
            cause = self.plan.stop_before(self.items[self.next_index], self.records)
            if cause is not None:
                self._stop_by_rule(cause, now)
        if self.next_index >= self.total:
            self.set_wait(Wait.SUBMIT, now)
            done: dict[str, Any] = {"observation": False, "info": False, "random_seed": False, "env_file_path": False}
            if self.server_side:
                done[EXTENSION_KEY] = {"finished": True}
            return reply(FLATLAND_RL.ENV_CREATE_RESPONSE, done)
        item = self.items[self.next_index]
        self.current = self.opener.open(self.next_index)
        self.next_index += 1
        body = self._with_item(self.current.create_payload(), item)
        self._episode_think = array("d")
        self._planning_s = None
        self._invalid_actions = 0
        self.item_budgets = item.budgets or self.budgets
        self.bank = TimeBank(self.item_budgets.time_bank_s)
        # Loading the env is our time, not the participant's: planning starts when it is ready.
        ready = self.clock()
        self._episode_started = ready
        stage_budget = self.current.stage_budget_s
        self.stage_at = ready + stage_budget if stage_budget is not None else None
        self.set_wait(Wait.PLANNING, ready)
        return reply(FLATLAND_RL.ENV_CREATE_RESPONSE, body)

    def _stop_by_rule(self, cause: str, now: float) -> None:
        """The plan's rule stops the evaluation before its next item (Flatland's flatland3 after a
        Test played too poorly): the items left are written as not played, and the evaluation
        waits for ENV_SUBMIT as after its last item, its score counting only what was played."""
        skipped = self.total - self.next_index
        self.opener.discard()
        for item in self.items[self.next_index :]:
            self.recording.write_item(item, self.plan.unplayed(item), now, played=False)
        self.next_index = self.total
        self.stop_cause = f"{cause}; {self.endings.items_said(skipped)} not played"
        log.info("the evaluation stops: %s", self.stop_cause)

    def _next_reset(self, current: OpenItem, now: float) -> dict[str, Any]:
        """The next episode of an item that spans resets: the reset is one of the item's steps,
        under the step budget (the planning budget was the item's first window)."""
        if self.wait is Wait.STEP:
            self._draw_bank(now - self.wait_started - self.item_budgets.step_s)
        body = self._with_item(current.next_reset(), current.item)
        self.set_wait(Wait.STEP, self.clock())
        return reply(FLATLAND_RL.ENV_CREATE_RESPONSE, body)

    def _with_item(self, body: dict[str, Any], item: Item) -> dict[str, Any]:
        """Server-side formats: the create reply names the item it opened, so a client that
        follows the plan (RemoteEnv's stages) knows where the evaluation stands."""
        if self.server_side:
            body.setdefault(EXTENSION_KEY, {})["item"] = item.index
        return body

    def on_step(self, payload: dict[str, Any], now: float) -> dict[str, Any] | None:
        self._heard(now)
        # ``is True``, not bool(): the truth of an array from the wire raises.
        wants_reply = self.server_side or extension(payload).get("reply") is True
        episode = self.current
        if episode is None:
            if self.restarted:  # a step of the item the killed evaluator was running
                self.restarts.restart_lost(now)
            if self.wait is Wait.AFTER_TIMEOUT or (self.records and self.records[-1]["timed_out"]):
                # A step of the episode that already timed out: late, ignored, never applied.
                self.counters["late_steps"] += 1
                if wants_reply:
                    raise TimeoutException("the episode timed out; call env_create() (RemoteEnv: reset()) for the next")
                return None
            ended = f"; item {self.records[-1]['index']} ended ({self.records[-1]['ended']})" if self.records else ""
            raise OutOfOrder(f"ENV_STEP without a running episode{ended}: call env_create() first (RemoteEnv: reset())")
        action = payload.get("action") if isinstance(payload, dict) else None
        actions, invalid = episode.sanitize(action)  # a refused action raises: nothing is applied
        think = now - self.wait_started
        if self.wait is Wait.PLANNING:
            self._planning_s = think
            over_budget_s = think - self.item_budgets.planning_s
        else:
            self._episode_think.append(think)
            self.think_s.append(think)
            over_budget_s = think - self.item_budgets.step_s
        self._draw_bank(over_budget_s)
        if invalid:
            self._invalid_actions += invalid
            self.counters["invalid_actions"] += invalid
        started = self.clock()
        done = episode.step(actions)
        finished_step = self.clock()
        self.server_step_s.append(finished_step - started)
        # Built before the item is recorded and closed: the reply reads the step's results.
        body = reply(FLATLAND_RL.ENV_STEP_RESPONSE, episode.step_reply(invalid)) if wants_reply else None
        if done:
            self.successive_timeouts = 0
            # The item's records are written and on their way to the disk while its notices go
            # out and the next item opens; the reply, which lets the agent go on, waits for them
            # to be durable.
            recording = self.recording
            recording.record_current(finished_step, finished=True, sync_later=True)
            try:
                recording.announce()
                if body is not None and self.server_side and extension(payload).get("next") is True:
                    self._open_next_into(body, now)
            finally:
                recording.wait_durable()
        else:
            self.set_wait(Wait.STEP, finished_step)
        return body

    def _open_next_into(self, body: dict[str, Any], now: float) -> None:
        """The step that ended its item asked for the next one (``{"arbiter": {"next": true}}``): its
        reply carries, as ``arbiter.next``, what an ENV_CREATE would now get, the item opened as that
        opens it. None when the evaluation is over or opening fails: the client's ENV_CREATE says why."""
        if self.finished:
            return
        try:
            created = self.on_create({}, now)
        except ArbiterError:
            return
        body["payload"].setdefault(EXTENSION_KEY, {})["next"] = created["payload"]

    def _draw_bank(self, over_budget_s: float) -> None:
        if over_budget_s > 0:
            self.bank.draw(over_budget_s)

    def on_submit(self, payload: dict[str, Any], now: float) -> dict[str, Any]:
        self._heard(now)
        self.submitted = True  # its reply says how the evaluation ended
        if self.next_index >= self.total and self.current is None:
            self.endings.finish(State.SUCCESS, self.endings.all_handed_out(), now)
        else:
            played = len({r["index"] for r in self.records}) + (self.current is not None)
            self.endings._end_early(f"ENV_SUBMIT after {played} of {self.endings.items_said(self.total)}", now)
        return reply(FLATLAND_RL.ENV_SUBMIT_RESPONSE, self.submit_payload())

    def preparation_pending(self) -> bool:
        return not self.finished and self.next_index < self.total and self.opener.pending(self.next_index)

    def prepare_ahead(self) -> None:
        """Open the next item now; the service loop calls this only when no deadline is near and
        nothing is queued, so the work never delays a budget decision."""
        if self.preparation_pending():
            self.opener.prepare(self.next_index)

    # -- bookkeeping --------------------------------------------------------------------------

    def _heard(self, now: float) -> None:
        if self.heard_at is None:
            self.heard_at = now
            if self.used_before_s > 0 or self.restarted:  # resumed: the clock was running
                self.started_at = now

    def set_wait(self, wait: Wait, since: float) -> None:
        self.wait = wait
        self.wait_started = since

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
        # the primary alone, once per item (records are only added, so their count dates it).
        if self.running_score_cache[0] != len(self.records):
            self.running_score_cache = (len(self.records), self.rule.primary(self.records))
        return self.running_score_cache[1]

    def submit_payload(self) -> dict[str, Any]:
        return evaluation_summary.submit_payload(self)

    def summary(self) -> dict[str, Any]:
        return evaluation_summary.summary(self)
