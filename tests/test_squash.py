"""so's own squash writer: what git does not track is refused, no filter runs, and a
failure at any step (an error, Ctrl-C) leaves the work tree and index as they were."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fakes import fake_sandbox
from helpers import git, make_repo, tree_snapshot
from sono import squash
from sono.errors import SoError
from sono.review import merge
from sono.sandbox import Sandbox
from test_review import recorder

ALWAYS: Callable[[object], bool] = lambda risky: True  # noqa: E731 - a test's approval


def agent_commits(
    tmp_path: Path, host: dict[str, str], build: Callable[[Path], None]
) -> tuple[Path, Sandbox]:
    repo = make_repo(tmp_path / "p", host)
    git(repo, "config", "user.name", "Host User")
    git(repo, "config", "user.email", "host@example.invalid")
    sb = fake_sandbox(tmp_path, repo)
    build(sb.work)
    sb.git.commit_all("agent")
    sb.take()
    return repo, sb


def write(root: Path, rel: str, text: str) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)


def state(repo: Path) -> dict[str, bytes]:
    """Work tree and .git, less the object store (imported objects may stay)."""
    snap = {k: v for k, v in tree_snapshot(repo).items() if not k.startswith(".git/objects/")}
    dirs = {f"{p.relative_to(repo)}/" for p in repo.rglob("*") if p.is_dir()}
    dirs = {d for d in dirs if not d.startswith(".git/objects/")}
    return {**snap, **dict.fromkeys(sorted(dirs), b"<dir>")}


HOST = {"README.md": "# p\n", ".gitignore": ".env\n.venv/\ndata/\nbuild\n", "src/a.py": "a\n"}


@pytest.mark.parametrize(
    ("name", "host_side", "agent_side"),
    [
        ("ignored .env", {".env": "SECRET=canary\n"}, {".env": "SECRET=agent\n"}),
        ("venv python", {".venv/bin/python": "#!real\n"}, {".venv/bin/python": "#!evil\n"}),
        ("ignored dir replaced by a file", {"data/keep.csv": "1,2\n"}, {"data": "file\n"}),
        ("ignored file where a dir goes", {"build": "artifact\n"}, {"build/x.txt": "x\n"}),
    ],
)
def test_merge_refuses_to_touch_what_git_does_not_track(
    tmp_path: Path, name: str, host_side: dict[str, str], agent_side: dict[str, str]
) -> None:
    def build(work: Path) -> None:
        (work / ".gitignore").write_text("")  # the agent's own view: nothing ignored
        for rel, text in agent_side.items():
            write(work, rel, text)

    repo, sb = agent_commits(tmp_path, HOST, build)
    for rel, text in host_side.items():
        write(repo, rel, text)
    before = state(repo)
    with pytest.raises(SoError, match=r"does not track.*nothing was changed") as err:
        merge(sb, commit=False, keep=True, approve=ALWAYS)
    assert next(iter(agent_side)).split("/")[0] in str(err.value), name
    assert state(repo) == before
    # Control: moved out of the way, the same change merges.
    for rel in host_side:
        (repo / rel).unlink()
    merge(sb, commit=False, keep=True, approve=ALWAYS)
    for rel, text in agent_side.items():
        assert (repo / rel).read_text() == text


def test_untracked_symlink_on_the_way_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    repo, sb = agent_commits(tmp_path, HOST, lambda w: write(w, "cache/x.txt", "x\n"))
    git(repo, "config", "core.excludesFile", str(tmp_path / "ignore"))
    (tmp_path / "ignore").write_text("cache\n")
    (repo / "cache").symlink_to(outside)
    with pytest.raises(SoError, match="cache \\(a symlink"):
        merge(sb, commit=False, keep=True, approve=ALWAYS)
    assert list(outside.iterdir()) == []


def test_assume_unchanged_file_is_refused(tmp_path: Path) -> None:
    repo, sb = agent_commits(tmp_path, HOST, lambda w: write(w, "src/a.py", "agent\n"))
    git(repo, "update-index", "--assume-unchanged", "src/a.py")
    (repo / "src/a.py").write_text("host edit git does not see\n")
    with pytest.raises(SoError, match="told to ignore changes"):
        merge(sb, commit=False, keep=True, approve=ALWAYS)
    assert (repo / "src/a.py").read_text() == "host edit git does not see\n"


def test_modes_symlinks_removals_and_file_to_dir_as_in_the_tree(tmp_path: Path) -> None:
    def build(work: Path) -> None:
        write(work, "run.sh", "#!/bin/sh\n")
        (work / "run.sh").chmod(0o755)
        (work / "link").symlink_to("src/a.py")
        (work / "README.md").unlink()
        (work / "src" / "a.py").unlink()
        write(work, "src/a.py/inner.txt", "now a dir\n")

    repo, sb = agent_commits(tmp_path, {**HOST, "src/deep/b.txt": "b\n"}, build)
    result = merge(sb, commit=False, keep=True, approve=ALWAYS)
    assert os.stat(repo / "run.sh").st_mode & stat.S_IXUSR
    assert os.readlink(repo / "link") == "src/a.py"
    assert not (repo / "README.md").exists()
    assert (repo / "src/a.py/inner.txt").read_text() == "now a dir\n"
    assert git(repo, "status", "--porcelain") == "\n".join(
        f"{'A ' if p != 'README.md' and p != 'src/a.py' else 'D '} {p}"
        for p in sorted(result.files)
    ).replace("A  run.sh", "A  run.sh")
    assert git(repo, "write-tree") == git(repo, "rev-parse", f"{sb.tip}^{{tree}}")


@pytest.mark.parametrize("keys", [("clean", "smudge"), ("process",)])
def test_no_filter_runs_during_merge(tmp_path: Path, keys: tuple[str, ...]) -> None:
    marker = tmp_path / "FILTER-RAN"
    script = tmp_path / "filter.sh"
    script.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\ncat\n')
    script.chmod(0o755)

    def build(work: Path) -> None:
        write(work, ".gitattributes", "* filter=lfs diff=lfs merge=lfs\n")
        write(work, ".lfsconfig", "[lfs]\n\turl = http://127.0.0.1:9/evil\n")
        write(work, "src/a.py", "agent\n")

    repo, sb = agent_commits(tmp_path, HOST, build)
    for key in keys:
        git(repo, "config", f"filter.lfs.{key}", f"{script} {key}")
    git(repo, "config", "filter.lfs.required", "true")
    seen: list[list[str]] = []
    merge(sb, commit=True, keep=True, approve=recorder(seen))
    assert seen == [[".gitattributes", ".lfsconfig"]]
    assert not marker.exists(), marker.read_text()
    assert (repo / "src/a.py").read_text() == "agent\n"
    # Control: the host's own git does run the filter for that attribute now.
    subprocess.run(["git", "-C", str(repo), "add", "--renormalize", "."], check=False)
    assert marker.exists()


@pytest.mark.parametrize("failure", ["error", "ctrl-c"])
@pytest.mark.parametrize("at", [1, 3, 6])
def test_a_failed_write_leaves_no_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str, at: int
) -> None:
    def build(work: Path) -> None:
        write(work, "src/a.py", "changed\n")
        (work / "README.md").unlink()
        for n in range(4):
            write(work, f"new/dir{n}/f.txt", f"{n}\n")

    repo, sb = agent_commits(tmp_path, {**HOST, "old/gone.txt": "g\n"}, build)
    before = state(repo)
    real = squash._move
    calls = []

    def flaky(src: Path, dest: Path, *, replace: bool = False) -> None:
        calls.append(dest)
        if len(calls) == at:
            raise KeyboardInterrupt if failure == "ctrl-c" else OSError(28, "No space left")
        real(src, dest, replace=replace)

    monkeypatch.setattr(squash, "_move", flaky)
    with pytest.raises(KeyboardInterrupt if failure == "ctrl-c" else OSError):
        merge(sb, commit=False, keep=True)
    assert len(calls) >= at
    assert state(repo) == before
    assert git(repo, "status", "--porcelain") == ""
    monkeypatch.setattr(squash, "_move", real)
    merge(sb, commit=False, keep=True)  # control: then it merges
    assert (repo / "new/dir3/f.txt").exists()


def test_a_failed_commit_undoes_the_files_and_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, sb = agent_commits(tmp_path, HOST, lambda w: write(w, "src/a.py", "agent\n"))
    before = state(repo)
    real = squash.git

    def moved_head(root: Path, *args: str, **kw: object) -> object:
        if args[0] == "update-ref":
            raise SoError("HEAD moved")
        return real(root, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(squash, "git", moved_head)
    with pytest.raises(SoError, match="HEAD moved"):
        merge(sb, commit=True, keep=True)
    assert state(repo) == before
