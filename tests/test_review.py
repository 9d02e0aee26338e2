"""diff / reset / merge with real git (fake backend at the seam; bwrap in integration)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from fakes import fake_sandbox
from helpers import git, make_repo, tree_snapshot
from sono.errors import SoError
from sono.review import diff_text, merge, reset, resolve_rev, show_diff
from sono.sandbox import Sandbox


def sandbox_with_commits(tmp_path: Path, *changes: dict[str, str]) -> tuple[Path, Sandbox]:
    repo = make_repo(tmp_path / "p", {"a.txt": "line\n", "b.txt": "b\n"})
    sb = fake_sandbox(tmp_path, repo)
    for n, files in enumerate(changes, start=1):
        for name, text in files.items():
            (sb.work / name).write_text(text)
        sb.git.commit_all(f"change {n}")
        sb.record_iteration(n)
        sb.save(iterations=n)
    return repo, sb


def without_objects(snapshot: dict[str, bytes]) -> dict[str, bytes]:
    """New objects from the sandbox may land in the store; everything else must not change."""
    return {k: v for k, v in snapshot.items() if not k.startswith(".git/objects/")}


def test_diff_whole_run_and_one_iteration(tmp_path: Path) -> None:
    _, sb = sandbox_with_commits(tmp_path, {"a.txt": "one\n"}, {"c.txt": "new\n"})
    whole = diff_text(sb, iteration=None, stat=False, color=False)
    assert "+one" in whole and "+new" in whole
    second = diff_text(sb, iteration=2, stat=False, color=False)
    assert "+new" in second and "+one" not in second
    assert "a.txt" in diff_text(sb, iteration=1, stat=True, color=False)


def test_iteration_diff_after_a_reset_starts_where_the_iteration_started(
    tmp_path: Path,
) -> None:
    _, sb = sandbox_with_commits(tmp_path, {"a.txt": "one\n"}, {"a.txt": "two\n"})
    reset(sb, "iter-1")
    start = sb.tip
    (sb.work / "d.txt").write_text("third\n")
    sb.git.commit_all("change 3")
    sb.record_iteration(3, start)
    sb.save(iterations=3)
    third = diff_text(sb, iteration=3, stat=False, color=False)
    assert "+third" in third and "two" not in third  # not against the abandoned iteration 2


def test_iteration_out_of_range_is_a_clear_error(tmp_path: Path) -> None:
    _, sb = sandbox_with_commits(tmp_path, {"a.txt": "one\n"}, {"a.txt": "two\n"})
    for n in (0, 3, 9):
        with pytest.raises(SoError, match=f"has no iteration {n} \\(it has 2"):
            diff_text(sb, iteration=n, stat=False, color=False)


def test_resolve_rev_forms_and_errors(tmp_path: Path) -> None:
    _, sb = sandbox_with_commits(tmp_path, {"a.txt": "one\n"})
    assert resolve_rev(sb, "iter-1") == sb.git.head()
    assert resolve_rev(sb, "base") == sb.record.base_commit
    assert resolve_rev(sb, "iter-0") == sb.record.base_commit
    with pytest.raises(SoError, match="not a commit or iteration"):
        resolve_rev(sb, "iter-9")


def test_reset_to_iteration(tmp_path: Path) -> None:
    _, sb = sandbox_with_commits(tmp_path, {"a.txt": "one\n"}, {"a.txt": "two\n"})
    (sb.work / "junk.txt").write_text("untracked")
    reset(sb, "iter-1")
    assert (sb.work / "a.txt").read_text() == "one\n"
    assert not (sb.work / "junk.txt").exists()
    assert sb.record.commits == 1


def test_merge_leaves_squash_staged_and_removes_sandbox(tmp_path: Path) -> None:
    repo, sb = sandbox_with_commits(tmp_path, {"a.txt": "one\n"}, {"c.txt": "new\n"})
    head = git(repo, "rev-parse", "HEAD")
    result = merge(sb, commit=False, keep=False)
    assert result.commits == 2 and sorted(result.files) == ["a.txt", "c.txt"]
    assert git(repo, "rev-parse", "HEAD") == head  # staged, not committed
    assert git(repo, "diff", "--cached", "--name-only").split() == ["a.txt", "c.txt"]
    assert (repo / "c.txt").read_text() == "new\n"
    assert not sb.dir.exists()


def test_merge_commit_flag_commits(tmp_path: Path) -> None:
    repo, sb = sandbox_with_commits(tmp_path, {"a.txt": "one\n"})
    git(repo, "config", "user.name", "Host User")
    git(repo, "config", "user.email", "host@example.invalid")
    merge(sb, commit=True, keep=True)
    assert git(repo, "log", "-1", "--format=%s").startswith(f"so: squash of sandbox {sb.record.id}")
    assert git(repo, "status", "--porcelain") == ""
    assert sb.dir.exists()


def test_merge_refuses_dirty_host(tmp_path: Path) -> None:
    repo, sb = sandbox_with_commits(tmp_path, {"a.txt": "one\n"})
    (repo / "b.txt").write_text("host edit\n")
    with pytest.raises(SoError, match="uncommitted changes"):
        merge(sb, commit=False, keep=False)
    assert sb.dir.exists()


def test_merge_conflict_restores_host_exactly_and_keeps_sandbox(tmp_path: Path) -> None:
    repo, sb = sandbox_with_commits(tmp_path, {"a.txt": "sandbox\n", "d.txt": "added\n"})
    (repo / "a.txt").write_text("host\n")
    git(repo, "commit", "-qam", "host change")
    before = without_objects(tree_snapshot(repo))
    with pytest.raises(SoError, match=r"conflicts in a\.txt.*exactly as it was.*kept"):
        merge(sb, commit=False, keep=False)
    assert without_objects(tree_snapshot(repo)) == before
    assert git(repo, "status", "--porcelain") == ""
    assert sb.dir.exists()


def test_merge_with_nothing_to_merge(tmp_path: Path) -> None:
    _, sb = sandbox_with_commits(tmp_path)
    with pytest.raises(SoError, match="nothing to merge"):
        merge(sb, commit=False, keep=False)


def test_old_git_merges_whole_files_in_a_scratch_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Old git (no merge-tree --write-tree): the same tree, or a conflict, no file touched."""
    from sono import review

    monkeypatch.setattr(review, "_merged_tree", review._merged_tree_old_git)
    repo, sb = sandbox_with_commits(tmp_path, {"a.txt": "sandbox\n", "d.txt": "added\n"})
    (repo / "b.txt").write_text("host\n")
    git(repo, "commit", "-qam", "host change")
    merge(sb, commit=False, keep=True)
    assert (repo / "b.txt").read_text() == "host\n" and (repo / "d.txt").exists()
    git(repo, "reset", "-q", "--hard")
    git(repo, "clean", "-qfd")
    (repo / "a.txt").write_text("host\n")
    git(repo, "commit", "-qam", "host change on a")
    before = without_objects(tree_snapshot(repo))
    with pytest.raises(SoError, match=r"conflicts in a\.txt.*exactly as it was"):
        merge(sb, commit=False, keep=True)
    assert without_objects(tree_snapshot(repo)) == before


