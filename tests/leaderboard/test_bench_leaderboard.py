"""scripts/bench_leaderboard.py at a small size: the folders it made are the ones its boards count
and rank, its figures and target verdicts agree with each other, its JSON mode prints JSON alone
(never a speed: the machine is shared)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import paths
import pytest

BENCH = paths.REPO / "scripts" / "bench_leaderboard.py"
COMPETITION = "bench-leaderboard"
PATHS = ("cli_recorded", "cli_rescored", "build_recorded", "build_rescored", "render_page", "cli_floor")


def bench(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, str(BENCH), *options], cwd=tmp_path, capture_output=True, text=True, timeout=150,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
    return done


def folders_made(root: Path) -> dict[str, object]:
    """What the results folders hold, read from their summary.json files."""
    summaries = [json.loads(path.read_text()) for path in sorted((root / COMPETITION).glob("*/summary.json"))]
    scored = [s for s in summaries if s["state"] == "SUCCESS" and not s["submission"]["debug"]]
    return {
        "folders": len(summaries),
        "debug": sum(1 for s in summaries if s["submission"]["debug"]),
        "interrupted": sum(1 for s in summaries if s["state"] == "INTERRUPTED"),
        "participants": len({s["submission"]["participant"] for s in summaries}),
        "ranked_participants": len({s["submission"]["participant"] for s in scored}),
        "ids": len({s["submission"]["id"] for s in summaries}),
        "sources": len({s["service_id"] for s in summaries}),
    }


@pytest.mark.timeout(180)
def test_the_benchmark_counts_and_ranks_the_folders_it_made(tmp_path: Path) -> None:
    results, out = tmp_path / "results", tmp_path / "bench.json"
    done = bench(tmp_path, "--submissions", "30", "--agents", "2", "--rounds", "1", "--results-root", str(results),
                 "--json", str(out))  # fmt: skip
    report = json.loads(out.read_text())
    found = folders_made(results)
    assert found["folders"] == found["ids"] == report["made"]["folders"] == 30
    assert found["sources"] == 2  # copies of the two real evaluations, each under an identity of its own
    assert found["participants"] == report["made"]["participants"] == 6  # N/5 by default
    assert found["debug"] == report["made"]["debug"] >= 1
    assert found["interrupted"] == report["made"]["interrupted"] >= 1
    assert found["ranked_participants"] == report["made"]["ranked_participants"]
    for path in ("recorded", "rescored"):
        counts = report["boards"][path]["counts"]
        assert counts == {"folders": 30, "ranked": found["ranked_participants"], "unranked": found["interrupted"],
                          "debug_left_out": found["debug"], "other_phases": 0, "baselines": 0}, path  # fmt: skip
        assert 0 <= report["boards"][path]["placed_by_time"] <= counts["ranked"]
    assert report["problems"] == []
    assert "checks: the boards count the folders made" in done.stdout

    figures = report["figures"]
    assert set(figures) == set(PATHS)
    for path in PATHS:
        (wall,) = figures[path]["wall_s"]["per_round"]
        assert wall > 0 and figures[path]["wall_s"]["median"] == pytest.approx(statistics.median([wall])), path
    for path in ("cli_recorded", "cli_rescored", "cli_floor"):
        (peak,) = figures[path]["peak_rss_mb"]["per_round"]
        assert peak > 0 and figures[path]["peak_rss_mb"]["max"] == peak, path

    # each target judged on its least favourable figure, and its verdict printed with it
    walls = [figures["cli_recorded"]["wall_s"]["max"], figures["cli_rescored"]["wall_s"]["max"]]
    peak = max(figures["cli_recorded"]["peak_rss_mb"]["max"], figures["cli_rescored"]["peak_rss_mb"]["max"])
    lines = [line for line in done.stdout.splitlines() if line.startswith("target ")]
    assert len(lines) == len(report["targets"]) == 3
    for target, judged, bound, line in zip(report["targets"], [*walls, peak], [10.0, 60.0, 500.0], lines, strict=True):
        assert target["judged"] == pytest.approx(judged) and target["met"] is (judged <= bound)
        assert "at 1,000 submissions (measured at 30)" in line
        assert line.split(": ", 1)[1].startswith("met" if target["met"] else "NOT met"), line
    assert "arbiter leaderboard, rescored (--from-records)" in done.stdout


@pytest.mark.timeout(120)
def test_the_json_option_alone_prints_the_figures_as_json(tmp_path: Path) -> None:
    done = bench(tmp_path, "--submissions", "10", "--agents", "1", "--episodes", "2", "--rounds", "1", "--json")
    report = json.loads(done.stdout)  # nothing but the JSON on stdout; progress went to stderr
    assert report["made"]["folders"] == report["boards"]["recorded"]["counts"]["folders"] == 10
    assert report["boards"]["rescored"]["counts"]["ranked"] == report["made"]["ranked_participants"] == 2
    assert "bench: round 1" in done.stderr
    assert report["results_kept"] is False and not Path(report["results_root"]).exists()  # removed at exit


def test_bad_options_are_refused_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    for options, message in (
        (["--submissions", "5"], "--submissions must be at least 10"),
        (["--participants", "0"], "--participants must be 1 to --submissions"),
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--results-root", str(tmp_path / "full")], "is not empty: give a new or empty folder"),
    ):
        refused = subprocess.run([sys.executable, str(BENCH), *options], cwd=tmp_path, capture_output=True,
                                 text=True, timeout=60)  # fmt: skip
        assert refused.returncode == 2 and message in refused.stderr, (options, refused.stderr)
    assert [p.name for p in tmp_path.iterdir()] == ["full"] and (tmp_path / "full" / "keep.txt").read_text() == "mine"
