"""server/leaderboard/page.py: the leaderboard page of a board, read as HTML and rendered in Chromium.

The boards are written by hand the way leaderboard.json holds them: a four-row ranking with a
baseline, an unranked submission, an achievement, a pair that cannot be told apart and a tie
broken by time; an empty board; a DIAMBRA-like board whose rows carry context fields. In headless
Chromium the page's own script sorts the rows from the URL fragment.
"""

from __future__ import annotations

from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from report_pages import count_near, headless

from arbiter.protocol.errors import ConfigError
from arbiter.server.leaderboard.page import render_page

HOSTILE = '<script>alert("pwned")</script>'
YELLOW = (0xFF, 0xF8, 0xC5)  # the "not separable" tag's background
SKY = (0xDD, 0xF4, 0xFF)  # the "tie broken by submission time" tag's background
WINDOW = (1200, 800)
RETURN = {"name": "normalized_return", "title": "mean normalized return", "direction": "higher", "spec": ".4f"}
ARRIVED = {"name": "arrived_fraction", "title": "arrived fraction", "direction": "higher", "spec": ".3f"}
PLANNING = {"name": "planning_s", "title": "mean planning time", "direction": "lower", "spec": ".2f"}


def row(rank: int, participant: str, values: tuple[float, float, float], ci: tuple[float, float], **extra) -> dict:
    figures = {
        RETURN["name"]: {"value": values[0], "ci95": list(ci), "std": 0.08, "n": 12},
        ARRIVED["name"]: {"value": values[1], "ci95": None, "std": None, "n": 12},
        PLANNING["name"]: {"value": values[2], "ci95": None, "std": None, "n": 12},
    }
    made = {
        "rank": rank, "participant": participant, "submission": f"sub-{participant}-2",
        "submitted_at": f"2026-11-2{rank}T10:00:00+00:00", "results": f"flatland/sub-{participant}-2",
        "figures": figures, "rank_score": None, "submissions": rank + 1,
        "last_submission_at": f"2026-11-2{rank}T12:30:00+00:00", "context": {}, "achievements": [],
        "not_separable_from": [], "tie_broken_by_time": False, "tied_with": [], "rescored": False,
    }  # fmt: skip
    return made | extra


def four_row_board() -> dict[str, Any]:
    """Average rank over three columns: bob (5/3), alice (2), then dave and erin equal (19/6)."""
    return {
        "competition": "flatland-neurips2020", "phase": None, "scoring": "neurips2020",
        "generated_at": "2026-11-26T01:02:03+00:00", "ranking": "average-rank", "policy": "best",
        "columns": [RETURN, ARRIVED, PLANNING],
        "rows": [
            row(1, "bob", (-0.44, 0.7, 0.1), (-0.49, -0.40), rank_score=5 / 3, not_separable_from=["alice"]),
            row(2, "alice", (-0.4231, 0.75, 0.5), (-0.47, -0.38), rank_score=2.0, not_separable_from=["bob"],
                achievements=[{"name": "Arrived early", "submission": "sub-alice-1"}], rescored=True),
            row(3, "dave", (-0.6, 0.5, 0.3), (-0.65, -0.55), rank_score=19 / 6, tie_broken_by_time=True,
                tied_with=["erin"]),
            row(4, "erin", (-0.6, 0.5, 0.3), (-0.65, -0.55), rank_score=19 / 6, tie_broken_by_time=True,
                tied_with=["dave"]),
        ],
        "baselines": [{"name": "random agent", "shown_before_rank": 3, "results": "baselines/random",
                       "figures": {RETURN["name"]: {"value": -0.95, "ci95": [-0.97, -0.93]},
                                   ARRIVED["name"]: {"value": 0.05}}}],
        "unranked": [{"participant": HOSTILE, "submission": "sub-x-1", "state": "FAILED",
                      "cause": "the agent exited <early>", "submitted_at": "2026-11-24T09:00:00+00:00"}],
        "achievements": [{"name": "Arrived early", "description": "three quarters of the agents arrived"}],
        "counts": {"folders": 9, "ranked": 4, "unranked": 1, "debug_left_out": 2, "baselines": 1},
    }  # fmt: skip


