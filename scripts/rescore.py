#!/usr/bin/env python3
"""Recompute an evaluation's scores offline from its results folder.

    python scripts/rescore.py RESULTS_DIR [--scoring neurips2020|flatland3]

Reads episodes.jsonl (the source of truth), re-derives every episode's figure from its raw
fields with the named scoring rule, aggregates, and compares with summary.json. Exits 1 when
they disagree, so organisers can audit a leaderboard entry.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from arbiter.server.scoring import scoring_rule


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--scoring", help="rule to apply (default: the one summary.json names)")
    args = parser.parse_args()
    with open(os.path.join(args.results, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    with open(os.path.join(args.results, "episodes.jsonl"), encoding="utf-8") as handle:
        episodes = [json.loads(line) for line in handle]
    rule = scoring_rule(args.scoring or summary["scoring"])
    for record in episodes:
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
    recomputed = rule.aggregate(episodes) if episodes and summary["state"] == "SUCCESS" else None
    print(f"{len(episodes)} episodes, rule {rule.name}, state {summary['state']}")
    if recomputed is None:
        print("no score (the evaluation did not complete, or played no episode)")
        return 0 if summary["score"]["primary"] is None else 1
    print(f"primary   {recomputed['primary']:.12f}  (summary.json: {summary['score']['primary']})")
    print(f"secondary {recomputed['secondary']:.12f}  (summary.json: {summary['score']['secondary']})")
    same = (args.scoring in (None, summary["scoring"])) and all(
        math.isclose(recomputed[k], summary["score"][k], rel_tol=0, abs_tol=1e-12) for k in ("primary", "secondary")
    )
    print("matches summary.json" if same else "DIFFERS from summary.json")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
