"""Tests for arbiter.protocol.errors: the error hierarchy, its wire codes, and what an error shows
(never a Redis password)."""

from __future__ import annotations

import asyncio

import pytest
from flatland.evaluators.client import TimeoutException as FlatlandTimeoutException

from arbiter.protocol import errors
from arbiter.protocol.errors import (
    ERRORS_BY_CODE,
    ArbiterError,
    DecodeError,
    MessageTooLarge,
    ProtocolError,
    TimeoutException,
    error_from_payload,
)


def test_timeout_exception_is_a_stop_async_iteration():
    assert issubclass(TimeoutException, StopAsyncIteration)
    assert issubclass(TimeoutException, ArbiterError)
    with pytest.raises(StopAsyncIteration):
        raise TimeoutException("planning budget exceeded")


def test_timeout_exception_caught_like_flatland_s():
    assert issubclass(FlatlandTimeoutException, StopAsyncIteration)
    caught = []
    try:
        raise TimeoutException("step")
    except StopAsyncIteration as exc:  # what agent code written for FlatlandRemoteClient catches
        caught.append(exc)
    assert isinstance(caught[0], TimeoutException) and str(caught[0]) == "step"


def test_timeout_exception_usable_in_async_code():
    async def agent() -> str:
        try:
            raise TimeoutException("late")
        except StopAsyncIteration as exc:
            return str(exc)

    assert asyncio.run(agent()) == "late"


def test_hierarchy():
    for cls in ERRORS_BY_CODE.values():
        assert issubclass(cls, ArbiterError)
    assert issubclass(MessageTooLarge, DecodeError)
    assert issubclass(DecodeError, ProtocolError)


def test_every_error_class_has_a_distinct_code():
    classes = [obj for obj in vars(errors).values() if isinstance(obj, type) and issubclass(obj, ArbiterError)]
    assert len(classes) >= 12
    assert sorted(ERRORS_BY_CODE.values(), key=lambda c: c.__name__) == sorted(classes, key=lambda c: c.__name__)
    assert len({cls.code for cls in classes}) == len(classes)
    for code, cls in ERRORS_BY_CODE.items():
        assert cls.code == code


@pytest.mark.parametrize("code,cls", sorted(ERRORS_BY_CODE.items()), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("message", ["boom", "", "multi\nline ü ∑ {'code': 'X'}"], ids=repr)
def test_error_payload_roundtrip(code, cls, message):
    payload = cls(message).to_payload()
    assert payload == {"code": code, "message": message}
    rebuilt = error_from_payload(payload)
    assert type(rebuilt) is cls
    assert str(rebuilt) == message
    assert error_from_payload(rebuilt.to_payload()).to_payload() == payload


def test_error_payload_survives_the_codec():
    from arbiter.protocol import codec

    for cls in ERRORS_BY_CODE.values():
        wire = codec.decode(codec.encode(cls("over budget").to_payload()))
        rebuilt = error_from_payload(wire)
        assert type(rebuilt) is cls and str(rebuilt) == "over budget"


@pytest.mark.parametrize(
    "payload,kept",
    [
        ("Exception: something broke", "Exception: something broke"),
        ("", ""),
        ({"message": "no code here"}, "no code here"),
        ({"error": "free form", "detail": 3}, "free form"),
        ({"code": "NO_SUCH_CODE", "message": "unknown code"}, "unknown code"),
        ({"code": 42, "message": "int code"}, "int code"),
        ({"code": None, "message": "none code"}, "none code"),
        ({"code": ["TIMEOUT"], "message": "list code"}, "list code"),
        (None, "None"),
        (12, "12"),
        (["a", "list"], "list"),
        (b"bytes payload", "bytes payload"),
    ],
    ids=repr,
)
def test_legacy_payloads_become_arbiter_error(payload, kept):
    err = error_from_payload(payload)
    assert type(err) is ArbiterError
    assert kept in str(err)


def test_unknown_code_does_not_pick_a_subclass_by_accident():
    for code in ("timeout", "Timeout", " TIMEOUT", "TIMEOUT ", "ERROR2"):
        assert type(error_from_payload({"code": code, "message": "m"})) is ArbiterError
    assert type(error_from_payload({"code": "TIMEOUT", "message": "m"})) is TimeoutException


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:s3cret@redis:6379/0", "redis://:***@redis:6379/0"),
        ("redis://participant-T1:s3cret@redis:6379/0", "redis://participant-T1:***@redis:6379/0"),
        ("rediss://u:p%40ss@[::1]:6380", "rediss://u:***@[::1]:6380"),
    ],
)
def test_redis_urls_are_shown_without_their_password(url, shown):
    from arbiter.protocol.redis_conn import redacted

    assert redacted(url) == shown


def test_a_dead_evaluator_error_does_not_show_the_password(redis_server, service_id):
    from arbiter.client import RemoteClient

    url = redis_server.url.replace("redis://", "redis://:wrong-s3cret@")
    with pytest.raises(errors.ArbiterError) as raised:
        RemoteClient(redis_url=url, service_id=service_id, reply_timeout_s=0.3)
    assert "wrong-s3cret" not in str(raised.value)
