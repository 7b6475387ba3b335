"""The DIAMBRA Arena format (SCORING.md §3): a fighting-game agent plays N episodes of a game at
the difficulty its submitter chose, scored by the difficulty-weighted rule.

- ``games``: what arbiter knows of each game (difficulty levels, reward-bound parameters, characters);
- ``settings``: the competition keys (``DiambraSettings``), checked at load;
- ``scoring``: bounds, k(R), episode records and the rule, pure functions over records;
- ``engine`` and ``env``: diambra-arena's real env on a DIAMBRA engine or on its engine mock;
- ``local``: an evaluation played in process (an agent script's env, its records and score).

``games``, ``settings`` and ``scoring`` import nothing from diambra-arena, so results rescore
and settings validate without the ``diambra`` extra; ``engine``, ``env`` and ``local`` need it.
"""
