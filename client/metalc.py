"""Play an unmodified MetaLC (WCCI 2022, round 1) agent against arbiter's MetaLC evaluator.

    python -m arbiter.client.metalc SUBMISSION_DIR [--agent-module agent]

As the challenge's ingestion program did:

- ``Agent`` comes from ``SUBMISSION_DIR/agent.py`` (``--agent-module`` names another module of
  the folder), with the folder as working directory and first on the import path;
- per fold, a fresh ``Agent(number_of_algorithms=n)`` and ``meta_train(dataset_meta_features,
  algorithms_meta_features, validation_learning_curves, test_learning_curves)``, the curves as
  objects with ``.timestamps`` and ``.scores`` (float64 numpy arrays; plain ``[0.0]`` lists for a
  curve whose file is missing) and the challenge's ``get_last_point_within_delta_t``;
- per dataset, ``reset(dataset_meta_features, algorithms_meta_features)`` then
  ``suggest(observation)`` (None first) until the dataset's time budget is spent. The observation
  is ``(A, C_A, score)`` with A the very object the agent passed.

Within a fold, every step asks for the next dataset (``{"arbiter": {"next": true}}``): the one
that ends a dataset brings the next one's ENV_CREATE reply, which spares a round trip per dataset.

Unlike it, each fold's agent lives in a process of its own (``arbiter.client.metalc_fold``), so
that no fold can remember another: a fold meta-trains on the other folds' test curves, which hold
the datasets later folds are scored on. Per fold, a fresh process (forked from this one on Linux,
which never imports the agent; elsewhere a fresh interpreter) imports the agent's module for the
first time, its working directory a fresh copy of the submission folder, with HOME and
TMPDIR (TMP, TEMP) folders of its own; at the fold's end that process and whatever it started in
its process group are killed and its folders removed (on SIGTERM or SIGHUP too; on Linux the
kernel kills it if this process is killed). Its environment loses arbiter's connection
variables. This process never imports the agent. It holds the evaluation's session (one client,
as the evaluator sees it) and hands it to the fold's process over a pipe for as long as that
process plays its datasets, each step sent from there on a connection of its own
(``arbiter.client.metalc_play``): a ``suggest`` costs one round trip to the evaluator, nothing
relayed. It takes the session back when a dataset ends without bringing the next one (the fold's
last, one that timed out) and asks for the next dataset itself, so a fold's meta-training data
reaches the runner first, never through an earlier fold's process. ``Runner.round_trips`` holds
what every request took, by kind.

Seeding: each fold's process is seeded as the challenge seeded its own at the start of the run
(development: Python's ``random`` with 208 before the agent's module is imported; final run r:
``random``, numpy and, if installed, torch with r + 1 after it is). The evaluator's handshake says
which. An agent that draws no random numbers, or draws them within one fold, plays as in the
challenge; one whose draws run on from one fold into the next does not (why:
docs/formats/metalc.md#folds-cannot-remember-each-other).

Actions travel as ``[str(A_star) or None, str(A), float(delta_t)]``: the challenge looked
algorithms up by ``str``, so this is its reading of any A the agent returns. An action the
evaluator refuses, or an error in the agent's code, stops the runner with an error, as it stopped
the challenge's ingestion. A dataset that runs out of time scores 0 and the next one goes on.
When the evaluator is restarted (``--resume``) while a fold is under way, the fold's process is
dropped and the fold is played again from its first dataset by a fresh agent, as the evaluator
asks. Exit status 0 once the evaluation is submitted, 1 after an error.
"""

from __future__ import annotations

import argparse
import logging
import signal
import statistics
import sys
import time
from typing import Any

from arbiter.client import metalc_process
from arbiter.client.fold_tenancy import FoldTenancy
from arbiter.client.metalc_play import SAMPLES_KEPT, STEP_KINDS, TIMED
from arbiter.client.metalc_process import FoldProcess, Submission, refusal
from arbiter.client.wire import Wire
from arbiter.protocol.errors import ArbiterError, EvaluationError, EvaluatorRestarted, TimeoutException
from arbiter.protocol.messages import FLATLAND_RL, PROTOCOL_VERSION, extension

