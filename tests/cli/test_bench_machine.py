"""The machine line every benchmark prints (scripts/machine.py, through scripts/harness.py):
besides the CPUs, Python and the checkout, the processor's name and, on a Linux guest, how long an
idle vCPU polls before it halts, which sets what waking a process costs there and so every figure
of the wire; and the share of the CPUs' time the hypervisor took while a benchmark ran."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import paths
import pytest

CPUINFO = Path("/proc/cpuinfo")


@pytest.fixture(scope="module")
def bench_machine():
    """scripts/machine.py, which every benchmark's harness takes its machine line from."""
    spec = importlib.util.spec_from_file_location("bench_machine", paths.REPO / "scripts" / "machine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
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
def test_the_machine_line_names_the_processor_and_the_guests_halt_polling(bench_machine) -> None:
    machine = bench_machine.machine_info()
    names = model_names()
    if names:
        assert machine["cpu_model"] == names[0]
    else:
        assert machine["cpu_model"]  # what the platform module says, or "unknown"
    line = bench_machine.machine_line(machine)
    assert line.startswith(f"{machine['cpus']} CPUs ({machine['cpu_model']}")
    if bench_machine.HALT_POLL_NS.exists():
        polled_ns = int(bench_machine.HALT_POLL_NS.read_text().strip())
        assert machine["guest_halt_poll_ns"] == polled_ns
        assert f"; guest halt polling {polled_ns} ns)" in line
    else:
        assert machine["guest_halt_poll_ns"] is None
        assert "halt polling" not in line


@pytest.mark.timeout(30)
def test_a_report_saved_without_them_still_prints_its_machine_line(bench_machine) -> None:
    saved = {"cpus": 2, "python": "3.11.7", "arbiter_rev": "abc1234", "loadavg_start": "0.10 0.20 0.30",
             "packages": {"gymnasium": "1.4.0"}}  # fmt: skip
    assert bench_machine.machine_line(saved) == (
        "2 CPUs, Python 3.11.7, gymnasium 1.4.0, arbiter abc1234; load average at start 0.10 0.20 0.30"
    )
    line = bench_machine.machine_line({**saved, "cpu_model": "Some CPU", "guest_halt_poll_ns": 200000})
    assert line.startswith("2 CPUs (Some CPU; guest halt polling 200000 ns), Python 3.11.7")


def stat_file(folder: Path, name: str, first_line: str) -> Path:
    path = folder / name
    path.write_text(f"{first_line}\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 12345\n", encoding="ascii")
    return path


@pytest.mark.timeout(30)
def test_the_hypervisors_share_of_the_cpus_time_is_read_from_the_kernels_counts(bench_machine, tmp_path) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice: a guest's time is in user already
    before = stat_file(tmp_path, "before", "cpu  1000 10 300 5000 40 0 50 100 70 0")
    after = stat_file(tmp_path, "after", "cpu  1600 10 500 5800 40 0 50 400 90 0")
    assert bench_machine.cpu_ticks(before) == [100, 6500]
    since = bench_machine.cpu_ticks(before)
    assert bench_machine.steal_share(since, after) == pytest.approx(300 / 1900)  # 300 of 8,400 - 6,500 ticks
    assert bench_machine.steal_share(since, before) is None  # no tick has passed
    assert bench_machine.steal_share(None, after) is None
    for name, line in (("older", "cpu  1000 10 300 5000"), ("other", "intr 1 2 3 4 5 6 7 8 9"),
                       ("junk", "cpu  1000 ten 300 5000 40 0 50 100")):  # fmt: skip
        assert bench_machine.cpu_ticks(stat_file(tmp_path, name, line)) is None, line
    assert bench_machine.cpu_ticks(tmp_path / "missing") is None
    assert bench_machine.benchmark_time_line({"total_s": 64.23, "steal_share": 300 / 1800}) == (
        "benchmark time: 64.2 s; the hypervisor took 16.7% of the CPUs' time meanwhile (steal)"
    )
    assert bench_machine.benchmark_time_line({"total_s": 64.23, "steal_share": None}) == "benchmark time: 64.2 s"


@pytest.mark.timeout(30)
def test_a_benchmark_notes_the_kernels_counts_as_it_starts(bench_machine) -> None:
    ticks = bench_machine.machine_info()["cpu_ticks_start"]
    if not bench_machine.PROC_STAT.exists():
        assert ticks is None
        return
    stolen, every = ticks
    assert 0 <= stolen <= every
    share = bench_machine.steal_share(ticks)
    assert share is None or 0.0 <= share <= 1.0
