"""microVM home volumes: one per project, found by id or unique prefix."""

from __future__ import annotations

from pathlib import Path

import pytest

from sono.backends.microvm_volumes import empty_dir, find_volume, home_volume, list_volumes
from sono.errors import SoError


def test_home_volume_per_project(tmp_path: Path) -> None:
    a = home_volume(tmp_path, Path("/src/My Project"))
    again = home_volume(tmp_path, Path("/src/My Project"))
    other = home_volume(tmp_path, Path("/elsewhere/My Project"))
    assert a == again and a.id.startswith("my-project-") and a.id != other.id
    assert [v.id for v in list_volumes(tmp_path)] == sorted([a.id, other.id])
    assert find_volume(tmp_path, a.id[:-3]) == a
    with pytest.raises(SoError, match="ambiguous"):
        find_volume(tmp_path, "my-project")
    with pytest.raises(SoError, match="no volume"):
        find_volume(tmp_path, "nope")


def test_empty_dir_keeps_the_dir(tmp_path: Path) -> None:
    volume = home_volume(tmp_path, Path("/src/p"))
    (volume.path / "cache" / "deep").mkdir(parents=True)
    (volume.path / "f").write_text("x")
    (volume.path / "link").symlink_to("/etc")
    empty_dir(volume.path)
    assert volume.path.is_dir() and not any(volume.path.iterdir())
    assert volume.to_json()["size_bytes"] == volume.size_bytes()
