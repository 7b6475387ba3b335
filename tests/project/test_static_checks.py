"""The house is checked with the tests: ruff over the whole tree, and mypy over the wire
(protocol/), the evaluation core (server/core/) and the format seam (server/formats/base.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import paths
import pytest

# What mypy checks: where a wrong type would cost the most (every request goes through protocol/,
# every evaluation through the core, every format through the seam).
TYPED = ["arbiter.protocol", "arbiter.server.core", "arbiter.server.formats.base"]


def test_ruff_finds_nothing() -> None:
    if shutil.which("ruff") is None:
        pytest.skip("ruff is not installed (it is in the dev extra: pip install -e '.[dev]')")
    done = subprocess.run(["ruff", "check", "."], cwd=paths.REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(300)
def test_mypy_finds_nothing_in_the_wire_the_core_and_the_format_seam(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (it is in the dev extra: pip install -e '.[dev]')")
    # The package maps protocol/, client/ and server/ under arbiter.* (setup.py), which an editable
    # install does with an import hook mypy cannot follow: a tree of links gives it the same names.
    root = tmp_path / "arbiter"
    root.mkdir()
    (root / "__init__.py").write_text("")
    for part in ("protocol", "client", "server"):
        os.symlink(paths.REPO / part, root / part)
    packages = [arg for name in TYPED for arg in ("-p", name)]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(paths.REPO / "pyproject.toml"), *packages],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
