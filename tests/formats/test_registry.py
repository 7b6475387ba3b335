"""The registry of formats (docs/adding-a-format.md): shipped formats load by name, outside
formats join under their own name only, and a wrong name says which ones exist."""

from __future__ import annotations

import os
import types

import pytest

import arbiter.server.formats as formats_package
from arbiter.protocol.errors import ConfigError
from arbiter.server.formats import KNOWN, format_names, get_format, presets_dirs, register_format
from arbiter.server.formats.base import Format


def test_a_shipped_format_loads_once_under_its_own_name():
    found = get_format("two-phase")
    assert isinstance(found, Format) and found.name == "two-phase"
    assert get_format("two-phase") is found


def test_an_unknown_format_is_refused_naming_the_known_ones():
    with pytest.raises(ConfigError) as caught:
        get_format("chess")
    message = str(caught.value)
    assert "'chess'" in message
    for name in KNOWN:
        assert name in message


def test_a_module_without_format_is_refused_by_module_name():
    empty = types.ModuleType("empty_format_module")
    with pytest.raises(ConfigError, match="empty_format_module defines no FORMAT"):
        register_format("empty", empty)


def test_a_shipped_name_or_a_mismatched_name_cannot_be_registered():
    shipped = get_format("two-phase")
    with pytest.raises(ConfigError, match="one of arbiter's own"):
        register_format("two-phase", shipped)
    with pytest.raises(ConfigError, match="named 'two-phase'"):
        register_format("other-name", shipped)
    assert "other-name" not in format_names()


def test_every_shipped_formats_presets_folder_is_listed():
    package = os.path.dirname(os.path.abspath(formats_package.__file__))
    shipped = [folder for folder in presets_dirs() if os.path.abspath(folder).startswith(package)]
    listed = {os.path.basename(os.path.dirname(folder)) for folder in shipped}
    assert listed == {module.rsplit(".", 1)[1] for module in KNOWN.values()}
    assert all(any(name.endswith(".toml") for name in os.listdir(folder)) for folder in shipped)
