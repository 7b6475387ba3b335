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

Every step asks for the next dataset (``{"arbiter": {"next": true}}``): the one that ends a
dataset brings the next one's ENV_CREATE reply, which spares a round trip per dataset.

Unlike it, each fold's agent lives in a process of its own (``arbiter.client.metalc_fold``), so
that no fold can remember another: a fold meta-trains on the other folds' test curves, which hold
the datasets later folds are scored on. Per fold, a fresh interpreter imports the agent's module
for the first time, its working directory a fresh copy of the submission folder, with HOME and
TMPDIR (TMP, TEMP) folders of its own; at the fold's end that process and whatever it started in
its process group are killed and its folders removed (on SIGTERM or SIGHUP too; on Linux the
kernel kills it if this process is killed). Its environment loses arbiter's connection
variables. This process keeps the one connection to the evaluator and relays ``meta_train``,
``reset`` and ``suggest`` over a pipe; it never imports the agent.

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
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from arbiter.client import metalc_fold
from arbiter.client.metalc_fold import FROM_FOLD_LIMITS, FoldPipeClosed, read_frame, write_frame
from arbiter.client.wire import Wire
from arbiter.protocol.errors import ArbiterError, DecodeError, EvaluatorRestarted, InvalidAction, TimeoutException
from arbiter.protocol.messages import EXTENSION_KEY, FLATLAND_RL, PROTOCOL_VERSION, extension

log = logging.getLogger("arbiter.metalc")

CLIENT_NAME = "arbiter.client.metalc"
# The fold's interpreter. Its working folder is the agent's, which must not shadow arbiter's own
# modules: arbiter comes from where it is installed, and the agent's folder is put first on the
# path once arbiter is loaded (metalc_fold.import_agent_class). metalc_fold is loaded from its
# file, without the arbiter.client package, whose Redis client a fold has no use for (a third of
# the fold's start-up).
BOOT = (
    "import importlib.util, sys\n"
    "if not sys.flags.safe_path:\n"
    "    del sys.path[0]\n"
    "spec = importlib.util.spec_from_file_location('arbiter_metalc_fold', sys.argv[1])\n"
    "fold = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(fold)\n"
    "fold.main(sys.argv[2:])\n"
)
# The agent has no business with the evaluator: its process does not get the way to reach it.
CONNECTION_VARIABLES = ("ARBITER_REDIS_URL", "AICROWD_SUBMISSION_ID", "redis_ip")
STOP_GRACE_S = 2.0  # a fold's process ends on its own once its pipe closes; then it is killed


@dataclass(frozen=True)
class Submission:
    folder: str
    module: str = "agent"

    @classmethod
    def checked(cls, folder: str, module: str = "agent") -> Submission:
        folder = os.path.abspath(folder)
        if not os.path.isdir(folder):
            raise ArbiterError(f"no submission folder {folder}")
        if not os.path.isfile(os.path.join(folder, f"{module}.py")):
            raise ArbiterError(f"no {module}.py in {folder}")
        return cls(folder, module)


# A fold's folder is named after the runner that made it, so that the folders of a runner that
# was killed outright (its fold process dies with it; its folder stays) are found and removed.
FOLD_FOLDER_PREFIX = "arbiter-metalc-fold-"


def remove_abandoned_folds() -> None:
    """Remove the fold folders of runners that no longer run (this user's only)."""
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        pid_text = name[len(FOLD_FOLDER_PREFIX) :].split("-", 1)[0]
        if not name.startswith(FOLD_FOLDER_PREFIX) or not pid_text.isdigit():
            continue
        path = os.path.join(root, name)
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid_text), 0)  # raises when no such process runs
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


