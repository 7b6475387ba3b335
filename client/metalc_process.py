"""A MetaLC fold's process as the runner sees it (``arbiter.client.metalc``): its folder and
start, its end, and what it says, checked before the runner uses it (its side:
``arbiter.client.metalc_fold``)."""

from __future__ import annotations

import contextlib
import functools
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any

from arbiter.client import metalc_fold
from arbiter.client.metalc_fold import FROM_FOLD_LIMITS, FoldPipeClosed, read_frame, write_frame
from arbiter.client.metalc_play import TIMED
from arbiter.protocol import errors
from arbiter.protocol.errors import ArbiterError, DecodeError
from arbiter.protocol.starter_folders import abandoned, starter_prefix

# How a fold's process starts. On Linux it is forked from the runner, which has loaded numpy and
# arbiter's client but never the agent, and made what a fresh interpreter would be
# (``metalc_fold.become_fold``): a start costs a fork instead of an interpreter importing numpy and
# Redis's client. Elsewhere (forking without exec is unsafe with macOS's system libraries) it is a
# fresh interpreter running BOOT, whose working folder is the agent's and must not shadow
# arbiter's own modules: arbiter comes from where it is installed, and the agent's folder is put
# first on the path once arbiter is loaded (metalc_fold.import_agent_class).
# ARBITER_METALC_FORK=0 starts fresh interpreters on Linux too: for a program that calls the runner
# while threads of its own run (a fork copies only the calling thread), or to compare the two.
FORK_VARIABLE = "ARBITER_METALC_FORK"


def forks_folds() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "fork") and os.environ.get(FORK_VARIABLE, "1") != "0"


BOOT = (
    "import sys\n"
    "if not sys.flags.safe_path:\n"
    "    del sys.path[0]\n"
    "from arbiter.client import metalc_fold\n"
    "metalc_fold.main(sys.argv[1:])\n"
)
# The fold's process reaches the evaluator with the session the runner hands it over its pipe, not
# through its environment: an agent that builds a client of its own from these finds none.
CONNECTION_VARIABLES = ("ARBITER_REDIS_URL", "AICROWD_SUBMISSION_ID", "redis_ip")
STOP_GRACE_S = 2.0  # a fold's process ends on its own once its pipe closes; then it is killed
# Set by the runner's stop signal: a fold is then killed at once, its folders removed, well within
# the time ``arbiter run`` gives a stopped agent before it kills it (and the folders would stay).
stopping = False


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
    for folder in abandoned(FOLD_FOLDER_PREFIX):
        shutil.rmtree(folder, ignore_errors=True)


class FoldProcess:
    """One fold's agent process, in a fresh copy of the submission folder (see the module docstring)."""

    def __init__(self, submission: Submission, label: str, forks: bool | None = None):
        self.label = label
        self.pid: int | None = None
        self._reap: Any = None  # waits for the process's end once it is killed
        self.to_fold: int | None = None
        self.from_fold: int | None = None
        remove_abandoned_folds()
        self.root = tempfile.mkdtemp(prefix=starter_prefix(FOLD_FOLDER_PREFIX))
        try:
            workdir = os.path.join(self.root, "submission")
            shutil.copytree(submission.folder, workdir)
            env = self._environment()
            fold_reads, self.to_fold = os.pipe()
            self.from_fold, fold_writes = os.pipe()
            try:
                if forks_folds() if forks is None else forks:
                    self._fork(workdir, env, fold_reads, fold_writes)
                else:
                    self._start_interpreter(workdir, env, fold_reads, fold_writes)
            finally:
                os.close(fold_reads)
                os.close(fold_writes)
        except BaseException:
            self.close()
            raise

    def _fork(self, workdir: str, env: dict[str, str], fold_reads: int, fold_writes: int) -> None:
        runner_pid = os.getpid()
        for stream in (sys.stdout, sys.stderr):  # what the runner wrote is not written twice
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        pid = os.fork()
        if pid == 0:  # the fold's process: never returns
            try:
                assert self.to_fold is not None and self.from_fold is not None
                os.close(self.to_fold)  # the runner's ends: the fold sees its pipe end when the runner closes it
                os.close(self.from_fold)
                metalc_fold.become_fold(workdir, env, fold_reads, fold_writes, runner_pid)
            except BaseException:
                traceback.print_exc()  # the runner says the process ended without answering
            finally:
                os._exit(1)
        self.pid = pid
        self._reap = functools.partial(os.waitpid, pid, 0)

    def _start_interpreter(self, workdir: str, env: dict[str, str], fold_reads: int, fold_writes: int) -> None:
        process = subprocess.Popen(
            [sys.executable, "-c", BOOT, str(fold_reads), str(fold_writes), str(os.getpid())],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            pass_fds=(fold_reads, fold_writes),
            start_new_session=True,  # its own process group: killed whole at the fold's end
        )
        self.pid = process.pid
        self._reap = process.wait

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in CONNECTION_VARIABLES}
        for name in ("home", "tmp"):
            os.mkdir(os.path.join(self.root, name))
        env["HOME"] = os.path.join(self.root, "home")
        for variable in ("TMPDIR", "TMP", "TEMP"):
            env[variable] = os.path.join(self.root, "tmp")
        return env

    def request(self, message: list[Any], *expected: str) -> list[Any]:
        """Send ``message``; the fold's answer, which must be one of the ``expected`` messages."""
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
        if not (isinstance(answer, list) and answer and answer[0] in expected and _well_formed(answer)):
            due = " or ".join(repr(kind) for kind in expected)
            raise ArbiterError(f"{self.label}: the agent's process sent {_short(answer)} where {due} was due")
        return answer

    def _status(self) -> str:
        """How the process ended, once it has (waited for a moment: its pipe closes as it exits)."""
        if self.pid is None:
            return "it never started"
        give_up = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < give_up:
            # left unreaped (WNOWAIT): close() kills its process group by the process's id
            ended = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
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
            if not stopping:
                self._await_exit(self.from_fold)
            os.close(self.from_fold)
            self.from_fold = None
        if self.pid is not None:
            # Not yet reaped, the process keeps its id: its process group's id names no one else.
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._reap()
            self.pid = None
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
    """The fold's process runs the agent's code: what it says is checked before it is used."""
    if answer[0] == "imported":
        return len(answer) == 1
    if len(answer) != 2 or not isinstance(answer[1], dict) or type(answer[1].get("seq")) is not int:
        return False
    told = answer[1]
    if answer[0] == "played":
        trips = told.get("round_trips")
        return (
            type(told.get("datasets")) is int
            and isinstance(told.get("timeouts"), list)
            and all(isinstance(line, str) for line in told["timeouts"])
            and isinstance(trips, dict)
            and all(_well_formed_trips(trips.get(kind)) for kind in TIMED)
        )
    return isinstance(told.get("message"), str) and (answer[0] != "refused" or isinstance(told.get("kind"), str))


def _well_formed_trips(row: Any) -> bool:
    return (
        isinstance(row, dict)
        and type(row.get("count")) is int
        and isinstance(row.get("total_s"), float)
        and isinstance(row.get("samples"), list)
        and all(isinstance(seconds, float) for seconds in row["samples"])
    )


def refusal(kind: str, message: str) -> ArbiterError:
    """The evaluator's refusal a fold's process told of, as the error the wire raised there."""
    error_class = getattr(errors, kind, None)
    if isinstance(error_class, type) and issubclass(error_class, ArbiterError):
        try:
            return error_class(message)
        except TypeError:  # a class that is built otherwise
            pass
    return ArbiterError(message)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
