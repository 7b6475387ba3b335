"""Whose evaluation it is: the identity summary.json's ``submission`` records (the participant,
the submission's id, when it was submitted), given before anything can end the evaluation and
kept by every resume of it."""

from __future__ import annotations

import datetime
import json
import logging
import os
from typing import Any

from arbiter.server.core.summary import iso_utc, submission_identity
from arbiter.server.service.events import submission_recorded
from arbiter.server.service.loop import EvaluatorService

log = logging.getLogger(__name__)


def name_submission(
    service: EvaluatorService,
    participant: str | None,
    *,
    results_dir: str,
    resume: bool,
    submitted_at: float | None = None,
) -> None:
    """Give the evaluation the identity summary.json's ``submission`` records, before anything
    can end it: ``participant``, the service id, ``submitted_at`` (a Unix time; by default when the
    evaluation started) and whether it is a debug run. A resumed evaluation keeps the identity
    of its first start: the one its summary recorded, else the one its first run named in its
    events (it was killed before it wrote a summary), else the participant now named, submitted
    when its first run started. A new identity is written into the events at once."""
    evaluation = service.evaluation
    if resume:
        kept = _recorded_identity(results_dir)
        if kept is not None:
            if participant is not None and kept.get("participant") != participant:
                log.warning(
                    "%s was started for participant %r: it keeps that identity, not %r",
                    results_dir,
                    kept.get("participant"),
                    participant,
                )
            evaluation.submission = kept
            return
    if participant is None:
        return
    if submitted_at is not None:
        when = iso_utc(submitted_at)
    else:
        when = (_first_start(results_dir) if resume else None) or evaluation.started_wall
    evaluation.submission = submission_identity(
        participant=participant, submission_id=evaluation.service_id, submitted_at=when, debug=evaluation.debug
    )
    if service.events is not None:
        service.events.submission(evaluation.submission)


def _recorded_identity(results_dir: str) -> dict[str, Any] | None:
    """The ``submission`` an earlier run of this evaluation wrote into its summary.json, else
    into its events (a run killed before its summary), if any."""
    try:
        with open(os.path.join(results_dir, "summary.json"), encoding="utf-8") as handle:
            found = json.load(handle).get("submission")
    except (OSError, ValueError, AttributeError):
        found = None
    if isinstance(found, dict) and found.get("participant"):
        return found
    return submission_recorded(os.path.join(results_dir, "events.jsonl"))


def _first_start(results_dir: str) -> str | None:
    """When the evaluation in ``results_dir`` first started (to the second): the time of the
    ``started`` event its first run wrote first into events.jsonl, which a resume continues."""
    try:
        with open(os.path.join(results_dir, "events.jsonl"), encoding="utf-8") as handle:
            first = json.loads(handle.readline())
        started = datetime.datetime.fromisoformat(first["time"]) if first.get("event") == "started" else None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return started.astimezone(datetime.UTC).isoformat(timespec="seconds") if started else None
