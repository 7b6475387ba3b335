"""server/cli/parser.py: ``arbiter``'s commands and options as the parser reads them.

Each test parses a command line the way a user types it and checks what the command would be
given, or that a bad value stops with a message naming it (argparse exits with status 2). The
commands running for real are in tests/cli/test_cli.py and tests/cli/test_newcomer.py.
"""

from __future__ import annotations

import pytest

from arbiter.server.cli.parser import build_parser


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def refused(capsys, *argv: str) -> str:
    """The error argparse prints for ``argv``; it must exit with status 2."""
    with pytest.raises(SystemExit) as exited:
        parse(*argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_a_command_is_required(capsys):
    assert "required" in refused(capsys)


def test_run_takes_the_agent_command_after_a_double_dash():
    args = parse("run", "--tests", "/data/tests", "--", "python", "agent.py", "--fast")
    assert args.command == "run" and args.tests == "/data/tests"
    assert args.agent[-3:] == ["python", "agent.py", "--fast"]


def test_options_left_out_are_none_so_the_competition_decides():
    args = parse("serve")
    for option in ("tests", "redis_url", "service_id", "results", "competition", "scoring", "seed", "record"):
        assert getattr(args, option) is None, option
    for budget in ("planning_timeout", "step_timeout", "overall_timeout", "idle_timeout", "time_bank"):
        assert getattr(args, budget) is None, budget
    assert args.resume is False and args.debug is False and args.set == []
    assert args.redis_outage_timeout == 60.0 and args.log_level == "WARNING"


def test_serve_reads_budgets_overrides_and_resume():
    args = parse(
        "serve", "--resume", "--step-timeout", "0.5", "--max-successive-timeouts", "3", "--time-bank", "0",
        "--set", "phase2.max_steps=200", "--set", "seed=4", "--phase", "2", "--refuse-pickle", "--record", "0",
    )  # fmt: skip
    assert args.resume and args.step_timeout == 0.5 and args.max_successive_timeouts == 3
    assert args.time_bank == 0.0 and args.record == 0 and args.phase == 2 and args.refuse_pickle
    assert args.set == ["phase2.max_steps=200", "seed=4"]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--step-timeout", "0", "'0' must be positive"),
        ("--step-timeout", "fast", "'fast' is not a number"),
        ("--max-successive-timeouts", "1.5", "'1.5' is not a whole number"),
        ("--time-bank", "-1", "'-1' must be 0 or more"),
        ("--time-bank", "inf", "'inf' must be 0 or more"),
        ("--record", "-2", "'-2' must be 0 or more"),
        ("--record", "all", "'all' is not a whole number"),
        ("--participant", " ", "is empty: name the participant"),
        ("--participant", "alice\nbob", "holds a control character"),
        ("--log-level", "LOUD", "'LOUD' is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("--results", "", "an empty folder name"),
        ("--seed", "-1", "'-1' must be 0 or more"),
    ],
)
def test_a_bad_value_is_refused_with_the_value_named(capsys, option, value, message):
    error = refused(capsys, "serve", option, value)
    assert message in error and option in error


def test_a_worker_takes_a_log_level_in_any_case_and_refuses_another_word(capsys):
    farm = ("worker", "--redis-url", "redis://127.0.0.1:1/0", "--results-root", "r")
    assert parse(*farm).log_level == "WARNING"
    assert parse(*farm, "--log-level", "debug").log_level == "DEBUG"
    error = refused(capsys, *farm, "--log-level", "LOUD")
    assert "'LOUD' is not one of DEBUG, INFO, WARNING, ERROR, CRITICAL" in error and "--log-level" in error


def test_run_and_serve_name_the_participant_trimmed():
    assert parse("serve", "--participant", " alice ").participant == "alice"
    assert parse("run", "--participant", "team blue", "--", "agent").participant == "team blue"
    assert parse("serve").participant is None


def test_run_and_serve_take_resume():
    assert parse("run", "--resume", "--results", "r", "--", "agent").resume
    assert parse("serve", "--resume", "--results", "r").resume
    assert not parse("run", "--", "agent").resume


def test_generate_needs_an_out_folder_and_has_defaults(capsys):
    assert "--out" in refused(capsys, "generate")
    args = parse("generate", "--out", "tests-folder")
    assert (args.out, args.format, args.seed, args.overwrite) == ("tests-folder", "flatland", None, False)
    assert parse("generate", "--out", "tests-folder", "--preset", "tiny").preset == "tiny"
    metalc = parse("generate", "--out", "meta", "--format", "metalc", "--datasets", "18")
    assert metalc.format == "metalc" and metalc.datasets == 18


