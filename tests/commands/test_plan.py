"""so plan's host-side steps: the templates, and never an agent without a terminal."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from helpers import make_repo
from sono.commands import plan
from sono.errors import SoError
from sono.specs import TEMPLATES


def test_templates_never_overwrite(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "p", {"specs/prompt.md": "mine\n"})
    written, kept = plan.write_templates(repo)
    assert "specs/prompt.md" in kept and len(written) == len(TEMPLATES) - 1
    assert (repo / "specs" / "prompt.md").read_text() == "mine\n"


def test_templates_never_write_through_links(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "p", {"README.md": "r"})
    outside = tmp_path / "outside"
    outside.mkdir()
    (repo / "specs").symlink_to(outside)
    with pytest.raises(SoError, match="symbolic link"):
        plan.write_templates(repo)
    assert not list(outside.iterdir())


def test_templates_keep_a_dangling_link(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "p", {"specs/x.md": "x"})
    (repo / "specs" / "status.md").symlink_to(tmp_path / "nowhere")
    _, kept = plan.write_templates(repo)
    assert "specs/status.md" in kept and not (tmp_path / "nowhere").exists()


def test_no_terminal_starts_no_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = make_repo(tmp_path / "p", {"README.md": "r"})
    monkeypatch.chdir(repo)

    def never(*args: object, **kwargs: object) -> int:
        raise AssertionError("an agent session without a terminal")

    monkeypatch.setattr(plan, "interactive_session", never)
    assert plan.run(argparse.Namespace(no_agent=False)) == 0
    assert "next: edit specs" in capsys.readouterr().out


def test_plan_in_a_repository_without_commits_writes_the_templates(tmp_path: Path) -> None:
    """A newcomer's first step, `git init && so plan`: the templates are written and so
    says what comes next (no sandbox can start before the first commit)."""
    import subprocess

    from helpers import so

    repo = tmp_path / "fresh"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    out = so("plan", cwd=repo)
    assert out.returncode == 0, out.stderr
    assert (repo / "specs" / "prompt.md").is_file()
    assert "the repository's first commit" in out.stdout
