"""A fold's datasets, played by the fold's own process on the runner's session (``arbiter.client.metalc``).

The runner hands its session over (``Wire.hand_over``) with each ``play`` message; the fold's
process opens a connection of its own and sends every step itself, so a ``suggest`` is one round
trip to the evaluator with nothing relayed on either side. Each step that ends a dataset asks for
the next one (``{"arbiter": {"next": true}}``), unless the evaluator said the dataset is its
fold's last (``last_of_fold``): the next fold's first dataset, with that fold's meta-training
data, goes to the runner alone, never through a process that held an earlier fold's agent.

A ``play`` ends, and the runner has its session back, when a dataset ends without bringing the
next one: the fold's last, one that timed out (it scores 0; the runner opens the next), or the
evaluation's last. The answer says how far the session's sequence numbers went, what timed out,
and what each request took (``RoundTrips``). An evaluator's refusal ends the ``play`` too, told
to the runner with its kind; an error of the agent's code is the fold's to report (``metalc_fold``).
"""

from __future__ import annotations

import time
from typing import Any

from arbiter.client.wire import Wire
from arbiter.protocol.errors import ArbiterError, EvaluatorRestarted, InvalidAction, TimeoutException
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL, extension

# The kinds of request a fold times (``RoundTrips``), in the order they are reported.
TIMED = (
    "step",  # a step that does not end its dataset (and is not a "first")
    "first",  # a dataset's first step when the last one's ending step brought it
    "closing",  # a step that ends a dataset and brings the fold's next one
    "last",  # a step that ends a dataset and brings nothing (the fold's last, or the evaluation's)
    "suggest",  # the agent's turn between two steps: the observation handed over, suggest, the action
)


STEP_KINDS = TIMED[:4]  # the kinds of step (the fifth is the agent's turn between two)
# Per kind, the first this many round trips travel one by one (the rest in the count and the
# total alone): a play's answer, and what the runner keeps, stay small whatever is played.
SAMPLES_KEPT = 2000


class RoundTrips:
    """What each request took, by kind: ``{kind: {"count", "total_s", "samples"}}`` (the runner
    adds up every play's and logs them; benchmarks read them)."""

    def __init__(self) -> None:
        self.table: dict[str, dict[str, Any]] = {kind: {"count": 0, "total_s": 0.0, "samples": []} for kind in TIMED}

    def add(self, kind: str, seconds: float) -> None:
        row = self.table[kind]
        row["count"] += 1
        row["total_s"] += seconds
        if len(row["samples"]) < SAMPLES_KEPT:
            row["samples"].append(seconds)


class Refused(Exception):
    """The evaluator's refusal of a request (an ``ArbiterError`` the wire raised), told apart from
    the errors of the agent's code, which pass through ``play`` as they are."""

    def __init__(self, error: ArbiterError):
        super().__init__(str(error))
        self.error = error


class FoldPlayer:
    """Plays the datasets the runner hands over with ``agent`` (``metalc_fold.Fold``)."""

    def __init__(self, agent: Any):
        self.agent = agent
        self.wire: Wire | None = None
        self.doing = "meta_train"  # what the agent's code was asked last: where an error of its happened
        self.meta_trained = False

    def play(self, order: dict[str, Any]) -> list[Any]:
        """``order``: the session (``Wire.hand_over``) and the dataset's ENV_CREATE payload. The
        answer to the runner: ``["played", {...}]``, ``["restarted", {...}]`` or ``["refused", {...}]``."""
        trips = RoundTrips()
        timeouts: list[str] = []
        body: dict[str, Any] | None = order["body"]
        datasets = 0
        if self.wire is None:
            self.wire = Wire.taking_over(order["session"])
        else:
            self.wire.take_back(order["session"]["seq"])
        wire = self.wire
        try:
            if not self.meta_trained:
                self.doing = "meta_train"
                self.agent.meta_train(extension(body)["meta_train"])
                self.meta_trained = True
            try:
                wire.connect()  # within the dataset's planning time, not its first step's round trip
            except ArbiterError as exc:
                raise Refused(exc) from None
            brought = False  # whether this dataset came with the last one's ending step
            while body is not None:
                ext = extension(body)
                try:
                    body = self._play_dataset(body, ext, brought, trips)
                except TimeoutException as exc:
                    timeouts.append(f"run {ext['run']}, dataset {ext['dataset']}: {exc} (it scores 0)")
                    body = None
                datasets += 1
                brought = body is not None
        except Refused as refused:
            error = refused.error
            if isinstance(error, EvaluatorRestarted):
                return ["restarted", {"seq": wire.seq, "message": str(error), "resume_item": error.resume_item}]
            return ["refused", {"seq": wire.seq, "kind": type(error).__name__, "message": str(error)}]
        return ["played", {"seq": wire.seq, "datasets": datasets, "timeouts": timeouts,
                           "round_trips": trips.table}]  # fmt: skip

    def _play_dataset(
        self, body: dict[str, Any], ext: dict[str, Any], brought: bool, trips: RoundTrips
    ) -> dict[str, Any] | None:
        """One dataset to its end; the next one's ENV_CREATE payload when the ending step brought it."""
        agent, request, clock = self.agent, self._request, time.perf_counter
        # An evaluator that does not say which dataset is its fold's last never brings the next.
        asks = {"reply": True, "next": ext.get("last_of_fold") is False}
        self.doing = "reset"
        answer = agent.reset(body["info"]["dataset_meta_features"])
        first = True
        while True:
            before = clock()
            step = request(FLATLAND_RL.ENV_STEP, {"action": answer[1:], EXTENSION_KEY: asks}, ext)["payload"]
            after = clock()
            if step["done"]:
                following = extension(step).get("next")
                if not isinstance(following, dict) or extension(following).get("finished"):
                    following = None  # the evaluation has no dataset left: the runner hears it again and submits
                trips.add("closing" if following is not None else "last", after - before)
                return following
            trips.add("first" if first and brought else "step", after - before)
            first = False
            _, reached, score = step["observation"]
            self.doing = "observe"
            answer = agent.observe(reached, score)
            trips.add("suggest", clock() - after)

    def _request(self, type_: str, payload: dict[str, Any], ext: dict[str, Any]) -> dict[str, Any]:
        assert self.wire is not None
        try:
            return self.wire.request(type_, payload)
        except TimeoutException:
            raise  # the dataset scores 0 (``play``)
        except InvalidAction as exc:
            raise Refused(InvalidAction(f"run {ext['run']}, dataset {ext['dataset']}: {exc}")) from None
        except ArbiterError as exc:
            raise Refused(exc) from None
