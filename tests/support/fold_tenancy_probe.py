"""Run inside a container of its own (tests/client/test_fold_tenancy.py): what a fold leaves, and
what FoldTenancy clears of it. Prints one JSON object."""

import json
import os
import subprocess
import sys

from arbiter.client import fold_tenancy
from arbiter.client.fold_tenancy import FoldTenancy

scratch = os.environ["ARBITER_SOLE_TENANT"]
with open(os.path.join(scratch, "kept"), "w") as handle:  # there before the runner: left alone
    handle.write("before")
older = subprocess.Popen(["sleep", "60"])  # started before the fold: left alone
before = sorted(os.listdir(scratch))  # with the folders the test mounts there, if any
tenancy = FoldTenancy()
tenancy.fold_begins()
# The fold: a process in a session of its own, and the test curves at an absolute path.
stray = subprocess.Popen(["setsid", "sleep", "60"])
os.makedirs(os.path.join(scratch, "leak"))
with open(os.path.join(scratch, "leak", "curves.json"), "w") as handle:
    handle.write("[0.1, 0.2]")
os.symlink("/etc/hostname", os.path.join(scratch, "link"))
started = fold_tenancy._started_at(stray.pid)
tenancy.fold_ended()
print(
    json.dumps(
        {
            "stray_started": started is not None,
            "stray_ended": stray.poll() is not None,
            "older_alive": older.poll() is None,
            "scratch": sorted(os.listdir(scratch)),
            "scratch_before": before,
            "runner_pid": os.getpid(),
        }
    )
)
older.kill()
older.wait()
sys.exit(0)
