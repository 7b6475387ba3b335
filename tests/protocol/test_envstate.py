"""Tests for arbiter.protocol.legacy.envstate and flatland_env: env state over the wire, and the 2020 reward rule."""

from __future__ import annotations

import enum
import functools
import sys
from collections import namedtuple
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from flatland.envs.persistence import RailEnvPersister
from flatland.envs.step_utils.states import TrainState

from arbiter.protocol import codec
from arbiter.protocol.errors import DecodeError
from arbiter.protocol.legacy import flatland_env
from arbiter.protocol.legacy.envstate import TAG, Rebuilder, to_plain

# --- classes the round trips use (module level, so the Rebuilder can import them by name) --------


class Speed(enum.IntEnum):
    SLOW = 1
    FAST = 2


class Mode(enum.Enum):
    ON = "on"
    OFF = ("off", 0)


Point = namedtuple("Point", "x y")


class Cell(NamedTuple):
    row: int
    col: int
    tag: Any = None


@dataclass
class Plain:
    a: Any
    b: Any = None


@dataclass(slots=True)
class Slotted:
    x: Any
    y: Any


@dataclass(frozen=True)
class Frozen:
    name: str
    where: Any


@dataclass(frozen=True, slots=True)
class FrozenSlotted:  # has its own __getstate__/__setstate__ (like flatland's Cython classes)
    p: Any
    q: Any


class SlotBase:
    __slots__ = ("a",)


class SlotChild(SlotBase):
    __slots__ = ("b", "unset")

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is SlotChild
            and (self.a, self.b) == (other.a, other.b)
            and hasattr(self, "unset") == hasattr(other, "unset")
        )


class WithDictAndSlots(SlotBase):
    """A __slots__ base under a class with a __dict__."""

    def __eq__(self, other: object) -> bool:
        return type(other) is WithDictAndSlots and self.a == other.a and vars(self) == vars(other)


class CustomState:
    """Own __getstate__/__setstate__ with a non-dict state."""

    def __init__(self, values: tuple) -> None:
        self.values = values

    def __getstate__(self) -> list:
        return [list(self.values), len(self.values)]

    def __setstate__(self, state: list) -> None:
        values, n = state
        assert len(values) == n
        self.values = tuple(values)

    def __eq__(self, other: object) -> bool:
        return type(other) is CustomState and self.values == other.values


class Outer:
    class Inner:
        def __init__(self, v: Any) -> None:
            self.v = v

        def __eq__(self, other: object) -> bool:
            return type(other) is Outer.Inner and self.v == other.v


def _with_dict_and_slots() -> WithDictAndSlots:
    obj = WithDictAndSlots()
    obj.a = (1, 2)
    obj.extra = {"k": Speed.FAST}
    return obj


def _slot_child() -> SlotChild:
    obj = SlotChild()
    obj.a, obj.b = frozenset({1, 2}), [Point(1, 2)]
    return obj


