"""The DIAMBRA report sections (docs/formats/diambra.md): the difficulty curves, each episode's point at its
score, the reward traces and the game's own settings, drawn from records played on diambra-arena's engine mock.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("diambra.arena")

from diambra_items import make_plan, make_spec, own_score, play_item  # noqa: E402

from arbiter.server.formats.diambra import FORMAT  # noqa: E402

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
