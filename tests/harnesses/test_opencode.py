from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from sono.events import (
    Error,
    Event,
    FileChanged,
    Raw,
    Result,
    SessionStarted,
    Text,
    Thinking,
    ToolCall,
    ToolResult,
    Usage,
)
from sono.harnesses import get_harness
from sono.harnesses.base import AgentOptions
from sono.harnesses.opencode import ALLOW_ALL, OpencodeHarness, OpencodeJsonParser, api_base_url

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "opencode" / "run_commit.jsonl"
EXE = "/x/opencode"
RUN = [EXE, "run", "--format", "json", "--thinking", "--auto"]
OPENAI = {"openai": "http://127.0.0.1:9/v1"}


def argv(**kwargs: Any) -> list[str]:
    return OpencodeHarness().unattended_argv(AgentOptions(executable=EXE, **kwargs))


def config(env: dict[str, str]) -> dict[str, Any]:
    data = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    assert isinstance(data, dict)
    return data


def parse(lines: list[str]) -> list[Event]:
    parser = OpencodeJsonParser()
    return [event for line in lines for event in parser.feed(line)]


# --- argv -----------------------------------------------------------------------------


def test_unattended_argv_reads_the_prompt_from_stdin() -> None:
    assert argv() == RUN
    assert OpencodeHarness().unattended_argv(AgentOptions())[0] == "opencode"


def test_model_and_variant_flags() -> None:
    assert argv(model="anthropic/claude-opus-4-5", effort="max") == [
        *RUN,
        "-m",
        "anthropic/claude-opus-4-5",
        "--variant",
        "max",
    ]


def test_endpoint_makes_its_provider_the_model() -> None:
    assert argv(endpoints=OPENAI)[-2:] == ["-m", "so-openai/gpt-5"]
    assert argv(endpoints=OPENAI, model="qwen3")[-2:] == ["-m", "so-openai/qwen3"]
    # An explicit provider/model is the user's choice, endpoint or not.
    assert argv(endpoints=OPENAI, model="openai/gpt-5")[-2:] == ["-m", "openai/gpt-5"]
    anthropic = {"anthropic": "http://h:1"}
    assert argv(endpoints=anthropic)[-2:] == ["-m", "so-anthropic/claude-sonnet-4-5"]
    both = {**anthropic, **OPENAI}
    assert argv(endpoints=both)[-2:] == ["-m", "so-openai/gpt-5"]


def test_interactive_argv_uses_prompt_flag_and_never_auto_approves() -> None:
    harness = OpencodeHarness()
    opts = AgentOptions(executable=EXE, model="openai/gpt-5", effort="high", task="plan")
    assert harness.interactive_argv(opts, "Plan with me\nline 2") == [
        EXE,
        "-m",
        "openai/gpt-5",
        "--prompt",
        "Plan with me\nline 2",
    ]
    assert harness.interactive_argv(AgentOptions(), None) == ["opencode"]


def test_efforts_are_the_variant_values() -> None:
    assert OpencodeHarness.efforts == ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def test_registry_and_npm_pin() -> None:
    harness = get_harness("opencode")
    assert harness.name == "opencode"
    assert harness.npm is not None and harness.npm.name == "opencode-ai"
    assert harness.npm.bin == "opencode" and harness.npm.version.count(".") == 2
    assert harness.executable_name(AgentOptions()) == "opencode"


# --- env and the generated config -------------------------------------------------------


