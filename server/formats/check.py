"""``check_format``: a format's plan played end to end against the contract the core relies on,
with no Redis, no client and no clock, so a format's faults show as one clear error naming the
member at fault rather than as a stalled evaluation.

What it plays: the plan made from a competition spec; every item opened, created and stepped
with actions sampled from the action space the handshake advertises (or a ``policy``) until it
ends (an item that spans resets is reset whenever its episode ends); the first item once more
cut short by a step timeout, once more left by the agent; every item's records as never played.
The plan is made once more with a cap of one item (``spec.max_episodes``, as ``--debug`` caps
it), which it must honour unless its format plays its plan whole. What it checks: every reply
and payload is plain wire data (``protocol.codec`` encodes it); records are JSON, carry the
core's part once merged (``core/summary.py``) and every declared column, end in the core's
vocabulary; results.csv rows, progress lines and table rows come out of every record; the
scoring rule computes from the records alone (the same figures after a JSON round trip, and with
items not played); the plan and its items close.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arbiter.protocol.errors import DecodeError, InvalidAction
from arbiter.protocol.messages import EXTENSION_KEY
from arbiter.protocol.spaces import space_from_wire
from arbiter.server.core.summary import ENDINGS, NOT_PLAYED, core_fields, merge_records
from arbiter.server.formats.base import Format, Item
from arbiter.server.formats.check_rules import RuleChecks, short_repr

# (the opened item, the last create payload or step reply) → the action to send
Policy = Callable[[Any, dict[str, Any]], Any]

OPEN_ITEM_MEMBERS = ("item", "spans_resets", "stage_budget_s", "create_payload", "sanitize", "step", "step_reply",
                     "records", "close")  # fmt: skip
PLAN_MEMBERS = ("items", "seed", "source", "server_side", "prepare_ahead", "packages", "columns", "csv_columns", "open",
                "unplayed", "handshake", "submit_fields", "csv_row", "progress_text", "table_header", "table_row",
                "close")  # fmt: skip


class FormatCheckError(AssertionError):
    """A format broke the contract; the message names the format and the member at fault."""


@dataclass
class FormatCheck:
    """What a check played: the records as an evaluation would have written them, and the score."""

    format: str
    items: int = 0
    steps: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)
    unplayed: list[dict[str, Any]] = field(default_factory=list)
    score: dict[str, Any] = field(default_factory=dict)


def check_format(
    fmt: str | Format,
    spec: Any,
    *,
    tests: str | None = None,
    policy: Policy | None = None,
    max_steps: int = 10_000,
    seed: int = 0,
) -> FormatCheck:
    """Play ``fmt``'s plan for competition ``spec`` (a ``CompetitionSpec``) and check it against
    the contract; raises ``FormatCheckError`` naming what is wrong. ``policy`` chooses the
    actions (by default: sampled from the handshake's action space, a format whose clients
    mirror the env advertises none and needs one); ``max_steps``: the most steps one item may
    take before the check says its ``step`` never ends it. ``tests``: the test folder, by default
    the competition's own (its ``tests`` key), as an evaluation reads it."""
    if isinstance(fmt, str):
        from arbiter.server.formats import get_format

        fmt = get_format(fmt)
    if tests is None:
        tests = getattr(spec, "tests", None)
    if tests is None and fmt.requires_tests:
        raise FormatCheckError(
            f"format {fmt.name!r}: Format.requires_tests is True and no test folder was given: pass "
            "check_format(..., tests=DIR) or set the competition's tests key"
        )
    checker = _Checker(fmt, policy, max_steps, random.Random(seed))
    return checker.run(spec, tests)


