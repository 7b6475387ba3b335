"""arbiter's DIAMBRA game table (docs/formats/diambra.md): the documented levels and bounds, and the
installed diambra-arena's own game data."""

from __future__ import annotations

import pytest

from arbiter.server.formats.diambra.games import GAMES


def test_game_table_matches_the_installed_diambra_arena():
    pytest.importorskip("diambra.arena")
    from diambra.arena.utils.gym_utils import available_games

    installed = available_games(print_out=False)
    assert set(GAMES) == set(installed), "arbiter's game table and diambra-arena's games differ"
    for game_id, game in GAMES.items():
        data = installed[game_id]
        assert game.levels == {name.lower(): level for name, level in data["cluster_to_difficulty_map"].items()}
        assert game.level_range == tuple(data["difficulty"][:2])
        assert game.rounds_per_stage == data["rounds_per_stage"]
        assert game.stages_per_game == data["stages_per_game"]
        assert game.chars_per_round == data["number_of_chars_per_round"]
        assert game.chars_to_select == data["number_of_chars_to_select"]
        assert game.health == tuple(data["health"])
        assert game.frame_shape == tuple(data["frame_shape"])
        assert game.outfits == tuple(data["outfits"])
        assert game.characters == tuple(data["char_list"])
        assert game.forbidden == tuple(data["char_forbidden_list"])
        assert {frozenset(pair) for pair in game.homonyms} == {
            frozenset(pair) for pair in data["char_homonymy_map"].items()
        }


# docs/formats/diambra.md's table: game id → (name, Easy / Medium / Hard levels, formula bounds)
DOCUMENTED = {
    "doapp": ("Dead Or Alive ++", (2, 3, 4), (-1872, 3328)),
    "sfiii3n": ("Street Fighter III", (4, 6, 8), (-1771, 3220)),
    "tektagt": ("Tekken Tag Tournament", (5, 7, 9), (-3276, 5824)),
    "umk3": ("Ultimate Mortal Kombat 3", (3, 4, 5), (-1992, 3652)),
    "samsh5sp": ("Samurai Showdown 5 Special", (4, 6, 8), (-1000, 1750)),
    "kof98umh": ("The King Of Fighters '98 UMH", (4, 6, 8), (-1800, 2520)),
    "mvsc": ("Marvel VS Capcom", (4, 6, 8), (-288, 2304)),
    "xmvsf": ("X-Men VS Street Fighter", (4, 6, 8), (-288, 2304)),
    "soulclbr": ("Soul Calibur", (3, 4, 5), (-2160, 3840)),
}


def test_every_game_has_the_documented_levels_and_formula_bounds():
    assert set(GAMES) == set(DOCUMENTED)
    for game_id, (name, levels, bounds) in DOCUMENTED.items():
        game = GAMES[game_id]
        assert game.name == name
        assert (game.levels["easy"], game.levels["medium"], game.levels["hard"]) == levels
        assert game.formula_bounds() == (float(bounds[0]), float(bounds[1]))
        assert game.level_range[0] <= levels[0] and levels[2] <= game.level_range[1]


def test_bosses_are_listed_but_never_selectable():
    for game in GAMES.values():
        assert set(game.selectable()) == set(game.characters) - set(game.forbidden)
        assert set(game.forbidden) <= set(game.characters)
    assert "Inferno" not in GAMES["soulclbr"].selectable()