def test_env_forwards_provider_keys_and_opencode_settings_only() -> None:
    env = OpencodeHarness().env(
        {
            "OPENAI_API_KEY": "o",
            "ANTHROPIC_API_KEY": "a",
            "OPENCODE_SERVER_PASSWORD": "p",
            "OPENCODE_CONFIG_DIR": "/host/path",
            "OPENCODE_PID": "123",
            "AWS_SECRET_ACCESS_KEY": "no",
            "GITHUB_TOKEN": "no",
        },
        AgentOptions(),
    )
    assert env["OPENAI_API_KEY"] == "o" and env["ANTHROPIC_API_KEY"] == "a"
    assert env["OPENCODE_SERVER_PASSWORD"] == "p"
    for absent in ("OPENCODE_CONFIG_DIR", "OPENCODE_PID", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN"):
        assert absent not in env


def test_env_turns_off_downloads_and_allows_tools_in_the_loop() -> None:
    env = OpencodeHarness().env({}, AgentOptions())
    for knob in (
        "OPENCODE_DISABLE_AUTOUPDATE",
        "OPENCODE_DISABLE_SHARE",
        "OPENCODE_DISABLE_MODELS_FETCH",
        "OPENCODE_DISABLE_LSP_DOWNLOAD",
    ):
        assert env[knob] == "1"
    assert json.loads(env["OPENCODE_PERMISSION"]) == {"*": "allow"} == json.loads(ALLOW_ALL)
    assert config(env) == {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "snapshot": False,
    }


def test_plan_and_learn_keep_opencode_asking() -> None:
    for task in ("plan", "learn"):
        assert "OPENCODE_PERMISSION" not in OpencodeHarness().env({}, AgentOptions(task=task))


def test_host_choices_win_over_defaults() -> None:
    env = OpencodeHarness().env(
        {"OPENCODE_PERMISSION": '{"bash":"ask"}', "OPENCODE_DISABLE_MODELS_FETCH": "0"},
        AgentOptions(),
    )
    assert env["OPENCODE_PERMISSION"] == '{"bash":"ask"}'
    assert env["OPENCODE_DISABLE_MODELS_FETCH"] == "0"


def test_openai_endpoint_becomes_a_chat_completions_provider() -> None:
    env = OpencodeHarness().env({}, AgentOptions(endpoints=OPENAI, model="qwen3"))
    cfg = config(env)
    assert cfg["provider"] == {
        "so-openai": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "so endpoint (openai)",
            "options": {"baseURL": "http://127.0.0.1:9/v1", "apiKey": "{env:OPENAI_API_KEY}"},
            "models": {"qwen3": {"name": "qwen3"}},
        }
    }
    assert cfg["small_model"] == "so-openai/qwen3"  # titles must not go to a vendor


def test_anthropic_endpoint_gets_v1_limits_and_reasoning_for_variants() -> None:
    opts = AgentOptions(endpoints={"anthropic": "http://h:1/"}, effort="high")
    provider = config(OpencodeHarness().env({}, opts))["provider"]["so-anthropic"]
    assert provider["npm"] == "@ai-sdk/anthropic"
    assert provider["options"] == {"baseURL": "http://h:1/v1", "apiKey": "{env:ANTHROPIC_API_KEY}"}
    model = provider["models"]["claude-sonnet-4-5"]
    assert model["reasoning"] is True and model["limit"]["output"] > 0
    already = AgentOptions(endpoints={"anthropic": "http://h:1/v1"})
    options = config(OpencodeHarness().env({}, already))["provider"]["so-anthropic"]["options"]
    assert options["baseURL"] == "http://h:1/v1"


def test_base_urls_follow_each_sdk() -> None:
    assert api_base_url("openai", "http://h:1") == "http://h:1/v1"  # a bare host, as codex
    assert api_base_url("openai", "http://h:1/") == "http://h:1/v1"
    assert api_base_url("openai", "https://gw/openai/v1/") == "https://gw/openai/v1"
    assert api_base_url("openai", "https://gw/api") == "https://gw/api"
    assert api_base_url("anthropic", "https://gw/anthropic") == "https://gw/anthropic/v1"
    assert api_base_url("anthropic", "https://gw/v1") == "https://gw/v1"


def test_both_endpoints_give_two_providers() -> None:
    opts = AgentOptions(endpoints={"anthropic": "http://a", "openai": "http://o/v1"})
    cfg = config(OpencodeHarness().env({}, opts))
    assert set(cfg["provider"]) == {"so-openai", "so-anthropic"}
    assert cfg["small_model"] == "so-openai/gpt-5"


