"""Scoring rules: how records become leaderboard figures, whatever the format.

A rule sees only records (plain dicts, as written to episodes.jsonl), so a score can always be
recomputed offline from the results folder. Each format ships its rules (``formats/<name>/``);
this module holds what they share: the interface, the spread of a figure, and the lookup.
"""

from __future__ import annotations

import random
import statistics
from typing import Any, Protocol

from arbiter.protocol.errors import ConfigError


class ScoringRule(Protocol):
    name: str
    higher_is_better: bool

    def aggregate(self, episodes: list[dict[str, Any]]) -> dict[str, Any]:
        """At least primary, secondary, primary_name, secondary_name and spread; summary.json's
        ``score`` is this map as it is."""

    def primary(self, episodes: list[dict[str, Any]]) -> float:
        """The primary figure alone: what ``aggregate`` reports as primary, without the spread
        (its bootstrap is too slow to run after every episode of a long evaluation)."""


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
