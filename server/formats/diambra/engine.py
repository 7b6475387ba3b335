"""Where a DIAMBRA env's engine comes from: a real DIAMBRA engine at an address, or the mock.

The real engine (the DIAMBRA container with the game ROMs) is reached over gRPC at an address.
DIAMBRA's own tools (``diambra run``) pass the addresses of the engines they start in the
``DIAMBRA_ENVS`` environment variable; arbiter reads it only at its command-line edge
(``engine_address_from_environ``) and passes the address inward explicitly.

Without an address the env runs on ``DiambraEngineMock``, which diambra-arena ships: the real
gymnasium env, its settings checks, spaces and reward bounds, with a simulated fight behind the
engine interface. The mock is given to one env only (never patched into the ``DiambraEngine``
class), so a mocked env and real ones can live in one process.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from arbiter.protocol.errors import ConfigError

ENGINE_MOCK = "mock"
MOCK_NOTE = (
    "diambra-arena's DiambraEngineMock stands in for the game: the real env code runs, the fights are "
    "simulated, so scores are not comparable with a real engine's"
)
ENGINE_REAL = "engine"

log = logging.getLogger(__name__)


def engine_address_from_environ(environ: Mapping[str, str], rank: int = 0) -> str | None:
    """The engine address DIAMBRA's tools give the env of ``rank`` (``DIAMBRA_ENVS`` holds one
    address per env, space-separated), or None when the variable is unset or empty."""
    addresses = environ.get("DIAMBRA_ENVS", "").split()
    if not addresses:
        return None
    if rank >= len(addresses):
        raise ConfigError(f"DIAMBRA_ENVS lists {len(addresses)} engine address(es); none for env rank {rank}")
    return addresses[rank]


class MockEngine:
    """The engine interface the gymnasium env calls, answered by diambra-arena's
    ``DiambraEngineMock`` (its ``mock_*`` methods)."""

    def __init__(self, level: int, **mock_options: Any):
        from diambra.arena.utils import engine_mock

        _quiet(engine_mock)
        self.mock = engine_mock.DiambraEngineMock(**mock_options)
        self.level = level

    def env_init(self, request: Any) -> Any:
        # The env sends its init request with empty episode settings, and the mock then draws its
        # win and perfect-round odds from a random difficulty. With the evaluation's level in the
        # request, the mock's odds follow the chosen difficulty instead.
        request.episode_settings.difficulty = self.level
        return self.mock.mock_env_init(request)

    def reset(self, episode_settings: Any) -> Any:
        return self.mock.mock_reset(episode_settings)

    def step(self, actions: Any) -> Any:
        return self.mock.mock_step(actions)

    def close(self) -> Any:
        return self.mock.mock_close()


def _quiet(module: Any) -> None:
    # The mock narrates every round with print(); on a server stdout is the log, so its lines go
    # to logging at DEBUG level instead (a module global shadows the builtin for that module only).
    if getattr(module, "print", None) is not _mock_print:
        module.print = _mock_print


def _mock_print(*parts: Any, **_: Any) -> None:
    if log.isEnabledFor(logging.DEBUG):
        log.debug("engine mock: %s", " ".join(str(p) for p in parts))


_construct_lock = threading.Lock()


def build_single_player_env(env_settings: Any, engine_factory: Callable[..., Any] | None) -> Any:
    """diambra-arena's ``DiambraGym1P`` on ``env_settings``; with ``engine_factory`` its engine is
    the factory's, else the real engine at ``env_settings.env_address``. The env builds its engine
    inside its constructor, so the factory stands in for the engine class during construction only."""
    from diambra.arena import arena_gym

    if engine_factory is None:
        return arena_gym.DiambraGym1P(env_settings)
    with _construct_lock:
        original = arena_gym.DiambraEngine
        arena_gym.DiambraEngine = engine_factory
        try:
            return arena_gym.DiambraGym1P(env_settings)
        finally:
            arena_gym.DiambraEngine = original


_rng_lock = threading.RLock()
# Python's module-level draws (random.random, random.choices, random.seed, ...) are bound methods
# of one hidden generator; these are their names. A private generator stands in for it by putting
# its own methods under those names: two dozen dictionary writes, where copying the generator's
# state in and out (getstate, setstate) rebuilds a tuple of 625 ints each way.
_PROCESS_GENERATOR = random.random.__self__
_MODULE_DRAWS = tuple(
    name for name, value in vars(random).items() if getattr(value, "__self__", None) is _PROCESS_GENERATOR
)


class PrivateRandom:
    """Python's and numpy's global generators, as one env sees them.

    diambra-arena reseeds both global generators at every reset and draws the role and characters
    from them; the mock also draws every hit from them. Each env keeps its own generators and
    swaps them in around its calls, so nothing else in the process (another env, the server, an
    agent playing in process) shifts an env's draws, and a seed replays an episode exactly; and
    the env's reseeding never leaks into the rest of the process.

    Python's generator is swapped by name: while an env is active, the ``random`` module's
    functions are its own generator's methods (diambra-arena and its mock call them through the
    module, ``random.choices(...)``). numpy's global generator has no such names and is swapped
    by state, which is dearer: only where numpy's draws matter (``numpy=True``)."""

    def __init__(self) -> None:
        self._python: dict[str, Any] | None = None  # the private generator's methods, by module name
        self._numpy: Any = None

    def _python_draws(self) -> dict[str, Any]:
        if self._python is None:
            # First used: it starts where the process's generator stands, as a copy of its state.
            generator = random.Random()
            generator.setstate(random.getstate())
            self._python = {name: getattr(generator, name) for name in _MODULE_DRAWS}
        return self._python

    @contextmanager
    def active(self, *, numpy: bool = True) -> Iterator[None]:
        """``numpy=False`` swaps Python's generator only: a step draws from it alone (numpy's is
        only reseeded, at reset), and swapping numpy's state costs more than the rest of the swap."""
        with _rng_lock:
            module = vars(random)
            outer_python = {name: module[name] for name in _MODULE_DRAWS}  # the process's, or an outer env's
            outer_numpy = np.random.get_state() if numpy else None
            module.update(self._python_draws())
            if numpy and self._numpy is not None:
                np.random.set_state(self._numpy)
            try:
                yield
            finally:
                module.update(outer_python)
                if numpy:
                    self._numpy = np.random.get_state()
                    np.random.set_state(outer_numpy)
