"""The settings of an evaluation from the command line and the environment: the competition
with its budgets and flags, the test data, the Redis URL, the service id and the results folder.

Environment variables that flatland users already set are read here, at the edge, and only
here; everything inward gets explicit settings. Precedence: flag > environment > competition.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import sys
import time

from arbiter.protocol import keys
from arbiter.protocol.errors import ConfigError
from arbiter.protocol.redis_conn import redacted
from arbiter.server.cli.option_values import DEFAULT_SERVICE_ID
from arbiter.server.core.competition import DEFAULT_COMPETITION, CompetitionSpec, load_competition
from arbiter.server.core.output_files import nearest_existing
from arbiter.server.core.rescore import EPISODES_FILE, EVENTS_FILE, SUMMARY_FILE
from arbiter.server.core.seeds import recorded_tests
from arbiter.server.formats import get_format

# flatland-rl's evaluator settings, honoured under their own names.
FLATLAND_ENV_BUDGETS = {
    "planning_s": "FLATLAND_INITIAL_PLANNING_TIMEOUT",
    "step_s": "FLATLAND_PER_STEP_TIMEOUT",
    "overall_s": "FLATLAND_OVERALL_TIMEOUT",
    "idle_s": "FLATLAND_DEFAULT_COMMAND_TIMEOUT",
    "max_successive_timeouts": "FLATLAND_MAX_SUCCESSIVE_TIMEOUTS",
}


# flatland-rl's evaluator's seed, honoured for Flatland: a whole number, or NONE (no reset seed).
FLATLAND_SEED_VARIABLE = "FLATLAND_EVALUATION_RANDOM_SEED"


def flatland_env_seed() -> tuple[bool, int | None]:
    """``FLATLAND_EVALUATION_RANDOM_SEED`` as flatland's service reads it: ``(False, None)`` when
    unset; ``NONE`` is no seed (flatland's service then resets its envs without one)."""
    text = os.environ.get(FLATLAND_SEED_VARIABLE, "").strip()
    if not text:
        return False, None
    if text == "NONE":
        return True, None
    try:
        seed = int(text)
    except ValueError:
        said = f"environment variable {FLATLAND_SEED_VARIABLE}={text!r}"
        raise ConfigError(f"{said} is not a whole number or NONE") from None
    if seed < 0:
        raise ConfigError(f"environment variable {FLATLAND_SEED_VARIABLE}={text!r} must be 0 or more")
    return True, seed


# flatland-rl's evaluator's threshold for playing the next Test (flatland3), under its own name.
FLATLAND_MIN_COMPLETION_VARIABLE = "TEST_MIN_PERCENTAGE_COMPLETE_MEAN"


def flatland_env_min_completion() -> float | None:
    text = os.environ.get(FLATLAND_MIN_COMPLETION_VARIABLE, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"environment variable {FLATLAND_MIN_COMPLETION_VARIABLE}={text!r} is not a float") from None
    if not math.isfinite(value):
        raise ConfigError(f"environment variable {FLATLAND_MIN_COMPLETION_VARIABLE}={text!r} must be finite")
    return value


EVALUATOR_SPIN_VARIABLE = "ARBITER_EVALUATOR_SPIN_US"


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


def resolve_poll_window_us() -> float:
    """How long the evaluator polls its socket for the agent's next request before sleeping on it,
    in microseconds: ``ARBITER_EVALUATOR_SPIN_US`` (0: never), else the transport's default."""
    from arbiter.server.service.transport import EVALUATOR_WINDOW_US

    text = os.environ.get(EVALUATOR_SPIN_VARIABLE, "").strip()
    if not text:
        return EVALUATOR_WINDOW_US
    try:
        window_us = float(text)
    except ValueError:
        raise ConfigError(
            f"environment variable {EVALUATOR_SPIN_VARIABLE}={text!r} is not a number of microseconds"
        ) from None
    if not window_us >= 0:
        raise ConfigError(f"environment variable {EVALUATOR_SPIN_VARIABLE}={text!r} must be 0 or more")
    return window_us


def resolve_spec(args: argparse.Namespace) -> CompetitionSpec:
    spec = load_competition(args.competition or DEFAULT_COMPETITION, list(args.set), phase=args.phase)
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
        spec = CompetitionSpec(**{**spec.__dict__, "seed": args.seed, "seed_fixed": True})
    elif spec.format == "flatland":  # flatland's variable, for flatland's envs only
        given, seed = flatland_env_seed()
        if given:
            spec = CompetitionSpec(**{**spec.__dict__, "seed": seed, "seed_fixed": True})
    completion = flatland_env_min_completion() if spec.format == "flatland" else None
    if completion is not None:
        options = dataclasses.replace(spec.options or get_format("flatland").options(), min_test_completion=completion)
        spec = CompetitionSpec(**{**spec.__dict__, "options": options})
    if args.record is not None:
        spec = CompetitionSpec(**{**spec.__dict__, "record_episodes": args.record})
    if args.refuse_pickle:
        spec = CompetitionSpec(**{**spec.__dict__, "accept_pickle": False})
    return spec


def resolve_tests(args: argparse.Namespace, spec: CompetitionSpec) -> str | None:
    """Flag, competition key, then the variable the format's community sets (Flatland's
    AICROWD_TESTS_FOLDER; read for that format only: another format's data is never a Flatland
    test folder)."""
    found = get_format(spec.format)
    if args.tests is not None and not found.takes_tests:
        raise ConfigError(
            f"--tests: format {spec.format!r} reads no test folder (its episodes come from the "
            "competition's env and seed); leave --tests out"
        )
    variable = found.tests_variable
    return args.tests or spec.tests or (os.environ.get(variable) if variable else None)


REDIS_SCHEMES = ("redis", "rediss", "unix")


def checked_redis_url(url: str, where: str) -> str:
    """A Redis URL as given, or a clear error: an empty or scheme-less one would otherwise be
    taken for "no URL" or fail deep inside the evaluation."""
    if not url.strip():
        raise ConfigError(
            f"{where} is empty: give a Redis URL (redis://HOST:6379/0, unix:///path/redis.sock), "
            "or leave it out for the default"
        )
    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme not in REDIS_SCHEMES:
        raise ConfigError(f"{where} {url!r} is not a Redis URL: it must start with redis://, rediss:// or unix://")
    return url


def resolve_redis_url(args: argparse.Namespace, *, embedded_ok: bool) -> str | None:
    if args.redis_url is not None:
        return checked_redis_url(args.redis_url, "--redis-url")
    if os.environ.get("ARBITER_REDIS_URL"):  # set but empty is unset, as shells have it
        return checked_redis_url(os.environ["ARBITER_REDIS_URL"], "ARBITER_REDIS_URL")
    if embedded_ok:
        return None  # arbiter run starts its own redis-server; arbiter watch looks for a local run
    return flatland_default_redis()


RUN_REDIS_WAIT_S = 3.0  # arbiter run: a Redis given that does not answer at the start is a typo, not an outage


def refuse_unreachable(redis_url: str, wait_s: float = RUN_REDIS_WAIT_S) -> None:
    """``arbiter run`` with a Redis of its user's: one that does not answer within ``wait_s`` is a
    ConfigError before anything starts (``serve`` rides out a Redis not up yet, as an orchestrator
    may start it after the evaluator)."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_connect_timeout=1.0, socket_timeout=1.0)
    give_up = time.monotonic() + wait_s
    try:
        while True:
            try:
                client.ping()
                return
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if time.monotonic() >= give_up:
                    raise ConfigError(
                        f"cannot reach Redis at {redacted(redis_url)} ({exc}): is it running, and is the URL "
                        "(--redis-url, ARBITER_REDIS_URL) right? Without one, arbiter run starts its own"
                    ) from None
                time.sleep(0.2)  # a Redis starting up: asked again
    finally:
        client.close()


def flatland_default_redis() -> str:
    """Where flatland's client looks for Redis."""
    return f"redis://{os.environ.get('redis_ip', '127.0.0.1')}:6379/0"


def given_service_id(args: argparse.Namespace) -> str | None:
    """The service id the flag or the environment names, if any."""
    if args.service_id is not None:
        return keys.validate_service_id(args.service_id)
    return os.environ.get("AICROWD_SUBMISSION_ID") or None


def resolve_service_id(args: argparse.Namespace) -> str:
    return keys.validate_service_id(given_service_id(args) or DEFAULT_SERVICE_ID)


DEFAULT_RESULTS_ROOT = "arbiter-results"  # in the current folder


def first_missing(path: str) -> str | None:
    """The outermost folder of ``path`` that does not exist yet (what a run would create), or None."""
    missing = None
    current = os.path.abspath(path)
    while not os.path.exists(current):
        missing = current
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return missing


def claim_results(args: argparse.Namespace) -> tuple[str, str | None]:
    """The results folder, and the outermost folder made for it here or to be made by the
    evaluation (None: there was one): what a command that fails before anything is evaluated
    removes again.

    ``--results`` as given, made later by the evaluation. Else a new folder
    ``arbiter-results/run-<date>-<time>`` made now, with ``-2``, ``-3`` ... after the name when
    another run took it: making it is what claims it, so runs started in the same second never
    share one."""
    if args.results:
        refuse_unusable_results(args.results)
        return args.results, first_missing(args.results)
    try:
        made_root = _made(DEFAULT_RESULTS_ROOT)
        os.makedirs(DEFAULT_RESULTS_ROOT, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot make the results folder {DEFAULT_RESULTS_ROOT} in {os.getcwd()} ({exc.strerror}): run from a "
            "folder you can write in, or give --results DIR"
        ) from None
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    default = os.path.join(DEFAULT_RESULTS_ROOT, f"run-{stamp}")
    found, number = default, 1
    while not _made(found):  # another run started within the same second
        number += 1
        found = f"{default}-{number}"
    return found, DEFAULT_RESULTS_ROOT if made_root else found


def refuse_unusable_results(results_dir: str) -> None:
    """A ``--results`` that is a file, lies under one, or in a folder that cannot be written, is
    said before anything starts, naming the option: the system's own error, later, names neither
    the option nor what to do."""
    if os.path.exists(results_dir) and not os.path.isdir(results_dir):
        raise ConfigError(f"--results {results_dir} is a file, not a folder: give a folder (a new one is made)")
    existing = nearest_existing(results_dir)
    if not os.path.isdir(existing):
        raise ConfigError(f"--results {results_dir}: {existing} is a file, so no folder can be made under it")
    # access() answers for this user and this mount: a read-only file system is refused as well.
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--results {results_dir}: {existing} cannot be written (no write permission, or a read-only file "
            "system); give another folder"
        )


def _made(folder: str) -> bool:
    """Whether this call made ``folder`` (False: it was there already)."""
    try:
        os.mkdir(folder)
    except FileExistsError:
        return False
    return True


def refuse_earlier_results(results_dir: str) -> None:
    """A new evaluation starts from an empty record: an earlier evaluation's results in the folder
    would be removed, and one a kill cut short could still be resumed. Left alone, and said."""
    earlier = [name for name in (SUMMARY_FILE, EPISODES_FILE) if os.path.isfile(os.path.join(results_dir, name))]
    if earlier:
        raise ConfigError(
            f"{results_dir} already holds an evaluation's results ({', '.join(earlier)}): give another --results "
            "folder, remove that one, or go on with the evaluation it holds "
            f"(arbiter run --resume --results {results_dir}, with the same options)"
        )


# What an evaluation writes once it has started: a folder with neither holds none to resume yet.
STARTED_FILES = (EVENTS_FILE, EPISODES_FILE)


def resumed_tests(args: argparse.Namespace, spec: CompetitionSpec, tests: str | None) -> str | None:
    """The test folder a ``--resume`` plays: the one its evaluation started on (``seed.json``),
    unless another is given, which is refused: its items' names would match another test set's,
    the data behind them would not. For a format that reads no tests, ``tests`` as it is."""
    if not args.results:
        raise ConfigError("--resume needs the --results folder of the evaluation to continue")
    started_on = recorded_tests(args.results)
    if tests and started_on and os.path.realpath(tests) != os.path.realpath(started_on):
        raise ConfigError(
            f"--resume: the evaluation started on the test folder {started_on}, not {tests}; resume it without "
            "--tests, or with that folder"
        )
    if not tests and get_format(spec.format).requires_tests:
        # A local run's may be the format's default test set, whose cache folder the participant never typed.
        if not started_on:
            raise ConfigError(f"--resume: {args.results} names no test folder (no seed.json): give it with --tests DIR")
        tests = started_on
        print(f"arbiter: --resume: playing the test folder the evaluation started on, {tests}", file=sys.stderr)
    return tests


def holds_an_evaluation(results_dir: str) -> bool:
    """Whether ``results_dir`` holds an evaluation that started (one a resume continues)."""
    return any(os.path.isfile(os.path.join(results_dir, name)) for name in STARTED_FILES)
