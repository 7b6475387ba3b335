"""ArbiterWorker.kill_horse, on RQ's cold shutdown or a job far past its timeout (F21): the
work-horse and every process group it started go, and none started while they were being found
escapes: the horse is frozen before its descendants are looked for, and each group as it is
found; RQ's alarm on its watch of the horse waits till all of that is done (F20). Real processes
and signals; the worker is not started (the horse is a process standing in for RQ's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from harness import wait_for
from rq.timeouts import HorseMonitorTimeoutException, UnixSignalDeathPenalty

from arbiter.server.hosting import worker as worker_module
from arbiter.server.hosting.queue import SERIALIZER, arbiter_queue
from arbiter.server.hosting.worker import ArbiterWorker

# A horse (its own process group, as RQ's) that starts a group which starts one more (as a
# container engine's process does), then keeps starting groups until it is stopped.
HORSE = """
import os, subprocess, sys, time
os.setpgrp()
marker = sys.argv[1]
sleeper = [sys.executable, "-c", "import time; time.sleep(120)", marker]
starter = "import subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True); import time; time.sleep(120)"
subprocess.Popen([sys.executable, "-c", starter, *sleeper], start_new_session=True)
print("ready", flush=True)
while True:
    subprocess.Popen(sleeper, start_new_session=True)
    time.sleep(0.005)
"""


def running_with(marker: str) -> list[int]:
    """The live processes (zombies aside) whose command line holds ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                if marker.encode() not in handle.read():
                    continue
            with open(f"/proc/{name}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(name))
        except OSError:
            continue
    return found


def stopped_or_stop_pending(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as handle:
        fields = dict(line.split(":", 1) for line in handle if ":" in line)
    stop_bit = 1 << (signal.SIGSTOP - 1)
    pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
    return fields["State"].split()[0] in ("T", "t") or bool(pending & stop_bit)


def frozen(pid: int, within_s: float = 2.0) -> bool:
    """Stopped, or bound to stop before it runs another instruction of its own: a stop signal
    pending on a process inside a system call (a fork, say) takes effect as the call returns.
    /proc/PID/status reads the state before the pending signals, so a stop taken between the
    two reads shows as neither: the status is read again until it shows one. A process never
    sent a stop shows neither for ``within_s``."""
    try:
        wait_for(lambda: stopped_or_stop_pending(pid), timeout_s=within_s, what="the stop")
    except AssertionError:
        return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_horse_and_every_group_it_started_go_and_none_escapes(redis_conn, monkeypatch, sig) -> None:
    marker = f"horse-{uuid.uuid4().hex}"
    horse = subprocess.Popen([sys.executable, "-c", HORSE, marker], stdout=subprocess.PIPE, text=True)
    try:
        assert horse.stdout.readline().strip() == "ready"
        wait_for(lambda: len(running_with(marker)) >= 4, what="the horse's groups")  # the horse, 3 sleepers
        horse_frozen: list[bool] = []
        look_up = worker_module._descendant_groups

        def looked_up(pid: int) -> set[int]:
            horse_frozen.append(frozen(pid))
            return look_up(pid)

        monkeypatch.setattr(worker_module, "_descendant_groups", looked_up)
        rq_worker = ArbiterWorker([arbiter_queue(redis_conn)], connection=redis_conn, serializer=SERIALIZER)
        rq_worker._horse_pid = horse.pid
        rq_worker.kill_horse(sig)
        assert horse.wait(timeout=10) == -sig
        assert horse_frozen and all(horse_frozen), "the horse ran on while its groups were looked up"
        assert len(horse_frozen) >= 2, "the groups were looked for again after the first were frozen"
        wait_for(lambda: running_with(marker) == [], timeout_s=10, what="no process of the horse's left")
    finally:
        horse.kill()
        horse.wait()
        for pid in running_with(marker):
            os.kill(pid, signal.SIGKILL)


# pytest-timeout's own alarm would be SIGALRM too: this test leaves that signal to RQ's watch.
@pytest.mark.timeout(60, method="thread")
def test_rqs_watch_of_the_horse_waits_till_what_the_horse_started_is_removed(redis_conn, monkeypatch) -> None:
    """A cold shutdown kills the horse inside RQ's watch of it, an alarm that raises when it goes
    off (a whole second at most here, as the worker's job-monitoring interval). A container engine
    that takes longer than that to remove the agent's container is not cut short: the alarm is
    held meanwhile, then set again with the time it had left."""
    removed: list[float] = []

    def slow_removal(self: ArbiterWorker) -> None:  # a busy machine's container engine
        subprocess.run([sys.executable, "-c", "import time; time.sleep(1.3)"], check=True, timeout=20)
        removed.append(time.monotonic())

    monkeypatch.setattr(ArbiterWorker, "_abandon_current_job", slow_removal)
    # a group of its own from its start, as RQ's horse: RQ signals the horse's group
    horse = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], process_group=0)
    try:
        assert os.getpgid(horse.pid) == horse.pid != os.getpgid(0)  # never this test's own group
        rq_worker = ArbiterWorker([arbiter_queue(redis_conn)], connection=redis_conn, serializer=SERIALIZER)
        rq_worker._horse_pid = horse.pid
        with UnixSignalDeathPenalty(worker_module.JOB_MONITORING_INTERVAL_S, HorseMonitorTimeoutException):
            rq_worker.kill_horse()
            left_s = signal.getitimer(signal.ITIMER_REAL)[0]
        assert len(removed) == 1, "the container's removal was cut short"
        assert 0.5 < left_s <= worker_module.JOB_MONITORING_INTERVAL_S  # the watch goes on where it was
        assert horse.wait(timeout=10) == -signal.SIGKILL
    finally:
        horse.kill()
        horse.wait()
