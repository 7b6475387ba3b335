"""What one write costs the process that makes it, by what the reader at the other end is doing:
the price of every hop on a remote step, paid once per process it wakes (bench_wire_floor.py
prints it under its round trips).

A writer whose reader sleeps in ``recv`` wakes it inside its own ``send``: on a VM, waking a
vCPU that has halted is an exit to the hypervisor, and the writer waits for it. A reader that
polls is not asleep, and the same write only copies its bytes. Each case is measured on a
socket pair, the writer and the reader pinned to CPUs of their own (or to the same one), the
reader given time to fall asleep again before every write.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from dataclasses import dataclass

from figures import spread

SETTLE_S = 50e-6  # after each exchange: long enough for a sleeping reader to be back in recv


@dataclass(frozen=True)
class Case:
    name: str  # as printed
    same_cpu: bool  # the reader on the writer's CPU
    reader_polls: bool  # the reader never sleeps: nothing to wake


CASES = (
    Case("asleep on another CPU", same_cpu=False, reader_polls=False),
    Case("asleep on the writer's CPU", same_cpu=True, reader_polls=False),
    Case("polling on another CPU", same_cpu=False, reader_polls=True),
)


def cpus_for_pinning() -> tuple[int, int] | None:
    """Two CPUs this process may run on, or None where a case cannot be pinned (fewer than two
    CPUs, or no ``sched_setaffinity`` on this platform)."""
    if not hasattr(os, "sched_setaffinity") or not hasattr(os, "fork"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    return (allowed[0], allowed[1]) if len(allowed) >= 2 else None


def _reader(sock: socket.socket, cpu: int, polls: bool, writes: int) -> None:
    os.sched_setaffinity(0, {cpu})
    sock.setblocking(not polls)
    for _ in range(writes):
        while True:
            try:
                sock.recv(16)
                break
            except BlockingIOError:
                continue
        sock.send(b"r")


def writer_cost_us(case: Case, writes: int, cpus: tuple[int, int]) -> float:
    """The median time of the writer's ``send`` (µs) over ``writes`` one-byte writes."""
    writer_cpu, other_cpu = cpus
    allowed = os.sched_getaffinity(0)
    mine, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the reader; it leaves without the parent's cleanup
        status = 1
        try:
            mine.close()
            _reader(theirs, writer_cpu if case.same_cpu else other_cpu, case.reader_polls, writes)
            status = 0
        finally:
            os._exit(status)
    theirs.close()
    costs: list[float] = []
    try:
        os.sched_setaffinity(0, {writer_cpu})
        clock = time.perf_counter
        for _ in range(writes):
            started = clock()
            mine.send(b"w")
            costs.append(clock() - started)
            mine.recv(16)
            settle_until = clock() + SETTLE_S
            while clock() < settle_until:
                pass
    finally:
        os.sched_setaffinity(0, allowed)
        mine.close()
        _, status = os.waitpid(pid, 0)
    if status != 0:
        raise RuntimeError(f"wake cost, {case.name}: the reader failed (wait status {status})")
    return statistics.median(costs) * 1e6


def report(writes: int, rounds: int) -> list[str]:
    """The printed lines: each case's median over ``rounds`` of its writes' median, in µs."""
    cpus = cpus_for_pinning()
    if cpus is None:
        return ["What a write costs its writer: not measured here (it takes two CPUs and sched_setaffinity)."]
    costs = {case.name: [writer_cost_us(case, writes, cpus) for _ in range(rounds)] for case in CASES}
    lines = [
        f"What a write costs its writer, by what the reader does — CPUs {cpus[0]} and {cpus[1]}, "
        f"{writes} one-byte writes per case and round, send() p50, median [min–max] over rounds:",
        f"{'reader':<27} {'µs':>6}",
    ]
    for name, values in costs.items():
        cost = spread(values)
        lines.append(f"{name:<27} {cost['median']:6.1f} [{cost['min']:.1f}–{cost['max']:.1f}]")
    return lines