def diambra_board() -> dict[str, Any]:
    context = [
        {"game": "doapp", "difficulty": "hard", "level": 4, "engine": "v2.2"},
        {"game": "sfiii3n", "difficulty": "easy", "level": 10, "engine": "v2.2"},
    ]
    rows = [
        row(rank, name, (0, 0, 0), (0, 0), context=fields)
        | {"figures": {"score": {"value": score, "ci95": None}, "reward": {"value": reward, "ci95": None}}}
        for rank, name, score, reward, fields in [
            (1, "ken", 0.8125, 123.456, context[0]),
            (2, "ryu", 0.5, -7, context[1]),
        ]
    ]
    return {
        "competition": "diambra-arena", "phase": "warm-up", "scoring": "diambra", "ranking": "lexicographic",
        "policy": "latest", "generated_at": "2026-11-26T01:02:03+00:00",
        "columns": [{"name": "score", "title": "mean score", "direction": "higher", "spec": ".3f"},
                    {"name": "reward", "title": "mean reward", "direction": "higher", "spec": ".2f"}],
        "rows": rows, "baselines": [], "unranked": [], "achievements": [],
        "counts": {"folders": 2, "ranked": 2, "unranked": 0, "debug_left_out": 0, "baselines": 0},
    }  # fmt: skip


# --- reading the page back ------------------------------------------------------------------------

VOID = {"meta", "br", "link", "img", "input", "hr"}


class Node:
    def __init__(self, tag: str, attrs: dict[str, str | None]) -> None:
        self.tag, self.attrs, self.children, self.parts = tag, attrs, [], []

    def text(self) -> str:
        """The element's text, whitespace collapsed; nested elements are set apart by a space."""
        return " ".join(" ".join(p if isinstance(p, str) else p.text() for p in self.parts).split())

    def all(self, tag: str, css: str | None = None) -> list[Node]:
        found = []
        for child in self.children:
            if child.tag == tag and (css is None or css in (child.attrs.get("class") or "").split()):
                found.append(child)
            found += child.all(tag, css)
        return found


class Tree(HTMLParser):
    """The page as a tree of elements (the page closes every element it opens)."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, dict(attrs))
        self.stack[-1].children.append(node)
        self.stack[-1].parts.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.stack[-1].parts.append(data)


def parse(page: str) -> Node:
    tree = Tree()
    tree.feed(page)
    tree.close()
    assert tree.stack == [tree.root], "an element is left open"
    return tree.root


def ranking(page: Node) -> Node:
    [table] = [t for t in page.all("table") if t.attrs.get("id") == "ranking"]
    return table


def order(page: Node) -> list[str]:
    return [tr.attrs["data-participant"] for tr in ranking(page).all("tbody")[0].all("tr")]


def cells(page: Node) -> dict[str, dict[str, str]]:
    """Each row's cell texts, by participant and header sort key."""
    keys = [th.attrs["data-sort"] for th in ranking(page).all("th")]
    return {
        tr.attrs["data-participant"]: dict(zip(keys, (td.text() for td in tr.all("td")), strict=True))
        for tr in ranking(page).all("tbody")[0].all("tr")
    }


def assert_self_contained(page: str) -> None:
    lowered = page.lower()
    for reference in ("<script src", "<link", "http://", "https://", "@import", "url("):
        assert reference not in lowered, f"the page loads something: {reference}"


# --- the page as HTML ------------------------------------------------------------------------------


def test_the_page_shows_every_row_in_ranking_order_with_its_figures_and_marks() -> None:
    board = four_row_board()
    text = render_page(board)
    assert_self_contained(text)
    page = parse(text)
    assert len(page.all("script")) == 1
    assert page.all("h1")[0].text() == "flatland-neurips2020"
    rule = page.all("p", "rule-line")[0].text()
    assert "average rank over 3 columns" in rule and "best submission" in rule and "2026-11-26 01:02 UTC" in rule

    headers = ranking(page).all("th")
    assert all(th.attrs.get("scope") == "col" for th in headers)
    assert [th.attrs["data-sort"] for th in headers] == [
        "rank", "participant", "normalized_return", "arrived_fraction", "planning_s", "rank_score",
        "submissions", "last_submission", "achievements",
    ]  # fmt: skip
    arrows = {th.attrs["data-sort"]: th.all("span", "arrow") for th in headers}
    assert arrows["normalized_return"][0].text() == "↑" and arrows["planning_s"][0].text() == "↓"
    assert arrows["planning_s"][0].attrs["aria-label"] == "lower is better"
    assert "lower is better" in headers[4].attrs["title"] and "rank" not in {k for k, v in arrows.items() if v}

    # the baseline sits before rank 3; each row's rank, figures and marks are its own
    assert order(page) == ["bob", "alice", "random agent", "dave", "erin"]
    shown = cells(page)
    assert [shown[name]["rank"] for name in order(page)] == ["1", "2", "baseline", "3", "4"]
    assert shown["alice"]["normalized_return"] == "-0.4231 [-0.4700, -0.3800]"
    assert shown["alice"]["arrived_fraction"] == "0.750" and shown["alice"]["planning_s"] == "0.50"
    assert [shown[name]["rank_score"] for name in ("bob", "alice", "dave")] == ["1.67", "2", "3.17"]
    assert shown["random agent"]["normalized_return"] == "-0.9500 [-0.9700, -0.9300]"
    assert shown["random agent"]["planning_s"] == "–" and shown["random agent"]["submissions"] == ""
    assert shown["bob"]["participant"] == "bob not separable from alice"
    assert shown["alice"]["participant"] == "alice not separable from bob rescored"
    assert shown["erin"]["participant"] == "erin tie broken by submission time (tied with dave)"
    assert shown["dave"]["last_submission"] == "2026-11-23 12:30 UTC" and shown["dave"]["submissions"] == "4"
    [badge] = page.all("span", "achievement")
    assert badge.text() == "Arrived early" and "sub-alice-1" in badge.attrs["title"]
    notes = page.all("ul", "notes")[0].text()
    assert "95 % intervals of mean normalized return" in notes and "earlier submission" in notes
    assert "neurips2020" in notes  # what "rescored" means names the rule

    [unranked] = page.all("table", "unranked")
    assert [td.text() for td in unranked.all("td")] == [
        HOSTILE, "sub-x-1", "FAILED", "the agent exited <early>", "2026-11-24 09:00 UTC"
    ]  # fmt: skip
    footer = page.all("footer")[0].text()
    assert "results folders read: 9 · ranked: 4 · not ranked: 1 · debug runs left out: 2 · baselines: 1" in footer


