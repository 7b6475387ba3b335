"""The command line: ``arbiter run``, ``serve``, ``generate``, ``watch``, ``report``, ``replay``,
``rescore``, ``acl``, ``leaderboard``.

``generate``, ``replay`` and the test data of a ``run`` given none reach a format through its
hooks (``Format.generate``, ``replay``, ``default_tests``); a format without the hook is a clear
error naming it.

What each command is given, from its flags and the environment, is settings.py's to resolve.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import shlex
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from arbiter.protocol.errors import ArbiterError, ConfigError
from arbiter.server.cli.hosting import HOSTING_HANDLERS
from arbiter.server.cli.parser import build_parser
from arbiter.server.cli.progress import Progress
from arbiter.server.cli.settings import (
    STARTED_FILES,
    claim_results,
    flatland_default_redis,
    given_service_id,
    holds_an_evaluation,
    refuse_earlier_results,
    refuse_unreachable,
    resolve_poll_window_us,
    resolve_redis_url,
    resolve_service_id,
    resolve_spec,
    resolve_tests,
    resumed_tests,
)
from arbiter.server.core.evaluation import State
from arbiter.server.core.seeds import persisted_seed
from arbiter.server.formats import get_format
from arbiter.server.service.process_memory import keep_freed_memory

EXIT_CODES = {State.SUCCESS.value: 0, State.FAILED.value: 1, State.INTERRUPTED.value: 130}
# serve: after an ending the agent did not ask for, the longest a request is still answered with
# it. A request that missed the ending was sent right after its client read the errors list: it
# comes within moments, and a dead agent's never does, so the wait is short.
ANSWER_AFTER_END_S = 1.0


def cmd_run(args: argparse.Namespace) -> int:
    from arbiter.server.cli.runner import run_local

    keep_freed_memory()  # the evaluator steps in this process; the agent's is its own
    agent = list(args.agent)
    if agent and agent[0] == "--":
        agent = agent[1:]
    if not agent:
        raise ConfigError("no agent command: use  arbiter run [options] -- python my_agent.py")
    spec = resolve_spec(args)
    poll_window_us = resolve_poll_window_us()
    tests = resolve_tests(args, spec)
    if args.resume:
        # Asked first: a folder with no evaluation also names no test folder, and asking for one
        # (--tests DIR) would send the user after the wrong thing.
        if args.results and not holds_an_evaluation(args.results):
            raise ConfigError(
                f"--resume: {args.results} holds no evaluation to continue (no {' or '.join(STARTED_FILES)}): "
                "start one without --resume"
            )
        tests = resumed_tests(args, spec, tests)
    if not tests and get_format(spec.format).requires_tests:
        lacking = "default test data: give one with --tests DIR or the competition's tests key"
        tests = format_hook(spec.format, "default_tests", lacking)()
    service_id = resolve_service_id(args)
    redis_url = resolve_redis_url(args, embedded_ok=True)
    if redis_url is not None:
        refuse_unreachable(redis_url)
    if args.resume:  # its own folder, and the seed it started with (a local run's is the competition's)
        results_dir, made_folder = args.results, None
        spec = persisted_seed(results_dir, spec, resume=True, hosted=True, tests=tests)
    else:
        results_dir, made_folder = claim_results(args)
        refuse_earlier_results(results_dir)
    outcome = run_local(
        spec,
        agent_command=agent,
        tests=tests,
        results_dir=results_dir,
        service_id=service_id,
        redis_url=redis_url,
        progress=Progress(enabled=not args.quiet, format_name=spec.format),
        redis_outage_s=args.redis_outage_timeout,
        participant=args.participant,
        poll_window_us=poll_window_us,
        made_folder=made_folder,
        resume=args.resume,
    )
    ending = agent_ending(outcome.agent_status, interrupted=outcome.interrupted)
    if ending:
        print(f"arbiter: {ending}", file=sys.stderr)
    ended = outcome.summary is not None and outcome.summary["state"] != "INTERRUPTED"  # a resume would be refused
    if outcome.interrupted and holds_an_evaluation(results_dir) and not ended:
        # What is finished is kept: the one who pressed Ctrl-C learns that it can go on from there.
        print(
            f"arbiter: to go on from where it stopped: arbiter run --resume --results {shlex.quote(results_dir)} "
            f"[the same options] -- {shlex.join(agent)}",
            file=sys.stderr,
        )
    return outcome.exit_code


def agent_ending(status: int | None, *, interrupted: bool) -> str | None:
    """How the agent ended, in words, when there is something to say."""
    if interrupted:
        return "interrupted: the agent was stopped" if status is not None else "interrupted before the agent started"
    if status is None or status == 0:
        return None
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"the agent exited with status {status} (killed by {name})"
    return f"the agent exited with status {status}"


def cmd_serve(args: argparse.Namespace) -> int:
    from arbiter.server.service import held_stops
    from arbiter.server.service.build import everything_on_record, run_to_end, start_service
    from arbiter.server.service.submission_naming import name_submission

    keep_freed_memory()
    spec = resolve_spec(args)
    poll_window_us = resolve_poll_window_us()
    tests = resolve_tests(args, spec)
    service_id = resolve_service_id(args)
    redis_url = resolve_redis_url(args, embedded_ok=False)
    progress = Progress(enabled=not args.quiet, format_name=spec.format)
    if args.resume:
        tests = resumed_tests(args, spec, tests)
    elif not tests and get_format(spec.format).requires_tests:
        variable = get_format(spec.format).tests_variable  # read for its own format only (resolve_tests)
        raise ConfigError(
            f"arbiter serve needs --tests DIR or the competition's tests key{f' (or {variable})' if variable else ''}: "
            f"format {spec.format!r} plays a test folder"
        )
    if args.no_agent and not args.resume:
        raise ConfigError("--no-agent goes with --resume: only an evaluation with every item on record needs no agent")
    results_dir, made_folder = claim_results(args)  # once the settings are checked: a refused command makes no folder
    if args.resume and not holds_an_evaluation(results_dir):
        # An evaluator killed before its first write leaves nothing to continue, and one started
        # again with --resume (an orchestrator's way) begins it: said, in case the folder is wrong.
        print(
            f"arbiter: --resume: {results_dir} holds no evaluation yet (no {' or '.join(STARTED_FILES)}); "
            "a new one starts there",
            file=sys.stderr,
        )
    held_stops.noted_from_now((signal.SIGTERM, signal.SIGHUP))  # obeyed once the evaluation handles them
    try:
        spec = persisted_seed(results_dir, spec, resume=args.resume, hosted=True, tests=tests)  # secret unless fixed
        service = start_service(
            spec,
            tests=tests,
            results_dir=results_dir,
            redis_url=redis_url,
            service_id=service_id,
            progress=progress,
            resume=args.resume,
            redis_outage_s=args.redis_outage_timeout,
            poll_window_us=poll_window_us,
            redis_private=args.private_redis,
            command="serve",
            agent_if_done=not args.no_agent,
        )
    except BaseException:  # nothing was evaluated (its Redis out of reach, say): no folder is left of it
        if made_folder is not None:
            shutil.rmtree(made_folder, ignore_errors=True)
        raise
    name_submission(service, args.participant, results_dir=results_dir, resume=args.resume)
    evaluation = service.evaluation
    if args.no_agent:
        # Whoever runs the agent started none (the Kubernetes backend, for an evaluation with every
        # item on record): it ends now, as `arbiter run --resume` ends one.
        refuse_items_left(service)
        progress.note(
            f"arbiter: every item is on record ({evaluation.endings.all_handed_out()}): nothing is left to play, "
            "and no agent comes (--no-agent)"
        )
        evaluation.endings.nothing_left_to_play(evaluation.clock())
    elif args.resume and everything_on_record(evaluation):
        # The agent is not this process's: one that lived on may still send its ENV_SUBMIT.
        progress.note(
            f"arbiter: every item is on record ({evaluation.endings.all_handed_out()}): nothing is left to play; "
            f"waiting up to the idle budget ({evaluation.budgets.idle_s:g} s) for the agent's ENV_SUBMIT"
        )
    # An agent waiting on a reply when the evaluation ended by itself is told how, not left to its timeout.
    summary = run_to_end(service, progress, results_dir, answer_after_end_s=ANSWER_AFTER_END_S, agent_watched=False)
    return EXIT_CODES[summary["state"]]


def refuse_items_left(service: Any) -> None:
    """``serve --no-agent`` of an evaluation with items left to play: ``ConfigError``, the
    evaluation left as it was for a resume with an agent."""
    from arbiter.server.service.build import everything_on_record

    evaluation = service.evaluation
    if everything_on_record(evaluation):
        return
    service.events.close()
    service.close()
    left = evaluation.endings.items_said(evaluation.total - evaluation.next_index)
    raise ConfigError(
        f"--no-agent: not every item is on record ({left} of {evaluation.total} left to play); resume it with an agent"
    )


def format_hook(format_name: str, hook: str, lacking: str) -> Callable[..., Any]:
    """The format's ``hook``, or a one-line error naming the format and what it lacks."""
    found = getattr(get_format(format_name), hook)
    if found is None:
        raise ConfigError(f"format {format_name!r} has no {lacking}")
    return found


