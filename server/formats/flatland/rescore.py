"""The format's ``rescore`` hook: an episode's normalized return and arrived fraction, derived again
from its raw fields (reward, steps budget, agents, arrivals, ending) with the rule being applied.

``arbiter rescore`` then scores these records, so a leaderboard figure is checked down to what the
env reported. Another rule of the format scores them too when it uses the same reward model: a
reward earned under one model says nothing of what the other would have paid, so records of
another model are refused.
"""

from __future__ import annotations

from typing import Any


def rederived_records(rule: Any, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``records`` whose derived figures are ``rule``'s, from the raw fields; the plan
    derives them the same way as each episode ends (``FlatlandPlan.record``)."""
    rederived = []
    for record in records:
        earned_under = record.get("reward_model")  # absent from records written before it was kept
        if earned_under is not None and earned_under != rule.reward_model:
            raise ValueError(
                f"episode {record.get('index')}'s reward was earned under flatland's {earned_under!r} reward "
                f"model, and {rule.name!r} scores rewards of the {rule.reward_model!r} model: the env's rewards "
                "would have differed, so these records cannot be scored under it; evaluate again under that rule"
            )
        finished = not (record["timed_out"] or record["abandoned"] or record["skipped"])
        num_agents = record["num_agents"]
        normalized = rule.normalized_return(
            reward=record["reward"],
            max_episode_steps=record["max_episode_steps"] or 1,
            num_agents=num_agents or 1,
            finished=finished,
            step_rewards=record.get("step_rewards"),
        )
        arrived = (
            rule.arrived_fraction(arrived=record["arrived"], num_agents=num_agents, finished=finished)
            if num_agents
            else 0.0
        )
        rederived.append({**record, "normalized_return": normalized, "arrived_fraction": arrived})
    return rederived