def test_watch_starts_from_the_history_unless_asked_for_new_events_only(capsys):
    assert parse("watch").from_start is True and parse("watch").timeout == 3600.0
    assert parse("watch", "--new-only").from_start is False
    assert "not allowed with" in refused(capsys, "watch", "--new-only", "--from-start")


def test_replay_reads_its_results_folder_episode_and_gif():
    args = parse("replay", "results", "3", "--out", "episode.gif", "--every", "2")
    assert (args.results, args.episode, args.out, args.every, args.renderer) == (
        "results",
        3,
        "episode.gif",
        2,
        "PILSVG",
    )


def test_acl_needs_its_service_id_and_password(capsys):
    assert "--password" in refused(capsys, "acl", "--service-id", "svc")
    args = parse("acl", "--service-id", "svc", "--password", "secret", "--format", "config")
    assert (args.service_id, args.password, args.format, args.user) == ("svc", "secret", "config", None)


def test_report_writes_next_to_its_results_unless_told(capsys):
    assert parse("report", "results").out is None
    assert parse("report", "results", "--out", "page.html").out == "page.html"


def test_the_help_of_run_and_serve_gives_the_defaults_that_apply_to_each(capsys):
    for command in ("run", "serve"):
        with pytest.raises(SystemExit) as exited:
            parse(command, "--help")
        assert exited.value.code == 0
        text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
        assert "--planning-timeout" in text and "the competition's" in text
        if command == "run":
            assert "a redis-server of its own" in text
        else:
            assert "--resume" in text and "redis://$redis_ip:6379/0" in text


@pytest.mark.parametrize(
    ("competition", "phase", "expected"),
    [("two-phase-cartpole", "2", 2), ("metalc-wcci2022", "final", "final"), ("metalc-wcci2022", "dev", "dev")],
)
def test_phase_takes_whatever_phases_the_format_has(competition, phase, expected):
    from arbiter.server.cli.settings import resolve_spec

    args = build_parser().parse_args(["serve", "--competition", competition, "--phase", phase])
    assert args.phase == expected and resolve_spec(args).options.phase == expected


@pytest.mark.parametrize(
    ("competition", "phase", "message"),
    [
        ("two-phase-cartpole", "3", "phase must be 1 or 2"),
        ("metalc-wcci2022", "2", "phase must be str, got 2"),
        ("metalc-wcci2022", "test", "unknown MetaLC phase .test.; known: dev, final"),
        ("flatland-neurips2020", "1", "has no phases to choose from"),
    ],
)
def test_a_phase_the_format_does_not_have_is_refused_by_it(competition, phase, message):
    from arbiter.protocol.errors import ConfigError
    from arbiter.server.cli.settings import resolve_spec

    args = build_parser().parse_args(["serve", "--competition", competition, "--phase", phase])
    with pytest.raises(ConfigError, match=message):
        resolve_spec(args)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ("run", "--resutls", "out", "--", "python", "a.py"),
            "unrecognized arguments: --resutls (did you mean --results?)",
        ),
        (("watch", "--sevice-id", "x"), "unrecognized arguments: --sevice-id x (did you mean --service-id?)"),
        (("report", "r", "--zzz"), "unrecognized arguments: --zzz\n"),
    ],
)
def test_an_option_the_command_does_not_take_is_said_by_that_command(capsys, argv, said):
    """As the command line's page says: the command's own usage and ``arbiter COMMAND: error``,
    not every command's usage, and the option meant when the typo is close to one."""
    error = refused(capsys, *argv)
    assert error.startswith(f"usage: arbiter {argv[0]} ")
    assert f"arbiter {argv[0]}: error: {said}" in error


def test_version_names_the_installed_distribution(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"arbiter {version('arbiter')}"


def test_rescore_help_offers_no_rule_it_refuses(capsys):
    """Flatland's two rules pay rewards under different reward models, so ``--scoring flatland3``
    on a neurips2020 evaluation is refused: the help must not give it as the example."""
    with pytest.raises(SystemExit):
        parse("rescore", "--help")
    help_text = " ".join(capsys.readouterr().out.split())
    assert "flatland3 for a neurips2020" not in help_text
    assert "different reward models: refused" in help_text
