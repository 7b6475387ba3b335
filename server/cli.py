"""The command line: ``arbiter run``, ``serve``, ``generate``, ``watch``, ``report``, ``replay``, ``acl``.

Environment variables that flatland users already set are read here, at the edge, and only
here; everything inward gets explicit settings. Precedence: flag > environment > competition.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
from collections.abc import Sequence

from arbiter.protocol import keys
from arbiter.protocol.errors import ArbiterError, ConfigError

from .cli_parser import DEBUG_TEST_PRESET, DEBUG_TEST_SEED, build_parser
from .competition import DEFAULT_COMPETITION, CompetitionSpec, load_competition
from .evaluation import State
from .formats import get_format
from .process_memory import keep_freed_memory
from .progress import Progress
from .testsets import cached_test_set, generate_test_set

EXIT_CODES = {State.SUCCESS.value: 0, State.FAILED.value: 1, State.INTERRUPTED.value: 130}
DEFAULT_SERVICE_ID = "T12345"

# flatland-rl's evaluator settings, honoured under their own names.
FLATLAND_ENV_BUDGETS = {
    "planning_s": "FLATLAND_INITIAL_PLANNING_TIMEOUT",
    "step_s": "FLATLAND_PER_STEP_TIMEOUT",
    "overall_s": "FLATLAND_OVERALL_TIMEOUT",
    "idle_s": "FLATLAND_DEFAULT_COMMAND_TIMEOUT",
    "max_successive_timeouts": "FLATLAND_MAX_SUCCESSIVE_TIMEOUTS",
}


def _env_number(name: str, kind: type) -> float | int | None:
    text = os.environ.get(name)
    if text in (None, ""):
        return None
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(f"environment variable {name}={text!r} is not a {kind.__name__}") from None
    if value <= 0:
        raise ConfigError(f"environment variable {name}={text!r} must be positive")
    return value


def resolve_spec(args: argparse.Namespace) -> CompetitionSpec:
    overrides = list(args.set) + ([f"phase={args.phase}"] if args.phase is not None else [])
    spec = load_competition(args.competition or DEFAULT_COMPETITION, overrides)
    budgets = {
        field: _env_number(var, int if field == "max_successive_timeouts" else float)
        for field, var in FLATLAND_ENV_BUDGETS.items()
    }
    flags = {
        "planning_s": args.planning_timeout,
        "step_s": args.step_timeout,
        "overall_s": args.overall_timeout,
        "idle_s": args.idle_timeout,
        "max_successive_timeouts": args.max_successive_timeouts,
        "time_bank_s": args.time_bank,
    }
    spec = spec.with_budgets(**budgets).with_budgets(**flags)
    if args.debug or os.environ.get("AICROWD_DEBUG_SUBMISSION", "").lower() in ("1", "true", "yes"):
        spec = spec.with_debug()
    if args.scoring:
        spec = CompetitionSpec(**{**spec.__dict__, "scoring": args.scoring})
    if args.seed is not None:
        spec = CompetitionSpec(**{**spec.__dict__, "seed": args.seed})
    if args.record is not None:
        spec = CompetitionSpec(**{**spec.__dict__, "record_episodes": args.record})
    if args.refuse_pickle:
        spec = CompetitionSpec(**{**spec.__dict__, "accept_pickle": False})
    return spec


def resolve_tests(args: argparse.Namespace, spec: CompetitionSpec) -> str | None:
    """Flag, competition key, then flatland's variable (for the Flatland format only: another
    format's data is never a Flatland test folder)."""
    legacy = os.environ.get("AICROWD_TESTS_FOLDER") if spec.format == "flatland" else None
    return args.tests or spec.tests or legacy


def resolve_redis_url(args: argparse.Namespace, *, embedded_ok: bool) -> str | None:
    if args.redis_url:
        return args.redis_url
    if os.environ.get("ARBITER_REDIS_URL"):
        return os.environ["ARBITER_REDIS_URL"]
    if embedded_ok:
        return None  # arbiter run starts its own redis-server
    return f"redis://{os.environ.get('redis_ip', '127.0.0.1')}:6379/0"


def resolve_service_id(args: argparse.Namespace) -> str:
    return keys.validate_service_id(args.service_id or os.environ.get("AICROWD_SUBMISSION_ID") or DEFAULT_SERVICE_ID)


def resolve_results(args: argparse.Namespace) -> str:
    if args.results:
        return args.results
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join("arbiter-results", f"run-{stamp}")