def test_host_inline_config_is_merged_under_ours() -> None:
    host = {"OPENCODE_CONFIG_CONTENT": json.dumps({"theme": "x", "provider": {"mine": {}}})}
    cfg = config(OpencodeHarness().env(host, AgentOptions(endpoints=OPENAI)))
    assert cfg["theme"] == "x" and set(cfg["provider"]) == {"mine", "so-openai"}
    assert cfg["snapshot"] is False
    broken = OpencodeHarness().env({"OPENCODE_CONFIG_CONTENT": "{nope"}, AgentOptions())
    assert config(broken)["autoupdate"] is False


# --- provision ------------------------------------------------------------------------


def test_provision_copies_config_and_auth_not_state(tmp_path: Path) -> None:
    host = tmp_path / "host"
    conf = host / ".config" / "opencode"
    (conf / "agent").mkdir(parents=True)
    (conf / "opencode.json").write_text('{"model": "anthropic/claude-sonnet-4-5"}')
    (conf / "agent" / "review.md").write_text("# review")
    (conf / "node_modules" / "pkg").mkdir(parents=True)
    data = host / ".local" / "share" / "opencode"
    for sub in ("log", "storage", "snapshot"):
        (data / sub).mkdir(parents=True)
    (data / "auth.json").write_text('{"anthropic": {"type": "api", "key": "k"}}')
    (data / "opencode.db").write_text("sessions")
    seed = tmp_path / "seed"
    seed.mkdir()
    copied = OpencodeHarness().provision(home_seed=seed, host_home=host, opts=AgentOptions())
    assert copied == ["~/.config/opencode", "~/.local/share/opencode/auth.json"]
    assert (seed / ".config" / "opencode" / "opencode.json").exists()
    assert (seed / ".config" / "opencode" / "agent" / "review.md").read_text() == "# review"
    assert not (seed / ".config" / "opencode" / "node_modules").exists()
    share = seed / ".local" / "share" / "opencode"
    assert sorted(p.name for p in share.iterdir()) == ["auth.json"]
    assert not (share / "auth.json").is_symlink()


def test_provision_without_anything(tmp_path: Path) -> None:
    (tmp_path / "seed").mkdir()
    assert (
        OpencodeHarness().provision(
            home_seed=tmp_path / "seed", host_home=tmp_path, opts=AgentOptions()
        )
        == []
    )


# --- parser: a real recorded run --------------------------------------------------------


def test_recorded_run() -> None:
    events = parse(FIXTURE.read_text().splitlines())
    assert not [e for e in events if isinstance(e, Raw | Error)]
    assert [e.kind for e in events] == [
        "session_started",
        *("thinking", "text", "tool_call", "tool_result", "usage"),
        *("thinking", "text", "tool_call", "tool_result", "usage"),
        *("thinking", "text", "usage", "result"),
    ]
    started = events[0]
    assert isinstance(started, SessionStarted) and started.session_id.startswith("ses_")
    calls = [e for e in events if isinstance(e, ToolCall)]
    results = [e for e in events if isinstance(e, ToolResult)]
    assert [c.name for c in calls] == ["bash", "bash"]
    assert calls[0].summary == "ls missing-file"
    assert [r.call_id for r in results] == [c.call_id for c in calls]
    assert results[0].ok is False and "No such file" in results[0].summary
    assert results[1].ok is True and "item 1" in results[1].summary
    assert isinstance(events[1], Thinking) and events[1].text
    usage = [e for e in events if isinstance(e, Usage)]
    assert usage[0] == Usage(input_tokens=88, output_tokens=27, cached_tokens=7506, cost_usd=0.0)
    assert events[-1] == Result(ok=True, text="Iteration done.", num_turns=3)


