"""The parsers of the commands that read an evaluation rather than run one: ``watch`` (its events
as they come), ``replay``, ``rescore`` and ``report`` (its results folder)."""

from __future__ import annotations

import argparse

from arbiter.server.cli.option_values import DEFAULT_SERVICE_ID, positive


def add_results_parsers(commands: argparse._SubParsersAction) -> None:
    _watch_and_replay_parsers(commands)
    _rescore_parser(commands)
    report = commands.add_parser("report", help="write a self-contained report.html from a results folder")
    report.add_argument("results", metavar="RESULTS_DIR", help="the results folder of the evaluation")
    report.add_argument("--out", metavar="FILE", help="the HTML file to write (default RESULTS_DIR/report.html)")


def _watch_and_replay_parsers(commands: argparse._SubParsersAction) -> None:
    watch = commands.add_parser("watch", help="follow an evaluation's progress from another terminal")
    watch.add_argument(
        "--service-id",
        metavar="ID",
        help="the evaluation to follow "
        f"(default: $AICROWD_SUBMISSION_ID, else the local run's, else {DEFAULT_SERVICE_ID})",
    )
    watch.add_argument(
        "--redis-url",
        metavar="URL",
        help="its Redis (default: $ARBITER_REDIS_URL, else the `arbiter run` going on on this machine for this "
        "user, else redis://$redis_ip:6379/0)",
    )
    start = watch.add_mutually_exclusive_group()
    start.add_argument(
        "--from-start", dest="from_start", action="store_true", default=True, help="show the history first (default)"
    )
    start.add_argument("--new-only", dest="from_start", action="store_false", help="show only events from now on")
    watch.add_argument(
        "--timeout",
        type=positive(float),
        default=3600.0,
        metavar="S",
        help="give up after S s with no event (default: 3600)",
    )
    replay = commands.add_parser("replay", help="render a recorded episode as an animated GIF, and check it")
    replay.add_argument("results", metavar="RESULTS_DIR", help="the results folder of the evaluation")
    replay.add_argument("episode", type=int, metavar="EPISODE", help="episode index, as in episodes.jsonl")
    replay.add_argument("--out", required=True, metavar="FILE.gif", help="the GIF to write")
    replay.add_argument("--tests", metavar="DIR", help="the evaluation's test folder (default: from summary.json)")
    replay.add_argument("--renderer", default="PILSVG", choices=["PILSVG", "PIL"], help="PIL is plainer and faster")
    replay.add_argument("--fps", type=positive(float), default=8.0, help="frames per second (default 8)")
    replay.add_argument("--every", type=positive(int), metavar="K", help="draw every K-th step (default: 500 frames)")


def _rescore_parser(commands: argparse._SubParsersAction) -> None:
    rescore = commands.add_parser(
        "rescore",
        help="recompute an evaluation's score from its results folder and check it against summary.json",
        description="Recompute the score of a finished evaluation from its results folder alone: summary.json "
        "names the format, the scoring rule and the format's options, episodes.jsonl holds the records. The "
        "rule is rebuilt from them, the format derives its per-record figures again from the raw fields where "
        "it has such figures (flatland: each episode's normalized return and arrived fraction), and the records "
        "are scored. Every figure is compared with the recorded one: the score and the leaderboard's figures in "
        "summary.json and the derived figures in episodes.jsonl (numbers to 1e-12). An evaluation that did "
        "not end in SUCCESS has no score; it matches when summary.json has none either.",
        epilog="exit status: 0 when every figure matches, 1 when one differs (each difference is named), 2 when "
        "the folder cannot be rescored (no summary.json, unknown rule ...)",
    )
    rescore.add_argument("results", metavar="RESULTS_DIR", help="the results folder of the evaluation")
    rescore.add_argument(
        "--json",
        action="store_true",
        help="print the recomputed and recorded scores, the differences and the verdict as one JSON object "
        "(default: a table of every figure, then the verdict)",
    )
    rescore.add_argument(
        "--scoring",
        metavar="RULE",
        help="score with another rule of the format, when the records can be scored under it (flatland's two "
        "rules use different reward models: refused); the result then differs from summary.json's by its rule "
        "(default: the rule summary.json names)",
    )
