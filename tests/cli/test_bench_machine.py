"""The machine line every benchmark prints (scripts/harness.py): besides the CPUs, Python and the
checkout, the processor's name and, on a Linux guest, how long an idle vCPU polls before it halts,
which sets what waking a process costs there and so every figure of the wire."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import paths
import pytest

CPUINFO = Path("/proc/cpuinfo")


@pytest.fixture(scope="module")
def harness():
    """scripts/harness.py under a name of its own: the tests' support folder has a harness too."""
    scripts = str(paths.REPO / "scripts")
    spec = importlib.util.spec_from_file_location("bench_harness", f"{scripts}/harness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    sys.path.insert(0, scripts)  # for the figures module it imports
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(scripts)
    return module


def model_names() -> list[str]:
    if not CPUINFO.exists():
        return []
    return [
        line.partition(":")[2].strip()
        for line in CPUINFO.read_text(encoding="utf-8", errors="replace").splitlines()
        if line.startswith("model name")
    ]


@pytest.mark.timeout(30)
def test_the_machine_line_names_the_processor_and_the_guests_halt_polling(harness) -> None:
    machine = harness.machine_info()
    names = model_names()
    if names:
        assert machine["cpu_model"] == names[0]
    else:
        assert machine["cpu_model"]  # what the platform module says, or "unknown"
    line = harness.machine_line(machine)
    assert line.startswith(f"{machine['cpus']} CPUs ({machine['cpu_model']}")
    if harness.HALT_POLL_NS.exists():
        polled_ns = int(harness.HALT_POLL_NS.read_text().strip())
        assert machine["guest_halt_poll_ns"] == polled_ns
        assert f"; guest halt polling {polled_ns} ns)" in line
    else:
        assert machine["guest_halt_poll_ns"] is None
        assert "halt polling" not in line


@pytest.mark.timeout(30)
def test_a_report_saved_without_them_still_prints_its_machine_line(harness) -> None:
    saved = {"cpus": 2, "python": "3.11.7", "arbiter_rev": "abc1234", "loadavg_start": "0.10 0.20 0.30",
             "packages": {"gymnasium": "1.4.0"}}  # fmt: skip
    assert harness.machine_line(saved) == (
        "2 CPUs, Python 3.11.7, gymnasium 1.4.0, arbiter abc1234; load average at start 0.10 0.20 0.30"
    )
    line = harness.machine_line({**saved, "cpu_model": "Some CPU", "guest_halt_poll_ns": 200000})
    assert line.startswith("2 CPUs (Some CPU; guest halt polling 200000 ns), Python 3.11.7")
