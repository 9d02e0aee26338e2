"""The ``specs/`` contract between the user, the loop and the agent, and the prompts."""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources

PROMPT = "specs/prompt.md"
PLAN = "specs/implementation-plan.md"
STATUS = "specs/status.md"
TEMPLATES = ("prompt.md", "readme.md", "implementation-plan.md", "status.md")

PENDING, DONE, BLOCKED = "pending", "done", "blocked"
_UNCHECKED = re.compile(r"^\s*[-*+]\s+\[ \]", re.MULTILINE)
_STATUS = re.compile(r"^\W*status\W*[:=]\s*\**\s*(\w+)", re.IGNORECASE | re.MULTILINE)
_DONE_WORDS = {"done", "complete", "completed", "finished"}

COMMIT_REMINDER = """You left uncommitted changes in the repository (git status is not clean).
Review them and commit them now with a clear message (What / Why). Do not start new work.
If a change should not be kept, revert it instead. The tree must be clean when you finish."""

STEP_NOTE = "Do NOT commit: a human reviews your changes after this iteration and decides."

CLEAN_PROMPT = """Find ONE code smell in this repository (dead code, unclear names, a function
doing too much, missing error handling, inconsistent style) and fix it. Keep behaviour
unchanged; run the project's type checker, linter and tests. Commit the fix with a message
saying What and Why. If you find nothing worth fixing, make no commit."""

DUP_PROMPT = """Remove ONE piece of duplicated code from this repository: extract the shared
logic so that both places use it. Keep behaviour unchanged; run the project's checks and tests.
Commit with a message saying What and Why. If nothing is worth deduplicating, make no commit.

The duplicate-code report (jscpd) for the current tree:
"""

LEARN_PROMPT = """You are a teacher, not a coder. Help me understand this repository and the
concepts I ask about. Explain, ask me questions, point me to files and lines; do NOT write
the solution for me. Code snippets at most 5 lines. Start by asking what I want to learn."""

PLAN_PROMPT = """Interview me to plan the next piece of work on this repository. Ask one
question at a time until the goal, constraints and acceptance criteria are clear. Then write
`specs/<feature>.md` (the spec), list it in `specs/readme.md`, and add small, ordered tasks as
`- [ ]` items to `specs/implementation-plan.md`. Do not implement anything."""


def template(name: str) -> str:
    return resources.files("sono.templates").joinpath(name).read_text()


def unchecked_items(plan_text: str | None) -> int:
    return len(_UNCHECKED.findall(plan_text or ""))


def parse_status(text: str | None) -> str:
    """``done`` / ``blocked`` / ``pending`` from ``specs/status.md``."""
    if not text:
        return PENDING
    match = _STATUS.search(text)
    word = match.group(1).lower() if match else text.strip().split()[0].strip("*#:").lower()
    if word in _DONE_WORDS:
        return DONE
    if word == BLOCKED:
        return BLOCKED
    return PENDING


def cap_iterations(requested: int, plan_text: str | None) -> int:
    """min(-i, unchecked plan items) when the plan has any, else -i."""
    items = unchecked_items(plan_text)
    return min(requested, items) if items else requested


def compose_prompt(base: str, recent: Sequence[str], i: int, n: int, *, step: bool = False) -> str:
    parts = [base.rstrip()]
    if recent:
        parts.append(
            "Recent commits since the sandbox started (newest first):\n" + "\n".join(recent)
        )
    if step:
        parts.append(STEP_NOTE)
    parts.append(f"Iteration {i}/{n}.")
    return "\n\n".join(parts) + "\n"
