"""Scoring rules: how records become leaderboard figures, whatever the format.

A rule sees only records (plain dicts, as written to episodes.jsonl), so a score can always be
recomputed offline from the results folder. Each format ships its rules (``formats/<name>/``);
this module holds what they share: the interface, the spread of a figure, the leaderboard figure
a rule reports (summary.json → ``leaderboard.figures``), and the lookup.
"""

from __future__ import annotations

import random
import statistics
from typing import Any, Protocol

from arbiter.protocol.errors import ConfigError


class ScoringRule(Protocol):
    """What the core asks of a scoring rule. A format writes its rules as subclasses of
    ``formats.base.Rule``, which gives this with defaults; the core names only this, so that it
    depends on no format's code."""

    name: str
    higher_is_better: bool
    figure_names: tuple[str, ...]  # what ``figures`` reports: the names a [leaderboard] column may use
    context_names: tuple[str, ...]  # what ``context`` reports: the fields achievements and ``per`` may use

    def aggregate(self, episodes: list[dict[str, Any]]) -> dict[str, Any]:
        """At least primary, secondary, primary_name, secondary_name and spread; summary.json's
        ``score`` is this map as it is."""

    def primary(self, episodes: list[dict[str, Any]]) -> float:
        """The primary figure alone: what ``aggregate`` reports as primary, without the spread
        (its bootstrap is too slow to run after every episode of a long evaluation)."""

    def figures(self, episodes: list[dict[str, Any]], score: dict[str, Any]) -> list[dict[str, Any]]:
        """Every figure a leaderboard column may show, each made by ``figure``, from the score
        ``aggregate`` gave for these records."""

    def context(self, episodes: list[dict[str, Any]], score: dict[str, Any]) -> dict[str, Any]:
        """Fields that describe the evaluation on a leaderboard without ranking it."""


def spread(values: list[float], seed: int = 0) -> dict[str, Any]:
    """Standard deviation, and a bootstrap 95% interval of the mean once there are 10+ values."""
    spread: dict[str, Any] = {"n": len(values), "std": statistics.pstdev(values) if values else None}
    if len(values) >= 10:
        rng = random.Random(seed)  # fixed: the interval is part of a reproducible result
        means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(2000))
        spread["ci95"] = [means[int(0.025 * len(means))], means[int(0.975 * len(means)) - 1]]
    else:
        spread["ci95"] = None
    return spread


def figure_spread(found: Any) -> dict[str, Any] | None:
    """A figure's spread as a leaderboard reads it: ``spread``'s ``n``, ``std`` and ``ci95`` (a
    rule's spread map may hold more, such as an interquartile mean); None without one."""
    if not isinstance(found, dict):
        return None
    return {"n": found.get("n"), "std": found.get("std"), "ci95": found.get("ci95")}


def sum_spread(found: Any) -> dict[str, Any] | None:
    """The spread of a figure that sums ``n`` values, from ``spread``'s map of the values: the sum
    is the mean of the values scaled by ``n``, so its ``std`` and ``ci95`` are scaled alike."""
    reduced = figure_spread(found)
    if reduced is None or not reduced["n"]:
        return reduced
    n = reduced["n"]
    std, ci95 = reduced["std"], reduced["ci95"]
    return {
        "n": n,
        "std": None if std is None else std * n,
        "ci95": None if ci95 is None else [bound * n for bound in ci95],
    }


def figure(
    name: str,
    title: str,
    value: float | None,
    *,
    higher_is_better: bool,
    spec: str = ".4f",
    spread_map: Any = None,
) -> dict[str, Any]:
    """One figure a leaderboard column may show. ``name`` is what a competition file's columns
    use; ``title`` what people read; ``value`` the score's own figure (None: not computed);
    ``spec`` a format spec for display; ``spread_map`` the figure's spread (``spread``'s map,
    reduced to n, std and ci95), or None."""
    return {
        "name": name,
        "title": title,
        "value": value,
        "direction": "higher" if higher_is_better else "lower",
        "spec": spec,
        "spread": figure_spread(spread_map),
    }


def scoring_rule(format_name: str, name: str | None = None, options: Any = None) -> ScoringRule:
    """The rule ``name`` of a format (its default rule when None), built with the format's options."""
    from arbiter.server.formats import get_format

    found = get_format(format_name)
    name = name or found.default_rule
    try:
        make = found.rules[name]
    except KeyError:
        raise ConfigError(
            f"unknown scoring rule {name!r} for format {format_name!r}; known: {', '.join(found.rules)}"
        ) from None
    return make(options)
