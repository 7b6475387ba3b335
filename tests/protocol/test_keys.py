"""Tests for arbiter.protocol.keys: the Redis key names, flatland-rl's, and what a service id and a reply
list may be."""

from __future__ import annotations

import uuid

import pytest
from flatland.evaluators.client import FlatlandRemoteClient

from arbiter.protocol import keys

SID = "T12345"
TOKEN = "0123456789abcdef0123456789abcdef"


def test_key_names_are_flatland_rl_s():
    assert keys.commands_key(SID) == "flatland-rl::T12345::commands"
    assert keys.errors_key(SID) == "flatland-rl::T12345::errors"
    assert keys.response_prefix(SID) == "flatland-rl::T12345::response::"
    assert keys.response_key(SID, TOKEN) == f"flatland-rl::T12345::response::{TOKEN}"
    assert keys.events_key(SID) == "flatland-rl::T12345::events"
    assert keys.evaluation_keys(SID) == [
        "flatland-rl::T12345::commands",
        "flatland-rl::T12345::errors",
        "flatland-rl::T12345::events",
    ]


@pytest.mark.parametrize("service_id", [SID, "abc-1.2_x"])
def test_key_names_match_flatland_rl_client(monkeypatch, service_id):
    """flatland-rl 4.3.0's own client names the same keys (its constructor, minus the Redis PING)."""
    monkeypatch.setattr(FlatlandRemoteClient, "ping_pong", lambda self: True)
    client = FlatlandRemoteClient(flatland_rl_service_id=service_id, remote_host="127.0.0.1", remote_port=1)
    assert client.command_channel == keys.commands_key(service_id)
    assert client.error_channel == keys.errors_key(service_id)
    for _ in range(20):
        channel = client._generate_response_channel()
        assert keys.is_valid_response_channel(channel, service_id), channel
        assert not keys.is_valid_response_channel(channel, service_id + "x")


def test_valid_response_channels_accepted():
    assert keys.is_valid_response_channel(keys.response_key(SID, TOKEN), SID)
    assert keys.is_valid_response_channel(keys.response_key(SID, uuid.uuid4().hex), SID)
    assert keys.is_valid_response_channel(keys.response_key("abc-1.2_x", "f" * 32), "abc-1.2_x")


@pytest.mark.parametrize(
    "channel",
    [
        keys.response_key("T12346", TOKEN),  # another service id
        keys.response_key("T1234", TOKEN),
        keys.response_key("T123456", TOKEN),
        keys.response_key(SID, TOKEN[:-1]),  # 31 hex
        keys.response_key(SID, TOKEN + "0"),  # 33 hex
        keys.response_key(SID, ""),
        keys.response_key(SID, TOKEN.upper()),
        keys.response_key(SID, "g" * 32),
        keys.response_key(SID, TOKEN[:-1] + " "),
        keys.response_key(SID, TOKEN) + "::x",  # extra suffix
        keys.response_key(SID, TOKEN) + "x",
        keys.response_key(SID, TOKEN) + "*",
        keys.response_key(SID, TOKEN + "::" + TOKEN),
        keys.commands_key(SID),
        keys.errors_key(SID),
        keys.response_prefix(SID),
        "*",
        "flatland-rl::*",
        keys.response_key(SID, "*"),
        keys.response_key("*", TOKEN),
        f"flatland-rl::{SID}::responses::{TOKEN}",
        f"flatland-rl::{SID}:response::{TOKEN}",
        f"FLATLAND-RL::{SID}::response::{TOKEN}",
        " " + keys.response_key(SID, TOKEN),
        "",
    ],
    ids=repr,
)
def test_invalid_response_channels_rejected(channel):
    assert keys.is_valid_response_channel(channel, SID) is False


@pytest.mark.parametrize(
    "channel",
    [
        None,
        5,
        b"flatland-rl::T12345::response::" + TOKEN.encode(),
        [keys.response_key(SID, TOKEN)],
        {"channel": keys.response_key(SID, TOKEN)},
    ],
    ids=repr,
)
def test_non_str_response_channels_rejected(channel):
    assert keys.is_valid_response_channel(channel, SID) is False


@pytest.mark.parametrize("service_id", ["T12345", "abc-1.2_x", "a", "A" * 64, "0", "t-" + "f" * 12, "..", "-"])
def test_valid_service_ids(service_id):
    assert keys.validate_service_id(service_id) == service_id


@pytest.mark.parametrize(
    "service_id",
    ["", "a b", "a::b", "a:b", "*", "a*", "T?", "[ab]", "a" * 65, "a/b", "ü", "a\tb", " T12345", "T12345 "],
    ids=repr,
)
def test_invalid_service_ids(service_id):
    with pytest.raises(ValueError):
        keys.validate_service_id(service_id)


@pytest.mark.parametrize("service_id", [None, 12345, b"T12345", ["T12345"]], ids=repr)
def test_non_str_service_ids(service_id):
    with pytest.raises(ValueError):
        keys.validate_service_id(service_id)


# Regression: a pattern ending in "$" used with .match() also accepts a trailing newline.


def test_response_channel_with_trailing_newline_rejected():
    assert keys.is_valid_response_channel(keys.response_key(SID, TOKEN) + "\n", SID) is False


@pytest.mark.parametrize("service_id", ["T12345\n", "a" * 64 + "\n"], ids=repr)
def test_service_id_with_trailing_newline_rejected(service_id):
    with pytest.raises(ValueError):
        keys.validate_service_id(service_id)
