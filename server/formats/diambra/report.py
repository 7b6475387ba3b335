"""The DIAMBRA format's report sections: the engine (loudly, when it is the mock), the score
against the episode's total reward for Easy, Medium and Hard of the game played with this
submission's episodes on their curve (the picture DIAMBRA's evaluation page shows), each
episode's cumulative reward over its steps, and the settings it was played with.

Everything is drawn from the records and the summary alone, so a results folder renders the same
on a machine without diambra-arena.
"""

from __future__ import annotations

from html import escape
from typing import Any

from arbiter.server.core.summary import ENDING_TEXT
from arbiter.server.formats.diambra.games import DIFFICULTIES, GAMES
from arbiter.server.formats.diambra.scoring import rescore, weighted_score
from arbiter.server.formats.diambra.settings import GAME_SPECIFIC
from arbiter.server.report.charts import fmt_count, fmt_score, number, section
from arbiter.server.report.svg import Series, linear_axis, rounded_axis, xy_chart

CURVE_POINTS = 64
UNSET = "unset: drawn at each reset"
MAX_TRACE_CHARTS = 12  # episodes drawn one chart each; the rest are in the table
CURVE_CSS = {"easy": "", "medium": "second", "hard": "third"}  # blue, green, amber (report_style)
KEY_COLOURS = {"easy": "var(--blue)", "medium": "var(--green)", "hard": "var(--amber)"}


def _ended(record: dict[str, Any]) -> str:
    ended = str(record.get("ended"))
    return ENDING_TEXT.get(ended, ended)


def _num(value: float) -> str:
    return f"{value:,.6g}"


def _legend(items: list[tuple[str, str]]) -> str:
    keys = "".join(
        f'<span><i class="key" style="background:{colour}"></i>{escape(text)}</span>' for colour, text in items
    )
    return f'<div class="legend">{keys}</div>'


def _engine(score: dict[str, Any], records: list[dict[str, Any]]) -> str:
    engines = sorted({str(r.get("engine")) for r in records}) or [str(score.get("engine"))]
    if engines == ["mock"]:
        note = score.get("engine_note") or "diambra-arena's engine mock stands in for the game"
        body = f'<p class="cause" style="color:var(--red)"><strong>engine: mock</strong> — {escape(str(note))}.</p>'
    else:
        body = f"<p>engine: {escape(', '.join(engines))}</p>"
    return section("Engine", body)


def _score_curves(records: list[dict[str, Any]]) -> str:
    first = records[0]
    game = GAMES.get(str(first.get("game")))
    bounds = first.get("bounds")
    if game is None or not isinstance(bounds, list) or len(bounds) != 2:
        return ""
    low, high = float(bounds[0]), float(bounds[1])
    easy = game.levels["easy"]
    series, legend = [], []
    for difficulty in DIFFICULTIES:
        level = game.levels[difficulty]
        rewards = [low + (high - low) * i / (CURVE_POINTS - 1) for i in range(CURVE_POINTS)]
        points = [(r, weighted_score(r, low=low, high=high, level=level, easy_level=easy)[1]) for r in rewards]
        label = f"{difficulty.capitalize()} (level {level})"
        series.append(Series(CURVE_CSS[difficulty], points, f"{label}: score against total reward"))
        legend.append((KEY_COLOURS[difficulty], label))
    marks = []
    for record in records:
        reward = number(record.get("reward"))
        if reward is None:
            continue
        k, score = rescore(record)
        ended = _ended(record)
        tip = (
            f"episode {record.get('episode')} ({record.get('difficulty')}, seed {record.get('seed')}): "
            f"R = {_num(reward)}, k = {k:.4f}, score = {_num(score)}; {ended}"
        )
        marks.append((reward, score, tip, "point"))
    top = high * game.levels["hard"] / easy
    title = f"{game.name}: score against total reward R, by difficulty"
    chart = xy_chart(
        "diambra-score-curves",
        title=title,
        series=series,
        # Both axes end on labelled ticks: a reward or score below zero reads as such.
        x_axis=rounded_axis([low, high]),
        y_axis=rounded_axis([low, top]),
        x_format=lambda v: f"{v:,.0f}",
        y_format=lambda v: f"{v:,.0f}",
        y_rules=[(0.0, "0", "mean")],
        points=marks,
    )
    legend.append(("var(--red)", "this submission's episodes"))
    note = (
        f"R from {_num(low)} to {_num(high)} (bounds from the {first.get('bounds_source', '?')}); "
        "Easy scores R, Medium and Hard R × k(R) with k rising linearly from 1 at the lowest R to "
        "L_D / L_Easy at the highest."
    )
    figure = f"<figure><figcaption>{escape(title)}</figcaption>{chart}{_legend(legend)}</figure>"
    return section("Score against total reward", figure + _episodes_table(records), note)


