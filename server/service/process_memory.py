"""The evaluator's process keeps the memory it frees for the next step.

Every step of an env with large observations allocates and frees buffers of the frame's size:
the engine's frame, the env's conversions, the reply's encoding (a DIAMBRA frame is 737 KB). With
glibc's defaults a buffer that size is mapped on allocation and unmapped on free, or taken from
the heap whose free top is given back to the system once it passes a threshold that glibc moves
as it goes; either way the next step faults every page back in. In the evaluator of a DIAMBRA
evaluation with frames through Redis that was 80 to 90 page faults a step, and 15–20 % of its CPU
time (scripts/bench_diambra.py --frames-through-redis).

Set once at the evaluator's start: blocks below ``MMAP_THRESHOLD`` come from the heap, and up to
``TRIM_THRESHOLD`` of free heap is kept, so a step reuses the pages of the last one. Fixed
values also stop glibc from moving the thresholds. The cost is memory the process keeps after a
peak (at most ``TRIM_THRESHOLD`` above what it uses). Thresholds the operator set (glibc's
``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_``, or ``glibc.malloc.*`` in
``GLIBC_TUNABLES``) are left alone; on a C library without a working ``mallopt`` (musl, macOS)
nothing is changed. (Under a preloaded jemalloc or tcmalloc, glibc's ``mallopt`` still answers
but no longer matters: harmless.)
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

# glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 16 * 1024 * 1024  # glibc accepts at most 32 MiB on 64-bit systems
TRIM_THRESHOLD = 64 * 1024 * 1024

OPERATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_freed_memory() -> dict[str, int] | None:
    """Apply the thresholds to this process; the values set, or None when nothing was changed."""
    if any(name in os.environ for name in OPERATOR_SETTINGS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success, 0 when it refuses a value (musl's stub refuses everything)
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
        return None
    if mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        log.debug("mallopt refused M_TRIM_THRESHOLD=%d", TRIM_THRESHOLD)
        return {"mmap_threshold": MMAP_THRESHOLD}
    return {"mmap_threshold": MMAP_THRESHOLD, "trim_threshold": TRIM_THRESHOLD}