class FoldProcess:
    """One fold's agent process, in a fresh copy of the submission folder (see the module docstring)."""

    def __init__(self, submission: Submission, label: str):
        self.label = label
        self.process: subprocess.Popen[bytes] | None = None
        self.to_fold: int | None = None
        self.from_fold: int | None = None
        remove_abandoned_folds()
        self.root = tempfile.mkdtemp(prefix=f"{FOLD_FOLDER_PREFIX}{os.getpid()}-")
        try:
            workdir = os.path.join(self.root, "submission")
            shutil.copytree(submission.folder, workdir)
            env = self._environment()
            fold_reads, self.to_fold = os.pipe()
            self.from_fold, fold_writes = os.pipe()
            fold_argv = [metalc_fold.__file__, str(fold_reads), str(fold_writes), str(os.getpid())]
            try:
                self.process = subprocess.Popen(
                    [sys.executable, "-c", BOOT, *fold_argv],
                    cwd=workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    pass_fds=(fold_reads, fold_writes),
                    start_new_session=True,  # its own process group: killed whole at the fold's end
                )
            finally:
                os.close(fold_reads)
                os.close(fold_writes)
        except BaseException:
            self.close()
            raise

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in CONNECTION_VARIABLES}
        for name in ("home", "tmp"):
            os.mkdir(os.path.join(self.root, name))
        env["HOME"] = os.path.join(self.root, "home")
        for variable in ("TMPDIR", "TMP", "TEMP"):
            env[variable] = os.path.join(self.root, "tmp")
        return env

    def request(self, message: list[Any], expected: str) -> list[Any]:
        """Send ``message``; the fold's answer, which must be an ``expected`` message."""
        try:
            write_frame(self.to_fold, message)
        except BrokenPipeError:
            pass  # the process ended: why, if it said, is read below
        try:
            answer = read_frame(self.from_fold, FROM_FOLD_LIMITS)
        except FoldPipeClosed:
            status = self._status()
            raise ArbiterError(f"{self.label}: the agent's process ended without answering ({status})") from None
        except DecodeError as exc:
            raise ArbiterError(f"{self.label}: the agent's process sent an unreadable answer: {exc}") from None
        if isinstance(answer, list) and answer and answer[0] == "error" and len(answer) == 2:
            raise ArbiterError(f"{self.label}: the agent failed: {answer[1]}")
        if not (isinstance(answer, list) and answer and answer[0] == expected and _well_formed(answer)):
            raise ArbiterError(f"{self.label}: the agent's process sent {_short(answer)} where {expected!r} was due")
        return answer

    def _status(self) -> str:
        """How the process ended, once it has (waited for a moment: its pipe closes as it exits)."""
        if self.process is None:
            return "it never started"
        give_up = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < give_up:
            # left unreaped (WNOWAIT): close() kills its process group by the process's id
            ended = os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if ended is not None:
                if ended.si_code == os.CLD_EXITED:
                    return f"exit status {ended.si_status}"
                return f"killed by signal {ended.si_status}"
            time.sleep(0.005)
        return "it closed its pipe and goes on"

    def close(self) -> None:
        """End the fold: its process (and its process group) gone, its folders removed."""
        if self.to_fold is not None:
            os.close(self.to_fold)  # the fold reads the end of its pipe and exits
            self.to_fold = None
        if self.from_fold is not None:
            self._await_exit(self.from_fold)
            os.close(self.from_fold)
            self.from_fold = None
        if self.process is not None:
            # Not yet reaped, the process keeps its id: its process group's id names no one else.
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.process.wait()
            self.process = None
        shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def _await_exit(from_fold: int) -> None:
        """Read the fold's pipe to its end, which comes when the process exits (or when it and the
        processes it started have closed it), for up to ``STOP_GRACE_S``."""
        give_up = time.monotonic() + STOP_GRACE_S
        while (left := give_up - time.monotonic()) > 0:
            readable, _, _ = select.select([from_fold], [], [], left)
            if readable and not os.read(from_fold, 1 << 16):
                return


