"""``arbiter report``: one self-contained ``report.html`` from a results folder.

The page is read where the results are, often with no network (a cluster's volume, an archived
folder), so it carries everything itself: the stylesheet inline, the charts as inline SVG
(svg.py), no script, and a Content-Security-Policy that forbids loading anything at all. Every
string taken from the results is escaped: some of them (the client's version, termination causes
that quote a request) come from the participant's side.
"""

from __future__ import annotations

import json
import os
from html import escape
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.output_files import make_output_folder
from arbiter.server.core.rescore import EVENTS_FILE
from arbiter.server.core.words import resume_command
from arbiter.server.report.charts import (
    HeadlineFigure,
    budget_charts,
    fmt_count,
    fmt_duration,
    number,
    section,
)
from arbiter.server.report.style import STYLESHEET
from arbiter.server.service.events import command_recorded
from arbiter.server.service.records_file import read_items

REPORT_NAME = "report.html"
BUDGET_ROWS = [
    ("planning_s", "Planning", "per episode, from the env_create reply to the first step"),
    ("step_s", "Step", "between consecutive steps of an episode"),
    ("overall_s", "Overall", "the whole evaluation, from the agent's first env_create"),
    ("idle_s", "Idle", "waiting for a client, for the next episode or for submit"),
    ("time_bank_s", "Time bank", "per episode: planning and steps may run over their budgets by this much in all"),
]


# --- reading the results folder ---------------------------------------------------------------