log = logging.getLogger("arbiter.metalc")

CLIENT_NAME = "arbiter.client.metalc"


class Runner:
    """One evaluation: the handshake, then datasets until the evaluator has none left."""

    def __init__(self, wire: Any, submission: Submission):
        self.wire = wire
        self.submission = submission
        self.server_info = wire.handshake(
            f"arbiter-{PROTOCOL_VERSION}", asks={"client": CLIENT_NAME, "formats": ["metalc"]}
        )
        if self.server_info.get("format") != "metalc":
            raise ArbiterError("this evaluator is not running a MetaLC evaluation")
        self.runs = {run["run"]: run for run in self.server_info["runs"]}
        self.tenancy = FoldTenancy()  # in a container of the submission's own: a fold leaves nothing
        self.fold: FoldProcess | None = None
        self.fold_key: tuple[int, int] | None = None  # (run, fold) of the running fold's process
        self.datasets = 0
        self.timeouts = 0
        self.restarts = 0
        self.fold_start_s: list[float] = []  # per fold: its process started and the agent imported
        # What every request took, by kind: the folds' (metalc_play.TIMED) and the runner's own
        # ENV_CREATEs that opened a dataset ("fold_create" when it brought a fold's meta-training
        # data, else "create": after a dataset that timed out).
        self.round_trips: dict[str, dict[str, Any]] = {
            kind: {"count": 0, "total_s": 0.0, "samples": []} for kind in (*TIMED, "create", "fold_create")
        }

    def play(self) -> dict[str, Any]:
        """Every dataset the evaluator hands out, then ENV_SUBMIT; its reply."""
        try:
            while True:
                try:
                    return self._play_until_submitted()
                except EvaluatorRestarted as exc:  # the fold's agent is gone with what it learnt
                    self.restarts += 1
                    log.warning("%s", exc)
                    self._end_fold()
        finally:
            self._end_fold()

    def _play_until_submitted(self) -> dict[str, Any]:
        while True:
            body = self._create()
            if body is None:
                continue
            ext = extension(body)
            if ext.get("finished"):
                break
            self._begin(ext)
            self._play(body)
        self._end_fold()
        return self.wire.request(FLATLAND_RL.ENV_SUBMIT, {})["payload"]

    def _create(self) -> dict[str, Any] | None:
        """The next dataset's ENV_CREATE payload; None when the evaluator told of a timeout late
        (the next request goes on)."""
        before = time.perf_counter()
        try:
            body = self.wire.request(FLATLAND_RL.ENV_CREATE, {})["payload"]
        except TimeoutException as exc:
            log.warning("%s", exc)
            return None
        seconds = time.perf_counter() - before
        ext = extension(body)
        if not ext.get("finished"):
            kind = "fold_create" if "meta_train" in ext else "create"
            self._add_trips({kind: {"count": 1, "total_s": seconds, "samples": [seconds]}})
        return body

    def _begin(self, ext: dict[str, Any]) -> None:
        """The fold's process, started at the fold's first dataset (it meta-trains in its first play)."""
        run, fold = ext["run"], ext["fold"]
        if self.fold_key == (run, fold):
            return
        self._end_fold()
        if ext.get("meta_train") is None:
            raise ArbiterError(f"run {run}, fold {fold}: the evaluator sent no meta-training data for this fold")
        began = time.perf_counter()
        self.tenancy.fold_begins()
        self.fold = FoldProcess(self.submission, f"run {run}, fold {fold}")
        start = {
            "module": self.submission.module,
            "seeding": self.runs[run],
            "seed_before_import": bool(self.server_info.get("seed_before_import")),
            "algorithms": self.server_info["algorithms"],
            "algorithms_meta_features": self.server_info["algorithms_meta_features"],
        }
        self.fold.request(["start", start], "imported")
        self.fold_start_s.append(time.perf_counter() - began)
        self.fold_key = (run, fold)

    def _end_fold(self) -> None:
        if self.fold is not None:
            self.fold.close()
            self.tenancy.fold_ended()
        self.fold, self.fold_key = None, None

    def _play(self, body: dict[str, Any]) -> None:
        """The fold's process plays from this dataset on, on this runner's session, for as long
        as each ending step brings the fold's next dataset (``metalc_play``)."""
        fold = self.fold
        assert fold is not None
        kind, told = fold.request(
            ["play", {"session": self.wire.hand_over(), "body": body}], "played", "restarted", "refused"
        )
        self.wire.take_back(told["seq"])
        if kind == "restarted":  # the fold's agent is gone with what it learnt (see play)
            resume_item = told.get("resume_item")
            raise EvaluatorRestarted(told["message"], resume_item if type(resume_item) is int else None)
        if kind == "refused":
            raise refusal(told["kind"], told["message"])
        self.datasets += told["datasets"]
        self.timeouts += len(told["timeouts"])
        for line in told["timeouts"]:
            log.warning("%s", line)
        self._add_trips({kind: told["round_trips"][kind] for kind in TIMED})  # checked kinds only

    def _add_trips(self, table: dict[str, dict[str, Any]]) -> None:
        for kind, row in table.items():
            mine = self.round_trips[kind]
            mine["count"] += row["count"]
            mine["total_s"] += row["total_s"]
            mine["samples"] += row["samples"][: max(0, SAMPLES_KEPT - len(mine["samples"]))]


