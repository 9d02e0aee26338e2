"""Copy-on-write workspaces, host side: creation, the merged view, drift classification.
Real git and real files; the mounted overlay itself is exercised in the integration tests."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from fakes import HostBackend
from helpers import git, make_repo, tree_snapshot
from sono import overlay
from sono.backends.bwrap import BwrapBackend
from sono.errors import SoError
from sono.gitobjects import reachable_objects
from sono.overlay import Overlay
from sono.sandbox import choose_workspace
from sono.workspace import alternates, create_overlay_workspace, inspect_host

EXCLUDE = (".env", "*.pem")


def project(tmp_path: Path) -> Path:
    repo = make_repo(
        tmp_path / "p",
        {
            ".gitignore": "node_modules/\n.env\n",
            "src/app.py": "print(1)\n",
            "src/util.py": "u = 1\n",
            "README.md": "# p\n",
            "certs/tracked.pem": "public\n",
        },
    )
    (repo / "node_modules" / "lib").mkdir(parents=True)
    (repo / "node_modules" / "lib" / "index.js").write_text("1\n")
    return repo


def create(tmp_path: Path, repo: Path, *, allow_dirty: bool = False) -> tuple[Overlay, str]:
    root = tmp_path / "sb"
    root.mkdir()
    ov = Overlay.under(root, repo)
    host = inspect_host(repo)
    base = create_overlay_workspace(
        host,
        ov,
        sandbox_id="t-1",
        exclude=EXCLUDE,
        allow_dirty=allow_dirty,
        objects=reachable_objects(tmp_path / "objects", repo, host.head),
    )
    time.sleep(0.01)  # host edits in a test land in a later ctime tick than the stamp
    return ov, base


def sgit(ov: Overlay, *args: str) -> str:
    return git(ov.project, f"--git-dir={ov.gitdir}", *args)


def test_creation_copies_nothing_and_leaves_the_host_alone(tmp_path: Path) -> None:
    repo = project(tmp_path)
    (repo / ".env").write_text("TOKEN=secret\n")
    before = tree_snapshot(repo)
    ov, base = create(tmp_path, repo)
    assert tree_snapshot(repo) == before
    assert base == git(repo, "rev-parse", "HEAD")
    assert sgit(ov, "rev-parse", "--abbrev-ref", "HEAD") == "so/t-1"
    assert sgit(ov, "rev-parse", "refs/so/t-1/base") == base
    [layer] = alternates(ov.gitdir)
    assert layer.parent.parent == tmp_path / "objects"  # so's store, not the host's
    assert (ov.gitdir / "index").read_bytes() == (repo / ".git" / "index").read_bytes()
    assert list(ov.upper.iterdir()) == []
    # The lower layer: the project's files as hard links, no .git content, no secret.
    app = ov.lower / "src" / "app.py"
    assert app.stat().st_ino == (repo / "src" / "app.py").stat().st_ino
    assert (ov.lower / "node_modules" / "lib" / "index.js").is_file()
    assert not (ov.lower / ".env").exists()
    assert list((ov.lower / ".git").iterdir()) == []


def test_secrets_are_hidden_but_tracked_matches_are_kept(tmp_path: Path) -> None:
    repo = project(tmp_path)
    (repo / ".env").write_text("TOKEN=secret\n")
    (repo / "src" / "server.pem").write_text("PRIVATE\n")
    ov, _ = create(tmp_path, repo)
    assert overlay.read_file(ov, ".env") is None
    assert overlay.read_file(ov, "src/server.pem") is None
    assert overlay.read_file(ov, "certs/tracked.pem") == "public\n"
    assert overlay.read_file(ov, "node_modules/lib/index.js") == "1\n"


def test_dirty_host_is_snapshotted_into_the_base_commit_without_secrets(tmp_path: Path) -> None:
    repo = project(tmp_path)
    (repo / "src" / "app.py").write_text("print(2)\n")
    (repo / "notes.txt").write_text("new\n")
    (repo / "key.pem").write_text("PRIVATE\n")
    before = tree_snapshot(repo)
    ov, base = create(tmp_path, repo, allow_dirty=True)
    assert base != git(repo, "rev-parse", "HEAD")
    assert sgit(ov, "show", f"{base}:src/app.py") == "print(2)"
    assert sgit(ov, "show", f"{base}:notes.txt") == "new"
    assert "key.pem" not in sgit(ov, "ls-tree", "--name-only", base)
    assert tree_snapshot(repo) == before  # the snapshot's objects live in the sandbox


def test_merged_view_prefers_upper_and_honours_whiteouts_and_opaque_dirs(tmp_path: Path) -> None:
    repo = project(tmp_path)
    ov, _ = create(tmp_path, repo)
    (ov.upper / "src").mkdir()
    (ov.upper / "src" / "app.py").write_text("print('sandbox')\n")
    os.mknod(ov.upper / "src" / "util.py", stat.S_IFCHR, os.makedev(0, 0))
    assert overlay.read_file(ov, "src/app.py") == "print('sandbox')\n"
    assert overlay.read_file(ov, "src/util.py") is None
    assert overlay.read_file(ov, "README.md") == "# p\n"
    assert overlay.shadowed(ov, "src/app.py")
    assert not overlay.shadowed(ov, "README.md")
    (ov.upper / "node_modules").mkdir()
    os.setxattr(ov.upper / "node_modules", "user.overlay.opaque", b"y")
    assert overlay.shadowed(ov, "node_modules/lib/index.js")
    assert overlay.read_file(ov, "node_modules/lib/index.js") is None


def test_merged_view_never_follows_links_or_reads_the_host_git(tmp_path: Path) -> None:
    repo = project(tmp_path)
    ov, _ = create(tmp_path, repo)
    outside = tmp_path / "outside.txt"
    outside.write_text("host secret\n")
    (ov.upper / "specs").mkdir()
    (ov.upper / "specs" / "status.md").symlink_to(outside)
    assert overlay.read_file(ov, "specs/status.md") is None
    assert overlay.read_file(ov, ".git/config") is None


def test_no_drift_right_after_creation(tmp_path: Path) -> None:
    repo = project(tmp_path)
    ov, base = create(tmp_path, repo)
    assert not overlay.scan_drift(ov, base=base)


def test_only_in_place_edits_are_drift_the_rest_never_shows(tmp_path: Path) -> None:
    repo = project(tmp_path)
    ov, base = create(tmp_path, repo)
    (repo / "src" / "app.py").write_text("print('host edit')\n")  # in place: same inode
    (repo / "README.md").unlink()  # deleted on the host: the link keeps the base's
    (repo / "src" / "new.py").write_text("new\n")  # added: not in the frozen names
    (repo / "node_modules" / "dep").mkdir()  # dependency install
    (repo / "node_modules" / "dep" / "i.js").write_text("d\n")
    (repo / "src" / "util.py").write_text("u = 1\n")  # rewritten with the same content
    replaced = repo / "certs" / "tracked.pem.tmp"
    replaced.write_text("rotated\n")
    replaced.rename(repo / "certs" / "tracked.pem")  # an editor's atomic save
    drift = overlay.scan_drift(ov, base=base)
    assert drift.restore == ["src/app.py"]
    assert drift.hide == []
    assert drift.ignored == []
    assert "1 restored from the base commit" in drift.summary()
    assert overlay.read_file(ov, "README.md") == "# p\n"
    assert overlay.read_file(ov, "certs/tracked.pem") == "public\n"
    for gone in ("src/new.py", "node_modules/dep/i.js"):
        assert overlay.read_file(ov, gone) is None


def test_hidden_files_created_after_creation_never_reach_the_lower_layer(
    tmp_path: Path,
) -> None:
    repo = project(tmp_path)
    ov, base = create(tmp_path, repo)
    (repo / ".env").write_text("TOKEN=later\n")
    (repo / "src" / "deploy.pem").write_text("PRIVATE\n")
    (repo / "newdir").mkdir()
    (repo / "newdir" / ".env").write_text("TOKEN=later\n")
    for rel in (".env", "src/deploy.pem", "newdir/.env"):
        assert overlay.read_file(ov, rel) is None
        assert not os.path.lexists(ov.lower / rel)
    assert not overlay.scan_drift(ov, base=base)


def test_freeze_mirrors_modes_and_skips_matching_dirs_and_special_files(tmp_path: Path) -> None:
    repo = project(tmp_path)
    (repo / "ro").mkdir()
    (repo / "ro" / "f").write_text("f\n")
    (repo / "ro").chmod(0o555)
    (repo / "id_keys").mkdir()  # a directory whose name matches: left out whole
    (repo / "id_keys" / "a").write_text("PRIVATE\n")
    (repo / "link").symlink_to("src/app.py")
    os.mkfifo(repo / "pipe")
    lower = tmp_path / "lower"
    frozen = overlay.freeze(repo, lower, ("id_*", ".env"), lambda paths: set())
    assert frozen.skipped == ["id_keys"]
    assert stat.S_IMODE((lower / "ro").stat().st_mode) == 0o555
    assert (lower / "ro" / "f").read_text() == "f\n"
    assert (lower / "link").readlink() == Path("src/app.py")
    assert not (lower / "id_keys").exists()
    assert stat.S_ISFIFO((lower / "pipe").lstat().st_mode)  # linked, never opened
    (repo / "ro").chmod(0o755)


def test_drift_ignores_what_the_sandbox_already_owns(tmp_path: Path) -> None:
    repo = project(tmp_path)
    ov, base = create(tmp_path, repo)
    (ov.upper / "src").mkdir()
    (ov.upper / "src" / "app.py").write_text("agent's\n")
    (repo / "src" / "app.py").write_text("host edit\n")
    assert not overlay.scan_drift(ov, base=base)
    (repo / "node_modules" / "lib" / "index.js").write_text("2\n")
    drift = overlay.scan_drift(ov, base=base)
    assert drift.ignored == ["node_modules/lib/index.js"]
    assert not overlay.scan_drift(ov, base=base, known=drift.ignored)  # reported once


def test_host_commit_of_a_new_file_is_not_drift(tmp_path: Path) -> None:
    repo = project(tmp_path)
    ov, base = create(tmp_path, repo)
    (repo / "extra.txt").write_text("x\n")
    git(repo, "add", "extra.txt")
    git(repo, "commit", "-q", "-m", "host commit")
    assert not overlay.scan_drift(ov, base=base)
    assert overlay.read_file(ov, "extra.txt") is None  # new on the host: not the sandbox's


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("gitfile", "is not a directory"),
        ("owner", "is owned by uid"),
        ("comma", "cannot carry"),
    ],
)
def test_static_obstacles(tmp_path: Path, setup: str, expected: str) -> None:
    name = "a,b" if setup == "comma" else "p"
    repo = make_repo(tmp_path / name)
    if setup == "gitfile":
        git(repo, "worktree", "add", "-q", str(tmp_path / "wt"))
        repo = tmp_path / "wt"
    owner = os.getuid() + 1 if setup == "owner" else os.getuid()
    reason = overlay.static_obstacle(repo, tmp_path / "home", owner_uid=owner)
    assert reason is not None
    assert expected in reason


def test_no_obstacle_for_a_plain_repo(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "p")
    assert overlay.static_obstacle(repo, tmp_path / "home", owner_uid=os.getuid()) is None


def test_remove_tree_handles_permissionless_dirs(tmp_path: Path) -> None:
    target = tmp_path / "x"
    (target / "work" / "work").mkdir(parents=True)
    (target / "work" / "work" / "f").write_text("")
    (target / "work" / "work").chmod(0)
    overlay.remove_tree(target)
    assert not target.exists()


def test_choose_workspace_falls_back_with_a_reason_or_insists(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "p")
    backend = HostBackend()  # cannot mount anything
    assert choose_workspace("copy", backend, repo, tmp_path) == ("copy", None)
    mode, notice = choose_workspace("auto", backend, repo, tmp_path)
    assert mode == "copy"
    assert notice is not None
    assert "the fake backend runs on the host" in notice
    with pytest.raises(SoError, match="workspace = overlay is not possible on fake"):
        choose_workspace("overlay", backend, repo, tmp_path)


def test_auto_takes_the_overlay_on_bwrap(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "p")
    assert choose_workspace("auto", BwrapBackend(), repo, tmp_path / "home") == ("overlay", None)


def test_a_vanished_project_is_a_clear_error(tmp_path: Path) -> None:
    ov = Overlay.under(tmp_path / "sb", tmp_path / "gone")
    with pytest.raises(SoError, match=r"the project .*gone under sandbox p-1 is gone"):
        ov.require_lower("p-1")


def _deep(root: Path, depth: int) -> None:
    """``depth`` nested directories, each with a mode-000 file and a link loop (by
    descriptor: the path would be far beyond PATH_MAX)."""
    fd = os.open(root, os.O_RDONLY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o000, dir_fd=sub))
        os.symlink("..", "loop", dir_fd=sub)
        os.close(fd)
        fd = sub
    os.close(fd)


def test_remove_tree_takes_any_depth_locked_dirs_and_link_loops(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("host file")
    outside.chmod(0o755)
    root = tmp_path / "sandbox"
    root.mkdir()
    _deep(root, 5000)
    locked = root / "x" / "y"
    locked.mkdir(parents=True)
    (locked / "z").write_text("1")
    locked.chmod(0)
    (root / "x").chmod(0o500)
    (root / "to-host").symlink_to(outside)
    (root / "x-link").symlink_to(outside / "keep")
    overlay.remove_tree(root)
    assert not root.exists()
    assert (outside / "keep").read_text() == "host file"  # links removed, never followed
    assert stat.S_IMODE(outside.stat().st_mode) == 0o755


def test_remove_tree_of_a_file_or_nothing(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    overlay.remove_tree(tmp_path / "f")
    overlay.remove_tree(tmp_path / "missing")
    assert not (tmp_path / "f").exists()


def test_strip_setid_clears_the_bits_below_roots_never_through_links(tmp_path: Path) -> None:
    import stat as st_

    from sono.overlay import strip_setid

    root = tmp_path / "upper"
    (root / "d").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.write_text("x")
    outside.chmod(0o4755)
    (root / "suid").write_text("x")
    (root / "suid").chmod(0o4755)
    (root / "d" / "sgid").write_text("x")
    (root / "d" / "sgid").chmod(0o2711)
    (root / "plain").write_text("x")
    (root / "plain").chmod(0o755)
    (root / "link").symlink_to(outside)
    (root / "sgdir").mkdir()
    (root / "sgdir").chmod(0o2775)  # a setgid directory passes its group on
    (root / "d").chmod(0o300)  # unreadable to its owner: opened to look inside
    stripped = strip_setid([root, tmp_path / "missing"])
    assert sorted(p.name for p in stripped) == ["sgdir", "sgid", "suid"]
    assert st_.S_IMODE((root / "sgdir").stat().st_mode) == 0o775
    (root / "d").chmod(0o700)
    assert st_.S_IMODE((root / "suid").stat().st_mode) == 0o755
    assert st_.S_IMODE((root / "d" / "sgid").stat().st_mode) == 0o711
    assert st_.S_IMODE((root / "plain").stat().st_mode) == 0o755  # control
    assert st_.S_IMODE(outside.stat().st_mode) == 0o4755  # never followed


def test_an_edit_in_the_commits_second_is_snapshotted_a_second_later(tmp_path: Path) -> None:
    """Racy git: commit and a same-size edit within one second, the sandbox made in the
    next: the copied index keeps its mtime, so git still re-reads the entry."""
    while time.time() % 1 > 0.3:  # room for the commit and the edit in this second
        time.sleep(0.01)
    repo = project(tmp_path)
    (repo / "src" / "app.py").write_text("print(2)\n")  # the size of print(1)
    (repo / "notes.txt").write_text("new\n")
    time.sleep(1.05 - time.time() % 1)  # the sandbox: a later second
    ov, base = create(tmp_path, repo, allow_dirty=True)
    assert sgit(ov, "show", f"{base}:src/app.py") == "print(2)"
