"""The manual stays whole: the MkDocs site builds strictly, every page is in its navigation, every
page and anchor that code, tests or the README cite exists, every command and option of the
command line is in its reference, every repository file the pages name exists, every shipped
format is listed wherever the manual lists formats by hand, and the README stays short and keeps
the two commands that CI and newcomers run."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import paths
import pytest
import yaml

from arbiter.server.cli.parser import build_parser
from arbiter.server.formats import KNOWN, get_format

REPO = paths.REPO
DOCS = REPO / "docs"
README = REPO / "README.md"
README_MAX_LINES = 200
# What the README promises, byte for byte: tests, CI (.ci/run) and newcomers run exactly these.
INSTALL_AND_RUN = "pip install -e . && arbiter run -- python examples/random_agent.py"
TEST_COMMAND = 'pip install -e ".[dev]" && python -m pytest'
# The pages code, tests and other pages are told they may cite: renaming one breaks them.
STABLE_PAGES = [
    "index.md",
    "getting-started.md",
    "local-runs.md",
    "hosted.md",
    "formats/flatland.md",
    "formats/two-phase.md",
    "formats/diambra.md",
    "formats/metalc.md",
    "adding-a-format.md",
    "reference/competition-file.md",
    "reference/results.md",
    "reference/command-line.md",
    "design/architecture.md",
    "design/wire.md",
    "design/scoring.md",
    "design/reliability.md",
    "design/performance.md",
]
# Where citations of the manual live: the code, its tests and scripts, and the README.
CITING_FOLDERS = ["server", "client", "protocol", "scripts", "tests"]
# docs/<page>.md with an optional #anchor, not inside a longer path (mydocs/, x/docs/).
DOCS_CITATION = re.compile(r"(?<![\w./-])docs/((?:[\w-]+/)*[\w-]+\.md)(?:#([\w-]+))?")
# A file or folder of the repository named in a page: a concrete path (no placeholder such as
# <name> or *) that ends in a file extension or a slash.
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:server|client|protocol|scripts|tests|examples|docker)/[\w./-]*?"
    r"(?:\.(?:py|md|yml|yaml|toml|json|txt|Dockerfile)|/))(?![\w<*])"
)


def cited_pages() -> list[tuple[str, str, str | None]]:
    """(citing file, page under docs/, anchor or None) for every citation of the manual."""
    sources = [README] + [
        path
        for folder in CITING_FOLDERS
        for path in sorted((REPO / folder).rglob("*.py"))
        if "__pycache__" not in path.parts
    ]
    found = []
    for source in sources:
        text = source.read_text(encoding="utf-8")
        for match in DOCS_CITATION.finditer(text):
            found.append((str(source.relative_to(REPO)), match.group(1), match.group(2)))
    return found


def nav_pages(entry: object) -> list[str]:
    """The page files a mkdocs.yml nav (or part of it) lists."""
    if isinstance(entry, str):
        return [entry]
    if isinstance(entry, list):
        return [page for item in entry for page in nav_pages(item)]
    if isinstance(entry, dict):
        return [page for value in entry.values() for page in nav_pages(value)]
    raise AssertionError(f"unexpected nav entry in mkdocs.yml: {entry!r}")


def built_page(site: Path, page: str) -> Path:
    """Where MkDocs (directory URLs) writes the HTML of docs/<page>."""
    stem = page[: -len(".md")]
    if stem == "index" or stem.endswith("/index"):
        return site / stem.removesuffix("index") / "index.html"
    return site / stem / "index.html"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once with `mkdocs build --strict` (a warning, such as a broken link or a
    page missing from the nav, fails the build)."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the dev extra has it: pip install -e '.[dev]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (pip install mkdocs-material)")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


@pytest.mark.timeout(300)
def test_the_site_builds_strictly_with_every_page(site: Path) -> None:
    for page in STABLE_PAGES:
        assert built_page(site, page).is_file(), f"docs/{page} was not built"


def test_the_pages_code_may_cite_exist() -> None:
    missing = [page for page in STABLE_PAGES if not (DOCS / page).is_file()]
    assert not missing, f"pages that code and tests may cite are missing: {missing}"


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = nav_pages(config["nav"])
    pages = sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md"))
    assert sorted(set(listed)) == sorted(listed), "a page is listed twice in the nav"
    assert sorted(listed) == pages, (
        f"pages not in the nav: {sorted(set(pages) - set(listed))}; "
        f"nav entries without a page: {sorted(set(listed) - set(pages))}"
    )


def test_every_cited_page_exists() -> None:
    citations = cited_pages()
    assert any(source == "README.md" for source, _, _ in citations), "the README links no page of the manual"
    missing = sorted({f"{source}: docs/{page}" for source, page, _ in citations if not (DOCS / page).is_file()})
    assert not missing, "citations of pages that do not exist:\n" + "\n".join(missing)


@pytest.mark.timeout(300)
def test_every_cited_anchor_exists(site: Path) -> None:
    missing = []
    for source, page, anchor in cited_pages():
        if anchor is None or not (DOCS / page).is_file():
            continue  # a missing page is test_every_cited_page_exists's to report
        html = built_page(site, page).read_text(encoding="utf-8")
        if f'id="{anchor}"' not in html:
            missing.append(f"{source}: docs/{page}#{anchor}")
    assert not missing, "citations of anchors that do not exist:\n" + "\n".join(sorted(set(missing)))


@pytest.mark.timeout(300)
def test_no_list_item_is_rendered_as_text(site: Path) -> None:
    """A list item that follows a paragraph with no blank line between them (the paragraph after
    a table or a code block inside an item, which Markdown ends the list before) is rendered as a
    line of that paragraph, dash and all."""
    literal = []
    for page in sorted(site.rglob("*.html")):
        html = page.read_text(encoding="utf-8")
        for paragraph in re.findall(r"<p>(.*?)</p>", html, re.S):
            for line in paragraph.split("\n")[1:]:
                if re.match(r"\s*(?:[-*]|\d+\.) \S", line):
                    literal.append(f"{page.relative_to(site)}: {re.sub(r'<[^>]+>', '', line).strip()[:80]}")
    assert not literal, "list items rendered as text (a blank line before them is missing):\n" + "\n".join(literal)


def test_the_reliability_page_defines_every_fault() -> None:
    """Tests' docstrings name faults F1 to F17; docs/design/reliability.md#f5 must lead to F5."""
    text = (DOCS / "design" / "reliability.md").read_text(encoding="utf-8")
    for number in range(1, 18):
        assert re.search(rf'id="f{number}"|\{{#f{number}\}}', text), f"no anchor f{number} on the reliability page"
        assert re.search(rf"\bF{number}\b", text), f"F{number} is not defined on the reliability page"


