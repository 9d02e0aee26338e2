"""What comes back from a planning sandbox's specs/: regular, well-named, bounded files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sono.errors import SoError
from sono.harvest import Bounds, collect, good_name, write_back


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize("name", ["a.md", "feature_x-2.md", "README", "v1.2"])
def test_good_names(name: str) -> None:
    assert good_name(name)


@pytest.mark.parametrize("name", [".hidden", "-rf", "a b.md", "x\x1b.md", "é.md", "", "a" * 101])
def test_bad_names(name: str) -> None:
    assert not good_name(name)


def test_collect_takes_regular_files_under_specs_only(tmp_path: Path) -> None:
    work = tree(tmp_path / "w", {"specs/a.md": "a\n", "specs/sub/b.md": "b\n", "README.md": "r"})
    (work / "specs" / "link.md").symlink_to("/etc/passwd")
    (work / "specs" / "dirlink").symlink_to(tmp_path)
    os.mkfifo(work / "specs" / "fifo")
    found = collect(work)
    assert found.files == {"specs/a.md": b"a\n", "specs/sub/b.md": b"b\n"}
    assert len(found.refused) == 3


def test_collect_refuses_a_symlinked_specs(tmp_path: Path) -> None:
    tree(tmp_path / "real", {"a.md": "a"})
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "specs").symlink_to(tmp_path / "real")
    found = collect(tmp_path / "w")
    assert not found.files and "not a directory" in found.refused[0]


def test_collect_bounds(tmp_path: Path) -> None:
    files = {f"specs/f{i}.md": "x" * 10 for i in range(5)}
    work = tree(tmp_path / "w", {**files, "specs/a/b/c/d/deep.md": "x", "specs/bin.md": ""})
    (work / "specs" / "bin.md").write_bytes(b"\xff\xfe")
    found = collect(work, Bounds(depth=3, files=3, file_bytes=9, total_bytes=100))
    assert not found.files  # every file is one byte too large
    found = collect(work, Bounds(depth=3, files=3, file_bytes=10, total_bytes=25))
    assert list(found.files) == ["specs/f0.md", "specs/f1.md"]  # the total
    reasons = " ".join(found.refused)
    assert "deeper than 3" in reasons and "not UTF-8" in reasons and "in all" in reasons


def test_write_back_replaces_links_instead_of_following_them(tmp_path: Path) -> None:
    project = tree(tmp_path / "p", {"specs/keep.md": "same\n"})
    outside = tmp_path / "outside"
    outside.write_text("precious\n")
    (project / "specs" / "x.md").symlink_to(outside)
    written = write_back(project, {"specs/x.md": b"new\n", "specs/keep.md": b"same\n"})
    assert written == ["specs/x.md"]
    assert outside.read_text() == "precious\n"
    assert (project / "specs" / "x.md").read_text() == "new\n"
    assert not (project / "specs" / "x.md").is_symlink()
    assert [p.name for p in (project / "specs").iterdir() if p.name.startswith(".")] == []


def test_write_back_refuses_linked_folders_and_other_paths(tmp_path: Path) -> None:
    project = tree(tmp_path / "p", {"README.md": "r"})
    (tmp_path / "elsewhere").mkdir()
    (project / "specs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SoError, match="not a plain folder"):
        write_back(project, {"specs/a.md": b"a"})
    for rel in ("README.md", "specs/../x", "specs/.git", "specs"):
        with pytest.raises(SoError, match="outside specs/"):
            write_back(project, {rel: b"a"})
    assert not list((tmp_path / "elsewhere").iterdir())