def _competition_of(results: Path) -> str | None:
    try:
        found = json.loads((results / "summary.json").read_text(encoding="utf-8")).get("competition")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def load_results(directory: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``summary.json`` and the records of ``episodes.jsonl``; ConfigError when they are not there."""
    folder = Path(directory)
    if not folder.is_dir():
        what = "a file" if os.path.isfile(folder) else "no such directory"
        raise ConfigError(f"{folder} is not a results folder ({what})")
    summary_path, episodes_path = folder / "summary.json", folder / "episodes.jsonl"
    if not summary_path.is_file():
        if episodes_path.is_file():
            raise ConfigError(
                f"{folder} has episodes.jsonl but no summary.json: its evaluation has not ended, or its "
                f"evaluator was killed ({_resume_of(folder)} finishes it)"
            )
        held = sorted(sub for sub in folder.iterdir() if (sub / "summary.json").is_file())
        if held:
            said = f"{folder} is not a results folder but holds {len(held)}: a report covers one evaluation"
            if folder.name in {_competition_of(sub) for sub in held}:
                # A competition's folder of submissions: ranking them is the leaderboard's work.
                raise ConfigError(
                    f"{said}; rank them with `arbiter leaderboard --results-root {folder.parent} "
                    f"--competition {folder.name}`"
                )
            raise ConfigError(f"{said}, such as `arbiter report {held[-1]}`")  # local runs: the newest last
        raise ConfigError(f"{folder} is not a results folder: it holds neither summary.json nor episodes.jsonl")
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ConfigError(f"{summary_path} is not valid JSON: {error}") from None
    if not isinstance(summary, dict):
        raise ConfigError(f"{summary_path} does not hold a JSON object")
    episodes: list[dict[str, Any]] = []
    if episodes_path.is_file():
        # The one reading rule of a results folder (resume and scoring read it the same way):
        # whole items only. A last line cut short is what a killed write leaves and is left
        # out; a complete line that is not part of a whole item is damage, and said so.
        stored = read_items(str(episodes_path))
        tail = episodes_path.read_bytes()[stored.whole_bytes :]
        if b"\n" in tail:
            line = sum(len(item.records) for item in stored.items) + 1
            raise ConfigError(
                f"{episodes_path}, line {line}: not valid JSON, or not a record of a whole item; "
                "the lines before it are readable"
            )
        episodes = stored.records
    elif number((summary.get("episodes") or {}).get("recorded")):
        raise ConfigError(f"{folder} has no episodes.jsonl, but its summary.json lists recorded episodes")
    return summary, episodes


def cut_short_line(directory: str | Path) -> bool:
    """Whether the folder's ``episodes.jsonl`` ends in a line cut short, which the page leaves out."""
    path = Path(directory) / "episodes.jsonl"
    if not path.is_file():
        return False
    stored = read_items(str(path))
    return stored.whole_bytes < stored.size


def table(headers: list[str], rows: list[list[str]], css: str = "") -> str:
    """A table whose cells are escaped here; ``rows`` hold plain text."""
    cells = "".join(f"<th>{escape(h)}</th>" for h in headers)
    head = f"<thead><tr>{cells}</tr></thead>" if any(headers) else ""
    body = "".join("<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="{css}">{head}<tbody>{body}</tbody></table>'


# --- the headline ------------------------------------------------------------------------------


def _spread_text(figure: HeadlineFigure) -> str:
    spread = figure.spread
    if figure.value is None:
        return figure.missing
    if not isinstance(spread, dict):
        return ""
    parts = []
    if number(spread.get("std")) is not None:
        parts.append(f"std {figure.text(spread['std'])}")
    if number(spread.get("n")) is not None:
        parts.append(f"n = {fmt_count(spread['n'])}")
    if number(spread.get("iqm")) is not None:
        parts.append(f"IQM {figure.text(spread['iqm'])}")
    interval = spread.get("ci95")
    if isinstance(interval, list) and len(interval) == 2:
        parts.append(f"95% CI [{figure.text(interval[0])}, {figure.text(interval[1])}]")
    return " · ".join(parts)


def headline_figures(summary: dict[str, Any]) -> list[HeadlineFigure]:
    """The format's own figures where it names them, else the score's primary and secondary."""
    from arbiter.server.formats import get_format

    try:
        found = get_format(str(summary.get("format") or "flatland"))
    except ConfigError:
        found = None
    if found is not None and found.report_headline is not None:
        return found.report_headline(summary)
    score = summary.get("score") or {}
    spread = score.get("spread") or {}
    return [
        HeadlineFigure(
            score.get(key),
            str(score.get(key + "_name") or key),
            score.get(key + "_higher_is_better") if isinstance(score.get(key + "_higher_is_better"), bool) else None,
            spread.get(key),
            primary=key == "primary",
        )
        for key in ("primary", "secondary")
    ]


def _figure(figure: HeadlineFigure) -> str:
    direction = figure.direction()
    return (
        f'<div class="score {"primary" if figure.primary else "secondary"}">'
        f'<div class="value">{escape(figure.text(figure.value))}</div>'
        f'<div class="label">{escape(figure.name)}</div>'
        + (f'<div class="direction">{escape(direction)}</div>' if direction else "")
        + f'<div class="spread">{escape(_spread_text(figure))}</div></div>'
    )


def _headline(summary: dict[str, Any], source: str) -> str:
    state = str(summary.get("state", "UNKNOWN"))
    score = summary.get("score") or {}
    debug = '<span class="badge debug">debug run</span>' if summary.get("debug") else ""
    facts = " · ".join(
        escape(str(value))
        for value in (
            _participant(summary),
            summary.get("competition"),
            summary.get("scoring"),
            summary.get("service_id"),
        )
        if value not in (None, "")
    )
    if number(score.get("primary")) is None:
        scores = (
            '<div class="score none"><div class="value">No score</div>'
            f'<div class="label">{escape(_no_score_reason(state, source))}</div></div>'
        )
    else:
        scores = "".join(_figure(figure) for figure in headline_figures(summary))
    return (
        f'<header><p class="eyebrow">arbiter evaluation report · {facts}</p>'
        f'<div class="state-line"><span class="badge state {escape(state.lower())}">{escape(state)}</span>{debug}'
        f'<span class="source">{escape(source)}</span></div>'
        f'<div class="scores">{scores}</div>'
        f'<p class="cause"><b>Termination:</b> {escape(str(summary.get("termination_cause") or "–"))}</p></header>'
    )


def _participant(summary: dict[str, Any]) -> Any:
    """Whose evaluation it is, when ``arbiter run --participant`` or a hosted submission named one."""
    submission = summary.get("submission")
    return submission.get("participant") if isinstance(submission, dict) else None


def _resume_of(folder: str | Path) -> str:
    """The command that continues the evaluation in ``folder``: the one its last run was."""
    return resume_command(command_recorded(os.path.join(folder, EVENTS_FILE)), str(folder))


def _no_score_reason(state: str, source: str = "") -> str:
    if state == "FAILED":
        return "the evaluation failed: a failed evaluation is not scored"
    if state == "INTERRUPTED":
        # The page is read later and from anywhere: the folder it names is the absolute one.
        resume = _resume_of(os.path.abspath(source)) if source and os.path.isdir(source) else resume_command(None)
        return f"the evaluation was interrupted before it ended ({resume} continues it)"
    return "this evaluation has no score"


def _recorded(items_done: dict[str, Any], counts: dict[str, Any], episodes: list[dict[str, Any]]) -> str:
    items = items_done.get("recorded", len(episodes))
    text = f"{fmt_count(items)} of {fmt_count(counts.get('total'))}"
    return text if number(items) == len(episodes) else f"{text} ({len(episodes)} episodes)"


def _counts(summary: dict[str, Any], episodes: list[dict[str, Any]], cut_short: bool = False) -> str:
    counts = summary.get("episodes") or {}
    timing = summary.get("timing") or {}
    budgets = summary.get("budgets") or {}
    cells = [
        ("recorded", _recorded(summary.get("items") or {}, counts, episodes)),
        ("finished", fmt_count(counts.get("finished"))),
        ("timed out", fmt_count(counts.get("timed_out"))),
        ("abandoned", fmt_count(counts.get("abandoned"))),
        ("not played", fmt_count(counts.get("skipped"))),
        ("time used", f"{fmt_duration(timing.get('evaluation_s'))} of {fmt_duration(budgets.get('overall_s'))}"),
    ]
    step_limited = ((summary.get("items") or {}).get("ended") or {}).get("step_limit")
    if step_limited:  # items the format's own step cap ended (among those counted finished)
        cells.insert(2, ("at the step limit", fmt_count(step_limited)))
    items = "".join(f"<div><dt>{escape(k)}</dt><dd>{escape(v)}</dd></div>" for k, v in cells)
    note = ""
    if cut_short:
        shown = f"{len(episodes)} {'record' if len(episodes) == 1 else 'records'}"
        note = (
            '<p class="note cut-short">episodes.jsonl ends in a line cut short (what a killed write leaves): '
            f"it is left out, so the episodes shown are the {escape(shown)} before it, while the counts "
            "and scores are summary.json's.</p>"
        )
    return f'<dl class="counts">{items}</dl>{note}'


# --- tables ------------------------------------------------------------------------------------


# summary.json's timing figures, as the page names them
TIMING_ROWS = (
    ("step_think_s", "agent time per step"),
    ("server_step_s", "evaluator time per step"),
    ("record_durable_s", "each item's record made durable"),
)


def _details(summary: dict[str, Any]) -> str:
    budgets = summary.get("budgets") or {}
    rows = [[label, fmt_duration(budgets.get(key)), meaning] for key, label, meaning in BUDGET_ROWS]
    rows.append(
        ["Successive timeouts", fmt_count(budgets.get("max_successive_timeouts")), "in a row end the evaluation"]
    )
    budget_table = table(["budget", "limit", "measured"], rows, "budgets")
    timing = summary.get("timing") or {}
    timing_rows = []
    for key, label in TIMING_ROWS:
        stats = timing.get(key) if isinstance(timing.get(key), dict) else {}
        timing_rows.append(
            [label, fmt_count(stats.get("n"))] + [fmt_duration(stats.get(k)) for k in ("min", "mean", "p99", "max")]
        )
    timing_table = table(["timed", "n", "min", "mean", "p99", "max"], timing_rows, "numeric")
    counters = summary.get("counters") or {}
    counter_rows = [[str(name), fmt_count(value)] for name, value in sorted(counters.items())] or [["none", ""]]
    versions = summary.get("versions") or {}
    participant = _participant(summary)
    run_rows = [["participant", str(participant)]] if participant not in (None, "") else []
    run_rows += [
        [label, str(summary.get(key))]
        for key, label in (
            ("started_at", "started"),
            ("seed", "seed"),
            ("tests", "test set"),
            ("client_version", "client"),
        )
        if summary.get(key) not in (None, "")
    ]
    run_rows += [[str(name), str(value)] for name, value in versions.items()]
    return (
        section("Budgets", budget_table)
        + section("Timing", timing_table)
        + '<section class="columns">'
        + f"<div><h2>Counters</h2>{table(['counter', 'count'], counter_rows)}</div>"
        + f"<div><h2>Run</h2>{table(['', ''], run_rows)}</div></section>"
    )


def format_sections(summary: dict[str, Any], episodes: list[dict[str, Any]]) -> str:
    """The sections of the evaluation's format (summaries written before formats existed are
    Flatland's); a format that cannot be loaded here (its extra is not installed) is said so."""
    from arbiter.server.formats import get_format

    name = str(summary.get("format") or "flatland")
    try:
        found = get_format(name)
    except ConfigError as exc:
        return section("Format", f'<p class="empty">{escape(str(exc))}</p>')
    return found.report_sections(summary, episodes) if found.report_sections else ""


# --- the page ----------------------------------------------------------------------------------


def render_report(
    summary: dict[str, Any], episodes: list[dict[str, Any]], *, source: str = "", cut_short: bool = False
) -> str:
    """The whole page as text; ``cut_short``: the episodes file's last line was cut short and left out."""
    try:
        arbiter_version = version("arbiter")
    except PackageNotFoundError:
        arbiter_version = "unknown"
    state = str(summary.get("state", "UNKNOWN"))
    body = (
        _headline(summary, source)
        + _counts(summary, episodes, cut_short)
        + format_sections(summary, episodes)
        + budget_charts(episodes, summary)
        + _details(summary)
        + f"<footer>Written by arbiter {escape(arbiter_version)} from {escape(source)}</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        # Nothing may be fetched or run, whatever ends up in the page.
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>arbiter report: {escape(state)}</title><style>{STYLESHEET}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )


def write_report(results_dir: str | Path, out: str | Path | None = None) -> Path:
    """Read ``results_dir`` and write the report (default ``results_dir/report.html``); returns its path."""
    summary, episodes = load_results(results_dir)
    target = Path(out) if out is not None else Path(results_dir) / REPORT_NAME
    page = render_report(summary, episodes, source=str(results_dir), cut_short=cut_short_line(results_dir))
    make_output_folder(str(target))
    try:
        target.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from None
    return target
