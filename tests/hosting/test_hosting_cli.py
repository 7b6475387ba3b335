"""`arbiter submit`, `worker`, `submissions` and `cancel` from the command line: one clear
message and the right exit status for bad input, and nothing changed."""

from __future__ import annotations

import redis
from hosting_farm import arbiter, competition_file, seeded_agent

from arbiter.server.cli.embedded_redis import free_port
from arbiter.server.cli.parser import build_parser
from arbiter.server.hosting.submissions import SubmissionStore


def test_the_four_commands_parse() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["submit", "--redis-url", "redis://h/0", "--competition", "c", "--participant", "p", "--phase", "2",
         "--debug", "--set", "a=1", "--workdir", "w", "--quiet", "--", "python", "agent.py"]
    )  # fmt: skip
    assert (args.command, args.phase, args.debug, args.set, args.workdir) == ("submit", 2, True, ["a=1"], "w")
    assert args.agent == ["--", "python", "agent.py"]
    args = parser.parse_args(["worker", "--redis-url", "redis://h/0", "--results-root", "r", "--burst"])
    assert (args.backend, args.burst, args.results_root) == ("local", True, "r")
    args = parser.parse_args(["submissions", "--redis-url", "redis://h/0", "--participant", "p", "--json"])
    assert (args.participant, args.json) == ("p", True)
    assert parser.parse_args(["cancel", "--redis-url", "redis://h/0", "sub-1"]).submission == "sub-1"


def test_submit_prints_the_id_alone_when_quiet(redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path) -> None:
    competition = competition_file(tmp_path, tiny_tests, hosting="daily_submissions = 1")
    done = arbiter("submit", "--redis-url", redis_url, "--competition", competition, "--participant", "alice",
                   "--quiet", "--", *seeded_agent())  # fmt: skip
    assert done.returncode == 0, done.stderr
    submission_id = done.stdout.strip()
    assert SubmissionStore(redis_conn).get(submission_id).participant == "alice"

    refused = arbiter("submit", "--redis-url", redis_url, "--competition", competition, "--participant", "alice",
                      "--", *seeded_agent())  # fmt: skip
    assert refused.returncode == 3
    assert refused.stderr.count("\n") == 1 and "resets at" in refused.stderr and refused.stdout == ""
    assert [one.id for one in SubmissionStore(redis_conn).listing()] == [submission_id]


def test_bad_input_gets_one_line_and_status_2(redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    cases = [
        (("submit", "--competition", "nope", "--participant", "a", "--", "x"), "unknown competition 'nope'"),
        (("submit", "--competition", competition, "--participant", "a", "--workdir", str(tmp_path / "gone"),
          "--", "x"), "is not a folder"),
        (("submit", "--competition", competition, "--participant", "a"), "no agent command"),
        (("cancel", "sub-nope"), "no submission 'sub-nope'"),
    ]  # fmt: skip
    for command, message in cases:
        done = arbiter(command[0], "--redis-url", redis_url, *command[1:])
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr.startswith("arbiter: error: ") and message in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
    assert redis_conn.keys("*") == []


def test_an_unreachable_redis_is_one_line_and_status_2(tmp_path) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    for command in (
        ("submit", "--competition", "flatland-debug", "--participant", "a", "--", "x"),
        ("submissions",),
        ("cancel", "sub-1"),
        ("worker", "--results-root", str(tmp_path / "results"), "--burst"),
    ):
        done = arbiter(command[0], "--redis-url", nowhere, *command[1:])
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr.startswith("arbiter: error: cannot reach Redis"), done.stderr
        assert done.stderr.count("\n") == 1, done.stderr


def test_a_burst_worker_leaves_an_empty_queue_at_once(redis_url, tmp_path) -> None:
    done = arbiter("worker", "--redis-url", redis_url, "--results-root", str(tmp_path / "results"), "--burst")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "results").is_dir()


def test_debug_submissions_are_marked_in_the_listing(redis_url, redis_conn: redis.Redis, tiny_tests, tmp_path) -> None:
    competition = competition_file(tmp_path, tiny_tests)
    debug = arbiter("submit", "--redis-url", redis_url, "--competition", competition, "--participant", "alice",
                    "--debug", "--", *seeded_agent())  # fmt: skip
    assert debug.returncode == 0 and "queued debug submission" in debug.stdout
    official = arbiter("submit", "--redis-url", redis_url, "--competition", competition, "--participant", "alice",
                       "--quiet", "--", *seeded_agent())  # fmt: skip
    table = arbiter("submissions", "--redis-url", redis_url).stdout.splitlines()
    assert table[0].split()[:4] == ["id", "participant", "competition", "state"]
    rows = {line.split()[0]: line for line in table[1:]}
    debug_id = debug.stdout.split()[3]
    assert "farm (debug)" in rows[debug_id] and "queued" in rows[debug_id]
    assert "(debug)" not in rows[official.stdout.strip()]
