"""The format's ``rescore`` hook: an episode's normalized return and arrived fraction, derived again
from its raw fields (reward, steps budget, agents, arrivals, ending) with the rule being applied.

``arbiter rescore`` then scores these records, so a leaderboard figure is checked down to what the
env reported, and the same records can be scored under the other rule (``--scoring flatland3``).
"""

from __future__ import annotations

from typing import Any


def rederived_records(rule: Any, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``records`` whose derived figures are ``rule``'s, from the raw fields; the plan
    derives them the same way as each episode ends (``FlatlandPlan.record``)."""
    rederived = []
    for record in records:
        finished = not (record["timed_out"] or record["abandoned"] or record["skipped"])
        num_agents = record["num_agents"]
        normalized = rule.normalized_return(
            reward=record["reward"],
            max_episode_steps=record["max_episode_steps"] or 1,
            num_agents=num_agents or 1,
            finished=finished,
        )
        arrived = (
            rule.arrived_fraction(arrived=record["arrived"], num_agents=num_agents, finished=finished)
            if num_agents
            else 0.0
        )
        rederived.append({**record, "normalized_return": normalized, "arrived_fraction": arrived})
    return rederived
