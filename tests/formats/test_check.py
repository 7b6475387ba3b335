"""``check_format`` holds every registered format to the contract the core relies on, and names the
member at fault when a format breaks it.

Each shipped format is played end to end on small real data (a generated Flatland test folder,
two-phase on CartPole and on the counting env, DIAMBRA on its engine mock, a generated MetaLC
meta-dataset); then small formats broken one member at a time show the error each gets.
"""

from __future__ import annotations

import os
import random
import statistics
from types import SimpleNamespace
from typing import Any

import pytest
from fake_envs import CountingEnv

from arbiter.server.core.budgets import BudgetPolicy
from arbiter.server.core.competition import load_competition, spec_from_dict
from arbiter.server.core.scoring import figure, spread
from arbiter.server.core.summary import ENDINGS
from arbiter.server.formats import KNOWN, FormatCheckError, check_format, get_format
from arbiter.server.formats.base import Column, Format, Item, OpenItem, Rule
from arbiter.server.formats.gym_episode import GymEpisode, GymPlan


@pytest.fixture(scope="module")
def metalc_data(tmp_path_factory: pytest.TempPathFactory) -> str:
    from arbiter.server.formats.metalc.generate import GeneratorSettings, write_meta_dataset

    folder = tmp_path_factory.mktemp("metalc") / "data"
    write_meta_dataset(str(folder), GeneratorSettings(datasets=12, algorithms=3, seed=3))
    return str(folder)


def flatland_policy(seed: int) -> Any:
    """Flatland's clients mirror the env, so its handshake advertises no action space: one of
    flatland's five actions per agent, drawn."""
    rng = random.Random(seed)
    return lambda item, last: {handle: rng.randrange(5) for handle in range(item.num_agents)}


def shipped_cases(tiny_tests: str, metalc_data: str) -> dict[str, tuple[str, Any, dict[str, Any]]]:
    """case → (format, spec, check_format's other arguments)"""
    counting = {"format": "two-phase", "seed": 7, "env_id": "fake_envs:CountingEnv",
                "env_kwargs": {"length": 5, "bonus": 1.0}, "reward_per_step": [1.0, 2.0], "worst_return": 0.0,
                "num_episodes": 2, "phase2": {"max_steps": 60, "goal_reward": 9.0, "stability_window": 2,
                                              "num_runs": 2}}  # fmt: skip
    cartpole = {"format": "two-phase", "seed": 7, "env_id": "CartPole-v1", "num_episodes": 2,
                "phase2": {"max_steps": 400, "goal_reward": 20.0, "stability_window": 2, "num_runs": 1}}  # fmt: skip
    return {
        "flatland": ("flatland", load_competition("flatland-debug", []), {"tests": tiny_tests,
                                                                          "policy": flatland_policy(1)}),
        "two-phase on the counting env": ("two-phase", spec_from_dict("counting", counting), {}),
        "two-phase on CartPole": ("two-phase", spec_from_dict("cartpole", cartpole), {}),
        "diambra on the engine mock": ("diambra", spec_from_dict("mock", {"format": "diambra", "seed": 3,
                                                                          "episodes": 2, "frame_shape": [32, 32, 1]}),
                                       {}),
        "metalc": ("metalc", load_competition("metalc-wcci2022", ["phase=dev"]), {"tests": metalc_data}),
    }  # fmt: skip


CASES = ["flatland", "two-phase on the counting env", "two-phase on CartPole", "diambra on the engine mock", "metalc"]


def test_every_shipped_format_has_a_case():
    # The shipped ones: formats registered from outside (the docs page's, in its own test) are
    # checked where they are registered.
    assert sorted({case.split(" ")[0] for case in CASES}) == sorted(KNOWN)


@pytest.mark.parametrize("case", CASES)
def test_every_shipped_format_keeps_the_contract(case, tiny_tests, metalc_data):
    name, spec, options = shipped_cases(tiny_tests, metalc_data)[case]
    fmt = get_format(name)
    plan = fmt.make_plan(spec, fmt.rules[spec.scoring](spec.options), tests=options.get("tests"))
    try:
        planned = [item.unit for item in plan.items]
    finally:
        plan.close()
    report = check_format(name, spec, **options)
    assert report.items == len(planned) and report.steps >= report.items
    assert [r["unit"] for r in report.records if r["last_of_item"]] == planned  # every item, in order, played
    assert {r["ended"] for r in report.records} <= {"finished", "step_limit"}
    assert [r["unit"] for r in report.unplayed if r["last_of_item"]] == planned
    assert all(r["ended"] == "not_played" and r["skipped"] for r in report.unplayed)
    assert report.score["primary"] is not None and report.score["primary_name"]


