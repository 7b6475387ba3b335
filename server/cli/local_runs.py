"""Local runs: how ``arbiter watch`` finds an ``arbiter run`` of the same user with no address
(``resolve_watched``).

``arbiter run`` announces itself while it runs: a small JSON file (its pid, Redis URL, service id
and results folder) in a folder only its user can open, removed when it ends. ``arbiter watch``
given no Redis address reads the announcements of the runs still alive; one left behind by a run
that was killed is removed by the next reader.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import stat
import sys
import tempfile
from typing import Any

from arbiter.protocol import keys
from arbiter.protocol.errors import ConfigError
from arbiter.protocol.redis_conn import redacted
from arbiter.protocol.starter_folders import process_runs
from arbiter.server.cli.settings import flatland_default_redis, given_service_id, resolve_redis_url, resolve_service_id

log = logging.getLogger(__name__)

RUNS_DIR_VARIABLE = "ARBITER_RUNS_DIR"


def runs_folder() -> str:
    """Where ``arbiter run`` announces itself: ``$ARBITER_RUNS_DIR``, else the user's runtime
    folder (``$XDG_RUNTIME_DIR/arbiter-runs``), else ``arbiter-runs-<uid>`` in the temporary
    folder. Only its owner may use it: an announcement names a Redis and its service id."""
    chosen = os.environ.get(RUNS_DIR_VARIABLE)
    if chosen:
        return chosen
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.stat(runtime).st_uid == os.getuid():
        return os.path.join(runtime, "arbiter-runs")
    return os.path.join(tempfile.gettempdir(), f"arbiter-runs-{os.getuid()}")


def _private_folder(path: str) -> bool:
    """Whether ``path`` is a real folder of this user's that no one else can open."""
    try:
        found = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid() and not found.st_mode & 0o077


def announce_run(redis_url: str, service_id: str, results_dir: str) -> str | None:
    """Write this process's announcement (atomically, readable by its owner only); returns its
    path, or None when the folder cannot be made private (the run goes on unannounced)."""
    folder = runs_folder()
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if not _private_folder(folder):
            log.warning("%s is not a folder of yours that only you can open: this run is not announced", folder)
            return None
        path = os.path.join(folder, f"{os.getpid()}.json")
        run = {"pid": os.getpid(), "redis_url": redis_url, "service_id": service_id}
        text = json.dumps({**run, "results": os.path.abspath(results_dir)})
        part = path + ".part"
        descriptor = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
        os.replace(part, path)
        return path
    except OSError as exc:
        log.warning("cannot announce this run in %s (%s): arbiter watch needs its address", folder, exc)
        return None


def withdraw_run(path: str | None) -> None:
    if path is not None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def _alive(pid: Any) -> bool:
    return type(pid) is int and pid > 0 and process_runs(pid)


def local_runs() -> list[dict[str, Any]]:
    """The announced runs whose process is alive, oldest first; the announcements of runs that
    died without withdrawing them (SIGKILL) are removed."""
    folder = runs_folder()
    if not _private_folder(folder):
        return []
    found = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as handle:
                run = json.load(handle)
            started = os.path.getmtime(path)
        except (OSError, ValueError):
            continue
        if not isinstance(run, dict) or not isinstance(run.get("redis_url"), str):
            continue
        if not _alive(run.get("pid")):
            withdraw_run(path)
            continue
        found.append({**run, "started": started})
    return sorted(found, key=lambda run: run["started"])


def watch_command(redis_url: str, service_id: str) -> str:
    """The command that follows this evaluation, ready to paste into a shell."""
    return f"arbiter watch --redis-url {shlex.quote(redis_url)} --service-id {shlex.quote(service_id)}"


def refuse_nothing_to_watch(redis_url: str, service_id: str | None) -> None:
    """No Redis given and no local run going on: flatland's default Redis is the last guess, and
    when nothing answers there the likeliest story is a run that has ended, which the bare
    "cannot reach Redis" did not tell."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_connect_timeout=1.0, socket_timeout=1.0)
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise ConfigError(
            f"no arbiter run of yours{f' with service id {service_id!r}' if service_id else ''} is going on (runs "
            f"announce themselves in {runs_folder()}), and no Redis answers at {redis_url}, flatland's default "
            f"({exc}): give the evaluation's --redis-url and --service-id; a run that ended is in its results "
            "folder (arbiter report DIR)"
        ) from None
    finally:
        client.close()


def resolve_watched(args: argparse.Namespace) -> tuple[str, str]:
    """The Redis and service id ``arbiter watch`` follows: as given (flag, then environment);
    with no Redis given, the local ``arbiter run`` (of the given service id, if one is given)
    that announced itself; else flatland's default Redis."""
    redis_url = resolve_redis_url(args, embedded_ok=True)
    if redis_url is not None:
        return redis_url, resolve_service_id(args)
    wanted = given_service_id(args)
    runs = [run for run in local_runs() if wanted is None or run.get("service_id") == wanted]
    if len(runs) == 1:
        run = runs[0]
        print(f"arbiter: following the local run {run.get('pid')} (results in {run.get('results')})", file=sys.stderr)
        return run["redis_url"], keys.validate_service_id(str(run.get("service_id")))
    if len(runs) > 1:
        # A URL's password is hidden here: that run's own start lines give its command.
        # Runs under one service id (T12345, the default) are told apart by their results folders.
        commands = "\n".join(
            f"  {watch_command(redacted(run['redis_url']), str(run.get('service_id')))}"
            f"  # results in {run.get('results')}"
            for run in runs
        )
        raise ConfigError(f"{len(runs)} local runs are going on ({runs_folder()}); follow one of them:\n{commands}")
    return flatland_default_redis(), resolve_service_id(args)