# Real lines from opencode 1.18.33 (long metadata trimmed): a write, an edit, an
# apply_patch, a tool error, a model calling an unknown tool, and an API error.
WRITE: dict[str, Any] = {
    "type": "tool_use",
    "sessionID": "ses_1",
    "part": {
        "type": "tool",
        "tool": "write",
        "callID": "call_x2",
        "state": {
            "status": "completed",
            "input": {"filePath": "/w/new.txt", "content": "hello\n"},
            "output": "Wrote file successfully.",
            "metadata": {"diagnostics": {}, "filepath": "/w/new.txt", "exists": False},
            "title": "new.txt",
        },
    },
}
EDIT: dict[str, Any] = {
    "type": "tool_use",
    "sessionID": "ses_1",
    "part": {
        "type": "tool",
        "tool": "edit",
        "callID": "call_x4",
        "state": {
            "status": "completed",
            "input": {"filePath": "/w/notes.txt", "oldString": "a", "newString": "b"},
            "output": "Edit applied successfully.",
            "metadata": {"diff": "…", "truncated": False},
        },
    },
}
PATCH_TEXT = (
    "*** Begin Patch\n*** Add File: added.txt\n+hello\n*** Update File: notes.txt\n"
    "@@\n-old line\n+patched line\n*** End Patch"
)
PATCH: dict[str, Any] = {
    "type": "tool_use",
    "sessionID": "ses_1",
    "part": {
        "type": "tool",
        "tool": "apply_patch",
        "callID": "call_x6",
        "state": {
            "status": "completed",
            "input": {"patchText": PATCH_TEXT},
            "output": "Success. Updated the following files:\nA added.txt\nM notes.txt",
            "metadata": {
                "files": [
                    {"filePath": "/w/added.txt", "relativePath": "added.txt", "type": "add"},
                    {"filePath": "/w/notes.txt", "relativePath": "notes.txt", "type": "update"},
                ]
            },
        },
    },
}
READ_ERROR: dict[str, Any] = {
    "type": "tool_use",
    "sessionID": "ses_1",
    "part": {
        "type": "tool",
        "tool": "read",
        "callID": "call_x8",
        "state": {
            "status": "error",
            "input": {"filePath": "/w/nope.txt"},
            "error": "File not found: /w/nope.txt",
        },
    },
}
API_ERROR: dict[str, Any] = {
    "type": "error",
    "sessionID": "ses_1",
    "error": {
        "name": "APIError",
        "data": {
            "message": "no route for /nope/chat/completions",
            "statusCode": 404,
            "isRetryable": False,
        },
    },
}


def test_file_tools_report_changed_files() -> None:
    events = parse([json.dumps(x) for x in (WRITE, EDIT, PATCH)])
    changed = [e.path for e in events if isinstance(e, FileChanged)]
    assert changed == ["/w/new.txt", "/w/notes.txt", "/w/added.txt", "/w/notes.txt"]
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert [c.summary for c in calls[:2]] == ["/w/new.txt", "/w/notes.txt"]


def test_patch_headers_name_files_when_metadata_is_missing() -> None:
    part = {**PATCH["part"], "state": {"status": "error", "input": {"patchText": PATCH_TEXT}}}
    events = parse([json.dumps({**PATCH, "part": part})])
    assert [e.path for e in events if isinstance(e, FileChanged)] == ["added.txt", "notes.txt"]


def test_tool_error_and_api_error() -> None:
    events = parse([json.dumps(READ_ERROR), json.dumps(API_ERROR)])
    result = next(e for e in events if isinstance(e, ToolResult))
    assert result == ToolResult(call_id="call_x8", ok=False, summary="File not found: /w/nope.txt")
    assert Error(message="APIError: no route for /nope/chat/completions") in events


def test_error_makes_the_final_result_fail() -> None:
    finish = {"type": "step_finish", "sessionID": "s", "part": {"reason": "stop", "tokens": {}}}
    events = parse([json.dumps(API_ERROR), json.dumps(finish)])
    assert events[-1] == Result(ok=False, text="", num_turns=0)


def test_tool_calls_step_is_not_a_result_and_length_is_not_ok() -> None:
    def finish(reason: str) -> str:
        return json.dumps({"type": "step_finish", "part": {"reason": reason, "cost": 0.5}})

    events = parse([finish("tool-calls"), finish("length")])
    assert [e.kind for e in events] == ["usage", "usage", "result"]
    assert isinstance(events[-1], Result) and events[-1].ok is False
    assert isinstance(events[0], Usage) and events[0].cost_usd == 0.5


