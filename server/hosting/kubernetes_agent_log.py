"""``agent.log`` on Kubernetes: the log of the ``agent`` container of an evaluation's pod, kept in
the results folder as the other backends keep what the agent prints (agent_log.py).

The log lives with the pod, and the pod with its Job, so it is read while the Job is there:
before the worker deletes the Job (the evaluation ended, or was stopped), once the Job ended on
its own, and before a Job that ended with its log not kept (its worker was lost) is replaced.
Each Job's agent gets one part, headed by the attempt that created the Job (its
``arbiter/attempt`` annotation) and when the agent's container started. A Job left in place is
annotated ``arbiter/agent-log`` once its part is written, so a later attempt never writes it again.

The API serves the container's current log file: what the kubelet rotated away (past its
``containerLogMaxSize``) is gone before anyone reads it. The log is read as a byte stream (the
client's own decoding would turn a line of JSON into a Python repr) into AgentLog, which keeps
its head and its tail and says how many bytes it dropped between them, whatever the log's size.
A container that restarted gives its previous instance's log first.

A log is never worth an evaluation: an API that still fails once the backend's retries are
spent, a container that never started (an image that could not be pulled: the API answers 400),
leave no part, or a part ended by a line saying its log could not be read further; the
evaluation goes on. An attempt that lost its lock (results_fence.py) writes nothing.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from arbiter.server.hosting.agent_log import READ_BYTES, AgentLog
from arbiter.server.service import results_fence

log = logging.getLogger(__name__)

AGENT_CONTAINER = "agent"
ATTEMPT_ANNOTATION = "arbiter/attempt"  # on the Job: the attempt that created it, which started its agent
KEPT_ANNOTATION = "arbiter/agent-log"  # on a Job left in place: its agent's part is written


def with_attempt(job_body: dict[str, Any], attempt: int) -> dict[str, Any]:
    """The Job's manifest, naming the attempt that creates it."""
    job_body["metadata"].setdefault("annotations", {})[ATTEMPT_ANNOTATION] = str(attempt)
    return job_body


def keep_agent_log(cluster: Any, job: Any, results_dir: str, *, attempt: int, leaves_job: bool) -> bool:
    """Append the part of ``job``'s agent (a V1Job, or its name to read it; None: gone) to
    ``results_dir``'s agent.log; whether it was written. ``attempt`` names the part when the Job
    names none (made before Jobs did); ``leaves_job``: the Job stays, annotated once its part is
    written."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if job is None or results_fence.refusal() is not None:
        return False
    name = job if isinstance(job, str) else job.metadata.name
    try:
        if isinstance(job, str) and (job := cluster.read_job(name)) is None:
            return False
        annotations = job.metadata.annotations or {}
        if annotations.get(KEPT_ANNOTATION):
            return False
        named = annotations.get(ATTEMPT_ANNOTATION, "")
        written = _write_part(cluster, name, results_dir, int(named) if named.isdigit() else attempt)
    except (ApiException, HTTPError, OSError) as exc:
        log.warning("the log of the Job %s's agent is not kept in agent.log: %s", name, _said(exc))
        return False
    if written and leaves_job:
        try:
            cluster.annotate_job(name, {KEPT_ANNOTATION: "kept"})
        except (ApiException, HTTPError, OSError) as exc:  # at worst a later attempt writes the part again
            log.warning("the Job %s is not marked as having its agent's log kept: %s", name, _said(exc))
    return written


def _said(exc: Exception) -> str:
    status = getattr(exc, "status", None)  # an ApiException's own text holds its headers and body
    if status is None:
        return f"{type(exc).__name__}: {exc}"
    hint = " (the worker's Role must allow get on pods/log)" if status == 403 else ""
    return f"{status} {getattr(exc, 'reason', '') or ''}".strip() + hint


def _write_part(cluster: Any, job_name: str, results_dir: str, attempt: int) -> bool:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    pod = _newest(cluster.pods(job_name))
    agent = _agent_status(pod)
    started_at = _started_at(agent)
    if agent is None or started_at is None:  # never started (its image not pulled ...): no log to read
        return False
    part = AgentLog(results_dir, attempt)
    opened = False
    try:
        for previous in ([True] if agent.restart_count else []) + [False]:
            try:
                response = cluster.agent_log(pod.metadata.name, previous=previous)
            except ApiException as exc:
                if exc.status != 400:
                    raise
                log.info("the Job %s's agent has no log to read: %s", job_name, _said(exc))
                continue  # 400: that instance of the container never started
            if response is None:  # the pod is gone
                break
            try:
                if not opened:
                    if not part.start(started_at):
                        return False
                    opened = True
                else:  # the current instance, after the previous one's log
                    part.take(b"=== arbiter: the agent's container restarted ===\n")
                for chunk in response.stream(READ_BYTES):
                    part.take(chunk)
            except (HTTPError, OSError) as exc:  # cut off midway: what came before is kept
                log.warning("the log of the Job %s's agent was cut off: %s", job_name, _said(exc))
                part.take(f"\n=== arbiter: the agent's log could not be read further: {_said(exc)} ===\n".encode())
                break
            finally:
                response.release_conn()
    finally:
        part.close()
    return opened and part.kept


def _newest(pods: list[Any]) -> Any | None:
    """The Job's newest pod (with backoffLimit 0 there is one)."""

    def created(pod: Any) -> float:
        stamp = pod.metadata.creation_timestamp if pod.metadata is not None else None
        return stamp.timestamp() if isinstance(stamp, datetime.datetime) else 0.0

    return max(pods, key=created) if pods else None


def _agent_status(pod: Any | None) -> Any | None:
    statuses = (pod.status.container_statuses or []) if pod is not None and pod.status is not None else []
    return next((one for one in statuses if one.name == AGENT_CONTAINER), None)


def _started_at(agent: Any | None) -> float | None:
    """When the agent's first instance in the pod started; None when none did."""
    if agent is None:
        return None
    for state in (agent.last_state, agent.state) if agent.restart_count else (agent.state,):
        for phase in (state.running, state.terminated) if state is not None else ():
            if phase is not None and isinstance(phase.started_at, datetime.datetime):
                return phase.started_at.timestamp()
    return None