def _episodes_table(records: list[dict[str, Any]]) -> str:
    head = (
        "<tr><th>episode</th><th>seed</th><th>difficulty</th><th>R</th><th>collected</th><th>k</th>"
        "<th>score</th><th>ended</th><th>steps</th><th>invalid actions</th></tr>"
    )
    rows = ""
    for record in records:
        k, score = rescore(record)
        partial = record.get("partial_reward")
        rows += (
            f"<tr><td>{escape(str(record.get('episode')))}</td><td>{escape(str(record.get('seed')))}</td>"
            f"<td>{escape(str(record.get('difficulty')))} ({escape(str(record.get('level')))})</td>"
            f"<td>{fmt_score(record.get('reward'), 1)}</td>"
            f"<td>{fmt_score(partial if partial is not None else record.get('reward'), 1)}</td>"
            f"<td>{k:.4f}</td><td>{fmt_score(score, 1)}</td>"
            f"<td>{escape(_ended(record))}</td>"
            f"<td>{fmt_count(record.get('steps'))}</td><td>{fmt_count(record.get('invalid_actions'))}</td></tr>"
        )
    return f'<table class="numeric"><thead>{head}</thead><tbody>{rows}</tbody></table>'


def _reward_over_time(records: list[dict[str, Any]]) -> str:
    charts = ""
    drawn = [r for r in records if r.get("reward_trace")][:MAX_TRACE_CHARTS]
    for record in drawn:
        points = [(float(x), float(y)) for x, y in record["reward_trace"]]
        steps = max(float(record.get("steps") or 0), points[-1][0], 1.0)
        values = [y for _, y in points]
        title = f"Episode {record.get('episode')}: cumulative reward over its steps"
        ended = _ended(record)
        rounds = [int(s) for s in record.get("round_ends") or []]
        chart = xy_chart(
            f"diambra-reward-{record.get('episode')}",
            title=title,
            series=[Series("", points, f"episode {record.get('episode')}: cumulative reward", step=True)],
            x_axis=linear_axis([0.0, steps], lo=0.0, hi=steps, whole=True),
            y_axis=rounded_axis([0.0, 1.0, *values]),
            x_format=lambda v: f"{v:,.0f}",
            y_format=lambda v: f"{v:,.0f}",
            y_rules=[(0.0, "0", "mean")],
        )
        caption = (
            f"{ended}; {len(rounds)} round{'s' if len(rounds) != 1 else ''} ended (steps "
            f"{', '.join(map(str, rounds[:20]))}{' …' if len(rounds) > 20 else ''})"
            if rounds
            else ended
        )
        charts += (
            f'<figure><figcaption>{escape(title)}</figcaption>{chart}<p class="note">{escape(caption)}</p></figure>'
        )
    if not charts:
        return ""
    more = len([r for r in records if r.get("reward_trace")]) - len(drawn)
    note = "Each step of the curve is a hit landed or taken (the reward is the change in health)."
    if more > 0:
        note += f" {more} more episodes are in the table above."
    return section("Reward over time", charts, note)


def _settings(records: list[dict[str, Any]]) -> str:
    first = records[0]
    settings = dict(first.get("settings") or {})
    game = GAMES.get(str(first.get("game")))
    applies = dict(game.specific) if game is not None else {}
    # A game-specific key of another game is left out: "drawn at each reset" would not be true.
    shown = {k: v for k, v in settings.items() if not (k in GAME_SPECIFIC and k not in applies and v is None)}
    rows = "".join(
        f"<tr><td>{escape(str(key))}</td><td>{escape(UNSET if value is None else str(value))}</td></tr>"
        for key, value in shown.items()
    )
    drawn = "".join(
        f"<tr><td>episode {escape(str(r.get('episode')))}</td><td>{escape(_drawn_text(r.get('drawn') or {}))}</td></tr>"
        for r in records
        if r.get("drawn")
    )
    body = f"<table><thead><tr><th>key</th><th>value</th></tr></thead><tbody>{rows}</tbody></table>"
    if drawn:
        body += (
            '<table style="margin-top:12px"><thead><tr><th>episode</th><th>as the env drew it</th></tr></thead>'
            f"<tbody>{drawn}</tbody></table>"
        )
    note = (
        f"Game {first.get('game')}, difficulty {first.get('difficulty')} = level {first.get('level')} "
        f"(Easy = level {first.get('easy_level')}); bounds {first.get('bounds')} from the "
        f"{first.get('bounds_source')}, the documented formula gives {first.get('formula_bounds')}."
    )
    return section("Settings", body, note)


def _drawn_text(drawn: dict[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in drawn.items())


def report_sections(summary: dict[str, Any], records: list[dict[str, Any]]) -> str:
    score = summary.get("score") or {}
    records = [r for r in records if isinstance(r, dict) and {"bounds", "reward", "level", "easy_level"} <= set(r)]
    if not records:
        return _engine(score, records) if score.get("engine") else ""
    return _engine(score, records) + _score_curves(records) + _reward_over_time(records) + _settings(records)
