"""Helpers of the hosting tests: competition files, the deterministic agent as a submission's
command, `arbiter worker` processes and the waits on a submission's state."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import paths
from harness import wait_for
from hosted import tail
from processes import alive, descendants

from arbiter.server.hosting.private_redis import remove_abandoned
from arbiter.server.hosting.submissions import Submission, SubmissionStore

REPO = str(paths.REPO)
SEEDED_AGENT = os.path.join(paths.SUPPORT, "seeded_agent_main.py")


def competition_file(
    folder: Path,
    tests: str,
    *,
    name: str = "farm",
    overall_s: float = 60,
    idle_s: float = 5,
    hosting: str = "",
) -> str:
    """A Flatland competition on ``tests``; ``hosting``: the lines of its [hosting] table."""
    path = folder / f"{name}.toml"
    path.write_text(
        f'format = "flatland"\nscoring = "neurips2020"\ntests = "{tests}"\n'
        f"[budgets]\nplanning_s = 5\nstep_s = 2\noverall_s = {overall_s}\nidle_s = {idle_s}\n"
        f"[hosting]\n{hosting}\n",
        encoding="utf-8",
    )
    return str(path)


def seeded_agent(step_delay_s: float = 0.0, slow_until: str | None = None) -> list[str]:
    """The deterministic agent, connecting where its evaluation tells it (its environment);
    ``slow_until``: its steps are slowed down only until that file exists."""
    command = f'exec {sys.executable} {SEEDED_AGENT} "$ARBITER_REDIS_URL" "$AICROWD_SUBMISSION_ID"'
    if step_delay_s:
        command += f" --step-delay {step_delay_s}"
    if slow_until:
        command += f" --slow-until {shlex.quote(slow_until)}"
    return ["sh", "-c", command]


def arbiter(*args: str, timeout_s: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "arbiter.server.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


# The Workers of the test running now: a failing test's report carries what they said and how
# far each of their evaluations got (conftest.py), which is all that is left of them on CI.
RUNNING_NOW: list[Workers] = []


class Workers:
    """`arbiter worker` processes, each in a process group of its own; all stopped at the end.
    What each says (its output and its errors, with those of the work-horses and agents it
    starts) goes to a file of its own beside the results, never to a pipe that no one reads, whose
    buffer, once full, would block it."""

    def __init__(self, redis_url: str, results_root: str):
        self.redis_url, self.results_root = redis_url, results_root
        self.logs_dir = os.path.join(os.path.dirname(os.path.abspath(results_root)), "worker-logs")
        self.started: list[subprocess.Popen] = []
        RUNNING_NOW.append(self)

    def start(self, *options: str) -> subprocess.Popen:
        os.makedirs(self.logs_dir, exist_ok=True)
        with open(self._log_path(len(self.started)), "w", encoding="utf-8") as log:  # the child holds its own copy
            process = subprocess.Popen(
                [sys.executable, "-m", "arbiter.server.cli", "worker", "--redis-url", self.redis_url,
                 "--results-root", self.results_root, *options],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, process_group=0,
            )  # fmt: skip
        self.started.append(process)
        return process

    def _log_path(self, index: int) -> Path:
        return Path(self.logs_dir) / f"worker-{index + 1}.log"

    def log_of(self, process: subprocess.Popen) -> str:
        """The end of what ``process`` (one of these workers) has said so far."""
        return tail(self._log_path(self.started.index(process)))

    def story(self) -> str:
        """What every worker said, and the last events of every evaluation under the results."""
        parts = [f"worker {process.pid}:\n{self.log_of(process) or '(nothing)'}" for process in self.started]
        for events in sorted(Path(self.results_root).glob("*/*/events.jsonl")):
            lines = events.read_text(encoding="utf-8", errors="replace").splitlines()
            parts.append(f"{events.parent.name}, its last events:\n" + "\n".join(lines[-5:]))
        return "\n\n".join(parts)

    def by_name(self, worker_name: str) -> subprocess.Popen:
        pid = int(worker_name.rsplit("-", 1)[1])  # arbiter-<host>-<pid>
        return next(process for process in self.started if process.pid == pid)

    def stop_all(self) -> None:
        """Every worker killed with all it started, as a lost machine would lose them; then the
        folders of the Redis servers of their killed horses are removed, as a later attempt on
        the machine would remove them."""
        killed: list[int] = []
        for process in self.started:
            killed += kill_tree(process.pid)
            process.wait(timeout=10)
        wait_for(lambda: not any(alive(pid) for pid in killed), what="the killed workers' processes gone")
        remove_abandoned()


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` with everything it started, as a lost machine would: every process group
    among them (the worker's, its work-horse's, the agent's). Returns the pids it killed."""
    everyone = [pid, *descendants(pid)]
    groups = set()
    for member in everyone:
        try:
            groups.add(os.getpgid(member))
        except ProcessLookupError:
            pass
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return everyone


def wait_state(store: SubmissionStore, submission_id: str, *states: str, timeout_s: float = 60) -> Submission:
    found: dict[str, Submission] = {}

    def reached() -> bool:
        found["last"] = store.get(submission_id)
        return found["last"].state in states

    wait_for(reached, timeout_s=timeout_s, what=f"submission {submission_id} in {states}")
    return found["last"]


def wait_lines(path: str, count: int, timeout_s: float = 30) -> None:
    def enough() -> bool:
        try:
            with open(path, encoding="utf-8") as handle:
                return sum(1 for line in handle if line.strip()) >= count
        except FileNotFoundError:
            return False

    wait_for(enough, timeout_s=timeout_s, what=f"{count} lines in {path}")


def elapsed_since(start: float) -> float:
    return time.monotonic() - start
