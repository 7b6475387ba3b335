"""``arbiter rescore``: an evaluation's score recomputed from its results folder alone.

summary.json names the evaluation's format, scoring rule and format options; episodes.jsonl holds
its records (whole items only, as ``--resume`` reads them). The competition spec and its rule are
rebuilt from those, the format's ``rescore`` hook (where it has one) derives the per-record figures
again from the raw fields, and the rule scores the records. Every figure is then compared with what
was recorded: the score in summary.json, and each derived figure in episodes.jsonl.

``evaluation_format`` tells the format of a results folder, for ``arbiter replay`` too.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.competition import spec_from_dict
from arbiter.server.core.scoring import scoring_rule
from arbiter.server.core.summary import leaderboard
from arbiter.server.formats import get_format
from arbiter.server.service.records_file import read_items

SUMMARY_FILE = "summary.json"
EPISODES_FILE = "episodes.jsonl"
EVENTS_FILE = "events.jsonl"
ABS_TOLERANCE = 1e-12  # a figure recomputed in another order of additions may differ in its last bits
SHOWN_DIFFERENCES = 20  # the text output lists this many differences, then counts the rest


@dataclass
class Rescore:
    """A score recomputed from a results folder, next to the one recorded."""

    results_dir: str
    format_name: str
    scoring: str  # the rule applied
    recorded_scoring: str  # the rule summary.json names
    state: str
    records: int
    rederived: bool  # the format derived its per-record figures again from the raw fields
    recomputed: dict[str, Any] | None  # None: no score (the evaluation did not complete, or played nothing)
    recorded: dict[str, Any]
    differences: list[str] = field(default_factory=list)

    @property
    def matches(self) -> bool:
        return not self.differences

    def as_dict(self) -> dict[str, Any]:
        return {
            "results": self.results_dir,
            "format": self.format_name,
            "scoring": self.scoring,
            "recorded_scoring": self.recorded_scoring,
            "state": self.state,
            "records": self.records,
            "rederived": self.rederived,
            "recomputed": self.recomputed,
            "recorded": self.recorded,
            "matches": self.matches,
            "differences": self.differences,
        }


def read_summary(results_dir: str) -> dict[str, Any]:
    """summary.json of ``results_dir``, or a clear error saying what is missing."""
    if not os.path.isdir(results_dir):
        what = "is a file, not a folder" if os.path.isfile(results_dir) else "does not exist"
        raise ConfigError(f"results folder {results_dir!r} {what}")
    path = os.path.join(results_dir, SUMMARY_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            summary = json.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{results_dir} has no {SUMMARY_FILE} (the evaluation never ended)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not readable: {exc}") from None
    except RecursionError:  # nested deeper than the parser goes: no summary arbiter wrote
        raise ConfigError(f"{path} is not readable: nested too deeply") from None
    if not isinstance(summary, dict):
        raise ConfigError(f"{path} is not a summary (a JSON object)")
    return summary


def evaluation_format(results_dir: str) -> str:
    """The format of the evaluation in ``results_dir``: its summary.json's, else (a killed
    evaluation has none) the one its events.jsonl announced at the start."""
    try:
        return read_summary(results_dir).get("format") or _started_format(results_dir)
    except ConfigError:
        if not os.path.isdir(results_dir):
            raise
        return _started_format(results_dir)


def _started_format(results_dir: str) -> str:
    path = os.path.join(results_dir, EVENTS_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    event = json.loads(line)
                except ValueError:
                    break
                if isinstance(event, dict) and event.get("event") == "started" and event.get("format"):
                    return str(event["format"])
    except OSError:
        pass
    raise ConfigError(f"cannot tell the format of {results_dir}: neither {SUMMARY_FILE} nor {EVENTS_FILE} names it")


def summary_rule(results_dir: str, summary: dict[str, Any], scoring: str | None = None) -> tuple[Any, Any]:
    """(spec, rule) of the evaluation ``summary`` describes: its format and options as recorded,
    scored by its own rule or by ``scoring`` (another rule of its format)."""
    spec_keys: dict[str, Any] = {**(summary.get("options") or {}), "scoring": scoring or summary.get("scoring")}
    if summary.get("format"):  # a summary of an evaluation older than formats names none
        spec_keys["format"] = summary["format"]
    source = f"{os.path.join(results_dir, SUMMARY_FILE)} (competition {summary.get('competition')!r})"
    spec = spec_from_dict(str(summary.get("competition") or "rescored"), spec_keys, source=source)
    return spec, scoring_rule(spec.format, spec.scoring, spec.options)


def rescore(results_dir: str, scoring: str | None = None) -> Rescore:
    """Recompute the score of ``results_dir`` with its own rule, or with ``scoring`` (another
    rule of its format), and compare it with the recorded one."""
    summary = read_summary(results_dir)
    recorded = (summary.get("items") or {}).get("recorded") if isinstance(summary.get("items"), dict) else None
    if isinstance(recorded, int) and recorded > 0 and not os.path.exists(os.path.join(results_dir, EPISODES_FILE)):
        raise ConfigError(f"{results_dir} has no {EPISODES_FILE}, and its {SUMMARY_FILE} counts {recorded} items")
    episodes = read_items(os.path.join(results_dir, EPISODES_FILE))
    records = episodes.records
    recorded_scoring = summary.get("scoring")
    spec, rule = summary_rule(results_dir, summary, scoring)
    hook = get_format(spec.format).rescore
    scored = hook(rule, records) if hook is not None else records
    state = str(summary.get("state"))
    recorded = summary.get("score") or {}
    recomputed = rule.aggregate(scored) if scored and state == "SUCCESS" else None
    if recomputed is not None:  # as summary.json holds it (tuples become lists)
        recomputed = json.loads(json.dumps(recomputed))
    found = Rescore(
        results_dir=results_dir,
        format_name=spec.format,
        scoring=rule.name,
        recorded_scoring=str(recorded_scoring),
        state=state,
        records=len(records),
        rederived=hook is not None,
        recomputed=recomputed,
        recorded=recorded,
    )
    if episodes.damage is not None:  # not what a crash leaves: the records scored may not be all there were
        found.differences.append(
            f"{EPISODES_FILE}: damaged after its {len(episodes.items)} whole items ({episodes.damage})"
        )
    if rule.name != recorded_scoring:
        found.differences.append(f"scoring: {rule.name!r} applied, {recorded_scoring!r} recorded")
    if recomputed is None:
        if recorded.get("primary") is not None:
            found.differences.append(f"score: none recomputed ({state}), summary.json has {recorded['primary']!r}")
    else:
        found.differences += differences(recomputed, recorded, "score")
        if rule.name == recorded_scoring and isinstance(summary.get("leaderboard"), dict):
            # What a leaderboard ranks by: the rule's figures of the same score, checked too.
            board = json.loads(json.dumps(leaderboard(rule, scored, recomputed)))
            found.differences += differences(board, summary["leaderboard"], "leaderboard")
    for line, (again, stored) in enumerate(zip(scored, records, strict=True), start=1):
        if again is not stored:
            found.differences += differences(again, stored, f"{EPISODES_FILE} line {line} (item {stored.get('index')})")
    return found


def differences(got: Any, want: Any, path: str) -> list[str]:
    """Where two figures disagree, each named by its path: numbers to ``ABS_TOLERANCE``,
    everything else exactly."""
    if isinstance(got, dict) and isinstance(want, dict):
        found = []
        for key in sorted(set(got) | set(want), key=str):
            found += differences(got.get(key), want.get(key), f"{path}.{key}")
        return found
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True)) for d in differences(g, w, f"{path}[{i}]")]
    if _is_number(got) and _is_number(want) and math.isclose(got, want, rel_tol=0, abs_tol=ABS_TOLERANCE):
        return []
    return [] if got == want else [f"{path}: recomputed {got!r}, recorded {want!r}"]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _leaves(value: Any, path: str) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [leaf for key, inner in value.items() for leaf in _leaves(inner, f"{path}.{key}" if path else str(key))]
    if isinstance(value, list) and any(isinstance(inner, (dict, list)) for inner in value):
        return [leaf for i, inner in enumerate(value) for leaf in _leaves(inner, f"{path}[{i}]")]
    return [(path, value)]


def as_text(found: Rescore) -> str:
    """The rescore as a table: every figure of the score, recomputed and recorded, then the verdict."""
    lines = [
        f"{found.records} records, format {found.format_name}, rule {found.scoring}, state {found.state}"
        + (" (per-record figures derived again from the raw fields)" if found.rederived else "")
    ]
    if found.recomputed is None:
        lines.append("no score recomputed (the evaluation did not complete, or played no episode)")
    else:
        recorded = dict(_leaves(found.recorded, ""))
        recomputed = dict(_leaves(found.recomputed, ""))
        rows = [(path, _shown(value), _shown(recorded.get(path))) for path, value in recomputed.items()]
        rows += [(path, "-", _shown(value)) for path, value in recorded.items() if path not in recomputed]
        width = max(len("figure"), *(len(path) for path, _, _ in rows))
        value_width = max(len("recomputed"), *(len(value) for _, value, _ in rows))
        lines.append(f"{'figure':<{width}}  {'recomputed':<{value_width}}  summary.json")
        lines += [f"{path:<{width}}  {value:<{value_width}}  {stored}" for path, value, stored in rows]
    if found.matches:
        lines.append(f"matches {SUMMARY_FILE} and {EPISODES_FILE}")
    else:
        lines.append(f"DIFFERS from what was recorded ({len(found.differences)}):")
        lines += [f"  {difference}" for difference in found.differences[:SHOWN_DIFFERENCES]]
        if len(found.differences) > SHOWN_DIFFERENCES:
            lines.append(f"  ... and {len(found.differences) - SHOWN_DIFFERENCES} more (--json lists them all)")
    return "\n".join(lines)


def _shown(value: Any) -> str:
    return "-" if value is None else repr(value) if isinstance(value, float) else str(value)
