"""The reference pages name what the program has, and nothing else: every option that
docs/reference/command-line.md gives a command is one its parser takes, every key that
docs/reference/competition-file.md lists is one a competition file may hold (and every key a file
may hold is listed), and every error of docs/reference/clients.md is importable from
``arbiter.client`` with the code the page gives it. (That every option of the parser is in the
reference is test_docs_site.py's.)"""

from __future__ import annotations

import dataclasses
import re

import paths
import pytest

import arbiter.client
from arbiter.protocol.errors import ArbiterError, ConfigError
from arbiter.server.cli.parser import build_parser
from arbiter.server.core.competition import load_competition
from arbiter.server.formats import get_format

REFERENCE = paths.REPO / "docs" / "reference"
# Options of the programs a command runs, named in its section as examples (podman's --runtime,
# --tmpfs given through --container-option), not options of arbiter.
NOT_ARBITER_OPTIONS = {"--runtime", "--tmpfs"}


def sections(text: str) -> dict[str, str]:
    """The page's ``## `` sections, by heading."""
    return {m.group(1): m.group(2) for m in re.finditer(r"^## ([^\n]+)\n(.*?)(?=^## |\Z)", text, re.S | re.M)}


def first_cells(text: str) -> list[str]:
    """The backticked first cells of the section's table rows (header rows left out)."""
    return re.findall(r"^\| `([^`]+)`", text, re.M)


def test_every_option_the_command_line_reference_names_is_taken_by_its_command() -> None:
    parser = build_parser()
    commands = next(action for action in parser._actions if action.choices and action.dest == "command").choices
    page = sections((REFERENCE / "command-line.md").read_text(encoding="utf-8"))
    named = {
        heading[len("`arbiter ") : -1]: [text] for heading, text in page.items() if heading.startswith("`arbiter ")
    }
    for command in ("run", "serve"):
        named[command].append(page["Options of `run` and `serve`"])
    unknown = []
    for command, texts in named.items():
        taken = {option for action in commands[command]._actions for option in action.option_strings}
        for option in sorted({o for text in texts for o in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", text)}):
            if option not in taken and option not in NOT_ARBITER_OPTIONS:
                unknown.append(f"arbiter {command} {option}")
    assert sorted(named) == sorted(commands), "a command without its section, or a section without its command"
    assert not unknown, "options docs/reference/command-line.md names that the command does not take: " + ", ".join(
        unknown
    )


@pytest.mark.parametrize("command", ["run", "serve"])
def test_every_variable_a_default_of_the_reference_names_is_in_the_options_help(command: str) -> None:
    """An option whose default the reference says an environment variable gives says so in its
    `arbiter run --help` and `arbiter serve --help` too."""
    parser = build_parser()
    commands = next(action for action in parser._actions if action.choices and action.dest == "command").choices
    helps = {o: action.help or "" for action in commands[command]._actions for o in action.option_strings}
    table = sections((REFERENCE / "command-line.md").read_text(encoding="utf-8"))["Options of `run` and `serve`"]
    missing = []
    for option, default in re.findall(r"^\| `(--[a-z-]+)[^|]*\|[^|]*\| ([^|]*) \|$", table, re.M):
        other = "serve" if command == "run" else "run"
        applying = re.sub(rf"`{other}`:[^;]*(?:;|$)", "", default)  # "`run`: ...; `serve`: ..." defaults
        for variable in re.findall(r"\$([A-Za-z_]+)", applying):
            if f"${variable}" not in helps[option]:
                missing.append(f"{option}: ${variable}")
    assert not missing, f"variables the reference gives as defaults, missing from arbiter {command} --help: {missing}"


def allowed(assignment: str, competition: str = "flatland-neurips2020") -> set[str]:
    """The keys the loader says a file may hold where ``assignment`` puts an unknown one."""
    with pytest.raises(ConfigError) as refused:
        load_competition(competition, [assignment])
    listed = re.search(r"allowed: \[([^]]*)\]", str(refused.value))
    assert listed, str(refused.value)
    return set(re.findall(r"'([^']+)'", listed.group(1)))


def test_every_competition_key_the_reference_lists_is_the_loaders_and_every_key_is_listed() -> None:
    page = sections((REFERENCE / "competition-file.md").read_text(encoding="utf-8"))
    core = {cell.strip("[]") for cell in first_cells(page["Core keys"])}
    core |= {"hosting", "leaderboard"}  # their own sections, ## Hosting and ## Leaderboard
    own = {f.name for f in dataclasses.fields(get_format("flatland").options)}
    tables = {
        "core keys": (core, allowed("no_such_key=1") - own),
        "[budgets]": (set(first_cells(page["Budgets"])), allowed("budgets.no_such_key=1")),
        "[hosting]": (set(first_cells(page["Hosting"])), allowed("hosting.no_such_key=1")),
        "[leaderboard]": (set(first_cells(page["Leaderboard"])), allowed("leaderboard.no_such_key=1")),
    }
    wrong = []
    for table, (listed, taken) in tables.items():
        wrong += [f"{table}: {key!r} is listed, and refused" for key in sorted(listed - taken)]
        wrong += [f"{table}: {key!r} is taken, and not listed" for key in sorted(taken - listed)]
    assert not wrong, "docs/reference/competition-file.md against the loader:\n" + "\n".join(wrong)


def test_every_error_of_the_clients_page_is_importable_from_the_client_with_its_code() -> None:
    errors = sections((REFERENCE / "clients.md").read_text(encoding="utf-8"))["Errors"]
    rows = re.findall(r"^\| (`\w+`(?:, `\w+`)*) \| (`\w+`(?:, `\w+`)*) \|", errors, re.M)
    assert len(rows) >= 10, "the errors table was not found"
    wrong = []
    for classes, codes in rows:
        for name, code in zip(re.findall(r"`(\w+)`", classes), re.findall(r"`(\w+)`", codes), strict=True):
            found = getattr(arbiter.client, name, None)
            if not (isinstance(found, type) and issubclass(found, ArbiterError)):
                wrong.append(f"{name} is not importable from arbiter.client")
            elif found.code != code:
                wrong.append(f"{name}'s code is {found.code}, not {code}")
    assert not wrong, "docs/reference/clients.md's errors against the client:\n" + "\n".join(wrong)