# -- broken formats ---------------------------------------------------------------------------------


def spec(max_episodes: int | None = None, **extra: Any) -> Any:
    """What make_plan reads of a competition spec (a format outside the registry has no file)."""
    return SimpleNamespace(name="check", scoring=None, options=None, seed=5, max_episodes=max_episodes,
                           budgets=BudgetPolicy(), debug=False, **extra)  # fmt: skip


class CountingPlan(GymPlan):
    columns = (Column("episode"), *GymPlan.columns)

    def make_env(self) -> CountingEnv:
        return CountingEnv(length=3)

    def make_items(self) -> list[Item]:
        episodes = min(3, self.spec.max_episodes or 3)  # a debug run's cap
        return [Item(index=i, unit=f"episode/{i}", fields={"episode": i}) for i in range(episodes)]


class MeanReturn(Rule):
    name = "mean-return"

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        returns = [r["return"] for r in records]
        return {"primary": statistics.fmean(returns), "secondary": None, "primary_name": "mean return",
                "secondary_name": None, "spread": {"primary": spread(returns)}}  # fmt: skip


def counting(
    plan: type = CountingPlan, rule: type = MeanReturn, registered: str = "mean-return", **declared: Any
) -> Format:
    return Format(name="counting", rules={registered: rule}, make_plan=plan, **declared)


def test_a_sound_small_format_passes_and_its_records_are_the_cores():
    report = check_format(counting(), spec())
    assert report.items == 3 and report.steps >= 3 * 3  # three 3-step episodes, and the first twice cut short
    assert [r["steps"] for r in report.records] == [3, 3, 3] and report.score["primary"] == 3.0
    assert all(r["ended"] in ENDINGS and r["last_of_item"] and r["seed"] is not None for r in report.records)


class NoWireReply(GymEpisode):
    def step_reply(self, invalid: int) -> dict[str, Any]:
        return {**super().step_reply(invalid), "info": object()}


class LostColumn(GymEpisode):
    def record(self, ended: str) -> dict[str, Any]:
        return {k: v for k, v in super().record(ended).items() if k != "steps"}


class HidesItsEnd(GymEpisode):
    """Ends the item without telling the agent's loop: neither terminated nor truncated."""

    def step_reply(self, invalid: int) -> dict[str, Any]:
        return {**super().step_reply(invalid), "terminated": False, "truncated": False}


class ClaimsFinished(GymEpisode):
    """Says every episode finished, whatever the core says of it."""

    def records(self, *, finished: bool, timeout: str | None, abandoned: bool) -> list[dict[str, Any]]:
        return [{**self.record("finished"), "ended": "finished"}]


class RefusesAll(GymEpisode):
    def sanitize(self, action: Any) -> tuple[Any, int]:
        from arbiter.protocol.errors import InvalidAction

        raise InvalidAction("no")


class NeverEnds(OpenItem):
    def create_payload(self) -> dict[str, Any]:
        return {"observation": 0, "info": {}}

    def step(self, action: Any) -> bool:
        self.steps += 1
        return False


def with_item(item_class: type) -> type:
    class Plan(CountingPlan):
        def open(self, item: Item) -> OpenItem:
            if item_class is NeverEnds:
                return NeverEnds(item)
            return item_class(self.env, item, self.seed_of(item))

    Plan.__name__ = f"{item_class.__name__}Plan"
    return Plan


class Remembers(MeanReturn):
    """Scores from what it saw before, not from the records it is given."""

    def __init__(self, options: Any = None):
        super().__init__(options)
        self.calls = 0

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        self.calls += 1
        return {**super().aggregate(records), "primary": float(self.calls)}


class NoSpaces(CountingPlan):
    def handshake(self) -> dict[str, Any]:
        return {}


class TwoKeys(CountingPlan):
    def make_items(self) -> list[Item]:
        return [Item(index=i, unit="episode", fields={"episode": i}) for i in range(2)]


class IgnoresCap(CountingPlan):
    """Plays its three episodes whatever spec.max_episodes says: --debug would play them all."""

    def make_items(self) -> list[Item]:
        return [Item(index=i, unit=f"episode/{i}", fields={"episode": i}) for i in range(3)]


class UnplayedClaims(CountingPlan):
    def unplayed(self, item: Item) -> list[dict[str, Any]]:
        return [{**item.fields, "seed": None, "steps": 0, "return": 0.0, "ended": "finished"}]


class NeedsPlayedFields(MeanReturn):
    """Divides by a figure that is 0 in the records of items never played."""

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return {**super().aggregate(records), "secondary": statistics.fmean(r["return"] / r["steps"] for r in records)}