class _Checker(RuleChecks):
    def __init__(self, fmt: Format, policy: Policy | None, max_steps: int, rng: random.Random):
        self.fmt = fmt
        self.policy = policy
        self.max_steps = max_steps
        self.rng = rng
        self.report = FormatCheck(fmt.name)
        self.action_space: Any = None

    def fail(self, member: str, problem: str) -> FormatCheckError:
        return FormatCheckError(f"format {self.fmt.name!r}: {member} {problem}")

    # -- the declaration, the rule, the plan -------------------------------------------------------

    def run(self, spec: Any, tests: str | None) -> FormatCheck:
        fmt = self.fmt
        if not fmt.rules:
            raise self.fail("Format.rules", "is empty: a format scores with at least one rule")
        rule_name = spec.scoring or fmt.default_rule
        if rule_name not in fmt.rules:
            raise self.fail("Format.rules", f"has no rule {rule_name!r} (the spec's scoring); it has {list(fmt.rules)}")
        rule = fmt.rules[rule_name](spec.options)
        self.check_rule(rule, rule_name)
        plan = fmt.make_plan(spec, rule, tests=tests)
        try:
            self.check_plan(plan)
            self.check_cap(spec, rule, plan, tests)
            played = self.play(plan)
            self.report.records = played
            self.check_unplayed(plan)
            self.check_scoring(plan, rule, played)
        finally:
            plan.close()
        return self.report

    def check_plan(self, plan: Any) -> None:
        for member in PLAN_MEMBERS:
            if not hasattr(plan, member):
                raise self.fail(f"Plan.{member}", "is missing")
        items = plan.items
        if not isinstance(items, list) or not items or not all(isinstance(i, Item) for i in items):
            raise self.fail("Plan.items", "must be a non-empty list of base.Item")
        for position, item in enumerate(items):
            if item.index != position:
                raise self.fail("Plan.items", f"item {position} has index {item.index}: indices are positions")
        keys = [item.unit for item in items]
        if len(set(keys)) != len(keys):
            raise self.fail("Plan.items", "has two items with one key: --resume tells items apart by key")
        for member in ("server_side", "prepare_ahead"):
            if not isinstance(getattr(plan, member), bool):
                raise self.fail(f"Plan.{member}", "must be True or False")
        if not all(isinstance(p, str) for p in plan.packages):
            raise self.fail("Plan.packages", "must name distributions (strings)")
        if plan.seed is not None and not isinstance(plan.seed, int):
            raise self.fail("Plan.seed", f"is {plan.seed!r}: a whole number or None")
        columns = plan.csv_columns
        if not isinstance(columns, list) or not columns or not all(isinstance(c, str) for c in columns):
            raise self.fail("Plan.csv_columns", "must be a non-empty list of column names")
        handshake = self.wire("Plan.handshake()", plan.handshake())
        if plan.server_side:
            self.action_space = self.advertised_action_space(handshake)
        if self.policy is None and self.action_space is None:
            raise self.fail(
                "Plan.handshake()", "advertises no action space (spaces.action): give check_format a policy"
            )
        if not isinstance(plan.table_header(), str):
            raise self.fail("Plan.table_header()", "must return a line of text")

    def check_cap(self, spec: Any, rule: Any, plan: Any, tests: str | None) -> None:
        """``spec.max_episodes``, a competition's cap and a debug run's: the plan made under it
        has at most that many items (a debug run plays the first N items, not the whole plan),
        unless the format declares that it plays its plan whole (``Format.plays_whole_plan``)."""
        if self.fmt.plays_whole_plan:
            return
        cap = getattr(spec, "max_episodes", None)
        if cap is not None:
            self.capped(f"{type(plan).__name__}.make_items()", len(plan.items), cap)
        if len(plan.items) < 2 or (cap is not None and cap < 2):
            return  # nothing a smaller cap could leave out
        capped = self.fmt.make_plan(_with_cap(spec, 1), rule, tests=tests)
        try:
            self.capped(f"{type(capped).__name__}.make_items()", len(capped.items), 1)
        finally:
            capped.close()

    def capped(self, member: str, items: int, cap: int) -> None:
        if not 1 <= items <= cap:
            raise self.fail(
                member,
                f"made {items} items for spec.max_episodes={cap} (a debug run's cap, --debug): a plan plays "
                "the first max_episodes items, at least one, or its Format declares plays_whole_plan=True",
            )

    def advertised_action_space(self, handshake: dict[str, Any]) -> Any:
        wire = (handshake.get("spaces") or {}).get("action") if isinstance(handshake.get("spaces"), dict) else None
        if wire is None:
            return None
        try:
            space = space_from_wire(wire)
        except DecodeError as exc:
            raise self.fail("Plan.handshake()", f"advertises an action space RemoteEnv cannot rebuild: {exc}") from None
        space.seed(self.rng.randrange(2**31))
        return space

    # -- playing ----------------------------------------------------------------------------------

    def play(self, plan: Any) -> list[dict[str, Any]]:
        first = plan.items[0]
        cut_short = (("step_timeout", {"timeout": "step", "abandoned": False}),
                     ("abandoned", {"timeout": None, "abandoned": True}))  # fmt: skip
        for expected, how in cut_short:  # after one step, as a step timeout or the agent's reset would
            opened = self.open(plan, first)
            reply = self.wire(f"{type(opened).__name__}.create_payload()", opened.create_payload())
            if self.step(plan, opened, reply)[1]:  # the item ended at once: nothing to cut short
                self.records(opened, first, finished=True, timeout=None, abandoned=False)
                continue
            records = self.records(opened, first, finished=False, **how)
            if records[-1]["ended"] != expected:
                raise self.fail(f"{type(opened).__name__}.records()", f"of an item cut short by {expected} say "
                                f"ended={records[-1]['ended']!r}")  # fmt: skip
        played: list[dict[str, Any]] = []
        for item in plan.items:
            opened = self.open(plan, item)
            reply = self.wire(f"{type(opened).__name__}.create_payload()", opened.create_payload())
            for _ in range(self.max_steps):
                reply, over = self.step(plan, opened, reply)
                if over:
                    break
                if opened.spans_resets and self.episode_ended(reply):
                    reply = self.wire(f"{type(opened).__name__}.next_reset()", opened.next_reset())
            else:
                raise self.fail(
                    f"{type(opened).__name__}.step", f"did not end item {item.index} in {self.max_steps} steps"
                )
            played += self.records(opened, item, finished=True, timeout=None, abandoned=False)
            self.report.items += 1
        return played

    def open(self, plan: Any, item: Item) -> Any:
        opened = plan.open(item)
        name = type(opened).__name__
        for member in OPEN_ITEM_MEMBERS:
            if not hasattr(opened, member):
                raise self.fail(f"{name}.{member}", "is missing (Plan.open returned an incomplete item)")
        if opened.item is not item:
            raise self.fail(f"{name}.item", f"is not the item Plan.open was given ({item.unit!r})")
        if opened.stage_budget_s is not None and not opened.stage_budget_s > 0:
            raise self.fail(f"{name}.stage_budget_s", "must be a positive number of seconds or None")
        return opened

    def step(self, plan: Any, opened: Any, last: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        name = type(opened).__name__
        action = self.policy(opened, last) if self.policy is not None else self.action_space.sample()
        try:
            sanitized = opened.sanitize(action)
        except InvalidAction as exc:
            raise self.fail(
                f"{name}.sanitize", f"refused an action from the action space ({action!r}): {exc}"
            ) from None
        if not (isinstance(sanitized, tuple) and len(sanitized) == 2 and isinstance(sanitized[1], int)):
            raise self.fail(f"{name}.sanitize", f"returned {sanitized!r}: (the action to apply, invalid entries)")
        clean, invalid = sanitized
        over = opened.step(clean)
        if not isinstance(over, bool):
            raise self.fail(f"{name}.step", f"returned {over!r}: True when the item is over, else False")
        self.report.steps += 1
        reply = self.wire(f"{name}.step_reply()", opened.step_reply(invalid))
        if reply.get("done") is not over:
            raise self.fail(f"{name}.step_reply()", f"says done={reply.get('done')!r} where step() said {over}")
        if plan.server_side and not isinstance((reply.get(EXTENSION_KEY) or {}).get("stage_over"), bool):
            raise self.fail(f"{name}.step_reply()", f"has no {EXTENSION_KEY}.stage_over (RemoteEnv's stages read it)")
        if plan.server_side and over and "terminated" in reply and not self.episode_ended(reply):
            raise self.fail(
                f"{name}.step_reply()",
                "ends the item (done) with neither terminated nor truncated: a Gymnasium loop would step past "
                "its end (an item its format's cap ended is truncated)",
            )
        return reply, over

    @staticmethod
    def episode_ended(reply: dict[str, Any]) -> bool:
        return bool(reply.get("terminated") or reply.get("truncated"))

    def records(self, opened: Any, item: Item, **ending: Any) -> list[dict[str, Any]]:
        name = type(opened).__name__
        try:
            made = opened.records(**ending)
        finally:
            opened.close()
        return self.merged(f"{name}.records()", made, item, played=True, **ending)

    def merged(self, member: str, made: Any, item: Item, *, played: bool, **ending: Any) -> list[dict[str, Any]]:
        """The records as the core writes them, checked."""
        if not isinstance(made, list) or not made or not all(isinstance(r, dict) for r in made):
            raise self.fail(member, "must return a non-empty list of records (dicts)")
        timeout, abandoned = ending.get("timeout"), ending.get("abandoned", False)
        every, last = core_fields(timeout=timeout, abandoned=abandoned, played=played, debug=False, elapsed_s=0.0,
                                  invalid_actions=0, wall_s=0.0, planning_s=None, step_think_s=None,
                                  time_bank_used_s=0.0)  # fmt: skip
        try:
            records = merge_records(item.index, item.unit, made, every, last)
        except ValueError as exc:
            raise self.fail(member, str(exc)) from None
        for record in records:
            try:
                json.dumps(record, allow_nan=False)
            except (TypeError, ValueError) as exc:
                said = f"gave a record episodes.jsonl cannot hold ({exc}): {short_repr(record)}"
                raise self.fail(member, said) from None
            if record["ended"] not in ENDINGS:
                raise self.fail(member, f"gave ended={record['ended']!r}, not one of {ENDINGS}")
        return records

    # -- records never played, and what reads records ---------------------------------------------

    def check_unplayed(self, plan: Any) -> None:
        for item in plan.items:
            records = self.merged("Plan.unplayed()", plan.unplayed(item), item, played=False)
            if any(r["ended"] != NOT_PLAYED for r in records):
                raise self.fail("Plan.unplayed()", f"gave a record of item {item.index} that does not end not_played")
            self.report.unplayed += records

    def check_outputs(self, plan: Any, records: list[dict[str, Any]]) -> None:
        columns = plan.csv_columns
        declared = [c.name for c in plan.columns if c.value is None and not c.optional]
        for record in records:
            missing = [name for name in declared if name not in record]
            if missing and record["ended"] == NOT_PLAYED:
                raise self.fail(
                    "Plan.unplayed_records()",
                    f"gave a record of item {record['index']}, never played, without {missing}, which "
                    f"Plan.columns declares (mark them optional, or give them): {short_repr(record)}",
                )
            if missing:
                raise self.fail("Plan.columns", f"declares {missing}, which a record lacks: {short_repr(record)}")
            row = plan.csv_row(record)
            if not isinstance(row, dict) or set(row) - set(columns):
                raise self.fail("Plan.csv_row()", f"gave {short_repr(row)}: a map of csv_columns {columns}")
            for member, text in (("progress_text", plan.progress_text(record)), ("table_row", plan.table_row(record))):
                if text is not None and not isinstance(text, str):
                    raise self.fail(f"Plan.{member}()", f"gave {text!r}: a line of text, or None to leave it out")
            if record["last_of_item"] and not isinstance(plan.progress_text(record), str):
                raise self.fail("Plan.progress_text()", f"gave no line for item {record['index']}'s last record")

    def check_scoring(self, plan: Any, rule: Any, played: list[dict[str, Any]]) -> None:
        self.check_outputs(plan, played + self.report.unplayed)
        self.wire("Plan.submit_fields()", plan.submit_fields(played))
        score = self.score(rule, played, "the records of a whole evaluation")
        stored = json.loads(json.dumps(played))  # episodes.jsonl, read back
        if self.score(rule, stored, "records read back from episodes.jsonl") != score:
            raise self.fail(f"rule {rule.name!r}.aggregate", "computes other figures from the records read back: "
                            "it must score from the records alone")  # fmt: skip
        ended_early = played[: _first_item_records(played)] + [
            r for r in self.report.unplayed if r["index"] > played[0]["index"]
        ]
        self.score(rule, ended_early, "an evaluation that ended after its first item")
        primary = self.call(rule, "primary", played, "the records of a whole evaluation")
        if primary is not None and not isinstance(primary, (int, float)):
            raise self.fail(f"rule {rule.name!r}.primary", f"gave {primary!r}: a number or None")
        self.check_figures(rule, played, score)
        self.report.score = score


def _with_cap(spec: Any, cap: int) -> Any:
    """``spec`` with ``max_episodes`` set to ``cap``: a CompetitionSpec (a frozen dataclass) as
    ``--debug`` makes one, or a copy of another object that stands for one."""
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        return dataclasses.replace(spec, max_episodes=cap)
    capped = copy.copy(spec)
    capped.max_episodes = cap
    return capped


def _first_item_records(records: list[dict[str, Any]]) -> int:
    first = records[0]["index"]
    return sum(1 for r in records if r["index"] == first)
