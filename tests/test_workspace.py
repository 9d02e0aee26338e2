"""Workspace creation with real git: what the sandbox gets, what it never gets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fakes import HostBackend, fake_sandbox
from helpers import git, make_repo, tree_snapshot
from sono.backends.base import SandboxSpec
from sono.errors import SoError
from sono.sandbox import Sandbox
from sono.state import Store
from sono.workspace import (
    alternates,
    inspect_host,
    read_beneath,
    read_workspace_file,
    remove_secrets,
)

EXCLUDE = (".env", ".env.*", ".envrc", "*.pem", "*.key", "id_*")


def new_sandbox(tmp_path: Path, repo: Path, *, allow_dirty: bool = False) -> Sandbox:
    return fake_sandbox(tmp_path, repo, exclude=EXCLUDE, allow_dirty=allow_dirty)


def test_copy_has_ignored_files_but_no_secrets(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "p",
        {
            ".gitignore": "node_modules/\n.env*\n*.pem\nkeys/\n",
            "src/app.py": "print(1)\n",
            "tests/fixture.key": "tracked\n",
        },
    )
    (repo / "node_modules" / "lib").mkdir(parents=True)
    (repo / "node_modules" / "lib" / "index.js").write_text("module.exports = 1\n")
    (repo / ".env").write_text("TOKEN=secret\n")
    (repo / ".env.local").write_text("TOKEN=secret\n")
    (repo / "keys").mkdir()
    (repo / "keys" / "id_ed25519").write_text("PRIVATE\n")
    (repo / "server.pem").write_text("PRIVATE\n")
    sb = new_sandbox(tmp_path, repo)
    work = sb.work
    assert (work / "node_modules" / "lib" / "index.js").read_text() == "module.exports = 1\n"
    assert (work / "src" / "app.py").is_file()
    for secret in (".env", ".env.local", "keys/id_ed25519", "server.pem"):
        assert not (work / secret).exists(), secret
    assert (work / "tests" / "fixture.key").read_text() == "tracked\n"  # tracked: kept
    assert git(work, "status", "--porcelain") == ""
    assert git(work, "rev-parse", "--abbrev-ref", "HEAD") == f"so/{sb.record.id}"
    assert git(work, "rev-parse", f"refs/so/{sb.record.id}/base") == git(repo, "rev-parse", "HEAD")
    assert git(work, "remote") == ""


def test_git_history_is_borrowed_from_so_s_store_not_the_host_s(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "p", {"big.bin": "x" * 200_000})
    sb = new_sandbox(tmp_path, repo)
    [layer] = alternates(sb.work / ".git")
    assert layer.parent.parent == tmp_path / "so" / "objects"
    size = sum(p.stat().st_size for p in (sb.work / ".git" / "objects").rglob("*") if p.is_file())
    assert size < 10_000
    assert git(sb.work, "tag") == ""  # no refs of the host but its HEAD


def test_host_is_untouched_by_creation(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "p", {"a.txt": "a\n"})
    before = tree_snapshot(repo)
    new_sandbox(tmp_path, repo)
    assert tree_snapshot(repo) == before


def test_dirty_host_snapshot_goes_into_base_commit(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "p", {"a.txt": "a\n"})
    (repo / "a.txt").write_text("edited\n")
    (repo / "new.txt").write_text("new\n")
    assert inspect_host(repo).dirty
    sb = new_sandbox(tmp_path, repo, allow_dirty=True)
    base = git(sb.work, "rev-parse", f"refs/so/{sb.record.id}/base")
    assert base != sb.record.host_head
    assert git(sb.work, "show", f"{base}:a.txt") == "edited"
    assert git(sb.work, "show", f"{base}:new.txt") == "new"
    assert git(sb.work, "status", "--porcelain") == ""


def test_not_a_repo_and_empty_repo_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SoError, match="not inside a git repository"):
        inspect_host(tmp_path)
    (tmp_path / "empty").mkdir()
    git(tmp_path / "empty", "init", "-q")
    with pytest.raises(SoError, match="no commits yet"):
        inspect_host(tmp_path / "empty")


def test_failed_creation_leaves_nothing_behind(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "p")
    store = Store(tmp_path / "so")

    class Boom(HostBackend):
        def create(self, *, spec: SandboxSpec) -> None:
            raise SoError("boom")

    with pytest.raises(SoError, match="boom"):
        fake_sandbox(tmp_path, repo, backend=Boom())
    assert store.all() == []
    assert not any(store.root.iterdir())


def test_remove_secrets_matches_names_not_paths(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "id_rsa").write_text("k")
    (tmp_path / "a" / "identity.txt").write_text("k")
    removed = remove_secrets(tmp_path, ["id_*"], set())
    assert removed == ["a/id_rsa"]
    assert (tmp_path / "a" / "identity.txt").exists()


def test_read_workspace_file_refuses_links_out(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "secret").write_text("host secret")
    (tmp_path / "work" / "status.md").symlink_to(tmp_path / "secret")
    (tmp_path / "work" / "ok.md").write_text("fine")
    assert read_workspace_file(tmp_path / "work", "status.md") is None
    assert read_workspace_file(tmp_path / "work", "ok.md") == "fine"
    assert read_workspace_file(tmp_path / "work", "missing.md") is None


def test_batched_git_queries(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "p", {"a.txt": "a\n"})
    sb = new_sandbox(tmp_path, repo)
    base = sb.record.base_ref
    head, recent = sb.git.before(base)
    assert head == sb.record.base_commit and recent == []
    (sb.work / "b.txt").write_text("b\n")
    (sb.work / "c.txt").write_text("c\n")
    sb.git.commit_all("add b and c")
    after, changed, commits, total = sb.git.after(sb.record.iter_ref(1), head, base)
    assert git(sb.work, "rev-parse", sb.record.iter_ref(1)) == after
    assert changed == ["b.txt", "c.txt"] and commits == [after] and total == 1
    assert sb.git.before(base)[1] == [f"{after[:7]} add b and c"]


def test_read_beneath_refuses_links_dirs_and_escapes(tmp_path: Path) -> None:
    root = tmp_path / "w"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f.txt").write_text("ok")
    (tmp_path / "secret").write_text("host")
    (root / "link").symlink_to(tmp_path / "secret")
    (root / "dlink").symlink_to(root / "d")
    assert read_beneath(root, "d/f.txt") == "ok"
    assert read_beneath(root, "link") is None  # a symlink as the file
    assert read_beneath(root, "dlink/f.txt") is None  # a symlink on the way
    assert read_beneath(root, "../secret") is None
    assert read_beneath(root, "d") is None  # not a regular file
    os.mkfifo(root / "fifo")
    assert read_beneath(root, "fifo") is None  # opened non-blocking, refused