def recorder(seen: list[list[str]]) -> Callable[[Sequence[str]], bool]:
    """An approval that records what it was shown and says yes."""

    def approve(risky: Sequence[str]) -> bool:
        seen.append([*risky])
        return True

    return approve


def test_merge_flags_files_that_run_code(tmp_path: Path) -> None:
    _, sb = sandbox_with_commits(tmp_path, {"a.txt": "one\n"})
    (sb.work / ".github" / "workflows").mkdir(parents=True)
    (sb.work / ".github" / "workflows" / "ci.yml").write_text("on: push\n")
    (sb.work / "sub").mkdir()
    (sb.work / "sub" / ".gitattributes").write_text("*.txt filter=evil\n")
    sb.git.commit_all("ci")
    sb.take()  # what a shell session does when it ends
    seen: list[list[str]] = []
    result = merge(sb, commit=False, keep=True, approve=recorder(seen))
    assert seen == [[".github/workflows/ci.yml", "sub/.gitattributes"]]
    assert len(result.notes) == 1
    assert ".github/workflows/ci.yml" in result.notes[0]
    assert "sub/.gitattributes" in result.notes[0]
    assert "a.txt" not in result.notes[0]


def test_merge_of_plain_files_has_no_notes(tmp_path: Path) -> None:
    _, sb = sandbox_with_commits(tmp_path, {"a.txt": "one\n"})
    assert merge(sb, commit=False, keep=True).notes == []


@pytest.mark.parametrize(
    "path",
    [
        "sub/.claude/settings.json",
        "pkg/.codex/config.toml",
        "app/.env.local",
        "a/b/.mcp.json",
        "web/opencode.json",
        "x/.vscode/tasks.json",
        ".tox/py/bin/python",
        "deep/dir/.GitAttributes",
        "svc/.envrc",
    ],
)
def test_files_that_run_code_are_found_at_any_depth(path: str) -> None:
    from sono.review import runs_code

    assert runs_code(path)


@pytest.mark.parametrize("path", ["src/app.py", "docs/claude-notes.md", "README.md", "env.txt"])
def test_ordinary_files_do_not_run_code(path: str) -> None:
    from sono.review import runs_code

    assert not runs_code(path)


# --- the pager: through sono.proc; a missing or failing one still shows the diff ----------


def on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """show_diff as on a terminal (stdout "is a tty"), without delta and without colour.
    Called in the test itself: ``capfd`` sets ``sys.stdout`` only when the test starts."""
    import shutil
    import sys

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.mark.parametrize(
    ("pager", "note"),
    [
        ("/nonexistent/pager -R", "so: pager: command not found: /nonexistent/pager"),
        ("false", "so: pager 'false' exited with 1; the diff follows"),
        ("less 'unclosed", 'so: pager: cannot parse "less \'unclosed"'),
    ],
)
def test_a_missing_or_failing_pager_prints_the_diff(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    pager: str,
    note: str,
) -> None:
    _, sb = sandbox_with_commits(tmp_path, {"a.txt": "one\n"})
    on_a_terminal(monkeypatch)
    show_diff(sb, iteration=None, stat=False, pager=pager)
    out, err = capfd.readouterr()
    assert note in err and len(err.strip().splitlines()) == 1
    assert out.count("+one") == 1


def test_a_working_pager_gets_the_diff_on_stdin(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, sb = sandbox_with_commits(tmp_path, {"a.txt": "one\n"})
    on_a_terminal(monkeypatch)
    show_diff(sb, iteration=None, stat=False, pager="sed s/^/paged:/")
    out, err = capfd.readouterr()
    assert err == "" and "paged:+one" in out and out.count("+one") == 1


def test_a_pager_that_quits_without_reading_is_no_error(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    big = "".join(f"line {i}\n" for i in range(200_000))  # more than a pipe holds
    _, sb = sandbox_with_commits(tmp_path, {"a.txt": big})
    on_a_terminal(monkeypatch)
    show_diff(sb, iteration=None, stat=False, pager="true")
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
