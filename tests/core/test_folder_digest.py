"""server/core/folder_digest.py: one digest names what a test folder holds, wherever it is."""

from __future__ import annotations

import shutil

import pytest

from arbiter.protocol.errors import ConfigError
from arbiter.server.core.folder_digest import folder_digest, short


def test_a_copy_elsewhere_has_the_digest_and_any_change_of_its_files_another(tmp_path):
    folder = tmp_path / "tests"
    (folder / "Test_0").mkdir(parents=True)
    (folder / "metadata.csv").write_text("test_id,env_id\nTest_0,Level_0\n")
    (folder / "Test_0" / "Level_0.pkl").write_bytes(b"\x80\x04level zero")
    digest = folder_digest(str(folder))
    assert digest.startswith("sha256:") and len(digest) == len("sha256:") + 64
    copy = tmp_path / "mounted" / "elsewhere"
    shutil.copytree(folder, copy)
    (copy / ".DS_Store").write_bytes(b"a file system's leftover")
    assert folder_digest(str(copy)) == digest

    (copy / "Test_0" / "Level_0.pkl").write_bytes(b"\x80\x04level 0")  # another episode
    assert folder_digest(str(copy)) != digest
    shutil.copy(folder / "Test_0" / "Level_0.pkl", copy / "Test_0" / "Level_0.pkl")
    assert folder_digest(str(copy)) == digest
    (copy / "Test_0" / "Level_0.pkl").rename(copy / "Test_0" / "Level_1.pkl")  # the same bytes, another episode's name
    assert folder_digest(str(copy)) != digest
    assert short(digest) == digest[len("sha256:") :][:12] and short(None) == "none"


def test_a_test_folder_that_is_not_one_is_said(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match="is not a folder"):
        folder_digest(str(tmp_path / "afile"))
