"""Results folders written by hand for board tests: a summary.json as an evaluation writes it, with
the figures a test chooses, and a competition file with a [leaderboard] table."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

TWO_PHASE_FIGURES = {"phase1": "higher", "convergence": "lower", "eval": "higher"}
START = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)


def at(minutes: int) -> str:
    return (START + datetime.timedelta(minutes=minutes)).isoformat(timespec="seconds")


def write_folder(
    root: Path,
    competition: str,
    submission: str,
    participant: str,
    figures: dict[str, float | None],
    *,
    minutes: int,
    state: str = "SUCCESS",
    debug: bool = False,
    intervals: dict[str, list[float]] | None = None,
    context: dict[str, Any] | None = None,
    phase: str | None = None,
    scoring: str = "two-phase",
    fmt: str = "two-phase",
    options: dict[str, Any] | None = None,
) -> Path:
    folder = root / competition / submission
    folder.mkdir(parents=True)
    directions = TWO_PHASE_FIGURES
    summary = {
        "state": state,
        "debug": debug,
        "format": fmt,
        "competition": competition,
        "scoring": scoring,
        "termination_cause": None if state == "SUCCESS" else "the agent exited before its handshake",
        "options": {**(options or {}), **({"phase": phase} if phase is not None else {})},
        "started_at": at(minutes),
        "leaderboard": {
            "figures": [
                {
                    "name": name,
                    "title": f"the {name}",
                    "value": value,
                    "direction": directions.get(name, "higher"),
                    "spec": ".3f",
                    "spread": {"n": 12, "std": 1.0, "ci95": (intervals or {}).get(name)},
                }
                for name, value in figures.items()
            ],
            "context": context or {},
        },
        "submission": {"participant": participant, "id": submission, "submitted_at": at(minutes), "debug": debug},
    }
    if phase is not None:
        summary["submission"]["phase"] = phase
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def competition_file(path: Path, leaderboard: str, *, head: str = 'format = "two-phase"') -> Path:
    """A competition file of the given top keys and [leaderboard] table (TOML text)."""
    path.write_text(head + "\n\n" + leaderboard + "\n")
    return path
