"""A format's own competition keys read from a TOML table (docs/reference/competition-file.md):
unknown keys, wrong types and nested tables are refused by name; values reach the dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.server.formats.options import options_from_dict


@dataclass(frozen=True)
class Inner:
    steps: int = 10
    rate: float = 0.5


@dataclass(frozen=True)
class Outer:
    name: str = "x"
    flag: bool = False
    limit: int | None = None
    inner: Inner = field(default_factory=Inner)

    def __post_init__(self) -> None:
        if self.name == "bad":
            raise ConfigError("name must not be 'bad'")


def test_values_of_every_scalar_type_and_a_nested_table_arrive():
    built = options_from_dict(Outer, {"name": "y", "flag": True, "limit": 3, "inner": {"rate": 2}}, "comp.toml")
    assert built == Outer(name="y", flag=True, limit=3, inner=Inner(steps=10, rate=2.0))
    assert isinstance(built.inner.rate, float)  # TOML's 2 is a fine float
    assert options_from_dict(Outer, {"limit": None}, "comp.toml").limit is None


@pytest.mark.parametrize(
    "data,message",
    [
        ({"nmae": "y"}, r"comp.toml: unknown keys \['nmae'\]; allowed here: \['flag', 'inner', 'limit', 'name'\]"),
        ({"inner": {"step": 1}}, r"unknown keys \['inner.step'\]"),
        ({"flag": 1}, "flag must be bool, got 1"),
        ({"limit": True}, "limit must be int or None, got True"),
        ({"limit": 2.5}, "limit must be int or None"),
        ({"inner": {"steps": "ten"}}, "inner.steps must be int, got 'ten'"),
        ({"inner": 3}, "inner must be a table"),
        ({"name": "bad"}, "comp.toml: name must not be 'bad'"),
    ],
)
def test_bad_tables_are_refused_saying_which_key_and_why(data, message):
    with pytest.raises(ConfigError, match=message):
        options_from_dict(Outer, data, "comp.toml")


def test_a_table_that_is_not_a_table_is_refused():
    with pytest.raises(ConfigError, match="the format options must be a table"):
        options_from_dict(Outer, ["name"], "comp.toml")
