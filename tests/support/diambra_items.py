"""DIAMBRA items driven as the evaluator drives them, on diambra-arena's engine mock: a spec, a
plan, a deterministic agent, and a record's score by docs/formats/diambra.md's own arithmetic.
Import it after ``pytest.importorskip("diambra.arena")``."""

from __future__ import annotations

from types import SimpleNamespace

from arbiter.server.core.budgets import BudgetPolicy
from arbiter.server.formats.diambra import FORMAT
from arbiter.server.formats.diambra.settings import DiambraSettings

SMALL = [64, 64, 1]


# docs/formats/diambra.md's difficulty table: game → (Easy, Medium, Hard) levels.
LEVELS = {
    "doapp": (2, 3, 4),
    "sfiii3n": (4, 6, 8),
    "tektagt": (5, 7, 9),
    "umk3": (3, 4, 5),
    "samsh5sp": (4, 6, 8),
    "kof98umh": (4, 6, 8),
}


DIFFICULTY_INDEX = {"easy": 0, "medium": 1, "hard": 2}


def make_spec(seed: int | None = 1001, max_episodes: int | None = None, **settings):
    settings.setdefault("frame_shape", SMALL)
    return SimpleNamespace(
        options=DiambraSettings(**settings), seed=seed, budgets=BudgetPolicy(), debug=False, max_episodes=max_episodes
    )


def make_plan(spec):
    return FORMAT.make_plan(spec, FORMAT.rules["diambra"](spec.options), tests=None, environ={})


def button(step: int) -> list[int]:
    """A deterministic agent: every move in turn, an attack every other step."""
    return [step % 9, (step // 2) % 8 if step % 2 else 0]


def play_item(plan, item, *, actions=button, stop_after: int | None = None):
    """Drive one item as the evaluator does; returns (opened item, create payload, step replies)."""
    opened = plan.open(item)
    payload = opened.create_payload()
    replies = []
    step = 0
    while stop_after is None or step < stop_after:
        clean, invalid = opened.sanitize(actions(step))
        over = opened.step(clean)
        replies.append(opened.step_reply(invalid))
        step += 1
        if over:
            break
    return opened, payload, replies


def own_score(record: dict) -> tuple[float, float]:
    """(k, score) of a record by docs/formats/diambra.md, from the record's R, bounds and game alone."""
    easy, *_ = LEVELS[record["game"]]
    level = LEVELS[record["game"]][DIFFICULTY_INDEX[record["difficulty"]]]
    r_min, r_max = record["bounds"]
    r = record["reward"]
    k = 1 + (level / easy - 1) * (r - r_min) / (r_max - r_min)
    k = min(max(k, 1.0), level / easy)
    return k, r * k
