"""Stage 1 of loading a pickled request (protocol/safe_pickle.py): the opcode scan.

``scan`` walks a pickle's opcodes without running any: protocols 2 to 5 only, and only the opcodes
a Python pickler writes for plain data and numpy arrays. Extension codes, persistent ids,
INST/OBJ/NEWOBJ, sets, out-of-band buffers and the text opcodes of protocols 0 and 1 are
refused; every declared length must fit in the bytes left, and every memo index in the pickle's
size (the unpickler allocates the memo up to the largest index it is given).
"""

from __future__ import annotations

import pickletools
import re

from arbiter.protocol.errors import DecodeError

PROTOCOLS = range(2, 6)
_MAX_GLOBAL_LINE = 256

_NAMES = {op.code.encode("latin-1")[0]: op.name for op in pickletools.opcodes}
_OP = {name: code for code, name in _NAMES.items()}

# Opcodes with a fixed-size argument (bytes), or none.
_FIXED = {
    _OP[name]: size
    for name, size in (
        ("MARK", 0), ("POP", 0), ("POP_MARK", 0), ("DUP", 0), ("NONE", 0), ("NEWTRUE", 0), ("NEWFALSE", 0),
        ("BININT", 4), ("BININT1", 1), ("BININT2", 2), ("BINFLOAT", 8),
        ("EMPTY_LIST", 0), ("APPEND", 0), ("APPENDS", 0), ("EMPTY_DICT", 0), ("SETITEM", 0), ("SETITEMS", 0),
        ("EMPTY_TUPLE", 0), ("TUPLE", 0), ("TUPLE1", 0), ("TUPLE2", 0), ("TUPLE3", 0),
        ("STACK_GLOBAL", 0), ("REDUCE", 0), ("BUILD", 0), ("MEMOIZE", 0), ("BINGET", 1), ("LONG_BINGET", 4),
    )
}  # fmt: skip
# Opcodes whose argument is a little-endian length (of this many bytes) and that many bytes.
_COUNTED = {
    _OP[name]: prefix
    for name, prefix in (
        ("LONG1", 1), ("LONG4", 4), ("SHORT_BINUNICODE", 1), ("BINUNICODE", 4), ("BINUNICODE8", 8),
        ("SHORT_BINBYTES", 1), ("BINBYTES", 4), ("BINBYTES8", 8), ("BYTEARRAY8", 8),
    )
}  # fmt: skip
_PUTS = {_OP["BINPUT"]: 1, _OP["LONG_BINPUT"]: 4}
# A run of opcodes with fixed-size arguments, skipped at C speed: a hostile pickle can be 64 KiB
# of them.
_FIXED_RUN = re.compile(
    b"(?:"
    + b"|".join(
        b"[" + b"".join(re.escape(bytes([op])) for op, n in _FIXED.items() if n == size) + b"]" + b"." * size
        for size in sorted(set(_FIXED.values()))
    )
    + b")*",
    re.DOTALL,
)
_PROTO, _FRAME, _GLOBAL, _STOP = _OP["PROTO"], _OP["FRAME"], _OP["GLOBAL"], _OP["STOP"]


def is_pickle(data: bytes) -> bool:
    """A pickle of protocol 2+ starts with 0x80 and its protocol number. msgpack's empty map is
    the byte 0x80 alone, and a request is never an empty map, so no msgpack request is longer
    than one byte and starts with 0x80."""
    return len(data) >= 2 and data[0] == _PROTO


def scan(data: bytes) -> None:
    """Check the pickle's opcodes and their arguments without running any (stage 1)."""
    size = len(data)
    if not is_pickle(data):
        raise DecodeError("not a pickle of protocol 2 or later")
    if data[1] not in PROTOCOLS:
        raise DecodeError(f"pickle protocol {data[1]} is not accepted (2 to 5 are)")
    pos = 2
    while True:
        if pos >= size:
            raise DecodeError("truncated pickle: no STOP")
        op = data[pos]
        if op in _FIXED:
            run = _FIXED_RUN.match(data, pos)  # matches at least the empty string
            end = run.end() if run is not None else pos
            pos = end if end > pos else pos + 1 + _FIXED[op]  # an argument cut short: refused below
        elif op == _STOP:
            if pos + 1 != size:
                raise DecodeError(f"{size - pos - 1} bytes of trailing data after the pickle")
            return
        elif op in _COUNTED:
            pos += 1
            prefix = _COUNTED[op]
            # LONG4's length is signed: read unsigned, a negative one is a huge one, refused below.
            pos += prefix + int.from_bytes(data[pos : pos + prefix], "little")
        elif op in _PUTS:
            pos += 1
            width = _PUTS[op]
            if int.from_bytes(data[pos : pos + width], "little") >= size:
                raise DecodeError("a pickle memo index beyond the pickle's size")
            pos += width
        elif op == _FRAME:
            length = int.from_bytes(data[pos + 1 : pos + 9], "little")
            pos += 9
            if length > size - pos:
                raise DecodeError(f"a pickle frame claims {length} bytes with {size - pos} left")
        elif op == _GLOBAL:
            pos += 1
            for _ in ("module", "name"):
                end = data.find(b"\n", pos, pos + _MAX_GLOBAL_LINE)
                if end < 0:
                    raise DecodeError("a pickled GLOBAL name that is unterminated or too long")
                pos = end + 1
        else:
            name = _NAMES.get(op, f"0x{op:02x}")
            raise DecodeError(f"pickle opcode {name} is not accepted")
        if pos > size:
            raise DecodeError("truncated pickle: an argument runs past its end")