def run(submission_dir: str, *, agent_module: str = "agent", wire: Any = None) -> dict[str, Any]:
    """Play the whole evaluation; returns the evaluator's ENV_SUBMIT reply."""
    submission = Submission.checked(submission_dir, agent_module)
    own_wire = wire is None
    wire = wire or Wire()
    try:
        runner = Runner(wire, submission)
        scores = runner.play()
        log.info(
            "%d datasets played, %d timed out; %d evaluator restarts", runner.datasets, runner.timeouts, runner.restarts
        )
        steps = [runner.round_trips[kind] for kind in STEP_KINDS]
        count = sum(row["count"] for row in steps)
        if count:
            samples = [seconds for row in steps for seconds in row["samples"]]
            log.info("%d steps, round trip to the evaluator: mean %.0f µs, median %.0f µs", count,
                     sum(row["total_s"] for row in steps) / count * 1e6, statistics.median(samples) * 1e6)  # fmt: skip
        return scores
    finally:
        if own_wire:
            wire.close()


def _stop_on_signal(signum: int, frame: Any) -> None:
    metalc_process.stopping = True  # the fold's process is killed on the way out (Runner.play)
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    # A stop signal (``arbiter run`` ends its agent with SIGTERM, Ctrl-C with SIGINT) unwinds like
    # an error would.
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _stop_on_signal)
    parser = argparse.ArgumentParser(prog="python -m arbiter.client.metalc", description=__doc__.split("\n\n")[0])
    parser.add_argument("submission_dir", help="folder holding agent.py (and the agent's files)")
    parser.add_argument("--agent-module", default="agent", help="module of the folder defining Agent (default: agent)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        scores = run(args.submission_dir, agent_module=args.agent_module)
    except EvaluationError as exc:
        if exc.ended == "SUCCESS":  # it ended by itself, scored (its agent's successive timeouts): done
            log.info("%s", exc)
            return 0
        log.error("%s: %s", type(exc).__name__, exc)
        return 1
    except ArbiterError as exc:  # a refusal, an unreachable evaluator, the agent's error: its message says it
        log.error("%s: %s", type(exc).__name__, exc)
        return 1
    log.info("submitted: score %s, secondary %s", scores.get("score"), scores.get("score_secondary"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
