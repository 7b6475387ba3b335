"""``check_format``'s checks of a scoring rule: its members, and what it computes from records
(figures a summary can hold, made by ``core.scoring.figure``), each failure one error naming the
rule's member at fault. Mixed into the checker of server/formats/check.py."""

from __future__ import annotations

import json
from typing import Any

from arbiter.protocol.codec import encode
from arbiter.protocol.errors import DecodeError
from arbiter.server.core.summary import NOT_PLAYED

SCORE_KEYS = ("primary", "secondary", "primary_name", "secondary_name", "spread")
FIGURE_KEYS = {"name", "title", "value", "direction", "spec", "spread"}  # what core.scoring.figure makes


class RuleChecks:
    """What the checker asks of a scoring rule; ``fail`` is the checker's."""

    def fail(self, member: str, problem: str) -> AssertionError:
        raise NotImplementedError

    def check_rule(self, rule: Any, registered: str) -> None:
        for member in ("aggregate", "primary"):
            if not callable(getattr(rule, member, None)):
                raise self.fail(f"rule {registered!r}.{member}", "is missing: a rule computes figures from records")
        if getattr(rule, "name", None) != registered:
            raise self.fail(
                f"rule {registered!r}.name",
                f"is {getattr(rule, 'name', None)!r}: a summary names its rule by the name it is registered under",
            )
        if not isinstance(getattr(rule, "higher_is_better", None), bool):
            raise self.fail(f"rule {registered!r}.higher_is_better", "must be True or False")

    def check_figures(self, rule: Any, records: list[dict[str, Any]], score: dict[str, Any]) -> None:
        """What a leaderboard reads: figures made by core.scoring.figure, named in figure_names."""
        member = f"rule {rule.name!r}.figures"
        made = self.call(rule, "figures", records, "the records of a whole evaluation", score)
        if not isinstance(made, list) or not all(isinstance(f, dict) and FIGURE_KEYS <= set(f) for f in made):
            raise self.fail(member, f"gave {short_repr(made)}: a list of figures made by core.scoring.figure")
        names = [f["name"] for f in made]
        unnamed = [name for name in names if name not in rule.figure_names]
        if unnamed or len(set(names)) != len(names):
            raise self.fail(member, f"gave figures {names}: each once, each one of figure_names {rule.figure_names}")
        if any(f["direction"] not in ("higher", "lower") for f in made):
            raise self.fail(member, f"gave {short_repr(made)}: each figure's direction is 'higher' or 'lower'")
        context = self.call(rule, "context", records, "the records of a whole evaluation", score)
        self.wire(f"rule {rule.name!r}.context", context)

    def call(self, rule: Any, member: str, records: list[dict[str, Any]], what: str, *more: Any) -> Any:
        """``rule.member(records, *more)``; what it raises, as one error naming it and the records."""
        try:
            return getattr(rule, member)(records, *more)
        except Exception as exc:
            hint = (
                " (an evaluation that ended early holds records of items never played: ended "
                "'not_played', with only the fields Plan.unplayed_records gives)"
                if any(r.get("ended") == NOT_PLAYED for r in records)
                else ""
            )
            raise self.fail(
                f"rule {rule.name!r}.{member}", f"raised {type(exc).__name__}: {exc}, for {what}{hint}"
            ) from exc

    def score(self, rule: Any, records: list[dict[str, Any]], what: str) -> dict[str, Any]:
        score = self.call(rule, "aggregate", records, what)
        member = f"rule {rule.name!r}.aggregate"
        if not isinstance(score, dict) or any(key not in score for key in SCORE_KEYS):
            raise self.fail(member, f"gave {short_repr(score)} for {what}: a map with at least {list(SCORE_KEYS)}")
        try:
            json.dumps(score, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise self.fail(member, f"gave figures summary.json cannot hold ({exc})") from None
        return score

    def wire(self, member: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise self.fail(member, f"returned {short_repr(body)}: a map")
        try:
            encode(body)
        except DecodeError as exc:
            raise self.fail(member, f"returned what the wire cannot carry ({exc}): {short_repr(body)}") from None
        return body


def short_repr(value: Any) -> str:
    """A value as an error names it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 160 else text[:157] + "..."
