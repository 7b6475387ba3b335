"""The figures of a benchmark: percentiles, spreads, medians of paired per-round ratios, and the
targets a benchmark promises, printed with whether they are met."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (the definition arbiter's summary uses)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def spread(values: Iterable[float]) -> dict[str, float]:
    values = list(values)  # read three times
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def median_of(runs: Iterable[dict[str, Any]], get: Callable[[dict[str, Any]], float | None]) -> float | None:
    """The median over runs of one figure, leaving out the runs that lack it (None if all do)."""
    values = [v for v in (get(run) for run in runs) if v is not None]
    return statistics.median(values) if values else None


def per_round_ratios(top: list[dict[str, Any]], bottom: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """``top[i][key] / bottom[i][key]`` for each round (its paths ran back to back, so slow drift of
    the machine cancels), with their spread."""
    values = [a[key] / b[key] for a, b in zip(top, bottom, strict=True)]
    return {**spread(values), "per_round": values}


@dataclass(frozen=True)
class Target:
    """What a benchmark promises about its path against a named peer: the ratio the report calls
    ``ratio`` at least (``at_least``), or at most, ``bound``, judged on its median over rounds,
    or with ``every_round`` on its least favourable round (one good round cannot carry it)."""

    ratio: str  # the report's name for it, e.g. "remote_over_async1"
    path: str  # what is measured, e.g. "RemoteEnv"
    peer: str  # what it is measured against, e.g. "AsyncVectorEnv(1)"
    measure: str  # e.g. "in steps/s"
    bound: float
    at_least: bool
    every_round: bool = False

    def judged(self, ratio: dict[str, Any]) -> float:
        if not self.every_round:
            return ratio["median"]
        return min(ratio["per_round"]) if self.at_least else max(ratio["per_round"])

    def met(self, judged: float) -> bool:
        return judged >= self.bound if self.at_least else judged <= self.bound

    def report(self, ratio: dict[str, Any]) -> dict[str, Any]:
        judged = self.judged(ratio)
        return {self.ratio: self.bound, "at_least": self.at_least, "every_round": self.every_round,
                "median": ratio["median"], "judged": judged, "met": self.met(judged)}  # fmt: skip

    def label(self, where: str = "") -> str:
        """``<path> ≥|≤ <bound>× <peer> <measure>[ in every round]<where>``: the target in words."""
        every = " in every round" if self.every_round else ""
        return f"{self.path} {'≥' if self.at_least else '≤'} {self.bound:g}× {self.peer} {self.measure}{every}{where}"

    def line(self, ratio: dict[str, Any], where: str = "") -> str:
        """``target <label><where>: met|NOT met (median …[; least favourable round …]; per round …)``."""
        rounds = ", ".join(f"{v:.3f}" for v in ratio["per_round"])
        label = self.label(where)
        judged = self.judged(ratio)
        verdict = "met" if self.met(judged) else "NOT met"
        worst = f"; least favourable round {judged:.3f}" if self.every_round else ""
        return f"target {label}: {verdict} (median {ratio['median']:.3f}{worst}; per round {rounds})"


@dataclass(frozen=True)
class Threshold:
    """What a benchmark promises about one figure on its own (not a ratio to a peer): ``what``
    at least (``at_least``), or at most, ``bound`` ``unit``, judged on the least favourable of
    the values measured (one per load level or round), so that a single good run cannot carry it."""

    name: str  # the report's name for it, e.g. "evaluations_per_redis_core"
    what: str  # e.g. "evaluations one Redis core carries"
    unit: str  # e.g. "evaluations"
    bound: float
    at_least: bool

    def judged(self, values: Sequence[float]) -> float:
        return min(values) if self.at_least else max(values)

    def met(self, values: Sequence[float]) -> bool:
        worst = self.judged(values)
        return worst >= self.bound if self.at_least else worst <= self.bound

    def report(self, values: Sequence[float]) -> dict[str, Any]:
        return {self.name: self.bound, "at_least": self.at_least, "judged": self.judged(values),
                "values": list(values), "met": self.met(values)}  # fmt: skip

    def label(self) -> str:
        """``<what> ≥|≤ <bound> <unit>``: the target in words."""
        return f"{self.what} {'≥' if self.at_least else '≤'} {self.bound:,g} {self.unit}"

    def line(self, values: Sequence[float], labels: Sequence[str]) -> str:
        """``target <what> ≥|≤ <bound> <unit>: met|NOT met (least favourable …; <label> …, …)``."""
        each = ", ".join(f"{label} {value:,.0f}" for label, value in zip(labels, values, strict=True))
        verdict = "met" if self.met(values) else "NOT met"
        label = self.label()
        return f"target {label}: {verdict} (least favourable {self.judged(values):,.0f}; {each})"
