#!/usr/bin/env python3
"""Recompute an evaluation's scores offline from its results folder.

    python scripts/rescore.py RESULTS_DIR [--scoring RULE]

Reads episodes.jsonl (the source of truth) and summary.json's format, rule and options. For
Flatland it re-derives every episode's figure from its raw fields (reward, steps, agents,
arrivals) with the named rule (neurips2020 or flatland3); for every format it aggregates the
records with the format's rule and compares every figure of the score (primary, secondary,
their spread and the format's own figures, e.g. two-phase's phase1, convergence, eval and runs)
with summary.json. Exits 1 when they disagree, so organisers can audit a leaderboard entry.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from arbiter.server.core.scoring import scoring_rule
from arbiter.server.formats import get_format
from arbiter.server.formats.base import options_from_dict
from arbiter.server.service.results import read_records


def flatland_figures(rule: Any, records: list[dict[str, Any]]) -> None:
    for record in records:
        finished = not (record["timed_out"] or record["abandoned"] or record["skipped"])
        record["normalized_return"] = rule.normalized_return(
            reward=record["reward"],
            max_episode_steps=record["max_episode_steps"] or 1,
            num_agents=record["num_agents"] or 1,
            finished=finished,
        )
        record["arrived_fraction"] = (
            rule.arrived_fraction(arrived=record["arrived"], num_agents=record["num_agents"], finished=finished)
            if record["num_agents"]
            else 0.0
        )


def differences(got: Any, want: Any, path: str = "score") -> list[str]:
    """Where two scores disagree: numbers to 1e-12, everything else exactly."""
    if isinstance(got, dict) and isinstance(want, dict):
        found = []
        for key in sorted(set(got) | set(want), key=str):
            found += differences(got.get(key), want.get(key), f"{path}.{key}")
        return found
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True)) for d in differences(g, w, f"{path}[{i}]")]
    numbers = (int, float)
    if isinstance(got, numbers) and isinstance(want, numbers) and not isinstance(got, bool):
        return [] if math.isclose(got, want, rel_tol=0, abs_tol=1e-12) else [f"{path}: {got!r} != {want!r}"]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--scoring", help="rule to apply (default: the one summary.json names)")
    args = parser.parse_args()
    with open(os.path.join(args.results, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    records = read_records(os.path.join(args.results, "episodes.jsonl"))  # whole items only, as resume reads
    format_name = summary.get("format") or "flatland"
    found = get_format(format_name)
    options = None
    if found.options is not None:
        options = options_from_dict(found.options, summary.get("options") or {}, "summary.json options")
    rule = scoring_rule(format_name, args.scoring or summary["scoring"], options)
    if format_name == "flatland":
        flatland_figures(rule, records)
    recomputed = rule.aggregate(records) if records and summary["state"] == "SUCCESS" else None
    if recomputed is not None:  # as summary.json holds it (tuples become lists)
        recomputed = json.loads(json.dumps(recomputed))
    print(f"{len(records)} records, format {format_name}, rule {rule.name}, state {summary['state']}")
    if recomputed is None:
        print("no score (the evaluation did not complete, or played no episode)")
        return 0 if summary["score"]["primary"] is None else 1
    print(f"primary   {recomputed['primary']!r}  (summary.json: {summary['score']['primary']!r})")
    print(f"secondary {recomputed['secondary']!r}  (summary.json: {summary['score']['secondary']!r})")
    found_differences = differences(recomputed, summary["score"])
    same = args.scoring in (None, summary["scoring"]) and not found_differences
    for line in found_differences[:20]:
        print(f"  {line}")
    print("matches summary.json" if same else "DIFFERS from summary.json")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
