"""What an agent in its podman container can reach, through a real worker: its own Redis through
the mounted socket (flatland's unmodified client included, over the socket bridge on its own
loopback), and nothing else: no TCP to the machine's Redis, no test data, no other submission's
results, no write outside its scratch folder. An agent past its memory limit is killed, and the
evaluation says so (F19).

The test data and the results root are made readable by every user, in a folder outside /tmp
(the container has its own /tmp): what keeps the agent from them is arbiter, not their modes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import paths
import pytest
import redis
from containers import ROOTFS_IMAGE, containers_of, open_to_all, worker_options
from harness import read_summary
from hosting_farm import REPO, competition_file

from arbiter.server.hosting.farm import submit
from arbiter.server.hosting.submissions import AGENT_FAULT, FAILED, FINISHED, SubmissionStore

LEGACY_AGENT = paths.EXAMPLES / "legacy_starter_kit_agent.py"
PROBE = paths.SUPPORT / "container_probe_main.py"


@pytest.fixture
def exposed() -> Path:
    """A folder every user may read, outside /tmp."""
    base = Path(tempfile.mkdtemp(prefix="arbiter-isolation-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.timeout(120)
def test_an_agent_reaches_its_own_redis_alone_and_dies_at_its_memory_limit(
    redis_server, redis_conn: redis.Redis, tiny_tests, tmp_path, exposed: Path, podman_env
) -> None:
    tests = exposed / "tests"
    shutil.copytree(tiny_tests, tests)
    results_root = exposed / "results"
    other_results = results_root / "farm" / "sub-of-someone-else"
    other_results.mkdir(parents=True)
    (other_results / "summary.json").write_text('{"state": "SUCCESS", "score": {"primary": 0.5}}\n')
    # The participant's folder: the probe, and the unmodified flatland starter kit with its own
    # copy of the envs (as an image that bundles public envs would hold them).
    workdir = exposed / "submission"
    workdir.mkdir()
    shutil.copy(PROBE, workdir)
    shutil.copy(LEGACY_AGENT, workdir)
    shutil.copytree(tiny_tests, workdir / "envs")
    for folder in (tests, results_root, workdir):
        open_to_all(folder)
    competition = competition_file(tmp_path, str(tests))
    tight = competition_file(tmp_path, str(tests), name="tight", hosting='memory = "128m"')
    legacy = f"AICROWD_TESTS_FOLDER=/submission/envs exec {sys.executable} legacy_starter_kit_agent.py"
    probe = [
        sys.executable, "container_probe_main.py",
        "--tcp", f"127.0.0.1:{redis_server.port}",
        "--read", str(tests), str(other_results), str(results_root),
        "--write", "/", "/submission", "/var/tmp", "/run", "/tmp",
        "--", "sh", "-c", legacy,
    ]  # fmt: skip
    looking = submit(
        redis_conn, competition=competition, participant="eve", agent=probe, workdir=str(workdir), image=ROOTFS_IMAGE
    )
    hog = [sys.executable, "-c", "import time; hog = bytearray(1 << 30); time.sleep(60)"]
    greedy = submit(redis_conn, competition=tight, participant="eve", agent=hog, image=ROOTFS_IMAGE)

    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        worker = subprocess.run(
            [sys.executable, "-m", "arbiter.server.cli", "worker", "--redis-url", redis_server.url,
             "--results-root", str(results_root), "--burst", *worker_options(tmp_path)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=100,
        )  # fmt: skip
    output = log_path.read_text()
    assert worker.returncode == 0, output[-3000:]

    store = SubmissionStore(redis_conn)
    played = store.get(looking.id)
    assert played.state == FINISHED, f"{played.cause}\n{output[-3000:]}"
    summary = read_summary(played.results)
    assert summary["state"] == "SUCCESS" and summary["episodes"]["finished"] == 3, summary["termination_cause"]
    printed = Path(played.results, "agent.log").read_text(encoding="utf-8")  # the agent's output, not the worker's
    assert "PROBE " not in output
    (line,) = [line for line in printed.splitlines() if line.startswith("PROBE ")]
    seen = json.loads(line[len("PROBE ") :])
    assert seen["uid"] == 10001
    assert seen["redis_url"] == "/run/arbiter/redis.sock?db=0"
    assert seen["tcp"][f"127.0.0.1:{redis_server.port}"].startswith("refused"), "the machine's Redis is not reachable"
    for path in (tests, other_results, results_root):
        assert seen["read"][str(path)].startswith(("refused", "nothing there")), (path, seen["read"][str(path)])
    assert seen["write"] == {
        "/": "refused: Read-only file system",
        "/submission": "refused: Read-only file system",
        "/var/tmp": "refused: Read-only file system",
        "/run": "refused: Read-only file system",
        "/tmp": "written",
    }
    assert not (workdir / "probe-was-here").exists()

    killed = store.get(greedy.id)
    assert killed.state == FAILED and killed.fault == AGENT_FAULT
    assert "memory limit of 128m" in killed.cause, killed.cause
    assert read_summary(killed.results)["termination_cause"] == killed.cause
    assert containers_of(looking.id, podman_env) == containers_of(greedy.id, podman_env) == []
