"""so volume list|reset on real directories under SO_HOME."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sono.backends.microvm_volumes import home_volume, volume_id
from sono.cli.main import main
from sono.state import so_home


def filled(project: Path) -> Path:
    volume = home_volume(so_home(os.environ), project)
    (volume.path / ".cache" / "npm").mkdir(parents=True)
    (volume.path / ".cache" / "npm" / "blob").write_bytes(b"x" * 10000)
    (volume.path / ".bash_history").write_text("ls\n")
    return volume.path


def test_list_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = filled(tmp_path / "proj")
    assert main(["volume", "list", "--json"]) == 0
    (item,) = json.loads(capsys.readouterr().out)
    assert item["id"] == volume_id(tmp_path / "proj") == path.name
    assert item["project"] == str(tmp_path / "proj")
    assert item["path"] == str(path)
    assert item["size_bytes"] >= 10000


def test_list_text_and_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["volume", "list"]) == 0
    assert "no volumes yet" in capsys.readouterr().out
    filled(tmp_path / "proj")
    assert main(["volume", "list"]) == 0
    out = capsys.readouterr().out
    assert volume_id(tmp_path / "proj") in out and str(tmp_path / "proj") in out


def test_reset_empties_the_home_but_keeps_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = filled(tmp_path / "proj")
    other = filled(tmp_path / "other")
    assert main(["volume", "reset", path.name[:-4], "--yes"]) == 0
    assert path.is_dir() and list(path.iterdir()) == []
    assert (other / ".bash_history").is_file()  # only the one named
    assert "is empty" in capsys.readouterr().out
    assert main(["volume", "list", "--json"]) == 0
    sizes = {v["id"]: v["size_bytes"] for v in json.loads(capsys.readouterr().out)}
    assert sizes[path.name] < sizes[other.name]


def test_reset_asks_first_and_names_a_volume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = filled(tmp_path / "proj")
    assert main(["volume", "reset", path.name]) == 1  # no terminal and no --yes
    assert "pass --yes" in capsys.readouterr().err
    assert (path / ".bash_history").is_file()
    assert main(["volume", "reset"]) == 1
    assert "name the volume" in capsys.readouterr().err
    assert main(["volume", "reset", "nope", "--yes"]) == 1
    assert "no volume 'nope'" in capsys.readouterr().err
