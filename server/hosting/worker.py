"""``arbiter worker``: an RQ worker on arbiter's queue, one submission at a time.

Its heartbeats are short (``HEARTBEAT_TTL_S``): a worker lost with its machine leaves a job
whose heartbeat lapses within seconds, which the next reaper pass (reaper.py) hands to another
worker. Every worker reaps, idle (RQ's maintenance, every ``MAINTENANCE_INTERVAL_S``) or busy
(between the heartbeats of its own job); a lock in Redis lets one pass run per interval.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

import redis
from rq import Worker

from arbiter.protocol.errors import ArbiterError, ConfigError
from arbiter.server.cli.parent_death import signalled_when_parent_ends
from arbiter.server.hosting.backends import get_backend
from arbiter.server.hosting.job import WorkerSettings, configure, current_settings
from arbiter.server.hosting.private_redis import remove_abandoned
from arbiter.server.hosting.queue import SERIALIZER, arbiter_queue
from arbiter.server.hosting.reaper import reap, reap_due

log = logging.getLogger(__name__)

JOB_MONITORING_INTERVAL_S = 1  # how often a busy worker renews its job's heartbeat (RQ wants whole seconds)
HEARTBEAT_TTL_S = 3  # a job with no heartbeat for this long is abandoned
MAINTENANCE_INTERVAL_S = 1
# RQ blocks on the queue for worker_ttl - 15 s at most: an idle worker looks up every second.
WORKER_TTL_S = 16


class ArbiterWorker(Worker):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._worker_pid = os.getpid()

    def setup_work_horse_signals(self) -> None:
        """In the work-horse, right after its fork: a SIGTERM from the kernel when this worker
        ends, killed outright included, which the evaluation obeys as a stop (INTERRUPTED, its
        agent stopped): no attempt goes on unwatched, and the submission is taken up again."""
        super().setup_work_horse_signals()
        if sys.platform.startswith("linux"):
            signalled_when_parent_ends(self._worker_pid, signal.SIGTERM)

    def kill_horse(self, sig=signal.SIGKILL) -> None:
        """RQ kills the work-horse's process group (a cold shutdown, a stop command, a job far
        past its timeout); the groups the horse started (the agent's, a container engine's) go
        with it. The horse is frozen first, and each group as it is found, then looked for
        again: nothing started while they were being found escapes. RQ's watch of the horse
        waits till all of it is done (``_monitor_alarm_held``)."""
        with _monitor_alarm_held():
            horse = self.horse_pid
            frozen = _signal_groups(_own_group(horse), signal.SIGSTOP)
            groups: set[int] = set()
            try:
                while found := _descendant_groups(horse) - groups:
                    _signal_groups(found, signal.SIGSTOP)
                    groups |= found
                _signal_groups(groups, sig)
            finally:
                super().kill_horse(sig)
                if sig != signal.SIGKILL:  # a stopped process acts on any other signal once it goes on
                    _signal_groups(groups | frozen, signal.SIGCONT)
            self._abandon_current_job()

    def wait_for_horse(self) -> tuple[int | None, int | None, Any]:
        """RQ waits here for every work-horse's end; once it is reaped, the folder of the Redis
        of a horse that was killed is removed (``private_redis.remove_abandoned``), here rather
        than by a later attempt, which may never come to this machine."""
        reaped = super().wait_for_horse()
        if reaped[0] is not None:
            try:
                remove_abandoned()
            except OSError as exc:  # a folder left is removed by a later attempt: never worth failing RQ's watch
                log.warning("the folders of killed work-horses' Redis servers were not looked for: %s", exc)
        return reaped

    def handle_work_horse_killed(self, job: Any, retpid: Any, ret_val: Any, rusage: Any) -> None:
        """RQ found the work-horse ended before its job did, killed by something else than this
        worker (the kernel's out-of-memory killer, say): the kernel took the horse's processes,
        not an agent's container, which goes here, before the job is retried, wherever the next
        attempt runs (a Kubernetes Job is the next attempt's to follow)."""
        super().handle_work_horse_killed(job, retpid, ret_val, rusage)
        settings = current_settings()
        if settings is not None and settings.backend.agent_outlives_horse:
            self._abandon(job.id)

    def _abandon_current_job(self) -> None:
        """What the killed horse's attempt runs outside its processes (a container) goes too."""
        try:
            submission_id = self.get_current_job_id()
        except redis.exceptions.RedisError as exc:
            log.warning(
                "the killed work-horse's submission is unknown (%s): its agent is left to the next attempt", exc
            )
            return
        if submission_id:
            self._abandon(submission_id)

    def _abandon(self, submission_id: str) -> None:
        settings = current_settings()
        if settings is None:
            return
        try:
            settings.backend.abandon(submission_id)
        except Exception:  # the horse is gone whatever: what is left goes with the next attempt
            log.exception("what the attempt of %s runs outside its work-horse was not stopped", submission_id)

    def get_heartbeat_ttl(self, job, working_time: float = 0.0) -> int:
        return HEARTBEAT_TTL_S

    def run_maintenance_tasks(self) -> None:
        super().run_maintenance_tasks()
        self._reap()

    def maintain_heartbeats(self, job, execution) -> None:
        try:
            super().maintain_heartbeats(job, execution)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            # The farm's Redis restarting, or out of reach a moment: the horse goes on watched. Its
            # attempt stops itself before its lock can lapse (job.py's LockKeeper) if the outage
            # lasts; the horse then ends, and this worker meets the outage where it records that.
            log.warning("heartbeat not sent (the farm's Redis: %s); the attempt goes on while its lock holds", exc)
            return
        self._reap()

    def _reap(self) -> None:
        try:
            if reap_due(self.connection):
                reap(self.connection)
        except redis.exceptions.RedisError as exc:
            log.warning("reaper pass skipped: %s", exc)


@contextlib.contextmanager
def _monitor_alarm_held() -> Iterator[None]:
    """RQ watches its work-horse under an alarm (SIGALRM, every job-monitoring interval), and a
    cold shutdown kills the horse from within that watch: on a busy machine the alarm went off
    while the container engine was still removing the agent's container, and the container
    stayed. The alarm is held while the horse and what it started are stopped, then set again
    with the time it had left, so RQ's watch goes on as if that had taken no time. Only the main
    thread receives the alarm: elsewhere (RQ's stop command) there is nothing to hold."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    left_s, interval_s = signal.setitimer(signal.ITIMER_REAL, 0)
    try:
        yield
    finally:
        if left_s > 0:
            signal.setitimer(signal.ITIMER_REAL, left_s, interval_s)


def _own_group(pid: int) -> set[int]:
    """``pid``'s process group when it leads one (RQ's horse does once it has started): the
    group that may be signalled without reaching this worker."""
    try:
        return {pid} if pid and os.getpgid(pid) == pid else set()
    except ProcessLookupError:
        return set()


def _signal_groups(groups: set[int], sig: int) -> set[int]:
    """``sig`` to each of ``groups``; those that were still there."""
    reached: set[int] = set()
    for group in groups:
        try:
            os.killpg(group, sig)
            reached.add(group)
        except (ProcessLookupError, PermissionError):
            pass  # gone meanwhile
    return reached


def _descendant_groups(pid: int) -> set[int]:
    """The process groups of ``pid``'s descendants other than its own (Linux's /proc; none
    elsewhere)."""
    groups: set[int] = set()
    pending = [pid] if pid else []
    while pending:
        current = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children", encoding="ascii") as handle:
                    children = [int(child) for child in handle.read().split()]
            except OSError:
                continue
            for child in children:
                pending.append(child)
                try:
                    groups.add(os.getpgid(child))
                except ProcessLookupError:
                    pass
    try:
        groups.discard(os.getpgid(pid))
    except ProcessLookupError:
        pass
    return groups


def run_worker(
    redis_url: str,
    results_root: str,
    *,
    backend: str = "local",
    backend_options: dict[str, Any] | None = None,
    burst: bool = False,
) -> bool:
    """Evaluate queued submissions until stopped (``burst``: until the queue is empty); returns
    whether it evaluated any. ``backend_options``: the chosen backend's own settings."""
    chosen = get_backend(backend, **(backend_options or {}))
    chosen.check()  # a machine that cannot run its agents takes no submission
    try:
        os.makedirs(results_root, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--results-root {results_root!r} cannot be used: {exc}") from None
    if not os.access(results_root, os.W_OK):
        raise ConfigError(f"--results-root {results_root!r} is not writable")
    conn = redis.Redis.from_url(redis_url)
    conn.ping()  # an unreachable Redis is one clear error, before anything starts
    worker = ArbiterWorker(
        [arbiter_queue(conn)],
        connection=conn,
        serializer=SERIALIZER,
        job_monitoring_interval=JOB_MONITORING_INTERVAL_S,
        maintenance_interval=MAINTENANCE_INTERVAL_S,
        worker_ttl=WORKER_TTL_S,
        name=f"arbiter-{socket.gethostname()}-{os.getpid()}",
    )
    configure(WorkerSettings(redis_url, os.path.abspath(results_root), chosen, worker_name=worker.name))
    try:
        worked = worker.work(burst=burst, logging_level=logging.getLevelName(logging.getLogger().level))
    except Exception as exc:  # the farm's Redis gone while busy (killed, restarted), or a fault of RQ's
        _stop_watched_attempt(worker)
        raise WorkerQuit(
            f"worker {worker.name} stopped on an error ({type(exc).__name__}: {exc}); start it again, or let its "
            "supervisor restart it"
        ) from exc
    told_to_stop = worker._stop_requested or worker._shutdown_requested_date is not None  # a signal, a command
    if not burst and not told_to_stop:
        # RQ's loop ends by itself when the farm's Redis does not answer a busy worker in time, or
        # on an error of its own: a worker is meant to run until it is told to stop, so this is a
        # failure its supervisor should see (and restart it on), never a clean exit.
        _stop_watched_attempt(worker)
        raise WorkerQuit(
            f"worker {worker.name} stopped on its own (its log above says why: the farm's Redis did not answer "
            "in time, or an error); start it again, or let its supervisor restart it"
        )
    return worked


def _stop_watched_attempt(worker: ArbiterWorker) -> None:
    """The attempt a quitting worker was watching goes with it, as with a cold shutdown: left
    alone it would run on unwatched, and the submission is queued again once its heartbeat lapses."""
    if not worker.horse_pid:
        return
    try:
        worker.kill_horse()  # the horse is killed before RQ writes the job's end to the farm's Redis
    except redis.RedisError as exc:
        log.warning("the farm's Redis did not take the attempt's end (%s); it is queued again later", exc)
    worker.wait_for_horse()


class WorkerQuit(ArbiterError):
    """The worker's loop ended without a stop signal or, in burst mode, an empty queue."""

    code = "WORKER"
