from __future__ import annotations

import pytest

from sono import specs


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "pending"),
        ("", "pending"),
        ("Status: pending\n", "pending"),
        ("Status: done\n", "done"),
        ("status: DONE", "done"),
        ("**Status:** complete", "done"),
        ("# Status\nStatus: blocked\nwaiting for API keys", "blocked"),
        ("done\n", "done"),
        ("blocked: no access", "blocked"),
        ("Status: in progress", "pending"),
    ],
)
def test_parse_status(text: str | None, expected: str) -> None:
    assert specs.parse_status(text) == expected


def test_unchecked_items_counts_only_open_boxes() -> None:
    plan = (
        "- [x] done\n- [ ] a\n  - [ ] nested\n* [ ] star\n- [X] done too\ntext - [ ] not a list\n"
    )
    assert specs.unchecked_items(plan) == 3


@pytest.mark.parametrize(
    ("requested", "plan", "expected"),
    [
        (10, "- [ ] a\n- [ ] b\n", 2),
        (1, "- [ ] a\n- [ ] b\n", 1),
        (5, None, 5),
        (5, "- [x] a", 5),
    ],
)
def test_cap_iterations(requested: int, plan: str | None, expected: int) -> None:
    assert specs.cap_iterations(requested, plan) == expected


def test_compose_prompt_order_and_content() -> None:
    prompt = specs.compose_prompt("Base prompt.\n", ["abc123 first", "def456 second"], 2, 3)
    assert (
        prompt.index("Base prompt.") < prompt.index("abc123 first") < prompt.index("Iteration 2/3.")
    )
    assert prompt.endswith("Iteration 2/3.\n")
    assert specs.STEP_NOTE not in prompt


def test_compose_prompt_without_commits_and_in_step_mode() -> None:
    prompt = specs.compose_prompt("P", [], 1, 1, step=True)
    assert "Recent commits" not in prompt and specs.STEP_NOTE in prompt


def test_templates_ship_with_the_package() -> None:
    for name in specs.TEMPLATES:
        assert specs.template(name).strip()
    assert "- [ ]" in specs.template("implementation-plan.md")
