"""The machine a benchmark runs on, as its report names it: the processor, how long an idle vCPU
polls before it halts (on a Linux guest), the load, the checkout's revision and the packages'
versions (``machine_info``, ``machine_line``); and the share of the CPUs' time the hypervisor took
while the benchmark ran (``steal_share``, ``benchmark_time_line``)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


# On a Linux guest: how long an idle vCPU polls before it halts. Waking a process on a halted vCPU
# is an exit to the hypervisor, so this setting moves every figure of the wire (docs: Performance).
HALT_POLL_NS = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


def cpu_model() -> str:
    """The processor's name: Linux's ``model name`` (/proc/cpuinfo), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def guest_halt_poll_ns() -> int | None:
    """``HALT_POLL_NS``'s value, or None where the kernel has no such setting."""
    try:
        return int(HALT_POLL_NS.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


# Linux's count of the CPUs' time since boot, in clock ticks; its first line adds up every CPU.
PROC_STAT = Path("/proc/stat")


def cpu_ticks(stat: Path = PROC_STAT) -> list[int] | None:
    """The CPUs' time so far as ``[stolen, all]`` clock ticks. Stolen time ("steal") is time in
    which a vCPU had work and the hypervisor ran something else: on a shared host, what makes a
    run noisy. None where the kernel does not count it."""
    try:
        fields = stat.read_text(encoding="ascii", errors="replace").split("\n", 1)[0].split()
        # user, nice, system, idle, iowait, irq, softirq, steal; a guest's time is in user already
        ticks = [int(field) for field in fields[1:9]]
    except (OSError, ValueError):
        return None
    if fields[:1] != ["cpu"] or len(ticks) < 8:
        return None
    return [ticks[7], sum(ticks)]


def steal_share(since: list[int] | None, stat: Path = PROC_STAT) -> float | None:
    """The share of the CPUs' time the hypervisor took since ``cpu_ticks()`` gave ``since``; None
    where it is not counted, or no tick has passed."""
    now = cpu_ticks(stat)
    if since is None or now is None or now[1] <= since[1]:
        return None
    return (now[0] - since[0]) / (now[1] - since[1])


def benchmark_time_line(report: dict[str, Any]) -> str:
    """The benchmark's time and, where counted, the share of the CPUs' time the hypervisor took
    meanwhile (``report["steal_share"]``, from ``machine_info``'s ``cpu_ticks_start``)."""
    steal = report.get("steal_share")
    said = "" if steal is None else f"; the hypervisor took {steal:.1%} of the CPUs' time meanwhile (steal)"
    return f"benchmark time: {report['total_s']:.1f} s{said}"


def machine_info(*packages: str) -> dict[str, Any]:
    """The machine a benchmark ran on, the checkout's revision and the versions of ``packages``;
    called as the benchmark starts (its load average, and the CPUs' time counted so far)."""
    from importlib.metadata import version

    try:
        rev = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True,
                             timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return {
        "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "cpu_ticks_start": cpu_ticks(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "guest_halt_poll_ns": guest_halt_poll_ns(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "arbiter_rev": rev or "unknown",
        "packages": {name: version(name) for name in packages},
    }


def machine_line(machine: dict[str, Any]) -> str:
    packages = "".join(f", {name} {v}" for name, v in machine["packages"].items())
    # A report saved before the processor and the halt polling were noted has neither.
    about = [machine["cpu_model"]] if machine.get("cpu_model") else []
    if machine.get("guest_halt_poll_ns") is not None:
        about.append(f"guest halt polling {machine['guest_halt_poll_ns']} ns")
    cpus = f"{machine['cpus']} CPUs" + (f" ({'; '.join(about)})" if about else "")
    return (f"{cpus}, Python {machine['python']}{packages}, arbiter {machine['arbiter_rev']}; "
            f"load average at start {machine['loadavg_start']}")  # fmt: skip