GENERATE_OPTIONS = ("preset", "seed", "overwrite", "datasets", "algorithms", "missing_fraction", "duplicate_fraction")


def cmd_generate(args: argparse.Namespace) -> int:
    generate = format_hook(args.format, "generate", "test-data generator: `arbiter generate` cannot write its data")
    print(generate(args.out, {name: getattr(args, name) for name in GENERATE_OPTIONS}))
    return 0


def cmd_acl(args: argparse.Namespace) -> int:
    from arbiter.server.service.acl import acl_line, config_line, participant_acl

    tokens = participant_acl(args.service_id, args.password, args.user)
    print(config_line(tokens) if args.format == "config" else acl_line(tokens))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from arbiter.server.report.page import write_report

    print(f"wrote {write_report(args.results, args.out)}")
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    from arbiter.server.cli.local_runs import refuse_nothing_to_watch, resolve_watched
    from arbiter.server.cli.watch import follow

    redis_url, service_id = resolve_watched(args)
    if resolve_redis_url(args, embedded_ok=True) is None and redis_url == flatland_default_redis():
        refuse_nothing_to_watch(redis_url, given_service_id(args))
    state = follow(redis_url, service_id, timeout_s=args.timeout, from_start=args.from_start, out=sys.stdout)
    return EXIT_CODES.get(state, 1)


