from __future__ import annotations

import pytest

from sono.errors import SoError
from sono.events import Text, ToolCall
from sono.harnesses import get_harness
from sono.harnesses.base import AgentOptions
from sono.harnesses.custom import CustomHarness, CustomParser


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
