"""Hostile pickles for arbiter's pickle path, generated deterministically.

Every payload that could run code leaves evidence when it does: a file in the marker folder
(``open``, ``os.system('touch ...')``, ``eval``/``exec`` of an ``open``, ``subprocess.Popen``)
or a call of ``record_code_ran``, which both creates its file and appends to ``CODE_RAN``. A
test asserts the folder and the list stay empty; ``live_payloads`` are the ones that do run code
under a plain ``pickle.loads`` (checked by a control test).

Pickles are assembled opcode by opcode (``op``), so every form a pickle can call through is
covered: GLOBAL and STACK_GLOBAL with REDUCE, INST, OBJ, NEWOBJ, NEWOBJ_EX, EXT1/2/4, BUILD,
persistent ids.
"""

from __future__ import annotations

import copyreg
import pickle
import random
import shlex
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from flatland.envs.rail_env_action import RailEnvActions

from arbiter.protocol import codec, keys
from arbiter.protocol.errors import DecodeError
from arbiter.protocol.messages import FLATLAND_RL, REQUEST_TYPES

CODE_RAN: list[str] = []


def record_code_ran(path: str) -> None:
    """What several payloads call: proof, in this process and on disk, that pickled code ran."""
    CODE_RAN.append(path)
    Path(path).touch()


# --- an assembler ---------------------------------------------------------------------------------


def text(value: str) -> bytes:
    data = value.encode("utf-8", "surrogatepass")
    if len(data) < 256:
        return b"\x8c" + bytes([len(data)]) + data
    return b"X" + struct.pack("<I", len(data)) + data


def blob(data: bytes) -> bytes:
    return (b"C" + bytes([len(data)]) if len(data) < 256 else b"B" + struct.pack("<I", len(data))) + data


def integer(value: int) -> bytes:
    if 0 <= value < 256:
        return b"K" + bytes([value])
    if -(2**31) <= value < 2**31:
        return b"J" + struct.pack("<i", value)
    data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(data)]) + data


