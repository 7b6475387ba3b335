"""``arbiter leaderboard``: a competition's board, rebuilt from its results folders."""

from __future__ import annotations

import argparse
import json
import os
import sys

from arbiter.protocol.errors import ConfigError
from arbiter.server.leaderboard.policy import POLICIES, RANKINGS


def add_leaderboard_parser(commands: argparse._SubParsersAction) -> None:
    board = commands.add_parser(
        "leaderboard",
        help="rank a competition's submissions from their results folders",
        description="Read every results folder of the competition under RESULTS_ROOT/<competition>/ (any folder "
        "holding a summary.json), rank each participant's submission by the competition file's [leaderboard] "
        "table, write leaderboard.html, leaderboard.csv and leaderboard.json, and print the table. Nothing is "
        "stored between builds: the board is rebuilt from the folders and the competition file each time, from "
        "the records under a changed rule ([leaderboard] scoring) or with --from-records. Debug submissions never "
        "appear; failed and unscored ones are listed apart.",
        epilog="exit status: 0 when the board is written, 2 on bad input (unknown competition, no results, a "
        "hidden phase without --reveal ...)",
    )
    board.add_argument("--results-root", required=True, metavar="DIR", help="the folder the workers write results to")
    board.add_argument(
        "--competition", required=True, metavar="NAME|FILE", help="a preset's name or a competition file"
    )
    board.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a key of the competition file"
    )
    board.add_argument(
        "--phase", metavar="P", help="the phase to rank (default: [leaderboard] phase; needed when results mix phases)"
    )
    board.add_argument(
        "--out",
        metavar="DIR",
        help="where the three files go (default RESULTS_ROOT/leaderboards/<competition>, -<phase> for a phase)",
    )
    board.add_argument("--ranking", choices=RANKINGS, help="the ranking rule (default: [leaderboard] ranking)")
    board.add_argument("--policy", choices=POLICIES, help="each participant's best or latest submission")
    board.add_argument("--json", action="store_true", help="print leaderboard.json instead of the table")
    board.add_argument(
        "--reveal",
        action="store_true",
        help="write the board of a hidden phase ([leaderboard] hidden_phases)",
    )
    board.add_argument("--diff", metavar="OLD.json", help="an earlier leaderboard.json: print who moved since")
    board.add_argument(
        "--from-records",
        action="store_true",
        help="recompute every figure from the folders' episodes.jsonl, trusting no summary.json's (an audit)",
    )


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from arbiter.server.core.competition import load_competition
    from arbiter.server.leaderboard.board import build_board
    from arbiter.server.leaderboard.outputs import board_text, check_comparable, moves, read_board, write_board

    spec = load_competition(args.competition, args.set)
    old = read_board(args.diff) if args.diff else None  # read before writing: OLD may be the file rewritten
    board = build_board(
        spec,
        args.results_root,
        phase=args.phase,
        ranking=args.ranking,
        policy=args.policy,
        reveal=args.reveal,
        from_records=args.from_records,
    )
    if old is not None:  # before anything is written
        check_comparable(old, board, args.diff)
    suffix = f"-{board['phase']}" if board["phase"] is not None else ""
    out = args.out or os.path.join(args.results_root, "leaderboards", f"{spec.name}{suffix}")
    try:
        written = write_board(board, out)
    except OSError as exc:  # the board is still shown: only its files are missing
        print(json.dumps(board, indent=2) if args.json else board_text(board))
        raise ConfigError(
            f"cannot write the board's files into {out}: {exc.strerror or exc}; name a folder that can be written "
            "with --out DIR"
        ) from None
    if args.json:
        print(json.dumps(board, indent=2))
    else:
        print(board_text(board))
        print("wrote " + ", ".join(written))
    if old is not None:  # with --json, stdout holds the JSON alone
        moved = moves(old, board)
        said = sys.stderr if args.json else sys.stdout
        print(f"since {args.diff}:" if moved else f"since {args.diff}: nobody moved", file=said)
        for line in moved:
            print(f"  {line}", file=said)
    return 0
