"""client/fold_tenancy.py in a real podman container running as the agent's user, its /tmp a
tmpfs of its own, as arbiter's container backend runs a submission: when a fold ends, what it
left (a process in a session of its own, files at an absolute path) is gone, and what was there
before the fold (a process, a file) is not. Outside such a container nothing is touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import paths
import pytest
from containers import RUNTIME, reachable_mounts

from arbiter.client.fold_tenancy import FoldTenancy

PROBE = paths.SUPPORT / "fold_tenancy_probe.py"


@pytest.mark.timeout(120)
def test_a_fold_leaves_nothing_in_a_container_of_its_own(podman_env, tmp_path):
    mounts = [option.removeprefix("--container-option=") for option in reachable_mounts(tmp_path)]
    probe = tmp_path / "probe"
    probe.mkdir(mode=0o755)
    probe.chmod(0o755)
    (probe / PROBE.name).write_text(PROBE.read_text())
    (probe / PROBE.name).chmod(0o644)
    done = subprocess.run(
        ["podman", "run", "--rm", "--runtime", RUNTIME, "--network", "none",
         "--user", "10001:10001", "--mount", "type=tmpfs,destination=/tmp,tmpfs-mode=1777,notmpcopyup",
         "--mount", f"type=bind,source={probe},destination=/probe,readonly",
         "--env", "ARBITER_SOLE_TENANT=/tmp", "--env", "HOME=/tmp", *mounts,
         "--rootfs", "/:O", sys.executable, f"/probe/{PROBE.name}"],
        capture_output=True, text=True, timeout=100, env={**os.environ, **podman_env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["stray_started"] and seen["stray_ended"], done.stderr
    assert seen["older_alive"]
    assert "kept" in seen["scratch_before"] and seen["scratch"] == seen["scratch_before"]  # leak/ and link gone


def test_outside_a_container_of_its_own_nothing_is_touched(tmp_path):
    """Without ARBITER_SOLE_TENANT (a participant's machine) no process and no file is touched."""
    (tmp_path / "curves.json").write_text("[]")
    tenancy = FoldTenancy(environ={})
    tenancy.fold_begins()
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        tenancy.fold_ended()
        assert stray.poll() is None and (tmp_path / "curves.json").exists() and not tenancy.active
    finally:
        stray.kill()
        stray.wait()
