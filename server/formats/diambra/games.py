"""What arbiter knows about each DIAMBRA Arena game, without importing diambra-arena.

The facts are diambra-arena 2.2.7's game data (``diambra/arena/utils/integratedGames.json``) and
its settings checks (``env_settings.py``); a test compares this table with the installed
package's data, so a new diambra-arena release that changes a game fails loudly instead of
scoring against stale bounds. Scoring and settings validation need only this table, so a result
recomputes offline on a machine without the extra.
"""

from __future__ import annotations

from dataclasses import dataclass

DIFFICULTIES = ("easy", "medium", "hard")


@dataclass(frozen=True)
class Game:
    game_id: str
    name: str
    levels: dict[str, int]  # difficulty name → the game's own difficulty level (docs/formats/diambra.md)
    level_range: tuple[int, int]  # every level the game accepts
    rounds_per_stage: int  # N_r
    stages_per_game: int  # N_s
    chars_per_round: int  # N_c
    health: tuple[int, int]  # a character's health, lowest and highest: ΔH = highest − lowest
    frame_shape: tuple[int, int, int]  # native frame, height × width × channels
    outfits: tuple[int, int]
    chars_to_select: int  # characters a player picks (a team for kof98umh, a tag pair for tektagt)
    characters: tuple[str, ...]
    forbidden: tuple[str, ...] = ()  # in the game's list but never selectable (bosses)
    homonyms: tuple[tuple[str, str], ...] = ()  # two names for one fighter: not both in one team
    # keys that apply to this game only, with their admissible values
    specific: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def delta_health(self) -> int:
        return self.health[1] - self.health[0]

    def formula_bounds(self) -> tuple[float, float]:
        """DIAMBRA's documented bounds of an episode's cumulative reward (one game, no continue):
        R_min = −N_c((N_s−1)(N_r−1)+N_r)ΔH — every stage won by a hair after losing all rounds but
        one at full health, then the last stage lost; R_max = N_c N_s N_r ΔH — every round perfect."""
        n_r, n_s, n_c, dh = self.rounds_per_stage, self.stages_per_game, self.chars_per_round, self.delta_health
        return float(-n_c * ((n_s - 1) * (n_r - 1) + n_r) * dh), float(n_c * n_s * n_r * dh)

    def selectable(self) -> tuple[str, ...]:
        return tuple(c for c in self.characters if c not in self.forbidden)


