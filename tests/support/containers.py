"""Helpers of the container tests: podman as this machine runs it, the worker options that run
agents on the machine's own files (image ``rootfs:/``), and a look at the containers left.

Podman here is Debian's, with runc as its runtime and the engine settings of ``CONTAINERS_CONF``
(no default ulimits, cgroupfs): ``podman_settings`` writes that file, and ``worker_options`` gives
``arbiter worker`` the runtime. The agent runs as a user other than root, so the interpreter that
runs these tests, and the repository, must be readable by it: when one lives under a folder
closed to others (pyenv under /root), ``worker_options`` mounts a stand-in for that folder that
shows their trees alone, read-only, and nothing else of it; a tree under /tmp, which the
container's own /tmp hides, is mounted at its own path.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import paths
import pytest

CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\n'
RUNTIME = "runc"
ROOTFS_IMAGE = "rootfs:/"
SUBMISSION_LABEL = "arbiter.submission"


def podman_or_skip() -> str:
    found = shutil.which("podman")
    if found is None:
        pytest.skip("podman is not installed (.ci/run installs it: apt-get install podman runc)")
    return found


def podman_settings(folder: Path) -> dict[str, str]:
    """The environment podman needs here (its containers.conf, written into ``folder``)."""
    path = folder / "containers.conf"
    path.write_text(CONTAINERS_CONF, encoding="utf-8")
    return {"CONTAINERS_CONF": str(path)}


def _closed_ancestor(path: Path) -> Path | None:
    """The outermost folder on ``path`` that users other than its owner cannot pass through."""
    for folder in reversed(path.parents):
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def reachable_mounts(folder: Path) -> list[str]:
    """Mounts that show the programs these tests run (this interpreter's trees, the repository)
    to any user: for each folder closed to others above them, a stand-in holding only the way
    down to them, and the trees themselves, all read-only."""
    trees = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), paths.REPO.resolve()}
    opened: dict[Path, set[Path]] = {}
    options = []
    for tree in sorted(trees):
        if tree.is_relative_to("/tmp"):
            # The container's own /tmp hides the machine's: a tree there (a clean clone, its venv)
            # is shown again at its own path; one closed to others (mktemp -d makes it so) as a
            # stand-in open to all that holds its entries.
            if os.stat(tree).st_mode & stat.S_IXOTH:
                options.append(f"--container-option=--mount=type=bind,source={tree},destination={tree},readonly")
                continue
            stand_in = folder / f"stand-in-tree-{len(options)}"
            stand_in.mkdir(mode=0o755, parents=True)
            stand_in.chmod(0o755)
            options.append(f"--container-option=--mount=type=bind,source={stand_in},destination={tree},readonly")
            for entry in sorted(tree.iterdir()):
                target = tree / entry.name
                # where the entry is mounted, made in the stand-in (read-only in the container)
                (stand_in / entry.name).mkdir() if entry.is_dir() else (stand_in / entry.name).touch()
                options.append(f"--container-option=--mount=type=bind,source={entry},destination={target},readonly")
            continue
        closed = _closed_ancestor(tree)
        if closed is not None:
            opened.setdefault(closed, set()).add(closed / tree.relative_to(closed).parts[0])
    for index, (closed, insides) in enumerate(sorted(opened.items())):
        stand_in = folder / f"stand-in-{index}"
        for inside in insides:
            (stand_in / inside.name).mkdir(parents=True, exist_ok=True)
            (stand_in / inside.name).chmod(0o755)
        stand_in.chmod(0o755)
        options.append(f"--container-option=--mount=type=bind,source={stand_in},destination={closed},readonly")
        for inside in sorted(insides):
            options.append(f"--container-option=--mount=type=bind,source={inside},destination={inside},readonly")
    return options


def worker_options(folder: Path) -> list[str]:
    """``arbiter worker`` options for the podman backend here."""
    return ["--backend", "podman", "--container-runtime", RUNTIME, *reachable_mounts(folder)]


def open_to_all(path: Path) -> None:
    """Make ``path`` readable by the agent's user (a container sees a mounted folder as it is)."""
    for root, _, files in os.walk(path):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)


def containers_of(submission_id: str, env: dict[str, str]) -> list[str]:
    """The names of the containers (running or not) labelled with ``submission_id``."""
    listed = subprocess.run(
        ["podman", "ps", "--all", "--filter", f"label={SUBMISSION_LABEL}={submission_id}", "--format", "{{.Names}}"],
        capture_output=True, text=True, check=True, timeout=30, env={**os.environ, **env},
    )  # fmt: skip
    return listed.stdout.split()


def remove_containers_of(submission_ids: list[str], env: dict[str, str]) -> None:
    """Whatever a failed test left behind."""
    for submission_id in submission_ids:
        for name in containers_of(submission_id, env):
            removing = ["podman", "rm", "--force", name]
            subprocess.run(removing, capture_output=True, timeout=60, env={**os.environ, **env})


@pytest.fixture
def podman_env(tmp_path, monkeypatch) -> dict[str, str]:
    """Podman's settings for a test, in this process's environment (the workers it starts inherit
    them); the test is skipped where podman is not installed."""
    podman_or_skip()
    settings = podman_settings(tmp_path)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    return settings
