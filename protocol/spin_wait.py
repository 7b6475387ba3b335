"""Waiting for a reply by polling its socket for a moment before sleeping in the kernel.

A process that blocks on a socket is put to sleep, and the reply that arrives has to wake it: a
scheduler wake-up, which on a virtual machine (an idle vCPU halts, and waking it is an exit to
the hypervisor) costs tens of microseconds. A step through Redis wakes the agent, Redis and the
evaluator in turn, so these wake-ups, not Python, are most of what a fast env's remote step
costs. An agent waiting for its reply has nothing else to do: polling its socket for a short
window instead of sleeping removes its own wake-up. With the requester polling, a round trip
through redis-server takes a fraction of what it takes with both sides sleeping
(``scripts/bench_wire_floor.py`` measures both; the docs' performance log has the figures).

The evaluator polls too, for the next request, in a shorter window of its own
(``server/service/transport.py``): one that sleeps leaves its vCPU idle while a fast agent
decides, and the agent's request then has to wake that vCPU before Redis can hand it over.

Between two looks at its socket the poller gives its CPU away (``sched_yield``): the way back
often needs that very CPU. Writing to a socket or a pipe wakes the reader on the writer's CPU,
since the writer is expected to sleep next; a poller that kept its CPU would make Redis, and the
evaluator after it, wait for the end of its time slice whenever the kernel put them there.
Yielding lets them run at once, and costs a system call when nothing else waits. This matters
most where more processes take part than there are CPUs, as with MetaLC's runner and its fold's
process.

The window adapts: a reply that comes within it is a hit, and polling goes on only while most
recent replies are hits (an exponential average, updated from the time a reply took whether it
was polled for or slept on), so a side whose partner is slower than the window spends no CPU
for nothing. Polling needs a CPU to itself: it is off where this process may use fewer than two
(its affinity, or a container's CPU quota). ``ARBITER_SPIN_US`` sets the agent's window and
``ARBITER_EVALUATOR_SPIN_US`` the evaluator's (read by the command line); 0 turns polling off.
"""

from __future__ import annotations

import os
import select
import time
from pathlib import Path
from typing import Any

# Long enough to poll through the slower replies an agent still gets often: a step that ends an
# item (the item's record is synced before the reply) and a slower env's step. A reply the window
# misses costs the agent a wake-up, which on a virtual machine whose idle vCPUs halt costs more
# than polling through; a partner slower than the window still turns polling off (below).
DEFAULT_WINDOW_US = 2500
# How quickly the hit rate follows the replies (the weight of the newest), and the rate below
# which polling stops.
LEARNING_RATE = 1 / 16
MIN_HIT_RATE = 0.5
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
# Gives this process's CPU to whatever else waits for it (see the module's docstring).
yield_cpu = getattr(os, "sched_yield", lambda: None)


def usable_cpus() -> float:
    """The CPUs this process may run on: its affinity, capped by a cgroup v2 CPU quota (a
    container's ``--cpus``)."""
    try:
        cpus: float = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = float(os.cpu_count() or 1)
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, int(quota) / int(period))
    except (OSError, ValueError):
        pass
    return cpus


def polling_window(window_us: float) -> float:
    """``window_us`` in seconds where this process may poll; 0 where it has fewer than two CPUs."""
    if not window_us >= 0:
        raise ValueError(f"the polling window must be 0 or more microseconds, got {window_us!r}")
    return window_us / 1e6 if usable_cpus() >= 2 else 0.0


def window_from_environment(window_us: float | None = None) -> float:
    """The polling window in seconds: ``window_us`` if given, else ``ARBITER_SPIN_US``, else
    ``DEFAULT_WINDOW_US``; 0 where fewer than two CPUs are usable."""
    if window_us is None:
        raw = os.environ.get("ARBITER_SPIN_US", "").strip()
        try:
            window_us = float(raw) if raw else DEFAULT_WINDOW_US
        except ValueError:
            raise ValueError(f"ARBITER_SPIN_US must be a number of microseconds, got {raw!r}") from None
    return polling_window(window_us)


class SpinWait:
    """Reads a reply's bytes from a socket, polling it for up to ``window_s`` first while that
    pays (see the module's docstring). A waiter of ``protocol.redis_conn.Packets``."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self.hit_rate = 1.0  # replies that came within the window, recently: start by polling
        self.polled = 0  # waits for a reply spent polling (for tests and benchmarks)
        self.slept = 0  # waits for a reply left to the kernel
        self._socket: Any = None
        self._poll: Any = None

    @property
    def polling(self) -> bool:
        return self.hit_rate >= MIN_HIT_RATE

    def recv_into(self, sock: Any, buffer: bytearray, fresh: bool) -> int:
        """``sock.recv_into(buffer)``. ``fresh``: nothing of the reply has come yet, so this is
        the wait for the other side (polled for, and learnt from); the rest of a reply that has
        begun to arrive follows at once."""
        if not fresh or getattr(sock, "pending", _nothing_pending)():  # TLS: bytes already decrypted
            return sock.recv_into(buffer)
        clock = time.perf_counter
        started = clock()
        if self.hit_rate >= MIN_HIT_RATE:
            self.polled += 1
            poll = self._poll if sock is self._socket else self._poller(sock)
            give_up = started + self.window_s
            give_away = yield_cpu
            while not poll(0) and clock() < give_up:
                give_away()
        else:
            self.slept += 1
        size = sock.recv_into(buffer)
        hit = clock() - started <= self.window_s
        self.hit_rate += LEARNING_RATE * (hit - self.hit_rate)
        return size

    def _poller(self, sock: Any) -> Any:
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        self._socket, self._poll = sock, poller.poll
        return self._poll


def _nothing_pending() -> int:
    return 0