def test_a_hostile_participant_name_shows_as_text() -> None:
    board = four_row_board()
    board["rows"][0]["participant"] = HOSTILE
    board["rows"][1]["not_separable_from"] = [HOSTILE]
    board["columns"][0] = RETURN | {"title": '"><img src=x onerror=alert(1)>'}
    text = render_page(board)
    page = parse(text)
    assert len(page.all("script")) == 1 and not page.all("img")
    assert order(page)[0] == HOSTILE  # the attribute holds the name itself, escaped in the markup
    assert cells(page)[HOSTILE]["participant"] == HOSTILE + " not separable from alice"
    assert cells(page)["alice"]["participant"].startswith("alice not separable from " + HOSTILE)
    assert "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in text


def test_an_empty_board_says_so() -> None:
    board = four_row_board() | {"rows": [], "baselines": [], "unranked": [], "achievements": []}
    board["counts"] = {"folders": 0, "ranked": 0, "unranked": 0, "debug_left_out": 0, "baselines": 0}
    page = parse(render_page(board))
    assert page.all("p", "empty")[0].text() == "No submission is ranked yet."
    assert not page.all("table") and "results folders read: 0" in page.all("footer")[0].text()


def test_a_board_with_context_fields_shows_them_and_no_rank_score() -> None:
    text = render_page(diambra_board())
    assert_self_contained(text)
    page = parse(text)
    assert page.all("h1")[0].text() == "diambra-arena · phase warm-up"
    rule = page.all("p", "rule-line")[0].text()
    assert rule.startswith("Ranked by mean score (higher is better), then mean reward (higher is better); each")
    assert "latest submission" in rule
    headers = {th.attrs["data-sort"]: th.attrs["data-type"] for th in ranking(page).all("th")}
    assert "rank_score" not in headers
    assert {key: headers[key] for key in ("game", "difficulty", "level", "engine")} == {
        "game": "text", "difficulty": "text", "level": "number", "engine": "text"
    }  # fmt: skip
    shown = cells(page)
    assert order(page) == ["ken", "ryu"]
    assert (shown["ken"]["score"], shown["ken"]["reward"], shown["ryu"]["reward"]) == ("0.812", "123.46", "-7.00")
    assert [shown[name]["game"] for name in order(page)] == ["doapp", "sfiii3n"]
    assert shown["ryu"]["level"] == "10" and shown["ken"]["difficulty"] == "hard"


def test_a_board_that_is_not_one_is_refused_clearly() -> None:
    with pytest.raises(ConfigError, match="'rows' must be a list of objects"):
        render_page(four_row_board() | {"rows": {"alice": 1}})
    with pytest.raises(ConfigError, match="column 'score': 'zz' is not a format spec"):
        board = diambra_board()
        board["columns"][0]["spec"] = "zz"
        render_page(board)


# --- in a real browser ------------------------------------------------------------------------------