def _same(a: Any, b: Any) -> None:
    """Equal, with the same types all the way down (so a tuple that came back as a list fails)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
            assert type(next(x for x in b if x == k)) is type(k)
    else:
        assert a == b


def _rebuilt_while_decoding(packages: list[str], data: Any) -> Any:
    """``data`` as an env state travels in a reply, rebuilt while the reply is decoded (as
    arbiter's client reads its ENV_CREATE replies) rather than walked once decoded."""
    reply = codec.encode({"type": "X", "payload": {"info": {"k": 1}, "arbiter": {"env_state": data}}})
    decoded = codec.decode(reply, codec.REPLY_LIMITS, Rebuilder(packages).map_from_wire)
    assert decoded["payload"]["info"] == {"k": 1}  # the reply's own maps come through as they are
    return decoded["payload"]["arbiter"]["env_state"]


REBUILDS = {
    "walk": lambda packages, data: Rebuilder(packages).rebuild(data),
    "while-decoding": _rebuilt_while_decoding,
}


@pytest.fixture(params=list(REBUILDS))
def rebuild(request: pytest.FixtureRequest) -> Any:
    """Each way of rebuilding decoded env state: both must rebuild and refuse alike."""
    return functools.partial(REBUILDS[request.param], [__name__])


VALUES = {
    "tuple": (1, "a", None, 2.5),
    "empty-tuple": (),
    "nested-tuple": ((1, (2, (3, ()))), [(4,), [5, (6, 7)]]),
    "set": {1, 2, (3, 4)},
    "frozenset": frozenset({"a", frozenset({1}), (1, (2,))}),
    "empty-set": set(),
    "tuple-keys": {(0, 1): "a", ((1, 2), 3): [(4, 5)], 7: {(8,): (9,)}, "s": None},
    "int-enum": Speed.FAST,
    "enum-in-containers": {Speed.SLOW: [Speed.FAST, (Speed.SLOW,)], "m": {Mode.ON, Mode.OFF}},
    "enum-tuple-value": Mode.OFF,
    "namedtuple": Point(1, (2, 3)),
    "typing-namedtuple": Cell(3, 4, tag=Point(0, 0)),
    "namedtuple-keys": {Point(1, 2): Cell(1, 2)},
    "plain-object": Plain(a=(1, 2), b={"x": {3, 4}}),
    "nested-objects": Plain(a=Plain(a=Speed.SLOW), b=[Frozen("f", Point(1, 1))]),
    "dataclass-slots": Slotted(x=(1,), y={(1, 2): 3}),
    "frozen-dataclass": Frozen("train", ((1, 2), 3)),
    "frozen-slots-getstate": FrozenSlotted(p=Fraction(1, 3), q=(Speed.FAST,)),
    "inherited-slots-one-unset": _slot_child(),
    "dict-and-slots": _with_dict_and_slots(),
    "custom-getstate": CustomState((1, (2, 3))),
    "nested-class": Outer.Inner(v={(1,): Outer.Inner(None)}),
    "numpy-and-fraction": {"grid": np.arange(6, dtype=np.uint16).reshape(2, 3), "speed": Fraction(1, 4)},
    "scalars": [None, True, False, 0, -1, 2**62, 1.5, "s", b"b"],
}


@pytest.mark.parametrize("value", list(VALUES.values()), ids=list(VALUES))
def test_roundtrip_in_memory(value, rebuild):
    _same(value, rebuild(to_plain(value)))


@pytest.mark.parametrize("value", list(VALUES.values()), ids=list(VALUES))
def test_roundtrip_through_codec(value):
    wire = codec.decode(codec.encode(to_plain(value)), codec.REPLY_LIMITS)
    _same(value, Rebuilder([__name__]).rebuild(wire))


def test_plain_form_is_tagged_data_only():
    plain = to_plain({(1, 2): Speed.FAST, "p": Point(1, 2), "s": {3}})
    assert plain[TAG] == "dict"
    pairs = {str(k): v for k, v in plain["v"]}
    assert pairs[str({TAG: "tuple", "v": [1, 2]})] == {TAG: "enum", "cls": f"{__name__}:Speed", "v": 2}
    assert pairs["p"] == {TAG: "nt", "cls": f"{__name__}:Point", "v": [1, 2]}
    assert pairs["s"] == {TAG: "set", "v": [3]}


def test_rebuild_of_enum_gives_the_member_itself(rebuild):
    assert rebuild(to_plain([Speed.SLOW, Mode.OFF])) == [Speed.SLOW, Mode.OFF]
    assert rebuild(to_plain(Mode.OFF)) is Mode.OFF


def test_rebuilt_objects_are_fresh_copies(rebuild):
    original = Plain(a=[1, 2])
    rebuilt = rebuild(to_plain(original))
    rebuilt.a.append(3)
    assert original.a == [1, 2]


def test_to_plain_refuses_objects_without_state():
    with pytest.raises(TypeError):
        to_plain(object())
    with pytest.raises(TypeError):
        to_plain({"k": [iter(())]})


# --- security: only allowlisted classes, no surprises -------------------------------------------


def _obj(cls: object, v: Any = None) -> dict:
    return {TAG: "obj", "cls": cls, "v": v if v is not None else {TAG: "dict", "v": []}}


FORBIDDEN_CLASSES = [
    "os:system",
    "subprocess:Popen",
    "builtins:eval",
    "builtins:object",
    "pickle:Unpickler",
    "posix:system",
    "flatland.envs.rail_env:RailEnv",
    f"x{__name__}:Plain",
    "builtins:type",
]


@pytest.mark.parametrize("cls", FORBIDDEN_CLASSES)
@pytest.mark.parametrize("tag", ["obj", "enum", "nt"])
def test_classes_outside_allowed_prefixes_refused(cls, tag, rebuild):
    data = {TAG: tag, "cls": cls, "v": ["echo", "hi"] if tag != "obj" else {TAG: "dict", "v": []}}
    with pytest.raises(DecodeError):
        rebuild(data)
    with pytest.raises(DecodeError):
        rebuild({TAG: "dict", "v": [["grid", [data]]]})


def _env_state_sent(data: Any) -> dict:
    """``data`` as the env state of an ENV_CREATE reply, read as arbiter's client reads it."""
    reply = codec.encode({"type": "X", "payload": {"arbiter": {"env_state": data}}})
    decoded = codec.decode(reply, codec.REPLY_LIMITS, flatland_env.env_state_maps)
    return flatland_env.env_state_from_wire(decoded["payload"]["arbiter"]["env_state"], rebuilt=True)


@pytest.fixture(params=["walk", "while-decoding"])
def env_state_from(request: pytest.FixtureRequest) -> Any:
    """Each way a Flatland env state is read: decoded data walked, or rebuilt while decoding."""
    return flatland_env.env_state_from_wire if request.param == "walk" else _env_state_sent


@pytest.mark.parametrize(
    "cls",
    [
        "os:system",
        "subprocess:Popen",
        "builtins:eval",
        "pickle:Unpickler",
        f"{__name__}:Plain",
        "flatlandx.envs:X",
        "flatland:X",
    ],
)
def test_env_state_refuses_non_flatland_classes(cls, env_state_from):
    with pytest.raises(DecodeError):
        env_state_from({TAG: "dict", "v": [["grid", _obj(cls)]]})


def test_forbidden_module_is_not_even_imported(rebuild):
    assert "this" not in sys.modules  # importing `this` prints the Zen of Python: it has side effects
    with pytest.raises(DecodeError):
        rebuild(_obj("this:Anything"))
    assert "this" not in sys.modules


@pytest.mark.parametrize(
    "cls",
    ["os.system", "Plain", f"{__name__}.Plain", "", 5, None, ["a", "b"], f"{__name__}:Plain".encode(), {"m": "c"}],
    ids=repr,
)
def test_malformed_class_refs_refused(cls, rebuild):
    for tag in ("obj", "enum", "nt"):
        with pytest.raises(DecodeError):
            rebuild({TAG: tag, "cls": cls, "v": []})


@pytest.mark.parametrize(
    "cls",
    [
        f"{__name__}:NoSuchClass",
        f"{__name__}:Outer.Nope",
        f"{__name__}_nomodule:Plain",
        f"{__name__}:",
        f"{__name__}:_same",
        f"{__name__}:VALUES",
        f"{__name__}:Speed.FAST",
    ],
)
def test_unknown_or_non_class_refs_refused(cls, rebuild):
    with pytest.raises(DecodeError):
        rebuild(_obj(cls))


def test_missing_class_ref_refused(rebuild):
    with pytest.raises(DecodeError):
        rebuild({TAG: "obj", "v": {TAG: "dict", "v": []}})


@pytest.mark.parametrize("tag", ["pickle", "reduce", "global", "", 5, "DICT", "list"], ids=repr)
def test_unknown_tags_refused(tag, rebuild):
    with pytest.raises(DecodeError):
        rebuild({TAG: tag, "v": []})


def test_untagged_maps_refused():
    with pytest.raises(DecodeError):
        Rebuilder([__name__]).rebuild({"a": 1})
    with pytest.raises(DecodeError):
        Rebuilder([__name__]).rebuild([1, {"grid": []}])
    with pytest.raises(DecodeError):
        Rebuilder([__name__]).rebuild({TAG: None, "v": []})


def test_while_decoding_untagged_maps_are_the_messages_own():
    """Rebuilt while a reply is decoded, a map without a tag is one of the reply's own (its
    payload, an info dict): it comes through as the codec makes it, arrays and fractions too."""
    maps = Rebuilder([__name__]).map_from_wire
    message = {"a": [1, {"b": (2,)}], "grid": np.arange(3), "speed": Fraction(1, 3), TAG: None}
    decoded = codec.decode(codec.encode(message), codec.REPLY_LIMITS, maps)
    _same(decoded, {"a": [1, {"b": [2]}], "grid": np.arange(3), "speed": Fraction(1, 3), TAG: None})


@pytest.mark.parametrize(
    "data",
    [
        {TAG: "set", "v": [[1, 2]]},
        {TAG: "frozenset", "v": [1, {TAG: "dict", "v": []}]},
        {TAG: "set", "v": [{TAG: "set", "v": []}]},
        {TAG: "dict", "v": [[[1], 2]]},
        {TAG: "dict", "v": [[{TAG: "dict", "v": []}, 2]]},
        {TAG: "dict", "v": [[{TAG: "tuple", "v": [[1]]}, 2]]},
        {TAG: "dict", "v": [[np.arange(3), 2]]},
    ],
    ids=["list-in-set", "dict-in-frozenset", "set-in-set", "list-key", "dict-key", "tuple-with-list-key", "array-key"],
)
def test_unhashable_members_and_keys_refused(data, rebuild):
    with pytest.raises(DecodeError):
        rebuild(data)


def test_object_state_must_be_a_map_of_str(rebuild):
    with pytest.raises(DecodeError):
        rebuild(_obj(f"{__name__}:Plain", [1, 2]))
    with pytest.raises(DecodeError):
        rebuild(_obj(f"{__name__}:Plain", {TAG: "dict", "v": [[1, 2]]}))
    with pytest.raises(DecodeError):
        rebuild(_obj(f"{__name__}:Plain", {TAG: "dict", "v": [[b"a", 2]]}))


@pytest.mark.parametrize(
    "data",
    [
        5,
        "x",
        None,
        [],
        [{TAG: "dict", "v": [["grid", []]]}],
        b"grid",
        {TAG: "dict", "v": []},
        {TAG: "dict", "v": [["agents", []]]},
        {TAG: "tuple", "v": ["grid"]},
        {TAG: "set", "v": ["grid"]},
        {"grid": []},
    ],
    ids=repr,
)
def test_env_state_from_wire_refuses_non_env_dicts(data):
    with pytest.raises(DecodeError):
        flatland_env.env_state_from_wire(data)


# --- known bugs -------------------------------------------------------------------------------


def _popen_payload(marker: Path) -> dict:
    touch = [sys.executable, "-c", "import pathlib, sys; pathlib.Path(sys.argv[1]).touch()", str(marker)]
    # flatland.evaluators.aicrowd_helpers does `import subprocess`: its module attribute reaches Popen
    popen = {TAG: "enum", "cls": "flatland.evaluators.aicrowd_helpers:subprocess.Popen", "v": touch}
    return {TAG: "dict", "v": [["grid", popen]]}


def test_env_state_cannot_reach_classes_through_module_attributes(tmp_path, env_state_from):
    marker = tmp_path / "code-ran"
    try:
        result = env_state_from(_popen_payload(marker))
    except DecodeError:
        result = None
    if isinstance(result, dict) and hasattr(result.get("grid"), "wait"):
        result["grid"].wait(timeout=30)  # reap the child the bug started
    assert not marker.exists(), "a subprocess named in the env state ran"
    assert result is None


@pytest.mark.parametrize("cls", [f"{__name__}:pytest.MonkeyPatch", f"{__name__}:Fraction", f"{__name__}:Path"])
def test_rebuilder_checks_the_class_module_not_the_path(cls, rebuild):
    with pytest.raises(DecodeError):
        rebuild(_obj(cls))


class _Recorder:
    """Any allowed class with a side-effecting constructor."""

    calls: list = []

    def __init__(self, *args: Any) -> None:
        _Recorder.calls.append(args)


@pytest.mark.parametrize("tag", ["enum", "nt"])
def test_enum_and_nt_tags_do_not_call_arbitrary_constructors(tag, rebuild):
    _Recorder.calls.clear()
    try:
        rebuild({TAG: tag, "cls": f"{__name__}:_Recorder", "v": [1, 2]})
    except DecodeError:
        pass
    assert _Recorder.calls == []


@pytest.mark.parametrize(
    "data",
    [
        {TAG: "dict"},
        {TAG: "dict", "v": 5},
        {TAG: "dict", "v": [[1]]},
        {TAG: "tuple", "v": 5},
        {TAG: "set", "v": None},
        {TAG: "enum", "cls": f"{__name__}:Speed", "v": 99},
        {TAG: "nt", "cls": f"{__name__}:Point", "v": [1, 2, 3]},
        {TAG: "obj", "cls": f"{__name__}:Slotted", "v": {TAG: "dict", "v": [["nope", 1]]}},
        {TAG: "obj", "cls": f"{__name__}:Plain", "v": {TAG: "dict", "v": [["__class__", 1]]}},
        {TAG: "obj", "cls": f"{__name__}:CustomState", "v": 7},
    ],
    ids=[
        "dict-no-v",
        "dict-int-v",
        "dict-short-pair",
        "tuple-int-v",
        "set-none-v",
        "enum-bad-value",
        "nt-wrong-arity",
        "slots-unknown-attr",
        "class-attr",
        "setstate-bad-state",
    ],
)
def test_malformed_tagged_maps_raise_decode_error(data, rebuild):
    wrapped = {TAG: "dict", "v": [["grid", data]]}
    with pytest.raises(DecodeError):
        rebuild(wrapped)


# --- Flatland env state over the wire ----------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_envs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from arbiter.server.formats.flatland.generate import generate_test_set

    root = tmp_path_factory.mktemp("envstate") / "t"
    paths = generate_test_set(root, preset="tiny", seed=1)
    assert len(paths) == 3
    return [root / p for p in paths]


def _env_from_wire(path: Path, while_decoding: bool = False, **kwargs: Any) -> Any:
    env_dict = RailEnvPersister.load_env_dict(str(path))
    if while_decoding:
        decoded = _env_state_sent(flatland_env.env_state_to_wire(env_dict))
    else:
        wire = codec.encode(flatland_env.env_state_to_wire(env_dict))
        decoded = flatland_env.env_state_from_wire(codec.decode(wire, codec.REPLY_LIMITS))
    return flatland_env.build_rail_env(decoded, **kwargs)


def _agent_view(env: Any) -> list[tuple]:
    return [(a.current_configuration, a.state, a.malfunction_handler.malfunction_down_counter) for a in env.agents]


def _compare_with_file(path: Path, seed: int, while_decoding: bool = False) -> int:
    """Step an env built from the wire and one loaded from the file alike; return the malfunctions seen."""
    env = _env_from_wire(path, while_decoding)
    reference, _ = RailEnvPersister.load_new(str(path))
    assert env.get_num_agents() == reference.get_num_agents() > 0
    env.reset(regenerate_rail=True, regenerate_schedule=True, random_seed=1001)
    reference.reset(regenerate_rail=True, regenerate_schedule=True, random_seed=1001)
    assert np.array_equal(env.rail.grid, reference.rail.grid)
    assert _agent_view(env) == _agent_view(reference)

    rng = np.random.default_rng(seed)
    steps = malfunction_steps = 0
    while True:
        actions = {h: int(rng.integers(0, 5)) for h in reference.get_agent_handles()}
        _, rewards, dones, _ = env.step(actions)
        _, ref_rewards, ref_dones, _ = reference.step(actions)
        steps += 1
        assert _agent_view(env) == _agent_view(reference), f"diverged at step {steps}"
        assert dones == ref_dones, f"dones diverged at step {steps}"
        assert rewards == ref_rewards, f"rewards diverged at step {steps}"
        malfunction_steps += any(a.malfunction_handler.malfunction_down_counter > 0 for a in env.agents)
        if ref_dones["__all__"]:
            break
        assert steps <= reference._max_episode_steps
    assert steps > 1
    return malfunction_steps


@pytest.mark.parametrize("while_decoding", [False, True], ids=["walk", "while-decoding"])
@pytest.mark.parametrize("index", [0, 1, 2])
def test_env_from_wire_steps_like_env_from_file(tiny_envs, index, while_decoding):
    _compare_with_file(tiny_envs[index], seed=index, while_decoding=while_decoding)


def test_env_comparison_covers_malfunctions(tiny_envs):
    """Without malfunctions in the tiny preset the comparison above would prove much less."""
    assert sum(_compare_with_file(path, seed=index) for index, path in enumerate(tiny_envs)) > 0


def test_one_message_decodes_to_independent_env_dicts(tiny_envs):
    """build_rail_env needs a fresh dict each time: two decodes of one message give two equal envs."""
    env_dict = RailEnvPersister.load_env_dict(str(tiny_envs[0]))
    wire = codec.encode(flatland_env.env_state_to_wire(env_dict))
    envs = []
    for _ in range(2):
        decoded = flatland_env.env_state_from_wire(codec.decode(wire, codec.REPLY_LIMITS))
        env = flatland_env.build_rail_env(decoded)
        env.reset(regenerate_rail=True, regenerate_schedule=True, random_seed=7)
        envs.append(env)
    assert _agent_view(envs[0]) == _agent_view(envs[1])
    assert envs[0].agents[0].targets == envs[1].agents[0].targets


def test_env_state_round_trip_preserves_types(tiny_envs):
    env_dict = RailEnvPersister.load_env_dict(str(tiny_envs[1]))
    decoded = flatland_env.env_state_from_wire(
        codec.decode(codec.encode(flatland_env.env_state_to_wire(env_dict)), codec.REPLY_LIMITS)
    )
    assert decoded.keys() == env_dict.keys()
    assert [type(a) for a in decoded["agents"]] == [type(a) for a in env_dict["agents"]]
    assert np.array_equal(np.asarray(decoded["grid"]), np.asarray(env_dict["grid"]))
    assert decoded["max_episode_steps"] == env_dict["max_episode_steps"]


# --- the NeurIPS 2020 reward rule -------------------------------------------------------------------


def _check_rewards2020(path: Path, seed: int) -> set[float]:
    """Run one episode with Rewards2020; check every step's reward; return the reward values seen."""
    env = _env_from_wire(path, rewards=flatland_env.Rewards2020())
    env.reset(regenerate_rail=True, regenerate_schedule=True, random_seed=1001)
    rng = np.random.default_rng(seed)
    totals = dict.fromkeys(env.get_agent_handles(), 0.0)
    seen: set[float] = set()
    steps = 0
    while True:
        # mostly MOVE_FORWARD, so that agents do arrive
        actions = {h: int(rng.choice(5, p=[0.05, 0.1, 0.7, 0.1, 0.05])) for h in env.get_agent_handles()}
        _, rewards, dones, _ = env.step(actions)
        steps += 1
        for agent in env.agents:
            expected = 0.0 if agent.state == TrainState.DONE else -1.0
            assert rewards[agent.handle] == expected, (steps, agent.handle, agent.state)
            totals[agent.handle] += rewards[agent.handle]
            seen.add(rewards[agent.handle])
        if dones["__all__"]:
            break
    for agent in env.agents:
        if agent.state == TrainState.DONE:  # arriving at step k collects -(k-1)
            assert totals[agent.handle] == -(agent.arrival_time - 1)
        else:
            assert totals[agent.handle] == -steps
    return seen


@pytest.mark.parametrize("index", [0, 1, 2])
def test_rewards2020_minus_one_until_done(tiny_envs, index):
    assert -1.0 in _check_rewards2020(tiny_envs[index], seed=100 + index)


def test_rewards2020_checks_cover_arrivals(tiny_envs):
    """Some agent arrives in these runs, so the 0.0 branch is checked too."""
    seen = set().union(*(_check_rewards2020(path, seed=100 + i) for i, path in enumerate(tiny_envs)))
    assert seen == {0.0, -1.0}


def test_rewards2020_interface():
    rewards = flatland_env.Rewards2020()
    assert rewards.empty() == 0.0
    assert rewards.cumulate(-1.0, -1.0, 0.0) == -2.0
    assert rewards.end_of_episode_reward(None, None, 10) == 0.0
    assert rewards.normalize(-10.0, -20.0, num_agents=3, max_episode_steps=10) == -1.0
    assert isinstance(flatland_env.rewards_for("neurips2020"), flatland_env.Rewards2020)
    assert flatland_env.rewards_for("flatland") is None
    with pytest.raises(ValueError):
        flatland_env.rewards_for("nope")