def cmd_run(args: argparse.Namespace) -> int:
    from .runner import run_local

    keep_freed_memory()  # the evaluator steps in this process; the agent's is its own
    agent = list(args.agent)
    if agent and agent[0] == "--":
        agent = agent[1:]
    if not agent:
        raise ConfigError("no agent command: use  arbiter run [options] -- python my_agent.py")
    spec = resolve_spec(args)
    tests = resolve_tests(args, spec)
    if not tests and get_format(spec.format).requires_tests:
        tests = str(cached_test_set(DEBUG_TEST_PRESET, DEBUG_TEST_SEED))
    service_id = resolve_service_id(args)
    outcome = run_local(
        spec,
        agent_command=agent,
        tests=tests,
        results_dir=resolve_results(args),
        service_id=service_id,
        redis_url=resolve_redis_url(args, embedded_ok=True),
        progress=Progress(enabled=not args.quiet),
        redis_outage_s=args.redis_outage_timeout,
    )
    if outcome.agent_status not in (0, None):
        print(f"arbiter: the agent exited with status {outcome.agent_status}", file=sys.stderr)
    return outcome.exit_code


def cmd_serve(args: argparse.Namespace) -> int:
    from .evaluator import run_to_end, start_service

    keep_freed_memory()
    spec = resolve_spec(args)
    tests = resolve_tests(args, spec)
    if not tests and get_format(spec.format).requires_tests:
        raise ConfigError("arbiter serve needs --tests DIR (or AICROWD_TESTS_FOLDER)")
    service_id = resolve_service_id(args)
    redis_url = resolve_redis_url(args, embedded_ok=False)
    results_dir = resolve_results(args)
    progress = Progress(enabled=not args.quiet)
    if args.resume and not args.results:
        raise ConfigError("--resume needs the --results folder of the evaluation to continue")
    service = start_service(
        spec,
        tests=tests,
        results_dir=results_dir,
        redis_url=redis_url,
        service_id=service_id,
        progress=progress,
        resume=args.resume,
        redis_outage_s=args.redis_outage_timeout,
    )
    summary = run_to_end(service, progress, results_dir)
    return EXIT_CODES[summary["state"]]


def cmd_generate(args: argparse.Namespace) -> int:
    if args.format == "metalc":
        from .formats.metalc.generate import GeneratorSettings, write_meta_dataset

        settings = GeneratorSettings(
            args.datasets, args.algorithms, args.seed or 0, args.missing_fraction, args.duplicate_fraction
        )
        written = write_meta_dataset(args.out, settings)
        print(f"wrote a synthetic MetaLC meta-dataset ({args.datasets} datasets, {args.algorithms} algorithms, "
              f"{written} files) to {args.out}")  # fmt: skip
        return 0
    seed = DEBUG_TEST_SEED if args.seed is None else args.seed
    paths = generate_test_set(args.out, preset=args.preset, seed=seed, overwrite=args.overwrite)
    print(f"wrote {len(paths)} envs and metadata.csv to {args.out}")
    return 0


def cmd_acl(args: argparse.Namespace) -> int:
    from .acl import acl_line, config_line, participant_acl

    tokens = participant_acl(args.service_id, args.password, args.user)
    print(config_line(tokens) if args.format == "config" else acl_line(tokens))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .report import write_report

    print(f"wrote {write_report(args.results, args.out)}")
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    from .watch import follow

    state = follow(
        resolve_redis_url(args, embedded_ok=False),
        resolve_service_id(args),
        timeout_s=args.timeout,
        from_start=args.from_start,
        out=sys.stdout,
    )
    return EXIT_CODES.get(state, 1)


def cmd_replay(args: argparse.Namespace) -> int:
    from .replay import replay_to_gif

    outcome = replay_to_gif(
        args.results,
        args.episode,
        out=args.out,
        tests=args.tests,
        renderer=args.renderer,
        fps=args.fps,
        every=args.every,
        progress=sys.stderr,
    )
    print(f"rendered {outcome.frames} frames of episode {outcome.index} ({outcome.env}) into {args.out}")
    if not outcome.matches:
        print(f"the replay does NOT match the recorded episode: {'; '.join(outcome.mismatches)}", file=sys.stderr)
        return 1
    print(
        f"the replay matches the recorded episode: {outcome.steps} steps, "
        f"{outcome.arrived}/{outcome.num_agents} arrived, reward {outcome.reward:g}"
    )
    return 0


# Budget decisions are made in the main thread while the next episode is prepared in a
# background one; a 1 ms GIL switch interval (default 5 ms) keeps deadline checks prompt.
GIL_SWITCH_INTERVAL_S = 0.001


def main(argv: Sequence[str] | None = None) -> int:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(getattr(args, "log_level", "WARNING")).upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    handlers = {"run": cmd_run, "serve": cmd_serve, "generate": cmd_generate, "acl": cmd_acl}
    handlers.update({"watch": cmd_watch, "replay": cmd_replay})
    handlers["report"] = cmd_report
    try:
        return handlers[args.command](args)
    except (ArbiterError, FileExistsError, ValueError) as exc:
        print(f"arbiter: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the evaluator handles SIGINT itself once it runs; this is the rest
        print("arbiter: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # redis unreachable and similar: a clear line, not a traceback
        import redis

        if isinstance(exc, redis.ConnectionError):
            print(f"arbiter: error: cannot reach Redis: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
