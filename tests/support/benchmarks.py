"""Running a benchmark script of scripts/ as its users do, for the tests of its quick mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import paths

SCRIPTS = paths.REPO / "scripts"


def run_benchmark(script: str, *options: str, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``python scripts/<script> <options>`` in ``cwd``, its output captured unbuffered; it must exit 0
    (the assertion shows the end of both streams when it does not)."""
    completed = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *options],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert completed.returncode == 0, f"stdout:\n{completed.stdout[-4000:]}\nstderr:\n{completed.stderr[-4000:]}"
    return completed