def expected_order(board: dict[str, Any], column: dict[str, str], reverse: bool) -> list[str]:
    """The rows in the ranking's order, then sorted by ``column``: better first (reversed when
    asked), rows without the figure last, rows with equal values in the ranking's order."""
    page = parse(render_page(board))
    entries = {entry.get("participant") or entry["name"]: entry for entry in board["rows"] + board["baselines"]}
    ranked = order(page)

    def value(name: str) -> float | None:
        return (entries[name]["figures"].get(column["name"]) or {}).get("value")

    present = [name for name in ranked if value(name) is not None]
    descending = (column["direction"] == "higher") != reverse
    present.sort(key=lambda name: -value(name) if descending else value(name))
    return present + [name for name in ranked if value(name) is None]


@dataclass(frozen=True)
class Address:
    """A page opened with a URL fragment: headless() opens ``page.as_uri()``, and a file path's
    own URI would escape the "#"."""

    page: Path
    fragment: str

    def as_uri(self) -> str:
        return self.page.as_uri() + self.fragment


@pytest.mark.timeout(900)  # a first run may install chromium
def test_the_page_sorts_from_its_url_and_renders_in_chromium(chromium, tmp_path: Path) -> None:
    from PIL import Image

    board = four_row_board()
    page = tmp_path / "leaderboard.html"
    page.write_text(render_page(board), encoding="utf-8")
    profile = tmp_path / "profile"
    screenshot = tmp_path / "leaderboard.png"

    def dom_order(*args: str, fragment: str = "") -> tuple[Node, list[str]]:
        dumped = headless(chromium, Address(page, fragment), profile, "--dump-dom", *args)  # type: ignore[arg-type]
        return (dom := parse(dumped.stdout)), order(dom)

    ranked_dom, ranked = dom_order(f"--screenshot={screenshot}", f"--window-size={WINDOW[0]},{WINDOW[1]}")
    assert ranked == ["bob", "alice", "random agent", "dave", "erin"]
    assert [th.attrs["data-sort"] for th in ranking(ranked_dom).all("th") if "aria-sort" in th.attrs] == ["rank"]

    _, worst_planning_first = dom_order(fragment="#sort=-planning_s")
    assert worst_planning_first == expected_order(board, PLANNING, reverse=True)
    assert worst_planning_first == ["alice", "dave", "erin", "bob", "random agent"]  # the baseline has none: last

    sorted_dom, by_name = dom_order(fragment="#sort=participant")
    assert by_name == sorted(ranked, key=str.casefold)
    assert [cells(sorted_dom)[name]["rank"] for name in by_name] == ["2", "1", "3", "4", "baseline"]

    with Image.open(screenshot) as image:
        assert image.size == WINDOW
        pixels = np.asarray(image.convert("RGB"), dtype=np.int16).reshape(-1, 3)
    inked = float(np.mean(pixels.sum(axis=1) < 600))
    assert inked > 0.01, f"the screenshot is nearly blank ({inked:.2%} of it is not white)"
    assert count_near(pixels, YELLOW, 4) > 500, "the not-separable tags are not drawn"
    assert count_near(pixels, SKY, 4) > 500, "the tie tags are not drawn"


def test_a_board_ranked_per_game_shows_one_table_per_game() -> None:
    board = diambra_board() | {"per": "game"}
    board["rows"] = [
        r | {"group": r["context"]["game"], "rank": 1} for r in board["rows"]
    ]  # each game ranks its own: both first
    page = parse(render_page(board))
    headings = [h.text() for h in page.all("h2")]
    assert [h for h in headings if h.startswith("game ")] == ["game doapp", "game sfiii3n"]
    tables = page.all("table", "board")
    assert [t.attrs.get("id") for t in tables] == ["ranking-1", "ranking-2"]
    players = [
        [r.attrs.get("data-participant") for r in t.all("tr") if r.attrs.get("data-participant")] for t in tables
    ]
    assert players == [["ken"], ["ryu"]]


def test_an_achievement_unlocked_in_two_games_names_each_game_it_was_unlocked_in() -> None:
    """Per game, each game's achievements count apart: ken's first fight in each game is listed
    once per game, with the game, not as the same name twice."""
    board = diambra_board() | {"per": "game", "achievements": [{"name": "First fight", "description": "a first"}]}
    first = [{"name": "First fight", "submission": "sub-1"}]
    board["rows"] = [
        r | {"group": game, "rank": 1, "participant": "ken", "achievements": first}
        for r, game in zip(board["rows"], ("doapp", "sfiii3n"), strict=True)
    ]
    page = parse(render_page(board))
    [section] = [s for s in page.all("section") if any(h.text() == "Achievements" for h in s.all("h2"))]
    assert [td.text() for td in section.all("td")] == ["First fight", "a first", "ken (doapp), ken (sfiii3n)"]
