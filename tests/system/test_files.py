"""replace_file: the one routine that rewrites the journal, the registry, the health state and
the NFD file. Real files in a temporary directory; failures made by the file system itself."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpuperfd.system.files import replace_file


def test_replaces_content_with_the_mode_asked_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("old")
    old_umask = os.umask(0o077)
    try:
        replace_file(path, b"new", 0o644)
    finally:
        os.umask(old_umask)
    assert path.read_bytes() == b"new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    replace_file(path, b"secret", 0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left


def test_a_symlink_at_the_path_is_replaced_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep me")
    path = tmp_path / "journal.cap.json"
    path.symlink_to(target)
    replace_file(path, b"{}")
    assert not path.is_symlink() and path.read_bytes() == b"{}"
    assert target.read_text() == "keep me"


def test_a_failed_replace_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "registry"
    path.mkdir()  # a directory where the file should be: rename onto it fails
    (path / "inside").write_text("x")
    with pytest.raises(OSError):
        replace_file(path, b"data")
    assert path.is_dir() and (path / "inside").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["registry"]


def test_an_unwritable_folder_raises_and_changes_nothing(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        folder = tmp_path / "missing"  # root writes anywhere: a folder that does not exist instead
    else:
        folder = tmp_path / "ro"
        folder.mkdir(mode=0o500)
    with pytest.raises(OSError):
        replace_file(folder / "health.json", b"{}")
    assert not (folder / "health.json").exists()
