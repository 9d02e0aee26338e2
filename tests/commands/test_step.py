"""The step dialogue between iterations, on real git (fake backend at the seam)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes import fake_sandbox
from helpers import make_repo
from sono.commands.step import between, numstat_lines
from sono.sandbox import Sandbox
from sono.state import IterationRecord


def iteration(tmp_path: Path) -> tuple[Sandbox, IterationRecord]:
    repo = make_repo(tmp_path / "p", {"a.txt": "a\n", "specs/prompt.md": "Original prompt\n"})
    sb = fake_sandbox(tmp_path, repo)
    before = sb.git.head()
    (sb.work / "a.txt").write_text("changed\n")
    sb.git.commit_all("iteration 1 work")
    sb.record_iteration(1)
    after = sb.git.head()
    rec = IterationRecord(
        n=1,
        started="t",
        duration_s=1.0,
        exit_code=0,
        timed_out=False,
        head_before=before,
        head_after=after,
        commits=(after,),
        commit_retries=0,
        auto_committed=True,
        status_after="pending",
        events=0,
    )
    return sb, rec


def answers(*values: str) -> Iterator[str]:
    yield from values


def test_continue_after_showing_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sb, rec = iteration(tmp_path)
    asked = answers("c")
    decision = between(sb, rec, lambda _q: next(asked))
    assert not decision.stop and decision.prompt is None
    assert "a.txt" in capsys.readouterr().out  # the iteration's diff summary


def test_show_diff_then_stop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sb, rec = iteration(tmp_path)
    asked = answers("d", "s")
    assert between(sb, rec, lambda _q: next(asked)).stop
    assert "+changed" in capsys.readouterr().out


def test_edit_the_next_prompt(tmp_path: Path) -> None:
    sb, rec = iteration(tmp_path)
    seen: list[str] = []

    def edit(text: str) -> str:
        seen.append(text)
        return "Focus on tests next.\n"

    asked = answers("e", "c")
    decision = between(sb, rec, lambda _q: next(asked), edit=edit)
    assert seen == ["Original prompt\n"]
    assert decision.prompt == "Focus on tests next.\n"


def test_reset_this_iteration(tmp_path: Path) -> None:
    sb, rec = iteration(tmp_path)
    (sb.work / "junk.txt").write_text("untracked")
    asked = answers("r", "c")
    between(sb, rec, lambda _q: next(asked))
    assert sb.git.head() == rec.head_before
    assert (sb.work / "a.txt").read_text() == "a\n" and not (sb.work / "junk.txt").exists()
    # The iteration's ref stays on the timeline.
    assert sb.iteration_commit(1) == rec.head_after  # the timeline keeps the iteration


def test_summary_shows_hostile_file_names_visibly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sb, rec = iteration(tmp_path)
    (sb.work / "evil\x1b]52;c;eA==\x07\u202e.txt").write_text("x\ny\n")
    (sb.work / "caf\u00e9.txt").write_bytes(b"\x00\x01binary")
    sb.git.commit_all("more")
    sb.record_iteration(1)
    asked = answers("s")
    between(sb, rec, lambda _q: next(asked))
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    assert " evil^[]52;c;eA==^G<U+202E>.txt  +2 -0" in out
    assert " caf<U+00E9>.txt  (binary)" in out
    assert " a.txt  +1 -1" in out
    assert " 3 file(s) changed, +3 -1" in out


def test_numstat_lines() -> None:
    out = "1\t2\ta.txt\0-\t-\tbin\0" + "0\t0\t\0old\x1b.txt\0new\u00e9.txt\0"
    assert numstat_lines(out) == [
        " a.txt  +1 -2",
        " bin  (binary)",
        " old^[.txt → new<U+00E9>.txt  +0 -0",
        " 3 file(s) changed, +1 -2",
    ]
    assert numstat_lines("") == []