def _well_formed(answer: list[Any]) -> bool:
    if answer[0] != "action":
        return len(answer) == 1
    return (
        len(answer) == 4
        and (answer[1] is None or isinstance(answer[1], str))
        and isinstance(answer[2], str)
        and isinstance(answer[3], (int, float, str))
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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
        self.fold: FoldProcess | None = None
        self.fold_key: tuple[int, int] | None = None  # (run, fold) of the running fold's process
        self.datasets = 0
        self.timeouts = 0
        self.restarts = 0
        self.fold_start_s: list[float] = []  # per fold: its process started and the agent imported

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
        body: dict[str, Any] | None = None  # the next dataset, when the last step's reply brought it
        while True:
            if body is None:
                try:
                    body = self.wire.request(FLATLAND_RL.ENV_CREATE, {})["payload"]
                except TimeoutException as exc:  # told late of a timeout: the next request goes on
                    log.warning("%s", exc)
                    continue
            ext = extension(body)
            if ext.get("finished"):
                break
            self._begin(ext)
            body = self._play_dataset(body["info"]["dataset_meta_features"], ext)
        self._end_fold()
        return self.wire.request(FLATLAND_RL.ENV_SUBMIT, {})["payload"]

    def _begin(self, ext: dict[str, Any]) -> None:
        """The fold's process, started and meta-trained at the fold's first dataset."""
        run, fold = ext["run"], ext["fold"]
        if self.fold_key == (run, fold):
            return
        self._end_fold()
        data = ext.get("meta_train")
        if data is None:
            raise ArbiterError(f"run {run}, fold {fold}: the evaluator sent no meta-training data for this fold")
        began = time.perf_counter()
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
        self.fold.request(["meta_train", data], "ready")
        self.fold_key = (run, fold)
        log.info("run %s, fold %s: agent meta-trained on %d datasets", run, fold, len(data["datasets"]))

    def _end_fold(self) -> None:
        if self.fold is not None:
            self.fold.close()
        self.fold, self.fold_key = None, None

    def _play_dataset(self, dataset_meta_features: dict[str, str], ext: dict[str, Any]) -> dict[str, Any] | None:
        """Play one dataset to its end; the next dataset's ENV_CREATE reply when the last step's
        reply brought it (each step asks for it: ``next``), else None."""
        fold = self.fold
        assert fold is not None
        answer = fold.request(["reset", dataset_meta_features], "action")
        request, asks = self.wire.request, {"reply": True, "next": True}
        while True:
            try:
                body = request(FLATLAND_RL.ENV_STEP, {"action": answer[1:], EXTENSION_KEY: asks})["payload"]
            except TimeoutException as exc:
                self.timeouts += 1
                log.warning("run %s, dataset %s: %s (it scores 0)", ext["run"], ext["dataset"], exc)
                return None
            except InvalidAction as exc:
                raise ArbiterError(f"run {ext['run']}, dataset {ext['dataset']}: {exc}") from None
            if body["done"]:
                self.datasets += 1
                next_dataset = extension(body).get("next")
                return next_dataset if isinstance(next_dataset, dict) else None
            _, reached, score = body["observation"]
            answer = fold.request(["observe", reached, score], "action")


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
        return scores
    finally:
        if own_wire:
            wire.close()


def _stop_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # the fold's process is ended on the way out (Runner.play)


def main(argv: list[str] | None = None) -> int:
    # A stop signal (``arbiter run`` ends its agent with SIGTERM) unwinds like an error would.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop_on_signal)
    parser = argparse.ArgumentParser(prog="python -m arbiter.client.metalc", description=__doc__.split("\n\n")[0])
    parser.add_argument("submission_dir", help="folder holding agent.py (and the agent's files)")
    parser.add_argument("--agent-module", default="agent", help="module of the folder defining Agent (default: agent)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        scores = run(args.submission_dir, agent_module=args.agent_module)
    except ArbiterError as exc:  # a refusal, an unreachable evaluator, the agent's error: its message says it
        log.error("%s: %s", type(exc).__name__, exc)
        return 1
    log.info("submitted: score %s, secondary %s", scores.get("score"), scores.get("score_secondary"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
