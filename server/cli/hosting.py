"""``arbiter submit``, ``worker``, ``submissions`` and ``cancel``: hosting a competition on a farm
of RQ workers (server/hosting/). Their parsers are here too; server/cli/parser.py adds them.

Exit status: 0 done, 2 bad input (an unknown competition or submission, a missing folder, an
unreachable Redis: nothing was changed), 3 a submission refused by its participant's quota.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import redis

from arbiter.protocol.errors import ConfigError
from arbiter.server.cli.kube_options import add_kubernetes_options, given_kubernetes_options, kubernetes_options
from arbiter.server.cli.option_values import log_level
from arbiter.server.core.competition import phase_value

QUOTA_EXCEEDED_EXIT = 3


def add_hosting_parsers(commands: argparse._SubParsersAction) -> None:
    from arbiter.server.hosting.backends import BACKENDS

    submit = commands.add_parser(
        "submit",
        help="queue one submission for the farm's workers; prints its id",
        usage="arbiter submit --redis-url URL --competition NAME|FILE --participant NAME [options] -- AGENT_COMMAND...",
    )
    _redis_option(submit)
    submit.add_argument(
        "--competition", required=True, metavar="NAME|FILE", help="competition preset or .toml file (workers read it)"
    )
    submit.add_argument("--participant", required=True, metavar="NAME", help="whose submission it is (quotas)")
    submit.add_argument(
        "--phase",
        metavar="P",
        type=phase_value,
        help="the format's phase to evaluate, as --set phase=P (two-phase: 1 or 2; MetaLC: dev or final)",
    )
    submit.add_argument(
        "--debug",
        action="store_true",
        help="a debug submission: the debug subset, its own daily limit, never on a leaderboard",
    )
    submit.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a competition key, as arbiter run (not [hosting] or [leaderboard]: the file's alone)",
    )
    submit.add_argument("--workdir", metavar="DIR", help="the agent's working folder (default: the worker's)")
    submit.add_argument(
        "--image",
        metavar="IMAGE",
        help="the agent's container image, for container workers (default: the competition's [hosting] image)",
    )
    submit.add_argument("--quiet", action="store_true", help="print the submission id alone")
    submit.add_argument("agent", nargs=argparse.REMAINDER, help="the agent command, after --")

    worker = commands.add_parser("worker", help="evaluate queued submissions, one at a time")
    _redis_option(worker)
    worker.add_argument(
        "--results-root", required=True, metavar="DIR", help="results go to DIR/<competition>/<submission id>/"
    )
    worker.add_argument(
        "--backend", default="local", choices=sorted(BACKENDS), help="where agents run (default: local)"
    )
    worker.add_argument(
        "--container-runtime",
        metavar="NAME",
        help="podman and docker backends: the OCI runtime containers run with (e.g. runc)",
    )
    worker.add_argument(
        "--container-option",
        action="append",
        default=[],
        metavar="ARG",
        help="podman and docker backends: one more argument for the engine's run, e.g. "
        "--container-option=--tmpfs=/cache (repeat it)",
    )
    add_kubernetes_options(worker)
    worker.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    worker.add_argument(
        "--log-level",
        default="WARNING",
        type=log_level,
        metavar="LEVEL",
        help="Python logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL (default: WARNING)",
    )

    listing = commands.add_parser("submissions", help="list submissions with their state and score")
    _redis_option(listing)
    listing.add_argument("--participant", metavar="P", help="this participant's only")
    listing.add_argument("--json", action="store_true", help="one JSON object per submission, one a line")

    cancel = commands.add_parser("cancel", help="cancel a queued or running submission")
    _redis_option(cancel)
    cancel.add_argument("submission", metavar="ID", help="the submission's id")


def _redis_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", required=True, metavar="URL", help="the farm's Redis")


def _connect(url: str) -> redis.Redis:
    from arbiter.server.cli.settings import checked_redis_url

    conn = redis.Redis.from_url(checked_redis_url(url, "--redis-url"), socket_connect_timeout=5, socket_timeout=10)
    conn.ping()  # unreachable: main() says so in one line, before anything is done
    return conn


def cmd_submit(args: argparse.Namespace) -> int:
    from arbiter.server.hosting.farm import submit
    from arbiter.server.hosting.quotas import QuotaExceeded

    agent = list(args.agent)
    if agent and agent[0] == "--":
        agent = agent[1:]
    if not agent:
        raise ConfigError("no agent command: use  arbiter submit [options] -- python my_agent.py")
    conn = _connect(args.redis_url)
    try:
        submission = submit(
            conn,
            competition=args.competition,
            participant=args.participant,
            agent=agent,
            phase=args.phase,
            debug=args.debug,
            sets=args.set,
            workdir=args.workdir,
            image=args.image,
        )
    except QuotaExceeded as exc:
        print(f"arbiter: refused: {exc}", file=sys.stderr)
        return QUOTA_EXCEEDED_EXIT
    if args.quiet:
        print(submission.id)
    else:
        kind = "debug submission" if submission.debug else "submission"
        print(f"queued {kind} {submission.id} of {submission.participant} to {submission.competition_name}")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from arbiter.server.cli.settings import checked_redis_url
    from arbiter.server.hosting.worker import run_worker

    run_worker(
        checked_redis_url(args.redis_url, "--redis-url"),
        args.results_root,
        backend=args.backend,
        backend_options=_backend_options(args),
        burst=args.burst,
    )
    return 0


CONTAINER_BACKENDS = ("podman", "docker")


def _backend_options(args: argparse.Namespace) -> dict:
    """The options of the chosen backend; another backend's options are a mistake, said so."""
    stray = given_kubernetes_options(args) if args.backend != "kubernetes" else []
    if stray:
        raise ConfigError(f"{stray[0]} is for --backend kubernetes, not {args.backend}")
    if args.backend in CONTAINER_BACKENDS:
        return {"runtime": args.container_runtime, "options": list(args.container_option)}
    container_options = {"--container-runtime": args.container_runtime, "--container-option": args.container_option}
    for option, given in container_options.items():
        if given:
            raise ConfigError(f"{option} is for --backend {' or '.join(CONTAINER_BACKENDS)}, not {args.backend}")
    return {"options": kubernetes_options(args)} if args.backend == "kubernetes" else {}


def cmd_submissions(args: argparse.Namespace) -> int:
    from arbiter.server.hosting.submissions import SubmissionStore

    found = SubmissionStore(_connect(args.redis_url)).listing(args.participant)
    if args.json:
        for submission in found:
            print(json.dumps(submission.as_dict()))
        return 0
    columns = ("id", "participant", "competition", "state", "attempts", "submitted", "ended", "score", "image", "cause")
    rows = [columns]
    for one in found:
        competition = one.competition_name + (" (debug)" if one.debug else "")
        score = "" if one.score is None else f"{one.score:.6g}"
        rows.append(
            (one.id, one.participant, competition, one.state, str(one.attempts), _when(one.submitted_at),
             _when(one.finished_at), score, one.image or "-", one.cause or "")
        )  # fmt: skip
    widths = [max(len(row[index]) for row in rows) for index in range(len(columns) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1])
    return 0


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    return datetime.datetime.fromtimestamp(stamp, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def cmd_cancel(args: argparse.Namespace) -> int:
    from arbiter.server.hosting.farm import cancel

    cancelled = cancel(_connect(args.redis_url), args.submission)
    print(f"cancelled submission {cancelled.id} of {cancelled.participant}")
    return 0


HOSTING_HANDLERS = {"submit": cmd_submit, "worker": cmd_worker, "submissions": cmd_submissions, "cancel": cmd_cancel}
