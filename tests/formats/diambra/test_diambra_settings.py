"""The DIAMBRA format's competition keys: what loads, and the errors that say why not."""

from __future__ import annotations

import json

import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.server.formats.base import options_from_dict
from arbiter.server.formats.diambra.settings import DiambraSettings


def test_defaults_and_normalisation():
    settings = DiambraSettings()
    assert (settings.game, settings.difficulty, settings.episodes, settings.level) == ("doapp", "easy", 1, 2)
    shaped = DiambraSettings(
        game="kof98umh", difficulty="Hard", frame_shape=(128, 128, 1), characters="Kyo", ultimate_style=(1, 2, 1)
    )
    assert shaped.difficulty == "hard" and shaped.level == 8
    assert shaped.frame_shape == [128, 128, 1]
    assert shaped.characters == ["Kyo"]
    assert shaped.as_record()["ultimate_style"] == [1, 2, 1]
    assert DiambraSettings.from_record(json.loads(json.dumps(shaped.as_record()))) == shaped


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"game": "pong"}, r"game must be a DIAMBRA Arena game id, one of \[.*'doapp'"),
        ({"difficulty": "insane"}, r"difficulty must be one of \['easy', 'medium', 'hard'\], got 'insane'"),
        ({"episodes": 0}, r"episodes must be a whole number >= 1, got 0"),
        ({"episodes": True}, r"episodes must be a whole number"),
        ({"step_ratio": 7}, r"step_ratio must be a whole number from 1 to 6, got 7"),
        ({"frame_shape": [128, 128]}, r"frame_shape must be \[height, width, channels\]"),
        ({"frame_shape": [600, 128, 0]}, r"frame_shape height must be a whole number from 0 to 512, got 600"),
        ({"frame_shape": [128, 0, 0]}, r"height and width must both be 0 \(native\) or both set"),
        ({"frame_shape": [128, 128, 3]}, r"channels must be 0 \(the game's colours\) or 1 \(grayscale\), got 3"),
        ({"role": "P3"}, r"role must be one of \['P1', 'P2'\]"),
        ({"characters": "Ryu"}, r"'Ryu' is not a doapp character; known: \['Kasumi'"),
        ({"characters": ["Kasumi", "Zack"]}, r"doapp has teams of 1, got 2 names"),
        ({"game": "sfiii3n", "characters": "Gill"}, r"'Gill' cannot be selected in sfiii3n"),
        ({"game": "tektagt", "characters": ["Jin", "Jin"]}, r"cannot hold one fighter twice"),
        ({"game": "tektagt", "characters": ["Kuma", "Panda"]}, r"'Panda' and 'Kuma' are one fighter in tektagt"),
        ({"characters": 5}, r"characters must be a name or a list of names, got 5"),
        ({"outfits": 5}, r"outfits must be a whole number from 1 to 4 for doapp, got 5"),
        ({"game": "umk3", "outfits": 2}, r"outfits must be a whole number from 1 to 1 for umk3, got 2"),
        ({"action_space": "box"}, r"action_space must be one of \['multi_discrete', 'discrete'\]"),
        ({"continue_game": -2.0}, r"continue_game must be 0.0, got -2.0: with continues"),
        ({"super_art": 1}, r"super_art applies to sfiii3n only, not to doapp"),
        ({"game": "sfiii3n", "super_art": 4}, r"super_art must be one of \[1, 2, 3\] for sfiii3n, got 4"),
        ({"game": "umk3", "tower": 5}, r"tower must be one of \[1, 2, 3, 4\] for umk3, got 5"),
        ({"game": "kof98umh", "ultimate_style": [1, 3, 1]}, r"ultimate_style must be \[dash, evade, bar\]"),
        ({"fighting_style": 1}, r"fighting_style applies to kof98umh, mvsc only, not to doapp"),
        ({"engine_timeout_s": 0}, r"engine_timeout_s must be a whole number from 1 to 3600"),
    ],
)
def test_invalid_settings_say_why(keys, message):
    with pytest.raises(ConfigError, match=message):
        DiambraSettings(**keys)


def test_loads_from_a_competition_table():
    table = {"game": "sfiii3n", "difficulty": "medium", "episodes": 3, "frame_shape": [128, 128, 1], "super_art": 2}
    settings = options_from_dict(DiambraSettings, table, "competition.toml")
    assert settings.level == 6 and settings.episodes == 3 and settings.super_art == 2
    with pytest.raises(ConfigError, match=r"competition.toml: unknown keys \['dificulty'\]"):
        options_from_dict(DiambraSettings, {"dificulty": "hard"}, "competition.toml")
    with pytest.raises(ConfigError, match=r"competition.toml: step_ratio must be int, got 'fast'"):
        options_from_dict(DiambraSettings, {"step_ratio": "fast"}, "competition.toml")
    with pytest.raises(ConfigError, match=r"competition.toml: difficulty must be one of"):
        options_from_dict(DiambraSettings, {"difficulty": "nightmare"}, "competition.toml")
