"""docs/design/architecture.md stays a map of the tree as it is: every folder of server/ is in its
tree, every module of protocol/, client/ and server/ is named in the section of its folder, and
every folder of tests/ is in its table of tests."""

from __future__ import annotations

import re
from pathlib import Path

import paths

REPO = Path(paths.REPO)
PAGE = REPO / "docs" / "design" / "architecture.md"
PARTS = ("protocol", "client", "server")


def sections(text: str) -> dict[str, str]:
    """The page's sections about a folder (a heading such as ``## `server/core/` ``), by folder."""
    found = {}
    for match in re.finditer(r"^## `([\w/]+/)`\n(.*?)(?=^## |\Z)", text, re.DOTALL | re.MULTILINE):
        found[match.group(1)] = match.group(2)
    return found


def modules() -> list[str]:
    """Every module of the code, relative to the repository; a package's ``__init__.py`` is
    named by its folder."""
    return sorted(
        str(path.relative_to(REPO))
        for part in PARTS
        for path in (REPO / part).rglob("*.py")
        if "__pycache__" not in path.parts and path.name != "__init__.py"
    )


def named(name: str, text: str) -> bool:
    """Whether ``text`` names ``name`` itself, not as the tail of a longer path."""
    return re.search(rf"(?<![\w./-]){re.escape(name)}(?!\w)", text) is not None


def test_every_module_is_named_in_the_section_of_its_folder() -> None:
    """A module is named by its path below the section's folder (``flatland/plan.py`` in
    ``server/formats/``), or by its file name when no other module of the section has it."""
    found = sections(PAGE.read_text(encoding="utf-8"))
    assert {"protocol/", "client/", "server/core/"} <= set(found), sorted(found)
    unplaced, unnamed = [], []
    for module in modules():
        folders = [folder for folder in found if module.startswith(folder)]
        if not folders:
            unplaced.append(module)
            continue
        folder = max(folders, key=len)
        below = module[len(folder) :]
        name = Path(module).name
        same_name = [m for m in modules() if m.startswith(folder) and Path(m).name == name]
        text = found[folder]
        if not (named(below, text) or (len(same_name) == 1 and named(name, text))):
            unnamed.append(f"{module} (in the section `{folder}`, as {below!r})")
    assert not unplaced, "modules whose folder has no section on the architecture page:\n" + "\n".join(unplaced)
    assert not unnamed, "modules the architecture page does not name:\n" + "\n".join(unnamed)


def test_every_folder_of_the_server_is_in_the_tree_and_every_tests_folder_in_the_table() -> None:
    text = PAGE.read_text(encoding="utf-8")
    tree = text.split("```\n", 2)[1]  # the page's first block: the tree
    folders = sorted(p.name for p in (REPO / "server").iterdir() if (p / "__init__.py").is_file())
    missing = [f"server/{name}/ in the tree" for name in folders if not re.search(rf"^  {name}/ ", tree, re.M)]
    tests = sorted(p.name for p in (REPO / "tests").iterdir() if p.is_dir() and any(p.glob("test_*.py")))
    missing += [f"tests/{name}/ in the table of tests" for name in tests if f"`tests/{name}/`" not in text]
    assert not missing, "missing from the architecture page:\n" + "\n".join(missing)
