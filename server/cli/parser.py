"""The command line's parser: ``arbiter``'s commands and their options (server/cli.py runs them)."""

from __future__ import annotations

import argparse
import difflib
import tomllib
from typing import Any

from arbiter.server.cli.hosting import add_hosting_parsers
from arbiter.server.cli.leaderboard import add_leaderboard_parser
from arbiter.server.cli.option_values import (
    DEFAULT_SERVICE_ID,
    count,
    folder,
    log_level,
    participant,
    positive,
    seconds,
)
from arbiter.server.cli.results_parsers import add_results_parsers
from arbiter.server.core.budgets import BudgetPolicy
from arbiter.server.core.competition import (
    DEBUG_EPISODES,
    DEBUG_OVERALL_S,
    DEFAULT_COMPETITION,
    phase_value,
    preset_names,
    preset_paths,
)
from arbiter.server.formats import format_names


def _default_competition() -> dict[str, Any]:
    """The default competition's keys, for the help: read from its preset file alone (no format
    is loaded for a --help)."""
    with open(preset_paths()[DEFAULT_COMPETITION], "rb") as handle:
        return tomllib.load(handle)


def _shared_options(parser: argparse.ArgumentParser, command: str) -> None:
    """The options of ``run`` and ``serve``; their help gives the default that applies to ``command``."""
    run = command == "run"
    default_competition = _default_competition()
    budgets = {**BudgetPolicy().as_dict(), **default_competition.get("budgets", {})}

    def competition_default(key: str, variable: str | None = None) -> str:
        value = budgets[key]
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        where = f"${variable}, else " if variable else ""
        return f"(default: {where}the competition's; {shown} in {DEFAULT_COMPETITION})"

    parser.add_argument(
        "--tests",
        metavar="DIR",
        help="the data evaluated on: a Flatland test folder (Test_<t>/Level_<l>.pkl + metadata.csv) or a MetaLC "
        "meta-dataset (default: the competition's `tests`, else for Flatland $AICROWD_TESTS_FOLDER, else "
        + (
            "an 8-env debug set generated once into ~/.cache/arbiter or $ARBITER_CACHE_DIR)"
            if run
            else "none: Flatland and MetaLC need one)"
        ),
    )
    parser.add_argument(
        "--redis-url",
        metavar="URL",
        help="the Redis to use (default: $ARBITER_REDIS_URL, else "
        + (
            "a redis-server of its own on port 6379 of 127.0.0.1 or the next free loopback address, named to the "
            "agent in $redis_ip; else on a free port; stopped at the end)"
            if run
            else "redis://$redis_ip:6379/0, with redis_ip 127.0.0.1 when unset)"
        ),
    )
    parser.add_argument(
        "--service-id",
        metavar="ID",
        help=f"evaluation id, the Redis key namespace (default: $AICROWD_SUBMISSION_ID, else {DEFAULT_SERVICE_ID})",
    )
    parser.add_argument(
        "--results",
        type=folder,
        metavar="DIR",
        help="results folder (default: arbiter-results/run-<date>-<time> in the current folder"
        + (")" if run else "; --resume needs the evaluation's own)"),
    )
    parser.add_argument(
        "--participant",
        type=participant,
        metavar="NAME",
        help="whose evaluation it is: summary.json gets a `submission` block naming NAME, the service id and "
        "when the evaluation started, so a leaderboard can rank it"
        + (" (default: none)" if run else "; --resume keeps the identity the evaluation started with (default: none)"),
    )
    parser.add_argument(
        "--competition",
        default=None,
        metavar="NAME|FILE",
        help=f"competition preset ({', '.join(preset_names())}) or a .toml file (default: {DEFAULT_COMPETITION})",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a competition key, validated like the file (dotted for tables: --set phase2.max_steps=20000)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue a killed or interrupted evaluation after its last finished item (its --results, the same "
        "options)" + (", with the agent started again" if run else ""),
    )
    parser.add_argument(
        "--phase",
        metavar="P",
        type=phase_value,
        help="the format's phase to run, as --set phase=P (two-phase: 1 or 2, default both; MetaLC: dev or final)",
    )
    parser.add_argument(
        "--scoring",
        metavar="RULE",
        help="the format's scoring rule, e.g. flatland: neurips2020 or flatland3 (default: the competition's)",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"debug run, not an official score: {DEBUG_OVERALL_S / 60:g} minutes overall and the first "
        f"{DEBUG_EPISODES} episodes (MetaLC: datasets; two-phase plays its whole plan) (default: off, unless "
        "$AICROWD_DEBUG_SUBMISSION=1)",
    )
    seed_default = (
        "for Flatland $FLATLAND_EVALUATION_RANDOM_SEED, else the competition's; "
        f"{default_competition.get('seed')} in {DEFAULT_COMPETITION}"
    )
    if not run:
        seed_default += "; a hosted evaluation of a format whose seeds stay secret (two-phase, DIAMBRA) draws one"
    parser.add_argument(
        "--seed", type=count, metavar="N", help=f"the seed every env is reset with (default: {seed_default})"
    )
    parser.add_argument(
        "--record",
        type=count,
        metavar="N",
        help="keep the actions of the first N episodes for `arbiter replay`, in formats that record them "
        "(flatland) (default: the competition's record_episodes, 0 in its presets)",
    )
    parser.add_argument(
        "--planning-timeout",
        type=positive(float),
        metavar="S",
        help="planning budget per episode " + competition_default("planning_s", "FLATLAND_INITIAL_PLANNING_TIMEOUT"),
    )
    parser.add_argument(
        "--step-timeout",
        type=positive(float),
        metavar="S",
        help="budget per step " + competition_default("step_s", "FLATLAND_PER_STEP_TIMEOUT"),
    )
    parser.add_argument(
        "--overall-timeout",
        type=positive(float),
        metavar="S",
        help="budget for the whole evaluation " + competition_default("overall_s", "FLATLAND_OVERALL_TIMEOUT"),
    )
    parser.add_argument(
        "--idle-timeout",
        type=positive(float),
        metavar="S",
        help="wait for a client / the next episode before ending "
        + competition_default("idle_s", "FLATLAND_DEFAULT_COMMAND_TIMEOUT"),
    )
    parser.add_argument(
        "--max-successive-timeouts",
        type=positive(int),
        metavar="N",
        help="timeouts in a row that end the evaluation "
        + competition_default("max_successive_timeouts", "FLATLAND_MAX_SUCCESSIVE_TIMEOUTS"),
    )
    parser.add_argument(
        "--time-bank",
        type=seconds,
        metavar="S",
        help="per episode: seconds planning and steps may run over their budgets in all "
        + competition_default("time_bank_s"),
    )
    parser.add_argument(
        "--redis-outage-timeout",
        type=positive(float),
        default=60.0,
        metavar="S",
        help="how long the evaluator rides out a Redis outage before stopping as INTERRUPTED (default: 60)",
    )
    parser.add_argument(
        "--refuse-pickle",
        action="store_true",
        help="answer pickled requests (FlatlandRemoteClient(use_pickle=True)) with an error instead of serving "
        "them (default: served, unless the competition says accept_pickle = false)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress lines" + (" (the agent's own output still shows)" if run else ""),
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        type=log_level,
        metavar="LEVEL",
        help="Python logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL (default: WARNING)",
    )


def _generate_parser(commands: argparse._SubParsersAction) -> None:
    """``arbiter generate``: each option is read by the generator of one format (its help says
    which); the generator refuses an option it does not read."""
    generate = commands.add_parser(
        "generate",
        help="write a format's test data: a Flatland test folder, or a synthetic MetaLC meta-dataset (--format metalc)",
    )
    generate.add_argument("--out", required=True, metavar="DIR", help="the folder to write")
    generate.add_argument(
        "--format",
        default="flatland",
        choices=format_names(),
        help="whose test data to write (default: flatland)",
    )
    generate.add_argument(
        "--preset", metavar="NAME", help="flatland: the test set's preset, e.g. debug (8 envs, the default) or tiny"
    )
    generate.add_argument(
        "--seed", type=count, help="the generator's seed: the same seed writes the same data (default: the format's)"
    )
    generate.add_argument("--overwrite", action="store_true", help="replace a non-empty DIR whole")
    generate.add_argument(
        "--datasets", type=int, metavar="N", help="metalc: datasets, at least 6, one per fold (default: 12)"
    )
    generate.add_argument("--algorithms", type=int, metavar="N", help="metalc: algorithms (default: 6)")
    generate.add_argument(
        "--missing-fraction", type=float, metavar="F", help="metalc: share of curves left out (default: 0)"
    )
    generate.add_argument(
        "--duplicate-fraction",
        type=float,
        metavar="F",
        help="metalc: share of curves with a repeated time (default: 0)",
    )


class CommandLineParser(argparse.ArgumentParser):
    """``arbiter``'s parser. argparse leaves an option no command takes to the top parser, which
    would print every command's usage and ``arbiter: error``; here the command it was given to
    says it, with its own usage, and names the option meant when the typo is close to one."""

    commands: dict[str, argparse.ArgumentParser]

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self.commands.get(getattr(parsed, "command", None) or "", self)
            command.error(f"unrecognized arguments: {' '.join(extras)}{_meant(command, extras)}")
        return parsed


def _meant(command: argparse.ArgumentParser, extras: list[str]) -> str:
    """`` (did you mean --results?)`` for the first unknown option close to one the command takes."""
    known = [option for action in command._actions for option in action.option_strings]
    for extra in extras:
        if extra.startswith("--"):
            close = difflib.get_close_matches(extra.partition("=")[0], known, n=1, cutoff=0.7)
            if close:
                return f" (did you mean {close[0]}?)"
    return ""


def _installed_version() -> str:
    """The version of the installed distribution (what a bug report should name)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("arbiter")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = CommandLineParser(prog="arbiter", description="A remote evaluator for RL competitions.")
    parser.add_argument("--version", action="version", version=f"arbiter {_installed_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    parser.commands = commands.choices

    run = commands.add_parser(
        "run", help="evaluate an agent locally in one command", usage="arbiter run [options] -- AGENT_COMMAND..."
    )
    _shared_options(run, "run")
    run.add_argument("agent", nargs=argparse.REMAINDER, help="the agent command, after --")

    serve = commands.add_parser("serve", help="run the evaluator alone (hosted evaluation)")
    _shared_options(serve, "serve")
    private = "the Redis serves this evaluation alone: full, it was filled by the agent, and the evaluation fails"
    serve.add_argument("--private-redis", action="store_true", help=private + " (not INTERRUPTED)")
    serve.add_argument(
        "--no-agent",
        action="store_true",
        help="with --resume: no agent will come, as every item is on record; the evaluation ends at once "
        "(refused when items are left to play)",
    )

    _generate_parser(commands)
    add_results_parsers(commands)  # watch, replay, rescore, report
    acl = commands.add_parser("acl", help="print the Redis ACL rule for one evaluation's participant")
    acl.add_argument("--service-id", required=True)
    acl.add_argument("--password", required=True, help="the participant's Redis password (printed only hashed)")
    acl.add_argument("--user", help="ACL user name (default participant-<service id>; 'default' for legacy clients)")
    acl.add_argument(
        "--format",
        choices=["command", "config"],
        default="command",
        help="command: an ACL SETUSER line for redis-cli (default); config: a `user` line for a redis.conf file",
    )
    add_hosting_parsers(commands)  # submit, worker, submissions, cancel
    add_leaderboard_parser(commands)
    return parser
