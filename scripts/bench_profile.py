"""Where a benchmarked process spends its time: run it under ``py-spy record`` (raw collapsed
stacks, idle frames included so that waiting for Redis shows next to CPU work) and rank its
functions by the share of samples they are on the stack (inclusive) and on top of it (self)."""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

RATE_HZ = 1000
# "func (path/to/file.py:123)" -> "func (file.py)": one row per function, whatever the line
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]*?)(?::\d+)?\)$")


def py_spy() -> str | None:
    return shutil.which("py-spy")


def wrap(argv: list[str], out: Path) -> list[str]:
    """``argv`` run under py-spy, which writes its samples to ``out`` when the process exits."""
    binary = py_spy()
    if binary is None:
        raise RuntimeError("py-spy is not installed (pip install py-spy)")
    return [binary, "record", "--format", "raw", "--idle", "--rate", str(RATE_HZ), "--nonblocking", "-o", str(out),
            "--", *argv]  # fmt: skip


def frame_name(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    return f"{match['func']} ({Path(match['file']).name})"


def rank(collapsed: Path, top: int = 15) -> dict[str, Any]:
    """Shares of the samples in ``collapsed`` (py-spy's raw format: ``frame;frame;... count``)."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        # the first frame is the thread ("process 123:\"python\"" or "<module>"); keep functions only
        frames = [frame_name(f) for f in stack.split(";") if "(" in f]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
    return {
        "samples": total,
        "self": [[name, n / total] for name, n in own.most_common(top)] if total else [],
        "inclusive": [[name, n / total] for name, n in inclusive.most_common(top)] if total else [],
    }


def print_ranking(label: str, ranking: dict[str, Any]) -> None:
    print(f"{label}: {ranking['samples']} samples at {RATE_HZ} Hz (idle included)")
    rows = max(len(ranking["self"]), len(ranking["inclusive"]))
    print(f"  {'self %':>6}  {'function (file)':<58} {'incl. %':>7}  function (file)")
    for i in range(rows):
        own = ranking["self"][i] if i < len(ranking["self"]) else ["", 0.0]
        inc = ranking["inclusive"][i] if i < len(ranking["inclusive"]) else ["", 0.0]
        print(f"  {own[1] * 100:>6.1f}  {own[0][:58]:<58} {inc[1] * 100:>7.1f}  {inc[0][:70]}")
