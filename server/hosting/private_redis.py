"""The Redis of one hosted evaluation attempt, started by the work-horse that evaluates it.

The farm's Redis holds the queue and the submissions; no agent ever gets its address. Each
attempt gets a redis-server of its own instead: the evaluator connects as its default user
(a password of its own), the agent as the participant's ACL user (server/service/acl.py: its own
keys, three commands) with a password drawn for this attempt alone. The server listens on a unix
socket only, in a folder a container mounts (containers.py); its memory is bounded by the
competition's ``[hosting] redis_memory``, past which writes are refused, never evicted: an agent
that floods it fills its own evaluation's Redis, no other's, and is stopped for it (``full``:
the evaluation cannot go on in a Redis that refuses its writes). It stops with the evaluation and
cannot outlive its work-horse (``die_with_parent``), however the horse ends. Its folder is named
after the process that started it (the horse): the folder a killed horse's Redis leaves behind
is removed once that process has ended, by the worker as soon as it has reaped its horse, or by
the next attempt on the machine when the worker was lost too (``remove_abandoned``).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import redis

from arbiter.protocol.starter_folders import abandoned, starter_of, starter_prefix
from arbiter.server.cli.embedded_redis import SHARED_SOCKET_FOLDER, UNIX_SOCKET_NAME, EmbeddedRedis
from arbiter.server.service.acl import config_line, participant_acl

log = logging.getLogger(__name__)

PASSWORD_BYTES = 24
FOLDER_PREFIX = "arbiter-evaluation-redis-"
# A folder whose name does not say which process started it, younger than this, may belong to
# a Redis still starting (its socket not there yet).
ABANDONED_AFTER_S = 120.0
CHECK_TIMEOUT_S = 1.0  # a look at the server's memory that takes longer says nothing
# Full: past this share of its bound. Redis refuses a write that would take it past the bound
# (counting the write's own bytes as they arrive), so a server short of the bound by less than
# a reply already refuses the evaluator's replies; an evaluation itself uses a few megabytes.
FULL_SHARE = 0.9


class PrivateRedis:
    """``with PrivateRedis(service_id, memory_bytes) as private:`` the evaluator uses
    ``private.evaluator_url``, the agent ``private.agent_url()``."""

    def __init__(self, service_id: str, memory_bytes: int, memory_text: str | None = None):
        """``memory_text``: the bound as the competition file writes it, for the messages."""
        self.service_id = service_id
        memory_text = memory_text or f"{memory_bytes} bytes"
        # The evaluation's cause when the agent filled it (``full``).
        self.full_cause = (
            f"the agent filled its evaluation's Redis (past {FULL_SHARE:.0%} of its bound of {memory_text}, "
            "[hosting] redis_memory), which then refuses the evaluator's writes: the evaluation cannot go on"
        )
        self._watcher: redis.Redis | None = None
        self.participant_user = f"participant-{service_id}"
        self.participant_password = secrets.token_hex(PASSWORD_BYTES)
        rule = participant_acl(service_id, self.participant_password, self.participant_user)
        self.server = EmbeddedRedis(
            password=secrets.token_hex(PASSWORD_BYTES),
            tcp=False,
            shared_socket=True,
            maxmemory_bytes=memory_bytes,
            config_lines=[config_line(rule)],
            die_with_parent=True,
            folder_prefix=starter_prefix(FOLDER_PREFIX),  # the horse that starts it (remove_abandoned)
        )

    def start(self) -> PrivateRedis:
        remove_abandoned()
        self.server.start()
        return self

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        self.server.stop()

    def stop_cause(self) -> str | None:
        """Why the evaluation cannot go on (its server ended, or the agent filled it); else None.
        For ``run_local``'s ``stop_check``."""
        return self.gone() or self.full()

    def gone(self) -> str | None:
        """Why the evaluation cannot go on once its server ended (killed): no one starts it again,
        so the evaluator's wait for Redis to come back would only hold the worker for its outage
        limit. The evaluation then stops as interrupted, which the farm tries again."""
        code = self.server.exit_code()
        if code is None:
            return None
        return f"the evaluation's Redis ended (its exit status {code}) while the evaluation ran: it cannot go on"

    def full(self) -> str | None:
        """Why the evaluation cannot go on, when the server holds nearly its memory bound (the
        agent filled it: only its user writes besides the evaluator, whose own keys stay small);
        else None. For ``run_local``'s ``stop_check``."""
        try:
            if self._watcher is None:
                self._watcher = redis.Redis.from_url(
                    self.evaluator_url, socket_timeout=CHECK_TIMEOUT_S, socket_connect_timeout=CHECK_TIMEOUT_S
                )
            memory = self._watcher.info("memory")
        except redis.RedisError:
            return None  # the evaluator itself sees an unreachable Redis for what it is
        if memory["maxmemory"] and memory["used_memory"] >= FULL_SHARE * memory["maxmemory"]:
            return self.full_cause
        return None

    def __enter__(self) -> PrivateRedis:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def evaluator_url(self) -> str:
        """Redis's default user, over the unix socket."""
        return self.server.local_url

    @property
    def socket(self) -> Path:
        found = self.server.unix_socket
        if found is None:
            raise RuntimeError("the evaluation's Redis is not running")
        return found

    @property
    def socket_folder(self) -> Path:
        """The folder holding the socket alone: what a container mounts."""
        return self.socket.parent

    def attempt_folder(self, name: str) -> Path:
        """A folder for the attempt's own files (the container engine's), this user's alone,
        removed with the server's (and, after a killed horse, with its abandoned folder)."""
        folder = self.socket_folder.parent / name
        folder.mkdir(mode=0o700)
        return folder

    def agent_url(self, socket_path: str | None = None) -> str:
        """The participant's URL: its user and password, over the socket at ``socket_path``
        (where the agent sees it: inside its container), by default the socket's own path."""
        path = socket_path or str(self.socket)
        return f"unix://{quote(self.participant_user, safe='')}:{quote(self.participant_password, safe='')}@{path}?db=0"


def remove_abandoned(now: float | None = None) -> list[Path]:
    """Remove the folders of evaluation Redis servers that died with their work-horse (a killed
    horse, or a lost worker: the server is gone, its folder is not); returns them. A folder is
    abandoned when the process that started it, named in the folder's name, no longer runs: the
    kernel killed its server with it (``protocol/starter_folders.py``). A folder whose name
    names none is abandoned when no server answers on its socket and it is older than
    ``ABANDONED_AFTER_S``. This user's folders only."""
    now = time.time() if now is None else now
    removed = abandoned(FOLDER_PREFIX)
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*"):
        if starter_of(folder.name, FOLDER_PREFIX) is not None:
            continue  # judged above by its starter
        try:
            if folder.stat().st_uid != os.getuid() or now - folder.stat().st_mtime < ABANDONED_AFTER_S:
                continue
        except OSError:
            continue  # removed meanwhile
        if not _answers(folder / SHARED_SOCKET_FOLDER / UNIX_SOCKET_NAME):
            removed.append(folder)
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    if removed:
        log.warning("removed %d folder(s) of evaluation Redis servers that died with their work-horse", len(removed))
    return removed


def _answers(path: Path) -> bool:
    """Whether a server listens on the unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True