def test_the_readme_is_short_and_keeps_the_two_commands() -> None:
    readme = README.read_text(encoding="utf-8")
    lines = readme.count("\n") + (not readme.endswith("\n"))
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the manual is the place for more"
    commands = [line.strip() for block in re.findall(r"```bash\n(.*?)```", readme, re.S) for line in block.splitlines()]
    getting_started = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    for command in (INSTALL_AND_RUN, TEST_COMMAND):
        assert command in commands, f"README.md has no bash block with the line {command!r}"
        assert command in getting_started, f"docs/getting-started.md does not give {command!r}"


def test_every_command_and_option_is_in_the_command_line_reference() -> None:
    reference = (DOCS / "reference" / "command-line.md").read_text(encoding="utf-8")
    parser = build_parser()
    commands = next(action for action in parser._actions if action.choices and action.dest == "command")
    missing = []
    for name, command in commands.choices.items():
        if f"## `arbiter {name}`" not in reference:
            missing.append(f"arbiter {name}")
        for action in command._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help" and f"`{option}" not in reference:
                    missing.append(f"arbiter {name} {option}")
    assert not missing, "missing from docs/reference/command-line.md: " + ", ".join(missing)


def test_every_repository_path_the_manual_names_exists() -> None:
    missing = []
    for page in [README, *sorted(DOCS.rglob("*.md"))]:
        for match in REPO_PATH.finditer(page.read_text(encoding="utf-8")):
            if not (REPO / match.group(1)).exists():
                missing.append(f"{page.relative_to(REPO)}: {match.group(1)}")
    assert not missing, "paths named in the manual that do not exist:\n" + "\n".join(sorted(set(missing)))


def section(text: str, heading: str) -> str:
    """The part of a page under ``heading`` (a line such as ``## Core keys``), to the next heading
    of its level or higher."""
    level = heading.split(" ", 1)[0]
    found = text.split(f"\n{heading}\n", 1)[1]
    return re.split(rf"\n#{{1,{len(level)}}} ", found, maxsplit=1)[0]


def table_rows(text: str, first_cell: str) -> list[str]:
    """The lines of the page's tables whose first cell starts with ``first_cell``."""
    return [line for line in text.splitlines() if line.startswith(f"| {first_cell}")]


def test_every_shipped_format_is_listed_wherever_the_manual_lists_formats() -> None:
    """docs/adding-a-format.md's checklist for a format shipped with arbiter: its page and its
    place in the nav, the index's table, the README, the competition file reference (presets,
    format, scoring and the format's own keys), the command line's presets, the tests table."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    formats_nav = next(nav_pages(entry["Formats"]) for entry in config["nav"] if "Formats" in entry)
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    readme = README.read_text(encoding="utf-8")
    competition_file = (DOCS / "reference" / "competition-file.md").read_text(encoding="utf-8")
    command_line = (DOCS / "reference" / "command-line.md").read_text(encoding="utf-8")
    architecture = (DOCS / "design" / "architecture.md").read_text(encoding="utf-8")
    core_keys = section(competition_file, "## Core keys")
    (format_key,) = table_rows(core_keys, "`format` |")
    (scoring_key,) = table_rows(core_keys, "`scoring` |")
    (own_keys,) = [p for p in core_keys.split("\n\n") if p.startswith("Every other top-level key")]
    (competition_option,) = table_rows(command_line, "`--competition NAME` or `FILE`")
    (tests_row,) = table_rows(architecture, "`tests/formats/<format>/`")
    missing = []
    for name, module in KNOWN.items():
        folder = module.rsplit(".", 1)[1]
        found = get_format(name)
        page = f"formats/{name}.md"
        presets = sorted(path.stem for path in (REPO / "server" / "formats" / folder / "presets").glob("*.toml"))
        index_rows = [row for row in table_rows(index, "[") if f"]({page})" in row]
        wanted = {
            f"docs/{page}": (DOCS / page).is_file(),
            "its page in the Formats section of mkdocs.yml's nav": page in formats_nav,
            "its row in docs/index.md's table of formats": len(index_rows) == 1,
            "a link to its page in README.md": f"(docs/{page})" in readme,
            "its name in the competition file reference's `format` key": f"`{name}`" in format_key,
            f"tests/formats/{folder}/": (REPO / "tests" / "formats" / folder).is_dir(),
            "its tests folder in the architecture page's tests table": f"`{folder}`" in tests_row,
        }
        for rule in found.rules:
            wanted[f"its rule {rule!r} in the competition file reference's `scoring` key"] = f"`{rule}`" in scoring_key
        for key in [f.name for f in dataclasses.fields(found.options)] if found.options else []:
            listed = f"`{key}`" in own_keys or f"`[{key}]`" in own_keys  # a key or a table
            wanted[f"its key {key!r} in the competition file reference's list of format keys"] = listed
        for preset in presets:
            wanted[f"its preset {preset!r} in docs/index.md's table"] = any(f"`{preset}`" in r for r in index_rows)
            wanted[f"its preset {preset!r} in the competition file reference's presets table"] = bool(
                table_rows(section(competition_file, "## Presets"), f"`{preset}` | `{name}` |")
            )
            wanted[f"its preset {preset!r} in --competition's list"] = f"`{preset}`" in competition_option
        missing += [f"format {name!r}: {what}" for what, there in wanted.items() if not there]
    assert not missing, "a shipped format missing where the manual lists formats:\n" + "\n".join(missing)