def cmd_replay(args: argparse.Namespace) -> int:
    from arbiter.server.core.rescore import evaluation_format

    format_name = evaluation_format(args.results)
    replay = format_hook(format_name, "replay", f"replays: `arbiter replay` cannot play {args.results} again")
    options = {"out": args.out, "tests": args.tests, "renderer": args.renderer, "fps": args.fps, "every": args.every}
    lines, mismatches = replay(args.results, args.episode, options, sys.stderr)
    for line in lines:
        print(line)
    if mismatches:
        print(f"the replay does NOT match the recorded episode: {'; '.join(mismatches)}", file=sys.stderr)
        return 1
    return 0


def cmd_rescore(args: argparse.Namespace) -> int:
    from arbiter.server.core.rescore import as_text, rescore

    try:
        found = rescore(args.results, args.scoring)
    except ConfigError:
        raise
    except ValueError as exc:  # records the rule cannot score (another reward model's, say)
        raise ConfigError(f"{args.results} cannot be rescored: {exc}") from None
    except (TypeError, AttributeError, KeyError, ArithmeticError) as exc:  # records edited by hand, or damaged
        raise ConfigError(
            f"{args.results} cannot be rescored: its records hold what no evaluation writes "
            f"({type(exc).__name__}: {exc})"
        ) from None
    print(json.dumps(found.as_dict(), indent=2) if args.json else as_text(found))
    return 0 if found.matches else 1