def tup(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def lst(*items: bytes) -> bytes:
    return b"](" + b"".join(items) + b"e"


def dct(*pairs: bytes) -> bytes:
    return b"}(" + b"".join(pairs) + b"u"


def glob(module: str, name: str, form: str = "STACK_GLOBAL") -> bytes:
    if form == "GLOBAL":
        return b"c" + f"{module}\n{name}\n".encode()
    return text(module) + text(name) + b"\x93"


def framed(body: bytes, protocol: int = 4) -> bytes:
    """A whole pickle: PROTO, a FRAME for protocols 4 and 5, the body, STOP."""
    if protocol >= 4:
        return b"\x80" + bytes([protocol]) + b"\x95" + struct.pack("<Q", len(body) + 1) + body + b"."
    return b"\x80" + bytes([protocol]) + body + b"."


# Extension codes the tests register for globals a payload calls (copyreg.add_extension).
EXTENSIONS = {("posix", "system"): 0xF0, ("hostile_pickles", "record_code_ran"): 0x1234, ("builtins", "exec"): 0x12345}


def register_extensions() -> None:
    """Register EXTENSIONS and load each once without restriction: the unpickler then caches the
    object and hands it to any later EXT opcode without asking ``find_class``."""
    for (module, name), code in EXTENSIONS.items():
        copyreg.add_extension(module, name, code)
        pickle.loads(b"\x80\x02" + ext_op(code) + b".")


def unregister_extensions() -> None:
    for (module, name), code in EXTENSIONS.items():
        copyreg.remove_extension(module, name, code)


def ext_op(code: int) -> bytes:
    if code < 256:
        return b"\x82" + bytes([code])
    if code < 65536:
        return b"\x83" + struct.pack("<H", code)
    return b"\x84" + struct.pack("<i", code)


FORMS = ("GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "EXT", "BUILD", "PERSID", "BINPERSID")
LIVE_FORMS = ("GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "EXT")  # these run the call under pickle.loads


def invoke(form: str, module: str, name: str, args: list[bytes]) -> bytes:
    """Opcodes that call ``module.name(*args)`` (or try to) through ``form``."""
    joined = b"".join(args)
    if form in ("GLOBAL", "STACK_GLOBAL"):
        return glob(module, name, form) + tup(*args) + b"R"
    if form == "INST":
        return b"(" + joined + b"i" + f"{module}\n{name}\n".encode()
    if form == "OBJ":
        return b"(" + glob(module, name, "GLOBAL") + joined + b"o"
    if form == "NEWOBJ":
        return glob(module, name) + tup(*args) + b"\x81"
    if form == "NEWOBJ_EX":
        return glob(module, name) + tup(*args) + b"}\x92"
    if form == "EXT":
        code = EXTENSIONS.get((module, name), 0xF0)
        return ext_op(code) + tup(*args) + b"R"
    if form == "BUILD":
        # Give an accepted constructor (numpy.dtype) the callable as its state, then call it.
        state = tup(b"N", dct(text("_build"), glob(module, name, "GLOBAL")))
        return glob("numpy", "dtype") + state + b"b" + tup(*args) + b"R"
    if form == "PERSID":
        return b"P" + f"{module}.{name}\n".encode()
    if form == "BINPERSID":
        return text(f"{module}.{name}") + b"Q"
    raise ValueError(form)


# --- what the payloads call -------------------------------------------------------------------------


def targets(marker: Callable[[], str]) -> list[tuple[str, str, list[bytes]]]:
    """(module, name, args) calls that each leave a fresh marker file when they run."""
    return [
        ("builtins", "open", [text(marker()), text("w")]),
        ("io", "open", [text(marker()), text("w")]),
        ("posix", "system", [text(f"touch {shlex.quote(marker())}")]),
        ("os", "system", [text(f"touch {shlex.quote(marker())}")]),
        ("builtins", "eval", [text(f"open({marker()!r}, 'w').close()")]),
        ("builtins", "exec", [text(f"open({marker()!r}, 'w').close()")]),
        ("subprocess", "Popen", [lst(text("touch"), text(marker()))]),
        ("subprocess", "check_call", [lst(text("touch"), text(marker()))]),
        ("hostile_pickles", "record_code_ran", [text(marker())]),
    ]


def chains(marker: Callable[[], str], form: str) -> list[tuple[bytes, bool]]:
    """Calls reached through other callables (getattr, importlib, __import__, partial, loads, ...),
    each with whether it runs code under pickle.loads."""

    def call(module: str, name: str, *args: bytes) -> bytes:
        return glob(module, name, form) + tup(*args) + b"R"

    def getattr_of(obj: bytes, attr: str) -> bytes:
        return call("builtins", "getattr", obj, text(attr))

    def touch() -> bytes:
        return text(f"touch {shlex.quote(marker())}")

    def inner() -> bytes:
        return blob(pickle.dumps(_Evil("builtins", "open", (marker(), "w")), protocol=2))

    hostile_module = call("importlib", "import_module", text("hostile_pickles"))
    return [
        (getattr_of(call("importlib", "import_module", text("os")), "system") + tup(touch()) + b"R", True),
        (getattr_of(call("builtins", "__import__", text("os")), "system") + tup(touch()) + b"R", True),
        (getattr_of(hostile_module, "record_code_ran") + tup(text(marker())) + b"R", True),
        (
            getattr_of(call("builtins", "__import__", text("builtins")), "exec")
            + tup(text(f"open({marker()!r}, 'w')"))
            + b"R",
            True,
        ),
        (call("functools", "partial", glob("posix", "system", form), touch()) + b")R", True),
        (call("pickle", "loads", inner()), True),
        (call("_pickle", "loads", inner()), True),
        (
            call("operator", "methodcaller", text("system"), touch())
            + tup(call("importlib", "import_module", text("os")))
            + b"R",
            True,
        ),
        # builds a Popen without running its __init__: no code runs, but it is no plain data either
        (
            call(
                "copyreg", "_reconstructor", glob("subprocess", "Popen", form), glob("builtins", "object", form), b"N"
            ),
            False,
        ),
    ]


class _Evil:
    """An object whose unpickling calls ``module.name(*args)``."""

    def __init__(self, module: str, name: str, args: tuple[Any, ...]):
        self.call = (module, name, args)

    def __reduce__(self) -> tuple[Any, ...]:
        import importlib

        module, name, args = self.call
        return getattr(importlib.import_module(module), name), args


def numpy_payloads(marker: Callable[[], str]) -> list[bytes]:
    """Object arrays and dtypes, numpy's own pickles and hand-made variants of them."""
    evil = glob("builtins", "open") + tup(text(marker()), text("w")) + b"R"
    dtype_i8 = glob("numpy", "dtype") + tup(text("i8"), b"\x89", b"\x88") + b"R"
    dtype_state = tup(integer(3), text("<"), b"N", b"N", b"N", integer(-1), integer(-1), integer(0))
    dtype_object = glob("numpy", "dtype") + tup(text("O8"), b"\x89", b"\x88") + b"R"
    array = glob("numpy.core.multiarray", "_reconstruct") + tup(glob("numpy", "ndarray"), tup(integer(0)), blob(b"b"))
    array += b"R"
    return [
        pickle.dumps(np.array([_Evil("builtins", "open", (marker(), "w"))], dtype=object), protocol=4),
        pickle.dumps(np.array([1, _Evil("posix", "system", (f"touch {shlex.quote(marker())}",))], dtype=object)),
        pickle.dumps({"action": np.array([_Evil("hostile_pickles", "record_code_ran", (marker(),))], dtype=object)}),
        pickle.dumps(np.array([(1, None)], dtype=[("a", "i8"), ("b", "O")]), protocol=2),
        pickle.dumps(np.dtype([("a", "O")]), protocol=4),
        pickle.dumps(np.array(["x"], dtype="U1"), protocol=4),
        pickle.dumps(np.array([1], dtype="M8[s]"), protocol=4),
        # a plain dtype whose data is a list holding the call
        framed(array + tup(integer(1), tup(integer(1)), dtype_i8 + dtype_state + b"b", b"\x89", lst(evil)) + b"b"),
        # a plain dtype rebuilt as an object dtype by its state
        framed(dtype_i8 + tup(integer(3), text("|"), b"N", b"N", b"N", integer(8), integer(1), integer(63)) + b"b"),
        # a numpy scalar of object dtype holding the call
        framed(glob("numpy.core.multiarray", "scalar") + tup(dtype_object, evil) + b"R"),
        framed(glob("numpy.core.multiarray", "scalar") + tup(dtype_object, blob(b"\0" * 8)) + b"R"),
        # numpy's pickling functions called with something else than they expect
        framed(
            glob("numpy.core.multiarray", "_reconstruct") + tup(glob("subprocess", "Popen"), tup(), blob(b"b")) + b"R"
        ),
        framed(
            glob("numpy.core.multiarray", "_reconstruct")
            + tup(glob("numpy", "dtype"), tup(integer(0)), blob(b"b"))
            + b"R"
        ),
        framed(glob("numpy.core.numeric", "_frombuffer") + tup(evil, dtype_i8, tup(integer(1)), text("C")) + b"R"),
        framed(
            array + tup(integer(1), tup(integer(10**9)), dtype_i8 + dtype_state + b"b", b"\x89", blob(b"\0" * 8)) + b"b"
        ),  # fmt: skip
    ]


def structural(service_id: str) -> list[bytes]:
    """Hostile structure: memo tricks, huge declared lengths, deep nesting, size bombs, protocols."""
    chan = text(keys.response_key(service_id, "ab" * 16))
    big = 2**63
    bombs = [
        framed(b"N" + b"r" + struct.pack("<I", 0xFFFFFFF0) + b"0N"),  # memo slot 4 G: a 32 GiB memo
        framed(b"N" + b"r" + struct.pack("<I", 1 << 26) + b"0N"),
        framed(b"j" + struct.pack("<I", 0xFFFFFFFF)),  # get of a slot never set
        framed(b"h\x05"),
        framed(b"]\x94h\x00a"),  # a list holding itself
        framed(b"}\x94K\x01h\x00s"),  # a dict holding itself
        framed(b"]\x94" + b"h\x00a" * 2000),  # a list holding itself 2000 times
        framed(blob(b"x" * 60_000) + b"\x94" + b"](" + b"h\x00" * 2000 + b"e"),  # 120 MB once spelt out
        framed(text("y" * 4000) + b"\x94" + b"}(" + b"".join(integer(i) + b"h\x00" for i in range(3000)) + b"u"),
        framed(b"(" * 30_000),  # marks with nothing to close them
        framed(b"]" * 20_000 + b"a" * 19_999),  # 20,000 nested lists
        framed(b"]" * 17 + b"a" * 16),  # one level too deep
        framed(lst(*[integer(0)] * 10_001)),  # longer than a request's containers
        framed(text("z" * 4097)),
        framed(integer(2**64)),
        framed(b"\x8b" + struct.pack("<i", 60_000) + b"\x01" * 60_000),  # a 480,000-bit int
        framed(b"\x8b" + struct.pack("<i", -5) + b"\x01"),
        framed(glob("fractions", "Fraction") + tup(integer(1), integer(0)) + b"R"),
        framed(glob("fractions", "Fraction") + tup(text("9" * 5000)) + b"R"),
        framed(glob("numpy", "ndarray") + tup(integer(10**9)) + b"R"),  # numpy.ndarray is no constructor
        framed(glob("numpy", "dtype") + b"2b"),  # BUILD a constructor with itself
        framed(b"]" + tup(b"N", dct(text("append"), integer(1))) + b"b"),  # BUILD a list's attributes
        framed(b"}" + dct(text("__class__"), text("x")) + b"b"),  # BUILD a dict's __dict__
        framed(
            glob("numpy.core.multiarray", "_reconstruct")
            + tup(glob("numpy", "ndarray"), tup(integer(0)), blob(b"b"))
            + b"R"
            + dct(text("data"), blob(b"x"))
            + b"b"
        ),  # fmt: skip
        framed(integer(1) + integer(2) + b"\x93"),  # STACK_GLOBAL of ints
        framed(glob("flatland.envs.rail_env_action", "RailEnvActions") + tup(integer(7)) + b"R"),
        framed(glob("flatland.envs.rail_env_action", "RailEnvActions") + tup(text("MOVE_LEFT")) + b"R"),
        framed(glob("flatland.envs.rail_env_action", "RailEnvActions") + b")\x81"),
        framed(glob("_codecs", "encode") + tup(text("\u20ac"), text("latin1")) + b"R"),
        framed(glob("_codecs", "encode") + tup(text("x"), text("utf-8")) + b"R"),
        framed(glob("builtins", "bytes") + tup(integer(10**9)) + b"R"),
        framed(b"\x96" + struct.pack("<Q", 3) + b"abc"),  # a bytearray where data belongs
        framed(b"\x8f" + b"(K\x01\x90"),  # a set
        framed(b"\x97"),  # out-of-band buffer
        framed(dct(text("type"), text("FLATLAND_RL.NOPE"), text("response_channel"), chan)) + b"\x00",  # trailing
        dct(text("type"), text("FLATLAND_RL.NOPE")),  # no PROTO, no STOP
        b"\x80\x06" + dct(text("type"), text("FLATLAND_RL.NOPE")) + b".",  # a protocol from the future
        b"\x80\x01N.",
        pickle.dumps({"type": "FLATLAND_RL.NOPE"}, protocol=0),
        pickle.dumps({"type": "FLATLAND_RL.NOPE"}, protocol=1),
    ]
    for op, width in ((b"X", "<I"), (b"\x8d", "<Q"), (b"B", "<I"), (b"\x8e", "<Q"), (b"\x96", "<Q"), (b"\x8b", "<I")):
        for claimed in (2**31 - 1, 2**32 - 1, big) if width == "<Q" else (2**31 - 1, 2**32 - 1):
            bombs.append(b"\x80\x04" + op + struct.pack(width, claimed) + b"abc.")
    for claimed in (2**32, big):
        bombs.append(b"\x80\x04\x95" + struct.pack("<Q", claimed) + b"N.")
    bombs.append(b"\x80\x04c" + b"x" * 1000 + b"\nsystem\n.")  # a GLOBAL module name of 1000 characters
    bombs.append(b"\x80\x04c" + b"x" * 300_000 + b"\n")  # oversized too
    bombs.append(framed(blob(b"\0" * codec.COMMAND_LIMITS.max_bytes)))
    return bombs


# --- legitimate requests, to mutate -----------------------------------------------------------------


def legacy_request(service_id: str, type_: str, payload: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A request as FlatlandRemoteClient builds it before pickling it."""
    channel = keys.response_key(service_id, f"{rng.getrandbits(128):032x}")
    return {"type": type_, "payload": payload, "response_channel": channel, "timestamp": 1.7e9 + rng.random()}


def templates(service_id: str, rng: random.Random) -> list[bytes]:
    step = {"action": {0: RailEnvActions.MOVE_FORWARD, 1: 3, 2: np.int64(4)}, "inference_time": 0.01}
    arrays = {"action": {0: 2}, "obs": np.arange(6, dtype=np.float32).reshape(2, 3), "x": np.uint8(7)}
    messages = [
        legacy_request(service_id, FLATLAND_RL.ENV_STEP, step, rng),
        legacy_request(service_id, FLATLAND_RL.PING, {"version": "4.3.0"}, rng),
        legacy_request(service_id, FLATLAND_RL.ENV_CREATE, {}, rng),
        legacy_request(service_id, FLATLAND_RL.ENV_STEP, arrays, rng),
    ]
    return [pickle.dumps(m, protocol=p) for m in messages for p in (2, 3, 4, 5)]


_ALL_OPCODES = [bytes([b]) for b in range(256)]


def mutate(data: bytes, rng: random.Random, fragments: list[bytes]) -> bytes:
    body = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        at = rng.randrange(len(body) + 1)
        if kind == 0 and body:
            body[min(at, len(body) - 1)] = rng.randrange(256)
        elif kind == 1:
            body[at:at] = rng.choice(_ALL_OPCODES) + rng.randbytes(rng.choice([0, 1, 2, 4, 8]))
        elif kind == 2:
            del body[at : at + rng.randint(1, 16)]
        elif kind == 3:
            end = min(len(body), at + rng.randint(1, 32))
            body[at:at] = body[at:end] * rng.randint(1, 20)
        elif kind == 4:
            body[at:at] = rng.choice(fragments)
        else:
            body = body[:at]
    return bytes(body)


def _is_request(data: bytes) -> bool:
    """Whether the evaluator would take ``data`` as a request of a known type."""
    try:
        message, _ = codec.decode_request(data)
    except DecodeError:
        return False
    return isinstance(message, dict) and isinstance(message.get("type"), str) and message["type"] in REQUEST_TYPES


# --- the corpus -------------------------------------------------------------------------------------


def hand_written(service_id: str, marker_dir: Path) -> Iterator[tuple[str, bytes]]:
    """(kind, pickle) for every hand-written payload: each call through each form, in each place
    of a request, at each protocol; chains; numpy payloads; structure."""
    counter = iter(range(10**9))

    def marker() -> str:
        return str(marker_dir / f"m{next(counter)}")

    chan = text(keys.response_key(service_id, "cd" * 16))

    def placed(where: int, hostile: bytes) -> bytes:
        request = [text("type"), text(FLATLAND_RL.ENV_STEP), text("response_channel"), chan]
        if where == 0:
            return hostile
        if where == 1:
            return dct(*request, text("payload"), hostile)
        if where == 2:
            return dct(*request, text("payload"), dct(text("action"), dct(integer(0), hostile)))
        if where == 3:
            return dct(*request, text("payload"), dct(hostile, integer(1)))
        if where == 4:
            return dct(*request, text("payload"), lst(lst(lst(lst(hostile)))))
        return dct(text("type"), text(FLATLAND_RL.PING), text("response_channel"), hostile)

    for protocol in (2, 3, 4, 5):
        for form in FORMS:
            for module, name, args in targets(marker):
                for where in range(6):
                    yield f"{form}:{module}.{name}", framed(placed(where, invoke(form, module, name, args)), protocol)
        for form in ("GLOBAL", "STACK_GLOBAL"):
            for n, (chain, _) in enumerate(chains(marker, form)):
                for where in range(6):
                    yield f"chain{n}:{form}", framed(placed(where, chain), protocol)
    for n, payload in enumerate(numpy_payloads(marker)):
        yield f"numpy{n}", payload
    for n, payload in enumerate(structural(service_id)):
        yield f"structure{n}", payload


def live_payloads(marker_dir: Path) -> list[tuple[str, bytes]]:
    """Payloads that do run code under pickle.loads (with EXTENSIONS registered): the control."""
    counter = iter(range(10**9))

    def marker() -> str:
        return str(marker_dir / f"live{next(counter)}")

    found = []
    for form in LIVE_FORMS:
        for module, name, args in targets(marker):
            if form == "EXT" and (module, name) not in EXTENSIONS:
                continue
            found.append((f"{form}:{module}.{name}", framed(invoke(form, module, name, args))))
    for form in ("GLOBAL", "STACK_GLOBAL"):
        found += [(f"chain{n}:{form}", framed(chain)) for n, (chain, live) in enumerate(chains(marker, form)) if live]
    found += [(f"numpy{n}", payload) for n, payload in enumerate(numpy_payloads(marker)[:3])]
    return found


def corpus(service_id: str, marker_dir: Path, seed: int = 20240611, mutants: int = 3000) -> list[tuple[str, bytes]]:
    """The hand-written payloads, then mutants and truncations of legitimate requests and of
    hostile pickles; none of them a request the evaluator could act on."""
    rng = random.Random(seed)
    found = list(hand_written(service_id, marker_dir))
    legit = templates(service_id, rng)
    fragments = [data[2:-1] for _, data in found[:: max(1, len(found) // 200)]]
    while mutants > 0:
        data = mutate(rng.choice(legit + [d for _, d in rng.sample(found, 4)]), rng, fragments)
        if not _is_request(data):
            found.append(("mutant", data))
            mutants -= 1
    for data in legit:
        cuts = sorted(rng.sample(range(1, len(data)), 40))
        found += [("truncated", data[:cut]) for cut in cuts if not _is_request(data[:cut])]
    return found