# One game per entry, laid out by hand: the formatter would spread it over hundreds of lines.
# fmt: off
_GAME_LIST = (
    Game(
        "doapp", "Dead Or Alive ++",
        levels={"easy": 2, "medium": 3, "hard": 4}, level_range=(1, 4),
        rounds_per_stage=2, stages_per_game=8, chars_per_round=1,
        health=(0, 208), frame_shape=(480, 512, 3), outfits=(1, 4), chars_to_select=1,
        characters=(
            "Kasumi", "Zack", "Hayabusa", "Bayman", "Lei-Fang", "Raidou", "Gen-Fu", "Tina", "Bass", "Jann-Lee", "Ayane",
        ),
    ),
    Game(
        "sfiii3n", "Street Fighter III",
        levels={"easy": 4, "medium": 6, "hard": 8}, level_range=(1, 8),
        rounds_per_stage=2, stages_per_game=10, chars_per_round=1,
        health=(-1, 160), frame_shape=(224, 384, 3), outfits=(1, 7), chars_to_select=1,
        characters=(
            "Alex", "Twelve", "Hugo", "Sean", "Makoto", "Elena", "Ibuki", "Chun-Li", "Dudley", "Necro", "Q", "Oro",
            "Urien", "Remy", "Ryu", "Gouki", "Yun", "Yang", "Ken", "Gill",
        ),
        forbidden=("Gill",),
        specific=(("super_art", (1, 2, 3)),),
    ),
    Game(
        "tektagt", "Tekken Tag Tournament",
        levels={"easy": 5, "medium": 7, "hard": 9}, level_range=(1, 9),
        rounds_per_stage=2, stages_per_game=8, chars_per_round=2,
        health=(0, 182), frame_shape=(240, 512, 3), outfits=(1, 5), chars_to_select=2,
        characters=(
            "Xiaoyu", "Yoshimitsu", "Nina", "Law", "Hwoarang", "Eddy", "Paul", "King", "Lei", "Jin", "Baek", "Michelle",
            "Armorking", "Gunjack", "Anna", "Brian", "Heihachi", "Ganryu", "Julia", "Jun", "Kunimitsu", "Kazuya",
            "Bruce", "Kuma", "Jack-Z", "Lee", "Wang", "P.Jack", "Devil", "True Ogre", "Ogre", "Roger", "Tetsujin",
            "Panda", "Tiger", "Angel", "Alex", "Mokujin", "Unknown",
        ),
        forbidden=("Unknown",),
        homonyms=(("Tetsujin", "Mokujin"), ("Tiger", "Eddy"), ("Angel", "Devil"), ("Panda", "Kuma"), ("Alex", "Roger")),
    ),
    Game(
        "umk3", "Ultimate Mortal Kombat 3",
        levels={"easy": 3, "medium": 4, "hard": 5}, level_range=(1, 5),
        rounds_per_stage=2, stages_per_game=11, chars_per_round=1,
        health=(0, 166), frame_shape=(254, 500, 3), outfits=(1, 1), chars_to_select=1,
        characters=(
            "Kitana", "Reptile", "Kano", "Sektor", "Kabal", "Sonya", "Mileena", "Sindel", "Sheeva", "Jax", "Ermac",
            "Stryker", "Shang Tsung", "Nightwolf", "Sub-Zero-2", "Cyrax", "Liu Kang", "Jade", "Sub-Zero", "Kung Lao",
            "Smoke", "Skorpion", "Human Smoke", "Noob Saibot", "Motaro", "Shao Kahn",
        ),
        forbidden=("Noob Saibot", "Human Smoke", "Motaro", "Shao Kahn"),
        specific=(("tower", (1, 2, 3, 4)),),
    ),
    Game(
        "samsh5sp", "Samurai Showdown 5 Special",
        levels={"easy": 4, "medium": 6, "hard": 8}, level_range=(1, 8),
        rounds_per_stage=2, stages_per_game=7, chars_per_round=1,
        health=(0, 125), frame_shape=(224, 320, 3), outfits=(1, 4), chars_to_select=1,
        characters=(
            "Kyoshiro", "Jubei", "Hanzo", "Enja", "Amakusa", "Suija", "Galford", "Charlotte", "Kusare", "Sogetsu",
            "Gaira", "Ukyo", "Yoshitora", "Gaoh", "Haohmaru", "Genjuro", "Shizumaru", "Kazuki", "Tamtam", "Rasetsumaru",
            "Rimururu", "Mina", "Zankuro", "Nakoruru", "Rera", "Yunfei", "Basara", "Mizuki",
        ),
    ),
    Game(
        "kof98umh", "The King Of Fighters '98 UMH",
        levels={"easy": 4, "medium": 6, "hard": 8}, level_range=(1, 8),
        rounds_per_stage=3, stages_per_game=7, chars_per_round=1,
        health=(-1, 119), frame_shape=(240, 320, 3), outfits=(1, 4), chars_to_select=3,
        characters=(
            "Kyo", "Benimaru", "Daimon", "Terry", "Andy", "Joe", "Ryo", "Robert", "Yuri", "Leona", "Ralf", "Clark",
            "Athena", "Kensou", "Chin", "Chizuru", "Mai", "King", "Kim", "Chang", "Choi", "Yashiro", "Shermie", "Chris",
            "Yamazaki", "Blue", "Billy", "Iori", "Mature", "Vice", "Heidern", "Takuma", "Saisyu", "Heavy-D!", "Lucky",
            "Brian", "Eiji", "Kasumi", "Shingo", "Rugal", "Geese", "Krauser", "Mr.Big", "Goenitz", "Orochi",
        ),
        forbidden=("Goenitz", "Orochi"),
        specific=(("fighting_style", (1, 2, 3)), ("ultimate_style", (1, 2))),
    ),
    Game(
        "mvsc", "Marvel VS Capcom",
        levels={"easy": 4, "medium": 6, "hard": 8}, level_range=(1, 8),
        rounds_per_stage=1, stages_per_game=8, chars_per_round=2,
        health=(0, 144), frame_shape=(224, 384, 3), outfits=(1, 2), chars_to_select=2,
        characters=(
            "Chun-Li", "Ryu", "Zangief", "Morrigan", "Captain Commando", "Megaman", "Strider Hiryu", "Spider Man",
            "Jin", "Captain America", "Venom", "Hulk", "Gambit", "War Machine", "Wolverine", "Roll", "Onslaught",
            "Alt-Venom", "Alt-Hulk", "Alt-War Machine", "Shadow Lady", "Alt-Morrigan",
        ),
        forbidden=("Roll", "Onslaught", "Alt-Venom", "Alt-Hulk", "Alt-War Machine", "Shadow Lady", "Alt-Morrigan"),
        specific=(("fighting_style", (1, 2)), ("speed_mode", (1, 2))),
    ),
    Game(
        "xmvsf", "X-Men VS Street Fighter",
        levels={"easy": 4, "medium": 6, "hard": 8}, level_range=(1, 8),
        rounds_per_stage=1, stages_per_game=8, chars_per_round=2,
        health=(0, 144), frame_shape=(224, 384, 3), outfits=(1, 2), chars_to_select=2,
        characters=(
            "Akuma", "Magneto", "Juggernaut", "Dhalsim", "Mr. Bison", "Sabretooth", "Storm", "Chun-Li", "Zangief",
            "Gambit", "Rogue", "Cammy", "Charlie", "Wolverine", "Cyclops", "Ryu", "Ken", "Apocalypse", "Alpha Chun-Li",
        ),
        forbidden=("Apocalypse", "Alpha Chun-Li"),
        specific=(("speed_mode", (1, 2)),),
    ),
    Game(
        "soulclbr", "Soul Calibur",
        levels={"easy": 3, "medium": 4, "hard": 5}, level_range=(1, 5),
        rounds_per_stage=2, stages_per_game=8, chars_per_round=1,
        health=(0, 240), frame_shape=(240, 512, 3), outfits=(1, 2), chars_to_select=1,
        characters=(
            "Xianghua", "Yoshimitsu", "Lizard Man", "Siegfried", "Rock", "Seung Mina", "Edge Master", "Voldo", "Ivy",
            "Sophitia", "Arthur", "Kilik", "Hwang", "Maxi", "Nightmare", "Taki", "Astaroth", "Inferno",
        ),
        forbidden=("Inferno",),
    ),
)
# fmt: on

GAMES: dict[str, Game] = {game.game_id: game for game in _GAME_LIST}

# The six games docs/formats/diambra.md names, with their difficulty table and documented bounds.
SCORED_GAMES = ("doapp", "sfiii3n", "tektagt", "umk3", "samsh5sp", "kof98umh")
