"""The DIAMBRA report sections (docs/formats/diambra.md): the difficulty curves, each episode's point at its
score, the reward traces and the game's own settings, drawn from records played on diambra-arena's engine mock.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("diambra.arena")

from arbiter.server.core.budgets import BudgetPolicy  # noqa: E402
from arbiter.server.formats.diambra import FORMAT  # noqa: E402
from arbiter.server.formats.diambra.settings import DiambraSettings  # noqa: E402

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


# -- the report ----------------------------------------------------------------------------------


def test_report_sections_draw_the_curves_the_point_the_reward_and_the_settings():
    spec = make_spec(seed=21, game="sfiii3n", difficulty="hard", episodes=2)
    plan = make_plan(spec)
    rule = FORMAT.rules["diambra"](spec.options)
    try:
        records = []
        opened, _, _ = play_item(plan, plan.items[0])
        records += opened.records(finished=True, timeout=None, abandoned=False)
        opened, _, _ = play_item(plan, plan.items[1], stop_after=5)
        records += opened.records(finished=False, timeout="step", abandoned=False)
    finally:
        plan.close()
    records = json.loads(json.dumps(records))
    html = FORMAT.report_sections({"score": rule.aggregate(records)}, records)
    assert "<strong>engine: mock</strong>" in html
    for label in ("Easy (level 4)", "Medium (level 6)", "Hard (level 8)"):
        assert label in html
    assert html.count('data-points="64"') == 3  # one curve per difficulty
    for record in records:  # each episode's point sits at its own score, on its curve
        assert f'data-value="{own_score(record)[1]:.6g}"' in html
    assert 'data-chart="diambra-reward-0"' in html and 'data-chart="diambra-reward-1"' in html
    assert "step budget ran out" in html and "super_art" in html  # sfiii3n's own key
    assert "tower" not in html and "fighting_style" not in html  # other games' keys are left out
    assert html.count("<section>") == 4