def test_session_starts_once_even_from_unknown_lines() -> None:
    parser = OpencodeJsonParser()
    assert parser.feed('{"type":"future","sessionID":"ses_9"}')[0].kind == "raw"
    assert parser.feed('{"type":"text","sessionID":"ses_9","part":{"text":"hi"}}') == [
        SessionStarted(session_id="ses_9"),
        Text(text="hi"),
    ]
    assert parser.feed('{"type":"text","sessionID":"ses_9","part":{"text":""}}') == []


GARBAGE = [
    "",
    "   ",
    "not json",
    "[1, 2]",
    "null",
    "42",
    '"text"',
    "{",
    '{"type": null}',
    '{"type": "step_finish", "part": "x"}',
    '{"type": "step_finish", "part": {"tokens": {"input": "9", "cache": [1]}, "cost": NaN}}',
    '{"type": "step_finish", "part": {"tokens": {"input": Infinity, "output": true}}}',
    '{"type": "tool_use", "part": {"state": {"status": "completed", "metadata": {"exit": "1"}}}}',
    '{"type": "tool_use", "part": {"tool": "apply_patch", "state": {"input": {"patchText": 5},'
    ' "metadata": {"files": [null, {"filePath": 3}]}}}}',
    '{"type": "tool_use", "part": {"tool": "write", "state": {"input": ["a"]}}}',
    '{"type": "error", "error": "boom"}',
    '{"type": "error", "error": {"data": null}}',
    '{"type": "error"}',
    '{"type": "reasoning", "part": {"text": 7}}',
    '{"type": "text", "sessionID": 5, "part": null}',
    "\x00\xff\ud800",
]


def test_garbage_never_raises() -> None:
    parser = OpencodeJsonParser()
    for line in GARBAGE:
        for event in parser.feed(line):
            assert isinstance(event, Event)
    assert parser.feed(None)[0].kind == "raw"  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(3))
def test_truncated_and_mangled_fixture_never_raises(seed: int) -> None:
    rng = random.Random(seed)
    lines = FIXTURE.read_text().splitlines() + [json.dumps(x) for x in (WRITE, PATCH, API_ERROR)]
    parser = OpencodeJsonParser()
    for line in lines:
        for cut in range(0, len(line), max(1, len(line) // 40)):
            parser.feed(line[:cut])
        chars = list(line)
        for _ in range(5):
            chars[rng.randrange(len(chars))] = rng.choice('{}[]":,0a\\')
        parser.feed("".join(chars))


def test_provision_is_an_allow_list(tmp_path: Path) -> None:
    host = tmp_path / "host"
    conf = host / ".config" / "opencode"
    for sub in ("keys", "command", "agents", "themes", "plugin", "backups"):
        (conf / sub).mkdir(parents=True)
    (conf / "keys" / "x.txt").write_text("sk-secret")
    provider = {"options": {"apiKey": "{file:./keys/x.txt}", "baseURL": "http://h/v1"}}
    (conf / "opencode.json").write_text(json.dumps({"provider": {"mine": provider}}))
    (conf / "tui.json").write_text('{"theme": "x"}')
    (conf / "notes.txt").write_text("sk-secret")
    (conf / "backups" / "opencode.json.bak").write_text("sk-secret")
    (conf / "command" / "x.md").write_text("# x")
    (conf / "agents" / "review.md").write_text("# review")
    (conf / "themes" / "mine.json").write_text("{}")
    (conf / "plugin" / "p.ts").write_text("export default {}")
    (conf / "plugin" / "github_token.txt").write_text("sk-secret")
    (conf / "plugin" / "server.pem").write_text("sk-secret")
    (conf / "plugin" / "keys.ts").symlink_to(conf / "keys" / "x.txt")
    seed = tmp_path / "seed"
    seed.mkdir()
    OpencodeHarness().provision(home_seed=seed, host_home=host, opts=AgentOptions())
    copied = seed / ".config" / "opencode"
    files = sorted(str(p.relative_to(copied)) for p in copied.rglob("*") if not p.is_dir())
    assert files == [
        "agents/review.md",
        "command/x.md",
        "opencode.json",
        "plugin/p.ts",
        "themes/mine.json",
        "tui.json",
    ]
    assert "sk-secret" not in "".join(p.read_text() for p in copied.rglob("*") if p.is_file())