class UnplayedLackColumns(CountingPlan):
    def unplayed_records(self, item: Item) -> list[dict[str, Any]]:
        return [{"steps": 0, "return": 0.0, "seed": None}]  # the plan's "episode" column left out


class UnnamedFigure(MeanReturn):
    def figures(self, records: list[dict[str, Any]], score: dict[str, Any]) -> list[dict[str, Any]]:
        return [figure("mean", "mean return", score["primary"], higher_is_better=True)]


class NoDirection(MeanReturn):
    def figures(self, records: list[dict[str, Any]], score: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**made, "direction": "up"} for made in super().figures(records, score)]


@pytest.mark.parametrize(
    "broken,member",
    [
        (counting(with_item(NoWireReply)), "NoWireReply.step_reply() returned what the wire cannot carry"),
        (counting(with_item(LostColumn)), "Plan.columns declares ['steps'], which a record lacks"),
        (
            counting(with_item(ClaimsFinished)),
            "ClaimsFinished.records() item 'episode/0': the format's record says "
            "ended='finished', but the item ended 'step_timeout'",
        ),
        (
            counting(with_item(HidesItsEnd)),
            "HidesItsEnd.step_reply() ends the item (done) with neither terminated nor truncated",
        ),
        (counting(with_item(RefusesAll)), "RefusesAll.sanitize refused an action from the action space"),
        (counting(with_item(NeverEnds)), "NeverEnds.step did not end item 0 in 50 steps"),
        (counting(rule=Remembers), "rule 'mean-return'.aggregate computes other figures from the records read back"),
        (counting(registered="mean"), "rule 'mean'.name is 'mean-return'"),
        (counting(NoSpaces), "Plan.handshake() advertises no action space"),
        (counting(TwoKeys), "Plan.items has two items with one key"),
        (counting(IgnoresCap), "IgnoresCap.make_items() made 3 items for spec.max_episodes=1 (a debug run's cap"),
        (counting(UnplayedClaims), "Plan.unplayed() item 'episode/0': the format's record says ended='finished'"),
        (
            counting(rule=NeedsPlayedFields),
            "rule 'mean-return'.aggregate raised ZeroDivisionError: float division by zero, for an evaluation "
            "that ended after its first item (an evaluation that ended early holds records of items never played",
        ),
        (
            counting(UnplayedLackColumns),
            "Plan.unplayed_records() gave a record of item 0, never played, without ['episode']",
        ),
        (counting(rule=UnnamedFigure), "rule 'mean-return'.figures gave figures ['mean']: each once, each one of"),
        (counting(rule=NoDirection), "rule 'mean-return'.figures gave"),
    ],
    ids=lambda value: value.split(" ")[0] if isinstance(value, str) else None,
)
def test_a_broken_member_is_named(broken, member):
    with pytest.raises(FormatCheckError) as raised:
        check_format(broken, spec(), max_steps=50)
    assert str(raised.value).startswith("format 'counting': ") and member in str(raised.value)


def test_a_plan_honours_the_debug_cap_unless_its_format_plays_it_whole():
    with pytest.raises(FormatCheckError, match=r"IgnoresCap.make_items\(\) made 3 items for spec.max_episodes=2"):
        check_format(counting(IgnoresCap), spec(max_episodes=2))
    assert check_format(counting(), spec(max_episodes=2)).items == 2
    assert check_format(counting(IgnoresCap, plays_whole_plan=True), spec(max_episodes=1)).items == 3
    assert get_format("two-phase").plays_whole_plan  # its phases and runs, scored together
    assert not any(get_format(name).plays_whole_plan for name in KNOWN if name != "two-phase")


class SeedListPlan(CountingPlan):
    """Plays one episode per line of its test folder's seeds.txt, reset with that seed."""

    def make_items(self) -> list[Item]:
        with open(os.path.join(self.tests, "seeds.txt"), encoding="utf-8") as handle:
            self.seeds = [int(line) for line in handle]
        episodes = min(len(self.seeds), self.spec.max_episodes or len(self.seeds))
        return [Item(index=i, unit=f"episode/{i}", fields={"episode": i}) for i in range(episodes)]

    def seed_of(self, item: Item) -> int:
        return self.seeds[item.index]


def test_a_format_that_requires_tests_is_checked_on_the_competitions_own(tmp_path):
    (tmp_path / "seeds.txt").write_text("11\n12\n", encoding="utf-8")
    declared = counting(SeedListPlan, requires_tests=True)
    report = check_format(declared, spec(tests=str(tmp_path)))  # the competition's tests key, as run reads it
    assert [r["seed"] for r in report.records] == [11, 12]
    with pytest.raises(FormatCheckError, match=r"^format 'counting': Format.requires_tests is True and no test"):
        check_format(declared, spec())
