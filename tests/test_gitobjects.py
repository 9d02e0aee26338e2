"""The per-project object store: exactly the objects reachable from a base, shared and
built incrementally. Real git."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helpers import git, make_repo
from sono.gitobjects import chain, project_store, reachable_objects


def objects_in(layers: list[Path]) -> set[str]:
    found: set[str] = set()
    for layer in layers:
        for idx in (layer / "pack").glob("*.idx"):
            with idx.open("rb") as fh:
                out = subprocess.run(
                    ["git", "show-index"], stdin=fh, capture_output=True, text=True, check=True
                ).stdout
            found |= {line.split()[1] for line in out.splitlines()}
    return found


def reachable(repo: Path, rev: str) -> set[str]:
    return {line.split()[0] for line in git(repo, "rev-list", "--objects", rev).splitlines()}


def blob(repo: Path, text: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), "hash-object", "-w", "--stdin"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_only_what_the_base_reaches(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "p", {"a.txt": "a\n"})
    git(repo, "commit", "-q", "--allow-empty", "-m", "second")
    dangling = blob(repo, "DANGLING=secret\n")
    (repo / "a.txt").write_text("STASHED=secret\n")
    git(repo, "stash", "-q")
    git(repo, "checkout", "-q", "-b", "other")
    (repo / "b.txt").write_text("OTHER=branch\n")
    git(repo, "add", "b.txt")
    git(repo, "commit", "-q", "-m", "other")
    other = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-")
    base = git(repo, "rev-parse", "HEAD")
    layers = reachable_objects(tmp_path / "objects", repo, base)
    assert layers == [project_store(tmp_path / "objects", repo) / base]
    have = objects_in(layers)
    assert have == reachable(repo, base)
    stash = git(repo, "rev-parse", "refs/stash")
    for outside in (dangling, stash, f"{stash}:a.txt", other, f"{other}:b.txt"):
        assert git(repo, "rev-parse", outside) not in have


def test_a_descendant_base_adds_a_layer_with_only_its_new_objects(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "p", {"a.txt": "a\n"})
    first = git(repo, "rev-parse", "HEAD")
    reachable_objects(tmp_path / "objects", repo, first)
    (repo / "b.txt").write_text("b\n")
    git(repo, "add", "b.txt")
    git(repo, "commit", "-q", "-m", "b")
    second = git(repo, "rev-parse", "HEAD")
    layers = reachable_objects(tmp_path / "objects", repo, second)
    assert [p.name for p in layers] == [second, first]
    assert objects_in(layers[:1]) == reachable(repo, second) - reachable(repo, first)
    assert objects_in(layers) == reachable(repo, second)
    assert reachable_objects(tmp_path / "objects", repo, second) == layers  # cached


def test_rewritten_history_starts_a_new_chain_without_the_old_objects(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "p", {"a.txt": "a\n"})
    (repo / ".env").write_text("TOKEN=committed-by-mistake\n")
    git(repo, "add", "-f", ".env")
    git(repo, "commit", "-q", "-m", "oops")
    leaked = git(repo, "rev-parse", "HEAD:.env")
    reachable_objects(tmp_path / "objects", repo, git(repo, "rev-parse", "HEAD"))
    git(repo, "rm", "-q", "--cached", ".env")
    git(repo, "commit", "-q", "--amend", "--allow-empty", "-m", "fixed")
    base = git(repo, "rev-parse", "HEAD")
    layers = reachable_objects(tmp_path / "objects", repo, base)
    assert chain(layers[0]) == layers == [layers[0]]
    assert leaked not in objects_in(layers)
    assert objects_in(layers) == reachable(repo, base)