# The evaluator's thread shares the interpreter with helper threads (the events publisher,
# ``arbiter run``'s agent watcher): a 1 ms GIL switch interval (default 5 ms) bounds how long a
# request, or a deadline check, waits for one of them to let go of the interpreter.
GIL_SWITCH_INTERVAL_S = 0.001


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from arbiter.server.cli.leaderboard import cmd_leaderboard as build

    return build(args)


def report_native_crashes() -> None:
    """A fault in native code (a C extension, the C library) kills the process with no Python
    traceback; with faulthandler on, every thread's Python stack goes to stderr first, so the
    crash says where it happened. A handler already installed (``PYTHONFAULTHANDLER``, pytest's,
    an embedding program's) is left as it is."""
    if faulthandler.is_enabled():
        return
    try:
        faulthandler.enable(file=sys.__stderr__)
    except (AttributeError, ValueError, OSError, RuntimeError):
        pass  # no usable stderr (a detached process): nothing to write a report to


def main(argv: Sequence[str] | None = None) -> int:
    report_native_crashes()
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(getattr(args, "log_level", "WARNING")).upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handlers = {"run": cmd_run, "serve": cmd_serve, "generate": cmd_generate, "acl": cmd_acl}
    handlers.update({"watch": cmd_watch, "replay": cmd_replay, "rescore": cmd_rescore})
    handlers["report"] = cmd_report
    handlers["leaderboard"] = cmd_leaderboard
    handlers.update(HOSTING_HANDLERS)  # submit, worker, submissions, cancel
    try:
        status = handlers[args.command](args)
        if args.command in ("run", "serve"):
            # The evaluation has ended and its status is decided: a stop signal now (the
            # interpreter's exit puts back their default action) must not turn it into a death.
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(signum, signal.SIG_IGN)
        sys.stdout.flush()  # here, where a reader gone away is caught, not at the interpreter's exit
        return status
    except (ArbiterError, FileExistsError, ValueError) as exc:
        print(f"arbiter: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the evaluator handles SIGINT itself once it runs; this is the rest
        print("arbiter: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # What read the output went away (`arbiter submissions | head`): nothing is wrong here.
        # Python would still complain when it flushes stdout at exit, so stdout goes nowhere now.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as exc:
        if exc.filename is None:  # not a file the user named or can fix: a bug, with its traceback
            raise
        print(f"arbiter: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # redis unreachable and similar: a clear line, not a traceback
        import redis

        if isinstance(exc, (redis.AuthenticationError, redis.exceptions.AuthorizationError)):
            print(f"arbiter: error: Redis refused the user or password: {exc}", file=sys.stderr)
            return 2
        if isinstance(exc, redis.ConnectionError):
            print(f"arbiter: error: cannot reach Redis: {exc}", file=sys.stderr)
            return 2
        if isinstance(exc, redis.TimeoutError):
            print(f"arbiter: error: Redis did not answer in time (hung, or out of reach): {exc}", file=sys.stderr)
            return 2
        if isinstance(exc, redis.exceptions.InvalidResponse):  # a web server, say, on the port given
            print(f"arbiter: error: what answers at the Redis URL's address is not Redis ({exc})", file=sys.stderr)
            return 2
        if isinstance(exc, redis.RedisError):  # refused: a database index out of range, a wrong password ...
            print(f"arbiter: error: Redis refused: {exc}", file=sys.stderr)
            return 2
        from arbiter.server.cli.embedded_redis import EmbeddedRedisError

        if isinstance(exc, EmbeddedRedisError):  # the Redis of `arbiter run`: its log's last lines say why
            print(f"arbiter: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
