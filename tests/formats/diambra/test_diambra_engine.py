"""Where the DIAMBRA engine is found (docs/formats/diambra.md): DIAMBRA_ENVS, one address per rank; and the
private random generators each env swaps in, so a seed replays an episode whatever else draws numbers."""

from __future__ import annotations

import random

import numpy as np
import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.server.formats.diambra.engine import engine_address_from_environ


def test_engine_address_comes_from_diambra_envs_as_diambra_run_sets_it():
    assert engine_address_from_environ({}) is None
    assert engine_address_from_environ({"DIAMBRA_ENVS": "  "}) is None
    environ = {"DIAMBRA_ENVS": "127.0.0.1:50051 127.0.0.1:50052"}
    assert engine_address_from_environ(environ) == "127.0.0.1:50051"
    assert engine_address_from_environ(environ, rank=1) == "127.0.0.1:50052"
    with pytest.raises(ConfigError, match="lists 2 engine address"):
        engine_address_from_environ(environ, rank=2)


@pytest.fixture
def process_generators():
    """These tests seed the process's generators: put them back afterwards."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    yield
    random.setstate(python_state)
    np.random.set_state(numpy_state)


def test_each_private_random_keeps_its_own_streams_and_the_process_keeps_its_own(process_generators):
    from arbiter.server.formats.diambra.engine import PrivateRandom

    first, second = PrivateRandom(), PrivateRandom()
    random.seed(1)
    np.random.seed(1)
    with first.active():
        random.seed(10)
        np.random.seed(10)
        first_draws = [random.random(), np.random.random()]
    with second.active():
        random.seed(10)
        np.random.seed(10)
        random.random()
        np.random.random()
    with first.active():  # first goes on where it stopped, whatever second drew meanwhile
        first_draws += [random.random(), np.random.random()]
    own, own_numpy = random.Random(10), np.random.RandomState(10)
    assert first_draws == [own.random(), own_numpy.random(), own.random(), own_numpy.random()]
    # the process's generators are where seed 1 left them
    assert (random.random(), np.random.random()) == (random.Random(1).random(), np.random.RandomState(1).random())


def test_a_python_only_swap_leaves_numpys_generator_to_the_process(process_generators):
    from arbiter.server.formats.diambra.engine import PrivateRandom

    private = PrivateRandom()
    np.random.seed(5)
    with private.active(numpy=False):
        inside = np.random.random()
    assert inside == np.random.RandomState(5).random()


def test_a_private_random_starts_where_the_process_stands_and_leaves_it_there(process_generators):
    from arbiter.server.formats.diambra.engine import PrivateRandom

    private = PrivateRandom()
    random.seed(3)
    with private.active(numpy=False):
        first = random.random()
    with private.active(numpy=False):
        second = random.random()
    own = random.Random(3)
    assert [first, second] == [own.random(), own.random()]
    assert random.random() == random.Random(3).random()  # the process drew nothing meanwhile


def test_every_draw_of_the_random_module_is_the_envs_while_it_is_active_and_the_processs_after(process_generators):
    from arbiter.server.formats.diambra.engine import PrivateRandom

    # the module's functions are bound methods of the process's generator
    generator = random.random.__self__
    names = [name for name, value in vars(random).items() if getattr(value, "__self__", None) is generator]
    process = {name: getattr(random, name) for name in names}
    assert {"seed", "random", "choices", "randint", "shuffle", "getstate", "setstate"} <= set(names)
    private = PrivateRandom()
    with private.active(numpy=False):
        owners = {getattr(random, name).__self__ for name in names}
    assert len(owners) == 1 and owners != {generator}
    assert {name: getattr(random, name) for name in names} == process
    with pytest.raises(RuntimeError), private.active(numpy=False):  # an error inside puts them back too
        raise RuntimeError
    assert {name: getattr(random, name) for name in names} == process


def test_an_env_active_inside_another_gives_the_outer_one_its_draws_back(process_generators):
    from arbiter.server.formats.diambra.engine import PrivateRandom

    outer, inner = PrivateRandom(), PrivateRandom()
    with outer.active(numpy=False):
        random.seed(7)
        with inner.active(numpy=False):
            random.seed(8)
            random.random()
        after_inner = random.random()
    assert after_inner == random.Random(7).random()
