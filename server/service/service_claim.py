"""One evaluator per service id on a Redis.

Two evaluators serving one service id on one Redis would take each other's requests, and the
second would clear the first's lists as it started (an ``arbiter serve --resume`` left on the
default Redis and service id, on a machine where another run used them). So an evaluator claims
its service id before it touches anything: a key of its own (``keys.evaluator_key``), set only
where none is, naming its holder (host, pid namespace, pid, when it started), on a lease that a
thread of its own renews. Another evaluator that finds the claim held waits at most one lease
for it to run out, then is refused with who holds it.

A holder killed with SIGKILL leaves its claim until the lease runs out; an evaluator started
again where it ran (an orchestrator's ``--resume`` on the same machine) sees its process gone and
takes the claim at once. A holder held up past its lease (a paused VM) may find the claim
another's when it wakes: it stops, INTERRUPTED, and leaves the service id to the other.

Participants' Redis users (service/acl.py) cannot reach the key.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

import redis

from arbiter.protocol import keys
from arbiter.protocol.errors import ConfigError
from arbiter.protocol.redis_conn import connect
from arbiter.server.service.redis_calls import OutageRidingCalls

log = logging.getLogger(__name__)

CLAIM_LEASE_S = 5.0  # how long a claim outlives its holder's last renewal
RENEW_EVERY_S = 1.0  # well inside the lease: a renewal late by a few seconds loses nothing
TAKE_POLL_S = 0.05  # while a claim is held: how often it is asked again

# Renew our own claim; take it again when it is gone (a Redis restarted without its data);
# 0 when another holds it.
_RENEW = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if not held then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""
# Replace a claim whose holder is known dead (exactly that value), or give up our own.
_REPLACE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then return redis.call('DEL', KEYS[1]) end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""


def _pid_namespace() -> str:
    """Which pids this process sees: a pid means the same process only within one namespace."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class ServiceClaim:
    def __init__(self, redis_url: str, service_id: str, *, lease_s: float | None = None):
        self.redis_url = redis_url
        self.service_id = service_id
        self.key = keys.evaluator_key(service_id)
        self.lease_ms = max(1, round((CLAIM_LEASE_S if lease_s is None else lease_s) * 1000))
        self.renew_every_s = min(RENEW_EVERY_S, self.lease_ms / 4000)
        self.holder = json.dumps(
            {
                "host": socket.gethostname(),
                "pids": _pid_namespace(),
                "pid": os.getpid(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "token": uuid.uuid4().hex,
            },
            sort_keys=True,
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._redis: redis.Redis | None = None
        self.held = False

    def take(self, calls: OutageRidingCalls) -> None:
        """Claim the service id on the evaluator's connection (``calls``, which rides out a Redis
        not up yet); ``ConfigError`` naming the holder when another evaluator keeps it."""
        call, client = calls.riding_out, calls.redis
        give_up = time.monotonic() + self.lease_ms / 1000 + self.renew_every_s
        while True:
            if call(lambda: client.set(self.key, self.holder, nx=True, px=self.lease_ms)):
                self.held = True
                return
            held = call(lambda: client.get(self.key))
            if held is None:
                continue  # its lease ran out just now
            if self._holder_dead(held) and call(functools.partial(self._replace, client, held)):
                log.info("service id %s: took the claim of an evaluator that is gone", self.service_id)
                self.held = True
                return
            if time.monotonic() >= give_up:
                raise ConfigError(
                    f"another evaluator is serving service id {self.service_id!r} on this Redis "
                    f"({describe(held)}): give this one another --service-id or Redis, or stop that one"
                )
            time.sleep(TAKE_POLL_S)

    def _replace(self, client: redis.Redis, held: bytes) -> bool:
        """Take over the claim ``held`` (and only it), its holder dead."""
        return bool(client.eval(_REPLACE, 1, self.key, held, self.holder, self.lease_ms))

    def _holder_dead(self, held: bytes) -> bool:
        """Whether the holder is a process of this machine's that has ended (one elsewhere can
        only be waited out)."""
        try:
            holder = json.loads(held)
            pid = int(holder["pid"])
            namespace = holder["pids"]
            here = holder["host"] == socket.gethostname() and bool(namespace) and namespace == _pid_namespace()
        except (ValueError, KeyError, TypeError):
            return False
        return here and pid != os.getpid() and not _process_alive(pid)

    def keep(self, on_lost: Callable[[str], None]) -> None:
        """Renew the claim until ``release``, in a thread of its own on a connection of its own;
        ``on_lost(cause)`` once, should another evaluator hold it."""
        self._redis = connect(self.redis_url, socket_timeout_s=self.renew_every_s * 2)
        self._thread = threading.Thread(target=self._renew, args=(on_lost,), name="service-claim", daemon=True)
        self._thread.start()

    def _renew(self, on_lost: Callable[[str], None]) -> None:
        assert self._redis is not None
        while not self._stop.wait(self.renew_every_s):
            try:
                if self._redis.eval(_RENEW, 1, self.key, self.holder, self.lease_ms):
                    continue
                held = self._redis.get(self.key)
            except redis.RedisError as exc:  # an outage: the evaluator rides it out, and so does the claim
                log.debug("the service id's claim was not renewed: %s", exc)
                continue
            self.held = False
            on_lost(
                f"another evaluator took over service id {self.service_id!r} on this Redis while this one was held "
                f"up past its claim ({describe(held)})"
            )
            return

    def release(self) -> None:
        """Stop renewing and give the claim up, if it is still this evaluator's."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.renew_every_s * 3)
        if self.held:
            client = self._redis or connect(self.redis_url, socket_timeout_s=self.renew_every_s * 2)
            try:
                client.eval(_REPLACE, 1, self.key, self.holder, "", 0)
            except redis.RedisError as exc:  # it runs out with its lease
                log.debug("the service id's claim was not given up: %s", exc)
            client.close()
        elif self._redis is not None:
            self._redis.close()
        self.held = False
        self._redis = None


def describe(held: bytes | None) -> str:
    """Who holds a claim, in words."""
    try:
        holder = json.loads(held or b"")
        return f"pid {holder['pid']} on {holder['host']}, since {holder['since']}"
    except (ValueError, KeyError, TypeError):
        return "an evaluator arbiter cannot name"
