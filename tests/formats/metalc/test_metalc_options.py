"""MetaLC's options (docs/formats/metalc.md): the preset loads and bad values are refused by name."""

from __future__ import annotations

import os

import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.budgets import BudgetPolicy
from arbiter.server.formats.base import options_from_dict
from arbiter.server.formats.metalc import FORMAT
from arbiter.server.formats.metalc.options import MetaLCOptions


@pytest.mark.parametrize(
    "options,message",
    [
        ({"phase": "test"}, "unknown MetaLC phase"),
        ({"meta_train_s": -1}, "meta_train_s must be >= 0"),
        ({"dataset_s": float("inf")}, "dataset_s must be a number"),
        ({"max_steps": -3}, "max_steps must be a whole number"),
        ({"max_steps": 2.5}, "max_steps must be int"),
        ({"folds": 5}, "unknown keys"),
    ],
)
def test_bad_options_are_refused_by_name(options, message):
    with pytest.raises(ConfigError, match=message):
        options_from_dict(MetaLCOptions, options, "test")


def test_the_preset_loads_as_the_formats_options():
    import tomllib

    with open(os.path.join(FORMAT.presets_dir, "metalc-wcci2022.toml"), "rb") as handle:
        data = tomllib.load(handle)
    assert (data["format"], data["scoring"]) == ("metalc", "alc")
    core = {"format", "scoring", "seed", "budgets", "leaderboard"}
    options = options_from_dict(MetaLCOptions, {k: v for k, v in data.items() if k not in core}, "preset")
    assert options.phase == "dev" and options.meta_train_s > 0 and options.dataset_s > 0
    BudgetPolicy(**data["budgets"])
