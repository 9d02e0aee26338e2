from __future__ import annotations

import pytest

from sono.errors import SoError
from sono.events import Text, ToolCall
from sono.harnesses import get_harness
from sono.harnesses.base import AgentOptions
from sono.harnesses.custom import CustomHarness, CustomParser, shell_operator


def test_argv_from_agent_cmd() -> None:
    opts = AgentOptions(agent_cmd="my-agent --fast 'two words'", executable="/usr/bin/my-agent")
    assert CustomHarness().unattended_argv(opts) == ["/usr/bin/my-agent", "--fast", "two words"]


@pytest.mark.parametrize("cmd", [None, "", "'unclosed"])
def test_bad_agent_cmd_is_a_clear_error(cmd: str | None) -> None:
    with pytest.raises(SoError, match=r"agent-cmd|agent_cmd"):
        CustomHarness().unattended_argv(AgentOptions(agent_cmd=cmd))


def test_model_and_effort_reach_the_agent_as_env() -> None:
    env = CustomHarness().env({}, AgentOptions(model="m", effort="high"))
    assert env == {"SO_MODEL": "m", "SO_EFFORT": "high"}


def test_parser_plain_lines_and_stream_json() -> None:
    p = CustomParser()
    assert p.feed("hello") == [Text(text="hello")]
    assert p.feed("   ") == []
    assert p.feed("{not json") == [Text(text="{not json")]
    line = (
        '{"type":"assistant","message":{"content":[{"type":"tool_use","id":"t1",'
        '"name":"Bash","input":{"command":"ls"}}]}}'
    )
    events = p.feed(line)
    assert any(isinstance(e, ToolCall) and e.name == "Bash" for e in events)


def test_unknown_and_missing_harnesses(monkeypatch: pytest.MonkeyPatch) -> None:
    from sono import harnesses

    monkeypatch.setitem(harnesses.HARNESSES, "ghost", "sono.harnesses.ghost:GhostHarness")
    with pytest.raises(SoError, match="not supported yet"):
        get_harness("ghost")
    assert "ghost" not in harnesses.available()
    with pytest.raises(SoError, match="unknown harness"):
        get_harness("nope")


@pytest.mark.parametrize(
    ("cmd", "operator"),
    [
        ("echo hi > f && git commit -am x", ">"),
        ("make && git commit -am x", "&&"),
        ("agent || true", "||"),
        ("agent | tee log", "|"),
        ("agent; git commit", ";"),
        ("agent < prompt.md", "<"),
        ("agent `cat flags`", "`"),
        ("agent $(cat flags)", "$("),
        ('agent "--flags=$(cat f)"', "$("),  # a shell expands it in double quotes too
        ("agent &", "&"),
    ],
)
def test_unquoted_shell_operators_are_refused(cmd: str, operator: str) -> None:
    with pytest.raises(SoError) as info:
        CustomHarness().unattended_argv(AgentOptions(agent_cmd=cmd))
    message = str(info.value)
    assert f"{operator!r}" in message and "not run by a shell" in message
    assert "sh -c '…'" in message and "\n" not in message


@pytest.mark.parametrize(
    "cmd",
    [
        "sh -c 'echo hi > f && git commit -am x'",
        'my-agent --pattern "a|b" --sep ";"',
        r"my-agent a\;b a\>b",
        "my-agent '$(not run)' '`x`'",
        "my-agent --url https://x.invalid/?a=1",
    ],
)
def test_quoted_operators_are_arguments(cmd: str) -> None:
    argv = CustomHarness().unattended_argv(AgentOptions(agent_cmd=cmd))
    assert argv[0] in ("sh", "my-agent") and len(argv) > 1


def test_shell_operator_reports_the_first_one() -> None:
    assert shell_operator("a 'x && y' && b > c") == "&&"
    assert shell_operator('a "unclosed') is None
