"""What making one appended record durable costs on a folder's disk: the floor under every item
an evaluation finishes, whose record is on the disk before the next item opens. bench_metalc.py
probes it after each of its arbiter runs, in the folder their results went to, and prints it
beside its per-dataset figure.

Each append is the evaluator's own (``durable.append_synced``: one write to episodes.jsonl, then
fdatasync), of a record about the size of a MetaLC dataset's, spaced as datasets end.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from figures import percentile

RECORD = b'{"probe": "' + b"x" * 580 + b'"}\n'  # one JSON line of a MetaLC dataset record's size
SPACING_S = 0.002  # between two appends: a dataset's steps take about that long


def measure(folder: Path, appends: int) -> dict[str, Any]:
    """``appends`` synced appends to a file of its own in ``folder`` (removed after): their mean,
    p50, p90 and largest time in µs."""
    from arbiter.server.service.durable import append_synced  # the evaluator's durable append

    path = folder / "sync-cost.jsonl"
    took: list[float] = []
    try:
        for _ in range(appends):
            started = time.perf_counter()
            append_synced(str(path), RECORD)
            took.append(time.perf_counter() - started)
            time.sleep(SPACING_S)
    finally:
        path.unlink(missing_ok=True)
    return {
        "appends": appends,
        "mean_us": statistics.fmean(took) * 1e6,
        "p50_us": percentile(took, 0.5) * 1e6,
        "p90_us": percentile(took, 0.9) * 1e6,
        "max_us": max(took) * 1e6,
    }


def line(rounds: list[dict[str, Any]]) -> str:
    """Each round's probe: mean, p50 and p90, and the largest of all."""

    def by_round(key: str) -> str:
        return ", ".join(f"{r[key]:.0f}" for r in rounds)

    return (
        f"the disk, probed after each arbiter run ({rounds[0]['appends']} appends): a record appended and synced "
        f"(fdatasync, as the evaluator ends an item) mean {by_round('mean_us')} µs, p50 {by_round('p50_us')} µs, "
        f"p90 {by_round('p90_us')} µs by round, largest {max(r['max_us'] for r in rounds):.0f} µs; part of every "
        f"dataset's figure above"
    )
