"""server/service/process_memory.py: the evaluator's process keeps the pages it frees for the next
step, measured in a process of its own (the page faults of a frame-sized step with glibc's
defaults, then with the thresholds applied), and an operator's own malloc settings win."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from arbiter.server.service.process_memory import MMAP_THRESHOLD, TRIM_THRESHOLD

# A step of an env with a 480×512×3 frame, as the evaluator's process sees it: the DIAMBRA mock's
# frame, its bytes, and a reply message holding them; then the same with the thresholds applied.
FRAME_STEPS = """
import json, os, resource, sys
import numpy as np
applied = None
if sys.argv[1] == "keep":
    from arbiter.server.service.process_memory import keep_freed_memory
    applied = keep_freed_memory()

def step(k):
    frame = np.ones((480, 512, 3), dtype=np.int8) * (k % 100)
    data = frame.tobytes()
    message = bytearray(len(data) + 64)
    message[64:] = data
    return len(message)

for k in range(20):
    step(k)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for k in range(200):
    step(k)
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 200
print(json.dumps({"applied": applied, "faults_per_step": faults}))
"""


def frame_steps(mode: str, **env: str) -> dict:
    # glibc's own defaults, whatever this shell set
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = subprocess.run([sys.executable, "-c", FRAME_STEPS, mode], capture_output=True, text=True, timeout=60,
                          check=True, env={**clean, **env})  # fmt: skip
    return json.loads(done.stdout)


glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")


@glibc_only
def test_the_evaluators_process_reuses_the_pages_of_its_last_step():
    default, kept = frame_steps("default"), frame_steps("keep")
    assert kept["applied"] == {"mmap_threshold": MMAP_THRESHOLD, "trim_threshold": TRIM_THRESHOLD}
    # glibc's defaults map and unmap (or trim) the frame-sized buffers at every step
    assert default["faults_per_step"] > 100, default
    assert kept["faults_per_step"] < 1, kept


@glibc_only
def test_an_operators_malloc_settings_are_left_alone():
    assert frame_steps("keep", MALLOC_TRIM_THRESHOLD_="131072")["applied"] is None
    assert frame_steps("keep", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=131072")["applied"] is None
    assert frame_steps("keep", GLIBC_TUNABLES="glibc.cpu.hwcaps=-AVX512F")["applied"] is not None
