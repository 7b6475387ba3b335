"""The DIAMBRA format's competition keys, checked at load against what the game supports.

``game`` and ``difficulty`` say what is played and how it is weighted (docs/formats/diambra.md);
``episodes`` how many episodes make one evaluation (its score is their mean). The env keys are
the ones that change what an agent faces or how fast it runs: frame shape, step ratio, role,
characters, outfits, the action space, and the game-specific keys of diambra-arena 2.2.7
(``super_art`` for sfiii3n, ``tower`` for umk3, ``fighting_style`` / ``ultimate_style`` for
kof98umh, ``fighting_style`` / ``speed_mode`` for mvsc, ``speed_mode`` for xmvsf). A key left
unset (``None``) is drawn by the env at each reset from the reset's seed, so it is still
reproducible and recorded.

Every error is a ``ConfigError`` that names the key, the value and what the game accepts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from arbiter.protocol.errors import ConfigError
from arbiter.server.formats.diambra.games import DIFFICULTIES, GAMES, Game

MAX_FRAME_SIDE = 512  # the engine resizes frames up to this side (diambra-arena's MAX_FRAME_RES)
ROLES = ("P1", "P2")
ACTION_SPACES = ("multi_discrete", "discrete")
GAME_SPECIFIC = ("super_art", "fighting_style", "ultimate_style", "speed_mode", "tower")


@dataclass(frozen=True)
class DiambraSettings:
    game: str = "doapp"
    difficulty: str = "easy"
    episodes: int = 1
    # [height, width, channels]: channels 0 keeps the game's colours, 1 makes it grayscale;
    # [0, 0, 0] (the default) is the game's native frame. The engine resizes, not arbiter.
    frame_shape: list[int] | None = None
    step_ratio: int = 6  # emulator frames per env step, 1 to 6
    role: str | None = None  # "P1" or "P2"; None: drawn at each reset
    characters: str | list[str] | None = None  # one name, or up to the game's team size
    outfits: int = 1
    action_space: str = "multi_discrete"
    # Continues would let an episode fall below the documented lowest reward, which the score's
    # weight and a timed-out episode's score rest on: only 0.0 (no continue) is accepted.
    continue_game: float = 0.0
    show_final: bool = False  # the ending animation costs time and changes nothing scored
    super_art: int | None = None
    fighting_style: int | None = None
    ultimate_style: list[int] | None = None  # kof98umh: [dash, evade, bar], each 1 or 2
    speed_mode: int | None = None
    tower: int | None = None
    engine_timeout_s: int = 60  # how long to wait for a DIAMBRA engine to answer at connection

    def __post_init__(self) -> None:
        game = self._check_game()
        difficulty = self.difficulty.lower() if isinstance(self.difficulty, str) else self.difficulty
        if difficulty not in DIFFICULTIES:
            raise ConfigError(f"difficulty must be one of {list(DIFFICULTIES)}, got {self.difficulty!r}")
        object.__setattr__(self, "difficulty", difficulty)
        _whole("episodes", self.episodes, 1, None)
        _whole("step_ratio", self.step_ratio, 1, 6)
        _whole("engine_timeout_s", self.engine_timeout_s, 1, 3600)
        self._check_frame_shape()
        if self.role is not None and self.role not in ROLES:
            raise ConfigError(f"role must be one of {list(ROLES)} (or unset: drawn at each reset), got {self.role!r}")
        self._check_characters(game)
        _whole("outfits", self.outfits, *game.outfits, f" for {game.game_id}")
        if self.action_space not in ACTION_SPACES:
            raise ConfigError(f"action_space must be one of {list(ACTION_SPACES)}, got {self.action_space!r}")
        if not isinstance(self.continue_game, (int, float)) or self.continue_game != 0:
            raise ConfigError(
                f"continue_game must be 0.0, got {self.continue_game!r}: with continues an episode's reward can fall "
                "below the lowest the score's difficulty weight is defined on"
            )
        if not isinstance(self.show_final, bool):
            raise ConfigError(f"show_final must be true or false, got {self.show_final!r}")
        self._check_game_specific(game)

    # -- checks ------------------------------------------------------------------------------------

    def _check_game(self) -> Game:
        game = GAMES.get(self.game) if isinstance(self.game, str) else None
        if game is None:
            raise ConfigError(f"game must be a DIAMBRA Arena game id, one of {sorted(GAMES)}; got {self.game!r}")
        return game

    def _check_frame_shape(self) -> None:
        shape = self.frame_shape
        if shape is None:
            return
        if not isinstance(shape, (list, tuple)) or len(shape) != 3:
            raise ConfigError(f"frame_shape must be [height, width, channels], got {shape!r}")
        height, width, channels = shape
        _whole("frame_shape height", height, 0, MAX_FRAME_SIDE)
        _whole("frame_shape width", width, 0, MAX_FRAME_SIDE)
        if (height == 0) != (width == 0):
            raise ConfigError(f"frame_shape: height and width must both be 0 (native) or both set, got {list(shape)}")
        if channels not in (0, 1) or isinstance(channels, bool):
            raise ConfigError(f"frame_shape channels must be 0 (the game's colours) or 1 (grayscale), got {channels!r}")
        object.__setattr__(self, "frame_shape", [int(height), int(width), int(channels)])

    def _check_characters(self, game: Game) -> None:
        chosen = self.characters
        if chosen is None:
            return
        names = [chosen] if isinstance(chosen, str) else chosen
        if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"characters must be a name or a list of names, got {chosen!r}")
        if len(names) > game.chars_to_select:
            raise ConfigError(
                f"characters: {game.game_id} has teams of {game.chars_to_select}, got {len(names)} names {list(names)}"
            )
        for name in names:
            if name not in game.characters:
                raise ConfigError(
                    f"characters: {name!r} is not a {game.game_id} character; known: {list(game.selectable())}"
                )
            if name in game.forbidden:
                raise ConfigError(
                    f"characters: {name!r} cannot be selected in {game.game_id} (forbidden: {list(game.forbidden)})"
                )
        if len(set(names)) != len(names):
            raise ConfigError(f"characters: a team cannot hold one fighter twice, got {list(names)}")
        for a, b in game.homonyms:
            if a in names and b in names:
                raise ConfigError(f"characters: {a!r} and {b!r} are one fighter in {game.game_id}")
        object.__setattr__(self, "characters", list(names))

    def _check_game_specific(self, game: Game) -> None:
        allowed = dict(game.specific)
        for key in GAME_SPECIFIC:
            value = getattr(self, key)
            if value is None:
                continue
            if key not in allowed:
                applies = sorted(g.game_id for g in GAMES.values() if key in dict(g.specific))
                raise ConfigError(f"{key} applies to {', '.join(applies)} only, not to {game.game_id}")
            if key == "ultimate_style":
                if not isinstance(value, (list, tuple)) or len(value) != 3 or any(v not in allowed[key] for v in value):
                    raise ConfigError(f"ultimate_style must be [dash, evade, bar], each 1 or 2; got {value!r}")
                object.__setattr__(self, key, [int(v) for v in value])
            elif isinstance(value, bool) or value not in allowed[key]:
                raise ConfigError(f"{key} must be one of {list(allowed[key])} for {game.game_id}, got {value!r}")

    # -- what the rest of the format reads ------------------------------------------------------

    @property
    def game_facts(self) -> Game:
        return GAMES[self.game]

    @property
    def level(self) -> int:
        """The game's own difficulty level for the chosen difficulty name."""
        return GAMES[self.game].levels[self.difficulty]

    def as_record(self) -> dict[str, Any]:
        """The settings as plain data, for every episode record and the results."""
        return {f.name: _plain_copy(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> DiambraSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _plain_copy(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


def _whole(name: str, value: Any, low: int, high: int | None, where: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f">= {low}"
        raise ConfigError(f"{name} must be a whole number {span}{where}, got {value!r}")
